# kernels.classifier: the output head's fused softmax cross-entropy (log-sum-exp, loss, and the
# gradient of the logits), against float64 NumPy, with and without positions not scored (target
# -1); and against kernels.crossentropy's probability-buffer version, which computes the same
# thing.
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from kernels import classifier, crossentropy

# (B, T, V): odd B*T, a prime V, T=1; the last above kernels.parallel's SERIAL_BELOW (threaded)
SHAPES = [(3, 5, 53), (2, 1, 7), (1, 3, 1), (3, 7, 50021)]


def make_inputs(rng, B, T, V, masked=False):
    """logits (B,T,V) and targets (B,T); masked: a third of the targets -1 (not scored), the
    first always, the last 0 (the id a mask off by one would skip too)."""
    logits = (3.0 * rng.standard_normal((B, T, V))).astype(np.float32)
    # rows offset by up to +-1000: exp overflows / underflows unless the max is subtracted
    logits += rng.uniform(-1000.0, 1000.0, size=(B, T, 1)).astype(np.float32)
    targets = rng.integers(0, V, size=(B, T), dtype=np.int32)
    if masked:
        targets[rng.random((B, T)) < 1 / 3] = -1
        targets.flat[0], targets.flat[-1] = -1, 0
    return logits, targets


def reference(logits, targets):
    """logsum, losses, softmax - onehot (the gradient for dlosses = 1), in float64; a target of
    -1 scores nothing: loss 0, a gradient row of 0."""
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    logsum = np.log(np.exp(x - m).sum(axis=-1))
    lse = m[..., 0] + logsum
    scored = targets >= 0
    picked = np.where(scored, targets, 0)[..., None].astype(np.int64)
    losses = np.where(scored, lse - np.take_along_axis(x, picked, -1)[..., 0], 0.0)
    grad = np.exp(x - lse[..., None])
    np.put_along_axis(grad, picked, np.take_along_axis(grad, picked, -1) - 1, -1)
    return logsum, losses, np.where(scored[..., None], grad, 0.0)


@pytest.mark.parametrize("masked", [False, True], ids=["all-scored", "masked"])
@pytest.mark.parametrize("num_threads", [1, 3])
@pytest.mark.parametrize("B,T,V", SHAPES)
def test_forward_backward_match_float64(B, T, V, num_threads, masked):
    rng = np.random.default_rng(V)
    logits, targets = make_inputs(rng, B, T, V, masked)
    logsum_ref, losses_ref, grad_ref = reference(logits, targets)
    lse, losses = np.full((B, T), np.nan, np.float32), np.full((B, T), np.nan, np.float32)
    dlosses = rng.uniform(0.5, 2.0, (B, T)).astype(np.float32)
    dlogits_start = rng.standard_normal((B, T, V)).astype(np.float32)
    dlogits = dlogits_start.copy()
    with threadpool_limits(limits=num_threads, user_api="openmp"):
        classifier.forward(lse, logits, losses, targets)
        classifier.backward(dlogits, dlosses, logits, lse, targets)
    np.testing.assert_allclose(lse, logsum_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, losses_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dlogits, dlogits_start + grad_ref * dlosses[..., None],
                               rtol=1e-5, atol=1e-6)   # added into
    # a position not scored: exactly no loss and no gradient, its logsum as any other's
    skipped = targets < 0
    assert np.all(losses[skipped] == 0.0)
    np.testing.assert_array_equal(dlogits[skipped], dlogits_start[skipped])


def test_forward_without_targets_gives_logsum_only():
    logits, targets = make_inputs(np.random.default_rng(0), 2, 3, 11)
    lse = np.zeros((2, 3), np.float32)
    classifier.forward(lse, logits)
    np.testing.assert_allclose(lse, reference(logits, targets)[0], rtol=1e-5, atol=1e-6)


def test_matches_the_probability_buffer_version():
    B, T, V = 3, 4, 301
    logits, targets = make_inputs(np.random.default_rng(2), B, T, V, masked=True)
    probs, ce_losses = np.zeros_like(logits), np.zeros((B, T), np.float32)
    crossentropy.softmax(probs, logits, V)
    crossentropy.forward(ce_losses, probs, targets)
    dlosses = np.full((B, T), 1.0 / (B * T), np.float32)
    ce_dlogits, dlogits = np.zeros_like(logits), np.zeros_like(logits)
    crossentropy.backward(ce_dlogits, dlosses, probs, targets, V)
    lse, losses = np.zeros((B, T), np.float32), np.zeros((B, T), np.float32)
    classifier.forward(lse, logits, losses, targets)
    classifier.backward(dlogits, dlosses, logits, lse, targets)
    np.testing.assert_allclose(losses, ce_losses, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dlogits, ce_dlogits, rtol=1e-4, atol=1e-8)


def test_bad_arguments_raise():
    logits, targets = make_inputs(np.random.default_rng(3), 2, 3, 5)
    lse, losses = np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="logsum has shape"):
        classifier.forward(np.zeros((3, 2), np.float32), logits)
    with pytest.raises(ValueError, match="both losses and targets"):
        classifier.forward(lse, logits, losses)
    for value in (5, -2):   # -1 alone of the negatives: a position not scored
        bad = targets.copy()
        bad[1, 2] = value
        with pytest.raises(ValueError, match=rf"targets\[1, 2\] = {value} is not a token id in "
                                             r"\[0, 5\) nor -1 \(not scored\)"):
            classifier.forward(lse, logits, losses, bad)
        with pytest.raises(ValueError, match=rf"targets\[1, 2\] = {value}"):
            classifier.backward(np.zeros_like(logits), lse, logits, lse, bad)
    with pytest.raises(ValueError, match="dlogits has shape"):
        classifier.backward(np.zeros((2, 3, 4), np.float32), lse, logits, lse, targets)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gpt2_loses_and_learns_alike_through_the_classifier_and_the_softmax(precision):
    """GPT-2 uses the classifier (no probability buffer) where the backend has it, llm.c's
    softmax and cross-entropy elsewhere: the same loss, probabilities and gradients, with
    positions not scored among the targets."""
    from accel.backend import get_backend
    from train_gpt2 import GPT2, GPT2Config
    config = GPT2Config.from_depth(2, max_seq_len=16, vocab_size=101)   # Vp 128: padded
    full = get_backend("cpu", precision)
    without = full._with_groups(tuple(g for g in full.groups if g != "classifier"))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 101, (2, 16)), rng.integers(0, 101, (2, 16))
    tokens[1][:, ::3] = -1
    models = [GPT2.random(config, seed=1, backend=b) for b in (full, without)]
    assert [m.classifier for m in models] == [True, False]
    losses = []
    for model in models:
        model.zero_grad()
        losses.append(model.forward(*tokens))
        model.backward()
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    np.testing.assert_allclose(models[0].probs, models[1].probs, atol=1e-6)
    scale = np.abs(models[1].grads).max()
    tolerance = 1e-6 if precision == "fp32" else 2.0 ** -7   # bf16: dlogits rounded apart
    assert np.abs(models[0].grads - models[1].grads).max() <= tolerance * scale
