# kernels.matmul against the float64 reference (kernels/reference.py), and the reference's
# backward against PyTorch autograd in float64.
import numpy as np
import pytest

import needs
from kernels import matmul
from kernels import reference as R
from kernels.reference import f64

# B*T not a multiple of 8, T=1, odd OC, C not a power of two, OC spanning several dbias blocks;
# B*T = 1 (the forward's matrix-vector product, 8 rows a pass) with rows past a multiple of 8
SIZES = [(3, 5, 36, 17), (1, 1, 20, 7), (2, 4, 24, 130), (2, 8, 64, 96), (1, 1, 44, 61)]


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("B,T,C,OC", SIZES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_forward(B, T, C, OC, with_bias):
    rng = np.random.default_rng(B * 1000 + C)
    inp, weight = randn(rng, B, T, C), randn(rng, OC, C)
    bias = randn(rng, OC) if with_bias else None
    out = np.full((B, T, OC), np.nan, dtype=np.float32)  # every entry must be written
    matmul.forward(out, inp, weight, bias)
    np.testing.assert_allclose(out, R.matmul_forward(inp, weight, bias), rtol=1e-5, atol=1e-5)


def backward_case(B, T, C, OC):
    """inp, weight, dout, and gradient buffers that start nonzero (the kernel must add)."""
    rng = np.random.default_rng(B * 1000 + OC)
    return (randn(rng, B, T, C), randn(rng, OC, C), randn(rng, B, T, OC),
            (randn(rng, B, T, C), randn(rng, OC, C), randn(rng, OC)))


@pytest.mark.parametrize("B,T,C,OC", SIZES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_backward_accumulates(B, T, C, OC, with_bias):
    inp, weight, dout, (dinp0, dweight0, dbias0) = backward_case(B, T, C, OC)
    dinp, dweight, dbias = dinp0.copy(), dweight0.copy(), dbias0.copy()
    matmul.backward(dinp, dweight, dbias if with_bias else None, dout, inp, weight)
    expected = R.matmul_backward(dinp0, dweight0, dbias0 if with_bias else None, dout, inp, weight)
    np.testing.assert_allclose(dinp, expected[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dweight, expected[1], rtol=1e-5, atol=1e-5)
    if with_bias:
        np.testing.assert_allclose(dbias, expected[2], rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(dbias, dbias0)


@pytest.mark.parametrize("B,T,C,OC", SIZES)
def test_reference_against_torch(B, T, C, OC):
    torch = needs.package("torch")
    inp, weight, dout, starts = backward_case(B, T, C, OC)
    x = torch.tensor(f64(inp), requires_grad=True)
    w = torch.tensor(f64(weight), requires_grad=True)
    b = torch.tensor(f64(starts[2]), requires_grad=True)
    out = x @ w.T + b
    out.backward(torch.tensor(f64(dout)))
    np.testing.assert_allclose(R.matmul_forward(inp, weight, starts[2]), out.detach().numpy(), rtol=1e-12)
    for want, start, grad in zip(R.matmul_backward(*starts, dout, inp, weight), starts,
                                 (x.grad, w.grad, b.grad)):
        np.testing.assert_allclose(want, start + grad.numpy(), rtol=1e-12, atol=1e-12)


def test_shape_mismatches_raise():
    B, T, C, OC = 2, 3, 8, 5
    z = lambda *s: np.zeros(s, dtype=np.float32)  # noqa: E731
    with pytest.raises(ValueError, match="weight"):
        matmul.forward(z(B, T, OC), z(B, T, C), z(OC, C + 1))
    with pytest.raises(ValueError, match="out"):
        matmul.forward(z(B, T + 1, OC), z(B, T, C), z(OC, C))
    with pytest.raises(ValueError, match="bias"):
        matmul.forward(z(B, T, OC), z(B, T, C), z(OC, C), z(OC + 1))
    with pytest.raises(ValueError, match="dout"):
        matmul.backward(z(B, T, C), z(OC, C), z(OC), z(B, T, OC - 1), z(B, T, C), z(OC, C))
    with pytest.raises(ValueError, match="dinp"):
        matmul.backward(z(B, T, C + 1), z(OC, C), z(OC), z(B, T, OC), z(B, T, C), z(OC, C))
    with pytest.raises(ValueError, match="dweight"):
        matmul.backward(z(B, T, C), z(OC, C - 1), z(OC), z(B, T, OC), z(B, T, C), z(OC, C))
    with pytest.raises(ValueError, match="dbias"):
        matmul.backward(z(B, T, C), z(OC, C), z(2 * OC), z(B, T, OC), z(B, T, C), z(OC, C))


def test_wrong_dtype_or_layout_raises():
    B, T, C, OC = 2, 3, 8, 5
    out, weight = np.zeros((B, T, OC), np.float32), np.zeros((OC, C), np.float32)
    with pytest.raises(ValueError):
        matmul.forward(out, np.zeros((B, T, C), np.float64), weight)
    with pytest.raises(ValueError):
        matmul.forward(out, np.zeros((B, T, 2 * C), np.float32)[:, :, ::2], weight)
