"""
The live dashboard (dev/dashboard.py), headless: a recorded JSON log (tests/fixtures/dashboard,
a 12-step d1 run of train.py --json-log --profile) drawn on a recording rich Console of
a fixed width; following a log that is still being written; the sample of a checkpoint equal
to the one train.py printed from the same model; --run starting a run and following it; a
missing log, a mistyped folder, a finished run and no terminal, each said or drawn at once; a
run without --json-log followed through its main.log (the Logger's lines, a real run's), its
end taken from loss.png, or without a terminal from main.log no longer growing.
"""
import io
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time

import pytest

import needs

rich = needs.package("rich")
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


def test_hellaswag_and_skipped_updates(tmp_path):
    """-h 1's eval records drawn as a curve, -sl/-sg's skip records counted (as train.py logs
    them: the step 0-based, shown as the console counts it)."""
    log = tmp_path / "log.jsonl"
    rs = records()
    extra = [dict(type="eval", step=4, accuracy=0.25, correct=1, examples=4, seconds=0.1),
             dict(type="skip", step=6, reason="loss", z=7.5, threshold=5.0),
             dict(type="eval", step=8, accuracy=0.5, correct=2, examples=4, seconds=0.1)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rs[:-1] + extra + rs[-1:]))
    d = dashboard.Dashboard(str(log), background=False)
    assert d.poll()
    text = text_of(d.render(100))
    assert "HellaSwag 0.5000" in text and dashboard.sparkline([0.25, 0.5], 70) in text
    assert "skipped updates 1" in text and "last at step 7 (loss z-score)" in text
    # fp16's overflow skips (train.py --precision fp16): counted with the others, named as such
    log.write_text("".join(json.dumps(r) + "\n" for r in rs[:-1] + extra + [
        dict(type="skip", step=9, reason="overflow", loss_scale=32768.0)] + rs[-1:]))
    d = dashboard.Dashboard(str(log), background=False)
    assert d.poll()
    text = text_of(d.render(100))
    assert "skipped updates 2" in text and "last at step 10 (overflow)" in text


def test_the_ane_steps_engine_dw_overlap_compiles_and_restarts(tmp_path):
    """The ANE backends' numbers of a step (train.py --backend ane-emu --json-log, static
    pipeline) beside ms/step."""
    log = tmp_path / "log.jsonl"
    rs = records()
    last = max(i for i, r in enumerate(rs) if r["type"] == "train")
    rs[last] = dict(rs[last], ane_engine_ms=12.5, ane_dw_ms=7.25, ane_overlap_ms=5.0,
                  ane_compiles=30, restarts=2)
    log.write_text("".join(json.dumps(r) + "\n" for r in rs))
    d = dashboard.Dashboard(str(log), background=False)
    assert d.poll()
    text = text_of(d.render(100))
    assert re.search(r"ANE engine 12.5 ms +CPU dW 7.2 ms +overlap 5.0 ms", text)
    assert re.search(r"ANE compiles 30 +restarts 2", text)
    assert "ANE" not in text_of(dashboard.Dashboard(FIXTURE, background=False).render(100))


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
    assert "step 12/12, finished" in text and f"lr {last['lr']:.2e}" in text
    assert f"loss {last['loss']:.4f}" in text and f"val loss {val[-1]['loss']:.4f}" in text
    assert dashboard.sparkline([r["loss"] for r in train], 70) in text
    assert dashboard.sparkline([r["loss"] for r in val], 70) in text
    assert dashboard.sparkline([r["ms"] for r in train[1:]], 70) in text
    # the last step beside the mean (the report's), each labelled
    head = rs[0]
    mean_tflops = head["flops_per_step"] / report["mean_ms"] / 1e9
    assert re.search(r"last step +mean of 11 \(the first left out\)", text)
    assert re.search(rf"ms/step +{last['ms']:.1f} +{report['mean_ms']:.1f}", text)
    assert re.search(rf"tokens/s +{last['tokens_per_s']:,.0f} +{report['tokens_per_s']:,.0f}",
                     text)
    assert re.search(rf"TFLOPS +{last['tflops']:.4g} \({last['peak_percent']:.1f}% of peak\) +"
                     rf"{mean_tflops:.4g} \({report['peak_percent']:.1f}% of peak\)", text)
    assert f"following {log}" in text.replace("\n", "")
    gpt2_share = 100 * last["groups_ms"]["gpt2"] / last["ms"]
    assert f"gpt2 {gpt2_share:.0f}%" in text and "compile 0.0%" in text
    assert "no checkpoint yet" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_a_line_that_is_no_json_record_is_skipped_and_counted(tmp_path):
    """A log holding `{{{` (and a JSON list) beside its records: drawn, the two counted."""
    log = tmp_path / "log.jsonl"
    lines = open(FIXTURE).read().splitlines()
    log.write_text("\n".join(lines[:3] + ["{{{", "[1, 2]"] + lines[3:]) + "\n")
    d = dashboard.Dashboard(str(log), background=False)
    assert d.poll() and d.done()
    text = text_of(d.render(200), width=200).replace("\n", "")
    assert "(2 lines not records: skipped)" in text and "step 12/12, finished" in text


def test_follows_a_growing_log(tmp_path):
    log = tmp_path / "log.jsonl"
    with open(FIXTURE, "rb") as f:
        data = f.read()
    cut = data.index(b'"type": "train"', data.index(b'"type": "train"') + 1) + 5  # mid-line
    follower = dashboard.LogFollower(str(log))
    assert follower.poll() == []   # not written yet
    waiting = dashboard.Dashboard(str(log), gen_tokens=0)
    assert not waiting.poll() and f"no {log} yet" in text_of(waiting.render(200))
    log.write_bytes(b"")   # the run has started it
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


def test_a_mistyped_folder_ends_at_once(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    with pytest.raises(SystemExit) as e:
        dashboard.main([str(tmp_path / "outk")])   # not a file either: a folder not there
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'outk'}: no such directory" in err
    assert "--json-log" in err


def on_a_terminal(argv, until, timeout=20):
    """dev/dashboard.py ARGV on a pseudo-terminal: (what it drew until `until` appeared or it
    ended, seconds taken, its exit status or None while it still runs); then it is stopped."""
    master, slave = pty.openpty()
    until = until.encode()
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "dev", "dashboard.py"), *argv],
                               stdin=slave, stdout=slave, stderr=slave, cwd=ROOT,
                               env=dict(os.environ, COLUMNS="250"))
    os.close(slave)
    out = b""
    try:
        while time.monotonic() - start < timeout and until not in out:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    out += re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", os.read(master, 65536))
                except OSError:   # it ended and closed the terminal
                    break
        if until not in out:   # it closed the terminal: its status
            try:
                process.wait(timeout=max(0.1, timeout - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                pass
        seconds = time.monotonic() - start
        status = process.poll()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        os.close(master)
    return out.decode(errors="replace"), seconds, status


def test_a_missing_log_is_named_at_once(tmp_path):
    """A run that has not started: the dashboard names the files it waits for and who writes
    them; a JSON log named as a FILE has no main.log to give way to."""
    drawn, seconds, status = on_a_terminal([str(tmp_path)], until="once it has a line")
    assert status is None and seconds < 10   # still waiting, saying for what
    log = tmp_path / "log.jsonl"
    assert (f"following {log} (not there yet: train.py writes it with --json-log, else "
            f"main.log beside it)") in drawn
    assert (f"no {log} yet: train.py writes it with --json-log, else main.log beside it (once "
            f"it has a line)") in drawn
    d = dashboard.Dashboard(str(tmp_path / "log.jsonl"), gen_tokens=0)
    assert not d.poll() and f"no {log} yet" in text_of(d.render(200))
    assert "a run without it cannot be followed" in text_of(d.render(200))


def test_a_finished_run_is_drawn_at_once(tmp_path):
    shutil.copy(FIXTURE, tmp_path / "log.jsonl")
    drawn, seconds, status = on_a_terminal([str(tmp_path)], until="no such text")
    assert status == 0 and seconds < 10
    assert "step 12/12, finished" in drawn and "waiting" not in drawn


def test_no_terminal_and_nothing_comes(tmp_path):
    start = time.monotonic()
    run = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "dashboard.py"),
                          str(tmp_path), "--wait", "1"], capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 1 and time.monotonic() - start < 15
    assert run.stderr.count("\n") == 1 and str(tmp_path / "log.jsonl") in run.stderr
    assert "no terminal" in run.stderr and "--json-log" in run.stderr


def test_no_sampling_note_once_the_run_ended(tmp_path):
    d = dashboard.Dashboard(str(tmp_path / "log.jsonl"), background=False)
    d.sample_step = 2   # its sample still being made
    assert "(sampling ...)" in text_of(d.render())
    d.ended = True
    assert "(sampling ...)" not in text_of(d.render())


def test_a_bare_json_log_follows_the_runs_own_log(tmp_path, monkeypatch):
    """--run with train.py's bare --json-log (its -o DIR's log) does not take the next flag for
    the log's path."""
    started = []
    monkeypatch.setattr(dashboard.subprocess, "Popen", lambda argv, **kw: started.append(argv))
    _, log_path = dashboard.start_run(["-e", "d2", "--json-log", "-x", "3", "-o", str(tmp_path)])
    assert log_path == str(tmp_path / dashboard.LOG_NAME)
    assert started[0][2:] == ["-e", "d2", "--json-log", "-x", "3", "-o", str(tmp_path)]


def write_main_log(run_dir):
    """A run's main.log as llmc/logger.py's Logger writes it (no --json-log), its run.json
    (a Llama d1): the losses at steps 0-5, a val loss at 0 and 6, HellaSwag at 3, an update
    skipped as an outlier at 4, an fp16 overflow at 5. The train losses."""
    from llmc.logger import Logger
    logger = Logger(str(run_dir))
    losses = [10.8, 10.2, 9.9, 9.1, 8.7, 8.8]
    logger.log_val(0, 10.9)
    for step, loss in enumerate(losses):
        logger.log_train(step, loss, 1e-4 * (step + 1), 1.5)
        if step == 3:
            logger.log_eval(step, 0.25, 1, 4, 0.1)
        if step == 4:
            logger.log_skip(step, "loss", 7.5, 5.0)
        if step == 5:
            logger.log_overflow(step, 32768.0)
    logger.log_val(6, 8.5)
    (run_dir / "run.json").write_text(json.dumps({"--family": "llama", "-e": "d1", "-b": 2,
                                                  "-t": 16, "-i": str(run_dir / "x_*.bin")}))
    return losses


def test_a_run_without_json_log_is_drawn_from_its_main_log(tmp_path):
    losses = write_main_log(tmp_path)
    main_log = tmp_path / "main.log"
    assert dashboard.log_to_follow(str(tmp_path / "log.jsonl")) == str(main_log)
    d = dashboard.Dashboard(str(main_log), gen_tokens=0)
    assert d.poll() and not d.done()   # no loss.png: still running
    text = text_of(d.render(100))
    assert "llama d1, B=2 T=16" in text   # run.json's
    assert "step 6 " in text and "lr 6.00e-04" in text and "norm 1.500" in text
    assert "finished" not in text
    assert f"loss {losses[-1]:.4f}" in text and dashboard.sparkline(losses, 70) in text
    assert "val loss 8.5000" in text and dashboard.sparkline([10.9, 8.5], 70) in text
    assert "HellaSwag 0.2500" in text
    assert "skipped updates 2" in text and "last at step 6 (overflow)" in text
    assert "step times: not in main.log (train.py --json-log writes them)" in text
    assert "ms/step" not in text
    assert f"following {main_log}" in text.replace("\n", "")
    # train.py's last act is its plot of main.log: then the run has ended
    (tmp_path / "loss.png").write_bytes(b"")
    os.utime(main_log, (1000, 1000))
    os.utime(tmp_path / "loss.png", (1000, 1000))
    assert d.done() and "step 6, finished" in text_of(d.render(100))
    with open(main_log, "a") as f:   # resumed since: a plot older than main.log
        f.write("s:6 trl:8.6000 lr:0.000700 norm:1.40\n")
    assert d.poll() and not d.done() and "loss 8.6000" in text_of(d.render(100))


def test_a_json_log_gives_way_to_main_log_once_it_has_a_line(tmp_path):
    """The Logger creates main.log and log.jsonl before either has a line: an empty main.log
    may still be a --json-log run's, one with a line and no JSON log is not."""
    log = tmp_path / "log.jsonl"
    d = dashboard.Dashboard(str(log), gen_tokens=0, main_log_fallback=True)
    (tmp_path / "main.log").write_text("")
    assert not d.poll() and d.log_path == str(log)
    write_main_log(tmp_path)
    assert d.poll() and d.log_path == str(tmp_path / "main.log") and d.head["family"] == "llama"
    assert "loss 8.8000" in text_of(d.render(100))
    shutil.copy(FIXTURE, log)   # a --json-log run's main.log beside its JSON log: the JSON log
    assert dashboard.log_to_follow(str(log)) == str(log)


def test_no_terminal_and_a_main_log_that_stopped_growing(tmp_path):
    """Without matplotlib (no loss.png) or a run that stopped, main.log's end is not marked:
    without a terminal the dashboard draws it and stops once it has not grown for --wait s."""
    losses = write_main_log(tmp_path)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "dashboard.py"),
                          str(tmp_path), "--wait", "1", "-g", "0"], capture_output=True,
                         text=True, timeout=30, env=dict(os.environ, COLUMNS="300"))
    assert run.returncode == 0, run.stderr
    main_log = tmp_path / "main.log"
    lines = run.stdout.splitlines()
    assert lines[0] == f"following {main_log} (no log.jsonl: run with --json-log for step times)"
    assert f"loss {losses[-1]:.4f}" in run.stdout and "finished" not in run.stdout
    assert lines[-1].startswith(f"{main_log} has not grown for 1 s and there is no terminal")


def test_a_finished_run_without_json_log(tmp_path, shards):
    """A real run without --json-log, finished (its loss.png written): drawn from its main.log
    at once, its sample made as train.py's, with its family and data's tokenizer (run.json)."""
    needs.package("matplotlib")   # train.py's loss.png, the mark of the run's end
    out = tmp_path / "out"
    stdout = run_train("-e", "d1", "-b", 2, "-t", 16, *shards, "-m", 0, "-x", 2, "-s", 2,
                       "-g", 8, "-n", 2, "-o", out)
    assert not (out / "log.jsonl").exists() and (out / "loss.png").exists()
    printed = re.findall(r"generating:\n---\n(.*?)\n---\n", stdout, re.S)[-1]
    last_loss = re.findall(r"s:1 trl:(\S+)", (out / "main.log").read_text())[0]
    drawn, seconds, status = on_a_terminal([str(out), "-g", "8"], until="no such text")
    assert status == 0 and seconds < 20
    drawn = re.sub(r"[│\s]+", " ", drawn)   # the panel's lines joined
    assert f"following {out / 'main.log'} (no log.jsonl: run with --json-log for step " \
           f"times)" in drawn
    assert "step 2, finished" in drawn and f"loss {last_loss}" in drawn
    assert "step times: not in main.log" in drawn
    assert "sample of the checkpoint at step 2" in drawn
    assert re.sub(r"\s+", " ", printed) in drawn
