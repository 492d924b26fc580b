"""
The efficiency report (llmc/report.py): train.py --json-log on a small random GPT-2 (d2) writes
JSON lines that parse and add up (tokens/s from the batch and ms/step, TFLOPS from
llmc/dry_run.py's FLOPs, the kernel groups and "other" summing to the step time, the losses those
of main.log), and the end-of-run report is their mean, with --profile the time per table entry
adding up to the groups' (and printed as a table); the compile-time hook and the peak.
"""
import json
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from llmc.formats.llmc import write_shard
from llmc.dry_run import flops_plan
from llmc.report import Efficiency, device_peak
from train_gpt2 import GPT2Config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    write_shard(d / "train_000.bin", rng.integers(0, 50257, 6000))
    write_shard(d / "val_000.bin", rng.integers(0, 50257, 2000))
    return types.SimpleNamespace(train=str(d / "train_000.bin"), val=str(d / "val_000.bin"))


def run_train(*args, status=0):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, LLMPYX_CACHE_DIR="/nonexistent-llmpyx-cache"))
    assert run.returncode == status, run.stderr
    assert "Traceback" not in run.stderr
    return run


def read_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def test_json_log_adds_up(data, tmp_path):
    B, T, total = 2, 32, 128   # grad_accum 2: tokens/s must count both micro-batches
    out = tmp_path / "out"
    run = run_train("-e", "d2", "-b", B, "-t", T, "-d", total, "-i", data.train, "-j", data.val,
                    "-m", 1, "-v", 2, "-s", 0, "-x", 3, "-o", out, "--json-log",
                    "--profile")
    records = read_records(out / "log.jsonl")
    kinds = [r["type"] for r in records]
    assert kinds == ["run", "val", "train", "train", "val", "train", "val", "report"]
    head, train, val, report = records[0], records[2:-1], records[1:-1], records[-1]
    train = [r for r in train if r["type"] == "train"]
    val = [r for r in val if r["type"] == "val"]
    assert [r["step"] for r in train] == [0, 1, 2] and [r["step"] for r in val] == [0, 2, 3]

    # the FLOPs are llmc/dry_run.py's: forward + backward of total/(B*T) micro-batches
    from train_gpt2 import GPT2
    config = GPT2Config.from_depth(2, vocab_size=50257)
    per_batch = flops_plan(GPT2, config, B, T)
    assert head["flops_per_step"] == (per_batch["forward"] + per_batch["backward"]) * 2
    assert head["tokens_per_step"] == total and head["backend"] == "profile:cpu"
    assert head["peak_tflops"] > 0 and head["max_steps"] == 3

    for r in train:
        assert close(r["tokens_per_s"], total * 1000 / r["ms"])
        assert close(r["tflops"], head["flops_per_step"] / r["ms"] / 1e9)
        assert close(r["peak_percent"], 100 * r["tflops"] / head["peak_tflops"])
        assert r["compile_ms"] == 0 and r["compile_share"] == 0   # the CPU compiles nothing
        groups = r["groups_ms"]
        assert {"core", "linear", "gpt2", "other"} <= set(groups) <= {"core", "linear", "gpt2",
                                                                       "classifier", "flash", "other"}
        assert all(t > 0 for g, t in groups.items() if g != "other")
        assert close(sum(groups.values()), r["ms"])
        assert 0 <= groups["other"] < r["ms"]   # the kernels ran within the step

    # the losses are main.log's (which rounds them)
    with open(out / "main.log") as f:
        logged = [line.split() for line in f]
    trl = {int(w[0][2:]): float(w[1][4:]) for w in logged if w[1].startswith("trl:")}
    tel = {int(w[0][2:]): float(w[1][4:]) for w in logged if w[1].startswith("tel:")}
    assert trl == {r["step"]: round(r["loss"], 4) for r in train}
    assert tel == {r["step"]: round(r["loss"], 4) for r in val}

    # the report: means over the steps after the first
    timed = train[1:]
    mean_ms = sum(r["ms"] for r in timed) / len(timed)
    assert report["steps"] == 3 and report["timed_steps"] == 2
    assert close(report["mean_ms"], mean_ms)
    assert close(report["tokens_per_s"], total * 1000 / mean_ms)
    assert close(sum(report["group_share"].values()), 1.0)

    # --profile: each entry's mean per step, under its group, the slowest first
    from accel.spec import ENTRY_GROUPS
    profile = report["profile"]
    assert list(profile) == sorted(profile, key=lambda e: -profile[e]["ms"])
    for group, share in report["group_share"].items():
        if group != "other":
            assert close(sum(e["share"] for e in profile.values() if e["group"] == group), share)
    for entry, e in profile.items():
        assert entry in ENTRY_GROUPS[e["group"]] and close(e["share"], e["ms"] / mean_ms)
        assert e["pass"] == ("forward" if entry.endswith("_forward") else
                             "backward" if entry.endswith("_backward") else "other")
    # 2 micro-batches of 2 layers' 4 matmuls and the head's, forward and backward
    assert profile["matmul_forward"]["calls"] == profile["matmul_backward"]["calls"] == 18
    assert profile["adamw_update"]["calls"] >= 1
    lines = run.stdout.splitlines()
    at = lines.index("profile of profile:cpu: the table's entries, mean per step over 2 timed steps")
    table = lines[at:]
    assert any(line.split()[:2] == ["matmul_forward", "18"] for line in table)
    assert any(line.split()[:2] == ["linear", "(group)"] for line in table)
    profiled_ms = sum(e["ms"] for e in profile.values())
    assert any(line.startswith(f"  profiled entries: {profiled_ms:.2f} ms of {mean_ms:.2f} ms a "
                               f"step; the rest,") for line in table)
    assert "efficiency report" in run.stdout and "mean ms/step" in run.stdout
    assert f"| mean ms/step          | {mean_ms:.2f}" in run.stdout


def test_json_log_to_file_and_peak_flag(data, tmp_path):
    path = tmp_path / "run.jsonl"
    run_train("-e", "d1", "-b", 2, "-t", 16, "-i", data.train, "-j", data.val, "-m", 0,
              "-s", 0, "-x", 1, "--json-log", path, "--peak-tflops", 2.5)
    head, step, report = read_records(path)
    assert head["peak_tflops"] == 2.5 and head["peak_source"] == "--peak-tflops"
    assert "groups_ms" not in step and not head["profile"]   # no --profile
    assert "profile" not in report
    assert close(step["peak_percent"], 100 * step["tflops"] / 2.5)
    assert report["steps"] == report["timed_steps"] == 1   # one step: it is its own mean


def test_json_log_needs_a_file_or_dir(data):
    run = run_train("-e", "d1", "--json-log", status=2)
    assert run.stderr.count("\n") == 1 and "add -o DIR" in run.stderr


class FakeFamily:
    """A model class for flops_plan: one layer of 1 GFLOP a token."""
    @classmethod
    def num_layers_of(cls, config):
        return 1

    @classmethod
    def flops_per_token(cls, config, T):
        return dict(layer_matmul=1e9, layer_attention=0.0, head_matmul=0.0)


def test_compile_hook_and_peak():
    # an ANE-like backend, wrapped by an instrument (which forwards both, as
    # accel/instrument.pyx's wrappers do): its compile_seconds and peak_tflops count
    target = types.SimpleNamespace(name="ane", host_visible=False, compile_seconds=0.0,
                                   peak_tflops=10.0)

    class Wrapper:
        name, host_visible = "check:ane", False
        peak_tflops = property(lambda self: target.peak_tflops)
        compile_seconds = property(lambda self: target.compile_seconds)

    backend = Wrapper()
    model = FakeFamily()
    model.backend, model.config, model.recompute = backend, None, "all"
    e = Efficiency(model, B=1, T=4, total_batch_size=4)
    assert e.flops_per_step == 3 * 4e9 and e.peak_tflops == 10.0
    for compile_s in (0.05, 0.0):   # the first step compiles for 50 ms of its 200
        e.begin()
        target.compile_seconds += compile_s
        r = e.end(0.2)
        assert close(r["compile_ms"], compile_s * 1e3)
        assert close(r["compile_share"], compile_s / 0.2)
    s = e.summary()
    assert close(s["compile_share"], 0.05 / 0.4) and close(s["mean_ms"], 200)
    assert close(s["tflops"], 12e9 / 0.2 / 1e12) and close(s["peak_percent"], 100 * 0.06 / 10)
    assert device_peak(target, None) == (10.0, "ane's peak_tflops")
    gpu = types.SimpleNamespace(name="gpu", host_visible=False, peak_tflops=None)
    assert device_peak(gpu)[0] is None


def test_a_bf16_run_counts_against_the_bf16_peak(data, tmp_path):
    """--precision bf16 on the CPU: the peak is the bf16 GEMM's rate (kernels.matmul_bf16),
    measured as the sgemm's is at fp32, and the run's JSON log says its precision."""
    from accel.backend import get_backend
    from kernels.blas import BF16_LIBRARY
    peak, source = device_peak(get_backend("cpu", "bf16"))
    assert peak > 0 and source == (f"kernels.matmul_bf16's bf16 GEMM ({BF16_LIBRARY}), "
                                   f"measured now")
    assert device_peak(get_backend("cpu"))[1] == "kernels.matmul's sgemm, measured now"
    path = tmp_path / "run.jsonl"
    run = run_train("-e", "d1", "-b", 2, "-t", 16, "-i", data.train, "-j", data.val, "-m", 0,
                    "-s", 0, "-x", 1, "--json-log", path, "--precision", "bf16")
    head, step, report = read_records(path)
    assert head["precision"] == "bf16" and head["peak_source"] == source
    assert close(step["peak_percent"], 100 * step["tflops"] / head["peak_tflops"])
    assert f"| peak from             | {source}" in run.stdout
