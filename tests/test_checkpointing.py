"""Activation checkpointing (llmc/recompute.py, run by llmc/model.pyx): every policy gives
bit-identical gradients and training steps, keeps the activations it says, and recomputes the
layer forwards it says."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from accel import cpu
from llmc.formats.llmc import write_shard
from llmc.recompute import RecomputePlan, parse_policy
from train_gpt2 import GPT2Config
from train_gpt2 import GPT2, activation_shapes
from train_llama2 import LlamaConfig
from train_llama2 import Llama2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = ["all", "boundary", "sqrt", "every-2", "every-3", "none"]
V = 101


def gpt2(depth, policy, backend="cpu"):
    return GPT2.random(GPT2Config.from_depth(depth, max_seq_len=16, vocab_size=V), seed=depth,
                       backend=backend, recompute=policy)


def batch(B, T, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))


def loss_and_grads(model, x, y):
    loss = model.forward(x, y)
    model.zero_grad()
    model.backward()
    return loss, model.grads.copy()


def llama(depth, policy):
    """A Llama dN (grouped-query attention from d2 on)."""
    config = LlamaConfig.from_name(f"d{depth}", vocab_size=V, max_seq_len=16)
    return Llama2.random(config, seed=depth, recompute=policy)


def llmc_attention_gpt2(depth, policy):
    """GPT-2 on llm.c's attention, its (B,NH,T,T) buffers recomputed, not flash attention."""
    return gpt2(depth, policy, backend=cpu.create(flash=False))


@pytest.mark.parametrize("make, depth, B, T", [
    (gpt2, 2, 3, 7), (gpt2, 3, 3, 7), (gpt2, 5, 1, 5), (llmc_attention_gpt2, 3, 3, 7),
    (llama, 2, 3, 7), (llama, 3, 3, 7), (llama, 4, 1, 5)])
def test_gradients_are_bit_identical_across_policies(make, depth, B, T):
    x, y = batch(B, T, depth)
    ref_loss, ref_grads = loss_and_grads(make(depth, "all"), x, y)
    assert np.abs(ref_grads).max() > 0
    for policy in POLICIES[1:]:
        loss, grads = loss_and_grads(make(depth, policy), x, y)
        assert loss == ref_loss, policy
        assert np.array_equal(grads, ref_grads), (policy, np.abs(grads - ref_grads).max())


def train(model, steps=2):
    """Steps of two accumulated micro-batches each, the second micro-batch of another shape,
    then AdamW; the losses and the final parameters."""
    losses = []
    for t in range(1, steps + 1):
        model.zero_grad()
        for B, T in ((3, 7), (2, 5)):
            x, y = batch(B, T, 10 * t + B)
            losses.append(model.forward(x, y))
            model.backward()
        model.update(1e-3, 0.9, 0.999, 1e-8, 0.1, t, grad_scale=0.5)
    return losses, model.params.copy()


def test_training_steps_are_bit_identical_across_policies():
    ref_losses, ref_params = train(gpt2(4, "all"))
    for policy in POLICIES[1:]:
        losses, params = train(gpt2(4, policy))
        assert losses == ref_losses, policy
        assert np.array_equal(params, ref_params), policy


def test_a_second_backward_adds_the_same_gradient_again():
    """backward twice after one forward: the slots hold other layers by then, recomputed."""
    x, y = batch(3, 7, 0)
    grads = {}
    for policy in ("all", "sqrt", "none"):
        model = gpt2(3, policy)
        loss_and_grads(model, x, y)
        model.backward()
        grads[policy] = model.grads.copy()
    assert np.array_equal(grads["sqrt"], grads["all"])
    assert np.array_equal(grads["none"], grads["all"])


def test_inference_logits_are_bit_identical_across_policies():
    x, _ = batch(2, 9, 1)
    ref = gpt2(3, "all")
    ref.forward(x)
    for policy in POLICIES[1:]:
        model = gpt2(3, policy)
        model.forward(x)
        assert np.array_equal(model.logits, ref.logits), policy


@pytest.mark.parametrize("flash", [True, False])
def test_all_keeps_llmcs_activation_tensors(flash):
    """llm.c's 23 tensors and att_lse, each layer tensor over the L layers."""
    model = gpt2(3, "all", backend=cpu.create(flash=flash))
    model.forward(*batch(3, 7, 0))
    embedding, layer, head = activation_shapes(model.config, 3, 7, flash)
    expected = [embedding] + [(n, (3,) + s) for n, s in layer] + head
    assert list(zip(model.act_layout.names, model.act_layout.shapes)) == expected
    assert len(expected) == 25 and model.act_layout.names[17] == "residual3"
    assert model.activation("residual3").shape == (3, 3, 7, model.config.channels)
    assert model.activation("att").shape == ((3, 0) if flash else (3, 3, 3, 7, 7))


@pytest.mark.parametrize("policy", POLICIES)
def test_activation_memory_is_the_policys(policy):
    """The kept activations: the embedding's output, the slots' internals, the outputs, the
    head's; the activation gradients the same under every policy."""
    B, T, L = 3, 7, 5
    model = gpt2(L, policy)
    loss_and_grads(model, *batch(B, T, 0))
    embedding, layer, head = activation_shapes(model.config, B, T)
    size = lambda shapes: 4 * sum(int(np.prod(s)) for _, s in shapes)
    plan = RecomputePlan(policy, L)
    expected = (size([embedding]) + plan.slots * size(layer[:-1]) +
                plan.outputs * size(layer[-1:]) + size(head))
    assert model.memory()["activations"] == expected
    assert (plan.slots, plan.outputs) == {"all": (5, 5), "boundary": (1, 5), "sqrt": (3, 4),
                                          "every-2": (2, 4), "every-3": (3, 4),
                                          "none": (1, 3)}[policy]
    no_grad = size([(n, s) for n, s in layer + head if n in GPT2.NO_GRAD])
    assert model.memory()["activation_grads"] == (size(layer) + size(head) - no_grad +
                                                  size(layer[-1:]))   # + the second stream


@pytest.mark.parametrize("policy", POLICIES)
def test_backward_recomputes_the_planned_layer_forwards(policy):
    """One training step on profile:cpu: 4 matmul_forward calls per layer forward, plus the
    head's, for the forward pass and for every layer the plan says backward recomputes."""
    L = 5
    model = gpt2(L, policy, backend="profile:cpu")
    loss_and_grads(model, *batch(3, 7, 0))
    plan = RecomputePlan(policy, L)
    assert plan.recomputed == {"all": 0, "boundary": 4, "sqrt": 2, "every-2": 3, "every-3": 2,
                               "none": 10}[policy]
    calls = model.backend.report()["entries"]
    assert calls["matmul_forward"]["calls"] == 4 * (L + plan.recomputed) + 1
    assert calls["matmul_backward"]["calls"] == 4 * L + 1


def test_check_backend_sees_no_mismatch_while_recomputing():
    model = gpt2(3, "every-2", backend="check:cpu")
    loss_and_grads(model, *batch(3, 7, 0))
    assert model.backend.report()["mismatches"] == 0


def test_guard_backend_runs_a_recomputing_step():
    """guard:cpu: the core's recompute and pointer tables touch no buffer outside the table."""
    x, y = batch(3, 7, 0)
    _, ref = loss_and_grads(gpt2(3, "all"), x, y)
    model = gpt2(3, "none", backend="guard:cpu")
    loss_and_grads(model, x, y)
    assert np.array_equal(model.grads, ref)


def test_changing_the_policy_frees_and_relays_the_activations():
    x, y = batch(3, 7, 0)
    model = gpt2(5, "all")
    _, ref = loss_and_grads(model, x, y)
    full = model.memory()["activations"]
    model.recompute = "none"
    assert model.recompute == "none" and model.memory()["activations"] == 0
    with pytest.raises(RuntimeError, match="no forward pass"):
        model.activations()
    _, grads = loss_and_grads(model, x, y)
    assert np.array_equal(grads, ref)
    assert 0 < model.memory()["activations"] < full


@pytest.mark.parametrize("bad", ["some", "every-0", "every-x", "every-", "ALL", "", None, 3])
def test_unknown_policies_are_refused_in_one_line(bad):
    with pytest.raises(ValueError, match="unknown recompute policy") as e:
        parse_policy(bad)
    assert "\n" not in str(e.value) and "sqrt" in str(e.value)
    with pytest.raises(ValueError, match="unknown recompute policy"):
        gpt2(1, bad)


def test_plans_keep_every_input_a_layer_reads():
    """For every L and policy, the core's schedule run on paper: every layer, when it runs
    forward (also recomputed) or backward, finds its own internals in its slot and its input
    (the previous layer's output) intact in its output tensor, and the head its input."""
    for L in range(1, 20):
        for policy in ["all", "boundary", "sqrt", "none"] + [f"every-{n}" for n in (2, 3, 7)]:
            p = RecomputePlan(policy, L)
            assert 0 <= p.slot_of.min() and p.slot_of.max() < p.slots
            assert 0 <= p.output_of.min() and p.output_of.max() < p.outputs
            resident, holds = [-1] * p.slots, [-1] * p.outputs   # which layer each holds

            def forward(l):
                assert l == 0 or holds[p.output_of[l - 1]] == l - 1, (policy, L, l)
                resident[p.slot_of[l]], holds[p.output_of[l]] = l, l
            for l in range(L):
                forward(l)
            assert holds[p.output_of[L - 1]] == L - 1
            recomputed = 0
            for l in range(L - 1, -1, -1):
                if resident[p.slot_of[l]] != l:
                    for j in range(p.segment_start[l], l + 1):
                        forward(j)
                        recomputed += 1
                assert resident[p.slot_of[l]] == l, (policy, L, l)
                assert l == 0 or holds[p.output_of[l - 1]] == l - 1, (policy, L, l)
            assert recomputed == p.recomputed


def test_train_py_trains_alike_under_every_policy(tmp_path):
    """--recompute reaches the model: the same loss and norm lines as the default."""
    rng = np.random.default_rng(0)
    for name in ("train_000.bin", "val_000.bin"):
        write_shard(tmp_path / name, rng.integers(0, 50257, 3000))
    outputs = {}
    for policy in ("all", "none"):
        done = subprocess.run(
            [sys.executable, os.path.join(ROOT, "train.py"), "-e", "d2", "-b", "2", "-t", "16",
             "-x", "2", "-m", "0", "-s", "0", "-i", str(tmp_path / "train_*.bin"),
             "-j", str(tmp_path / "val_000.bin"), "--recompute", policy],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert re.search(rf"recompute\s+\|\s+{policy}", done.stdout), done.stdout
        outputs[policy] = re.findall(r"loss \S+ \| norm \S+", done.stdout)
    assert len(outputs["all"]) == 2 and outputs["none"] == outputs["all"]
