#!/usr/bin/env bash
# The exit check of a training run from scratch: N first runs of train.py (30 unless given),
# each preparing tinyshakespeare itself (its shards and its text deleted before it, so each
# downloads the text or, offline, takes the fallback), and each must exit 0.  Issue 20's crash
# at exit came only from such runs (tests/test_teardown.py says why).
#   dev/exit_loop.sh [N] [train.py flags ...]        flags default to -x 2 -v 100 -s 0
# A run's output is in $TMPDIR/exit_loop.*/run_K.log; the last lines of a failed one are shown.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
runs=${1:-30}
shift $(( $# > 0 ? 1 : 0 ))
flags=("$@")
(( ${#flags[@]} )) || flags=(-x 2 -v 100 -s 0)
data=dev/data/tinyshakespeare
logs=$(mktemp -d "${TMPDIR:-/tmp}/exit_loop.XXXXXX")

passed=0
for ((k = 1; k <= runs; k++)); do
    rm -f "$data"/tiny_shakespeare_{train,val}.bin "$data"/tiny_shakespeare.txt \
          "$data"/shakespeare_plays.txt
    "$PYTHON" -X faulthandler train.py "${flags[@]}" > "$logs/run_$k.log" 2>&1
    status=$?
    echo "run $k/$runs: exit status $status"
    if (( status == 0 )); then
        passed=$((passed + 1))
    else
        tail -n 15 "$logs/run_$k.log" | sed 's/^/    /'
    fi
done
echo "$passed of $runs runs exited 0 (logs in $logs)"
(( passed == runs ))
