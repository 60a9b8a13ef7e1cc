#!/usr/bin/env bash
# make demo-hotswap: a whole host lost and a spare spliced in. Five hosts,
# emulated by Linux network namespaces on a bridge (root and `ip netns`
# needed): examples/dptrain runs 8 ranks on the first four (2 slots each),
# the fifth is a spare whose agent idles. Mid-run every process of the
# second host is killed; gorun fences it, moves its ranks to the spare,
# publishes the next epoch and the surviving ranks roll back to the last
# step every rank had protected while the moved ones restore theirs from
# replicas on other hosts. The recovery timeline and the final hash are
# printed beside those of a run without the failure.
set -euo pipefail
bin=$(cd "${BIN:-bin}" && pwd)
if [ "$(id -u)" != 0 ] || ! ip netns list >/dev/null 2>&1; then
	echo "demo-hotswap needs root and ip netns" >&2
	exit 2
fi
tag=gdemo$$
br=$tag-br
net=10.78.$(($$ % 200 + 20))
out=$(mktemp -d)
cleanup() {
	for i in 0 1 2 3 4; do
		ip netns pids "$tag-h$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
		ip netns del "$tag-h$i" 2>/dev/null || true
	done
	ip link del "$br" 2>/dev/null || true
	rm -rf "$out"
}
trap cleanup EXIT
ip link add "$br" type bridge
ip addr add "$net.1/24" dev "$br"
ip link set "$br" up
: >"$out/hostfile"
for i in 0 1 2 3 4; do
	ns=$tag-h$i
	ip netns add "$ns"
	ip link add "$tag-v$i" type veth peer name eth0 netns "$ns"
	ip link set "$tag-v$i" master "$br" up
	ip -n "$ns" addr add "$net.$((i + 2))/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" link set lo up
	ip -n "$ns" route add default via "$net.1"
	echo "$ns slots=2" >>"$out/hostfile"
done

gorun=("$bin/gorun" -np 8 --hostfile "$out/hostfile" --spares 1 --rsh "ip netns exec" --bind "$net.1")
args=(--params 4M --steps 80 --seed 5 --device-ms 40 --log-every 10 --protect)

echo "== 1. a run without a failure (8 ranks on 4 hosts, 1 spare idle)"
"${gorun[@]}" -- "$bin/dptrain" "${args[@]}" | tee "$out/ref"
echo
echo "== 2. the same run; every process of host $tag-h1 is killed after step 40"
# The killed host's agent cannot remove its job directory (a real host's
# /tmp goes with it; these emulated hosts share this one's): the demo
# removes what the job left once it is over.
ls -d "${TMPDIR:-/tmp}"/gorun-* 2>/dev/null | sort >"$out/dirs-before" || true
"${gorun[@]}" --recovery in-place --events "$out/events" -- "$bin/dptrain" "${args[@]}" --log-every 1 >"$out/got" 2>"$out/err" &
job=$!
until grep -Eq "^\[0\] step 40( |$)" "$out/got"; do
	if ! kill -0 "$job" 2>/dev/null; then
		cat "$out/got" "$out/err"
		echo "demo-hotswap: the job ended before step 40" >&2
		exit 1
	fi
	sleep 0.02
done
ip netns pids "$tag-h1" | xargs -r kill -9
echo "   killed at $(date +%T.%N | cut -c1-12)"
status=0
wait "$job" || status=$?
ls -d "${TMPDIR:-/tmp}"/gorun-* 2>/dev/null | sort | comm -13 "$out/dirs-before" - | xargs -r rm -rf
grep -Ev '^\[0\] step [0-9]+( loss .*)?$' "$out/got" || true
cat "$out/err"
echo
echo "== the recovery, from --events (seconds since the job started):"
grep -E '"event":"(fence|splice|publish|timeline)"' "$out/events" || true
echo
ref=$(sed -n 's/^\[0\] params sha256 //p' "$out/ref")
got=$(sed -n 's/^\[0\] params sha256 //p' "$out/got")
printf '%-28s %s\n' "without a failure:" "$ref" "host lost, spare spliced in:" "$got"
if [ "$status" != 0 ] || [ -z "$ref" ] || [ "$ref" != "$got" ]; then
	echo "demo-hotswap: exit $status, or the final states differ" >&2
	exit 1
fi
echo "the same final state, bit for bit"
