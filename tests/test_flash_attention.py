# kernels.flash_attention against the float64 reference (kernels/reference.py), against today's
# kernel with llm.c's (B,NH,T,T) buffers (kernels.attention), against finite differences of the
# float64 reference, and against PyTorch's scaled_dot_product_attention (skipped without torch);
# then GPT-2 with and without it.  Llama's grouped-query form (forward_gqa, backward_gqa) against
# the same reference on repeated key/value heads, against kernels.attention_gqa (the (B,NH,T,T)
# path) and finite differences; then Llama with and without it.  Tolerance reached (max |err| / max |ref| over a tensor, float32
# kernels vs float64): 2.4e-7 for out, 9e-8 for lse and 4.6e-7 for dinp at GPT-2's T=1024, C=768,
# NH=12 (see test_gpt2_size_tolerance); the tests ask for 1e-5 as dev/ab.py does.
import numpy as np
import pytest

import needs
from accel import cpu, instrument
from entries import run_every_entry
from faults import faulty_cpu
from kernels import attention, attention_gqa, flash_attention
from kernels import reference as R
from train_gpt2 import GPT2Config
from train_gpt2 import GPT2
from train_llama2 import Llama2, LlamaConfig

TOLERANCE = 1e-5
# (B, T, C, NH): B*T not a multiple of 8, T=1, one head, hs=1; T across query tiles and key
# blocks (64): exactly one, one and a bit, several with a partial last one
SIZES = [(3, 5, 36, 3), (1, 1, 20, 4), (2, 7, 20, 4), (2, 16, 48, 1), (1, 6, 6, 6),
         (1, 64, 32, 2), (2, 65, 24, 3), (1, 200, 16, 2)]


def randn(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def rel_err(got, ref):
    return np.max(np.abs(np.float64(got) - ref)) / np.max(np.abs(ref))


def run_forward(inp, NH):
    B, T, C3 = inp.shape
    out = np.full((B, T, C3 // 3), np.nan, dtype=np.float32)
    lse = np.full((B, NH, T), np.nan, dtype=np.float32)
    flash_attention.forward(out, lse, inp, NH)
    return out, lse


@pytest.mark.parametrize("B,T,C,NH", SIZES)
def test_forward_matches_reference(B, T, C, NH):
    rng = np.random.default_rng(B * 100 + T)
    inp = randn(rng, B, T, 3 * C)
    out, lse = run_forward(inp, NH)
    expected_out, expected_lse = R.flash_attention_forward(inp, NH)
    assert rel_err(out, expected_out) < TOLERANCE
    assert rel_err(lse, expected_lse) < TOLERANCE


@pytest.mark.parametrize("B,T,C,NH", SIZES)
def test_backward_adds_the_reference_gradient(B, T, C, NH):
    rng = np.random.default_rng(B * 100 + T + 1)
    inp, dout = randn(rng, B, T, 3 * C), randn(rng, B, T, C)
    out, lse = run_forward(inp, NH)
    dinp0 = randn(rng, B, T, 3 * C)
    dinp = dinp0.copy()
    flash_attention.backward(dinp, dout, inp, out, lse, NH)
    expected = R.flash_attention_backward(dinp0, dout, inp, out, lse, NH)
    assert rel_err(dinp - dinp0, expected - dinp0) < TOLERANCE   # the added part itself


@pytest.mark.parametrize("B,T,C,NH", [(2, 65, 24, 3), (1, 130, 64, 1), (3, 7, 20, 4)])
def test_matches_todays_kernel(B, T, C, NH):
    # the same numbers as kernels.attention (llm.c's buffers) to float32 rounding
    rng = np.random.default_rng(T)
    inp, dout = randn(rng, B, T, 3 * C), randn(rng, B, T, C)
    out, lse = run_forward(inp, NH)
    old_out = np.zeros((B, T, C), np.float32)
    preatt, att = np.zeros((B, NH, T, T), np.float32), np.zeros((B, NH, T, T), np.float32)
    attention.forward(old_out, preatt, att, inp, NH)
    np.testing.assert_allclose(out, old_out, rtol=0, atol=1e-5 * np.abs(old_out).max())
    dinp, old_dinp = np.zeros((B, T, 3 * C), np.float32), np.zeros((B, T, 3 * C), np.float32)
    flash_attention.backward(dinp, dout, inp, out, lse, NH)
    attention.backward(old_dinp, np.zeros_like(att), np.zeros_like(att), dout, inp, att, NH)
    np.testing.assert_allclose(dinp, old_dinp, rtol=0, atol=1e-5 * np.abs(old_dinp).max())


def test_gradient_matches_finite_differences():
    # d/dinp of sum(out * w): the kernel's backward against central differences of the
    # float64 reference forward, at coordinates of q, k and v, early and late positions
    B, T, C, NH = 1, 70, 12, 2
    rng = np.random.default_rng(7)
    inp, w = randn(rng, B, T, 3 * C), randn(rng, B, T, C)
    out, lse = run_forward(inp, NH)
    dinp = np.zeros_like(inp)
    flash_attention.backward(dinp, w, inp, out, lse, NH)
    eps = 1e-4
    for t, c in [(0, 0), (3, 5), (69, 7), (40, 12 + 3), (66, 12 + 11), (10, 24 + 1), (69, 24 + 9)]:
        plus, minus = np.float64(inp), np.float64(inp)
        plus[0, t, c] += eps
        minus[0, t, c] -= eps
        numeric = (np.sum(R.flash_attention_forward(plus, NH)[0] * w)
                   - np.sum(R.flash_attention_forward(minus, NH)[0] * w)) / (2 * eps)
        assert abs(dinp[0, t, c] - numeric) < 1e-4 * max(1.0, abs(numeric)), (t, c, dinp[0, t, c], numeric)


@pytest.mark.parametrize("B,T,C,NH", [(2, 7, 20, 4), (1, 65, 24, 3), (1, 130, 64, 1)])
def test_matches_torch_sdpa(B, T, C, NH):
    torch = needs.package("torch")
    rng = np.random.default_rng(T + 11)
    inp, dout = randn(rng, B, T, 3 * C), randn(rng, B, T, C)
    out, lse = run_forward(inp, NH)
    dinp = np.zeros_like(inp)
    flash_attention.backward(dinp, dout, inp, out, lse, NH)

    x = torch.tensor(inp.astype(np.float64), requires_grad=True)
    q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in x.split(C, dim=2))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    y = sdpa.transpose(1, 2).reshape(B, T, C)
    y.backward(torch.tensor(dout.astype(np.float64)))
    assert rel_err(out, y.detach().numpy()) < TOLERANCE
    assert rel_err(dinp, x.grad.numpy()) < TOLERANCE
    flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if flash_cpu is not None:   # PyTorch's own CPU flash kernel returns its log-sum-exp too
        torch_lse = flash_cpu(q.detach(), k.detach(), v.detach(), is_causal=True)[1]
        assert rel_err(lse, torch_lse.numpy()) < TOLERANCE


def test_gpt2_size_tolerance():
    # one sequence at GPT-2 124M's shape and full context: the tolerance the header states
    B, T, C, NH = 1, 1024, 768, 12
    rng = np.random.default_rng(3)
    inp, dout = randn(rng, B, T, 3 * C), randn(rng, B, T, C)
    out, lse = run_forward(inp, NH)
    dinp = np.zeros_like(inp)
    flash_attention.backward(dinp, dout, inp, out, lse, NH)
    expected_out, expected_lse = R.flash_attention_forward(inp, NH)
    assert rel_err(out, expected_out) < 1e-6
    assert rel_err(lse, expected_lse) < 1e-6
    assert rel_err(dinp, R.flash_attention_backward(0.0, dout, inp, out, lse, NH)) < 2e-6


def test_shape_mismatches_raise():
    B, T, C, NH = 2, 3, 12, 3
    z = lambda *s: np.zeros(s, dtype=np.float32)  # noqa: E731
    with pytest.raises(ValueError, match="NH"):
        flash_attention.forward(z(B, T, C), z(B, 5, T), z(B, T, 3 * C), 5)
    with pytest.raises(ValueError, match="NH"):
        flash_attention.forward(z(B, T, C), z(B, 0, T), z(B, T, 3 * C), 0)
    with pytest.raises(ValueError, match="3\\*C"):
        flash_attention.forward(z(B, T, C), z(B, NH, T), z(B, T, 3 * C + 1), NH)
    with pytest.raises(ValueError, match="out"):
        flash_attention.forward(z(B, T, C + 1), z(B, NH, T), z(B, T, 3 * C), NH)
    with pytest.raises(ValueError, match="lse"):
        flash_attention.forward(z(B, T, C), z(B, NH, T + 1), z(B, T, 3 * C), NH)
    args = dict(dinp=z(B, T, 3 * C), dout=z(B, T, C), inp=z(B, T, 3 * C), out=z(B, T, C),
                lse=z(B, NH, T))
    for name in args:
        bad = dict(args)
        bad[name] = z(*(args[name].shape[:-1] + (args[name].shape[-1] + 1,)))
        with pytest.raises(ValueError, match=name if name != "inp" else "3\\*C"):
            flash_attention.backward(*bad.values(), NH)


# --- GPT-2 with and without it ----------------------------------------------------------------

def two_steps(backend, T=70):
    """Losses, the gradients and the activations' bytes of two AdamW steps of a small GPT-2
    whose T spans two attention tiles."""
    config = GPT2Config.from_depth(2, max_seq_len=80, vocab_size=300)
    model = GPT2.random(config, seed=1, backend=backend)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 300, (2, T + 1)).astype(np.int32)
    losses = []
    for t in (1, 2):
        losses.append(model.forward(tokens[:, :-1], tokens[:, 1:]))
        model.zero_grad()
        model.backward()
        model.update(1e-3, 0.9, 0.999, 1e-8, 0.0, t)
    return model, losses


def test_gpt2_uses_flash_where_the_backend_has_it():
    flash_model, flash_losses = two_steps("cpu")
    llmc_model, llmc_losses = two_steps(cpu.create(flash=False))
    assert flash_model.flash and not llmc_model.flash
    np.testing.assert_allclose(flash_losses, llmc_losses, rtol=1e-6)
    np.testing.assert_allclose(flash_model.grads, llmc_model.grads, rtol=0,
                               atol=1e-5 * np.abs(llmc_model.grads).max())
    # with flash, no (L,B,NH,T,T) buffers: only the (L,B,NH,T) log-sum-exp
    acts = flash_model.activations()
    assert acts["preatt"].size == acts["att"].size == 0
    assert acts["att_lse"].shape == (2, 2, flash_model.config.num_heads, 70)
    assert llmc_model.activations()["att_lse"].size == 0
    saved = 2 * 2 * 2 * flash_model.config.num_heads * 70 * 70 * 4   # L B NH T T, two buffers
    kept = lambda model: model.memory()["activations"] + model.memory()["activation_grads"]
    assert kept(llmc_model) - kept(flash_model) >= saved


def test_check_claims_only_what_the_oracle_has():
    backend = instrument.create("check", cpu.create(flash=False))
    assert "gpt2" in backend.groups and "flash" not in backend.groups
    model, _ = two_steps(backend, T=9)
    assert not model.flash and backend.report()["mismatches"] == 0
    model, _ = two_steps("check:cpu", T=9)
    assert model.flash and model.backend.report()["entries"]["flash_attention_backward"]["calls"] == 4


# --- Llama's form: grouped-query heads --------------------------------------------------------

# (B, T, NH, NKV, hs): ordinary multi-head, groups of 2 and 3, multi-query (NKV = 1); T across
# the query tiles (128) and key blocks (256), with partial last ones; hs = 1
GQA_SIZES = [(3, 7, 4, 2, 5), (1, 1, 2, 1, 3), (2, 9, 3, 3, 4), (1, 130, 6, 2, 8),
             (2, 70, 4, 1, 6), (1, 300, 2, 1, 4), (1, 5, 4, 4, 1)]


def gqa_inputs(rng, B, T, NH, NKV, hs):
    return randn(rng, B, T, NH, hs), randn(rng, B, T, NKV, hs), randn(rng, B, T, NKV, hs)


def as_gpt2_inp(q, k, v):
    """q, k, v of Llama's form as GPT-2's inp (B,T,3C): each key/value head repeated for the
    query heads of its group (query head h reads head h / (NH/NKV))."""
    B, T, NH, hs = q.shape
    repeat = lambda x: np.repeat(np.float64(x), NH // x.shape[2], axis=2).reshape(B, T, NH * hs)  # noqa: E731
    return np.concatenate([np.float64(q).reshape(B, T, -1), repeat(k), repeat(v)], axis=-1)


def gqa_reference(q, k, v, dout):
    """(out, lse, dq, dk, dv) in float64: the GPT-2 reference on repeated heads, the repeated
    heads' gradients summed into their key/value head."""
    B, T, NH, hs = q.shape
    NKV = k.shape[2]
    inp = as_gpt2_inp(q, k, v)
    out, lse = R.flash_attention_forward(inp, NH)
    dinp = R.flash_attention_backward(0.0, np.float64(dout).reshape(B, T, -1), inp, out, lse, NH)
    dq, dk, dv = (d.reshape(B, T, NH, hs) for d in np.split(dinp, 3, axis=-1))
    fold = lambda d: d.reshape(B, T, NKV, NH // NKV, hs).sum(axis=3)  # noqa: E731
    return out.reshape(B, T, NH, hs), lse, dq, fold(dk), fold(dv)


def run_gqa_forward(q, k, v):
    B, T, NH, hs = q.shape
    out = np.full((B, T, NH, hs), np.nan, dtype=np.float32)
    lse = np.full((B, NH, T), np.nan, dtype=np.float32)
    flash_attention.forward_gqa(out, lse, q, k, v)
    return out, lse


def run_gqa_backward(dout, q, k, v, out, lse, start=None):
    """dq, dk, dv added onto `start` (three arrays; zeros by default)."""
    grads = start or (np.zeros_like(q), np.zeros_like(k), np.zeros_like(v))
    grads = tuple(g.copy() for g in grads)
    flash_attention.backward_gqa(*grads, dout, q, k, v, out, lse)
    return grads


@pytest.mark.parametrize("B,T,NH,NKV,hs", GQA_SIZES)
def test_gqa_matches_the_reference(B, T, NH, NKV, hs):
    rng = np.random.default_rng(B * 1000 + T + NKV)
    q, k, v = gqa_inputs(rng, B, T, NH, NKV, hs)
    dout = randn(rng, B, T, NH, hs)
    out, lse = run_gqa_forward(q, k, v)
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = gqa_reference(q, k, v, dout)
    assert rel_err(out, ref_out) < TOLERANCE
    assert rel_err(lse, ref_lse) < TOLERANCE
    start = tuple(randn(rng, *x.shape) for x in (q, k, v))   # backward adds
    for got, before, ref in zip(run_gqa_backward(dout, q, k, v, out, lse, start), start,
                                (ref_dq, ref_dk, ref_dv)):
        if np.any(ref):
            assert rel_err(got - before, ref) < TOLERANCE
        else:   # T = 1: one key, probability 1 whatever q and k, so no gradient to them
            assert np.max(np.abs(got - before)) < 1e-6


@pytest.mark.parametrize("B,T,NH,NKV,hs", [(2, 70, 4, 2, 6), (1, 130, 6, 3, 8), (3, 7, 4, 1, 5)])
def test_gqa_matches_the_kernel_with_buffers(B, T, NH, NKV, hs):
    # the same numbers as kernels.attention_gqa, the (B,NH,T,T) path Llama takes without flash
    rng = np.random.default_rng(T + NKV)
    q, k, v = gqa_inputs(rng, B, T, NH, NKV, hs)
    dout = randn(rng, B, T, NH, hs)
    out, lse = run_gqa_forward(q, k, v)
    old_out, att = np.zeros_like(out), np.zeros((B, NH, T, T), np.float32)
    attention_gqa.forward(old_out, att, q, k, v)
    np.testing.assert_allclose(out, old_out, rtol=0, atol=1e-5 * np.abs(old_out).max())
    old = (np.zeros_like(q), np.zeros_like(k), np.zeros_like(v))
    attention_gqa.backward(*old, dout, q, k, v, att)
    for got, want in zip(run_gqa_backward(dout, q, k, v, out, lse), old):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_gqa_gradient_matches_finite_differences():
    # d/d(q, k, v) of sum(out * w) against central differences of the float64 reference, at
    # coordinates of each, early and late positions, both query heads of a key/value head
    B, T, NH, NKV, hs = 1, 40, 4, 2, 3
    rng = np.random.default_rng(11)
    q, k, v = gqa_inputs(rng, B, T, NH, NKV, hs)
    w = randn(rng, B, T, NH, hs)
    out, lse = run_gqa_forward(q, k, v)
    grads = run_gqa_backward(w, q, k, v, out, lse)
    eps = 1e-4
    for which, index in [(0, (0, 0, 0, 0)), (0, (0, 39, 3, 2)), (1, (0, 3, 0, 1)),
                         (1, (0, 38, 1, 0)), (2, (0, 0, 1, 2)), (2, (0, 25, 0, 1))]:
        plus = [np.float64(x) for x in (q, k, v)]
        minus = [np.float64(x) for x in (q, k, v)]
        plus[which][index] += eps
        minus[which][index] -= eps
        numeric = (np.sum(gqa_reference(*plus, w)[0] * w) - np.sum(gqa_reference(*minus, w)[0] * w)) / (2 * eps)
        got = grads[which][index]
        assert abs(got - numeric) < 1e-4 * max(1.0, abs(numeric)), (which, index, got, numeric)


def test_gpt2_form_is_the_gqa_form_with_every_head_its_own():
    B, T, NH, hs = 2, 9, 3, 4
    rng = np.random.default_rng(5)
    q, k, v = gqa_inputs(rng, B, T, NH, NH, hs)
    inp = np.float32(as_gpt2_inp(q, k, v))
    out, lse = run_forward(inp, NH)
    gqa_out, gqa_lse = run_gqa_forward(q, k, v)
    np.testing.assert_array_equal(out.reshape(gqa_out.shape), gqa_out)
    np.testing.assert_array_equal(lse, gqa_lse)


def test_gqa_shape_mismatches_raise():
    B, T, NH, NKV, hs = 2, 3, 4, 2, 5
    z = lambda *s: np.zeros(s, dtype=np.float32)  # noqa: E731
    with pytest.raises(ValueError, match="must divide"):
        flash_attention.forward_gqa(z(B, T, NH, hs), z(B, NH, T), z(B, T, NH, hs), z(B, T, 3, hs),
                                    z(B, T, 3, hs))
    args = dict(out=z(B, T, NH, hs), lse=z(B, NH, T), q=z(B, T, NH, hs), k=z(B, T, NKV, hs),
                v=z(B, T, NKV, hs))
    for name in ("out", "lse", "v"):
        bad = dict(args)
        bad[name] = z(*(args[name].shape[:-1] + (args[name].shape[-1] + 1,)))
        with pytest.raises(ValueError, match=name):
            flash_attention.forward_gqa(*bad.values())
    args = dict(dq=z(B, T, NH, hs), dk=z(B, T, NKV, hs), dv=z(B, T, NKV, hs), dout=z(B, T, NH, hs),
                q=z(B, T, NH, hs), k=z(B, T, NKV, hs), v=z(B, T, NKV, hs), out=z(B, T, NH, hs),
                lse=z(B, NH, T))
    for name in ("dq", "dk", "dv", "dout", "out", "lse"):
        bad = dict(args)
        bad[name] = z(*(args[name].shape[:-1] + (args[name].shape[-1] + 1,)))
        with pytest.raises(ValueError, match=name):
            flash_attention.backward_gqa(*bad.values())


# --- Llama with and without it ----------------------------------------------------------------

def llama_two_steps(backend, T=70, precision=None):
    """Losses, the model and the activations of two AdamW steps of a small Llama with
    grouped-query heads (4 query heads on 2 key/value heads) whose T spans two query tiles."""
    config = LlamaConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300,
                         hidden_dim=64, max_seq_len=160)
    model = Llama2.random(config, seed=1, backend=backend, precision=precision)
    tokens = np.random.default_rng(0).integers(0, 300, (2, T + 1)).astype(np.int32)
    losses = []
    for t in (1, 2):
        losses.append(model.forward(tokens[:, :-1], tokens[:, 1:]))
        model.zero_grad()
        model.backward()
        model.update(1e-3, 0.9, 0.999, 1e-8, 0.0, t)
    return model, losses


def test_llama_uses_flash_where_the_backend_has_it():
    flash_model, flash_losses = llama_two_steps("cpu", T=150)
    buffers_model, buffers_losses = llama_two_steps(cpu.create(flash=False), T=150)
    assert flash_model.flash and not buffers_model.flash
    np.testing.assert_allclose(flash_losses, buffers_losses, rtol=1e-6)
    np.testing.assert_allclose(flash_model.grads, buffers_model.grads, rtol=0,
                               atol=1e-5 * np.abs(buffers_model.grads).max())
    # with flash no (L,B,NH,T,T) probabilities: only the (L,B,NH,T) log-sum-exp
    acts = flash_model.activations()
    assert acts["att"].size == 0 and acts["att_lse"].shape == (2, 2, 4, 150)
    assert buffers_model.activations()["att_lse"].size == 0
    assert buffers_model.activations()["att"].shape == (2, 2, 4, 150, 150)
    kept = lambda model: model.memory()["activations"] + model.memory()["activation_grads"]  # noqa: E731
    assert kept(buffers_model) - kept(flash_model) >= 2 * 2 * 4 * 150 * 150 * 4 - 2 * 2 * 4 * 150 * 4


def test_llama_on_check_cpu_calls_the_gqa_entries():
    model, _ = llama_two_steps("check:cpu", T=9)
    report = model.backend.report()
    assert model.flash and report["mismatches"] == 0
    assert report["entries"]["flash_attention_gqa_backward"]["calls"] == 4
    assert "attention_gqa_forward" not in report["entries"]


def test_llama_flash_at_bf16_trains_as_without_it():
    flash_model, flash_losses = llama_two_steps("cpu", T=20, precision="bf16")
    buffers_model, buffers_losses = llama_two_steps(cpu.create(flash=False, precision="bf16"), T=20)
    assert flash_model.flash and flash_model.precision == "bf16" and not buffers_model.flash
    np.testing.assert_allclose(flash_losses, buffers_losses, rtol=1e-3)


# --- the bf16 kernel: its probabilities rounded to bf16 for the GEMMs --------------------------

# (name, dims): GPT-2 d12 at its full context; Llama 3.2 1B's heads (32 query heads of 64 sharing
# 8 key/value heads); Qwen3's head size of its own (128); the sizes that do not fill a tile
REAL_SHAPES = [("gpt2-d12", dict(B=1, T=1024, C=768, NH=12, NKV=12, hs=64)),
               ("llama-1b", dict(B=1, T=512, C=2048, NH=32, NKV=8, hs=64)),
               ("qwen3", dict(B=2, T=300, C=512, NH=4, NKV=2, hs=128)),
               ("odd", dict(B=3, T=37, C=20, NH=4, NKV=2, hs=5))]


@pytest.mark.parametrize("label, dims", REAL_SHAPES, ids=[label for label, _ in REAL_SHAPES])
def test_bf16_kernel_passes_check_against_the_widened_fp32_kernel(label, dims):
    """check:'s oracle at bf16 runs the fp32 kernel on widened copies (accel/cpu.pyx's
    ROUNDED_INSIDE); the bf16 kernel, which rounds P and dS to bf16 for its GEMMs, stays within
    an ulp of each output's largest element, and differs from it (the two are not one code)."""
    backend = instrument.create("check", cpu.create(precision="bf16"))
    run_every_entry(backend, dims=dict(dims, OC=1, H=1, V=1, Vp=1, P=1, R=1), seed=1,
                    groups=("flash",))
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    worst = {name: e["worst_ratio"] for name, e in report["entries"].items() if e["compared"]}
    assert len(worst) == 4 and all(0 < ratio < 1 for ratio in worst.values()), worst


ON_MKLS_BF16_GEMM = """
import sys
sys.path.insert(0, "tests")
from accel import cpu, instrument
from entries import run_every_entry
from kernels import blas
backend = instrument.create("check", cpu.create(precision="bf16"))
run_every_entry(backend, dims=dict(B=2, T=300, C=512, NH=8, NKV=2, hs=64, OC=1, H=1, V=1, Vp=1,
                                   P=1, R=1), groups=("flash",))
print(blas.BF16_LIBRARY, "|", backend.report()["mismatches"], backend.summary())
"""


def test_bf16_kernel_on_mkls_bf16_gemm():
    """The path of a CPU with AMX or AVX512_BF16 (LLMPYX_BF16_GEMM=mkl forces it, in a process
    of its own: MKL runs it without the hardware too, slowly): check: clean there as well."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", ON_MKLS_BF16_GEMM], cwd=root, text=True,
                          capture_output=True, env=dict(os.environ, LLMPYX_BF16_GEMM="mkl"))
    if "no libmkl_rt was found" in done.stderr:
        pytest.skip("no libmkl_rt here (pip install mkl)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MKL") and "| 0 " in done.stdout, done.stdout


def test_a_bf16_statistic_in_the_bf16_kernel_is_named():
    backend = instrument.create("check", faulty_cpu("bf16_flash_attention_gqa_forward"))
    run_every_entry(backend, dims=dict(REAL_SHAPES[-1][1], OC=1, H=1, V=1, Vp=1, P=1, R=1),
                    groups=("flash",))
    assert backend.report()["first"]["entry"] == "flash_attention_gqa_forward", backend.summary()
