"""
dev/bench_blas.py: which GEMM library should the kernels call on this machine?

Times kernels.matmul's forward and backward at a model's matmul shapes once on each library
kernels/blas.pyx can load (LLMPYX_BLAS=openblas and =mkl), each in its own process, the two
interleaved round by round, and prints GFLOP/s (best and median call) and MKL's speed relative
to OpenBLAS's. What `LLMPYX_BLAS=auto` picks (MKL on Intel CPUs) rests on this table
(dev/BENCHMARKS.md section 9).  With --variant N it compares kernels.matmul with the lab's
dev/cpu/matmul_N instead, the same way, on the library in use: at a model's own shapes, and
round by round, which dev/ab.py's one pass over fixed shapes is too noisy for when the
difference is a few percent.  With --cold it compares kernels.matmul with itself, hot (the
operands in the caches from the call before) against cold (a pass over twice the last-level
cache before each call, so the operands come from DRAM as the step's mostly do): what the
step's GEMMs lose to the memory bus that a hot 2048^3 peak does not show.  With --precision
bf16 it compares kernels.matmul (float32) with kernels.matmul_bf16 (bf16 operands, float32
accumulation: what a bf16 step's GEMMs run, on kernels.blas.BF16_LIBRARY) at the same shapes,
the bf16 side's inputs the float32 side's rounded (issue 21).

    python dev/bench_blas.py                          GPT-2 d12 at B=4, T=64
    python dev/bench_blas.py -t 1024
    python dev/bench_blas.py --model stories15M -t 256
    python dev/bench_blas.py --variant 8 --rounds 8   kernels.matmul vs dev/cpu/matmul_8
    python dev/bench_blas.py --model stories110M -t 256 --cold   hot vs cold caches
    python dev/bench_blas.py --precision bf16         kernels.matmul vs kernels.matmul_bf16
"""
import argparse
import glob
import importlib.util
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dev.bench_step import config_for, json_worker, matmul_shapes  # noqa: E402

LIBRARIES = ("openblas", "mkl")
CACHES = ("hot", "cold")
PRECISIONS = ("fp32", "bf16")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("-e", "--depth", type=int, default=12, help="GPT-2 depth dN")
    p.add_argument("--model", default=None, help="a Llama preset (stories15M, ...) instead")
    p.add_argument("-b", "--batch", type=int, default=4)
    p.add_argument("-t", "--seq", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS")
    p.add_argument("--calls", type=int, default=10, help="timed calls per shape and round")
    p.add_argument("--rounds", type=int, default=3)
    other = p.add_mutually_exclusive_group()
    other.add_argument("--variant", type=int, help="compare kernels.matmul with "
                       "dev/cpu/matmul_N (on the library LLMPYX_BLAS picks) instead of the two "
                       "libraries")
    other.add_argument("--cold", action="store_true", help="compare kernels.matmul with hot "
                       "and with cold caches (on the library LLMPYX_BLAS picks) instead")
    other.add_argument("--precision", choices=["bf16"], help="bf16: compare kernels.matmul "
                       "with kernels.matmul_bf16 (on the libraries kernels.blas picks) instead")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def last_level_cache_bytes():
    """The largest cache Linux reports for CPU 0 (256 MiB when it reports none)."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with open(path) as f:
            text = f.read().strip()   # "2048K", "260M"
        unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:])
        if unit and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * unit)
    return max(sizes, default=256 << 20)


def worker(args):
    """{"name": ..., "C,OC": [forward seconds..., backward seconds...]} for one round of the
    side args.worker: a library (kernels.matmul on it), "hot" or "cold" (kernels.matmul on the
    library in use), "fp32" or "bf16" (kernels.matmul or kernels.matmul_bf16 on the libraries
    in use) or a matmul module's name."""
    from kernels import blas
    from kernels.bf16 import to_bf16
    bf16 = args.worker == "bf16"
    module = "kernels.matmul_bf16" if bf16 else \
        args.worker if args.worker not in LIBRARIES + CACHES + PRECISIONS else "kernels.matmul"
    matmul = importlib.import_module(module)
    rng = np.random.default_rng(0)
    BT = args.batch * args.seq
    if args.worker in LIBRARIES:
        name = blas.LIBRARY
    elif args.worker in CACHES:
        name = f"hot ({blas.LIBRARY})" if args.worker == "hot" else "cold"
    elif bf16:
        name = f"{module} on {blas.BF16_LIBRARY}"
    else:
        name = f"{module} on {blas.LIBRARY}"
    result = {"name": name}
    flush = np.zeros(2 * last_level_cache_bytes() // 4, np.float32) if args.worker == "cold" \
        else None
    for C, OC in matmul_shapes(config_for(args)):
        inp = rng.standard_normal((1, BT, C), dtype=np.float32)
        weight = rng.standard_normal((OC, C), dtype=np.float32) * 0.02
        out = np.empty((1, BT, OC), np.float32)
        dout = rng.standard_normal((1, BT, OC), dtype=np.float32)
        dinp, dweight = np.zeros_like(inp), np.zeros_like(weight)
        if bf16:   # bf16 operands and activation gradients; the weight gradient stays float32
            inp, weight, dout = to_bf16(inp), to_bf16(weight), to_bf16(dout)
            out, dinp = np.empty(out.shape, np.uint16), np.zeros(inp.shape, np.uint16)
        fwd, bwd = [], []
        for i in range(args.calls + 1):   # the first call of each is a warm-up
            if flush is not None:
                flush += 1.0
            t0 = time.perf_counter()
            matmul.forward(out, inp, weight)
            t1 = time.perf_counter()
            if flush is not None:
                flush += 1.0
            t2 = time.perf_counter()
            matmul.backward(dinp, dweight, None, dout, inp, weight)
            t3 = time.perf_counter()
            if i:
                fwd.append(t1 - t0)
                bwd.append(t3 - t2)
        result[f"{C},{OC}"] = [fwd, bwd]
    return result


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        import json
        print(json.dumps(worker(args)))
        return 0
    argv = ["-e", str(args.depth), "-b", str(args.batch), "-t", str(args.seq),
            "--calls", str(args.calls)] + (["--model", args.model] if args.model else [])
    if args.cold:
        sides, labels = CACHES, CACHES
    elif args.precision:
        sides, labels = PRECISIONS, PRECISIONS
    elif args.variant is None:
        sides, labels = LIBRARIES, ("OpenBLAS", "MKL")
    else:
        sides, labels = ("kernels.matmul", f"dev.cpu.matmul_{args.variant}"), \
            ("kernels", f"matmul_{args.variant}")
        if importlib.util.find_spec(sides[1]) is None:
            sys.exit(f"dev/bench_blas.py: {sides[1]} is not built: make dev (dev/README.md)")
    times = {side: {} for side in sides}
    names = {}
    for _ in range(args.rounds):
        for side in sides:
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
            if side in LIBRARIES:
                env["LLMPYX_BLAS"] = side
            try:
                got = json_worker(__file__, argv + ["--worker", side], env)
            except RuntimeError as e:
                if side == "mkl" and "no libmkl_rt was found" in str(e):
                    sys.exit("dev/bench_blas.py: MKL is not installed here (pip install mkl)")
                raise
            names[side] = got.pop("name")
            for shape, (fwd, bwd) in got.items():
                t = times[side].setdefault(shape, ([], []))
                t[0].extend(fwd)
                t[1].extend(bwd)
    BT = args.batch * args.seq
    ratio = f"{labels[1]}/{labels[0]}"
    what = "kernels.matmul and kernels.matmul_bf16" if args.precision else "kernels.matmul"
    print(f"{what} at {args.model or f'd{args.depth}'}'s shapes, B*T={BT}, "
          f"{args.threads} threads, {args.calls} calls x {args.rounds} rounds per side: "
          f"{names[sides[0]]} vs {names[sides[1]]}")
    print(f"GFLOP/s, best | median call; {ratio}: the ratio of the median times "
          f"(<1: {labels[1]} faster)")
    print(f"{'C':>6} {'OC':>6} {'per step':>8}   {'pass':8} {labels[0]:>13} {labels[1]:>13} "
          f"{ratio:>16}")
    total = {side: 0.0 for side in sides}
    for shape, count in matmul_shapes(config_for(args)).items():
        C, OC = shape
        key = f"{C},{OC}"
        passes = (("forward", 2.0 * BT * C * OC), ("backward", 4.0 * BT * C * OC))
        for p, (name, flops) in enumerate(passes):
            cols = []
            med = {}
            for side in sides:
                t = np.array(times[side][key][p])
                med[side] = float(np.median(t))
                total[side] += count * med[side]
                cols.append(f"{flops / t.min() / 1e9:5.0f} | {flops / med[side] / 1e9:5.0f}")
            print(f"{C:6d} {OC:6d} {count:8d}   {name:8} {cols[0]:>13} {cols[1]:>13} "
                  f"{med[sides[1]] / med[sides[0]]:16.3f}")
    first, second = total[sides[0]], total[sides[1]]
    print(f"a step's matmuls at the median times: {labels[0]} {first * 1e3:.1f} ms, "
          f"{labels[1]} {second * 1e3:.1f} ms ({ratio} {second / first:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
