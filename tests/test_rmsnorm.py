# kernels.rmsnorm: forward and backward against float64 NumPy references and PyTorch autograd.
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import needs
from kernels import rmsnorm

EPS = 1e-5  # llama2.c's norm_eps


# ----------------------------------------------------------------------------
# float64 references

def rmsnorm_forward_ref(inp, weight, eps=EPS):
    """out (B,T,C), rstd (B,T) of RMSNorm, in float64."""
    x = inp.astype(np.float64)
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1) + eps)
    return x * rstd[..., None] * weight.astype(np.float64), rstd


def rmsnorm_backward_ref(dout, inp, weight, eps=EPS):
    """dinp (B,T,C), dweight (C,) of RMSNorm, in float64."""
    x, dy, w = inp.astype(np.float64), dout.astype(np.float64), weight.astype(np.float64)
    _, rstd = rmsnorm_forward_ref(inp, weight, eps)
    norm = x * rstd[..., None]
    g = w * dy
    dinp = rstd[..., None] * (g - norm * (g * norm).mean(axis=-1, keepdims=True))
    dweight = (norm * dy).reshape(-1, x.shape[-1]).sum(axis=0)
    return dinp, dweight


# ----------------------------------------------------------------------------

SHAPES = [(3, 7, 37), (2, 1, 24), (1, 13, 200)]  # (B, T, C): odd B*T, C not a multiple of 8, T=1
SHAPES.append((3, 7, 49999))  # above kernels.parallel's SERIAL_BELOW: threaded


def make_inputs(rng, B, T, C):
    # a mean far from 0, so a kernel that subtracts the mean (LayerNorm) fails
    inp = (2.0 + 3.0 * rng.standard_normal((B, T, C))).astype(np.float32)
    weight = rng.standard_normal(C).astype(np.float32)
    return inp, weight


def run_forward(inp, weight, eps=EPS):
    B, T, C = inp.shape
    out = np.full((B, T, C), np.nan, dtype=np.float32)
    rstd = np.full((B, T), np.nan, dtype=np.float32)
    rmsnorm.forward(out, rstd, inp, weight, eps)
    return out, rstd


@pytest.mark.parametrize("B,T,C", SHAPES)
def test_forward_matches_numpy(B, T, C):
    inp, weight = make_inputs(np.random.default_rng(0), B, T, C)
    out, rstd = run_forward(inp, weight)
    out_ref, rstd_ref = rmsnorm_forward_ref(inp, weight)
    np.testing.assert_allclose(rstd, rstd_ref, rtol=1e-5)
    np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-5)


def test_forward_eps_is_used():
    # a zero row: rstd is exactly 1/sqrt(eps), whatever eps is passed
    inp = np.zeros((1, 2, 24), dtype=np.float32)
    weight = np.ones(24, dtype=np.float32)
    for eps in (1e-5, 1e-6):
        _, rstd = run_forward(inp, weight, eps)
        np.testing.assert_allclose(rstd, 1.0 / np.sqrt(eps), rtol=1e-6)


@pytest.mark.parametrize("num_threads", [1, 3])
@pytest.mark.parametrize("B,T,C", SHAPES)
def test_backward_adds_and_matches_numpy_and_torch(B, T, C, num_threads):
    rng = np.random.default_rng(1)
    inp, weight = make_inputs(rng, B, T, C)
    dout = rng.standard_normal((B, T, C)).astype(np.float32)
    _, rstd = run_forward(inp, weight)
    # gradient buffers start nonzero: backward must add to them
    dinp_start = rng.standard_normal((B, T, C)).astype(np.float32)
    dweight_start = rng.standard_normal(C).astype(np.float32)
    dinp, dweight = dinp_start.copy(), dweight_start.copy()
    with threadpool_limits(limits=num_threads, user_api="openmp"):
        rmsnorm.backward(dinp, dweight, dout, inp, weight, rstd)

    dinp_ref, dweight_ref = rmsnorm_backward_ref(dout, inp, weight)
    np.testing.assert_allclose(dinp, dinp_start + dinp_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dweight, dweight_start + dweight_ref, rtol=1e-5, atol=1e-4)

    torch = needs.package("torch")
    x = torch.tensor(inp, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(weight, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.rms_norm(x, (C,), w, eps=EPS).backward(torch.tensor(dout, dtype=torch.float64))
    np.testing.assert_allclose(dinp_ref, x.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dweight_ref, w.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_forward_matches_torch():
    torch = needs.package("torch")
    inp, weight = make_inputs(np.random.default_rng(2), 3, 7, 37)
    out, _ = run_forward(inp, weight)
    expected = torch.nn.functional.rms_norm(torch.from_numpy(inp), (37,), torch.from_numpy(weight),
                                            eps=EPS)
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5, atol=1e-5)


def valid_args(B=3, T=5, C=37):
    inp, weight = make_inputs(np.random.default_rng(3), B, T, C)
    return inp, weight, np.zeros((B, T, C), np.float32), np.zeros((B, T), np.float32)


@pytest.mark.parametrize("name,shape", [("out", (3, 5, 36)), ("out", (3, 4, 37)),
                                        ("rstd", (3, 4)), ("weight", (36,))])
def test_forward_shape_mismatch_raises(name, shape):
    inp, weight, out, rstd = valid_args()
    args = dict(out=out, rstd=rstd, inp=inp, weight=weight)
    args[name] = np.zeros(shape, dtype=np.float32)
    with pytest.raises(ValueError, match=name):
        rmsnorm.forward(**args)


@pytest.mark.parametrize("name,shape", [("dinp", (3, 5, 36)), ("dweight", (36,)),
                                        ("dout", (3, 4, 37)), ("weight", (38,)), ("rstd", (3, 6))])
def test_backward_shape_mismatch_raises(name, shape):
    inp, weight, _, rstd = valid_args()
    args = dict(dinp=np.zeros_like(inp), dweight=np.zeros(37, np.float32), dout=np.ones_like(inp),
                inp=inp, weight=weight, rstd=rstd)
    args[name] = np.zeros(shape, dtype=np.float32)
    with pytest.raises(ValueError, match=name):
        rmsnorm.backward(**args)
