"""
dev/gpu/ab_epilogues.py: the GEMM-epilogue variants of dev/gpu/matmul_epilogues.hip against the
plain path of accel/hip/gpt2.hip, each variant a library of its own (accel/hip/Makefile):

    variant 1  matmul_forward with hipBLASLt's / cuBLASLt's BIAS epilogue   vs  bias kernel + Sgemm
    variant 2  matmul_backward's dbias from the BGRADB epilogue             vs  the column-sum kernel
    both       matmul + GELU as one GEMM, GELU_AUX_BIAS (pre-activation    vs  matmul_forward, then
               kept for gelu_backward)                                         gelu_forward

A variant's library also holds the plain path (accel_hip_plain_matmul_forward / _backward and
gelu_forward), so both run in one process, on one context, on the same buffers.

  1. check: every path (plain and epilogue) against a float64 NumPy reference at odd shapes and at
     GPT-2 d12's widths (forward outputs; backward's gradients added into buffers that start
     non-zero); on the emulated builds under several schedules at warp sizes 32 and 64. A path
     outside its tolerance is WRONG and the run exits non-zero naming it.
  2. time (a GPU build only: the emulator's speed means nothing): each path at d12's GEMMs at
     B=8, T=1024, the median of --repeats, and the ratio epilogue / plain (under 1: the epilogue
     wins).

    make -C accel/hip dev-epilogues              the emulated builds
    python dev/gpu/ab_epilogues.py --emulated    check only
    make -C accel/hip dev-epilogues-gpu NVCC_ARCH=sm_90   on a GPU machine (cuBLASLt; hipBLASLt on AMD)
    python dev/gpu/ab_epilogues.py               check, then time

tests/test_gpu_epilogues.py runs check() on the emulated builds and on planted faults.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, "accel", "hip", "build")
VARIANTS = (1, 2)
PRECISIONS = ("fp32", "bf16")
SCHEDULES = [("lockstep", 1), ("lockstep-reverse", 1), ("warp-ahead", 1), ("shuffled", 2)]
WARP_SIZES = (32, 64)
# odd sizes (no multiple of a tile or a warp), and d12's widths at a small odd B*T
ODD = dict(B=3, T=7, C=20, OC=60)
D12 = [dict(B=3, T=5, C=768, OC=3 * 768), dict(B=3, T=5, C=768, OC=768), dict(B=3, T=5, C=768, OC=4 * 768),
       dict(B=3, T=5, C=4 * 768, OC=768)]
# d12's four GEMMs (qkv, attproj, fc, fcproj) at B=8, T=1024, for timing
TIMED = [("qkv", dict(B=8, T=1024, C=768, OC=2304)), ("attproj", dict(B=8, T=1024, C=768, OC=768)),
         ("fc", dict(B=8, T=1024, C=768, OC=3072)), ("fcproj", dict(B=8, T=1024, C=3072, OC=768))]
# max |path - reference| / max |reference|, per output: fp32 sums of K terms, bf16 outputs
# rounded once (a relative step of 2^-8) and bf16 inputs to float32 GEMMs
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2}
GELU_SCALE = np.sqrt(2.0 / np.pi)


def library_path(variant, precision="fp32", emulated=True, build=BUILD):
    suffix = "" if precision == "fp32" else "_bf16"
    return os.path.join(build, f"libgpt2_hip{'_emu' if emulated else ''}_epilogue{variant}{suffix}.so")


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(GELU_SCALE * (x + 0.044715 * x ** 3)))


class Device:
    """A variant's library through its C ABI (accel/hip/gpt2.hip's accel_hip_* and the variant's
    accel_hip_dev_*), one context; float64 arrays in and out, stored as the build's floatX (float32
    or bf16) or as float32 where the table declares float (dweight, dbias)."""

    def __init__(self, path, precision, schedule=None, warp_size=32):
        if not os.path.exists(path):
            raise SystemExit(f"ab_epilogues.py: {path} is not built (make -C accel/hip dev-epilogues, or "
                             f"dev-epilogues-gpu on a GPU machine)")
        self.lib = lib = ctypes.CDLL(path)
        self.precision = precision
        self.emulated = hasattr(lib, "accel_hip_emu_configure")
        if self.emulated:
            lib.accel_hip_emu_configure.restype = ctypes.c_char_p
            name, seed = schedule or SCHEDULES[0]
            refused = lib.accel_hip_emu_configure(name.encode(), seed, warp_size, 64)
            if refused:
                raise ValueError(refused.decode())
        for name, restype in (("create", ctypes.c_void_p), ("alloc", ctypes.c_void_p),
                              ("last_error", ctypes.c_char_p), ("precision", ctypes.c_char_p)):
            getattr(lib, f"accel_hip_{name}").restype = restype
        built = lib.accel_hip_precision().decode()
        if built != precision:
            raise SystemExit(f"ab_epilogues.py: {path} is a {built} build, not {precision}")
        error = ctypes.create_string_buffer(512)
        self.ctx = lib.accel_hip_create(error, ctypes.c_size_t(512))
        if not self.ctx:
            raise SystemExit(f"ab_epilogues.py: {path}: {error.value.decode()}")
        self.buffers = []

    def put(self, x, wide=False):
        """x on the device: floatX, or float32 where `wide`."""
        if self.precision == "bf16" and not wide:
            from kernels.bf16 import to_bf16
            host = np.ascontiguousarray(to_bf16(np.asarray(x, dtype=np.float32)))
        else:
            host = np.ascontiguousarray(x, dtype=np.float32)
        p = self.lib.accel_hip_alloc(ctypes.c_void_p(self.ctx), ctypes.c_size_t(host.nbytes))
        assert p, "out of device memory"
        self.lib.accel_hip_copy_to_backend(ctypes.c_void_p(self.ctx), ctypes.c_void_p(p),
                                           host.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(host.nbytes))
        self.buffers.append(p)
        return (p, host.shape, host.dtype)

    def get(self, buffer):
        p, shape, dtype = buffer
        host = np.empty(shape, dtype=dtype)
        self.lib.accel_hip_copy_to_host(ctypes.c_void_p(self.ctx), host.ctypes.data_as(ctypes.c_void_p),
                                        ctypes.c_void_p(p), ctypes.c_size_t(host.nbytes))
        self.check_error()
        if dtype == np.uint16:
            return (host.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return host.astype(np.float64)

    def value(self, x, wide=False):
        """x as the device holds it (bf16-rounded for a floatX at bf16), in float64."""
        if self.precision == "bf16" and not wide:
            from kernels.bf16 import to_bf16
            return (to_bf16(np.asarray(x, dtype=np.float32)).astype(np.uint32) << 16).view(np.float32).astype(
                np.float64)
        return np.asarray(x, dtype=np.float32).astype(np.float64)

    def call(self, name, *args):
        converted = [ctypes.c_void_p(a[0]) if isinstance(a, tuple) else
                     ctypes.c_void_p(None) if a is None else ctypes.c_int(a) for a in args]
        getattr(self.lib, name)(ctypes.c_void_p(self.ctx), *converted)

    def call_n(self, name, *args):
        """name(ctx, pointers..., N) with N a ptrdiff_t."""
        *pointers, n = args
        getattr(self.lib, name)(ctypes.c_void_p(self.ctx), *[ctypes.c_void_p(p[0]) for p in pointers],
                                ctypes.c_ssize_t(n))

    def synchronize(self):
        self.lib.accel_hip_synchronize(ctypes.c_void_p(self.ctx))
        self.check_error()

    def check_error(self):
        error = self.lib.accel_hip_last_error(ctypes.c_void_p(self.ctx))
        if error:
            raise RuntimeError(error.decode())

    def free(self, st):
        """The buffers of a case's state."""
        for buffer in st.values():
            if isinstance(buffer, tuple) and buffer[0] in self.buffers:
                self.buffers.remove(buffer[0])
                self.lib.accel_hip_free(ctypes.c_void_p(self.ctx), ctypes.c_void_p(buffer[0]), ctypes.c_size_t(0))

    def close(self):
        for p in self.buffers:
            self.lib.accel_hip_free(ctypes.c_void_p(self.ctx), ctypes.c_void_p(p), ctypes.c_size_t(0))
        self.lib.accel_hip_destroy(ctypes.c_void_p(self.ctx))


# ----------------------------------------------------------------------------
# the cases: for each, make(device, shape, rng) -> state; run(device, state, path) calls the plain
# or the epilogue path; outputs(device, state) -> {name: (device's values, float64 reference)}

class MatmulForward:
    name = "matmul_forward"
    variant = 1

    def __init__(self, bias=True):
        self.bias = bias
        self.label = self.name + ("" if bias else " (no bias)")

    def make(self, d, s, rng):
        BT, C, OC = s["B"] * s["T"], s["C"], s["OC"]
        inp, weight, bias = rng.standard_normal((BT, C)), rng.standard_normal((OC, C)) / np.sqrt(C), \
            rng.standard_normal(OC)
        st = dict(s=s, inp=d.put(inp), weight=d.put(weight), bias=d.put(bias) if self.bias else None,
                  out=d.put(np.full((BT, OC), np.nan)))
        ref = d.value(inp) @ d.value(weight).T + (d.value(bias) if self.bias else 0.0)
        st["ref"] = {"out": ref}
        return st

    def run(self, d, st, path):
        s = st["s"]
        fn = "accel_hip_plain_matmul_forward" if path == "plain" else "accel_hip_matmul_forward"
        d.call(fn, st["out"], st["inp"], st["weight"], st["bias"], s["B"], s["T"], s["C"], s["OC"])

    def outputs(self, d, st):
        return {"out": (d.get(st["out"]), st["ref"]["out"])}


class MatmulBackward:
    name = "matmul_backward"
    variant = 2
    label = name

    def make(self, d, s, rng):
        BT, C, OC = s["B"] * s["T"], s["C"], s["OC"]
        dout, inp, weight = rng.standard_normal((BT, OC)), rng.standard_normal((BT, C)), \
            rng.standard_normal((OC, C)) / np.sqrt(C)
        # gradients start non-zero: backward adds
        dinp0, dweight0, dbias0 = rng.standard_normal((BT, C)), rng.standard_normal((OC, C)), rng.standard_normal(OC)
        st = dict(s=s, dout=d.put(dout), inp=d.put(inp), weight=d.put(weight), dinp=d.put(dinp0),
                  dweight=d.put(dweight0, wide=True), dbias=d.put(dbias0, wide=True))
        g, x, w = d.value(dout), d.value(inp), d.value(weight)
        st["ref"] = {"dinp": d.value(dinp0) + g @ w, "dweight": d.value(dweight0, wide=True) + g.T @ x,
                     "dbias": d.value(dbias0, wide=True) + g.sum(axis=0)}
        return st

    def run(self, d, st, path):
        s = st["s"]
        fn = "accel_hip_plain_matmul_backward" if path == "plain" else "accel_hip_matmul_backward"
        d.call(fn, st["dinp"], st["dweight"], st["dbias"], st["dout"], st["inp"], st["weight"], s["B"], s["T"],
               s["C"], s["OC"])

    def outputs(self, d, st):
        return {k: (d.get(st[k]), st["ref"][k]) for k in ("dinp", "dweight", "dbias")}


class MatmulGelu:
    name = "matmul_gelu_forward"
    variant = None  # in both libraries
    label = name

    def make(self, d, s, rng):
        BT, C, OC = s["B"] * s["T"], s["C"], s["OC"]
        inp, weight, bias = rng.standard_normal((BT, C)), rng.standard_normal((OC, C)) / np.sqrt(C), \
            rng.standard_normal(OC)
        st = dict(s=s, inp=d.put(inp), weight=d.put(weight), bias=d.put(bias),
                  pre=d.put(np.full((BT, OC), np.nan)), out=d.put(np.full((BT, OC), np.nan)))
        pre = d.value(inp) @ d.value(weight).T + d.value(bias)
        st["ref"] = {"pre": pre, "out": gelu(pre)}
        return st

    def run(self, d, st, path):
        s = st["s"]
        if path == "plain":
            d.call("accel_hip_plain_matmul_forward", st["pre"], st["inp"], st["weight"], st["bias"], s["B"], s["T"],
                   s["C"], s["OC"])
            d.call_n("accel_hip_gelu_forward", st["out"], st["pre"], s["B"] * s["T"] * s["OC"])
        else:
            d.call("accel_hip_dev_matmul_gelu_forward", st["out"], st["pre"], st["inp"], st["weight"], st["bias"],
                   s["B"], s["T"], s["C"], s["OC"])

    def outputs(self, d, st):
        return {k: (d.get(st[k]), st["ref"][k]) for k in ("pre", "out")}


CASES = [MatmulForward(), MatmulForward(bias=False), MatmulBackward(), MatmulGelu()]


def cases_of(variant):
    return [case for case in CASES if case.variant in (variant, None)]


def shape_text(s):
    return f"B={s['B']} T={s['T']} C={s['C']} OC={s['OC']}"


def check_library(path, variant, precision="fp32", schedule=None, warp_size=32, shapes=None, seed=0):
    """Each case of this variant's library, plain and epilogue paths, against the float64 reference:
    [(case, shape, path, output, relative error, tolerance, ok)]. A case the library refuses (a BLAS
    without that epilogue: the context's error) is one failing row, and the next case gets a fresh
    context."""
    rows = []
    shapes = [ODD] + D12 if shapes is None else shapes
    tolerance = TOLERANCE[precision]
    for case in cases_of(variant):
        d = Device(path, precision, schedule, warp_size)
        try:
            for i, s in enumerate(shapes):
                for path_name in ("plain", "epilogue"):
                    # each path on fresh buffers (outputs NaN, gradients at the same start): an
                    # output a path leaves unwritten is not the other path's
                    st = case.make(d, s, np.random.default_rng([seed, i]))
                    case.run(d, st, path_name)
                    d.synchronize()
                    for output, (got, ref) in case.outputs(d, st).items():
                        scale = max(np.abs(ref).max(), 1e-30)
                        error = float(np.abs(got - ref).max() / scale) if np.isfinite(got).all() else float("inf")
                        rows.append((case.label, shape_text(s), path_name, output, error, tolerance,
                                     error <= tolerance))
                    d.free(st)
        except RuntimeError as e:
            rows.append((case.label, "", "", f"failed: {e}", float("inf"), tolerance, False))
        finally:
            d.close()
    return rows


def check(build=BUILD, emulated=True, precisions=PRECISIONS, variants=VARIANTS, schedules=None, warp_sizes=None,
          shapes=None, paths=None):
    """check_library for each variant and precision (under each schedule and warp size on the
    emulator); prints the table, returns the failing rows as (variant, precision, setting, row)."""
    schedules = (SCHEDULES if emulated else [None]) if schedules is None else schedules
    warp_sizes = (WARP_SIZES if emulated else [32]) if warp_sizes is None else warp_sizes
    failures = []
    for variant in variants:
        for precision in precisions:
            path = (paths or {}).get((variant, precision)) or library_path(variant, precision, emulated, build)
            for warp_size in warp_sizes:
                for schedule in schedules:
                    setting = f"{schedule[0]}/{schedule[1]} warp {warp_size}" if emulated else "GPU"
                    rows = check_library(path, variant, precision, schedule, warp_size, shapes)
                    for row in rows:
                        if not row[6]:
                            failures.append((variant, precision, setting, row))
                    bad = sum(not r[6] for r in rows)
                    print(f"variant {variant} {precision} {setting}: {len(rows)} outputs, "
                          f"worst {max(r[4] for r in rows):.2e} (tolerance {TOLERANCE[precision]:.0e})"
                          f"{'' if not bad else f', {bad} WRONG'}")
    for variant, precision, setting, (case, shape, path_name, output, error, tolerance, _) in failures[:20]:
        print(f"  WRONG: variant {variant} {precision} {setting}: {case} {path_name} {output} at {shape}: "
              f"{error:.2e} > {tolerance:.0e}")
    return failures


def time_library(path, variant, precision, repeats, warmup=3, shapes=TIMED):
    """Median ms of each path of each case at d12's GEMMs (B=8, T=1024), and epilogue / plain; a
    case the library refuses is one line."""
    rng = np.random.default_rng(1)
    for case in cases_of(variant):
        d = Device(path, precision)
        try:
            for gemm, s in shapes:
                if isinstance(case, MatmulGelu) and gemm != "fc":
                    continue  # GELU follows the fc GEMM only
                ms = {}
                for path_name in ("plain", "epilogue"):
                    st = case.make(d, s, rng)
                    for _ in range(warmup):
                        case.run(d, st, path_name)
                    d.synchronize()
                    samples = []
                    for _ in range(repeats):
                        t0 = time.perf_counter()
                        case.run(d, st, path_name)
                        d.synchronize()
                        samples.append((time.perf_counter() - t0) * 1e3)
                    ms[path_name] = statistics.median(samples)
                    d.free(st)
                print(f"{case.label:28s} {gemm:8s} {precision}  plain {ms['plain']:8.3f} ms  "
                      f"epilogue {ms['epilogue']:8.3f} ms  epilogue/plain {ms['epilogue'] / ms['plain']:.3f}")
        except RuntimeError as e:
            print(f"{case.label:28s} {precision}  failed: {e}")
        finally:
            d.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emulated", action="store_true", help="the emulated builds: check only")
    parser.add_argument("--build", default=BUILD, help="where the libraries are (accel/hip/build)")
    parser.add_argument("--precision", choices=PRECISIONS + ("both",), default="both")
    parser.add_argument("--variant", type=int, choices=VARIANTS, action="append", help="(default: every one)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--check-only", action="store_true")
    args = parser.parse_args()
    precisions = PRECISIONS if args.precision == "both" else (args.precision,)
    variants = tuple(args.variant or VARIANTS)
    if args.emulated:
        print("emulated builds: checks only (the emulator's speed means nothing)")
    failures = check(args.build, args.emulated, precisions, variants)
    if failures:
        names = sorted({f"variant {v} {p} {row[0]} {row[2]}" for v, p, _, row in failures})
        print(f"ab_epilogues.py: WRONG: {'; '.join(names)}", file=sys.stderr)
        return 1
    if args.emulated or args.check_only:
        return 0
    for variant in variants:
        for precision in precisions:
            time_library(library_path(variant, precision, False, args.build), variant, precision, args.repeats)
    return 0


if __name__ == "__main__":
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    sys.exit(main())
