# kernels.gelu: tanh-approximation GELU against the float64 reference (kernels/reference.py),
# and the reference's backward against PyTorch autograd (gelu(approximate="tanh")).
import numpy as np
import pytest

import needs
from kernels import gelu
from kernels import reference as R

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


@pytest.mark.parametrize("N", SIZES)
def test_forward(N):
    x = make_input(np.random.default_rng(0), N)
    out = np.full(N, np.nan, dtype=np.float32)
    gelu.forward(out, x)
    np.testing.assert_allclose(out, R.gelu_forward(x), rtol=1e-5, atol=1e-6)


def backward_case(N):
    rng = np.random.default_rng(1)
    x = make_input(rng, N)
    return x, rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)


@pytest.mark.parametrize("N", SIZES)
def test_backward(N):
    x, dout, dinp_start = backward_case(N)
    dinp = dinp_start.copy()
    gelu.backward(dinp, x, dout)
    # atol: in the far tails gelu' is ~1e-6 and float32's 1 - tanh^2 loses its digits (as
    # PyTorch's float32 kernel does); a wrong term or constant is off by > 1e-3
    np.testing.assert_allclose(dinp, R.gelu_backward(dinp_start, x, dout), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("N", SIZES)
def test_reference_against_torch(N):
    torch = needs.package("torch")
    x, dout, dinp_start = backward_case(N)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    out = torch.nn.functional.gelu(xt, approximate="tanh")
    out.backward(torch.tensor(dout, dtype=torch.float64))
    np.testing.assert_allclose(R.gelu_forward(x), out.detach().numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(R.gelu_backward(dinp_start, x, dout), dinp_start + xt.grad.numpy(),
                               rtol=1e-12, atol=1e-12)


def test_size_mismatch_raises():
    a = np.zeros(555, dtype=np.float32)
    b = np.zeros(554, dtype=np.float32)
    with pytest.raises(ValueError, match="out"):
        gelu.forward(b, a)
    with pytest.raises(ValueError, match="dinp"):
        gelu.backward(b, a, a.copy())
    with pytest.raises(ValueError, match="dout"):
        gelu.backward(a, a.copy(), b)
