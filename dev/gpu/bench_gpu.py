"""
dev/gpu/bench_gpu.py: a training step of llm.pyx on a GPU backend, next to PyTorch and llm.c on
the same GPU, in one run.

Times N training steps (forward with targets, zero_grad, backward, AdamW update, the device
synchronized after each) of llm.pyx's model on --backend (default hip), and of the same model in
PyTorch on the same GPU: eager (the family's reference module, torch.optim.AdamW(fused=True))
and torch.compile, each in fp32 and under bf16 autocast (torch.autocast("cuda",
dtype=torch.bfloat16) around the forward and the loss, fp32 parameters and AdamW, as llm.c's
train_gpt2.py --dtype bfloat16); and, for GPT-2 d12 with --llmc DIR, llm.c's own CUDA trainers
(dev/gpu/llmc_peer.py: train_gpt2_fp32.cu, train_gpt2.cu at PRECISION=BF16). Same parameters
(llm.pyx's random init, written for the others), same shapes, each side in its own process.
fp32 is without TF32 on llm.pyx's and PyTorch's sides: accel/hip leaves cuBLAS/hipBLAS in their
default math mode, and PyTorch's matmul and cuDNN TF32 switches are set off; llm.c's fp32 trainer
turns TF32 on by its own design (no flag turns it off), which its row says.

    python dev/gpu/bench_gpu.py                          GPT-2 d12, B=8, T=1024, fp32 and bf16
    python dev/gpu/bench_gpu.py --llmc shared/llm.c      ... and llm.c beside them (built first:
                                                         python dev/gpu/llmc_peer.py build)
    python dev/gpu/bench_gpu.py --model stories110M      Llama 2 stories110M (PyTorch only: llm.c
                                                         has no Llama)
    python dev/gpu/bench_gpu.py --precision bf16 --no-compile
    python dev/gpu/bench_gpu.py --backend hip-emu --torch-device cpu -e 1 -b 1 -t 8 --no-compile
                                                  the script's own test, where there is no GPU

Prints ms/step (median, min-max) and tokens/s of each side, the first and last losses (same
start: at fp32 they must agree), and the ratios of llm.pyx's time to each peer's at the same
precision, with issue 22's targets at bf16: llm.pyx / llm.c bf16 at most 1.0, llm.pyx /
PyTorch bf16-autocast eager at most 0.6.
"""
import argparse
import contextlib
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from dev.bench_step import (ADAMW, batch, config_for, family_for, json_worker, reference_module,  # noqa: E402
                            llmpyx_steps, summarize, torch_steps)

PRECISIONS = ("fp32", "bf16")
# issue 22's targets at bf16: llm.pyx's time per step over each peer's
TARGETS = {"llm.c bf16": 1.0, "PyTorch eager bf16": 0.6}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-e", "--depth", type=int, default=12, help="GPT-2's depth dN (12: GPT-2 124M)")
    p.add_argument("--model", help="a Llama 2 model instead: a preset (stories110M, ...) or dN")
    p.add_argument("-b", "--batch", type=int, default=8, help="batch size B")
    p.add_argument("-t", "--seq", type=int, default=1024, help="sequence length T")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (torch.compile compiles here)")
    p.add_argument("--precision", choices=[*PRECISIONS, "both"], default="both", help="the precisions timed")
    p.add_argument("--backend", default="hip", help="llm.pyx's backend")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--llmc", help="llm.c's checkout with its trainers built (GPT-2 d12 only): time them too")
    p.add_argument("--torch-device", default="cuda", help="PyTorch's device (cpu: to test this script)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--worker", choices=["llmpyx", "eager", "compile"], help=argparse.SUPPRESS)
    p.add_argument("--worker-precision", choices=PRECISIONS, help=argparse.SUPPRESS)
    p.add_argument("--params", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.llmc and (args.model or args.depth != 12):
        p.error("--llmc times GPT-2 d12 only (llm.c's trainers are GPT-2's; -e 12, no --model)")
    return args


def worker_llmpyx(args):
    config = config_for(args)
    model = family_for(args).model_class.random(config, seed=0, backend=args.backend,
                                                precision=args.worker_precision)
    if args.params:
        np.save(args.params, model.params)   # float32 (at bf16: the master weights)
    x, y = batch(config, args.batch, args.seq)
    losses, times = llmpyx_steps(model, x, y, 1, args.warmup + args.steps)
    return dict(times=times[args.warmup:], losses=losses, device=getattr(model.backend, "device", ""))


def worker_torch(args):
    import torch
    on_gpu = args.torch_device != "cpu"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("dev/gpu/bench_gpu.py: this PyTorch sees no GPU (a CPU-only build?)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_default_device(args.torch_device)  # the reference models make their position ids with arange
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    config = config_for(args)
    model = reference_module(args).build_model(config, np.load(args.params))
    optimizer = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                                  eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"], fused=True)
    step_model = torch.compile(model) if args.worker == "compile" else model
    autocast = (lambda: torch.autocast("cuda" if on_gpu else "cpu", dtype=torch.bfloat16)) \
        if args.worker_precision == "bf16" else contextlib.nullcontext
    x, y = (torch.from_numpy(a.astype(np.int64)).to(args.torch_device) for a in batch(config, args.batch, args.seq))
    losses, times = torch_steps(step_model, optimizer, x, y, autocast, args.warmup + args.steps, synchronize)
    return dict(times=times[args.warmup:], losses=losses, torch=torch.__version__,
                device=torch.cuda.get_device_name() if on_gpu else "cpu")


def run_worker(kind, precision, args, params):
    argv = ["--worker", kind, "--worker-precision", precision, "-e", str(args.depth), "-b", str(args.batch),
            "-t", str(args.seq), "--steps", str(args.steps), "--warmup", str(args.warmup), "--backend", args.backend,
            "--torch-device", args.torch_device, "--params", params] + (["--model", args.model] if args.model else [])
    try:
        return json_worker(__file__, argv)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None


def run_llmc(args, precision, params):
    from dev.gpu import llmc_peer
    try:
        return llmc_peer.time_steps(args.llmc, precision, np.load(params), args.batch, args.seq, args.steps,
                                    args.warmup)
    except llmc_peer.PeerError as e:
        raise SystemExit(f"dev/gpu/bench_gpu.py: {e}") from None


def sides(args):
    """[(row name, precision, how to run it)] in the order they run: llm.pyx first (its first
    run writes the parameters the others start from)."""
    precisions = PRECISIONS if args.precision == "both" else (args.precision,)
    rows = [(f"llm.pyx {p}", p, "llmpyx") for p in precisions]
    rows += [(f"PyTorch eager {p}", p, "eager") for p in precisions]
    if not args.no_compile:
        rows += [(f"torch.compile {p}", p, "compile") for p in precisions]
    if args.llmc:
        rows += [(f"llm.c {p}", p, "llmc") for p in precisions]
    return rows


def ratio_lines(rows, precisions):
    """llm.pyx's time over each peer's at the same precision, with the targets where there are."""
    lines = []
    for p in precisions:
        ours = rows.get(f"llm.pyx {p}")
        for name, row in rows.items():
            if ours is None or name.startswith("llm.pyx") or not name.endswith(p):
                continue
            ratio = ours["median"] / row["median"]
            line = f"llm.pyx {p} / {name}: {ratio:.3f} of the time per step ({1 / ratio:.2f}x the speed)"
            if name in TARGETS:
                target = TARGETS[name]
                line += f"; issue 22's target: at most {target}, {'met' if ratio <= target else 'NOT met'}"
            lines.append(line)
    return lines


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker = worker_llmpyx if args.worker == "llmpyx" else worker_torch
        print(json.dumps(worker(args)))
        return 0
    config = config_for(args)
    B, T = args.batch, args.seq
    name = args.model or f"GPT-2 d{args.depth}"
    print(f"training step: {name} ({config.num_parameters() / 1e6:.1f}M parameters), B={B} T={T}, "
          f"{args.warmup} warm-up + {args.steps} timed steps; fp32 without TF32 (but llm.c's), bf16: "
          f"llm.pyx's bf16, PyTorch's bf16 autocast, llm.c's PRECISION=BF16", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as tmp:
        params = os.path.join(tmp, "params.npy")
        for row, precision, kind in sides(args):
            print(f"  {row} ...", flush=True)
            results[row] = run_llmc(args, precision, params) if kind == "llmc" else \
                run_worker(kind, precision, args, params)
    first = next(iter(results.values()))
    torch_row = next((r for n, r in results.items() if "torch" in r), None)
    print(f"llm.pyx on {args.backend}: {first['device']}" +
          (f"; PyTorch {torch_row['torch']} on {torch_row['device']}" if torch_row else "") + "\n")
    print(f"{'':<20} {'ms/step':>9} {'min-max ms':>17} {'tokens/s':>9}  losses (first .. last)")
    rows = {}
    for row, r in results.items():
        s = summarize(r["times"])
        rows[row] = dict(s, losses=r["losses"])
        note = "  (TF32 on: llm.c's own choice)" if row == "llm.c fp32" else ""
        print(f"{row:<20} {s['median'] * 1e3:9.1f} {s['min'] * 1e3:8.1f}-{s['max'] * 1e3:<8.1f} "
              f"{B * T / s['median']:9.0f}  {r['losses'][0]:.6f} .. {r['losses'][-1]:.6f}{note}")
    print()
    for line in ratio_lines(rows, PRECISIONS):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), results=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
