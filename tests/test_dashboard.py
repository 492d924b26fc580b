"""
The live dashboard (dev/dashboard.py), headless: a recorded JSON log (tests/fixtures/dashboard,
a 12-step d1 run of train.py --json-log --profile-groups) drawn on a recording rich Console of
a fixed width; following a log that is still being written; the sample of a checkpoint equal
to the one train.py printed from the same model; --run starting a run and following it.
"""
import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

rich = pytest.importorskip("rich")
from rich.console import Console  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from dev import dashboard  # noqa: E402

FIXTURE = os.path.join(HERE, "fixtures", "dashboard", "log.jsonl")


def text_of(renderable, width=100):
    console = Console(record=True, file=io.StringIO(), width=width)
    console.print(renderable)
    return console.export_text()


def records():
    with open(FIXTURE) as f:
        return [json.loads(line) for line in f]


def test_sparkline():
    assert dashboard.sparkline([1, 2, 3, 4, 5, 6, 7, 8], 20) == "▁▂▃▄▅▆▇█"
    assert dashboard.sparkline([5, 5, 5], 20) == "▁▁▁"
    assert dashboard.sparkline([], 20) == ""
    assert dashboard.sparkline([1, float("nan"), 2], 20) == "▁█"
    squeezed = dashboard.sparkline(list(range(100)) + [0] * 100, 10)   # up, then flat at 0
    assert len(squeezed) == 10 and squeezed[4] == "█" and squeezed[5:] == "▁" * 5


def test_recorded_log(tmp_path):
    log = tmp_path / "log.jsonl"
    shutil.copy(FIXTURE, log)
    d = dashboard.Dashboard(str(log), background=False)
    assert d.poll() and d.done()
    text = text_of(d.render(100))
    rs = records()
    train = [r for r in rs if r["type"] == "train"]
    val = [r for r in rs if r["type"] == "val"]
    last, report = train[-1], rs[-1]
    assert "gpt2 random d1 (seed 42) on profile:cpu, B=2 T=32" in text
    assert "step 12/12" in text and f"lr {last['lr']:.2e}" in text
    assert f"loss {last['loss']:.4f}" in text and f"val loss {val[-1]['loss']:.4f}" in text
    assert dashboard.sparkline([r["loss"] for r in train], 70) in text
    assert dashboard.sparkline([r["loss"] for r in val], 70) in text
    assert dashboard.sparkline([r["ms"] for r in train[1:]], 70) in text
    assert f"{last['tokens_per_s']:,.0f} tok/s" in text
    assert f"({last['peak_percent']:.1f}% of peak)" in text
    gpt2_share = 100 * last["groups_ms"]["gpt2"] / last["ms"]
    assert f"gpt2 {gpt2_share:.0f}%" in text and "compile 0.0%" in text
    assert re.search(rf"finished +mean {report['mean_ms']:.1f} ms/step", text)
    assert "no checkpoint yet" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_follows_a_growing_log(tmp_path):
    log = tmp_path / "log.jsonl"
    with open(FIXTURE, "rb") as f:
        data = f.read()
    cut = data.index(b'"type": "train"', data.index(b'"type": "train"') + 1) + 5  # mid-line
    follower = dashboard.LogFollower(str(log))
    assert follower.poll() == []   # not written yet
    waiting = dashboard.Dashboard(str(log), gen_tokens=0)
    assert not waiting.poll() and "waiting for the first step" in text_of(waiting.render())
    log.write_bytes(data[:cut])
    first = follower.poll()
    assert [r["type"] for r in first] == ["run", "val", "train"]   # the partial line waits
    with open(log, "ab") as f:
        f.write(data[cut:])
    assert first + follower.poll() == records()
    assert follower.poll() == []


def run_train(*args):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=600,
                         )
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.fixture
def shards(tmp_path):
    """Llama data with its tokenizer.bin beside (llama2.c's: <unk> <s> </s>, 256 bytes, words),
    so samples decode offline; the flags of a tiny Llama on it."""
    import numpy as np
    from llmc.formats.llama2c import write_llama2c_tokenizer
    from llmc.formats.llmc import write_shard
    words = [f" w{i}".encode() for i in range(41)]
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    write_llama2c_tokenizer(tmp_path / "tokenizer.bin", pieces + words,
                            [0.0] * (len(pieces) + len(words)))
    rng = np.random.default_rng(0)
    write_shard(tmp_path / "train_000.bin", rng.integers(3, 300, 3000))
    write_shard(tmp_path / "val_000.bin", rng.integers(3, 300, 1000))
    return ["--family", "llama", "-i", tmp_path / "train_000.bin", "-j", tmp_path / "val_000.bin"]


def test_sample_is_train_py_sample(tmp_path, shards):
    out = tmp_path / "out"
    stdout = run_train("-e", "d1", "-b", 2, "-t", 16, *shards, "-m", 0, "-x", 1, "-s", 1,
                       "-g", 8, "-n", 1, "-o", out, "--json-log")
    printed = re.findall(r"generating:\n---\n(.*?)\n---\n", stdout, re.S)
    d = dashboard.Dashboard(str(out / "log.jsonl"), gen_tokens=8, background=False)
    d.poll()
    assert d.sample_step == 1 and d.sample == printed[-1]   # the model of step 1 either way
    assert d.sample and not re.fullmatch(r"[\d ]+", d.sample)   # decoded by the data's tokenizer
    assert "sample of the checkpoint at step 1" in text_of(d.render())


def test_run_mode(tmp_path, shards):
    out = tmp_path / "out"
    console = Console(record=True, file=io.StringIO(), width=100)
    status = dashboard.main(["--run", "--interval", "0.05", "-g", "8",
                             "--", "-e", "d1", "-b", 2, "-t", 16,
                             *shards, "-m", 0, "-s", 0, "-x", 2, "-n", 2, "-o", out], console)
    assert status == 0
    text = console.export_text()
    assert "step 2/2" in text and "finished" in text
    assert "sample of the checkpoint at step 2" in text
    assert "(sampling ...)" not in text and "(no sample" not in text   # it waited for it
    assert "no checkpoint yet" not in text
    assert (out / "log.jsonl").exists() and "total average iteration time" in (
        out / "train.out").read_text()


def test_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        dashboard.main([str(tmp_path / "no" / "log.jsonl")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such directory" in err


def test_a_bare_json_log_follows_the_runs_own_log(tmp_path, monkeypatch):
    """--run with train.py's bare --json-log (its -o DIR's log) does not take the next flag for
    the log's path."""
    started = []
    monkeypatch.setattr(dashboard.subprocess, "Popen", lambda argv, **kw: started.append(argv))
    _, log_path = dashboard.start_run(["-e", "d2", "--json-log", "-x", "3", "-o", str(tmp_path)])
    assert log_path == str(tmp_path / dashboard.LOG_NAME)
    assert started[0][2:] == ["-e", "d2", "--json-log", "-x", "3", "-o", str(tmp_path)]
