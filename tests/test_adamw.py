# kernels.adamw: update and norm_squared against the float64 reference (kernels/reference.py),
# and the reference's update against torch.optim.AdamW (float64).
import numpy as np
import pytest

import needs
from kernels import adamw
from kernels import reference as R

# the kernel takes float32 hyperparameters: hand the references the same rounded values, or
# 1 - beta2 alone differs by 2e-5 relative (1 - 0.999f = 0.00100002)
LR, BETA1, BETA2, EPS = (float(np.float32(x)) for x in (1e-3, 0.9, 0.999, 1e-8))


def assert_moment_close(m, m_expected, m_prev, g):
    # m = beta1 m_prev + (1 - beta1) g can cancel: measure the error against the terms' size
    terms = BETA1 * np.abs(m_prev) + (1 - BETA1) * np.abs(g)
    assert np.all(np.abs(m - m_expected) <= 1e-6 * terms), np.abs(m - m_expected).max()


def make_grads(rng, n, steps):
    grads = rng.standard_normal((steps, n)).astype(np.float32)
    grads[:, : n // 4] *= 1e-8  # gradients near eps: catches eps in the wrong place
    return grads


@pytest.mark.parametrize("n", [1, 1003])
@pytest.mark.parametrize("grad_scale", [1.0, 0.5])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_update(n, grad_scale, weight_decay):
    # three steps from nonzero moments, each checked from the kernel's state before it
    rng = np.random.default_rng(n)
    params = (0.5 * rng.standard_normal(n)).astype(np.float32)  # float32 rounding << 1e-3 lr
    m = (0.1 * rng.standard_normal(n)).astype(np.float32)
    v = (0.01 * rng.random(n)).astype(np.float32)
    grads = make_grads(rng, n, steps=3)
    wd = float(np.float32(weight_decay))
    for t in (1, 2, 3):
        params0, m_prev = params.copy(), m.astype(np.float64)
        p_ref, m_ref, v_ref = R.adamw_update(params, m, v, grads[t - 1], LR, BETA1, BETA2, EPS, wd,
                                             grad_scale, t)
        adamw.update(params, m, v, grads[t - 1], LR, BETA1, BETA2, EPS, weight_decay, grad_scale, t)
        assert_moment_close(m, m_ref, m_prev, grads[t - 1] * grad_scale)
        np.testing.assert_allclose(v, v_ref, rtol=1e-6, atol=0)
        # a step moves params by ~lr; compare the moves to 0.1% of lr
        moved = params.astype(np.float64) - params0
        np.testing.assert_allclose(moved, p_ref - params0, rtol=0, atol=1e-3 * LR)


@pytest.mark.parametrize("grad_scale", [1.0, 0.5])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_reference_against_torch(grad_scale, weight_decay):
    torch = needs.package("torch")
    rng = np.random.default_rng(3)
    n = 1003
    params = rng.standard_normal(n)
    grads = make_grads(rng, n, steps=3).astype(np.float64)
    p = torch.tensor(params, requires_grad=True)
    opt = torch.optim.AdamW([p], lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=weight_decay)
    m, v = np.zeros(n), np.zeros(n)
    for t in (1, 2, 3):
        p.grad = torch.tensor(grads[t - 1] * grad_scale)  # the reference scales first
        opt.step()
        params, m, v = R.adamw_update(params, m, v, grads[t - 1], LR, BETA1, BETA2, EPS, weight_decay,
                                      grad_scale, t)
        np.testing.assert_allclose(m, opt.state[p]["exp_avg"].numpy(), rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(v, opt.state[p]["exp_avg_sq"].numpy(), rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(params, p.detach().numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("n", [0, 1, 7, 100_003])
def test_global_norm_squared(n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 3
    expected = R.global_norm_squared(x)
    # accumulated in double: far tighter than a float sum could get
    assert adamw.norm_squared(x) == pytest.approx(expected, rel=1e-12, abs=0)


def test_bad_arguments_raise():
    z = lambda n: np.zeros(n, dtype=np.float32)  # noqa: E731
    for bad in range(3):
        bufs = [z(5), z(5), z(5)]
        bufs[bad] = z(6)
        with pytest.raises(ValueError, match=("m has", "v has", "grads has")[bad]):
            adamw.update(z(5), *bufs, LR, BETA1, BETA2, EPS, 0.0, 1.0, 1)
    with pytest.raises(ValueError, match="t=0"):
        adamw.update(z(5), z(5), z(5), z(5), LR, BETA1, BETA2, EPS, 0.0, 1.0, 0)
