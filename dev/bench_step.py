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
    python dev/bench_step.py --precision bf16         llm.pyx in bf16 (issue 21) against two peers:
                                                      PyTorch's fp32 eager step and its bf16-
                                                      autocast eager step
    python dev/bench_step.py --compare-precisions     also llm.pyx at fp32, next to its bf16 run
    python dev/bench_step.py --compare-precisions --grad-precision bf16 -w 0
                                                      the bf16 run with bf16 gradients and no
                                                      master weights (issue 38)

Prints ms/step (median, min-max), tokens/s, the ratio llm.pyx / PyTorch, the model FLOPs
achieved against this machine's measured sgemm peak (kernels.matmul at 2048^3, on the library
the kernels use, kernels/blas.pyx, and the same threads),
the step against GEMM-only (its matmul FLOPs at that sgemm rate: the time of a step that did
nothing else), peak RSS of each side's process and their ratio, and the losses of both sides
(same parameters, same batch: they must agree).

With --precision bf16 llm.pyx runs at bf16 (llmc/model.pyx: bf16 parameters and activations,
fp32 master weights) and there are two PyTorch sides, each in its own process, all interleaved:
PyTorch's fp32 eager step, and its bf16-autocast one (torch.autocast("cpu", dtype=torch.bfloat16)
around the forward and the loss, fp32 parameters and fused AdamW, as llm.c's train_gpt2.py
--dtype bfloat16).  The peak line then has this machine's bf16 GEMM peak too (kernels.matmul_bf16
at 2048^3, on what kernels.blas.BF16_LIBRARY says, the same threads), and a bf16 row's
"% peak" and "x GEMM-only" count against it (an fp32 row's against the sgemm peak).  The ratios
are printed with issue 21's targets (llm.pyx bf16 at most 0.5x PyTorch's fp32 step and 0.8x its
bf16-autocast step); bf16 losses agree only loosely, so the differences are printed, not checked.
--compare-precisions (implies --precision bf16) adds llm.pyx at fp32 as one more interleaved
side: both times and the peak RSS ratio bf16/fp32 (the issue's target: at most 0.6 at d12 B=4
T=1024); with --grad-precision bf16 the bf16 side keeps bf16 parameter gradients (llm.c's),
with -w 0 no float32 master weights (llm.c's use_master_weights 0), and its row says so.
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
PRECISIONS = ("fp32", "bf16")
GRAD_PRECISIONS = ("fp32", "bf16")
# issue 21's speed and memory targets at bf16, as fractions: llm.pyx bf16's time per step over
# each peer's, and its peak RSS over llm.pyx fp32's (d12 B=4 T=1024)
TARGETS = {"PyTorch fp32": 0.5, "PyTorch bf16": 0.8, "llm.pyx fp32": 0.6}


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
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="llm.pyx's precision (llm.c's PRECISION); bf16: PyTorch's fp32 eager and "
                        "bf16-autocast eager steps are both timed next to it")
    p.add_argument("--compare-precisions", action="store_true",
                   help="also time llm.pyx at fp32 next to its bf16 run (implies --precision "
                        "bf16): both times and the peak RSS ratio bf16/fp32")
    p.add_argument("--grad-precision", choices=GRAD_PRECISIONS, default="fp32",
                   help="llm.pyx's parameter gradients at bf16: fp32, or bf16 (llm.c's)")
    p.add_argument("-w", dest="master_weights", type=int, choices=(0, 1), default=1,
                   help="llm.pyx's float32 master weights at bf16: 0, none (llm.c's -w 0)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--worker", choices=["llmpyx", "torch", "peak", "profile"], help=argparse.SUPPRESS)
    p.add_argument("--params", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.compare_precisions:
        args.precision = "bf16"
    if args.grad_precision != "fp32" and args.precision != args.grad_precision:
        p.error(f"argument --grad-precision: {args.grad_precision} gradients need --precision "
                f"{args.grad_precision}")
    if not args.master_weights and args.precision != "bf16":
        p.error("argument -w: 0 needs --precision bf16")
    return args


def family_for(args):
    """The benchmarked model family (llmc/families.py): Llama with --model, else GPT-2."""
    from llmc.families import get_family
    return get_family("llama" if args.model else "gpt2")


def config_for(args):
    return family_for(args).config_class.from_name(args.model or f"d{args.depth}")


def reference_module(args):
    """The PyTorch reference module of the benchmarked family (imports torch)."""
    return importlib.import_module(family_for(args).reference)


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
    best of 5 calls after a warm-up; at bf16 also kernels.matmul_bf16's rate, the same way."""
    from kernels import blas
    from llmc.dry_run import measure_gflops
    peak = dict(gflops=measure_gflops(2048, 5), source=f"kernels.matmul 2048^3 on {blas.LIBRARY}")
    if args.precision == "bf16":
        peak.update(bf16_gflops=measure_gflops(2048, 5, "bf16"),
                    bf16_source=f"kernels.matmul_bf16 2048^3 on {blas.BF16_LIBRARY}",
                    bf16_library=blas.BF16_LIBRARY, hardware_bf16=bool(blas.HARDWARE_BF16))
    return peak


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
        model.backend.synchronize()   # a device's queue (nothing on the CPU)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    return losses, times


def torch_steps(model, optimizer, x, y, autocast, steps, synchronize=lambda: None):
    """(losses, seconds) of `steps` PyTorch training steps (the forward under autocast(),
    zero_grad, backward, AdamW), the device synchronized before the clock starts and stops
    (bench_gpu's CUDA, bench_metal's MPS)."""
    losses, times = [], []
    for _ in range(steps):
        synchronize()
        t0 = time.perf_counter()
        with autocast():
            _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def worker_llmpyx(args):
    # the training path as it runs: OMP_NUM_THREADS from --threads, BLAS threads left to it
    Model = family_for(args).model_class
    config = config_for(args)
    model = Model.random(config, seed=0, backend=args.backend, recompute=args.recompute,
                         precision=args.precision,
                         grad_precision=args.grad_precision,
                         master_weights=bool(args.master_weights))
    if args.params:
        np.save(args.params, model.params)
    x, y = batch(config, args.batch, args.seq)
    losses, times = llmpyx_steps(model, x, y, 1, args.warmup + args.steps)
    return dict(times=times[args.warmup:], losses=losses, rss=peak_rss_bytes(),
                precision=model.precision)


def worker_torch(args):
    """PyTorch's eager step; at --precision bf16 with the forward and the loss under bf16
    autocast (the parameters, their gradients and AdamW stay fp32), as llm.c's train_gpt2.py
    --dtype bfloat16 on a CPU."""
    import contextlib
    import torch
    reference = reference_module(args)
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
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) \
        if args.precision == "bf16" else contextlib.nullcontext
    losses, times = torch_steps(model, optimizer, x, y, autocast, args.warmup + args.steps)
    return dict(times=times[args.warmup:], losses=losses, rss=peak_rss_bytes(), torch=torch.__version__,
                precision=args.precision)


def worker_profile(args):
    """The step on profile:BACKEND: {entry: seconds per step} of the table's entries, and the
    wall time per step (the rest is Python and the model's bookkeeping)."""
    Model = family_for(args).model_class
    config = config_for(args)
    model = Model.random(config, seed=0, backend="profile:" + args.backend,
                         recompute=args.recompute, precision=args.precision,
                         grad_precision=args.grad_precision,
                         master_weights=bool(args.master_weights))
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


def run_worker(kind, args, params_path=None, precision=None):
    argv = ["--worker", kind, "-e", str(args.depth), "-b", str(args.batch), "-t", str(args.seq),
            "--threads", str(args.threads), "--steps", str(args.steps), "--warmup",
            str(args.warmup), "--backend", args.backend, "--recompute", args.recompute,
            "--precision", precision or args.precision]
    if (precision or args.precision) == "bf16":   # the fp32 side of --compare-precisions: plain
        argv += ["--grad-precision", args.grad_precision, "-w", str(args.master_weights)]
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


def sides_for(args, use_torch):
    """[(name, worker, precision)] of the timed sides, in the order each round runs them: llm.pyx
    first (its first round writes the parameters the PyTorch sides start from)."""
    if args.precision == "fp32":
        return [("llm.pyx", "llmpyx", "fp32")] + ([("PyTorch", "torch", "fp32")] if use_torch else [])
    sides = [("llm.pyx bf16" + (" bf16-grads" if args.grad_precision == "bf16" else "")
              + ("" if args.master_weights else " -w0"), "llmpyx", "bf16")]
    if args.compare_precisions:
        sides.append(("llm.pyx fp32", "llmpyx", "fp32"))
    if use_torch:
        sides += [("PyTorch fp32", "torch", "fp32"), ("PyTorch bf16", "torch", "bf16")]
    return sides


def higher_peak(a, b):
    """Each rate of two peak measurements, the higher one (with its source)."""
    best = dict(a)
    for key in ("gflops", "bf16_gflops"):
        if key in b and b[key] > a.get(key, 0.0):
            best[key] = b[key]
    return best


# what each peer of llm.pyx bf16 is, in words
PEERS = {"PyTorch fp32": "PyTorch fp32 eager", "PyTorch bf16": "PyTorch bf16-autocast eager",
         "llm.pyx fp32": "llm.pyx fp32"}


def target_text(ratio, target):
    return f"issue 21's target: at most {target}, {'met' if ratio <= target else 'not met'}"


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
    bf16 = args.precision == "bf16"
    use_torch = not args.no_torch and have_torch()
    sides = sides_for(args, use_torch)
    tmp = tempfile.mkdtemp(prefix="bench_step_")
    params_path = os.path.join(tmp, "params.npy") if use_torch else None
    what = (f"{args.model or f'd{args.depth}'} ({config.num_parameters() / 1e6:.1f}M parameters), "
            f"B={B} T={T}, {args.threads} threads, {args.warmup} warm-up + {args.steps} timed "
            f"steps x {args.rounds} rounds")
    if not bf16:
        print(f"llm.pyx training step: {what}", flush=True)
    try:
        peak = run_worker("peak", args)
        if bf16:
            print(f"llm.pyx training step in bf16 (its GEMMs: {peak['bf16_library']}): {what}",
                  flush=True)
            if not peak["hardware_bf16"]:
                print("(no bf16 hardware in use here: the bf16 GEMMs are float32 GEMMs on "
                      "widened operands, and llm.pyx bf16 will be slower than fp32)", flush=True)
        results = {name: [] for name, _, _ in sides}
        for r in range(args.rounds):
            for i, (name, kind, precision) in enumerate(sides):
                # the first side's first round writes the parameters, the PyTorch sides read them
                params = params_path if kind == "torch" or (i == 0 and r == 0) else None
                results[name].append(run_worker(kind, args, params, precision))
        profile = run_worker("profile", args) if args.profile else None
        # again after the rounds, keeping the higher: a peak measured in a noisy moment would
        # understate the rate and flatter the GEMM-only ratio
        peak = higher_peak(peak, run_worker("peak", args))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    matmul_flops, attention_flops = model_flops(config, B, T)
    flops = matmul_flops + attention_flops
    gemm_only = matmul_flops / (peak["gflops"] * 1e9)
    # each precision's peak and GEMM-only time: a row counts against its own precision's
    peaks, gemm_onlys = {"fp32": peak["gflops"]}, {"fp32": gemm_only}
    if bf16:
        peaks["bf16"] = peak["bf16_gflops"]
        gemm_onlys["bf16"] = matmul_flops / (peak["bf16_gflops"] * 1e9)
        print(f"model FLOPs per step: {flops / 1e9:.1f} G (matmuls {matmul_flops / 1e9:.1f} G, "
              f"attention {attention_flops / 1e9:.1f} G)")
        print(f"measured peaks, {args.threads} threads: bf16 GEMM {peaks['bf16']:.0f} GFLOP/s "
              f"({peak['bf16_source']}), {peaks['bf16'] / peaks['fp32']:.2f}x the fp32 sgemm "
              f"{peaks['fp32']:.0f} GFLOP/s ({peak['source']})")
        print(f"  -> at the bf16 peak: floor {flops / peaks['bf16'] / 1e6:.0f} ms for the FLOPs "
              f"alone, GEMM-only (the matmul FLOPs at that rate) {gemm_onlys['bf16'] * 1e3:.0f} ms; "
              f"at the sgemm peak: GEMM-only {gemm_only * 1e3:.0f} ms")
        print("  (a bf16 row's % peak and x GEMM-only count against the bf16 peak, an fp32 row's "
              "against the sgemm peak)")
    else:
        print(f"model FLOPs per step: {flops / 1e9:.1f} G (matmuls {matmul_flops / 1e9:.1f} G, "
              f"attention {attention_flops / 1e9:.1f} G); measured peak: {peak['gflops']:.0f} GFLOP/s "
              f"({peak['source']}, {args.threads} threads) -> floor {flops / peak['gflops'] / 1e6:.0f} ms "
              f"for the FLOPs alone; GEMM-only (the matmul FLOPs at that rate) {gemm_only * 1e3:.0f} ms")
    rows = {}
    width = max(9, max(len(name) for name, _, _ in sides))
    print(f"\n{'':<{width}} {'ms/step':>9} {'min-max ms':>17} {'tokens/s':>9} {'GFLOP/s':>8} "
          f"{'% peak':>7} {'x GEMM-only':>11} {'peak RSS':>9}")
    for name, _, precision in sides:
        runs = results[name]
        s = summarize([t for run in runs for t in run["times"]])
        rss = max(run["rss"] for run in runs)
        rows[name] = dict(s, rss=rss, losses=runs[0]["losses"], precision=precision,
                          gemm_only=s["median"] / gemm_onlys[precision])
        gflops = flops / s["median"] / 1e9
        print(f"{name:<{width}} {s['median'] * 1e3:9.1f} {s['min'] * 1e3:8.1f}-{s['max'] * 1e3:<8.1f} "
              f"{B * T / s['median']:9.0f} {gflops:8.1f} {100 * gflops / peaks[precision]:6.0f}% "
              f"{rows[name]['gemm_only']:11.2f} {rss / 2 ** 30:7.2f} GB")
    ours = sides[0][0]
    ratios = {}
    if not bf16:
        print(f"\nllm.pyx / GEMM-only: {rows['llm.pyx']['median'] / gemm_only:.3f} "
              f"(a step of nothing but its matmuls at the sgemm rate would be 1)")
        if "PyTorch" in rows:
            ratio = rows["llm.pyx"]["median"] / rows["PyTorch"]["median"]
            rss = rows["llm.pyx"]["rss"] / rows["PyTorch"]["rss"]
            ratios["llm.pyx/PyTorch"] = dict(time=ratio, rss=rss)
            print(f"llm.pyx / PyTorch eager (torch {results['PyTorch'][0]['torch']}, fused AdamW): "
                  f"{ratio:.3f} of the time per step ({1 / ratio:.2f}x the speed), "
                  f"{rss:.3f} of the peak RSS")
            a, b = np.array(rows["llm.pyx"]["losses"]), np.array(rows["PyTorch"]["losses"])
            print(f"losses, same parameters and batch: llm.pyx {a[0]:.6f} .. {a[-1]:.6f}, "
                  f"PyTorch {b[0]:.6f} .. {b[-1]:.6f}, max |difference| {np.max(np.abs(a - b)):.2e}")
    else:
        print(f"\n{ours} / GEMM-only: {rows[ours]['gemm_only']:.3f} "
              f"(a step of nothing but its matmuls at the bf16 GEMM rate would be 1)")
        for peer, _, _ in sides[1:]:
            ratio = rows[ours]["median"] / rows[peer]["median"]
            rss = rows[ours]["rss"] / rows[peer]["rss"]
            ratios[f"{ours}/{peer}"] = dict(time=ratio, rss=rss, target=TARGETS[peer])
            if peer == "llm.pyx fp32":   # the target is the memory's
                print(f"{ours} / {PEERS[peer]}: {ratio:.3f} of the time per step "
                      f"({1 / ratio:.2f}x the speed), {rss:.3f} of the peak RSS "
                      f"({target_text(rss, TARGETS[peer])}, at d12 B=4 T=1024)")
            else:
                print(f"{ours} / {PEERS[peer]} (torch {results[peer][0]['torch']}, fused AdamW): "
                      f"{ratio:.3f} of the time per step ({1 / ratio:.2f}x the speed; "
                      f"{target_text(ratio, TARGETS[peer])}), {rss:.3f} of the peak RSS")
        a = np.array(rows[ours]["losses"])
        print(f"losses, same parameters and batch (bf16 agrees only loosely: not checked):")
        print(f"  {ours:<{width}} {a[0]:.6f} .. {a[-1]:.6f}")
        for peer, _, _ in sides[1:]:
            b = np.array(rows[peer]["losses"])
            print(f"  {peer:<{width}} {b[0]:.6f} .. {b[-1]:.6f}, max |difference| from {ours} "
                  f"{np.max(np.abs(a - b)):.2e}")
    if not use_torch and not args.no_torch:
        print("\n(PyTorch is not installed: llm.pyx only)")
    if profile:
        cats = profile["categories"]
        total = sum(cats.values())
        print(f"\nllm.pyx step on profile:{args.backend} at {args.precision}, entry by entry "
              f"({total * 1e3:.0f} ms in the table, {profile['wall'] * 1e3:.0f} ms wall per step):")
        for name, seconds in sorted(cats.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<30} {profile['calls'][name]:5d} calls {seconds * 1e3:8.1f} ms  "
                  f"{100 * seconds / total:5.1f}%")
    if args.json:
        extra = dict(gemm_only_bf16=gemm_onlys["bf16"]) if bf16 else {}
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), precision=args.precision, peak=peak, results=rows,
                           ratios=ratios, profile=profile, flops=flops, gemm_only=gemm_only,
                           **extra), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
