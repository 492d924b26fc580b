"""The Llama 2 model (train_llama2.pyx) on the shared core: forward and backward against the
PyTorch reference (GQA, multi-query, tied and separate classifiers, odd B and T), the committed
fixture through test_llama2.py (also on check:cpu and guard:cpu, and failing when a gradient
is off), the llama group of the backend table entry by entry through check:cpu (and a planted
fault it names), and bad input refused in one line."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import needs
import test_llama2
from accel import instrument
from entries import run_every_entry
from faults import LLAMA_FAULTS, faulty_cpu
from accel.backend import ENTRY_GROUPS, BackendError, get_backend
from llmc.formats import param_views
from llmc.formats.llmc import read_debug_state, write_debug_state
from train_llama2 import LlamaConfig
from train_llama2 import Llama2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# odd sizes: 6 query heads on 2 kv heads with a separate classifier; multi-query attention
# (4 heads on 1) with the classifier tied to the embedding
TINY_GQA = LlamaConfig(dim=24, n_layers=2, n_heads=6, n_kv_heads=2, vocab_size=37,
                       hidden_dim=40, max_seq_len=9, shared_classifier=False)
TINY_MQA = LlamaConfig(dim=16, n_layers=1, n_heads=4, n_kv_heads=1, vocab_size=29,
                       hidden_dim=48, max_seq_len=9, shared_classifier=True)


def batch(config, B, T, seed=0):
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, (B, T + 1)).astype(np.int32)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()


def forward_backward(model, x, y):
    loss = model.forward(x, y)
    model.zero_grad()
    model.backward()
    return loss


# --- against PyTorch --------------------------------------------------------------------------

@pytest.mark.parametrize("config", [TINY_GQA, TINY_MQA], ids=["gqa-separate", "mqa-tied"])
def test_forward_backward_match_pytorch(config):
    torch = needs.package("torch")
    import train_llama2_torch as ref
    torch.set_num_threads(1)
    params = ref.init_params(config, seed=3)
    x, y = batch(config, 3, 7)
    logits, loss, grads = ref.reference_forward_backward(config, params, x, y)
    model = Llama2(config)
    model.params = params
    assert abs(forward_backward(model, x, y) - loss) < 1e-5
    np.testing.assert_allclose(model.logits, logits, atol=1e-5, rtol=1e-4)
    expected = param_views(config, grads)
    for name, grad in model.grad_tensors().items():
        scale = np.abs(expected[name]).max()
        assert np.abs(grad - expected[name]).max() <= 1e-4 * scale, name


def test_random_init_is_llama2c_s():
    config = LlamaConfig.from_name("d2", vocab_size=50)
    tensors = Llama2.random(config, seed=1).param_tensors()
    for name in ("attention_norm", "ffn_norm", "norm"):
        assert (tensors[name] == 1.0).all()
    residual_std = 0.02 / np.sqrt(2 * config.n_layers)
    for name in ("tok_embeddings", "wq", "wk", "wv", "wo", "w1", "w2", "w3"):
        std = residual_std if name in ("wo", "w3") else 0.02
        assert abs(tensors[name].std() - std) < 0.05 * std, name
    other = Llama2.random(config, seed=2).params
    assert not np.array_equal(other, Llama2.random(config, seed=1).params)
    np.testing.assert_array_equal(Llama2.random(config, seed=1).params,
                                  Llama2.random(config, seed=1).params)


def test_probs_are_the_softmax_of_the_logits():
    model = Llama2.random(TINY_MQA, seed=2)
    model.forward(batch(TINY_MQA, 2, 5)[0])   # no targets: the logsum is computed all the same
    logits = model.logits.astype(np.float64)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(model.probs, expected / expected.sum(-1, keepdims=True), rtol=1e-5)


def test_save_and_load_round_trip(tmp_path):
    model = Llama2.random(TINY_GQA, seed=4)
    model.save(tmp_path / "m.bin")
    loaded = Llama2.from_checkpoint(tmp_path / "m.bin")
    assert loaded.config == TINY_GQA
    np.testing.assert_array_equal(loaded.params, model.params)


def test_weight_decay_spans_are_the_matrices():
    model = Llama2(TINY_GQA)
    decayed = {name for name, start in zip(model.param_layout.names, model.param_layout.offsets)
               if any(s <= start < s + n and d for s, n, d in model._decay_spans(True))}
    assert decayed == Llama2.MATRICES
    norms = {"attention_norm", "ffn_norm", "norm"}   # the only tensors that are not matrices
    assert Llama2.MATRICES == {name for name, _ in TINY_GQA.param_shapes()} - norms


# --- the committed fixture through test_llama2.py ----------------------------------------------

def run_check(capsys, monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["test_llama2.py", *map(str, args)])
    code = test_llama2.main()
    return code, capsys.readouterr().out


def test_fixture_passes(capsys, monkeypatch):
    code, out = run_check(capsys, monkeypatch)
    assert code == 0, out
    assert "NOT OK" not in out and "overall okay: 1" in out
    assert out.count(" OK ") == 2 + 11 + 1   # logits, loss, 11 gradient tensors, 10-step losses


def test_fixture_losses_without_torch(monkeypatch):
    """Where PyTorch is missing, the losses come from the .losses.json beside the state."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else find_spec(name, *a))
    fixture = Llama2.from_checkpoint(test_llama2.FIXTURE_MODEL)
    config, params = fixture.config, fixture.params
    state = read_debug_state(test_llama2.FIXTURE_STATE, config)
    losses, source = test_llama2.expected_losses(config, params, state, test_llama2.FIXTURE_STATE)
    assert source.endswith("llama2_tiny_debug_state.losses.json") and len(losses) == 10


def test_a_gradient_off_by_more_than_its_tolerance_fails(tmp_path, capsys, monkeypatch):
    config = Llama2.from_checkpoint(test_llama2.FIXTURE_MODEL).config
    state = read_debug_state(test_llama2.FIXTURE_STATE, config)
    grads = state.grads.copy()
    wk = param_views(config, grads)["wk"]
    wk[1, 2, 3] += 2e-3 * np.abs(wk).max()
    bad_state = tmp_path / "bad_state.bin"
    write_debug_state(bad_state, state.x, state.y, state.logits, state.loss, grads)
    code, out = run_check(capsys, monkeypatch, "--state", bad_state)
    assert code == 1
    assert [line.split()[0] for line in out.splitlines() if "NOT OK" in line] == ["wk"]


@pytest.mark.parametrize("backend", ["check:cpu", "guard:cpu"])
def test_fixture_passes_on_wrapped_backends(backend):
    done = subprocess.run([sys.executable, "test_llama2.py", "--backend", backend], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "overall okay: 1" in done.stdout


# --- the llama group of the backend table ------------------------------------------------------

def test_every_llama_entry_passes_check_cpu():
    backend = get_backend("check:cpu")
    run_every_entry(backend, groups=("llama",))
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    assert all(report["entries"][name]["compared"] > 0 for name in ENTRY_GROUPS["llama"])


def test_check_names_a_planted_fault_in_a_llama_entry():
    for fault in LLAMA_FAULTS:
        backend = instrument.create("check", faulty_cpu(fault))
        run_every_entry(backend, groups=("llama",))
        report = backend.report()
        assert report["first"]["entry"] == fault
        assert {name for name, e in report["entries"].items() if e["mismatches"]} == {fault}


def test_check_names_the_broken_kernel_in_the_model_and_carries_on():
    x, y = batch(TINY_GQA, 3, 5)
    model = Llama2.random(TINY_GQA, seed=0, backend=instrument.create("check", faulty_cpu("rope_backward")))
    reference = Llama2.random(TINY_GQA, seed=0)
    assert forward_backward(model, x, y) == forward_backward(reference, x, y)
    first = model.backend.report()["first"]
    assert (first["entry"], first["step"], first["layer"]) == ("rope_backward", 0, TINY_GQA.n_layers - 1)
    np.testing.assert_allclose(model.grads, reference.grads, rtol=1e-6, atol=1e-7)


def test_every_missing_llama_entry_is_refused_by_name():
    backend = get_backend("cpu")
    for entry in ENTRY_GROUPS["llama"]:
        with pytest.raises(BackendError, match=f"its table has no entry '{entry}'"):
            backend._without_entry(entry)


def test_a_backend_without_the_llama_group_is_refused_in_one_line():
    gpt2_only = get_backend("cpu")._with_groups(("linear", "gpt2"))
    with pytest.raises(BackendError) as e:
        Llama2(TINY_MQA, backend=gpt2_only)
    assert str(e.value) == ("backend 'cpu' has no llama kernels, which the llama family needs "
                            "(it fills: core, linear, gpt2)")


@pytest.mark.parametrize("backend", ["check:cpu", "guard:cpu", "profile:cpu"])
def test_training_steps_on_wrapped_backends_match_cpu(backend):
    x, y = batch(TINY_GQA, 3, 7, seed=5)

    def steps(backend):
        model = Llama2.random(TINY_GQA, seed=0, backend=backend)
        losses = []
        for t in range(1, 3):
            losses.append(forward_backward(model, x, y))
            norm = model.grad_norm()
            model.update(1e-3, 0.9, 0.999, 1e-8, 0.01, t, grad_scale=0.5, decay_2d_only=True)
        return model, losses, norm

    reference, ref_losses, ref_norm = steps("cpu")
    model, losses, norm = steps(backend)
    assert losses == ref_losses and norm == ref_norm
    np.testing.assert_array_equal(model.params, reference.params)
    if backend == "check:cpu":
        assert model.backend.report()["mismatches"] == 0
    if backend == "profile:cpu":
        entries = model.backend.report()["entries"]
        L = TINY_GQA.n_layers
        assert entries["matmul_forward"]["calls"] == 2 * (7 * L + 1)
        assert entries["rope_forward"]["calls"] == 2 * 2 * L


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, message", [
    (np.array([[1, 2, 37]]), r"token ids must be in \[0, 37\), got \[1, 37\]"),
    (np.array([[1, -1, 3]]), r"token ids must be in \[0, 37\), got \[-1, 3\]"),
    (np.zeros((2, 10), np.int32), "sequence length 10 exceeds the model's max_seq_len 9"),
    (np.zeros(5, np.int32), r"must have shape \(B, T\)"),
])
def test_bad_inputs_are_one_line_errors(tokens, message):
    model = Llama2(TINY_GQA)
    with pytest.raises(ValueError, match=message) as e:
        model.forward(tokens)
    assert "\n" not in str(e.value)
