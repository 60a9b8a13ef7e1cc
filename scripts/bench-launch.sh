#!/usr/bin/env bash
# bench-launch.sh compares gorun's launch-to-exit time with Open MPI and MPICH
# Hydra (see internal/benchlaunch). It installs Debian's openmpi-bin and mpich
# if their launchers are missing, then runs the benchmark from the repository
# root against ./bin/gorun. Arguments are passed on, e.g. -n 1,16 -rounds 5.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v mpirun.openmpi >/dev/null || missing+=(openmpi-bin)
command -v mpiexec.hydra >/dev/null || missing+=(mpich)
if ((${#missing[@]})); then
	sudo=()
	[[ $(id -u) -eq 0 ]] || sudo=(sudo)
	echo "bench-launch: installing ${missing[*]}" >&2
	if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
		! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; then
		echo "bench-launch: apt-get failed; the missing MPIs will be skipped" >&2
	fi
fi
exec go run ./internal/benchlaunch -gorun ./bin/gorun "$@"
