"""
dev/bench_memory.py: what activation checkpointing saves, and what it costs, measured.

Runs training steps of GPT-2 or of a Llama preset (forward, zero_grad, backward, AdamW:
dev/bench_step.py's step)
under each recompute policy (llmc/recompute.py), each policy in a fresh process so that each
has its own peak RSS, and prints per policy: the peak RSS (ru_maxrss), the bytes the model
allocated (Model.memory(), what llmc/dry_run.py plans), the activations' share of them, the step
time (median) and its ratio to "all" in the same run, and the losses (the same for every
policy: the gradients are bit-identical).  With --rounds 2 the policies run A B C A B C, so a
noisy neighbour hurts all alike.

    python dev/bench_memory.py                        d12, B=4, T=256, 2 threads
    python dev/bench_memory.py -e 6 -t 128 --policies all,sqrt --steps 3
    python dev/bench_memory.py --model stories110M     a Llama preset
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from dev.bench_step import (batch, config_for, family_for, json_worker,  # noqa: E402
                            llmpyx_steps, peak_rss_bytes)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-e", "--depth", type=int, default=12, help="model depth dN (12: GPT-2 124M)")
    p.add_argument("--model", help="a Llama preset (train_llama2.PRESETS) instead of GPT-2 dN")
    p.add_argument("-b", "--batch", type=int, default=4, help="batch size B")
    p.add_argument("-t", "--seq", type=int, default=256, help="sequence length T")
    p.add_argument("--policies", default="all,every-2,sqrt,boundary,none",
                   help="comma-separated recompute policies")
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the workers")
    p.add_argument("--steps", type=int, default=2, help="timed steps per policy and round")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--rounds", type=int, default=1, help="rounds over the policies, interleaved")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(args):
    Model = family_for(args).model_class
    config = config_for(args)
    model = Model.random(config, seed=0, recompute=args.worker)
    x, y = batch(config, args.batch, args.seq)
    losses, times = llmpyx_steps(model, x, y, 1, args.warmup + args.steps)
    return dict(rss=peak_rss_bytes(), memory=model.memory(), times=times[args.warmup:],
                losses=losses)


def run_worker(policy, args):
    argv = ["--worker", policy, "-e", str(args.depth), "-b", str(args.batch), "-t", str(args.seq),
            "--steps", str(args.steps), "--warmup", str(args.warmup)]
    argv += ["--model", args.model] if args.model else []
    return json_worker(__file__, argv, dict(os.environ, OMP_NUM_THREADS=str(args.threads)))


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    from llmc.recompute import parse_policy
    policies = [parse_policy(p.strip()) for p in args.policies.split(",")]
    name = args.model or f"GPT-2 d{args.depth}"
    print(f"llm.pyx training step under each recompute policy: {name}, "
          f"B={args.batch} T={args.seq}, {args.threads} threads, {args.warmup} warm-up + "
          f"{args.steps} timed steps x {args.rounds} rounds, each policy in its own process",
          flush=True)
    runs = {policy: [] for policy in policies}
    for _ in range(args.rounds):
        for policy in policies:
            runs[policy].append(run_worker(policy, args))
    MiB = 2.0 ** 20
    median = {p: float(np.median([t for r in rs for t in r["times"]])) for p, rs in runs.items()}
    first = policies[0]
    print(f"\n{'policy':<10} {'peak RSS':>10} {'allocated':>10} {'activations':>12} "
          f"{'ms/step':>9} {'vs ' + first:>8}")
    for policy, rs in runs.items():
        memory = rs[0]["memory"]
        print(f"{policy:<10} {max(r['rss'] for r in rs) / MiB:7.0f} MiB "
              f"{sum(memory.values()) / MiB:6.0f} MiB "
              f"{(memory['activations'] + memory['activation_grads']) / MiB:8.0f} MiB "
              f"{median[policy] * 1e3:9.0f} {median[policy] / median[first]:7.2f}x")
    losses = {p: rs[0]["losses"] for p, rs in runs.items()}
    same = all(l == losses[first] for l in losses.values())
    print(f"\nlosses {losses[first][0]:.6f} .. {losses[first][-1]:.6f}: "
          f"{'bit-identical across the policies' if same else 'DIFFERENT: ' + repr(losses)}")
    print("(allocated: Model.memory(), all buffers; activations: the kept activations and "
          "their gradients)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
