"""Mixed precision (bf16) on the CPU: the conversions, the bf16 table entry by entry against the
fp32 table (and the fp16 table, check:'s oracle for the GPUs' half precision, likewise), both
bf16 GEMM paths, check: at bf16 and a planted rounding fault, and the models (master weights,
stochastic rounding, determinism) of both families."""
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import needs
import train_llama2
from accel import cpu
from accel.backend import BackendError, get_backend
from accel.spec import BY_NAME, ORDER, evaluate, tolerance
from entries import SMALL, host_data, numbers
from faults import faulty_cpu
from kernels import bf16, fp16
from train_gpt2 import GPT2, GPT2Config
from train_llama2 import Llama2

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def reference_rne(x):
    """float32 -> bf16 bits rounded to nearest even, in NumPy's integers (NaN kept a NaN)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def special_values():
    rng = np.random.default_rng(0)
    ties = (rng.integers(0, 1 << 16, 64).astype(np.uint32) << 16 | 0x8000).view(np.float32)
    return np.concatenate([
        rng.standard_normal(4096).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 4096),
        ties, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3.4e38, -3.4e38,
               np.finfo(np.float32).max]]).astype(np.float32)


# --- the conversions --------------------------------------------------------------------------

def test_rounding_to_nearest_even_matches_the_reference_and_torch():
    x = special_values()
    bits = bf16.to_bf16(x)
    nan = np.isnan(x)
    assert np.array_equal(bits[~nan], reference_rne(x)[~nan])
    assert np.isnan(bf16.to_float32(bits[nan])).all()
    assert np.array_equal(bf16.to_float32(bits).view(np.uint32) & 0xFFFF, np.zeros(x.size, np.uint32))
    torch = needs.package("torch")
    expected = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(bf16.to_float32(bits)[~nan], expected[~nan])


def test_widening_is_exact():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    wide = bf16.to_float32(every)
    assert np.array_equal(wide.view(np.uint32), every.astype(np.uint32) << 16)


def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour():
    x = np.full(200_000, 1.0 + 2.0 ** -10, dtype=np.float32)   # an eighth of the way up an ulp
    down, up = int(bf16.to_bf16(np.float32(1.0))), int(bf16.to_bf16(np.float32(1.0 + 2.0 ** -7)))
    bits = bf16.to_bf16(x, seed=7)
    assert set(np.unique(bits)) == {down, up}
    assert abs((bits == up).mean() - 0.125) < 0.005
    assert abs(bf16.to_float32(bits).astype(np.float64).mean() - (1.0 + 2.0 ** -10)) < 2.0 ** -14
    exact = np.float32(1.5)   # representable: never moved
    assert (bf16.to_bf16(np.full(1000, exact), seed=3) == bf16.to_bf16(exact)).all()


def test_stochastic_rounding_depends_on_index_and_seed_alone():
    x = np.random.default_rng(1).standard_normal(100_003).astype(np.float32)
    whole = bf16.to_bf16(x, seed=11)
    assert np.array_equal(whole, bf16.to_bf16(x, seed=11))
    assert not np.array_equal(whole, bf16.to_bf16(x, seed=12))
    # a slice rounded on its own, told where it starts, rounds as it did in the whole
    assert np.array_equal(bf16.to_bf16(x[50_000:], seed=11, first=50_000), whole[50_000:])


# --- the bf16 (and fp16) table against the fp32 table ----------------------------------------

def rounded(values, precision):
    """float32 values rounded to nearest at a narrow precision, as float32."""
    if precision == "fp16":
        return fp16.from_fp16(fp16.to_fp16(values))
    return bf16.to_float32(bf16.to_bf16(values))


def stored(values, precision):
    """float32 values as a narrow precision's bits, for a buffer (and back: loaded)."""
    return fp16.to_fp16(values) if precision == "fp16" else bf16.to_bf16(values)


def loaded(buffer, precision):
    if precision == "fp16":
        return buffer.to_numpy(np.float16).astype(np.float32)
    return bf16.to_float32(buffer.to_numpy(np.uint16))


def narrow_values(rng, arg, dims, precision="bf16"):
    """Inputs for an argument as the spec's init says, every value exactly of the precision."""
    data = host_data(arg, dims, rng)
    return rounded(data, precision) if arg.floatx else data


def run_entry(backend, name, inputs, dims):
    """Call one entry of a backend on these host inputs; returns every pointer argument after."""
    entry = BY_NAME[name]
    values = numbers(name, dims)
    buffers = {}
    for a in entry.args:
        if not a.pointer:
            continue
        data = inputs[a.name]
        if a.floatx and backend.precision != "fp32":
            data = stored(data, backend.precision)
        buffers[a.name] = backend.alloc(data.nbytes)
        buffers[a.name].load(data)
    backend.call(name, *[buffers[a.name] if a.pointer else values[a.name] for a in entry.args])
    out = {}
    for a in entry.args:
        if a.pointer and a.written:
            if a.floatx and backend.precision != "fp32":
                out[a.name] = loaded(buffers[a.name], backend.precision)
            else:
                out[a.name] = buffers[a.name].to_numpy(np.int32 if a.dtype() == "int32" else np.float32)
    return out


def forward_inputs(fp32, name, inputs, dims, precision="bf16"):
    """A backward's init=forward inputs: what the fp32 forward writes, rounded to precision."""
    forward = BY_NAME[name.replace("_backward", "_forward")]
    written = run_entry(fp32, forward.name, {a.name: inputs.get(a.name, np.zeros(
        evaluate(a.elements, numbers(name, dims)), np.float32)) for a in forward.args if a.pointer}, dims)
    for a in BY_NAME[name].args:
        if a.init == "forward":
            value = written[a.name]
            inputs[a.name] = rounded(value, precision) if a.floatx else value


KERNELS = [name for name in ORDER if BY_NAME[name].wrap
           and BY_NAME[name].group not in ("mixed", "no_master")
           and any(a.floatx for a in BY_NAME[name].args)]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", KERNELS)
def test_each_narrow_entry_is_the_fp32_entry_rounded_once(name, precision):
    """On bf16 (fp16) inputs, a bf16 (fp16) entry's outputs are the fp32 entry's rounded to
    nearest: bit for bit where the table runs the fp32 kernel on widened copies (every fp16
    entry), within an ulp at a few elements where it runs code of its own (cpu.OWN_BF16_KERNELS
    among them), and within an ulp of the largest where it rounds inside too
    (cpu.ROUNDED_INSIDE: flash attention's bf16 probabilities)."""
    fp32, half = get_backend("cpu"), get_backend("cpu", precision)
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    dims = SMALL
    values = numbers(name, dims)
    entry = BY_NAME[name]
    inputs = {a.name: narrow_values(rng, a, values, precision) for a in entry.args
              if a.pointer and a.init != "forward"}
    if any(a.init == "forward" for a in entry.args):
        forward_inputs(fp32, name, inputs, dims, precision)
    expected = run_entry(fp32, name, inputs, dims)
    got = run_entry(half, name, inputs, dims)
    for a in entry.args:
        if not (a.pointer and a.written):
            continue
        want = expected[a.name]
        if a.floatx:
            want = rounded(want, precision)
        if a.causal:   # only t2 <= t is written
            T = dims["T"]
            keep = np.tril(np.ones((T, T), bool))
            want, got_a = want.reshape(-1, T, T)[:, keep], got[a.name].reshape(-1, T, T)[:, keep]
        else:
            got_a = got[a.name]
        rounded_inside = precision == "bf16" and name in cpu.ROUNDED_INSIDE
        own_kernel = precision == "bf16" and name in cpu.OWN_BF16_KERNELS
        if (entry.bf16 == "adapter" and not own_kernel) or precision == "fp16":
            # the fp32 kernel on the same values
            assert np.array_equal(got_a, want), (name, a.name, np.abs(got_a - want).max())
            continue
        # its own code (a GEMM, or a kernel compiled for bf16 loads): float32 sums in another
        # order, so float32 outputs within check:'s error model, and a bf16 output an ulp off
        # where the two float32 results straddle a rounding boundary, rarely
        scale = np.abs(want).max()
        if a.floatx:
            assert np.abs(got_a - want).max() <= 2.0 ** -7 * scale, (name, a.name)
            if not rounded_inside:
                assert np.mean(got_a != want) <= 0.02, (name, a.name, np.mean(got_a != want))
        else:
            allowed = tolerance(evaluate(a.reduction, values)) * scale
            assert np.abs(got_a - want).max() <= allowed, (name, a.name)


# --- the bf16 GEMM: both paths ---------------------------------------------------------------

GEMM_CHECK = """
import numpy as np, sys
from kernels import bf16, blas, matmul_bf16
rng = np.random.default_rng(5)
B, T, C, OC = 2, 37, 80, 96
r = lambda *s: bf16.to_bf16(rng.standard_normal(s).astype(np.float32))
inp, w, b, dout = r(B, T, C), r(OC, C), r(OC), r(B, T, OC)
out = np.zeros((B, T, OC), np.uint16)
matmul_bf16.forward(out, inp, w, b)
f = lambda x: bf16.to_float32(x).astype(np.float64)
ref = f(inp) @ f(w).T + f(b)
err = np.abs(f(out) - ref).max() / np.abs(ref).max()
dinp, dw, db = bf16.to_bf16(np.ones((B, T, C), np.float32)), np.ones((OC, C), np.float32), np.ones(OC, np.float32)
matmul_bf16.backward(dinp, dw, db, dout, inp, w)
e_dinp = np.abs(f(dinp) - (1 + f(dout) @ f(w))).max() / np.abs(1 + f(dout) @ f(w)).max()
ref_dw = 1 + f(dout).reshape(-1, OC).T @ f(inp).reshape(-1, C)
e_dw = np.abs(dw - ref_dw).max() / np.abs(ref_dw).max()
e_db = np.abs(db - (1 + f(dout).sum((0, 1)))).max()
print(blas.BF16_LIBRARY, "|", err, e_dinp, e_dw, e_db)
assert err <= 2.0 ** -8 and e_dinp <= 2.0 ** -8, (err, e_dinp)
assert e_dw < 1e-5 and e_db < 1e-4, (e_dw, e_db)   # float32 sums of exact products
"""


@pytest.mark.parametrize("path", ["fp32", "mkl"])
def test_bf16_gemm_on_each_path_against_float64(path):
    """LLMPYX_BF16_GEMM forces the path (in a process of its own: chosen at import): MKL's
    gemm_bf16bf16f32, or float32 GEMMs on widened operands (what a CPU without bf16 hardware
    runs).  Each output is rounded once; the weight gradients stay float32."""
    env = dict(os.environ, LLMPYX_BF16_GEMM=path)
    result = subprocess.run([sys.executable, "-c", GEMM_CHECK], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    if path == "mkl" and "no libmkl_rt was found" in result.stderr:
        pytest.skip("no libmkl_rt here (pip install mkl)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("MKL" if path == "mkl" else "float32 GEMMs"), result.stdout


@pytest.mark.parametrize("C", [5, 64, 771])
@pytest.mark.parametrize("with_bias", [True, False])
def test_bf16_matrix_vector_product_against_float64(C, with_bias):
    """One position (generation's decode step): the bf16 weight read as it is, each output
    summed in float32 and rounded once, so within one rounding of float64's, and mostly equal
    to float64's rounded (C = 5 and 771 have a tail past the running sums' 32 lanes)."""
    from kernels import matmul_bf16
    rng = np.random.default_rng(C)
    OC = 1003   # split unevenly between the threads
    r = lambda *s: bf16.to_bf16(rng.standard_normal(s).astype(np.float32))
    inp, w, b = r(1, 1, C), r(OC, C), r(OC) if with_bias else None
    out = np.zeros((1, 1, OC), np.uint16)
    matmul_bf16.forward(out, inp, w, b)
    f = lambda x: bf16.to_float32(x).astype(np.float64)
    want = f(inp)[0] @ f(w).T + (f(b) if with_bias else 0)
    got = f(out)[0]
    assert np.all(np.abs(got - want) <= 2.0 ** -8 * np.abs(want) + 1e-6 * np.abs(want).max())
    assert np.mean(out[0, 0] == bf16.to_bf16(want[0].astype(np.float32))) >= 0.98


def test_unknown_bf16_gemm_choice_is_one_line():
    env = dict(os.environ, LLMPYX_BF16_GEMM="amx")
    result = subprocess.run([sys.executable, "-c", "import kernels.blas"], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "LLMPYX_BF16_GEMM='amx': expected mkl, fp32 or auto" in result.stderr


# --- check: at bf16 ----------------------------------------------------------------------------

def tiny_gpt2(backend, precision="bf16"):
    config = GPT2Config.from_depth(2, max_seq_len=32, vocab_size=97)
    return GPT2.random(config, seed=3, backend=backend, precision=precision)


def batch(V, B=2, T=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))


def train(model, steps, tokens, decay_2d_only=False):
    losses = []
    for t in range(1, steps + 1):
        model.zero_grad()
        losses.append(model.forward(*tokens))
        model.backward()
        model.update(1e-3, 0.9, 0.95, 1e-8, 0.01, t, decay_2d_only=decay_2d_only)
    return losses


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_check_cpu_at_a_narrow_precision_is_clean_and_catches_a_truncating_store(precision, capfd):
    model = tiny_gpt2("check:cpu", precision)
    train(model, 2, batch(97))
    assert model.backend.report()["mismatches"] == 0, model.backend.summary()
    from accel import instrument
    faulty = instrument.create("check", faulty_cpu(f"{precision}_gelu_forward"))
    model = tiny_gpt2(faulty, precision)
    train(model, 1, batch(97))
    report = faulty.report()
    assert report["first"]["entry"] == "gelu_forward", faulty.summary()
    assert f"gelu_forward's {precision} output is rounded with a bias" in capfd.readouterr().err


# --- the models --------------------------------------------------------------------------------

def test_gpt2_at_bf16_tracks_fp32_and_keeps_master_weights():
    tokens = batch(97)
    fp32, half = tiny_gpt2("cpu", "fp32"), tiny_gpt2("cpu", "bf16")
    assert half.precision == "bf16" and half.itemsize == 2
    losses32, losses16 = train(fp32, 5, tokens), train(half, 5, tokens)
    assert np.allclose(losses16, losses32, atol=0.02), (losses16, losses32)
    # the master weights moved by AdamW; the kernels' parameters are them in bf16
    master, run = half.params, half.params_as_run()
    assert master.dtype == np.float32 and not np.array_equal(master, run)
    assert np.all(np.abs(run - master) <= np.abs(master) * 2.0 ** -7)   # within an ulp
    assert np.array_equal(bf16.to_bf16(run), bf16.to_bf16(run))   # run is exactly bf16
    assert np.array_equal(run.view(np.uint32) & 0xFFFF, np.zeros(run.size, np.uint32))
    # parameter gradients stay float32: not all of them bf16 values
    assert np.any(half.grads.view(np.uint32) & 0xFFFF)
    memory32, memory16 = fp32.memory(), half.memory()
    assert memory16["activations"] < 0.7 * memory32["activations"]
    assert memory16["params"] == 1.5 * memory32["params"]   # bf16 copy and float32 master


def test_bf16_runs_are_deterministic_and_round_params_redoes_the_update():
    tokens = batch(97)
    a, b = tiny_gpt2("cpu"), tiny_gpt2("cpu")
    assert train(a, 3, tokens) == train(b, 3, tokens)
    assert np.array_equal(a.params_as_run(), b.params_as_run())
    before = a.params_as_run()
    a.round_params(a.step)        # the update's own rounding, redone for every parameter
    assert np.array_equal(a.params_as_run(), before)
    a.round_params(a.step + 1)    # another seed: other draws
    assert not np.array_equal(a.params_as_run(), before)


@pytest.mark.parametrize("precision, atol", [("bf16", 0.02), ("fp16", 2e-3)])
def test_llama_at_a_narrow_precision_tracks_fp32(precision, atol):
    config = dataclasses.replace(train_llama2.PRESETS["stories15M"], dim=64, hidden_dim=160,
                                 n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=101,
                                 max_seq_len=32, shared_classifier=False)
    tokens = batch(101)
    losses = [train(Llama2.random(config, seed=2, precision=p), 5, tokens)
              for p in ("fp32", precision)]
    assert np.allclose(losses[1], losses[0], atol=atol), losses


def test_a_backend_without_bf16_kernels_is_refused_in_one_line():
    with pytest.raises(BackendError, match="unknown precision 'fp8'"):
        get_backend("cpu", "fp8")
    with pytest.raises(BackendError, match="runs at bf16, not fp32"):
        GPT2(GPT2Config.from_depth(1, max_seq_len=8, vocab_size=16),
             backend=get_backend("cpu", "bf16"), precision="fp32")


MODEL_ON_PATH = """
import numpy as np
from kernels import blas
from train_gpt2 import GPT2, GPT2Config
config = GPT2Config.from_depth(2, max_seq_len=32, vocab_size=97)
model = GPT2.random(config, seed=3, precision="bf16")
rng = np.random.default_rng(0)
tokens = rng.integers(0, 97, (2, 16)), rng.integers(0, 97, (2, 16))
losses = []
for t in range(1, 4):
    model.zero_grad()
    losses.append(model.forward(*tokens))
    model.backward()
    model.update(1e-3, 0.9, 0.95, 1e-8, 0.01, t)
print(blas.HARDWARE_BF16, *losses)
"""


def test_a_bf16_model_trains_alike_on_both_gemm_paths():
    """The fallback (float32 GEMMs on widened bf16, what a CPU without bf16 hardware runs) and
    the hardware path differ only in the order of float32 sums: the same losses to bf16's
    precision."""
    runs = {}
    for path in ("fp32", "auto"):
        env = dict(os.environ, LLMPYX_BF16_GEMM=path)
        result = subprocess.run([sys.executable, "-c", MODEL_ON_PATH], cwd=ROOT, env=env,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        hardware, *losses = result.stdout.split()
        runs[path] = (hardware, np.array(losses, dtype=float))
    assert runs["fp32"][0] == "False"
    assert np.allclose(runs["fp32"][1], runs["auto"][1], atol=5e-3), runs
