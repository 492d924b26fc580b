"""
dev/metal/bench_metal.py: a GPT-2 training step of llm.pyx on Metal, next to PyTorch's MPS backend
and MLX on the same Mac.

Times N training steps (forward with targets, zero_grad, backward, AdamW update, the device
synchronized after each) of train_gpt2.GPT2 on --backend (default metal), of the same model in
PyTorch eager on --torch-device (default mps; train_gpt2_torch.GPT, torch.optim.AdamW), and, when
MLX is installed, of the same model written here in MLX (mlx.core, value_and_grad,
mlx.optimizers.AdamW with bias correction). Same parameters, same batch, each side in its own
process, in this one run, at each --precision: fp32; fp16 (llm.pyx's half precision with loss
scaling, PyTorch's float16 autocast on the device, MLX's forward on float16 casts of its float32
parameters); bf16 likewise (bfloat16; Metal's needs macOS 14).  A side that cannot run at a
precision (an older PyTorch without MPS autocast) is a row saying why.

    python dev/metal/bench_metal.py                            d12, B=4, T=1024, fp32
    python dev/metal/bench_metal.py --precision all            fp32, fp16 and bf16
    python dev/metal/bench_metal.py -e 4 -b 4 -t 256
    python dev/metal/bench_metal.py --backend metal-emu --torch-device cpu -e 1 -b 1 -t 8 --steps 1
                                                 the script's own test, where there is no Mac
                                                 (MLX on its CPU build, if installed)

Prints ms/step (median, min-max) and tokens/s of each side, the ratios llm.pyx / PyTorch and
llm.pyx / MLX at each precision and llm.pyx's fp16 and bf16 over its fp32, and the first and
last losses of each (same start: they must agree).
NOT YET RUN ON A MAC (accel/metal/README.md).
"""
import argparse
import contextlib
import importlib.util
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from dev.bench_step import ADAMW, batch, config_for, json_worker, summarize, torch_steps  # noqa: E402
from dev.gpu.bench_gpu import worker_llmpyx  # noqa: E402  (any backend: synchronizes it)

PRECISIONS = ("fp32", "fp16", "bf16")
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}   # PyTorch's and MLX's names


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-e", "--depth", type=int, default=12, help="model depth dN (12: GPT-2 124M)")
    p.add_argument("-b", "--batch", type=int, default=4, help="batch size B")
    p.add_argument("-t", "--seq", type=int, default=1024, help="sequence length T")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--backend", default="metal", help="llm.pyx's backend")
    p.add_argument("--torch-device", default="mps", help="PyTorch's device (cpu: to test this script)")
    p.add_argument("--no-mlx", action="store_true", help="skip MLX even where it is installed")
    p.add_argument("--precision", choices=[*PRECISIONS, "all"], default="fp32",
                   help="the precisions timed (default fp32)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--worker", choices=["llmpyx", "torch", "mlx"], help=argparse.SUPPRESS)
    p.add_argument("--worker-precision", default="fp32", help=argparse.SUPPRESS)
    p.add_argument("--params", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.model = None   # GPT-2 (dev/bench_step.py's config_for and family_for)
    return args


def worker_torch(args):
    import torch
    import train_gpt2_torch
    if args.torch_device == "mps" and not torch.backends.mps.is_available():
        raise SystemExit("dev/metal/bench_metal.py: this PyTorch has no MPS device (not a Mac, or too old)")
    synchronize = torch.mps.synchronize if args.torch_device == "mps" else (lambda: None)
    torch.set_default_device(args.torch_device)
    config = config_for(args)
    model = train_gpt2_torch.build_model(config, np.load(args.params))
    optimizer = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                                  eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
    x, y = (torch.from_numpy(a.astype(np.int64)).to(args.torch_device) for a in batch(config, args.batch, args.seq))
    dtype = DTYPES.get(args.worker_precision)
    autocast = (lambda: torch.autocast(args.torch_device, dtype=getattr(torch, dtype))) if dtype else \
        contextlib.nullcontext
    losses, times = torch_steps(model, optimizer, x, y, autocast, args.warmup + args.steps, synchronize)
    return dict(times=times[args.warmup:], losses=losses, version=f"PyTorch {torch.__version__}",
                device=args.torch_device)


def mlx_loss(p, x, y, config, dtype=None):
    """GPT-2's mean cross-entropy in MLX, from llm.c's parameter tensors (wte's padding rows
    take part and get zero gradient); with a dtype, the forward on casts of the parameters to
    it (the loss in float32), as autocast's mixed precision."""
    import mlx.core as mx
    import mlx.nn as nn
    if dtype is not None:
        p = {name: value.astype(getattr(mx, dtype)) for name, value in p.items()}
    B, T = x.shape
    C, NH, V = config.channels, config.num_heads, config.vocab_size
    hs = C // NH

    def layernorm(h, w, b):
        mean = mx.mean(h, axis=-1, keepdims=True)
        var = mx.mean(mx.square(h - mean), axis=-1, keepdims=True)
        return (h - mean) * mx.rsqrt(var + 1e-5) * w + b

    def heads(t):
        return t.reshape(B, T, NH, hs).transpose(0, 2, 1, 3)

    mask = mx.triu(mx.full((T, T), -math.inf), k=1)
    h = p["wte"][x] + p["wpe"][:T]
    for l in range(config.num_layers):
        a = layernorm(h, p["ln1w"][l], p["ln1b"][l])
        q, k, v = mx.split(a @ p["qkvw"][l].T + p["qkvb"][l], 3, axis=-1)
        q, k, v = heads(q), heads(k), heads(v)
        att = mx.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(hs) + mask, axis=-1)
        out = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        h = h + out @ p["attprojw"][l].T + p["attprojb"][l]
        a = layernorm(h, p["ln2w"][l], p["ln2b"][l])
        f = nn.gelu_approx(a @ p["fcw"][l].T + p["fcb"][l])
        h = h + f @ p["fcprojw"][l].T + p["fcprojb"][l]
    logits = layernorm(h, p["lnfw"], p["lnfb"]) @ p["wte"][:V].T
    return mx.mean(nn.losses.cross_entropy(logits.astype(mx.float32), y))


def worker_mlx(args):
    import mlx.core as mx
    import mlx.optimizers as optim
    from llmc.formats import param_views
    config = config_for(args)
    params = {name: mx.array(view) for name, view in param_views(config, np.load(args.params)).items()}
    optimizer = optim.AdamW(learning_rate=ADAMW["lr"], betas=[ADAMW["beta1"], ADAMW["beta2"]], eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], bias_correction=True)
    x, y = (mx.array(a) for a in batch(config, args.batch, args.seq))
    dtype = DTYPES.get(args.worker_precision)
    loss_and_grad = mx.value_and_grad(lambda p: mlx_loss(p, x, y, config, dtype))
    losses, times = [], []
    for _ in range(args.warmup + args.steps):
        start = time.perf_counter()
        loss, grads = loss_and_grad(params)
        params = optimizer.apply_gradients(grads, params)
        mx.eval(params, loss)   # MLX is lazy: the step runs here
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return dict(times=times[args.warmup:], losses=losses, version=f"MLX {mx.__version__}",
                device=str(mx.default_device()))


def run_worker(kind, precision, args, params):
    """One side at one precision, in its own process: its result, or {"error": why}."""
    argv = ["--worker", kind, "--worker-precision", precision, "-e", str(args.depth), "-b", str(args.batch),
            "-t", str(args.seq), "--steps", str(args.steps), "--warmup", str(args.warmup), "--backend",
            args.backend, "--torch-device", args.torch_device, "--params", params]
    try:
        return json_worker(__file__, argv)
    except RuntimeError as e:
        if kind == "llmpyx" and precision == "fp32":   # the others start from its parameters
            raise SystemExit(str(e)) from None
        return {"error": str(e).strip().splitlines()[-1]}


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker = {"llmpyx": worker_llmpyx, "torch": worker_torch, "mlx": worker_mlx}[args.worker]
        result = worker(args)
        result.setdefault("version", "llm.pyx")
        print(json.dumps(result))
        return 0
    config = config_for(args)
    B, T = args.batch, args.seq
    precisions = PRECISIONS if args.precision == "all" else (args.precision,)
    sides = ["llmpyx", "torch"] + (["mlx"] if not args.no_mlx and importlib.util.find_spec("mlx") else [])
    names = {"llmpyx": "llm.pyx", "torch": "PyTorch", "mlx": "MLX"}
    print(f"training step: d{args.depth} ({config.num_parameters() / 1e6:.1f}M parameters), B={B} T={T}, "
          f"{', '.join(precisions)}, {args.warmup} warm-up + {args.steps} timed steps", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_metal_") as tmp:
        params = os.path.join(tmp, "params.npy")
        # llm.pyx at fp32 first: its worker writes the parameters every side starts from
        for precision in ("fp32",) + tuple(p for p in precisions if p != "fp32"):
            for kind in sides:
                results[f"{names[kind]} {precision}"] = run_worker(kind, precision, args, params)
    results = {name: r for name, r in results.items() if name.split()[1] in precisions}
    for name, r in results.items():
        print(f"{name}: " + (f"{r['version']} on {r['device']}" if "error" not in r else f"not run: {r['error']}"))
    print(f"\n{'':<14} {'ms/step':>9} {'min-max ms':>17} {'tokens/s':>9}  losses (first .. last)")
    rows = {}
    for name, r in results.items():
        if "error" in r:
            continue
        s = summarize(r["times"])
        rows[name] = dict(s, losses=r["losses"], device=r["device"], version=r["version"])
        print(f"{name:<14} {s['median'] * 1e3:9.1f} {s['min'] * 1e3:8.1f}-{s['max'] * 1e3:<8.1f} "
              f"{B * T / s['median']:9.0f}  {r['losses'][0]:.6f} .. {r['losses'][-1]:.6f}")
    for precision in precisions:
        ours = rows.get(f"llm.pyx {precision}")
        for name, row in rows.items():
            if ours is not None and name.endswith(precision) and not name.startswith("llm.pyx"):
                print(f"llm.pyx {precision} / {name}: {ours['median'] / row['median']:.2f}x the time per step")
        if ours is not None and precision != "fp32" and "llm.pyx fp32" in rows:
            print(f"llm.pyx {precision} / llm.pyx fp32: {ours['median'] / rows['llm.pyx fp32']['median']:.2f}x "
                  f"the time per step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(depth=args.depth, B=B, T=T, backend=args.backend, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
