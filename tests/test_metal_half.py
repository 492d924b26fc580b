"""accel/metal at fp16 and bf16 on Linux: its kernels (gpt2.metal and the llama.metal and flash.metal
it #includes) built with floatX half (libmetal_emu_fp16.so)
and bfloat (libmetal_emu_bf16.so) for the CPU emulator of MSL, and the emulator's half and bfloat.

- The emulator's types (accel/emu/msl_half.h) against NumPy's float16 (which rounds to nearest
  even) over every half and over random and boundary floats (ties, the overflow boundary 65520,
  subnormals), their arithmetic against NumPy's, and bfloat against kernels/bf16.pxd.
- Every entry through check:metal-emu against the CPU's table of the same precision, at fp16 and
  bf16, under a few schedules at simdgroups of 32 and 64; Llama's fixture likewise
  (test_llama2.py; test_gpt2.py's, about a minute each, are the README's commands).
- fp16, more strictly than check:: every entry against the CPU's fp32 kernels on widened copies
  (what the CPU's fp16 table computes: the fp32 kernel on the same fp16 values, each floatX
  output rounded once), compared as check: compares (accel/instrument.pyx): within
  spec.tolerance(K) plus two fp16 steps (2^-10) of the output's largest element, and the mean
  signed difference of the elements one step apart near 0 (a store that truncates moves it to
  about -0.5 step); and, as
  tests/test_hip_bf16.py, at most 1 in 50 elements of other bits than the oracle's (rounded once
  from nearly the same float32, few straddle a midpoint: seen at most 1 in 300, matmul's dinp at
  d12 widths; an intermediate rounded on the way, as attention's probabilities were before they
  went through float, changes a third of them); at small shapes under a few schedules, and the
  GEMM and flash attention at d12's widths.
- The mixed group bit for bit: narrow_params and adamw_update_rounded as the CPU rounds (bf16:
  kernels/bf16.pxd's nearest-even and stochastic rounding with its hash; fp16: nearest even).
- Planted faults caught by check:: a store that truncates instead of rounding (its bias
  statistic, at bf16 and fp16), the matmul accumulating in half instead of float (named
  matmul_forward at d12's widths), a kernel reading a floatX buffer through a float pointer (a
  spec declaration missed in the port).
- host.c declares floatX exactly where accel/spec.py does (its pointer arithmetic counts elements).
- The model's dynamic loss scaling on these kernels: the CPU's fp16 gradients at the default
  scale, whole tensors lost to underflow without it, an overflow seen at 2^30.
"""
import ctypes
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import builds
import needs
from accel import instrument
from accel.backend import get_backend
from accel.spec import BY_NAME, ORDER, entries_of, evaluate, tolerance
from entries import D12_WIDTHS, SMALL, host_data, numbers, run_every_entry
from kernels.bf16 import to_bf16
from metal_sources import SOURCE, patched

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "accel" / "metal" / "build"
# a few schedules and both simdgroup widths (tests/test_metal_emu.py runs every schedule at fp32)
CONFIGS = [("lockstep", 1, 32), ("shuffled", 2, 64), ("warp-ahead-reverse", 1, 32)]
GROUPS = ("linear", "gpt2", "llama", "classifier", "flash")
KERNELS = [name for name in entries_of(GROUPS) if BY_NAME[name].wrap]
FP16_STEP = 2.0 ** -10    # two fp16 steps of the largest element (check:'s BF16_ULP is bf16's two)
BIAS_LIMIT = 0.05         # check:'s BF16_BIAS_LIMIT
ONE_IN = 50               # at most one element in 50 of an fp16 output with other bits than the oracle's

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Metal emulator runs on Linux")
needs.tool("g++")
needs.tool("make")


def make_library(precision, source=SOURCE, library=None):
    """The emulator library of a .metal file at a precision (`make metal-emu`); its path."""
    library = library or BUILD / f"libmetal_emu_{precision}.so"
    command = ["make", "-s", "-C", str(ROOT), "metal-emu", f"METAL_SOURCE={source}", f"METAL_EMU_LIB={library}",
               f"METAL_PRECISION={precision}", f"PYTHON={sys.executable}"]
    result = subprocess.run(builds.locked(command), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return library


def backend(library, precision, schedule="lockstep", seed=1, simdgroup_size=32):
    """A fresh metal-emu backend over `library`, its emulator configured first."""
    from accel.metal import metal
    lib = ctypes.CDLL(str(library))
    lib.metal_emu_configure.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int]
    assert lib.metal_emu_configure(schedule.encode(), seed, simdgroup_size) == 0
    return metal.create(str(library), "metal-emu", precision=precision)


@pytest.fixture(scope="module")
def libraries():
    return {p: make_library(p) for p in ("fp16", "bf16")}


# --- the emulator's half and bfloat -------------------------------------------------------------

@pytest.fixture(scope="module")
def conversions(tmp_path_factory):
    library = tmp_path_factory.mktemp("msl_half") / "msl_half.so"
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Werror", "-shared", "-fPIC",
                    str(ROOT / "accel" / "emu" / "tests" / "msl_half.cpp"), "-o", str(library)], check=True)
    return ctypes.CDLL(str(library))


def convert(lib, function, values, dtype):
    values = np.ascontiguousarray(values)
    out = np.empty(values.size, dtype)
    getattr(lib, function)(out.ctypes.data_as(ctypes.c_void_p), values.ctypes.data_as(ctypes.c_void_p),
                           ctypes.c_size_t(values.size))
    return out


def boundary_floats():
    """Every midpoint between neighbouring finite halves and the floats either side of it, the
    overflow boundary, the subnormal range's edges, zeros, infinities."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    finite = np.unique(halves[np.isfinite(halves)].astype(np.float64))
    middle = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)   # exact in float32
    return np.concatenate([middle, np.nextafter(middle, np.float32(np.inf)),
                           np.nextafter(middle, np.float32(-np.inf)),
                           np.float32([65504, 65519.996, 65520, 65520.004, 1e10, 2.0 ** -14, 2.0 ** -24,
                                       2.0 ** -25, 2.0 ** -25 * 1.0000001, 2.0 ** -26, 1e-45, 0.0, -0.0,
                                       np.inf, -np.inf])])


def random_floats(n=1 << 20, seed=0):
    """Floats of every exponent (random bit patterns, NaNs among them)."""
    return np.random.default_rng(seed).integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def test_half_widens_exactly_every_half(conversions):
    every = np.arange(1 << 16, dtype=np.uint16)
    got = convert(conversions, "halves_to_float", every, np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), every.view(np.float16).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("floats", [boundary_floats, random_floats], ids=["boundaries", "random"])
def test_half_rounds_to_nearest_even_as_numpy(conversions, floats):
    x = floats()
    got = convert(conversions, "floats_to_half", x, np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.all(np.isnan(got[nan].view(np.float16)))   # a NaN stays a NaN
    # every half is its own rounding (the round trip)
    every = np.arange(1 << 16, dtype=np.uint16)
    finite = np.isfinite(every.view(np.float16))
    np.testing.assert_array_equal(convert(conversions, "floats_to_half", every.view(np.float16)[finite]
                                          .astype(np.float32), np.uint16), every[finite])


@pytest.mark.parametrize("op, numpy_op", [(0, np.add), (1, np.multiply), (2, np.subtract), (3, np.divide)],
                         ids=["add", "multiply", "subtract", "divide"])
def test_half_arithmetic_is_correctly_rounded(conversions, op, numpy_op):
    rng = np.random.default_rng(op)
    a, b = (rng.integers(0, 1 << 16, 1 << 18, dtype=np.uint32).astype(np.uint16) for _ in range(2))
    out = np.empty(a.size, np.uint16)
    conversions.half_arithmetic(*(v.ctypes.data_as(ctypes.c_void_p) for v in (out, a, b)), ctypes.c_size_t(a.size),
                                op)
    with np.errstate(all="ignore"):
        want = numpy_op(a.view(np.float16), b.view(np.float16))
    nan = np.isnan(want)
    np.testing.assert_array_equal(out[~nan], want.view(np.uint16)[~nan])
    assert np.all(np.isnan(out[nan].view(np.float16)))


def test_narrowing_a_float_into_a_half_must_be_written_out(tmp_path):
    """MSL narrows implicitly; the emulator's half and bfloat do not, so a store that forgets its
    floatX(...) fails to build instead of rounding unseen."""
    def builds(body):
        source = tmp_path / "narrowing.cpp"
        source.write_text(f'#include "msl_half.h"\nvoid f(half* h, bfloat* b, float x) {{ {body} }}\n')
        return subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-I", str(ROOT / "accel" / "emu"), str(source)],
                              capture_output=True).returncode == 0
    assert builds("h[0] = half(x); b[0] = bfloat(x); float y = h[0] + b[0] * x; (void)y;")
    assert not builds("h[0] = x;")
    assert not builds("b[0] = x;")
    assert not builds("h[0] = h[0] + x;")   # half + float is float, as in MSL


@pytest.mark.parametrize("floats", [boundary_floats, random_floats], ids=["boundaries", "random"])
def test_bfloat_rounds_as_kernels_bf16(conversions, floats):
    x = floats()
    ties = (np.arange(1 << 16, dtype=np.uint32) << 16 | 0x8000).view(np.float32)   # exactly between two bfloats
    with np.errstate(invalid="ignore"):
        x = np.concatenate([x, ties, np.nextafter(ties, np.float32(0))])
    np.testing.assert_array_equal(convert(conversions, "floats_to_bfloat", x, np.uint16), to_bf16(x))
    every = np.arange(1 << 16, dtype=np.uint16)
    np.testing.assert_array_equal(convert(conversions, "bfloats_to_float", every, np.float32).view(np.uint32),
                                  every.astype(np.uint32) << 16)


# --- every entry through check:metal-emu --------------------------------------------------------

def checked(library, precision, *config):
    return instrument.create("check", backend(library, precision, *config))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("config", CONFIGS, ids=[f"{s}-{seed}-{w}" for s, seed, w in CONFIGS])
def test_every_entry_matches_the_cpu_through_check(libraries, precision, config):
    b = checked(libraries[precision], precision, *config)
    run_every_entry(b, seed=config[1])
    report = b.report()
    assert report["mismatches"] == 0, b.summary()
    assert all(report["entries"][k]["compared"] > 0 for k in KERNELS + ["narrow_params", "adamw_update_rounded"]), \
        set(KERNELS) - set(report["entries"])


# --- fp16: every entry against the CPU's fp32 kernels on widened copies ----------------------------

def host_input(arg, values, rng):
    """An input as tests/entries.py fills it: a floatX one as fp16."""
    data = host_data(arg, values, rng)
    return data.astype(np.float16) if arg.floatx else data


def call(target, name, host, values, widen):
    """The entry on target from host arrays (fp16 ones widened to float32 for the CPU's fp32
    kernels): (what it returns, {output: host copy}, floatX outputs as fp16)."""
    entry = BY_NAME[name]
    buffers = {}
    for a in entry.args:
        if a.pointer and host.get(a.name) is not None:
            data = host[a.name].astype(np.float32) if widen and a.floatx else host[a.name]
            buffers[a.name] = target.alloc(data.nbytes)
            buffers[a.name].load(data)
    result = target.call(name, *[buffers.get(a.name) if a.pointer else values[a.name] for a in entry.args])
    target.check_error()
    outputs = {}
    for a in entry.outputs:
        if a.name in buffers:
            dtype = np.float32 if widen or not a.floatx else np.float16
            out = buffers[a.name].to_numpy(dtype)
            outputs[a.name] = out.astype(np.float16) if a.floatx else out   # the oracle's one rounding
    return result, outputs


def fp16_cases(cpu, dims=SMALL, names=KERNELS, seed=0):
    """[(name, values, host inputs, the oracle's (result, outputs))]; a backward's saved
    activations are the oracle's forward's outputs."""
    rng = np.random.default_rng(seed)
    made = []
    for name in names:
        entry = BY_NAME[name]
        for with_optional in (True, False) if any(a.optional for a in entry.args) else (True,):
            values = numbers(name, dims)
            host = {a.name: host_input(a, values, rng) for a in entry.args
                    if a.pointer and a.init != "forward" and (with_optional or not a.optional)}
            if any(a.init == "forward" for a in entry.args):
                forward = BY_NAME[name.replace("_backward", "_forward")]
                inputs = {a.name: host[a.name] if a.name in host else host_input(a, values, rng)
                          for a in forward.args if a.pointer}
                _, saved = call(cpu, forward.name, inputs, values, widen=True)
                host.update({a.name: saved[a.name] for a in entry.args if a.init == "forward"})
            made.append((name, values, host, call(cpu, name, host, values, widen=True)))
    return made


def compare(name, arg, values, got, want):
    """Why an output differs from the oracle's beyond check:'s rule, or None."""
    if arg.causal:
        T = values["T"]
        mask = np.broadcast_to(np.arange(T)[:, None] >= np.arange(T)[None, :], (want.size // (T * T), T, T))
        got, want = got[mask.reshape(-1)], want[mask.reshape(-1)]
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isfinite(g), np.isfinite(w)) or not np.all((g == w) | np.isfinite(w)):
        return f"{name}.{arg.name}: NaN or infinity where the oracle has {w[~np.isfinite(g)][:3]}"
    g, w = g[np.isfinite(w)], w[np.isfinite(w)]
    if w.size == 0:
        return None
    scale = float(np.max(np.abs(w)))
    allowed = (tolerance(evaluate(arg.reduction, values)) + (FP16_STEP if arg.floatx else 0.0)) * scale
    error = float(np.max(np.abs(g - w)))
    if error > allowed:
        return f"{name}.{arg.name}: error {error:.3g} > {allowed:.3g} ({error / scale:.3g} of its largest element)"
    if arg.floatx:
        # the mean signed difference, in fp16 steps of each element, over the elements one step apart
        step = np.maximum(np.ldexp(1.0, np.frexp(np.abs(w))[1] - 11), 2.0 ** -24)
        ulps = (g - w) * np.sign(w) / step
        one = (w != 0) & (g != w) & (np.abs(ulps) <= 1)
        bias = float(np.sum(ulps[one])) / w.size
        if abs(bias) > BIAS_LIMIT + 4 * math.sqrt(np.sum(one)) / w.size:
            return f"{name}.{arg.name}: rounded with a bias of {bias:.3f} steps ({np.sum(one)} of {w.size} differ)"
        if np.mean(g != w) * ONE_IN > 1:
            return f"{name}.{arg.name}: {np.mean(g != w):.1%} of its elements differ from the oracle's (at most 1 in {ONE_IN})"
    return None


def fp16_mismatches(target, made):
    """Every case of `made` on target: [problems], each naming its entry first."""
    problems = []
    for name, values, host, (want_result, want) in made:
        result, got = call(target, name, host, values, widen=False)
        entry = BY_NAME[name]
        if entry.returns != "void" and not abs(result - want_result) <= \
                tolerance(evaluate(entry.reduction, values)) * abs(want_result):
            problems.append(f"{name} returned {result!r}, the oracle {want_result!r}")
        problems += [p for a in entry.outputs if a.name in want
                     for p in [compare(name, a, values, got[a.name], want[a.name])] if p]
    return problems


@pytest.fixture(scope="module")
def made():
    return fp16_cases(get_backend("cpu"))


def test_every_fp16_entry_matches_the_widened_fp32_oracle(libraries, made):
    assert {name for name, *_ in made} == set(KERNELS)
    problems = fp16_mismatches(backend(libraries["fp16"], "fp16", "shuffled", 5, 64), made)
    assert not problems, problems


def test_fp16_gemm_and_flash_attention_at_d12_widths(libraries):
    """C = 768, OC = 3072 (K up to 3072 in float32), hs = 64 in tiles of 16 rows."""
    names = [n for n in KERNELS if n.startswith("matmul") or BY_NAME[n].group == "flash"]
    made = fp16_cases(get_backend("cpu"), dims=D12_WIDTHS, names=names)
    problems = fp16_mismatches(backend(libraries["fp16"], "fp16", "shuffled", 3, 32), made)
    assert not problems, problems


# --- the mixed group, bit for bit ---------------------------------------------------------------

def masters(n=20011, seed=3):
    """Weights of every magnitude, with ties, the largest finite values, infinities, zeros,
    subnormals and a NaN first."""
    rng = np.random.default_rng(seed)
    master = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    special = np.float32([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 65504, 65520,
                          -65520, 3.3895314e38, np.inf, -np.inf, 0.0, -0.0, 1e-40, 2.0 ** -25, 3e-6, np.nan])
    master[:special.size] = special
    return master


def narrowed(target, master, first, seed):
    params, weights = target.alloc(2 * master.size), target.alloc(4 * master.size)
    weights.load(master)
    target.call("narrow_params", params, weights, master.size, first, seed)
    target.check_error()
    return params.to_numpy(np.uint16)


@pytest.mark.parametrize("seed, first", [(-1, 0), (0, 0), (7, 123456789), (9, (1 << 32) + 5)])
def test_bf16_narrow_params_rounds_bit_for_bit_as_the_cpu(libraries, seed, first):
    master = masters()
    got = narrowed(backend(libraries["bf16"], "bf16", "shuffled", 2, 64), master, first, seed)
    np.testing.assert_array_equal(got, narrowed(get_backend("cpu", "bf16"), master, first, seed))
    if seed < 0:
        np.testing.assert_array_equal(got, to_bf16(master))   # nearest even
    else:
        assert np.mean(got != to_bf16(master)) > 0.2   # stochastic: up or down


@pytest.mark.parametrize("seed", [-1, 7])
def test_fp16_narrow_params_rounds_to_nearest_even_whatever_the_seed(libraries, seed):
    master = masters()
    got = narrowed(backend(libraries["fp16"], "fp16"), master, 5, seed)
    with np.errstate(over="ignore", invalid="ignore"):
        want = master.astype(np.float16).view(np.uint16)
    nan = np.isnan(master)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.isnan(got[nan].view(np.float16)).all()
    np.testing.assert_array_equal(got, narrowed(get_backend("cpu", "fp16"), master, 5, seed))   # the CPU's table


def rounded_update(target, precision, state, first, t=3):
    """adamw_update_rounded on copies of state: (params bits, master, m, v) after it."""
    n = state["master"].size
    bufs = {k: target.alloc(v.nbytes) for k, v in state.items()}
    for k, v in state.items():
        bufs[k].load(v)
    params = target.alloc(2 * n)
    target.call("adamw_update_rounded", params, bufs["master"], bufs["m"], bufs["v"], bufs["grads"], n, 1e-3, 0.9,
                0.999, 1e-8, 0.01, 1.0, t, first)
    target.check_error()
    return [params.to_numpy(np.uint16)] + [bufs[k].to_numpy(np.float32) for k in ("master", "m", "v")]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_adamw_update_rounded_as_the_cpu(libraries, precision):
    """The float32 update as the CPU's adamw_update (within the last bits: the CPU's compiler may
    contract a multiply and an add; seen: 1.5% of the weights one or two ulps apart), and params
    the new master rounded as narrow_params rounds it with seed t (bf16 stochastically, fp16 to
    nearest even): as the CPU's table of the precision, bit for bit wherever the new masters are."""
    rng = np.random.default_rng(4)
    n = 20011
    state = {"master": (rng.standard_normal(n) / 10).astype(np.float32),
             "m": (rng.standard_normal(n) / 100).astype(np.float32),
             "v": (rng.random(n) / 1000).astype(np.float32), "grads": rng.standard_normal(n).astype(np.float32)}
    first, t = 77, 3
    got = rounded_update(backend(libraries[precision], precision, "shuffled", 1, 64), precision, state, first, t)
    cpu = get_backend("cpu")
    bufs = {k: cpu.alloc(v.nbytes) for k, v in state.items()}
    for k, v in state.items():
        bufs[k].load(v)
    cpu.call("adamw_update", bufs["master"], bufs["m"], bufs["v"], bufs["grads"], n, 1e-3, 0.9, 0.999, 1e-8, 0.01,
             1.0, t)
    for have, key in zip(got[1:], ("master", "m", "v")):
        want = bufs[key].to_numpy(np.float32)
        np.testing.assert_allclose(have, want, rtol=0, atol=4 * 2.0 ** -24 * np.max(np.abs(want)), err_msg=key)
    if precision == "bf16":
        np.testing.assert_array_equal(got[0], to_bf16(got[1], seed=t, first=first))
    else:
        np.testing.assert_array_equal(got[0], got[1].astype(np.float16).view(np.uint16))
    params, master, _, _ = rounded_update(get_backend("cpu", precision), precision, state, first, t)
    same = master.view(np.uint32) == got[1].view(np.uint32)
    assert same.mean() > 0.9
    np.testing.assert_array_equal(got[0][same], params[same])   # the CPU's table, where the masters agree


# --- planted faults -----------------------------------------------------------------------------

# gelu_forward's store truncating toward zero instead of rounding to nearest (within one step of
# the right value: only the bias of the differences shows it)
TRUNCATING_GELU = (
    "        out[i] = floatX(0.5f * x * (1.0f + precise::tanh(GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x))));",
    "        float g = 0.5f * x * (1.0f + precise::tanh(GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x)));\n"
    "        floatX r = floatX(g);\n"
    "        if (abs(float(r)) > abs(g)) r = as_type<floatX>(ushort(as_type<ushort>(r) - 1));\n"
    "        out[i] = r;")


def test_a_truncating_store_is_caught_at_both_precisions(tmp_path, made, capfd):
    source, _ = patched(tmp_path / "truncate", [TRUNCATING_GELU])
    for precision in ("bf16", "fp16"):
        b = checked(make_library(precision, source, tmp_path / f"truncate_{precision}.so"), precision)
        run_every_entry(b, groups=("gpt2",))
        assert {n for n, e in b.report()["entries"].items() if e["mismatches"]} == {"gelu_forward"}, b.summary()
        assert "gelu_forward's" in capfd.readouterr().err   # check:'s line on the bias
    # and the stricter fp16 comparison here names it by its bias too
    library = tmp_path / "truncate_fp16.so"
    problems = fp16_mismatches(backend(library, "fp16"), [m for m in made if m[0].startswith("gelu")])
    assert len(problems) == 1 and problems[0].startswith("gelu_forward.out: rounded with a bias of -0."), problems


def test_a_matmul_accumulating_in_half_is_caught(tmp_path):
    """The tiles and the products' sums in simdgroup_half8x8 (each 8-term step rounded to half)
    instead of float: at d12's widths (K = 768, 3072) check: names matmul_forward first, off by
    far more than its tolerance."""
    text = SOURCE.read_text()
    start, end = text.index("template <typename OutT>\nvoid matmul_tile("), text.index("// out floatX: the forward")
    section = text[start:end]
    half = section.replace("simdgroup_float8x8", "simdgroup_half8x8").replace(
        "make_filled_simdgroup_matrix<float, 8, 8>(0.0f)", "make_filled_simdgroup_matrix<half, 8, 8>(half(0.0f))")
    source, _ = patched(tmp_path / "half_accumulation", [(section, half)])
    b = checked(make_library("fp16", source, tmp_path / "half_accumulation.so"), "fp16")
    run_every_entry(b, dims=D12_WIDTHS, groups=("linear",))
    report = b.report()
    assert report["first"]["entry"] == "matmul_forward", b.summary()
    assert {n for n, e in report["entries"].items() if e["mismatches"]} <= {"matmul_forward", "matmul_backward"}


def test_a_floatx_buffer_read_as_float_is_caught(tmp_path):
    """bias_backward reading dout (floatX in accel/spec.py) through a float pointer: the same at
    fp32, pairs of 16-bit values read as one float (and past the end) at fp16 and bf16."""
    source, _ = patched(tmp_path / "float_dout", [(
        "kernel void bias_backward(device float* dbias [[buffer(0)]],\n"
        "                          device const floatX* dout [[buffer(1)]],",
        "kernel void bias_backward(device float* dbias [[buffer(0)]],\n"
        "                          device const float* dout [[buffer(1)]],")])
    b = checked(make_library("bf16", source, tmp_path / "float_dout.so"), "bf16")
    run_every_entry(b, groups=("linear",))
    assert {n for n, e in b.report()["entries"].items() if e["mismatches"]} == {"matmul_backward"}, b.summary()


# --- host.c against the spec --------------------------------------------------------------------

def test_host_declares_floatx_where_the_spec_does():
    """Every accel_metal_<entry> of host.c spells floatX exactly for the arguments accel/spec.py
    declares floatX (so offsets into them count elements of the build's size)."""
    text = (ROOT / "accel" / "metal" / "host.c").read_text()
    checked_entries = 0
    for name in ORDER:
        m = re.search(rf"\baccel_metal_{name}\(void\* ctx,([^)]*)\)", text)
        if m is None:
            continue
        declared = {p.split()[-1].lstrip("*"): " ".join(p.split()[:-1]) for p in m.group(1).split(",")}
        for a in BY_NAME[name].args:
            if a.pointer:
                assert ("floatX" in declared[a.name]) == a.floatx, (name, a.name, declared[a.name])
        checked_entries += 1
    assert checked_entries == len([n for n in entries_of(GROUPS + ("core", "mixed")) if BY_NAME[n].args])


def test_each_library_is_its_precision(libraries):
    from accel.backend import BackendError
    from accel.metal import metal
    for precision, library in libraries.items():
        assert backend(library, precision).precision == precision
        with pytest.raises(BackendError, match=rf"is a {precision} build, not fp32"):
            metal.create(str(library), "metal-emu")
    assert get_backend("metal-emu", "fp16").groups[-1] == "mixed"


# --- a whole model, and the AddressSanitizer builds ----------------------------------------------

@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_test_llama2_passes_on_check_metal_emu(libraries, precision):
    # the committed GQA fixture: every Llama kernel, the classifier and flash attention through
    # check: against the CPU's table of the precision, and the model's loss scaling at fp16
    # (test_gpt2.py likewise: about a minute each, not run here)
    result = subprocess.run([sys.executable, "test_llama2.py", "--backend", "check:metal-emu", "--precision", precision],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "overall okay: 1" in result.stdout, result.stdout + result.stderr
    assert "check      OK      check:metal-emu: 1591 outputs compared, all within tolerance" in result.stdout


def test_loss_scaling_on_metal_emu_against_underflow_and_overflow(libraries):
    """The model's dynamic loss scaling (llmc/model.pyx) on the GPU's fp16 kernels: at the
    default scale the parameter gradients are the CPU's fp16 model's; unscaled, through weights
    a tenth of GPT-2's init, the fp16 activation gradients underflow and whole tensors are lost;
    at 2^30 they overflow fp16 and the step's gradient norm is not finite, which is what skips
    the update and halves the scale (the train loop's planted fault: tests/test_fp16.py)."""
    from train_gpt2 import GPT2, GPT2Config
    config = GPT2Config.from_depth(1, max_seq_len=64, vocab_size=97)
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, 97, (2, 64)), rng.integers(0, 97, (2, 64))

    def gradients(backend, scale):
        model = GPT2.random(config, seed=5, backend=backend, precision="fp16")
        model.params = model.params * np.float32(0.1)
        model.set_loss_scale(scale)
        model.zero_grad()
        model.forward(x, y)
        model.backward()
        return model, {k: g / np.float32(scale) for k, g in model.grad_tensors().items()}
    _, cpu = gradients("cpu", 2.0 ** 16)
    scaled_model, scaled = gradients("metal-emu", 2.0 ** 16)
    _, unscaled = gradients("metal-emu", 1.0)

    def worst(grads):   # the largest error of a tensor, relative to its largest gradient
        return max(np.abs(grads[k] - cpu[k]).max() / np.abs(cpu[k]).max() for k in cpu)
    assert worst(scaled) < 0.01 and not scaled_model.gradients_overflowed(scaled_model.grad_norm())
    assert worst(unscaled) > 0.5
    overflowed, _ = gradients("metal-emu", 2.0 ** 30)
    assert overflowed.gradients_overflowed(overflowed.grad_norm())


ASAN_SCRIPT = """
import sys
sys.path.insert(0, "tests")
import test_metal_half as t
from accel.backend import get_backend
library, precision = sys.argv[1], sys.argv[2]
b = t.checked(library, precision, "shuffled", 1, 64)
t.run_every_entry(b)
assert b.report()["mismatches"] == 0, b.summary()
print("every entry ran")
"""


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_address_sanitizer_build_runs_every_entry_cleanly(tmp_path, precision):
    """2-byte buffers: a kernel or host.c offset that counts floats where it should count halves
    reads or writes past them."""
    libasan = needs.asan_runtime()
    library = tmp_path / f"libmetal_emu_{precision}.asan.so"
    command = ["make", "-s", "-C", str(ROOT), "metal-emu", f"METAL_EMU_LIB={library}", f"METAL_PRECISION={precision}",
               "ASAN=1", f"PYTHON={sys.executable}"]
    built = subprocess.run(builds.locked(command), capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", ASAN_SCRIPT, str(library), precision], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "AddressSanitizer" not in done.stderr, done.stderr[-3000:]
    assert "every entry ran" in done.stdout
