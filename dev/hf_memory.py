"""
dev/hf_memory.py: the README's table of today's small open models (train_llama2.PRESETS of their
shapes) with the memory llm.pyx allocates for each, computed as train.py --dry-run computes it
(llmc/dry_run.py's memory_plan: the model's own layout), nothing allocated.

    python dev/hf_memory.py                  # B=1, T=1024, recompute all
    python dev/hf_memory.py -b 4 -t 512
    python dev/hf_memory.py --load FOLDER --precision bf16   # a load's peak, measured (Linux)
    python dev/hf_memory.py --load FOLDER --precision bf16 --frozen   # ... for inference or LoRA

    inference   the parameters and one forward's activations, of a model made for inference or
                as a LoRA base (llmc/model.pyx's trainable=False: at bf16 no float32 master
                weights; finetune.py --method lora makes its base so)
    training    full fine-tuning or training: parameters, their gradients, AdamW's m and v,
                the activations under the recompute policy and their gradients
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from accel.hooks import format_bytes  # noqa: E402
from llmc.dry_run import memory_plan  # noqa: E402
from llmc.families import get_family  # noqa: E402

# preset -> its Hugging Face repository (llama-1b is TinyLlama-1.1B's shape)
MODELS = {
    "SmolLM2-135M": "HuggingFaceTB/SmolLM2-135M", "SmolLM2-360M": "HuggingFaceTB/SmolLM2-360M",
    "Qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B", "Qwen3-0.6B": "Qwen/Qwen3-0.6B",
    "llama-1b": "TinyLlama/TinyLlama_v1.1", "Llama-3.2-1B": "meta-llama/Llama-3.2-1B",
    "Qwen2.5-1.5B": "Qwen/Qwen2.5-1.5B", "SmolLM2-1.7B": "HuggingFaceTB/SmolLM2-1.7B",
    "Qwen3-1.7B": "Qwen/Qwen3-1.7B", "Llama-3.2-3B": "meta-llama/Llama-3.2-3B",
    "Mistral-7B-v0.3": "mistralai/Mistral-7B-v0.3",
}


def needs(family, config, B, T, policy, precision):
    """(inference bytes, training bytes) of the model at the precision."""
    plan = memory_plan(family.model_class, config, B, T, policy, precision=precision)
    frozen = memory_plan(family.model_class, config, B, T, policy, precision=precision,
                         trainable=False)
    inference = frozen["params"] + frozen["activations"] + frozen["tokens"]
    return inference, sum(plan.values())


def table(B, T, policy):
    family = get_family("llama")
    rows = ["| model | parameters | switches | inference fp32 | inference bf16 | training fp32 "
            "| training bf16 |", "|---|---|---|---|---|---|---|"]
    for preset, repo in MODELS.items():
        config = family.presets[preset]
        cells = [format_bytes(b) for precision in ("fp32", "bf16")
                 for b in needs(family, config, B, T, policy, precision)]
        switches = ", ".join(config.switches()) or "Llama 2's block"
        rows.append(f"| [{repo}](https://huggingface.co/{repo}) | "
                    f"{config.num_parameters() / 1e6:,.0f}M | {switches} | {cells[0]} | {cells[2]} "
                    f"| {cells[1]} | {cells[3]} |")
    return "\n".join(rows)


def status(key):
    """A /proc/self/status value in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(key)).split()[1]) * 1024


def measure_load(folder, precision, trainable=True):
    """The peak resident memory of loading the model at folder (trainable: llmc/model.pyx's),
    above the process's before it, as a multiple of its safetensors files' bytes (the peak
    reset first: VmHWM)."""
    from llmc.families import family_of_file
    from llmc.formats.huggingface import safetensors_files
    family, _ = family_of_file(folder)   # the modules imported, the backend made, first
    family.model_class(family.config_class.from_name("d1", vocab_size=8), precision=precision)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    family.model_class.from_checkpoint(folder, precision=precision, trainable=trainable)
    weights = sum(os.path.getsize(path) for path in safetensors_files(folder))
    peak = status("VmHWM") - before
    print(f"{folder} at {precision}{'' if trainable else ', trainable=False'}: peak {peak / 2**30:.2f} GiB above the process's memory "
          f"before the load, {peak / weights:.2f}x the weights' {weights / 2**30:.2f} GiB")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("-b", "--batch", type=int, default=1, help="batch size B (default: 1)")
    p.add_argument("-t", "--seq", type=int, default=1024, help="sequence length T (default: 1024)")
    p.add_argument("--recompute", default="all", help="the recompute policy (default: all)")
    p.add_argument("--load", metavar="FOLDER", help="measure loading this Hugging Face folder")
    p.add_argument("--precision", default="fp32", help="--load's precision (default: fp32)")
    p.add_argument("--frozen", action="store_true",
                   help="--load for inference or as a LoRA base (trainable=False)")
    args = p.parse_args(argv)
    if args.load:
        measure_load(args.load, args.precision, trainable=not args.frozen)
        return
    print(f"B={args.batch}, T={args.seq}, recompute {args.recompute}:\n")
    print(table(args.batch, args.seq, args.recompute))


if __name__ == "__main__":
    main()
