# kernels.matmul: forward against NumPy in float64, backward against PyTorch autograd in float64.
import numpy as np
import pytest

from kernels import matmul

# B*T not a multiple of 8, T=1, odd OC, C not a power of two, OC spanning several dbias blocks
SIZES = [(3, 5, 36, 17), (1, 1, 20, 7), (2, 4, 24, 130), (2, 8, 64, 96)]


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def f64(x):
    return x.astype(np.float64)


@pytest.mark.parametrize("B,T,C,OC", SIZES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_forward(B, T, C, OC, with_bias):
    rng = np.random.default_rng(B * 1000 + C)
    inp, weight = randn(rng, B, T, C), randn(rng, OC, C)
    bias = randn(rng, OC) if with_bias else None
    out = np.full((B, T, OC), np.nan, dtype=np.float32)  # every entry must be written
    matmul.forward(out, inp, weight, bias)
    expected = f64(inp) @ f64(weight).T + (f64(bias) if with_bias else 0.0)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("B,T,C,OC", SIZES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_backward_matches_torch_and_accumulates(B, T, C, OC, with_bias):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(B * 1000 + OC)
    inp, weight, dout = randn(rng, B, T, C), randn(rng, OC, C), randn(rng, B, T, OC)
    x = torch.tensor(f64(inp), requires_grad=True)
    w = torch.tensor(f64(weight), requires_grad=True)
    b = torch.zeros(OC, dtype=torch.float64, requires_grad=True)
    (x @ w.T + b).backward(torch.tensor(f64(dout)))

    # gradient buffers start nonzero: the kernel must add to them
    dinp0, dweight0, dbias0 = randn(rng, B, T, C), randn(rng, OC, C), randn(rng, OC)
    dinp, dweight, dbias = dinp0.copy(), dweight0.copy(), dbias0.copy()
    matmul.backward(dinp, dweight, dbias if with_bias else None, dout, inp, weight)

    np.testing.assert_allclose(dinp, dinp0 + x.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dweight, dweight0 + w.grad.numpy(), rtol=1e-5, atol=1e-5)
    if with_bias:
        np.testing.assert_allclose(dbias, dbias0 + b.grad.numpy(), rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(dbias, dbias0)


def test_backward_without_torch_numpy_reference():
    # the same check with a NumPy reference, so it runs where torch is absent
    rng = np.random.default_rng(7)
    B, T, C, OC = 3, 5, 20, 67
    inp, weight, dout = randn(rng, B, T, C), randn(rng, OC, C), randn(rng, B, T, OC)
    dinp, dweight, dbias = randn(rng, B, T, C), randn(rng, OC, C), randn(rng, OC)
    expected_dinp = f64(dinp) + f64(dout) @ f64(weight)
    expected_dweight = f64(dweight) + f64(dout).reshape(-1, OC).T @ f64(inp).reshape(-1, C)
    expected_dbias = f64(dbias) + f64(dout).sum(axis=(0, 1))
    matmul.backward(dinp, dweight, dbias, dout, inp, weight)
    np.testing.assert_allclose(dinp, expected_dinp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dweight, expected_dweight, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dbias, expected_dbias, rtol=1e-5, atol=1e-5)


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
