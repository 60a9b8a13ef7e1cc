#!/usr/bin/env bash
# make demo: gorun's main job on this host. examples/dptrain (a
# deterministic data-parallel trainer) runs on 4 ranks with its optimizer
# state protected in memory every step; in a second run, rank 2 is killed
# with SIGKILL mid-run, gorun restarts the ranks in place and they resume
# from the protected state. Both runs print the hash of their final state:
# they must be equal, bit for bit.
set -euo pipefail
bin=${BIN:-bin}
args=(--params 2M --steps 60 --seed 5 --log-every 20 --protect)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== 1. a run without a failure"
"$bin/gorun" -np 4 --oversubscribe -- "$bin/dptrain" "${args[@]}" | tee "$out/ref"
echo
echo "== 2. the same run; rank 2 is killed (SIGKILL) at step 30"
"$bin/gorun" -np 4 --oversubscribe --max-restarts 1 -- "$bin/dptrain" "${args[@]}" \
	--fail-at-step 30 --fail-rank 2 --fail-signal KILL | tee "$out/got"
echo
ref=$(sed -n 's/^\[0\] params sha256 //p' "$out/ref")
got=$(sed -n 's/^\[0\] params sha256 //p' "$out/got")
printf '%-28s %s\n' "without a failure:" "$ref" "rank 2 killed, recovered:" "$got"
if [ -z "$ref" ] || [ "$ref" != "$got" ]; then
	echo "demo: the final states differ" >&2
	exit 1
fi
echo "the same final state, bit for bit"
