"""Half precision (fp16, the GPUs' and Metal's) on the CPU, the oracle check: compares the GPUs'
fp16 tables with: the conversions against NumPy's float16, dynamic loss scaling (underflow
without it, the overflow that skips a step and halves the scale, and a planted loop that
applies it anyway), GPT-2 at fp16 against fp32, both families against the PyTorch
reference (test_gpt2.py's and test_llama2.py's fp16 tolerances, with planted faults), and a
run that resumes bit for bit with its loss scale.  (tests/test_bf16.py holds every fp16 entry
against the fp32 entry rounded once, check:cpu at fp16 with a planted truncating store, and
Llama at fp16 against fp32.)"""
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import test_gpt2
from kernels import fp16
from llmc.formats import param_views
from llmc.formats.llmc import read_checkpoint, read_debug_state, read_training_state
from llmc.model import LOSS_SCALE_GROWTH_STEPS, LOSS_SCALE_INITIAL
from test_bf16 import batch, tiny_gpt2, train as train_steps
from test_bf16_parity import failed
from test_train import STEP_LINE, data, run_train, state_header, step_losses  # noqa: F401 (data: a fixture)
from train_gpt2 import GPT2, GPT2Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_conversions_are_numpys_round_to_nearest_even():
    every = np.arange(2 ** 16, dtype=np.uint16).view(np.float16)
    nan = np.isnan(every)
    wide = fp16.from_fp16(every)
    assert np.array_equal(wide[~nan], every[~nan].astype(np.float32)) and np.isnan(wide[nan]).all()
    assert np.array_equal(fp16.to_fp16(wide[~nan]).view(np.uint16), every[~nan].view(np.uint16))
    # random floats of every exponent, every tie between neighbouring halves, the edges:
    # 65520 (half-way to 65536) rounds to even, inf; 2^-25 (half the smallest subnormal) to 0
    finite = np.sort(every[~nan & np.isfinite(every)].astype(np.float64))
    ties = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)
    bits = np.random.default_rng(0).integers(0, 2 ** 32, 200_000, dtype=np.uint64)
    edges = np.float32([65504, 65519.996, 65520, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, -0.0,
                        np.inf, -np.inf, np.nan])
    x = np.concatenate([bits.astype(np.uint32).view(np.float32), ties, edges])
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16)
    got = fp16.to_fp16(x)
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), x[~same][:5]


# --- the models ----------------------------------------------------------------------------

def test_gpt2_at_fp16_tracks_fp32_keeps_master_weights_and_scales_its_loss():
    tokens = batch(97)
    fp32, half = tiny_gpt2("cpu", "fp32"), tiny_gpt2("cpu", "fp16")
    assert (half.precision, half.itemsize, half.loss_scale) == ("fp16", 2, LOSS_SCALE_INITIAL)
    assert fp32.loss_scale == 1.0
    losses32, losses16 = train_steps(fp32, 5, tokens), train_steps(half, 5, tokens)
    assert np.allclose(losses16, losses32, atol=2e-3), (losses16, losses32)
    master, run = half.params, half.params_as_run()
    assert not np.array_equal(master, run)
    assert np.array_equal(run, master.astype(np.float16).astype(np.float32))   # to nearest
    # the gradients are the scaled loss's; grad_norm divides the scale out
    assert half.grad_norm() == pytest.approx(fp32.grad_norm(), rel=0.02)
    assert np.linalg.norm(half.grads) == pytest.approx(half.loss_scale * half.grad_norm(), rel=1e-5)


def test_without_loss_scaling_small_gradients_vanish_in_fp16():
    """A batch of 256 positions makes each position's loss gradient 1/256; through weights a
    tenth of GPT-2's init, the layers' activation gradients fall below fp16's smallest normal
    (2^-14) and subnormal (2^-24): unscaled, whole tensors of parameter gradients are lost
    (measured: LayerNorm's biases 96% and 98% off, 67% of qkvw's zero); at the default scale
    every tensor is within 0.1% of fp32's."""
    config = GPT2Config.from_depth(1, max_seq_len=128, vocab_size=97)
    tokens = batch(97, B=2, T=128)
    grads = {}
    for precision, scale in (("fp32", 1.0), ("fp16", LOSS_SCALE_INITIAL), ("fp16", 1.0)):
        model = GPT2.random(config, seed=5, precision=precision)
        model.params = model.params * np.float32(0.1)
        model.set_loss_scale(scale)
        model.zero_grad()
        model.forward(*tokens)
        model.backward()
        grads[precision, scale] = {name: g / np.float32(scale)
                                   for name, g in model.grad_tensors().items()}
    exact = grads["fp32", 1.0]

    def worst(g):   # the largest error of a tensor, relative to its largest gradient
        return max(np.abs(g[k] - exact[k]).max() / np.abs(exact[k]).max() for k in exact)
    assert worst(grads["fp16", LOSS_SCALE_INITIAL]) < 0.002
    assert worst(grads["fp16", 1.0]) > 0.5
    assert np.mean(grads["fp16", 1.0]["qkvw"] == 0) > 0.5 and np.all(exact["qkvw"] != 0)


def test_the_loss_scale_halves_on_overflow_and_doubles_after_its_steps():
    model = tiny_gpt2("cpu", "fp16")
    assert model.gradients_overflowed(math.inf) and model.gradients_overflowed(math.nan)
    assert not model.gradients_overflowed(1.0)
    assert model.adjust_loss_scale(False) and model.loss_scale == LOSS_SCALE_INITIAL / 2
    for _ in range(LOSS_SCALE_GROWTH_STEPS - 1):
        assert not model.adjust_loss_scale(True)
    assert model.adjust_loss_scale(True) and model.loss_scale == LOSS_SCALE_INITIAL
    model.set_loss_scale(1.0)
    model.adjust_loss_scale(False)
    assert model.loss_scale == 1.0   # never below 1
    fp32 = tiny_gpt2("cpu", "fp32")
    assert not fp32.gradients_overflowed(math.inf) and not fp32.adjust_loss_scale(False)
    with pytest.raises(ValueError, match="a fp32 model has no loss scale"):
        fp32.set_loss_scale(2.0)


# --- test_gpt2.py and test_llama2.py at fp16 -------------------------------------------------

@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_scripts_pass_at_fp16(family, capsys, monkeypatch):
    script = {"gpt2": test_gpt2, "llama": __import__("test_llama2")}[family]
    monkeypatch.setattr("sys.argv", [f"{script.__name__}.py", "--precision", "fp16"])
    code = script.main()
    out = capsys.readouterr().out
    assert code == 0 and "overall okay: 1" in out, out
    assert "tolerances fp16" in out and not failed(out.splitlines())


@pytest.fixture(scope="module")
def gpt2_fixture():
    config, params = read_checkpoint(test_gpt2.FIXTURE_MODEL, GPT2Config)
    state = read_debug_state(test_gpt2.FIXTURE_STATE, config)
    losses = test_gpt2.expected_losses(config, params, state, test_gpt2.FIXTURE_STATE)
    return config, params, state, losses


def parity(model, params, fixture, grads=None, capsys=None):
    config, _, state, losses = fixture
    model.params = params
    okay = test_gpt2.check_parity(model, state, grads or param_views(config, state.grads),
                                  lambda: losses)
    return okay, capsys.readouterr().out


def test_fp16_tolerances_catch_parameters_off_by_a_hundredth_of_their_spread(gpt2_fixture, capsys):
    """Parameters off by noise of 2e-4 (a hundredth of GPT-2's init spread): at fp16 every
    comparison fails (measured: logits 6x their tolerance, each gradient 1.4x to 7x), where
    bf16's tolerances see only the losses."""
    config, params, *_ = gpt2_fixture
    noise = np.random.default_rng(1).normal(0.0, 2e-4, params.shape).astype(np.float32)
    okay, out = parity(GPT2(config, precision="fp16"), params + noise, gpt2_fixture,
                       capsys=capsys)
    assert not okay and len(failed(out.splitlines())) == 2 + 16 + 1, out


def test_fp16_tolerances_catch_a_gradient_off(gpt2_fixture, capsys):
    """One gradient element off by 2% of its tensor's largest (five times fp16's floor)."""
    config, params, state, _ = gpt2_fixture
    grads = param_views(config, state.grads.copy())
    grad = grads["qkvw"].reshape(-1)
    grad[np.argmin(np.abs(grad))] += 0.02 * np.abs(grad).max()
    okay, out = parity(GPT2(config, precision="fp16"), params, gpt2_fixture, grads, capsys)
    assert not okay and failed(out.splitlines()) == ["qkvw"], out


# --- train.py --precision fp16 -----------------------------------------------------------------

def fp16_run(data, *args):
    return ["-e", "d2", "-b", 4, "-t", 32, "-i", data.train, "-j", data.val, "-m", 0, "-s", 0,
            "-l", 1e-3, "--precision", "fp16", *args]


def test_overflow_skips_the_update_and_halves_the_scale(data, tmp_path):
    """Started at 2^26, a d2 GPT-2's gradients overflow fp16 (inf, NaN): each such step is
    skipped and halves the scale, until the scale fits (2^20 or 2^21 on this model); then it
    trains, its gradients finite."""
    out = run_train(*fp16_run(data, "-x", 10, "--loss-scale", 2 ** 26, "-o", tmp_path / "o"))
    scales = re.findall(r"skipping update: the fp16 gradients overflowed; loss scale now 2\^(\d+)",
                        out)
    assert 2 <= len(scales) <= 8 and [int(s) for s in scales] == list(range(25, 25 - len(scales), -1))
    steps = [m.groups() for m in STEP_LINE.finditer(out)]
    assert all(math.isfinite(float(loss)) for _, _, loss, *_ in steps), out
    norms = [float(norm) for _, _, _, norm, *_ in steps]
    assert all(math.isnan(n) for n in norms[:len(scales)]), out
    assert all(map(math.isfinite, norms[len(scales):])) and norms[-1] < norms[len(scales)], out
    assert (tmp_path / "o" / "main.log").read_text().count("overflow_loss_scale:") == len(scales)


UNCHECKED_RUN = """
import sys, train, train_gpt2
class Unchecked(train_gpt2.GPT2):   # the planted fault: no step's gradients ever overflowed
    def gradients_overflowed(self, grad_norm):
        return False
train.model_class = lambda args: Unchecked
train.run(sys.argv[1:])
"""


def test_planted_a_loop_that_applies_overflowed_gradients_breaks_the_run(data):
    """The same run with the overflow check planted out (gradients_overflowed always False):
    inf and NaN gradients reach AdamW and the parameters become NaN."""
    run = subprocess.run([sys.executable, "-c", UNCHECKED_RUN,
                          *map(str, fp16_run(data, "-x", 3, "--loss-scale", 2 ** 26))],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "skipping update" not in run.stdout
    losses = step_losses(run.stdout)
    assert math.isfinite(float(losses[1])) and math.isnan(float(losses[3])), run.stdout


def test_resume_at_fp16_is_bit_identical_and_keeps_the_loss_scale(data, tmp_path):
    common = fp16_run(data, "--loss-scale", 2 ** 22)
    out, straight_dir = tmp_path / "out", tmp_path / "straight"
    first = run_train(*common, "-x", 2, "-n", 2, "-o", out)
    resumed = run_train(*common, "-x", 4, "-n", 2, "-o", out, "-y", 1)
    straight = run_train(*common, "-x", 4, "-n", 2, "-o", straight_dir)
    assert "skipping update" in first   # the scale changed before the checkpoint
    assert {**step_losses(first), **step_losses(resumed)} == step_losses(straight)
    for name in ("model_00000004.bin", "state_00000004_00000.bin"):
        assert (out / name).read_bytes() == (straight_dir / name).read_bytes(), name
    header = state_header(out / "state_00000002_00000.bin")
    assert header[4] == 1 and header[12] > 0   # master weights; 1 + log2 of the loss scale
    n = GPT2.from_checkpoint(str(out / "model_00000002.bin")).num_parameters
    assert read_training_state(str(out / "state_00000002_00000.bin"), n).loss_scale == \
        2.0 ** (header[12] - 1) < 2 ** 22
    assert re.search(r"^\| precision\s+\| fp16, scaled loss \(float32 master, grads, AdamW\)\s+\|$",
                     straight, re.M)
