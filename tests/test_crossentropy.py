# kernels.crossentropy: softmax over the real vocab of padded rows, the cross-entropy loss, and
# their fused backward, against the float64 reference (kernels/reference.py), with and without
# positions not scored (target -1); the reference against PyTorch's cross_entropy (its
# ignore_index) and autograd.
import numpy as np
import pytest

import needs
from kernels import crossentropy
from kernels import reference as R

# (B, T, V, Vp): odd B*T, V prime with Vp > V, T=1, and no padding at all
SHAPES = [(3, 5, 53, 64), (2, 1, 53, 64), (1, 3, 7, 7)]


def make_logits(rng, B, T, V, Vp):
    logits = (3.0 * rng.standard_normal((B, T, Vp))).astype(np.float32)
    # rows offset by up to +-1000: exp overflows / underflows unless the max is subtracted
    logits += rng.uniform(-1000.0, 1000.0, size=(B, T, 1)).astype(np.float32)
    logits[..., V:] = 1e30  # the padding must be ignored
    return logits


def run_softmax(logits, V):
    probs = np.full(logits.shape, np.nan, dtype=np.float32)
    crossentropy.softmax(probs, logits, V)
    return probs


@pytest.mark.parametrize("B,T,V,Vp", SHAPES)
def test_softmax_forward(B, T, V, Vp):
    logits = make_logits(np.random.default_rng(0), B, T, V, Vp)
    probs = run_softmax(logits, V)
    # atol 0: the padding must hold exact zeros
    np.testing.assert_allclose(probs, R.softmax_forward(logits, V), rtol=1e-5, atol=0)


def mask(rng, targets):
    """targets with about a third of them -1 (not scored): the first always; the last 0, the id
    a mask off by one would skip too."""
    targets = np.where(rng.random(targets.shape) < 1 / 3, -1, targets).astype(np.int32)
    targets.flat[0], targets.flat[-1] = -1, 0
    return targets


@pytest.mark.parametrize("masked", [False, True], ids=["all-scored", "masked"])
@pytest.mark.parametrize("B,T,V,Vp", SHAPES)
def test_crossentropy_forward(B, T, V, Vp, masked):
    rng = np.random.default_rng(1)
    probs = run_softmax(make_logits(rng, B, T, V, Vp), V)
    targets = rng.integers(0, V, size=(B, T), dtype=np.int32)
    if masked:
        targets = mask(rng, targets)
    losses = np.full((B, T), np.nan, dtype=np.float32)
    crossentropy.forward(losses, probs, targets)
    np.testing.assert_allclose(losses, R.crossentropy_forward(probs, targets), rtol=1e-6, atol=1e-7)
    assert np.all(losses[targets < 0] == 0.0)   # exactly: not scored


def backward_case(B, T, V, Vp, masked=False):
    """logits, targets (the last real token among them; masked: some -1 instead), dlosses, and
    dlogits' starting value."""
    rng = np.random.default_rng(2)
    logits = make_logits(rng, B, T, V, Vp)
    targets = rng.integers(0, V, size=(B, T), dtype=np.int32)
    targets[0, 0] = V - 1
    if masked:
        targets = mask(rng, targets)
    dlosses = rng.uniform(0.1, 1.0, size=(B, T)).astype(np.float32)
    return logits, targets, dlosses, rng.standard_normal((B, T, Vp), dtype=np.float32)


@pytest.mark.parametrize("masked", [False, True], ids=["all-scored", "masked"])
@pytest.mark.parametrize("B,T,V,Vp", SHAPES)
def test_backward(B, T, V, Vp, masked):
    logits, targets, dlosses, dlogits_start = backward_case(B, T, V, Vp, masked)
    probs = run_softmax(logits, V)
    probs[..., V:] = 0.5  # never read: the gradient covers the first V entries only
    dlogits = dlogits_start.copy()
    crossentropy.backward(dlogits, dlosses, probs, targets, V)
    expected = R.crossentropy_softmax_backward(dlogits_start, dlosses, probs, targets, V)
    np.testing.assert_allclose(dlogits[..., :V], expected[..., :V], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(dlogits[..., V:], dlogits_start[..., V:])  # padding untouched
    skipped = targets < 0   # rows not scored: untouched, bit for bit
    np.testing.assert_array_equal(dlogits[skipped], dlogits_start[skipped])


@pytest.mark.parametrize("masked", [False, True], ids=["all-scored", "masked"])
@pytest.mark.parametrize("B,T,V,Vp", SHAPES)
def test_reference_against_torch(B, T, V, Vp, masked):
    torch = needs.package("torch")
    logits, targets, dlosses, dlogits_start = backward_case(B, T, V, Vp, masked)
    probs = R.softmax_forward(logits, V)
    x = torch.tensor(logits[..., :V], dtype=torch.float64, requires_grad=True)
    # llm.c's ignore_index: a target of -1 has loss 0 and no gradient
    losses = torch.nn.functional.cross_entropy(x.reshape(-1, V), torch.tensor(targets).long().reshape(-1),
                                               reduction="none", ignore_index=-1)
    (losses * torch.tensor(dlosses, dtype=torch.float64).reshape(-1)).sum().backward()
    np.testing.assert_allclose(R.crossentropy_forward(probs, targets).reshape(-1), losses.detach().numpy(),
                               rtol=1e-10, atol=1e-12)
    dlogits = R.crossentropy_softmax_backward(dlogits_start, dlosses, probs, targets, V)
    np.testing.assert_allclose(dlogits[..., :V], dlogits_start[..., :V] + x.grad.numpy(),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(dlogits[..., V:], dlogits_start[..., V:])


def test_vocab_out_of_range_raises():
    logits = np.zeros((3, 5, 64), dtype=np.float32)
    for V in (0, -1, 65):
        with pytest.raises(ValueError, match="V = "):
            crossentropy.softmax(np.zeros_like(logits), logits, V)
        with pytest.raises(ValueError, match="V = "):
            crossentropy.backward(np.zeros_like(logits), np.ones((3, 5), np.float32), logits,
                                  np.zeros((3, 5), np.int32), V)


def test_shape_mismatch_raises():
    probs = np.full((3, 5, 64), 1.0 / 53, dtype=np.float32)
    targets = np.zeros((3, 5), dtype=np.int32)
    dlosses = np.ones((3, 5), dtype=np.float32)
    with pytest.raises(ValueError, match="probs"):
        crossentropy.softmax(np.zeros((3, 5, 63), np.float32), probs, 53)
    with pytest.raises(ValueError, match="losses"):
        crossentropy.forward(np.zeros((3, 4), np.float32), probs, targets)
    with pytest.raises(ValueError, match="targets"):
        crossentropy.forward(np.zeros((3, 5), np.float32), probs, np.zeros((5, 3), np.int32))
    with pytest.raises(ValueError, match="dlogits"):
        crossentropy.backward(np.zeros((3, 5, 53), np.float32), dlosses, probs, targets, 53)
    with pytest.raises(ValueError, match="dlosses"):
        crossentropy.backward(np.zeros_like(probs), np.ones((2, 5), np.float32), probs, targets, 53)
    with pytest.raises(ValueError, match="targets"):
        crossentropy.backward(np.zeros_like(probs), dlosses, probs, np.zeros((3, 6), np.int32), 53)


@pytest.mark.parametrize("bad", [-2, 53, 64])
def test_out_of_range_target_raises(bad):
    V, Vp = 53, 64
    probs = np.full((3, 5, Vp), 1.0 / V, dtype=np.float32)
    targets = np.zeros((3, 5), dtype=np.int32)
    targets[1, 4] = bad
    dlogits = np.zeros_like(probs)
    with pytest.raises(ValueError, match=r"targets\[1, 4\] = -?\d+ is not a token id in "
                                         r"\[0, 53\) nor -1 \(not scored\)"):
        crossentropy.backward(dlogits, np.ones((3, 5), np.float32), probs, targets, V)
    np.testing.assert_array_equal(dlogits, 0.0)
    if bad < 0 or bad >= Vp:  # forward knows only Vp
        with pytest.raises(ValueError, match=r"targets\[1, 4\]"):
            crossentropy.forward(np.zeros((3, 5), np.float32), probs, targets)
