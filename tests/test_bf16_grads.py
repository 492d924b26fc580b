"""
bf16 parameter gradients (Model(grad_precision="bf16"), train.py --grad-precision bf16; llm.c's
choice): at bf16, the same model with float32 and with bf16 gradients, from the same weights
and batches.  The forward does not change; each gradient is the float32 one rounded to bf16
once per kernel that adds into it (within about an ulp, most elements exactly it); training
tracks the float32-gradient run; the memory is 2 bytes a parameter less; check: compares the
gradients as bf16; what cannot take bf16 gradients says so in one line.
(The kernels against float64: tests/test_bf16_grad_kernels.py.)
"""
import dataclasses
import numpy as np
import pytest

import test_bf16
import train_llama2
from accel.backend import BackendError, get_backend, require_grad_precision
from entries import run_every_entry
from kernels.bf16 import to_bf16, to_float32
from llmc.dry_run import memory_plan
from train_gpt2 import GPT2, GPT2Config
from train_llama2 import Llama2

ULP = 2.0 ** -8   # a bf16 ulp relative to a value in [1, 2): 7 stored mantissa bits


def gpt2(grad_precision, backend="cpu"):
    config = GPT2Config.from_depth(2, max_seq_len=32, vocab_size=97)
    return GPT2.random(config, seed=3, backend=backend, precision="bf16",
                       grad_precision=grad_precision)


def llama(grad_precision, backend="cpu"):
    # grouped-query heads, a separate head, q/k/v bias and QK-norm: every gradient kernel
    config = dataclasses.replace(train_llama2.PRESETS["stories15M"], dim=64, hidden_dim=160,
                                 n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=101,
                                 max_seq_len=32, shared_classifier=False, qkv_bias=True,
                                 qk_norm=True)
    return Llama2.random(config, seed=2, backend=backend, precision="bf16",
                         grad_precision=grad_precision)


MODELS = {"gpt2": (gpt2, 97), "llama": (llama, 101)}


def batch(V, B=2, T=16, seed=0):
    rng = np.random.default_rng(seed)
    # few distinct tokens: many positions add into each embedding row
    return rng.integers(0, min(V, 11), (B, T)), rng.integers(0, V, (B, T))


def train(model, steps, tokens):
    # decay on the matrices alone: AdamW runs span by span, each at its offset in grads
    return test_bf16.train(model, steps, tokens, decay_2d_only=True)


@pytest.mark.parametrize("family", MODELS)
def test_bf16_gradients_are_the_float32_ones_rounded_once(family):
    make, V = MODELS[family]
    exact, narrow = make("fp32"), make("bf16")
    assert narrow.grad_precision == "bf16" and narrow.grad_itemsize == 2
    tokens = batch(V)
    for model in (exact, narrow):
        model.zero_grad()
    assert exact.forward(*tokens) == narrow.forward(*tokens)   # the forward is the same
    exact.backward()
    narrow.backward()
    reference = exact.grad_tensors()
    matched = total = 0
    for name, grad in narrow.grad_tensors().items():
        expected = reference[name]
        assert np.array_equal(to_float32(to_bf16(grad)), grad), f"{name} is not bf16"
        scale = np.abs(expected).max()
        # one rounding per kernel call that adds into the gradient (GPT-2's tied embedding:
        # the head's and the encoder's, where a token was read)
        assert np.abs(grad - expected).max() <= 2 * ULP * scale, name
        # the float32 gradient rounded to nearest, bit for bit, but where a second rounding
        # moved it: a kernel that rounded at every position it sums would match far fewer
        exact_share = np.count_nonzero(grad == to_float32(to_bf16(expected))) / grad.size
        assert exact_share >= 0.95, (name, exact_share)
        matched += exact_share * grad.size
        total += grad.size
    assert matched >= 0.999 * total, (matched, total)
    assert narrow.grad_norm() == pytest.approx(exact.grad_norm(), rel=ULP)


@pytest.mark.parametrize("family", MODELS)
def test_training_with_bf16_gradients_tracks_float32_gradients(family):
    make, V = MODELS[family]
    tokens = batch(V)
    exact, narrow = train(make("fp32"), 8, tokens), train(make("bf16"), 8, tokens)
    assert exact[-1] < exact[0] - 0.5   # it learns the batch
    assert np.allclose(narrow, exact, rtol=0, atol=0.02), (narrow, exact)


def test_bf16_gradients_halve_the_gradient_memory_as_the_plan_says():
    exact, narrow = gpt2("fp32"), gpt2("bf16")
    tokens = batch(97)
    for model in (exact, narrow):
        model.zero_grad()
        model.forward(*tokens)
        model.backward()
    assert narrow.memory()["grads"] == 2 * narrow.num_parameters
    assert exact.memory()["grads"] == 4 * exact.num_parameters
    B, T = tokens[0].shape
    plan = memory_plan(GPT2, narrow.config, B, T, precision="bf16", grad_precision="bf16")
    assert plan["grads"] == narrow.memory()["grads"]


def test_gradients_load_rounded_and_read_widened():
    model = gpt2("bf16")
    values = np.random.default_rng(0).standard_normal(model.num_parameters).astype(np.float32)
    model.grads = values
    assert np.array_equal(model.grads, to_float32(to_bf16(values)))
    model.zero_grad()
    assert not model.grads.any()


def test_check_cpu_compares_bf16_gradients_and_every_entry_runs():
    model = gpt2("bf16", backend="check:cpu")
    assert model.backend.grad_precision == "bf16"
    train(model, 2, batch(97))
    assert model.backend.report()["mismatches"] == 0, model.backend.summary()
    backend = get_backend("check:cpu", "bf16", "bf16")
    run_every_entry(backend)
    assert backend.report()["mismatches"] == 0, backend.summary()


def test_what_cannot_take_bf16_gradients_says_so_in_one_line():
    with pytest.raises(BackendError, match="bf16 gradients need precision bf16"):
        get_backend("cpu", "fp32", "bf16")
    with pytest.raises(BackendError, match="unknown gradient precision 'fp8'"):
        get_backend("cpu", "bf16", "fp8")
    with pytest.raises(BackendError, match="keeps bf16 gradients, not fp32"):
        GPT2(GPT2Config.from_depth(1, max_seq_len=8, vocab_size=16),
             backend=get_backend("cpu", "bf16", "bf16"), grad_precision="fp32")
    # a GPU backend's module has no GRAD_PRECISIONS: float32 gradients alone

    class GpuModule:
        PRECISIONS = ("fp32", "bf16")
    with pytest.raises(BackendError, match="backend 'hip' keeps float32 parameter gradients"):
        require_grad_precision(GpuModule, "hip", "bf16", "bf16")
    with pytest.raises(ValueError, match="LoRA's updates keep float32 gradients"):
        llama("bf16").attach_lora(4, 8.0, ["wq"], [0])
