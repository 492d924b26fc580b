# kernels.gelu: tanh-approximation GELU, forward against NumPy float64, backward against
# PyTorch autograd (gelu(approximate="tanh")).
import numpy as np
import pytest

from kernels import gelu

# 3*5*4*37 elements; and one size spanning several 16384-float chunks, with a ragged last one
SIZES = [3 * 5 * 4 * 37, 1, 3 * 16384 + 5]
# the tails, where tanh saturates, and 0
SPECIAL = np.array([-20.0, -10.0, -5.0, -3.0, -1e-3, 0.0, 1e-3, 3.0, 5.0, 10.0, 20.0],
                   dtype=np.float32)


def make_input(rng, N):
    x = (2.0 * rng.standard_normal(N)).astype(np.float32)
    k = min(N, SPECIAL.size)
    x[:k] = SPECIAL[:k]
    return x


def gelu_ref(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("N", SIZES)
def test_forward(N):
    x = make_input(np.random.default_rng(0), N)
    out = np.full(N, np.nan, dtype=np.float32)
    gelu.forward(out, x)
    np.testing.assert_allclose(out, gelu_ref(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("N", SIZES)
def test_backward_against_torch(N):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = make_input(rng, N)
    dout = rng.standard_normal(N, dtype=np.float32)
    dinp_start = rng.standard_normal(N, dtype=np.float32)
    dinp = dinp_start.copy()
    gelu.backward(dinp, x, dout)

    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.gelu(xt, approximate="tanh").backward(torch.tensor(dout, dtype=torch.float64))
    # atol: in the far tails gelu' is ~1e-6 and float32's 1 - tanh^2 loses its digits (as
    # PyTorch's float32 kernel does); a wrong term or constant is off by > 1e-3
    np.testing.assert_allclose(dinp, dinp_start + xt.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_size_mismatch_raises():
    a = np.zeros(555, dtype=np.float32)
    b = np.zeros(554, dtype=np.float32)
    with pytest.raises(ValueError, match="out"):
        gelu.forward(b, a)
    with pytest.raises(ValueError, match="dinp"):
        gelu.backward(b, a, a.copy())
    with pytest.raises(ValueError, match="dout"):
        gelu.backward(a, a.copy(), b)
