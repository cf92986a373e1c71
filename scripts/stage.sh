#!/usr/bin/env bash
# stage.sh NAME COMMAND...: runs COMMAND as the stage NAME and prints how
# long it took and whether it passed, so CI's log says which stage failed
# and what each cost (.ci/run, make test). With STAGE_TIMES set, it also
# appends "NAME SECONDS passed|FAILED" to that file for a summary.
set -uo pipefail
name=$1
shift
start=$SECONDS
echo "==== stage $name: $*"
"$@"
rc=$?
took=$((SECONDS - start))
if [ "$rc" -eq 0 ]; then
	echo "==== stage $name passed in ${took}s"
	result=passed
else
	echo "==== stage $name FAILED (exit $rc) after ${took}s"
	result=FAILED
fi
if [ -n "${STAGE_TIMES:-}" ]; then
	echo "$name ${took}s $result" >>"$STAGE_TIMES"
fi
exit "$rc"
