"""
dev/gpu/bench_gpu.py: a training step of llm.pyx on a GPU backend, next to PyTorch on the same GPU.

Times N training steps (forward with targets, zero_grad, backward, AdamW update, the device
synchronized after each) of train_gpt2.GPT on --backend (default hip), and of the same model in
PyTorch on the GPU: eager (train_gpt2_torch.GPT, torch.optim.AdamW(fused=True)) and
torch.compile. Same parameters, same batch, each side in its own process, in this one run.
All fp32 without TF32 on every side: accel/hip leaves cuBLAS/hipBLAS in their default math mode
(no TF32), and PyTorch's matmul and cuDNN TF32 switches are set off explicitly.

    python dev/gpu/bench_gpu.py                          d12, B=4, T=1024
    python dev/gpu/bench_gpu.py -b 4 -t 64 --no-compile
    python dev/gpu/bench_gpu.py --backend hip-emu --torch-device cpu -e 1 -b 1 -t 8 --no-compile
                                                  the script's own test, where there is no GPU

Prints ms/step (median, min-max) and tokens/s of each, the ratios llm.pyx / PyTorch eager and
llm.pyx / torch.compile, and the first and last losses of each (same start: they must agree).
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from dev.bench_step import ADAMW, batch, json_worker, summarize  # noqa: E402
from train_gpt2 import GPT2Config  # noqa: E402


def config_for(args):
    return GPT2Config.from_depth(args.depth)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-e", "--depth", type=int, default=12, help="model depth dN (12: GPT-2 124M)")
    p.add_argument("-b", "--batch", type=int, default=4, help="batch size B")
    p.add_argument("-t", "--seq", type=int, default=1024, help="sequence length T")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (torch.compile compiles here)")
    p.add_argument("--backend", default="hip", help="llm.pyx's backend")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--torch-device", default="cuda", help="PyTorch's device (cpu: to test this script)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--worker", choices=["llmpyx", "eager", "compile"], help=argparse.SUPPRESS)
    p.add_argument("--params", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker_llmpyx(args):
    from train_gpt2 import GPT2
    config = config_for(args)
    model = GPT2.random(config, seed=0, backend=args.backend)
    np.save(args.params, model.params)
    x, y = batch(config, args.batch, args.seq)
    losses, times = [], []
    for t in range(1, args.warmup + args.steps + 1):
        start = time.perf_counter()
        loss = model.forward(x, y)
        model.zero_grad()
        model.backward()
        model.update(ADAMW["lr"], ADAMW["beta1"], ADAMW["beta2"], ADAMW["eps"], ADAMW["weight_decay"], t)
        model.backend.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss)
    return dict(times=times[args.warmup:], losses=losses, device=getattr(model.backend, "device", ""))


def worker_torch(args):
    import torch
    import train_gpt2_torch
    on_gpu = args.torch_device != "cpu"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("dev/gpu/bench_gpu.py: this PyTorch sees no GPU (a CPU-only build?)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_default_device(args.torch_device)  # the reference model makes its position ids with arange
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    config = config_for(args)
    model = train_gpt2_torch.build_model(config, np.load(args.params))
    optimizer = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                                  eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"], fused=True)
    step_model = torch.compile(model) if args.worker == "compile" else model
    x, y = (torch.from_numpy(a.astype(np.int64)).to(args.torch_device) for a in batch(config, args.batch, args.seq))
    losses, times = [], []
    for _ in range(args.warmup + args.steps):
        synchronize()
        start = time.perf_counter()
        _, loss = step_model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return dict(times=times[args.warmup:], losses=losses, torch=torch.__version__,
                device=torch.cuda.get_device_name() if on_gpu else "cpu")


def run_worker(kind, args, params):
    argv = ["--worker", kind, "-e", str(args.depth), "-b", str(args.batch), "-t", str(args.seq),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--backend", args.backend,
            "--torch-device", args.torch_device, "--params", params]
    try:
        return json_worker(__file__, argv)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker = worker_llmpyx if args.worker == "llmpyx" else worker_torch
        print(json.dumps(worker(args)))
        return 0
    config = config_for(args)
    B, T = args.batch, args.seq
    print(f"training step: d{args.depth} ({config.num_parameters() / 1e6:.1f}M parameters), B={B} T={T}, "
          f"fp32 (no TF32), {args.warmup} warm-up + {args.steps} timed steps", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as tmp:
        params = os.path.join(tmp, "params.npy")
        results = {"llm.pyx": run_worker("llmpyx", args, params)}   # writes params first
        results["PyTorch eager"] = run_worker("eager", args, params)
        if not args.no_compile:
            results["torch.compile"] = run_worker("compile", args, params)
    print(f"llm.pyx on {args.backend}: {results['llm.pyx']['device']}; PyTorch {results['PyTorch eager']['torch']} "
          f"on {results['PyTorch eager']['device']}\n")
    print(f"{'':<14} {'ms/step':>9} {'min-max ms':>17} {'tokens/s':>9}  losses (first .. last)")
    rows = {}
    for name, r in results.items():
        s = summarize(r["times"])
        rows[name] = dict(s, losses=r["losses"])
        print(f"{name:<14} {s['median'] * 1e3:9.1f} {s['min'] * 1e3:8.1f}-{s['max'] * 1e3:<8.1f} "
              f"{B * T / s['median']:9.0f}  {r['losses'][0]:.6f} .. {r['losses'][-1]:.6f}")
    print()
    for name in ("PyTorch eager", "torch.compile"):
        if name in rows:
            ratio = rows["llm.pyx"]["median"] / rows[name]["median"]
            print(f"llm.pyx / {name}: {ratio:.3f} of the time per step ({1 / ratio:.2f}x the speed)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), results=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
