# kernels.layernorm against the float64 reference (kernels/reference.py), and the reference's
# backward against PyTorch autograd.
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import needs
from kernels import layernorm
from kernels import reference as R

EPS = R.LAYERNORM_EPS
SHAPES = [(3, 5, 37), (2, 1, 24), (1, 7, 200)]  # (B, T, C): odd B*T, C not a power of two, T=1


def make_inputs(rng, B, T, C):
    # a mean far from 0 and a spread far from 1, so skipping either shows
    inp = (2.0 + 3.0 * rng.standard_normal((B, T, C))).astype(np.float32)
    weight = rng.standard_normal(C, dtype=np.float32)
    bias = rng.standard_normal(C, dtype=np.float32)
    return inp, weight, bias


def run_forward(inp, weight, bias):
    B, T, C = inp.shape
    out = np.full((B, T, C), np.nan, dtype=np.float32)
    mean = np.full((B, T), np.nan, dtype=np.float32)
    rstd = np.full((B, T), np.nan, dtype=np.float32)
    layernorm.forward(out, mean, rstd, inp, weight, bias)
    return out, mean, rstd


@pytest.mark.parametrize("B,T,C", SHAPES)
def test_forward(B, T, C):
    inp, weight, bias = make_inputs(np.random.default_rng(0), B, T, C)
    out, mean, rstd = run_forward(inp, weight, bias)
    out_ref, mean_ref, rstd_ref = R.layernorm_forward(inp, weight, bias)
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd, rstd_ref, rtol=1e-5)
    np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-5)


def test_forward_eps():
    # a constant row has variance 0: rstd is exactly 1/sqrt(eps), and out is the bias
    inp = np.full((1, 1, 24), 7.0, dtype=np.float32)
    weight = np.ones(24, dtype=np.float32)
    bias = np.arange(24, dtype=np.float32)
    out, mean, rstd = run_forward(inp, weight, bias)
    np.testing.assert_allclose(rstd, 1.0 / np.sqrt(EPS), rtol=1e-6)
    np.testing.assert_allclose(out[0, 0], bias, atol=1e-6)


def backward_case(B, T, C):
    """inp, weight, bias, dout, and gradient buffers that start nonzero (backward adds)."""
    rng = np.random.default_rng(1)
    inp, weight, bias = make_inputs(rng, B, T, C)
    dout = rng.standard_normal((B, T, C), dtype=np.float32)
    starts = (rng.standard_normal((B, T, C), dtype=np.float32), rng.standard_normal(C, dtype=np.float32),
              rng.standard_normal(C, dtype=np.float32))
    return inp, weight, bias, dout, starts


@pytest.mark.parametrize("num_threads", [1, 3])
@pytest.mark.parametrize("B,T,C", SHAPES)
def test_backward(B, T, C, num_threads):
    inp, weight, bias, dout, starts = backward_case(B, T, C)
    _, mean, rstd = run_forward(inp, weight, bias)
    grads = [g.copy() for g in starts]
    with threadpool_limits(limits=num_threads, user_api="openmp"):
        layernorm.backward(*grads, dout, inp, weight, mean, rstd)
    expected = R.layernorm_backward(*starts, dout, inp, weight, mean, rstd)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("B,T,C", SHAPES)
def test_reference_against_torch(B, T, C):
    torch = needs.package("torch")
    inp, weight, bias, dout, starts = backward_case(B, T, C)
    out, mean, rstd = R.layernorm_forward(inp, weight, bias)
    x = torch.tensor(inp, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(weight, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    out_t = torch.nn.functional.layer_norm(x, (C,), w, b, eps=EPS)
    out_t.backward(torch.tensor(dout, dtype=torch.float64))
    np.testing.assert_allclose(out, out_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    expected = R.layernorm_backward(*starts, dout, inp, weight, mean, rstd)
    for want, start, grad in zip(expected, starts, (x.grad, w.grad, b.grad)):
        np.testing.assert_allclose(want, start + grad.numpy(), rtol=1e-10, atol=1e-12)


def valid_forward_args(B=3, T=5, C=37):
    inp, weight, bias = make_inputs(np.random.default_rng(2), B, T, C)
    out = np.zeros((B, T, C), dtype=np.float32)
    mean = np.zeros((B, T), dtype=np.float32)
    rstd = np.zeros((B, T), dtype=np.float32)
    return dict(out=out, mean=mean, rstd=rstd, inp=inp, weight=weight, bias=bias)


@pytest.mark.parametrize("name,shape", [("out", (3, 5, 36)), ("out", (3, 4, 37)),
                                        ("mean", (3, 4)), ("rstd", (2, 5)),
                                        ("weight", (36,)), ("bias", (38,))])
def test_forward_shape_mismatch_raises(name, shape):
    args = valid_forward_args()
    args[name] = np.zeros(shape, dtype=np.float32)
    with pytest.raises(ValueError, match=name):
        layernorm.forward(**args)


@pytest.mark.parametrize("name,shape", [("dinp", (3, 5, 36)), ("dweight", (36,)),
                                        ("dbias", (38,)), ("dout", (3, 4, 37)),
                                        ("weight", (38,)), ("mean", (5, 3)), ("rstd", (3, 6))])
def test_backward_shape_mismatch_raises(name, shape):
    f = valid_forward_args()
    args = dict(dinp=np.zeros_like(f["inp"]), dweight=np.zeros(37, np.float32),
                dbias=np.zeros(37, np.float32), dout=np.ones_like(f["inp"]), inp=f["inp"],
                weight=f["weight"], mean=f["mean"], rstd=f["rstd"])
    args[name] = np.zeros(shape, dtype=np.float32)
    with pytest.raises(ValueError, match=name):
        layernorm.backward(**args)
