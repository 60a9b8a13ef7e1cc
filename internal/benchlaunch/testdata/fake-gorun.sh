#!/bin/sh
# fake-gorun.sh stands in for bin/gorun: it accepts "-np N [--flag ...] cmd
# [args]" and runs N copies of cmd in the background, exiting non-zero if any
# copy does. Other flags are ignored.
n=1
while [ $# -gt 0 ]; do
	case $1 in
	-np) n=$2; shift 2 ;;
	-*) shift ;;
	*) break ;;
	esac
done
i=0
pids=
while [ "$i" -lt "$n" ]; do
	"$@" &
	pids="$pids $!"
	i=$((i + 1))
done
rc=0
for p in $pids; do wait "$p" || rc=1; done
exit $rc
