"""End-to-end parity: test_gpt2.py against debug states written by the PyTorch reference, and
proof that it fails when any logit, the loss or any gradient tensor is off by more than its
tolerance."""
import os
import subprocess
import sys

import numpy as np
import pytest

import needs
import test_gpt2
from llmc.formats import param_views
from llmc.formats.llmc import read_checkpoint, read_debug_state, write_debug_state
from train_gpt2 import GPT2Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_check(model, state, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["test_gpt2.py", "--model", str(model), "--state", str(state)])
    code = test_gpt2.main()
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def reference_d2(tmp_path_factory):
    """A random d2 GPT-2 with the real vocab and a B=3, T=13 debug state from the reference."""
    needs.package("torch")
    out = tmp_path_factory.mktemp("ref")
    subprocess.run([sys.executable, os.path.join(ROOT, "train_gpt2_torch.py"), "-e", "d2",
                    "-b", "3", "-t", "13", "-o", str(out), "--name", "d2"], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    return out / "d2.bin", out / "d2_debug_state.bin"


def test_fixture_passes(capsys, monkeypatch):
    code, out = run_check(test_gpt2.FIXTURE_MODEL, test_gpt2.FIXTURE_STATE, capsys, monkeypatch)
    assert code == 0, out
    assert "overall okay: 1" in out and "NOT OK" not in out


def test_reference_d2_passes(reference_d2, capsys, monkeypatch):
    model, state = reference_d2
    code, out = run_check(model, state, capsys, monkeypatch)
    assert code == 0, out
    assert out.count(" OK ") == 19  # logits, loss, 16 gradients, 10-step losses
    assert "step 9: loss" in out


def test_bf16_checkpoint_loads_and_runs(reference_d2, capsys, monkeypatch):
    model, state = reference_d2
    bf16 = model.with_name("d2_bf16.bin")
    code, out = run_check(bf16, state, capsys, monkeypatch)
    assert "step 9: loss" in out  # bf16 weights differ from the fp32 state: only that it runs


@pytest.fixture(scope="module")
def reference_losses_d2(reference_d2):
    model, state_path = reference_d2
    config, params = read_checkpoint(model, GPT2Config)
    state = read_debug_state(state_path, config)
    return test_gpt2.expected_losses(config, params, state, str(state_path))


@pytest.fixture
def known_losses(reference_losses_d2, monkeypatch):
    """The perturbation tests change logits or gradients only: they reuse the reference's step
    losses instead of running PyTorch again each time."""
    monkeypatch.setattr(test_gpt2, "expected_losses", lambda *args: reference_losses_d2)


def perturbed_state(reference_d2, tmp_path, change):
    model, state_path = reference_d2
    config, _ = read_checkpoint(model, GPT2Config)
    state = read_debug_state(state_path, config)
    change(state, config)
    path = tmp_path / "perturbed_debug_state.bin"
    write_debug_state(path, state.x, state.y, state.logits, state.loss, state.grads)
    return model, path


def test_one_logit_off_fails(reference_d2, known_losses, tmp_path, capsys, monkeypatch):
    def change(state, config):
        state.logits[1, 5, 123] += 3 * test_gpt2.LOGITS_TOL * max(1.0, abs(state.logits[1, 5, 123]))
    code, out = run_check(*perturbed_state(reference_d2, tmp_path, change), capsys, monkeypatch)
    assert code != 0 and "overall okay: 0" in out
    assert "logits     NOT OK  max abs err" in out and "1 of" in out


def test_loss_off_fails(reference_d2, known_losses, tmp_path, capsys, monkeypatch):
    def change(state, config):
        state.loss += 3 * test_gpt2.LOGITS_TOL * max(1.0, abs(state.loss))
    code, out = run_check(*perturbed_state(reference_d2, tmp_path, change), capsys, monkeypatch)
    assert code != 0 and "loss       NOT OK" in out


@pytest.mark.parametrize("tensor", ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw",
                                    "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw",
                                    "fcprojb", "lnfw", "lnfb"])
def test_one_gradient_off_fails(reference_d2, known_losses, tmp_path, capsys, monkeypatch, tensor):
    def change(state, config):
        grad = param_views(config, state.grads)[tensor].reshape(-1)  # a view into state.grads
        grad[grad.size // 2] += 2 * test_gpt2.GRAD_TOL * np.abs(grad).max()
    code, out = run_check(*perturbed_state(reference_d2, tmp_path, change), capsys, monkeypatch)
    assert code != 0
    failed = [line.split()[0] for line in out.splitlines() if "NOT OK" in line]
    assert failed == [tensor], out


def test_bad_file_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\0" * 2048)
    result = subprocess.run([sys.executable, "test_gpt2.py", "--model", str(bad)], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0], result.stderr
