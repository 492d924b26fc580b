# kernels.encoder: token + position embedding, forward and backward (scatter-add into wte, wpe),
# against the float64 reference (kernels/reference.py).
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from kernels import encoder
from kernels import reference as R

Vp, MAX_T = 64, 9
SHAPES = [(3, 5, 37), (2, 1, 24), (1, 7, 130)]  # (B, T, C): odd B*T, C not a power of two, T=1


def make_weights(rng, C):
    wte = rng.standard_normal((Vp, C), dtype=np.float32)
    wpe = rng.standard_normal((MAX_T, C), dtype=np.float32)
    return wte, wpe


@pytest.mark.parametrize("B,T,C", SHAPES)
def test_forward(B, T, C):
    rng = np.random.default_rng(0)
    wte, wpe = make_weights(rng, C)
    inp = rng.integers(0, Vp, size=(B, T), dtype=np.int32)
    out = np.full((B, T, C), np.nan, dtype=np.float32)
    encoder.forward(out, inp, wte, wpe)
    np.testing.assert_allclose(out, R.encoder_forward(inp, wte, wpe), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("num_threads", [1, 3])
@pytest.mark.parametrize("B,T,C", SHAPES)
def test_backward_adds_and_handles_repeated_ids(B, T, C, num_threads):
    rng = np.random.default_rng(1)
    # ids from a few rows only, so many positions scatter into the same row of dwte
    inp = rng.integers(3, 7, size=(B, T), dtype=np.int32)
    inp[0, 0] = Vp - 1  # the last row too
    dout = rng.standard_normal((B, T, C), dtype=np.float32)
    dwte_start, dwpe_start = make_weights(rng, C)
    dwte, dwpe = dwte_start.copy(), dwpe_start.copy()
    with threadpool_limits(limits=num_threads, user_api="openmp"):
        encoder.backward(dwte, dwpe, dout, inp)

    dwte_ref, dwpe_ref = R.encoder_backward(dwte_start, dwpe_start, dout, inp)
    np.testing.assert_allclose(dwte, dwte_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dwpe, dwpe_ref, rtol=1e-5, atol=1e-5)
    # rows nobody read are untouched, bit for bit
    unused = np.setdiff1d(np.arange(Vp), inp)
    np.testing.assert_array_equal(dwte[unused], dwte_start[unused])
    np.testing.assert_array_equal(dwpe[T:], dwpe_start[T:])


def valid_args(B=3, T=5, C=37):
    rng = np.random.default_rng(2)
    wte, wpe = make_weights(rng, C)
    inp = rng.integers(0, Vp, size=(B, T), dtype=np.int32)
    out = np.zeros((B, T, C), dtype=np.float32)
    return out, inp, wte, wpe


@pytest.mark.parametrize("case", ["out_C", "out_B", "out_T", "wpe_C", "T_too_long"])
def test_shape_mismatch_raises(case):
    out, inp, wte, wpe = valid_args()
    if case == "out_C":
        out = np.zeros((3, 5, 36), dtype=np.float32)
    elif case == "out_B":
        out = np.zeros((2, 5, 37), dtype=np.float32)
    elif case == "out_T":
        out = np.zeros((3, 4, 37), dtype=np.float32)
    elif case == "wpe_C":
        wpe = np.zeros((MAX_T, 38), dtype=np.float32)
    elif case == "T_too_long":
        inp = np.zeros((3, MAX_T + 1), dtype=np.int32)
        out = np.zeros((3, MAX_T + 1, 37), dtype=np.float32)
    with pytest.raises(ValueError):
        encoder.forward(out, inp, wte, wpe)
    # the same arguments as gradients: (dwte, dwpe, dout, inp)
    with pytest.raises(ValueError):
        encoder.backward(wte.copy(), wpe.copy(), out, inp)


@pytest.mark.parametrize("bad_id", [-1, Vp, 2**31 - 1])
def test_out_of_range_token_raises(bad_id):
    out, inp, wte, wpe = valid_args()
    inp[2, 3] = bad_id
    with pytest.raises(ValueError, match=r"inp\[2, 3\]"):
        encoder.forward(out, inp, wte, wpe)
    dwte, dwpe = wte.copy(), wpe.copy()
    with pytest.raises(ValueError, match=r"inp\[2, 3\]"):
        encoder.backward(dwte, dwpe, out, inp)
    np.testing.assert_array_equal(dwte, wte)  # nothing written before the check


def test_wrong_dtype_raises():
    out, inp, wte, wpe = valid_args()
    with pytest.raises(ValueError):
        encoder.forward(out, inp.astype(np.int64), wte, wpe)
