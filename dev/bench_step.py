"""
dev/bench_step.py: how fast is a training step of llm.pyx, next to PyTorch on the same machine?

Times N training steps (forward with targets, zero_grad, backward, AdamW update) of the real
training path, train_gpt2.GPT2 on random tokens, and - when PyTorch is installed - the same
step of the same model in PyTorch eager (train_gpt2_torch.GPT, torch.optim.AdamW(fused=True)),
at the same size, batch and thread count, starting from the same parameters.  Each side runs
in its own process (its own OpenMP runtime, its own peak RSS); with --rounds 2 the two are
interleaved A B A B so that a noisy neighbour hurts both alike.

    python dev/bench_step.py                          d12, B=4, T=64, 2 threads (make bench)
    python dev/bench_step.py -t 1024 --steps 3        the long-context end
    python dev/bench_step.py --threads 1
    python dev/bench_step.py --profile                also: where llm.pyx's step time goes
    python dev/bench_step.py --backend NAME           llm.pyx on another backend
    python dev/bench_step.py --model stories15M -t 256  Llama 2 (train_llama2.Llama2 against
                                                      train_llama2_torch.Transformer): a preset
                                                      or a Llama dN

Prints ms/step (median, min-max), tokens/s, the ratio llm.pyx / PyTorch, the model FLOPs
achieved against this machine's measured sgemm peak (kernels.matmul at 2048^3, on the library
the kernels use, kernels/blas.pyx, and the same threads),
the step against GEMM-only (its matmul FLOPs at that sgemm rate: the time of a step that did
nothing else), peak RSS of each side's process and their ratio, and the losses of both sides
(same parameters, same batch: they must agree).
The training path runs as it would from the shell with OMP_NUM_THREADS=--threads: nothing
here changes its BLAS thread settings.
Other environment variables (OMP_WAIT_POLICY, OPENBLAS_NUM_THREADS, ...) pass through.
"""
import argparse
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# the optimizer settings of both sides: llm.c's train_gpt2.c training loop
ADAMW = dict(lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-e", "--depth", type=int, default=12, help="model depth dN (12: GPT-2 124M)")
    p.add_argument("--model", help="a Llama model instead: a preset (stories15M, ...) or dN")
    p.add_argument("-b", "--batch", type=int, default=4, help="batch size B")
    p.add_argument("-t", "--seq", type=int, default=64, help="sequence length T")
    p.add_argument("--threads", type=int, default=2, help="threads for both sides (OMP_NUM_THREADS, torch.set_num_threads)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (allocation, caches)")
    p.add_argument("--rounds", type=int, default=2, help="llm.pyx/PyTorch rounds, interleaved")
    p.add_argument("--no-torch", action="store_true", help="time llm.pyx only")
    p.add_argument("--backend", default="cpu", help="llm.pyx's backend (accel/README.md)")
    p.add_argument("--recompute", default="all",
                   help="llm.pyx's activation checkpoint policy (llmc/recompute.py)")
    p.add_argument("--profile", action="store_true",
                   help="also time each entry of the backend table over llm.pyx's step "
                        "(the step on profile:BACKEND)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--worker", choices=["llmpyx", "torch", "peak", "profile"], help=argparse.SUPPRESS)
    p.add_argument("--params", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def family_for(args):
    """The benchmarked model family (llmc/families.py): Llama with --model, else GPT-2."""
    from llmc.families import get_family
    return get_family("llama" if args.model else "gpt2")


def config_for(args):
    return family_for(args).config_class.from_name(args.model or f"d{args.depth}")


def model_class(args):
    """(llm.pyx's model class, the PyTorch reference module) of the benchmarked family."""
    family = family_for(args)
    return family.model_class, importlib.import_module(family.reference)


def matmul_shapes(config):
    """{(C, OC): how many per step} of the model's matmuls (inp (.., C) @ weight (OC, C)^T)."""
    if hasattr(config, "n_layers"):   # Llama: q, k, v, o, then w1, w3, w2, then the head
        C, H, kv_dim = config.dim, config.hidden_dim, config.n_kv_heads * config.head_size
        layer, head, L = [(C, C), (C, kv_dim), (C, kv_dim), (C, C), (C, H), (C, H), (H, C)], \
            (C, config.vocab_size), config.n_layers
    else:                             # GPT-2: qkv, attproj, fc, fcproj, then the head
        C = config.channels
        layer, head, L = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)], \
            (C, config.padded_vocab_size), config.num_layers
    counts = {}
    for shape in layer:
        counts[shape] = counts.get(shape, 0) + L
    counts[head] = counts.get(head, 0) + 1
    return counts


def model_flops(config, B, T):
    """(matmul, attention) FLOPs of one training step: every matmul's 2*B*T*C*OC forward, and
    twice that backward; attention's causal half of q.k and att.v, likewise."""
    matmul = 3 * 2.0 * B * T * sum(n * C * OC for (C, OC), n in matmul_shapes(config).items())
    L, C = (config.n_layers, config.dim) if hasattr(config, "n_layers") else \
        (config.num_layers, config.channels)
    attention = 3 * 2.0 * B * T * (T + 1) * C * L
    return matmul, attention


def peak_rss_bytes():
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def batch(config, B, T, seed=1234):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, (B, T + 1)).astype(np.int32)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()


# ----------------------------------------------------------------------------
# workers: each prints one JSON line

def worker_peak(args):
    """The sgemm rate of kernels.matmul (its library, split over --threads OpenMP threads),
    best of 5 calls after a warm-up."""
    from kernels import blas
    from llmc.plan import measure_gflops
    return dict(gflops=measure_gflops(2048, 5), source=f"kernels.matmul 2048^3 on {blas.LIBRARY}")


def llmpyx_steps(model, x, y, first_t, steps):
    """(losses, seconds) of `steps` training steps of llm.pyx's model."""
    losses, times = [], []
    for t in range(first_t, first_t + steps):
        t0 = time.perf_counter()
        loss = model.forward(x, y)
        model.zero_grad()
        model.backward()
        model.update(ADAMW["lr"], ADAMW["beta1"], ADAMW["beta2"], ADAMW["eps"],
                     ADAMW["weight_decay"], t)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    return losses, times


def worker_llmpyx(args):
    # the training path as it runs: OMP_NUM_THREADS from --threads, BLAS threads left to it
    Model, _ = model_class(args)
    config = config_for(args)
    model = Model.random(config, seed=0, backend=args.backend, recompute=args.recompute)
    if args.params:
        np.save(args.params, model.params)
    x, y = batch(config, args.batch, args.seq)
    losses, times = llmpyx_steps(model, x, y, 1, args.warmup + args.steps)
    return dict(times=times[args.warmup:], losses=losses, rss=peak_rss_bytes())


def worker_torch(args):
    import torch
    _, reference = model_class(args)
    torch.set_num_threads(args.threads)
    config = config_for(args)
    if args.params:
        model = reference.build_model(config, np.load(args.params))
    else:
        model = reference.Transformer(config) if args.model else reference.GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"],
                                  betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
                                  weight_decay=ADAMW["weight_decay"], fused=True)
    x, y = (torch.from_numpy(a.astype(np.int64)) for a in batch(config, args.batch, args.seq))
    losses, times = [], []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss = loss.item()
        dt = time.perf_counter() - t0
        losses.append(loss)
        if step >= args.warmup:
            times.append(dt)
    return dict(times=times, losses=losses, rss=peak_rss_bytes(), torch=torch.__version__)


def worker_profile(args):
    """The step on profile:BACKEND: {entry: seconds per step} of the table's entries, and the
    wall time per step (the rest is Python and the model's bookkeeping)."""
    Model, _ = model_class(args)
    config = config_for(args)
    model = Model.random(config, seed=0, backend="profile:" + args.backend,
                         recompute=args.recompute)
    x, y = batch(config, args.batch, args.seq)
    llmpyx_steps(model, x, y, 1, args.warmup)
    model.backend.reset()
    _, times = llmpyx_steps(model, x, y, 1 + args.warmup, args.steps)
    entries = model.backend.report()["entries"]
    return dict(categories={name: e["seconds"] / args.steps for name, e in entries.items()},
                calls={name: e["calls"] // args.steps for name, e in entries.items()},
                wall=sum(times) / args.steps)


# ----------------------------------------------------------------------------
# the parent: run the workers, print the table

def json_worker(script, argv, env=None):
    """Run `python script argv` in its own process, the repository importable, and return the
    JSON object its last line of output prints; a worker that fails is one RuntimeError with
    its stderr (the benchmarks' workers: bench_step, bench_memory, gpu/bench_gpu)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.abspath(script), *argv], env=env,
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        name = os.path.relpath(os.path.abspath(script), ROOT)
        raise RuntimeError(f"{name}: the {argv[argv.index('--worker') + 1]} worker failed:\n"
                           f"{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_worker(kind, args, params_path=None):
    argv = ["--worker", kind, "-e", str(args.depth), "-b", str(args.batch), "-t", str(args.seq),
            "--threads", str(args.threads), "--steps", str(args.steps), "--warmup",
            str(args.warmup), "--backend", args.backend, "--recompute", args.recompute]
    if params_path:
        argv += ["--params", params_path]
    if args.model:
        argv += ["--model", args.model]
    return json_worker(__file__, argv, dict(os.environ, OMP_NUM_THREADS=str(args.threads)))


def have_torch():
    try:
        import importlib.util
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def summarize(times):
    t = np.array(times)
    return dict(median=float(np.median(t)), min=float(t.min()), max=float(t.max()), n=len(t))


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        fn = dict(llmpyx=worker_llmpyx, torch=worker_torch, peak=worker_peak, profile=worker_profile)[args.worker]
        print(json.dumps(fn(args)))
        return 0
    if args.steps < 1 or args.rounds < 1 or args.threads < 1:
        sys.exit("dev/bench_step.py: --steps, --rounds and --threads must be at least 1")

    config = config_for(args)
    B, T = args.batch, args.seq
    if T > config.max_seq_len:
        sys.exit(f"dev/bench_step.py: -t {T} exceeds the model's max_seq_len {config.max_seq_len}")
    use_torch = not args.no_torch and have_torch()
    tmp = tempfile.mkdtemp(prefix="bench_step_")
    params_path = os.path.join(tmp, "params.npy") if use_torch else None
    print(f"llm.pyx training step: {args.model or f'd{args.depth}'} "
          f"({config.num_parameters() / 1e6:.1f}M parameters), "
          f"B={B} T={T}, {args.threads} threads, {args.warmup} warm-up + {args.steps} timed steps "
          f"x {args.rounds} rounds", flush=True)
    try:
        peak = run_worker("peak", args)
        results = {"llm.pyx": [], "PyTorch": []}
        for r in range(args.rounds):
            results["llm.pyx"].append(run_worker("llmpyx", args, params_path if r == 0 else None))
            if use_torch:
                results["PyTorch"].append(run_worker("torch", args, params_path))
        profile = run_worker("profile", args) if args.profile else None
        # again after the rounds, keeping the higher: a peak measured in a noisy moment would
        # understate the rate and flatter the GEMM-only ratio
        later = run_worker("peak", args)
        peak = later if later["gflops"] > peak["gflops"] else peak
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    matmul_flops, attention_flops = model_flops(config, B, T)
    flops = matmul_flops + attention_flops
    gemm_only = matmul_flops / (peak["gflops"] * 1e9)
    print(f"model FLOPs per step: {flops / 1e9:.1f} G (matmuls {matmul_flops / 1e9:.1f} G, "
          f"attention {attention_flops / 1e9:.1f} G); measured peak: {peak['gflops']:.0f} GFLOP/s "
          f"({peak['source']}, {args.threads} threads) -> floor {flops / peak['gflops'] / 1e6:.0f} ms "
          f"for the FLOPs alone; GEMM-only (the matmul FLOPs at that rate) {gemm_only * 1e3:.0f} ms")
    rows = {}
    print(f"\n{'':<9} {'ms/step':>9} {'min-max ms':>17} {'tokens/s':>9} {'GFLOP/s':>8} {'% peak':>7} {'peak RSS':>9}")
    for name, runs in results.items():
        if not runs:
            continue
        s = summarize([t for run in runs for t in run["times"]])
        rss = max(run["rss"] for run in runs)
        rows[name] = dict(s, rss=rss, losses=runs[0]["losses"])
        gflops = flops / s["median"] / 1e9
        print(f"{name:<9} {s['median'] * 1e3:9.1f} {s['min'] * 1e3:8.1f}-{s['max'] * 1e3:<8.1f} "
              f"{B * T / s['median']:9.0f} {gflops:8.1f} {100 * gflops / peak['gflops']:6.0f}% "
              f"{rss / 2 ** 30:7.2f} GB")
    print(f"\nllm.pyx / GEMM-only: {rows['llm.pyx']['median'] / gemm_only:.3f} "
          f"(a step of nothing but its matmuls at the sgemm rate would be 1)")
    if "PyTorch" in rows:
        ratio = rows["llm.pyx"]["median"] / rows["PyTorch"]["median"]
        print(f"llm.pyx / PyTorch eager (torch {results['PyTorch'][0]['torch']}, fused AdamW): "
              f"{ratio:.3f} of the time per step ({1 / ratio:.2f}x the speed), "
              f"{rows['llm.pyx']['rss'] / rows['PyTorch']['rss']:.3f} of the peak RSS")
        a, b = np.array(rows["llm.pyx"]["losses"]), np.array(rows["PyTorch"]["losses"])
        print(f"losses, same parameters and batch: llm.pyx {a[0]:.6f} .. {a[-1]:.6f}, "
              f"PyTorch {b[0]:.6f} .. {b[-1]:.6f}, max |difference| {np.max(np.abs(a - b)):.2e}")
    elif not args.no_torch:
        print("\n(PyTorch is not installed: llm.pyx only)")
    if profile:
        cats = profile["categories"]
        total = sum(cats.values())
        print(f"\nllm.pyx step on profile:{args.backend}, entry by entry ({total * 1e3:.0f} ms in the "
              f"table, {profile['wall'] * 1e3:.0f} ms wall per step):")
        for name, seconds in sorted(cats.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<30} {profile['calls'][name]:5d} calls {seconds * 1e3:8.1f} ms  "
                  f"{100 * seconds / total:5.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), peak=peak, results=rows, profile=profile,
                           flops=flops, gemm_only=gemm_only), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
