# kernels.swiglu: out = silu(a) * b, forward and backward against float64 NumPy references
# and PyTorch autograd.
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import needs
from kernels import swiglu


# ----------------------------------------------------------------------------
# float64 references

def swiglu_forward_ref(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return a / (1.0 + np.exp(-a)) * b


def swiglu_backward_ref(dout, a, b):
    """(da, db) of silu(a) * b, in float64."""
    a, b, dout = a.astype(np.float64), b.astype(np.float64), dout.astype(np.float64)
    s = 1.0 / (1.0 + np.exp(-a))
    return dout * b * s * (1.0 + a * (1.0 - s)), dout * a * s


# ----------------------------------------------------------------------------

# odd sizes, one element, and more than one 16384-float chunk (threads split the chunks)
SIZES = [1, 37, 3 * 7 * 771, 2 * 16384 + 5, (1 << 20) + 5]  # the last threaded (SERIAL_BELOW)


def make_inputs(rng, N):
    # wide enough that both tails of the sigmoid are exercised
    a = (4.0 * rng.standard_normal(N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    return a, b


@pytest.mark.parametrize("N", SIZES)
def test_forward_matches_numpy(N):
    a, b = make_inputs(np.random.default_rng(N), N)
    out = np.full(N, np.nan, dtype=np.float32)
    swiglu.forward(out, a, b)
    np.testing.assert_allclose(out, swiglu_forward_ref(a, b), rtol=1e-5, atol=1e-6)


def test_forward_extremes():
    # silu(-100) ~ -4e-42 (0 in float), silu(100) = 100; no inf, no nan
    a = np.array([-100.0, -30.0, 0.0, 30.0, 100.0], dtype=np.float32)
    b = np.ones(5, dtype=np.float32)
    out = np.empty(5, dtype=np.float32)
    swiglu.forward(out, a, b)
    np.testing.assert_allclose(out, swiglu_forward_ref(a, b), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("num_threads", [1, 3])
@pytest.mark.parametrize("N", SIZES)
def test_backward_adds_and_matches_numpy_and_torch(N, num_threads):
    rng = np.random.default_rng(N + 1)
    a, b = make_inputs(rng, N)
    dout = rng.standard_normal(N).astype(np.float32)
    da_start = rng.standard_normal(N).astype(np.float32)
    db_start = rng.standard_normal(N).astype(np.float32)
    da, db = da_start.copy(), db_start.copy()
    with threadpool_limits(limits=num_threads, user_api="openmp"):
        swiglu.backward(da, db, dout, a, b)
    da_ref, db_ref = swiglu_backward_ref(dout, a, b)
    np.testing.assert_allclose(da, da_start + da_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, db_start + db_ref, rtol=1e-5, atol=1e-5)

    torch = needs.package("torch")
    ta = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    tb = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    (torch.nn.functional.silu(ta) * tb).backward(torch.tensor(dout, dtype=torch.float64))
    np.testing.assert_allclose(da_ref, ta.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(db_ref, tb.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["out", "b"])
def test_forward_size_mismatch_raises(name):
    args = dict(out=np.zeros(8, np.float32), a=np.zeros(8, np.float32), b=np.zeros(8, np.float32))
    args[name] = np.zeros(7, np.float32)
    with pytest.raises(ValueError, match="elements"):
        swiglu.forward(**args)


@pytest.mark.parametrize("name", ["da", "db", "dout", "b"])
def test_backward_size_mismatch_raises(name):
    args = {n: np.zeros(8, np.float32) for n in ("da", "db", "dout", "a", "b")}
    args[name] = np.zeros(9, np.float32)
    with pytest.raises(ValueError, match=name):
        swiglu.backward(**args)
