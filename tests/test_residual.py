# kernels.residual: out = inp1 + inp2; backward adds dout to both input gradients.  Against the
# float64 reference (kernels/reference.py): a float32 sum is the correctly rounded float64 sum.
import numpy as np
import pytest

from kernels import reference as R
from kernels import residual

# 3*5*37 elements; and one size spanning several of the kernel's 16384-float chunks, with a
# ragged last chunk
SIZES = [3 * 5 * 37, 1, 3 * 16384 + 5]


@pytest.mark.parametrize("N", SIZES)
def test_forward(N):
    rng = np.random.default_rng(0)
    inp1 = rng.standard_normal(N, dtype=np.float32)
    inp2 = rng.standard_normal(N, dtype=np.float32)
    out = np.full(N, np.nan, dtype=np.float32)
    residual.forward(out, inp1, inp2)
    np.testing.assert_allclose(out, R.residual_forward(inp1, inp2), rtol=1e-7, atol=0)


def test_forward_in_place():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(555, dtype=np.float32)
    y = rng.standard_normal(555, dtype=np.float32)
    expected = R.residual_forward(x, y)
    residual.forward(x, x, y)
    np.testing.assert_allclose(x, expected, rtol=1e-7, atol=0)


@pytest.mark.parametrize("N", SIZES)
def test_backward_adds(N):
    rng = np.random.default_rng(2)
    dout = rng.standard_normal(N, dtype=np.float32)
    dinp1_start = rng.standard_normal(N, dtype=np.float32)
    dinp2_start = rng.standard_normal(N, dtype=np.float32)
    dinp1, dinp2 = dinp1_start.copy(), dinp2_start.copy()
    residual.backward(dinp1, dinp2, dout)
    expected1, expected2 = R.residual_backward(dinp1_start, dinp2_start, dout)
    np.testing.assert_allclose(dinp1, expected1, rtol=1e-7, atol=0)
    np.testing.assert_allclose(dinp2, expected2, rtol=1e-7, atol=0)


def test_size_mismatch_raises():
    a = np.zeros(555, dtype=np.float32)
    b = np.zeros(554, dtype=np.float32)
    with pytest.raises(ValueError, match="inp2"):
        residual.forward(a, a.copy(), b)
    with pytest.raises(ValueError, match="inp1"):
        residual.forward(a, b, a.copy())
    with pytest.raises(ValueError, match="dinp2"):
        residual.backward(a, b, a.copy())
    with pytest.raises(ValueError, match="dinp1"):
        residual.backward(b, a, a.copy())


def test_rejects_non_contiguous_and_read_only():
    a = np.zeros(20, dtype=np.float32)
    with pytest.raises(ValueError):
        residual.forward(a[::2], a[:10], a[:10])
    out = np.zeros(10, dtype=np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError):
        residual.forward(out, a[:10], a[:10])
