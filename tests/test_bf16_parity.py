"""bf16 parity (issue 21, item 5): test_gpt2.py and test_llama2.py at --precision bf16 on the
committed fixtures, on both bf16 GEMM paths (the default one, oneMKL's bf16 GEMM where the CPU
has bf16 hardware, and the float32 fallback, forced); the PyTorch references' --dtype bfloat16
files; planted faults that the bf16 comparison must catch; and 10 steps of bf16 training of a
small GPT-2 and a small Llama whose losses track the fp32 run's within llm.c's 0.05.

The faults here are the ones a model-level comparison can see.  A bf16 store that truncates
instead of rounding is not among them: it moves each stored value by at most one bf16 step where
rounding moves it by half of one, and on these models that stays inside bf16's own error
(measured: the fixtures pass with every matmul output truncated, or with the bf16 parameters
truncated from the master weights).  Rounding itself is a kernel's property, for a test that
compares each bf16 entry with its float32 result rounded to nearest."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import needs
import test_gpt2
import test_llama2
from llmc.formats import param_views
from llmc.formats.llmc import read_checkpoint, read_debug_state
from train_gpt2 import GPT2, GPT2Config
from train_llama2 import Llama2, LlamaConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUTOCAST_HEADER = "against the PyTorch bf16-autocast reference"
SCRIPTS = {"gpt2": test_gpt2, "llama": test_llama2}


def has_torch():
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def sections(out):
    """(the lines against the float32 reference, those against the autocast one: [] if none)."""
    lines = out.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith(AUTOCAST_HEADER)), len(lines))
    return lines[:at], lines[at:]


def failed(lines):
    return [line.split()[0] for line in lines if " NOT OK " in line]


def passed(lines):
    return [line.split()[0] for line in lines if " OK " in line and " NOT OK " not in line]


# --- the scripts at --precision bf16 on the fixtures ---------------------------------------

@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_script_passes_at_bf16(family, capsys, monkeypatch):
    script = SCRIPTS[family]
    monkeypatch.setattr(sys, "argv", [f"{script.__name__}.py", "--precision", "bf16"])
    code = script.main()
    out = capsys.readouterr().out
    assert code == 0 and "overall okay: 1" in out and "NOT OK" not in out, out
    assert "precision bf16" in out and "tolerances bf16" in out
    tensors = 16 if family == "gpt2" else 11
    fp32_ref, autocast = sections(out)
    assert len(passed(fp32_ref)) == 2 + tensors + 1, out   # logits, loss, gradients, losses
    if has_torch():
        assert len(passed(autocast)) == 2 + tensors + 1, out
    else:
        assert "not compared (no PyTorch)" in out


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_script_passes_at_bf16_on_the_fp32_gemm_fallback(family):
    """The path of a CPU without bf16 hardware, forced (LLMPYX_BF16_GEMM is read at import)."""
    env = dict(os.environ, LLMPYX_BF16_GEMM="fp32")
    script = "test_gpt2.py" if family == "gpt2" else "test_llama2.py"
    result = subprocess.run([sys.executable, script, "--precision", "bf16"], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0 and "overall okay: 1" in result.stdout, \
        result.stdout + result.stderr


def test_fp32_is_unchanged_by_the_bf16_mode(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["test_gpt2.py", "--precision", "fp32"])
    assert test_gpt2.main() == 0
    out = capsys.readouterr().out
    assert "tolerances fp32: logits 0.0001, gradients 0.001, step losses 0.001" in out
    assert AUTOCAST_HEADER not in out and "\n[Backend] cpu\n" in out


def test_bf16_and_fp16_tolerances():
    expected = np.array([0.0, -0.5, 2.0])
    np.testing.assert_allclose(test_gpt2.narrow_tolerance(expected),
                               2.0 ** -5 * 2.0 + 0.079 * np.abs(expected))
    np.testing.assert_allclose(test_gpt2.narrow_tolerance(expected, "fp16"),
                               (2.0 ** -5 * 2.0 + 0.079 * np.abs(expected)) / 8)
    # the losses: llm.c's 0.05, at most 3% of the reference's drop over its 10 steps
    assert test_gpt2.narrow_loss_tolerance(None) == 0.05
    assert test_gpt2.narrow_loss_tolerance([5.27, 4.0, 0.19]) == 0.05
    assert test_gpt2.narrow_loss_tolerance(list(np.linspace(10.84, 10.81, 10))) == \
        pytest.approx(0.03 * 0.03)


# --- planted faults ---------------------------------------------------------------------

def truncated(values):
    """float32 values cut to bf16 by dropping their low 16 bits (toward zero)."""
    return (np.asarray(values, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def without_master_weights(family):
    """A bf16 model whose update rounds into bf16 by truncation and keeps no float32 master:
    updates smaller than a bf16 step are lost, as llm.c's stochastic rounding and master
    weights exist to prevent."""
    base = GPT2 if family == "gpt2" else Llama2

    class TruncatingUpdate(base):
        def update(self, *args, **kwargs):
            super().update(*args, **kwargs)
            self.params = truncated(self.params)
    return TruncatingUpdate


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def fixture_run(request):
    """A family's fixture: (config, params, state, expected losses, autocast reference)."""
    family = request.param
    script = SCRIPTS[family]
    if family == "gpt2":
        config, params = read_checkpoint(script.FIXTURE_MODEL, GPT2Config)
    else:
        model = Llama2.from_checkpoint(script.FIXTURE_MODEL)
        config, params = model.config, model.params.copy()
    state = read_debug_state(script.FIXTURE_STATE, config)
    losses = script.expected_losses(config, params, state, script.FIXTURE_STATE)
    return family, config, params, state, losses, script.autocast_reference(config, params, state)


def check(fixture_run, model, params, capsys):
    family, config, _, state, losses, autocast = fixture_run
    model.params = params
    okay = test_gpt2.check_parity(model, state, param_views(config, state.grads),
                                  lambda: losses, lambda: autocast)
    return okay, capsys.readouterr().out


def test_fault_update_without_master_weights_fails(fixture_run, capsys):
    family, config, params, *_ = fixture_run
    okay, out = check(fixture_run, without_master_weights(family)(config, precision="bf16"),
                      params, capsys)
    assert not okay and "overall okay: 0" in out
    fp32_ref, autocast = sections(out)
    assert failed(fp32_ref) == ["losses"], out   # the first step is right, training is not
    if fixture_run[5] is not None:   # the autocast reference (PyTorch is installed)
        assert failed(autocast) == ["losses"], out


def test_fault_wrong_parameters_fail(fixture_run, capsys):
    """The bf16 parameters off by about a tenth of their init's spread: every check sees it."""
    family, config, params, *_ = fixture_run
    noise = np.random.default_rng(1).normal(0.0, 0.002, params.shape).astype(np.float32)
    okay, out = check(fixture_run, (GPT2 if family == "gpt2" else Llama2)(config, precision="bf16"),
                      params + noise, capsys)
    assert not okay
    fp32_ref, _ = sections(out)
    assert {"logits", "loss", "losses"} <= set(failed(fp32_ref)), out
    assert len(failed(fp32_ref)) >= 10, out


def test_fault_a_gradient_off_fails(fixture_run, capsys):
    """One gradient element off by a tenth of its tensor's largest: that tensor alone fails.
    The element is the tensor's smallest, where the tolerance is about its absolute part
    (0.031 of the largest): at a large element the relative part can take in the whole fault."""
    family, config, params, state, losses, autocast = fixture_run
    grads = param_views(config, state.grads.copy())
    name = "qkvw" if family == "gpt2" else "wk"
    grad = grads[name].reshape(-1)
    grad[np.argmin(np.abs(grad))] += 0.1 * np.abs(grad).max()
    model = (GPT2 if family == "gpt2" else Llama2)(config, precision="bf16")
    model.params = params
    okay = test_gpt2.check_parity(model, state, grads, lambda: losses, lambda: None)
    out = capsys.readouterr().out
    assert not okay and failed(sections(out)[0]) == [name], out


# --- the references at --dtype bfloat16 ------------------------------------------------

@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_reference_writes_a_bf16_autocast_state(family, tmp_path, capsys, monkeypatch):
    needs.package("torch")
    if family == "gpt2":
        import train_gpt2_torch as ref
        argv = ["train_gpt2_torch.py", "-e", "d2", "--vocab-size", "61", "--channels", "16",
                "--heads", "2", "--max-seq-len", "8"]
    else:
        import train_llama2_torch as ref
        argv = ["train_llama2_torch.py", "-e", "d2", "--dim", "16", "--vocab-size", "61",
                "--max-seq-len", "8"]
    subprocess.run([sys.executable, *argv, "-b", "2", "-t", "5", "-o", str(tmp_path), "--name",
                    "tiny", "--dtype", "bfloat16"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    assert not (tmp_path / "tiny_debug_state.bin").exists()
    state_path = tmp_path / "tiny_debug_state_bf16.bin"
    record = json.loads((tmp_path / "tiny_debug_state_bf16.losses.json").read_text())
    assert record["dtype"] == "bfloat16" and len(record["losses"]) == 10
    if family == "gpt2":
        config, params = read_checkpoint(tmp_path / "tiny.bin", GPT2Config)
    else:
        model = Llama2.from_checkpoint(tmp_path / "tiny.bin")
        config, params = model.config, model.params.copy()
    state = read_debug_state(state_path, config)
    assert record["losses"][0] == pytest.approx(state.loss, abs=1e-6)
    logits, loss, _ = ref.reference_forward_backward(config, params, state.x, state.y)
    assert not np.array_equal(state.logits, logits)   # autocast ran: bf16 matmuls
    assert np.all(np.abs(state.logits - logits) <= test_gpt2.narrow_tolerance(logits))
    # our bf16 model against the autocast state as its first reference passes as well
    script = SCRIPTS[family]
    monkeypatch.setattr(sys, "argv", ["test.py", "--model", str(tmp_path / "tiny.bin"),
                                      "--state", str(state_path), "--precision", "bf16"])
    code = script.main()
    out = capsys.readouterr().out
    assert code == 0 and "overall okay: 1" in out, out


# --- 10 steps of bf16 training against fp32 ---------------------------------------------

SMALL_GPT2 = GPT2Config(max_seq_len=64, vocab_size=256, padded_vocab_size=256, num_layers=2,
                        num_heads=2, channels=64)
SMALL_LLAMA = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256,
                          hidden_dim=192, max_seq_len=64, shared_classifier=True)
# lr 5e-3 on one batch: the 10 losses fall by 2.5 nats or more (llm.c's 124M test: 5.1), so
# that llm.c's 0.05 is a small part of the trajectory, as it is there
TRAIN_LR, TRAIN_STEPS = 5e-3, 10


def train_losses(cls, config, precision):
    model = cls.random(config, seed=0, precision=precision)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (4, 33)).astype(np.int32)
    x, y = tokens[:, :-1].copy(), tokens[:, 1:].copy()
    losses = []
    for step in range(TRAIN_STEPS):
        losses.append(model.forward(x, y))
        model.zero_grad()
        model.backward()
        model.update(TRAIN_LR, 0.9, 0.95, 1e-8, 0.0, step + 1)
    return np.array(losses)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_bf16_training_tracks_fp32(family):
    cls, config = (GPT2, SMALL_GPT2) if family == "gpt2" else (Llama2, SMALL_LLAMA)
    fp32 = train_losses(cls, config, "fp32")
    bf16 = train_losses(cls, config, "bf16")
    assert fp32[0] - fp32[-1] > 2.5 and np.all(np.diff(fp32) < 0), fp32
    diff = np.abs(bf16 - fp32)
    assert diff.max() <= test_gpt2.BF16_LOSS_TOL, (fp32, bf16)   # llm.c's 0.05
    # and the same comparison catches a bf16 update that loses its small steps
    faulty = train_losses(without_master_weights(family), config, "bf16")
    assert np.abs(faulty - fp32).max() > test_gpt2.BF16_LOSS_TOL, (fp32, faulty)
