"""
dev/metal/ab.py: the Metal kernel lab's A/B table (dev/metal/README.md). For each staged variant
of a kernel (dev/metal/<kernel>_<N>.metal) and for accel/metal/gpt2.metal's own (the last row):
  1. a copy of gpt2.metal with the kernel's section replaced by the variant's (beside copies of
     the files it #includes), built for the backend (metal-emu: `make metal-emu` on the copy;
     metal: the copy compiled by the Metal runtime at load, `make metal` first);
  2. check: every entry that runs the kernel through check:<backend> against the CPU oracle,
     on metal-emu under every schedule of the emulator; the largest error over its tolerance,
     and a variant out of tolerance makes the run exit non-zero, naming it;
  3. time, on metal only (the emulator's times say nothing about a GPU): each entry at GPT-2
     124M's shapes (B=4, T=1024), median of --repeats after a warm-up, GFLOP/s, and the speed-up
     over variant 1.

    python dev/metal/ab.py --list
    python dev/metal/ab.py matmul                          # metal on macOS, metal-emu elsewhere
    python dev/metal/ab.py matmul --check-only --shapes small
"""
import argparse
import ctypes
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SOURCE = os.path.join(ROOT, "accel", "metal", "gpt2.metal")
# kernel -> (the line opening its section in gpt2.metal, the text that starts the next section)
SECTIONS = {"matmul": ("// ---- matmul ----", "// dbias (OC,) += dout")}
SCHEDULES = [("lockstep", 1), ("lockstep-reverse", 1), ("warp-ahead", 1), ("warp-ahead-reverse", 1),
             ("shuffled", 1), ("shuffled", 2)]
# (name, B, T, C, OC): odd sizes (no multiple of 8 or of a tile), or GPT-2 124M's layers
SHAPES = {
    "small": [("odd", 3, 7, 45, 67), ("two-tiles", 2, 65, 70, 9)],
    "gpt2": [("qkv", 4, 1024, 768, 2304), ("fc", 4, 1024, 768, 3072), ("fcproj", 4, 1024, 3072, 768),
             ("lm_head", 4, 1024, 768, 50304)],
}


def variants(kernel):
    """[(row name, .metal file)]: the staged variants by number, then gpt2.metal's own."""
    staged = glob.glob(os.path.join(HERE, f"{kernel}_*.metal"))
    staged.sort(key=lambda p: int(os.path.basename(p)[len(kernel) + 1:-len(".metal")]))
    return [(os.path.basename(p)[:-len(".metal")], p) for p in staged] + [("gpt2.metal", SOURCE)]


def spliced(kernel, variant, folder):
    """A copy of gpt2.metal in folder with `kernel`'s section taken from the variant's file, and
    copies of the other .metal files beside gpt2.metal (llama.metal, flash.metal: it #includes
    them); the copy's path."""
    for other in glob.glob(os.path.join(os.path.dirname(SOURCE), "*.metal")):
        shutil.copy(other, folder)
    start, end = SECTIONS[kernel]
    text = open(SOURCE).read()
    section = open(variant).read()
    if start not in section:
        sys.exit(f"ab.py: {variant} has no line '{start}' opening its section")
    path = os.path.join(folder, "gpt2.metal")
    section = section[section.index(start):]
    section = section[:section.index(end)] if end in section else section   # gpt2.metal's own
    with open(path, "w") as f:
        f.write(text[:text.index(start)] + section.rstrip() + "\n\n" + text[text.index(end):])
    return path


def backend_of(source, target, folder):
    """The backend `target` with the kernels of `source`; the emulator library's handle (for
    its schedule) or None."""
    from accel.metal import metal
    if target == "metal-emu":
        library = os.path.join(folder, "libmetal_emu.so")
        result = subprocess.run(["make", "-s", "-C", ROOT, "metal-emu", f"METAL_SOURCE={source}",
                                 f"METAL_EMU_LIB={library}", f"PYTHON={sys.executable}"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"ab.py: {source} does not build:\n{result.stderr}")
        return metal.create(library, "metal-emu"), ctypes.CDLL(library)
    return metal.create(metal.MACOS_RUNTIME, "metal", kernels=source), None


def calls(backend, shape, rng):
    """The matmul entries at one shape: (name, arguments, GFLOP of the call)."""
    _, B, T, C, OC = shape

    def buf(*dims):
        b = backend.alloc(4 * int(np.prod(dims)))
        b.load(rng.standard_normal(dims).astype(np.float32))
        return b
    flop = 2.0 * B * T * C * OC / 1e9
    return [("matmul_forward", (buf(B, T, OC), buf(B, T, C), buf(OC, C), buf(OC), B, T, C, OC), flop),
            ("matmul_backward", (buf(B, T, C), buf(OC, C), buf(OC), buf(B, T, OC), buf(B, T, C), buf(OC, C),
                                 B, T, C, OC), 2 * flop)]


def check(backend, emulator, shapes):
    """The largest error over tolerance of every call at these shapes (under every schedule on
    the emulator), and whether all were within tolerance."""
    from accel import instrument
    worst, ok = 0.0, True
    for schedule in SCHEDULES if emulator else [None]:
        if emulator:
            emulator.metal_emu_configure(schedule[0].encode(), ctypes.c_uint64(schedule[1]), 32)
        checked = instrument.create("check", backend)
        for shape in shapes:
            for name, args, _ in calls(checked, shape, np.random.default_rng(1)):
                checked.call(name, *args)
        report = checked.report()
        worst = max([worst] + [e["worst_ratio"] for e in report["entries"].values()])
        ok = ok and report["mismatches"] == 0
    return worst, ok


def timed(backend, shapes, repeats):
    """{(shape, entry): (median seconds, min, max, GFLOP/s)}."""
    times = {}
    for shape in shapes:
        for name, args, gflop in calls(backend, shape, np.random.default_rng(1)):
            backend.call(name, *args)   # warm-up: pipelines compiled, memory touched
            backend.synchronize()
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                backend.call(name, *args)
                backend.synchronize()
                samples.append(time.perf_counter() - start)
            median = float(np.median(samples))
            times[(shape[0], name)] = (median, min(samples), max(samples), gflop / median)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", nargs="?", choices=sorted(SECTIONS))
    parser.add_argument("--list", action="store_true", help="the kernels and their variants")
    parser.add_argument("--backend", choices=("metal", "metal-emu"),
                        default="metal" if sys.platform == "darwin" else "metal-emu")
    parser.add_argument("--shapes", choices=sorted(SHAPES),
                        help="default: gpt2 on metal, small on metal-emu (the emulator is slow)")
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    if args.list or args.kernel is None:
        for kernel in sorted(SECTIONS):
            print(f"{kernel}: {', '.join(name for name, _ in variants(kernel))}")
        return 0
    shapes = SHAPES[args.shapes or ("gpt2" if args.backend == "metal" else "small")]
    timing = args.backend == "metal" and not args.check_only
    print(f"{args.kernel} on {args.backend}, shapes {', '.join(s[0] for s in shapes)}"
          f"{'' if timing else ' (check only: times are measured on metal alone)'}")
    wrong, baseline = [], {}
    for name, path in variants(args.kernel):
        with tempfile.TemporaryDirectory(prefix=f"ab_{name}_") as folder:
            backend, emulator = backend_of(spliced(args.kernel, path, folder), args.backend, folder)
            worst, ok = check(backend, emulator, shapes)
            line = f"{name:14s} check {'OK   ' if ok else 'WRONG'} worst error / tolerance {worst:.2f}"
            if not ok:
                wrong.append(name)
            if timing:
                for (shape, entry), (median, low, high, gflops) in timed(backend, shapes, args.repeats).items():
                    baseline.setdefault((shape, entry), median)
                    line += (f"\n    {shape:8s} {entry:16s} {median * 1e3:8.3f} ms ({low * 1e3:.3f}-{high * 1e3:.3f})"
                             f" {gflops:8.1f} GFLOP/s  x{baseline[(shape, entry)] / median:.2f} vs the first row")
            print(line, flush=True)
    if wrong:
        print(f"ab.py: out of tolerance: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
