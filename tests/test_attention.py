# kernels.attention against the float64 reference (kernels/reference.py), a transcription of
# llm.c's accumulate-into-scratch semantics; the reference against PyTorch's causal attention
# and autograd (float64).
import numpy as np
import pytest

import needs
from kernels import attention
from kernels import reference as R

# (B, T, C, NH): B*T not a multiple of 8, T=1, C not a power of two, one head, hs=1
SIZES = [(3, 5, 36, 3), (1, 1, 20, 4), (2, 7, 20, 4), (2, 16, 48, 1), (1, 6, 6, 6)]


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def run_forward(inp, NH):
    B, T, C3 = inp.shape
    out = np.full((B, T, C3 // 3), np.nan, dtype=np.float32)
    preatt = np.full((B, NH, T, T), np.nan, dtype=np.float32)
    att = np.full((B, NH, T, T), np.nan, dtype=np.float32)
    attention.forward(out, preatt, att, inp, NH)
    return out, preatt, att


@pytest.mark.parametrize("B,T,C,NH", SIZES)
def test_forward(B, T, C, NH):
    rng = np.random.default_rng(B * 100 + T)
    inp = randn(rng, B, T, 3 * C)
    out, preatt, att = run_forward(inp, NH)
    expected_out, expected_preatt, expected_att = R.attention_forward(inp, NH)
    np.testing.assert_allclose(out, expected_out, rtol=1e-5, atol=1e-5)
    # above the diagonal both score buffers hold exact zeros
    np.testing.assert_allclose(preatt, expected_preatt, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(att, expected_att, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("B,T,C,NH", SIZES)
def test_reference_against_torch(B, T, C, NH):
    torch = needs.package("torch")
    rng = np.random.default_rng(B * 100 + T + 2)
    inp, dout = randn(rng, B, T, 3 * C), randn(rng, B, T, C)
    out, _, att = R.attention_forward(inp, NH)

    x = torch.tensor(inp.astype(np.float64), requires_grad=True)
    q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in x.split(C, dim=2))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(out, R.merge_heads(sdpa.detach().numpy()), rtol=1e-10, atol=1e-12)
    preatt_t = q @ k.transpose(-2, -1) / np.sqrt(C // NH)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    att_t = torch.softmax(preatt_t.masked_fill(~causal, float("-inf")), dim=-1)
    preatt_t.retain_grad()
    att_t.retain_grad()
    (att_t @ v).transpose(1, 2).reshape(B, T, C).backward(torch.tensor(dout.astype(np.float64)))

    # the scratch gradients start at zero, as in llm.c's training step
    dinp0 = randn(rng, B, T, 3 * C)
    zeros = np.zeros((B, NH, T, T))
    dinp, dpreatt, datt = R.attention_backward(dinp0, zeros, zeros, dout, inp, att, NH)
    lower = np.broadcast_to(causal.numpy(), datt.shape)
    np.testing.assert_allclose(dinp, dinp0 + x.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(datt[lower], att_t.grad.numpy()[lower], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dpreatt, preatt_t.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert not datt[~lower].any(), "the reference wrote datt above the diagonal"


@pytest.mark.parametrize("B,T,C,NH", SIZES)
def test_backward_accumulates_into_scratch_and_ignores_future(B, T, C, NH):
    rng = np.random.default_rng(B * 100 + T + 3)
    inp, dout = randn(rng, B, T, 3 * C), randn(rng, B, T, C)
    _, _, att = run_forward(inp, NH)
    upper = ~np.tril(np.ones((T, T), dtype=bool))
    att[:, :, upper] = randn(rng, B, NH, int(upper.sum()))  # the backward must not read these
    dinp, dpreatt, datt = randn(rng, B, T, 3 * C), randn(rng, B, NH, T, T), randn(rng, B, NH, T, T)
    expected = R.attention_backward(dinp, dpreatt, datt, dout, inp, att, NH)
    attention.backward(dinp, dpreatt, datt, dout, inp, att, NH)
    for got, want in zip((dinp, dpreatt, datt), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_shape_mismatches_raise():
    B, T, C, NH = 2, 3, 12, 3
    z = lambda *s: np.zeros(s, dtype=np.float32)  # noqa: E731
    with pytest.raises(ValueError, match="NH"):
        attention.forward(z(B, T, C), z(B, 5, T, T), z(B, 5, T, T), z(B, T, 3 * C), 5)
    with pytest.raises(ValueError, match="NH"):
        attention.forward(z(B, T, C), z(B, 0, T, T), z(B, 0, T, T), z(B, T, 3 * C), 0)
    with pytest.raises(ValueError, match="3\\*C"):
        attention.forward(z(B, T, C), z(B, NH, T, T), z(B, NH, T, T), z(B, T, 3 * C + 1), NH)
    with pytest.raises(ValueError, match="out"):
        attention.forward(z(B, T, C + 1), z(B, NH, T, T), z(B, NH, T, T), z(B, T, 3 * C), NH)
    with pytest.raises(ValueError, match="preatt"):
        attention.forward(z(B, T, C), z(B, NH, T, T + 1), z(B, NH, T, T), z(B, T, 3 * C), NH)
    with pytest.raises(ValueError, match="att"):
        attention.forward(z(B, T, C), z(B, NH, T, T), z(B, NH + 1, T, T), z(B, T, 3 * C), NH)
    args = dict(dinp=z(B, T, 3 * C), dpreatt=z(B, NH, T, T), datt=z(B, NH, T, T), dout=z(B, T, C),
                inp=z(B, T, 3 * C), att=z(B, NH, T, T))
    for name in args:
        bad = dict(args)
        bad[name] = z(*(args[name].shape[:-1] + (args[name].shape[-1] + 1,)))
        with pytest.raises(ValueError, match=name if name != "inp" else "3\\*C"):
            attention.backward(*bad.values(), NH)
