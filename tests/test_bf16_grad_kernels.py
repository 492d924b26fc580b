# bf16 parameter gradients in the CPU kernels (llm.c's choice): each call sums its whole
# contribution to each gradient element in float32 and adds it in once, rounded to nearest once.
# Each kernel, from a nonzero bf16 gradient, against a float64 reference of old gradient plus
# contribution, with float32 and with bf16 activations (the same values, so one reference); the
# optimizer's reads of bf16 gradients against the same gradients as float32, bit for bit.  The
# float32 gradients' paths are tests/test_embedding.py's, test_encoder.py's, ... unchanged.
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from kernels import adamw, bf16, embedding, encoder, layernorm, matmul_bf16, rmsnorm
from kernels import reference as R

ACTIVATIONS = ["float32", "bf16"]


def bf16_values(rng, *shape, scale=1.0):
    """bf16 bits of normal values: the inputs of both activation types and of the reference."""
    return bf16.to_bf16(scale * rng.standard_normal(shape))


def activation(bits, kind):
    """bf16 values as the kernel takes them: float32 (exact) or the bits themselves."""
    return bf16.to_float32(bits) if kind == "float32" else bits.copy()


def f64(bits):
    return bf16.to_float32(bits).astype(np.float64)


def assert_rounded_once(got, ref, magnitude, terms):
    """got (bf16 bits) is ref (float64: old gradient + contribution) rounded once: within half
    a bf16 ulp of it (at most 2^-8 |ref|) plus float32's error bound on a sum of `terms` terms
    whose magnitudes add up to `magnitude` (old gradient included); and exactly ref rounded to
    nearest almost everywhere (float32's error straddles a rounding boundary rarely).  A sum
    rounded at each position it adds is several roundings off, and seldom the nearest."""
    error = np.abs(f64(got) - ref)
    bound = 2.0 ** -8 * np.abs(ref) + 2 * terms * 2.0 ** -24 * magnitude
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert np.all(error <= bound), \
        f"at {worst}: |got - ref| = {error[worst]:.3g} > {bound[worst]:.3g} (ref {ref[worst]:.6g})"
    nearest = np.mean(got == bf16.to_bf16(ref))
    assert nearest >= 0.99, f"only {nearest:.1%} of the elements are ref rounded to nearest"


# --- embedding and encoder: many positions of few token ids ---------------------------------

# the last shape above kernels.parallel's SERIAL_BELOW: threaded
EMBEDDING_SHAPES = [(4, 64, 768, 5), (2, 128, 100, 5), (4, 256, 1024, 5)]   # (B, T, C, Vp)


def scattered(dwte_bits, dout_bits, inp):
    """(old dwte + dout scattered to the rows inp read, the sum of the terms' magnitudes, the
    most terms an element adds), float64."""
    C = dwte_bits.shape[1]
    ref, magnitude = f64(dwte_bits), np.abs(f64(dwte_bits))
    np.add.at(ref, inp.reshape(-1), f64(dout_bits).reshape(-1, C))
    np.add.at(magnitude, inp.reshape(-1), np.abs(f64(dout_bits)).reshape(-1, C))
    return ref, magnitude, np.bincount(inp.reshape(-1)).max()


@pytest.mark.parametrize("kind", ACTIVATIONS)
@pytest.mark.parametrize("B,T,C,Vp", EMBEDDING_SHAPES)
def test_embedding_backward_rounds_each_row_once_whatever_the_threads(B, T, C, Vp, kind):
    rng = np.random.default_rng(B * T + C)
    inp = rng.integers(0, Vp, (B, T)).astype(np.int32)
    dout = bf16_values(rng, B, T, C)
    dwte0 = bf16_values(rng, Vp, C, scale=4.0)
    results = []
    for num_threads in (1, 2):
        dwte = dwte0.copy()
        with threadpool_limits(limits=num_threads, user_api="openmp"):
            embedding.backward_bf16_grads(dwte, activation(dout, kind), inp)
        results.append(dwte)
    np.testing.assert_array_equal(results[0], results[1])
    assert_rounded_once(results[0], *scattered(dwte0, dout, inp))


@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_encoder_backward_rounds_each_element_once(kind):
    B, T, C, Vp, max_T = 32, 8, 768, 5, 10
    rng = np.random.default_rng(2)
    inp = rng.integers(0, Vp, (B, T)).astype(np.int32)
    dout = bf16_values(rng, B, T, C)
    dwte0, dwpe0 = bf16_values(rng, Vp, C, scale=4.0), bf16_values(rng, max_T, C)
    dwte, dwpe = dwte0.copy(), dwpe0.copy()
    encoder.backward_bf16_grads(dwte, dwpe, activation(dout, kind), inp)
    assert_rounded_once(dwte, *scattered(dwte0, dout, inp))
    _, dwpe_ref = R.encoder_backward(f64(dwte0), f64(dwpe0), f64(dout), inp)
    magnitude = np.abs(f64(dwpe0))
    magnitude[:T] += np.abs(f64(dout)).sum(0)
    assert_rounded_once(dwpe, dwpe_ref, magnitude, B)


# --- layernorm, rmsnorm: sums over the positions --------------------------------------------

# with one thread the kernels sum a chunk of channels at a time; with two, per-thread rows.
# rmsnorm's threads start at kernels.parallel's SERIAL_BELOW elements: its last shape.
NORM_SHAPES = [(4, 64, 768), (3, 100, 100), (4, 256, 1024)]   # (B, T, C)


def norm_inputs(rng, B, T, C):
    """inp (2 + 3 N(0,1): a mean and a spread to get right), weight, dout, dinp as bf16 bits."""
    inp = bf16.to_bf16(2.0 + 3.0 * rng.standard_normal((B, T, C)))
    return inp, bf16_values(rng, C), bf16_values(rng, B, T, C), bf16_values(rng, B, T, C)


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("kind", ACTIVATIONS)
@pytest.mark.parametrize("B,T,C", NORM_SHAPES)
def test_layernorm_backward_rounds_each_element_once(B, T, C, kind, num_threads):
    rng = np.random.default_rng(C)
    inp, weight, dout, dinp0 = norm_inputs(rng, B, T, C)
    bias = bf16_values(rng, C)
    mean, rstd = np.empty((B, T), np.float32), np.empty((B, T), np.float32)
    layernorm.forward(np.empty((B, T, C), np.float32), mean, rstd, bf16.to_float32(inp),
                      bf16.to_float32(weight), bf16.to_float32(bias))
    dweight0, dbias0 = bf16_values(rng, C, scale=8.0), bf16_values(rng, C, scale=8.0)
    dweight, dbias = dweight0.copy(), dbias0.copy()
    with threadpool_limits(limits=num_threads, user_api="openmp"):
        layernorm.backward_bf16_grads(activation(dinp0, kind), dweight, dbias,
                                      activation(dout, kind), activation(inp, kind),
                                      activation(weight, kind), mean, rstd)
    _, dweight_ref, dbias_ref = R.layernorm_backward(f64(dinp0), f64(dweight0), f64(dbias0),
                                                     f64(dout), f64(inp), f64(weight), mean, rstd)
    norm = (f64(inp) - mean[..., None]) * rstd[..., None]
    positions = (0, 1)
    assert_rounded_once(dweight, dweight_ref,
                        np.abs(f64(dweight0)) + np.abs(f64(dout) * norm).sum(positions), B * T)
    assert_rounded_once(dbias, dbias_ref,
                        np.abs(f64(dbias0)) + np.abs(f64(dout)).sum(positions), B * T)


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("kind", ACTIVATIONS)
@pytest.mark.parametrize("B,T,C", NORM_SHAPES)
def test_rmsnorm_backward_rounds_each_element_once(B, T, C, kind, num_threads):
    rng = np.random.default_rng(C + 1)
    inp, weight, dout, dinp0 = norm_inputs(rng, B, T, C)
    rstd = np.empty((B, T), np.float32)
    rmsnorm.forward(np.empty((B, T, C), np.float32), rstd, bf16.to_float32(inp),
                    bf16.to_float32(weight))
    dweight0 = bf16_values(rng, C, scale=8.0)
    dweight, dinp, dinp_frozen = dweight0.copy(), activation(dinp0, kind), activation(dinp0, kind)
    with threadpool_limits(limits=num_threads, user_api="openmp"):
        rmsnorm.backward_bf16_grads(dinp, dweight, activation(dout, kind), activation(inp, kind),
                                    activation(weight, kind), rstd)
        rmsnorm.backward_bf16_grads(dinp_frozen, None, activation(dout, kind),
                                    activation(inp, kind), activation(weight, kind), rstd)
    np.testing.assert_array_equal(dinp_frozen, dinp)   # a frozen weight: dinp all the same
    terms = f64(dout) * f64(inp) * rstd[..., None]
    assert_rounded_once(dweight, f64(dweight0) + terms.sum((0, 1)),
                        np.abs(f64(dweight0)) + np.abs(terms).sum((0, 1)), B * T)


# --- matmul_bf16: dweight by the GEMM in float32 blocks, dbias over the rows ----------------

@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("B,T,C,OC", [(4, 64, 256, 384), (3, 100, 96, 200)])
def test_matmul_bf16_backward_rounds_each_element_once(B, T, C, OC, with_bias):
    rng = np.random.default_rng(C + OC)
    inp, weight = bf16_values(rng, B, T, C), bf16_values(rng, OC, C)
    dout = bf16_values(rng, B, T, OC)
    dinp0, dweight0, dbias0 = bf16_values(rng, B, T, C), bf16_values(rng, OC, C, scale=8.0), \
        bf16_values(rng, OC, scale=8.0)
    dinp, dweight, dbias = dinp0.copy(), dweight0.copy(), dbias0.copy() if with_bias else None
    matmul_bf16.backward_bf16_grads(dinp, dweight, dbias, dout, inp, weight)
    # dinp as the float32 gradients' backward makes it: that path is tests/test_bf16.py's
    dinp_fp32 = dinp0.copy()
    matmul_bf16.backward(dinp_fp32, f64(dweight0).astype(np.float32), None, dout, inp, weight)
    np.testing.assert_array_equal(dinp, dinp_fp32)
    rows, x = f64(dout).reshape(-1, OC), f64(inp).reshape(-1, C)
    assert_rounded_once(dweight, f64(dweight0) + rows.T @ x,
                        np.abs(f64(dweight0)) + np.abs(rows).T @ np.abs(x), B * T)
    if with_bias:
        assert_rounded_once(dbias, f64(dbias0) + rows.sum(0),
                            np.abs(f64(dbias0)) + np.abs(rows).sum(0), B * T)


# --- adamw: bf16 gradients read widened, exactly ---------------------------------------------

def test_adamw_reads_bf16_gradients_as_their_float32_values():
    n = 10_007
    rng = np.random.default_rng(4)
    grads = bf16_values(rng, n, scale=1e-2)
    params = (0.5 * rng.standard_normal(n)).astype(np.float32)
    m = (0.1 * rng.standard_normal(n)).astype(np.float32)
    v = (0.01 * rng.random(n)).astype(np.float32)
    states = []
    for g in (grads, bf16.to_float32(grads)):
        state = (np.zeros(n, np.uint16), params.copy(), m.copy(), v.copy())
        adamw.update_rounded(*state, g, 1e-3, 0.9, 0.999, 1e-8, 0.1, 0.5, t=3, first=7)
        states.append(state)
    for got, expected in zip(*states):
        np.testing.assert_array_equal(got, expected)
    norm2 = adamw.norm_squared_bf16(grads)
    assert norm2 == pytest.approx(R.global_norm_squared(f64(grads)), rel=1e-12)
    assert norm2 == pytest.approx(adamw.norm_squared(bf16.to_float32(grads)), rel=1e-12)
