# kernels.attention_gqa: causal attention with grouped-query heads, forward and backward against
# float64 NumPy references and PyTorch (scaled_dot_product_attention, autograd).
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import needs
from kernels import attention_gqa


# ----------------------------------------------------------------------------
# float64 references.  q (B,T,NH,hs); k, v (B,T,NKV,hs); query head h uses kv head h // (NH/NKV)

def repeat_kv(x, NH):
    """(B,T,NKV,hs) -> (B,NH,T,hs), each kv head repeated for its NH/NKV query heads."""
    return np.repeat(x, NH // x.shape[2], axis=2).transpose(0, 2, 1, 3)


def attention_gqa_forward_ref(q, k, v):
    """out (B,T,NH,hs), att (B,NH,T,T), in float64."""
    B, T, NH, hs = q.shape
    qh = q.astype(np.float64).transpose(0, 2, 1, 3)
    kh, vh = repeat_kv(k.astype(np.float64), NH), repeat_kv(v.astype(np.float64), NH)
    causal = np.tril(np.ones((T, T), dtype=bool))
    scores = np.where(causal, qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(hs), -np.inf)
    att = np.exp(scores - scores.max(axis=-1, keepdims=True))
    att /= att.sum(axis=-1, keepdims=True)
    return (att @ vh).transpose(0, 2, 1, 3), att


def attention_gqa_backward_ref(dout, q, k, v):
    """dq (B,T,NH,hs), dk, dv (B,T,NKV,hs), in float64."""
    B, T, NH, hs = q.shape
    NKV = k.shape[2]
    _, att = attention_gqa_forward_ref(q, k, v)
    qh = q.astype(np.float64).transpose(0, 2, 1, 3)
    kh, vh = repeat_kv(k.astype(np.float64), NH), repeat_kv(v.astype(np.float64), NH)
    dy = dout.astype(np.float64).transpose(0, 2, 1, 3)
    datt = dy @ vh.transpose(0, 1, 3, 2)
    dvh = att.transpose(0, 1, 3, 2) @ dy
    dscores = att * (datt - (att * datt).sum(axis=-1, keepdims=True)) / np.sqrt(hs)
    dq, dkh = dscores @ kh, dscores.transpose(0, 1, 3, 2) @ qh
    # each kv head's gradient sums over its group of query heads
    group = lambda x: x.reshape(B, NKV, NH // NKV, T, hs).sum(axis=2).transpose(0, 2, 1, 3)
    return dq.transpose(0, 2, 1, 3), group(dkh), group(dvh)


# ----------------------------------------------------------------------------

# (B, T, NH, NKV, hs): GQA, MHA (NKV = NH), MQA (NKV = 1), T = 1, T across the 64-row blocks,
# odd head sizes
SIZES = [(3, 7, 6, 2, 16), (3, 7, 6, 6, 8), (2, 13, 6, 1, 10), (1, 1, 4, 2, 8),
         (2, 70, 4, 2, 12), (1, 130, 2, 1, 5)]


def make_inputs(rng, B, T, NH, NKV, hs):
    q = rng.standard_normal((B, T, NH, hs)).astype(np.float32)
    k = rng.standard_normal((B, T, NKV, hs)).astype(np.float32)
    v = rng.standard_normal((B, T, NKV, hs)).astype(np.float32)
    return q, k, v


def run_forward(q, k, v):
    B, T, NH, hs = q.shape
    out = np.full((B, T, NH, hs), np.nan, dtype=np.float32)
    att = np.full((B, NH, T, T), np.nan, dtype=np.float32)
    attention_gqa.forward(out, att, q, k, v)
    return out, att


@pytest.mark.parametrize("B,T,NH,NKV,hs", SIZES)
def test_forward_matches_numpy_and_torch(B, T, NH, NKV, hs):
    q, k, v = make_inputs(np.random.default_rng(B * T + NKV), B, T, NH, NKV, hs)
    out, att = run_forward(q, k, v)
    out_ref, att_ref = attention_gqa_forward_ref(q, k, v)
    np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(att, att_ref, rtol=1e-5, atol=1e-6)
    assert np.all(att[:, :, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)

    torch = needs.package("torch")
    t = lambda x: torch.from_numpy(x.astype(np.float64)).transpose(1, 2)
    expected = torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True,
                                                               enable_gqa=True)
    np.testing.assert_allclose(out_ref, expected.transpose(1, 2).numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("num_threads", [1, 3])
@pytest.mark.parametrize("B,T,NH,NKV,hs", SIZES)
def test_backward_adds_and_matches_numpy_and_torch(B, T, NH, NKV, hs, num_threads):
    rng = np.random.default_rng(B + T + NH + NKV)
    q, k, v = make_inputs(rng, B, T, NH, NKV, hs)
    dout = rng.standard_normal((B, T, NH, hs)).astype(np.float32)
    _, att = run_forward(q, k, v)
    # gradient buffers start nonzero: backward must add to them
    starts = [rng.standard_normal(x.shape).astype(np.float32) for x in (q, k, v)]
    dq, dk, dv = (s.copy() for s in starts)
    with threadpool_limits(limits=num_threads, user_api="openmp"):
        attention_gqa.backward(dq, dk, dv, dout, q, k, v, att)
    refs = attention_gqa_backward_ref(dout, q, k, v)
    for got, start, ref in zip((dq, dk, dv), starts, refs):
        np.testing.assert_allclose(got, start + ref, rtol=1e-4, atol=1e-4)

    torch = needs.package("torch")
    tq, tk, tv = (torch.tensor(x, dtype=torch.float64).transpose(1, 2).requires_grad_()
                  for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                          enable_gqa=True)
    out.backward(torch.tensor(dout, dtype=torch.float64).transpose(1, 2))
    for ref, x in zip(refs, (tq, tk, tv)):
        np.testing.assert_allclose(ref, x.grad.transpose(1, 2).numpy(), rtol=1e-9, atol=1e-10)


def test_backward_does_not_depend_on_threads():
    # per-head partial sums are added in a fixed order: the same bits for any thread count
    q, k, v = make_inputs(np.random.default_rng(5), 2, 70, 6, 2, 12)
    dout = np.random.default_rng(6).standard_normal(q.shape).astype(np.float32)
    _, att = run_forward(q, k, v)
    results = []
    for num_threads in (1, 2, 3):
        grads = [np.zeros_like(x) for x in (q, k, v)]
        with threadpool_limits(limits=num_threads, user_api="openmp"):
            attention_gqa.backward(*grads, dout, q, k, v, att)
        results.append(grads)
    for grads in results[1:]:
        for got, first in zip(grads, results[0]):
            np.testing.assert_array_equal(got, first)


def test_bad_arguments_raise():
    q, k, v = make_inputs(np.random.default_rng(7), 2, 5, 6, 4, 8)
    out, att = np.zeros_like(q), np.zeros((2, 6, 5, 5), np.float32)
    with pytest.raises(ValueError, match="must divide"):
        attention_gqa.forward(out, att, q, k, v)
    q, k, v = make_inputs(np.random.default_rng(7), 2, 5, 6, 2, 8)
    for name, bad in (("k", (2, 5, 2, 7)), ("v", (2, 4, 2, 8)), ("att", (2, 2, 5, 5)),
                      ("out", (2, 5, 6, 7))):
        args = dict(out=out, att=att, q=q, k=k, v=v)
        args[name] = np.zeros(bad, np.float32)
        with pytest.raises(ValueError, match=name):
            attention_gqa.forward(**args)
    for name, bad in (("dq", (2, 5, 2, 8)), ("dk", (2, 5, 6, 8)), ("dv", (2, 5, 2, 7)),
                      ("dout", (2, 5, 2, 8))):
        args = dict(dq=np.zeros_like(q), dk=np.zeros_like(k), dv=np.zeros_like(v),
                    dout=np.zeros_like(q), q=q, k=k, v=v, att=att)
        args[name] = np.zeros(bad, np.float32)
        with pytest.raises(ValueError, match=name):
            attention_gqa.backward(**args)
