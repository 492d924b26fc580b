# kernels.adamw: update against torch.optim.AdamW (float64), norm_squared against NumPy.
import numpy as np
import pytest

from kernels import adamw

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
def test_update_matches_torch(n, grad_scale, weight_decay):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(n)
    params0 = (0.5 * rng.standard_normal(n)).astype(np.float32)  # float32 rounding << 1e-3 lr
    grads = make_grads(rng, n, steps=3)

    p = torch.tensor(params0.astype(np.float64), requires_grad=True)
    opt = torch.optim.AdamW([p], lr=LR, betas=(BETA1, BETA2), eps=EPS,
                            weight_decay=float(np.float32(weight_decay)))
    params, m, v = params0.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    for t in (1, 2, 3):
        g = grads[t - 1].astype(np.float64) * grad_scale  # the reference scales first
        m_prev = m.astype(np.float64)
        p.grad = torch.tensor(g)
        opt.step()
        adamw.update(params, m, v, grads[t - 1], LR, BETA1, BETA2, EPS, weight_decay, grad_scale, t)

        state = opt.state[p]
        assert_moment_close(m, state["exp_avg"].numpy(), m_prev, g)
        np.testing.assert_allclose(v, state["exp_avg_sq"].numpy(), rtol=1e-6, atol=0)
        # each step moves params by ~lr; compare the moves to 0.1% of lr
        moved = params.astype(np.float64) - params0
        np.testing.assert_allclose(moved, p.detach().numpy() - params0, rtol=0, atol=1e-3 * LR)


def test_update_numpy_reference():
    # llm.c's formula in float64, so the check also runs where torch is absent
    rng = np.random.default_rng(1)
    n, lr, wd, scale = 517, float(np.float32(3e-4)), float(np.float32(0.05)), 0.25
    params = rng.standard_normal(n).astype(np.float32)
    m = (0.1 * rng.standard_normal(n)).astype(np.float32)
    v = (0.01 * rng.random(n)).astype(np.float32)
    grads = make_grads(rng, n, 1)[0]
    t = 5
    g = grads.astype(np.float64) * scale
    m_ref = BETA1 * m + (1 - BETA1) * g
    v_ref = BETA2 * v + (1 - BETA2) * g * g
    m_hat, v_hat = m_ref / (1 - BETA1 ** t), v_ref / (1 - BETA2 ** t)
    p_ref = params - lr * (m_hat / (np.sqrt(v_hat) + EPS) + wd * params)
    params0, m_prev = params.copy(), m.astype(np.float64)
    adamw.update(params, m, v, grads, lr, BETA1, BETA2, EPS, wd, scale, t)
    assert_moment_close(m, m_ref, m_prev, g)
    np.testing.assert_allclose(v, v_ref, rtol=1e-6, atol=0)
    np.testing.assert_allclose(params - params0.astype(np.float64), p_ref - params0, rtol=0, atol=1e-3 * lr)


@pytest.mark.parametrize("n", [0, 1, 7, 100_003])
def test_global_norm_squared(n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 3
    expected = np.sum(x.astype(np.float64) ** 2)
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
