"""
Outlier skipping (train.py -sl, -sg; llmc/outlier_detector.py): the detector's z-scores are a
direct NumPy z-score over the window and survive a round trip through its saved state; a spike
planted in the data (one batch of random tokens after the model has learnt a repeating pattern)
has its update skipped, the parameters and AdamW's m and v after that step bit for bit those
before it, the run going on; a run stopped before the spike and resumed skips it alike and ends
with the same losses and model as one that never stopped. Tiny runs: d2 over 64 tokens, B=2,
T=16, a window of 16 steps.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from llmc.dataloader import DataLoader
from llmc.formats.llmc import read_state, write_shard
from llmc.outlier_detector import OutlierDetector

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, T, V = 2, 16, 64
SAMPLES = 40        # one epoch covers every step of these runs
SPIKE = 30          # the loop step (the console's step 31) that reads the random tokens
WINDOW = 16         # z can reach sqrt(15) = 3.87 at most
STEP_LINE = re.compile(r"^step\s+(\d+)/\d+ \| loss (\S+) \((\S+)z\) \| norm (\S+) \((\S+)z\)",
                       re.M)


# ----------------------------------------------------------------------------
# the detector

def numpy_zscores(values, window):
    """The z-score of each value against the window of the latest `window` values, itself
    included (population std); NaN until the window is full."""
    z = np.full(len(values), np.nan)
    for i in range(window, len(values)):
        w = np.array(values[i - window + 1:i + 1])
        z[i] = (values[i] - w.mean()) / w.std()
    return z


@pytest.mark.parametrize("window", [2, 16, 128])
def test_detector_is_a_zscore_over_the_window(window):
    rng = np.random.default_rng(window)
    values = list(rng.normal(3.0, 0.5, 400) + np.linspace(0, 2, 400))
    values[250] += 10   # an outlier: it enters the window and leaves it
    detector = OutlierDetector(window)
    got = np.array([detector.update(v) for v in values])
    expected = numpy_zscores(values, window)
    assert np.isnan(got[:window]).all()
    # llm.c's running sums drift from a fresh sum by rounding, most in a small window of
    # close values (2 values: z is +-1, the variance tiny against the squares summed)
    np.testing.assert_allclose(got[window:], expected[window:], rtol=1e-6, atol=1e-6)
    if window == 128:
        assert 9 < got[250] <= math.sqrt(window - 1)
    constant = OutlierDetector(window)
    assert [constant.update(1.5) for _ in range(window + 3)][window:] == [0.0] * 3


def test_detector_state_round_trips_exactly():
    rng = np.random.default_rng(1)
    values = rng.normal(0, 1, 100)
    detector = OutlierDetector(16)
    for v in values[:37]:    # full, and wrapped around once
        detector.update(v)
    restored = OutlierDetector.from_state(json.loads(json.dumps(detector.state())))
    assert [detector.update(v) for v in values[37:]] == [restored.update(v) for v in values[37:]]
    for state in ({}, dict(detector.state(), values="x"), dict(detector.state(), index=16),
                  dict(detector.state(), window=8)):
        with pytest.raises(ValueError, match="not an outlier detector's state"):
            OutlierDetector.from_state(state)


# ----------------------------------------------------------------------------
# train.py -sl / -sg

@pytest.fixture(scope="module")
def spiked(tmp_path_factory):
    """A shard of SAMPLES samples of the pattern 0..6 repeated, but the one the shuffled
    loader reads at loop step SPIKE, which is random tokens. The loader's order depends on the
    number of samples only: a probe shard whose every sample holds its own index tells it."""
    d = tmp_path_factory.mktemp("spiked")
    BT = B * T
    write_shard(d / "probe.bin", np.append(np.repeat(np.arange(SAMPLES), BT), 0))
    probe = DataLoader(str(d / "probe.bin"), B, T, shuffle=True)
    spike_sample = [int(probe.next_batch()[0][0, 0]) for _ in range(SPIKE + 1)][SPIKE]
    tokens = np.arange(SAMPLES * BT + 1) % 7
    tokens[spike_sample * BT:(spike_sample + 1) * BT + 1] = \
        np.random.default_rng(0).integers(0, V, BT + 1)
    write_shard(d / "train.bin", tokens)
    return str(d / "train.bin")


def run_train(data, *args, status=0):
    common = ["-e", "d2", "--vocab-size", V, "-b", B, "-t", T, "-i", data, "-j", data, "-m", 0,
              "-s", 0, "-l", 3e-3, "--outlier-window", WINDOW]
    run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *map(str, common),
                          *map(str, args)], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, LLMPYX_CACHE_DIR="/nonexistent-llmpyx-cache"))
    assert run.returncode == status, run.stdout[-2000:] + run.stderr
    assert "Traceback" not in run.stderr
    return run


def steps(stdout):
    return {int(m.group(1)): m.groups()[1:] for m in STEP_LINE.finditer(stdout)}


def skips(stdout):
    return re.findall(r"^skipping update due to (\w+) z-score of (\S+)$", stdout, re.M)


def checkpoint(out, step):
    """(model file bytes, m, v) of the checkpoint at step."""
    model = (out / f"model_{step:08d}.bin").read_bytes()
    _, m, v, _ = read_state(str(out / f"state_{step:08d}_00000.bin"), (len(model) - 1024) // 4)
    return model, m, v


def test_a_loss_spike_is_skipped_bit_for_bit_and_resumes(spiked, tmp_path):
    last = SPIKE + 3
    straight = tmp_path / "straight"
    run = run_train(spiked, "-sl", 3, "-x", last, "-n", 1, "-nk", 4, "-o", straight, "--json-log")
    assert skips(run.stdout) == [("loss", skips(run.stdout)[0][1])]
    assert float(skips(run.stdout)[0][1]) > 3
    lines = steps(run.stdout)
    assert sorted(lines) == list(range(1, last + 1))          # the run goes on past it
    assert float(lines[SPIKE + 1][0]) > 20 * float(lines[SPIKE][0])
    assert all(z == "+nan" for _, z, _, _ in (lines[s] for s in range(1, WINDOW + 1)))
    # the checkpoints around the skipped update: the same model, m and v, bit for bit
    before, after, next_ = (checkpoint(straight, s) for s in (SPIKE, SPIKE + 1, SPIKE + 2))
    assert before[0] == after[0] and before[0] != next_[0]
    assert np.array_equal(before[1], after[1]) and np.array_equal(before[2], after[2])
    assert not np.array_equal(after[1], next_[1])
    log = (straight / "main.log").read_text()
    assert re.search(rf"^s:{SPIKE} skip_lossz:\d+\.\d{{4}}$", log, re.M)
    records = [json.loads(line) for line in (straight / "log.jsonl").read_text().splitlines()]
    skip = [r for r in records if r["type"] == "skip"]
    assert len(skip) == 1 and skip[0]["step"] == SPIKE and skip[0]["reason"] == "loss"
    assert skip[0]["threshold"] == 3 and skip[0]["z"] > 3
    # a side file per checkpoint, which -nk rotates with the others
    assert sorted(p.name for p in straight.glob("outliers_*")) == [
        f"outliers_{s:08d}.json" for s in range(SPIKE, last + 1)]

    # resumed at step 20 (the window full and wrapped around) past the spike: a run that went
    # on past it but stopped in its last checkpoint (no DONE), whose logs then hold the lines
    # of steps 20-32, the skip's too, which are not there twice
    resumed = tmp_path / "resumed"
    first = run_train(spiked, "-sl", 3, "-x", last, "-n", 20, "-o", resumed, "--json-log")
    os.remove(resumed / f"DONE_{last:08d}")
    shutil.copytree(resumed, tmp_path / "without")
    shutil.copytree(resumed, tmp_path / "window")
    second = run_train(spiked, "-sl", 3, "-x", last, "-n", 20, "-o", resumed, "-y", 1,
                       "--json-log")
    assert "resuming from the checkpoint at step 20" in second.stdout
    assert {s: line for s, line in steps(first.stdout).items() if s <= 20} | \
        steps(second.stdout) == lines
    assert skips(second.stdout) == skips(run.stdout)
    assert (resumed / f"model_{last:08d}.bin").read_bytes() == \
        (straight / f"model_{last:08d}.bin").read_bytes()
    assert (resumed / "main.log").read_text() == log
    assert [r for r in map(json.loads, (resumed / "log.jsonl").read_text().splitlines())
            if r["type"] == "skip"] == skip

    # a checkpoint without the windows: said, and they start empty; another window: refused
    os.remove(tmp_path / "without" / "outliers_00000020.json")
    note = run_train(spiked, "-sl", 3, "-x", 21, "-o", tmp_path / "without", "-y", 1).stderr
    assert "the checkpoint at step 20 holds no outlier windows" in note
    error = run_train(spiked, "-sl", 3, "-x", 21, "-o", tmp_path / "window", "-y", 1,
                      "--outlier-window", 8, status=1).stderr.strip()
    assert "other settings: --outlier-window 16 (this run: 8)" in error   # run.json says so
    os.remove(tmp_path / "window" / "run.json")   # else (an older run) the windows' file does
    error = run_train(spiked, "-sl", 3, "-x", 21, "-o", tmp_path / "window", "-y", 1,
                      "--outlier-window", 8, status=1).stderr.strip()
    assert error == (f"train.py: error: -y 1: {tmp_path / 'window' / 'outliers_00000020.json'} "
                     f"holds windows of 16 steps, --outlier-window is 8: resume with "
                     f"--outlier-window 16")
    run_train(spiked, "-x", 1, "-o", straight, "--overwrite")   # deletes them with the run
    assert not list(straight.glob("outliers_*"))


def test_a_gradient_spike_is_skipped(spiked, tmp_path):
    run = run_train(spiked, "-sg", 3, "-x", SPIKE + 1)
    assert [reason for reason, _ in skips(run.stdout)] == ["grad"]
    assert "skip update gradz     | 3.000000" in run.stdout
    off = run_train(spiked, "-x", SPIKE + 1)   # off: the spike's update is made
    assert skips(off.stdout) == [] and "z)" not in off.stdout


@pytest.mark.parametrize("flags, message", [
    (["-sl", -1], "argument -sl: must be a z-score >= 0"),
    (["-sg", "nan"], "argument -sg: must be a z-score >= 0"),
    (["--outlier-window", 1], "argument --outlier-window: must be at least 2"),
])
def test_bad_outlier_flags(spiked, flags, message):
    line = run_train(spiked, *flags, status=2).stderr.strip()
    assert line.startswith("train.py: error: ") and message in line, line


def test_a_bad_outliers_file_is_one_line(tmp_path):
    import types
    import train
    from llmc.formats import FormatError
    args = types.SimpleNamespace(output_dir=str(tmp_path), outlier_window=WINDOW,
                                 skip_lossz=3.0, skip_gradz=0.0)
    path = tmp_path / "outliers_00000005.json"
    good = OutlierDetector(WINDOW).state()
    for content, message in (("{", "not the outlier detectors' state (Expecting"),
                             (json.dumps({"loss": good}), "expected the streams loss, grad_norm"),
                             (json.dumps({"loss": good, "grad_norm": {"window": 16}}),
                              "not an outlier detector's state ('values')")):
        path.write_text(content)
        with pytest.raises(FormatError, match=re.escape(message)) as e:
            train.resumed_outliers(args, 5)
        assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)
    path.write_text(json.dumps({"loss": good, "grad_norm": good}))
    assert set(train.resumed_outliers(args, 5)) == {"loss", "grad_norm"}
