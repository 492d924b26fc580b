#!/usr/bin/env bash
# dev/ane/check_and_time.sh — the ANE backend on a Mac (Apple silicon, macOS 13+): the Core ML
# path, then the private one; each piece's parity against the CPU, 20 training steps of
# stories15M and stories110M in each pipeline, and ms a step against the project's published
# figures for the chip.  Nothing of it has run yet: there was no Mac (accel/ane/README.md).
#
#   bash dev/ane/check_and_time.sh             everything below, logs into $OUT (default out_ane/)
#   DRY_RUN=1 bash dev/ane/check_and_time.sh   print the steps, check the tools, and run only
#                                              the planner's dry runs (they work on any machine)
#
#   1. build: make train_gpt2 (coremltools from requirements.txt); make ane-private for step 3
#   2. Core ML (LLMPYX_ANE_RUNTIME=coreml): every entry of the ANE's table through check:ane
#      against the CPU kernels at the ANE's fp16 tolerances (tests/entries.py), then for
#      stories15M and stories110M, static and dynamic: the planner's dry run, and 20 steps of
#      train.py --backend ane -b 1 -t 256 (random init, tinyshakespeare) with --json-log
#   3. the private API (LLMPYX_ANE_RUNTIME=private: every kernel checked against Core ML's
#      outputs before it is trusted): the same
#   4. ms a step: each run's mean (the JSON log's report, the first step left out) beside the
#      published figure for stories110M on this chip (91 ms M4, 64 ms M4 Max); their batch and
#      sequence are the anchor's, this runs B=1 T=256: an indication, not a like-for-like race
# A refused run (a static step needing more compiles than a process's 109, as llama-1b's 134:
# one line, README.md; stories110M's 74 restart every step) is said and the script goes on; any
# other failure stops it with its log's tail.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-out_ane}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
STEPS=${STEPS:-20}
mkdir -p "$OUT"

# run NAME COMMAND...: the command with its output in $OUT/NAME.log (and on the terminal);
# status 0, or 2 for a run train.py refused in one line ("train.py: error: ...")
run() {
    local name=$1
    shift
    echo "== $name: $*"
    [ "$DRY_RUN" = 1 ] && return 0
    if "$@" > "$OUT/$name.log" 2>&1; then
        tail -n 3 "$OUT/$name.log"
        return 0
    fi
    if tail -n 1 "$OUT/$name.log" | grep -q "^train.py: error: "; then
        echo "   refused: $(tail -n 1 "$OUT/$name.log")"
        return 2
    fi
    echo "check_and_time.sh: step '$name' failed (log: $OUT/$name.log):" >&2
    tail -n 15 "$OUT/$name.log" >&2
    exit 1
}

chip=unknown
if [ "$(uname -s)" = Darwin ]; then
    chip=$(sysctl -n machdep.cpu.brand_string 2>/dev/null || echo unknown)
    echo "machine: $chip, macOS $(sw_vers -productVersion 2>/dev/null || echo '?')"
else
    echo "check_and_time.sh: not a Mac ($(uname -s)): the Neural Engine needs macOS" >&2
    [ "$DRY_RUN" = 1 ] || exit 1
    echo "(dry run: the steps that would run, and the planner's dry runs)"
fi

run build "$PYTHON" dev/ensure_requirements.py requirements.txt
run build-product make train_gpt2
run build-private make ane-private

parity() {   # every entry of check:ane against the CPU (accel/ane/table.pyx's tolerances)
    "$PYTHON" - <<'EOF'
import sys
sys.path.insert(0, "tests")
from accel.backend import get_backend
from entries import run_every_entry
backend = get_backend("check:ane")
run_every_entry(backend, groups=("linear", "llama"))
print(backend.summary())
sys.exit(backend.report()["mismatches"] != 0)
EOF
}

mean_ms() {   # the mean ms a step of a JSON log's report
    "$PYTHON" -c 'import json, sys
report = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "report"]
print(f"{report[-1][\"mean_ms\"]:.1f}" if report else "none")' "$1"
}

published() {   # stories110M's ms a step on this chip, the project's figures
    case "$chip" in
        *"M4 Max"*) echo 64 ;;
        *"M4"*) echo 91 ;;
        *) echo "" ;;
    esac
}

results=()
for runtime in coreml private; do
    export LLMPYX_ANE_RUNTIME=$runtime
    if [ "$DRY_RUN" = 1 ]; then
        echo "== parity-$runtime: check:ane on every entry (tests/entries.py), LLMPYX_ANE_RUNTIME=$runtime"
    else
        run "parity-$runtime" parity
    fi
    for model in stories15M stories110M; do
        for pipeline in dynamic static; do
            name="$runtime-$model-$pipeline"
            # the plan runs here too, on any machine: train.py --dry-run
            echo "== plan-$name: $PYTHON train.py --model $model --backend ane --dry-run --ane-pipeline $pipeline -b 1 -t 256"
            "$PYTHON" train.py --model "$model" --backend ane --dry-run --ane-pipeline "$pipeline" \
                -b 1 -t 256 > "$OUT/plan-$name.log"
            grep -E "^(compiles per step|restarts)" "$OUT/plan-$name.log" | sed 's/^/   /'
            status=0
            run "train-$name" "$PYTHON" train.py --model "$model" --backend ane \
                --ane-pipeline "$pipeline" -b 1 -t 256 -x "$STEPS" -s 0 -v 1000 \
                -o "$OUT/run-$name" --overwrite --json-log || status=$?
            [ "$DRY_RUN" = 1 ] && continue
            if [ "$status" = 0 ]; then
                results+=("$name $(mean_ms "$OUT/run-$name/log.jsonl")")
            else
                results+=("$name refused")
            fi
        done
    done
done
unset LLMPYX_ANE_RUNTIME

[ "$DRY_RUN" = 1 ] && exit 0
figure=$(published)
echo "ms a step (mean, the first step left out), B=1 T=256, on $chip:"
for line in "${results[@]}"; do
    set -- $line
    note=""
    if [[ "$1" == *stories110M* && -n "$figure" && "$2" != refused ]]; then
        note="  (published for this chip: $figure ms)"
    fi
    echo "  $1: $2${2:+ ms}$note" | sed 's/refused ms/refused/'
done
[ -n "$figure" ] || echo "(no published figure for this chip: the project has M4 91 ms, M4 Max 64 ms)"
