#!/usr/bin/env bash
# The Open LLM Leaderboard's first evaluations (v1, the set llm.c's dev/eval runs) by EleutherAI's
# lm-evaluation-harness, on a model exported for Hugging Face transformers
# (python dev/export.py MODEL --format hf -o EXPORT_DIR), each task at the leaderboard's shots:
#   ARC-Challenge 25-shot (acc_norm), HellaSwag 10-shot (acc_norm), MMLU 5-shot (acc),
#   TruthfulQA 0-shot (mc2), Winogrande 5-shot (acc), GSM8K 5-shot (exact match)
#
#   dev/eval/run_eval.sh EXPORT_DIR [OUT]        OUT defaults to EXPORT_DIR/eval
#
# lm-eval downloads the tasks' datasets from Hugging Face (online); this script fetches
# nothing itself.  Each task's results go to OUT/<task>_<shots>shot/; the last lines are the
# six scores and their average.  The model runs in float32 at batch size 1, on a GPU where
# torch sees one; LM_EVAL_ARGS adds lm-eval options (later ones win), e.g.
# LM_EVAL_ARGS="--device cuda:1 --batch_size auto" or "--limit 20" for a quick look.
set -euo pipefail
PYTHON=${PYTHON:-python3}
if (( $# < 1 || $# > 2 )); then
    echo "usage: dev/eval/run_eval.sh EXPORT_DIR [OUT]" >&2
    exit 2
fi
model=$1
out=${2:-$model/eval}
if [[ ! -f $model/config.json ]]; then
    echo "run_eval.sh: error: $model: no config.json: not a Hugging Face model folder (python" \
         "dev/export.py MODEL --format hf -o $model writes one)" >&2
    exit 1
fi
if ! "$PYTHON" -c "import lm_eval.models.huggingface" 2>/dev/null; then
    echo "run_eval.sh: error: needs lm-evaluation-harness with its Hugging Face model: pip" \
         "install 'lm-eval[hf]'" >&2
    exit 1
fi

TASKS=(arc_challenge:25 hellaswag:10 mmlu:5 truthfulqa_mc2:0 winogrande:5 gsm8k:5)
for spec in "${TASKS[@]}"; do
    task=${spec%:*} shots=${spec#*:}
    echo "run_eval.sh: $task, $shots-shot"
    # shellcheck disable=SC2086  # LM_EVAL_ARGS is split into options on purpose
    "$PYTHON" -m lm_eval run --model hf --model_args "pretrained=$model,dtype=float32" \
        --tasks "$task" --num_fewshot "$shots" --batch_size 1 \
        --output_path "$out/${task}_${shots}shot" ${LM_EVAL_ARGS:-}
done

"$PYTHON" - "$out" "${TASKS[@]}" <<'SUMMARY'
import glob, json, os, sys
out, specs = sys.argv[1], sys.argv[2:]
# the leaderboard's metric of each task: its name in lm-eval's results, and in the table
METRICS = {"arc_challenge": ("acc_norm,none", "acc_norm"), "hellaswag": ("acc_norm,none", "acc_norm"),
           "mmlu": ("acc,none", "acc"), "truthfulqa_mc2": ("acc,none", "mc2"),
           "winogrande": ("acc,none", "acc"), "gsm8k": ("exact_match,strict-match", "exact_match")}
scores = []
print("-" * 48)
for spec in specs:
    task, shots = spec.split(":")
    found = sorted(glob.glob(os.path.join(out, f"{task}_{shots}shot", "**", "results_*.json"),
                             recursive=True), key=os.path.getmtime)
    key, label = METRICS[task]
    scores.append(100 * json.load(open(found[-1]))["results"][task][key])
    print(f"{task + ' ' + shots + '-shot':<28} {label:<12} {scores[-1]:6.2f}")
print("-" * 48)
print(f"{'average':<41} {sum(scores) / len(scores):6.2f}")
SUMMARY
