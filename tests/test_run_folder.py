"""
An output dir holds one run (train.py, llmc/checkpoint.py, llmc/logger.py): a fresh run into a
dir with another run's checkpoints or main.log is refused in one line (--overwrite starts over,
deleting that run's files only); -nk never deletes the checkpoint just written; -y 1 continues
only a run of the same settings and says which differ; main.log holds one run's lines; the
data's tokenizer is checked against the model's vocabulary first; -i without -j says which val
data it uses. -y 1 takes the run's own settings from run.json, and is an error where there is
no run; a run stopped before its first checkpoint starts afresh; -o keeps the final model and
is ignored by git; Ctrl-C says how to resume.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import train
from llmc import checkpoint, default_data
from llmc.dataloader import DataLoader
from llmc.formats.llmc import write_shard
from test_train import data  # noqa: F401  (the shards every run here trains on)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_train(*args, status=0):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, LLMPYX_CACHE_DIR="/nonexistent-llmpyx-cache"))
    assert run.returncode == status, run.stdout[-2000:] + run.stderr
    assert "Traceback" not in run.stderr
    return run


def error_line(*args):
    """The one line a refused run prints, exit status 1."""
    lines = run_train(*args, status=1).stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: "), lines
    return lines[0]


def small(data, *more):
    return ["-e", "d2", "-b", 2, "-t", 32, "-i", data.train, "-j", data.val, "-m", 1, "-v", 2,
            "-s", 0, *more]


def listing(out):
    return sorted(p.name for p in out.iterdir())


def checkpoints_in(out):
    return sorted(name for name in listing(out) if name.startswith(("DONE_", "model_", "state_")))


def steps_in(log_path):
    with open(log_path) as f:
        return [line.split()[0] for line in f if " trl:" in line]


def test_a_fresh_run_into_another_runs_dir_is_refused(data, tmp_path):
    """The issue's -nk scenario: a run to step 8 keeping 2 checkpoints, then a fresh run of 3
    steps into the same dir. Refused, that run intact; with --overwrite, the new run alone."""
    out = tmp_path / "outk"
    run_train(*small(data, "-x", 8, "-n", 1, "-nk", 2, "-o", out))
    before = {name: (out / name).read_bytes() for name in listing(out)}
    line = error_line(*small(data, "-x", 3, "-n", 1, "-nk", 2, "-o", out))
    assert f"-o {out} holds another run (checkpoints at steps 7, 8 and main.log)" in line
    assert "-y 1" in line and "another -o" in line and "--overwrite" in line
    assert {name: (out / name).read_bytes() for name in listing(out)} == before

    (out / "notes.txt").write_text("mine")   # not the run's: --overwrite leaves it
    run_train(*small(data, "-x", 3, "-n", 1, "-nk", 2, "-o", out, "--overwrite"))
    assert checkpoints_in(out) == [
        "DONE_00000002", "DONE_00000003", "model_00000002.bin", "model_00000003.bin",
        "state_00000002_00000.bin", "state_00000003_00000.bin"]
    assert steps_in(out / "main.log") == ["s:0", "s:1", "s:2"]
    assert (out / "notes.txt").read_text() == "mine"
    assert {"loss.png", "run.json"} <= set(listing(out))


def without_checkpoints(out):
    """out as a run killed before its first checkpoint leaves it: its checkpoints deleted."""
    for name in checkpoints_in(out):
        os.remove(out / name)


def test_the_same_run_stopped_before_its_first_checkpoint_starts_afresh(data, tmp_path):
    """-y 1 on the run in -o, stopped before its first checkpoint: the same command starts it
    afresh, saying so, and its main.log is the new run's alone."""
    out = tmp_path / "nockpt"
    run_train(*small(data, "-x", 2, "-o", out))
    without_checkpoints(out)
    done = run_train(*small(data, "-x", 2, "-o", out, "-y", 1))
    assert f"-y 1: the run in {out} stopped before its first checkpoint: starting it afresh" \
        in done.stdout + done.stderr
    assert steps_in(out / "main.log") == ["s:0", "s:1"]
    assert checkpoints_in(out) == ["DONE_00000002", "model_00000002.bin",
                                   "state_00000002_00000.bin"]


def test_resume_into_another_runs_log_without_a_checkpoint_keeps_it(data, tmp_path):
    """-y 1 into a dir whose run (no run.json: an older llm.pyx's, llm.c's) left a main.log but
    no checkpoint: refused, the log kept."""
    out = tmp_path / "nockpt"
    run_train(*small(data, "-x", 2, "-o", out))
    without_checkpoints(out)
    os.remove(out / "run.json")
    log = (out / "main.log").read_text()
    line = error_line(*small(data, "-x", 3, "-o", out, "-y", 1))
    assert "holds another run (main.log) but no complete checkpoint to resume" in line
    assert (out / "main.log").read_text() == log


def test_overwrite_needs_a_fresh_run_in_an_output_dir(data, tmp_path, capsys):
    for flags in (["--overwrite"], ["--overwrite", "-o", tmp_path, "-y", 1]):
        with pytest.raises(SystemExit) as e:
            train.run(["-e", "d2", "-i", data.train, "-j", data.val, *map(str, flags)])
        assert e.value.code == 2
        assert "argument --overwrite" in capsys.readouterr().err


class FakeModel:
    """What write_checkpoint reads of a model at fp32: save, m and v."""
    m = v = np.zeros(4, dtype=np.float32)
    precision = "fp32"
    master_weights = False

    def save(self, path):
        with open(path, "wb") as f:
            f.write(b"model")


def test_rotation_never_deletes_the_checkpoint_just_written(data, tmp_path):
    loader = DataLoader(data.train, 2, 32, shuffle=True)
    for stale in (7, 8):   # newer checkpoints of another run
        for path in checkpoint.checkpoint_paths(str(tmp_path), stale):
            open(path, "wb").close()
    for step in (1, 2, 3):
        checkpoint.write_checkpoint(str(tmp_path), step, FakeModel(), loader, keep=2)
        assert step in checkpoint.complete_steps(str(tmp_path))
    assert checkpoint.complete_steps(str(tmp_path)) == [2, 3, 7, 8]


def test_a_resume_with_other_settings_names_them(data, tmp_path):
    out = tmp_path / "out"
    run_train(*small(data, "-x", 2, "-n", 2, "-o", out))
    other = ["-e", "d2", "-b", 4, "-t", 16, "-i", data.dir / "train_000.bin", "-j", data.val,
             "-m", 1, "-s", 0]
    line = error_line(*other, "-x", 4, "-n", 2, "-o", out, "-y", 1)
    assert f"-y 1: {out} holds a run with other settings:" in line
    assert line.endswith("drop those flags to resume it with its own (run.json), or give this "
                         "run another -o")
    assert "-b 2 (this run: 4)" in line and "-t 32 (this run: 16)" in line
    assert f"-i {data.train} (this run: {data.dir / 'train_000.bin'})" in line
    assert "--family" not in line and "-e " not in line
    # the same settings resume (another number of processes is tests/test_mpi.py's)
    args = train.parse_args(["-e", "d2", "-b", "2", "-t", "32", "-i", data.train, "-j", data.val])
    config = train.run_config(args)
    assert checkpoint.run_differences(str(out), {flag: config[flag] for flag in train.RUN_SHAPE}) == []


def test_main_log_holds_one_run(data, tmp_path):
    """A run stopped after its last checkpoint, resumed: its main.log is the uninterrupted
    run's, not the steps after the checkpoint twice. Resumed at its last step, it says so."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    run_train(*small(data, "-x", 6, "-n", 3, "-o", straight))
    run_train(*small(data, "-x", 6, "-n", 3, "-o", stopped))
    for path in checkpoint.checkpoint_paths(str(stopped), 6):   # as if stopped before it
        os.remove(path)
    run_train(*small(data, "-x", 6, "-n", 3, "-o", stopped, "-y", 1))
    assert (stopped / "main.log").read_text() == (straight / "main.log").read_text()
    again = run_train(*small(data, "-x", 6, "-n", 3, "-o", stopped, "-y", 1)).stdout
    assert "the run is at step 6 already, -x 6 asks for 6: nothing to train" in again
    assert (stopped / "main.log").read_text() == (straight / "main.log").read_text()


def losses_in_json_log(path):
    records = [json.loads(line) for line in open(path)]
    return [(r["type"], r["step"], r["loss"]) for r in records if r["type"] in ("train", "val")]


def test_the_json_log_holds_each_step_once(data, tmp_path):
    """As main.log: a run resumed from before its last steps logs them once, as straight."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    run_train(*small(data, "-x", 6, "-n", 3, "-o", straight, "--json-log"))
    run_train(*small(data, "-x", 6, "-n", 3, "-o", stopped, "--json-log"))
    for path in checkpoint.checkpoint_paths(str(stopped), 6):   # as if stopped before it
        os.remove(path)
    run_train(*small(data, "-x", 6, "-n", 3, "-o", stopped, "-y", 1, "--json-log"))
    expected = losses_in_json_log(straight / "log.jsonl")
    assert losses_in_json_log(stopped / "log.jsonl") == expected and len(expected) >= 6


def test_the_datas_tokenizer_is_checked_against_the_models_vocabulary_first(data, tmp_path):
    """The issue's SentencePiece-512 Llama on GPT-2-token data: one message, the cause."""
    from train_llama2 import Llama2, LlamaConfig
    model = tmp_path / "llama512.bin"
    Llama2(LlamaConfig.from_name("d1", vocab_size=512)).save(model)
    for sampling in ([], ["-s", 0]):
        line = error_line("--family", "llama", "-e", model, "-i", data.train, "-j", data.val,
                          *sampling)
        assert line == (f"train.py: error: -i {data.train}: the data's tokenizer, GPT-2's (no "
                        f"tokenizer.bin beside -i's shards), has 50257 tokens, more than the "
                        f"model's vocabulary of 512: train it on data tokenized for it (-i, -j, "
                        f"with its tokenizer.bin or tokenizer.json beside the shards: "
                        f"dev/data/text_to_shards.py --tokenizer)")


def test_i_without_j_validates_on_the_split_beside_or_says_why_not(data, tmp_path, capsys):
    args = train.parse_args(["-i", data.train])
    assert train.val_data_pattern(args) == str(data.dir / "val_*.bin")
    assert "validating on" in capsys.readouterr().err
    write_shard(tmp_path / "corpus_000.bin", np.zeros(1000, dtype=np.int64))
    args = train.parse_args(["-i", str(tmp_path / "corpus_*.bin")])
    assert train.val_data_pattern(args) == default_data.VAL
    note = capsys.readouterr().err
    assert f"validating on {default_data.VAL}, the default val data" in note
    assert "give -j" in note
    assert train.val_data_pattern(train.parse_args([])) == default_data.VAL
    assert capsys.readouterr().err == ""   # the defaults need no note


def test_a_resume_takes_the_runs_own_settings(data, tmp_path):
    """-y 1 needs no flag typed again: run.json holds every setting (the learning rate and its
    schedule too); -x may change (said, as the learning rate decays over it), and the next
    resume takes it; a flag that contradicts the run is named."""
    out = tmp_path / "run"
    run_train(*small(data, "-x", 2, "-l", 3e-4, "-q", 0.1, "-o", out))
    saved = checkpoint.read_run_config(str(out))
    assert (saved["-l"], saved["-q"], saved["--lr-schedule"], saved["-b"]) == (3e-4, 0.1, "cosine", 2)
    done = run_train("-o", out, "-y", 1, "-x", 4)
    assert f"-x 4: the run in {out} was to take 2 steps: its learning rate now decays over 4" \
        in done.stdout + done.stderr
    assert steps_in(out / "main.log") == ["s:0", "s:1", "s:2", "s:3"]
    assert checkpoint.read_run_config(str(out))["-x"] == 4
    assert "nothing to train" in run_train("-o", out, "-y", 1).stdout   # at step 4 of 4
    line = error_line("-o", out, "-y", 1, "-x", 6, "-l", 1e-3)
    assert "other settings: -l 0.0003 (this run: 0.001): drop those flags" in line


@pytest.mark.parametrize("made", [False, True])
def test_resuming_a_dir_without_a_run_is_an_error(data, tmp_path, made):
    out = tmp_path / "nosuchdir"
    if made:
        out.mkdir()
    lines = run_train(*small(data, "-o", out, "-y", 1), status=2).stderr.strip().splitlines()
    what = "holds no run to resume" if made else "does not exist: no run to resume"
    assert lines[-1].startswith(f"train.py: error: argument -y: -o {out} {what}"), lines
    assert os.listdir(out) == [] if made else not out.exists()


def test_an_output_dir_keeps_the_final_model_and_says_what_it_holds(data, tmp_path):
    """-o without -n: the final step's checkpoint (llm.c keeps its last one), named in the
    run's last line, with how to sample it and train it on; git ignores the new dir."""
    out = tmp_path / "run_non"
    last = run_train(*small(data, "-x", 3, "-o", out)).stdout.strip().splitlines()[-1]
    assert checkpoints_in(out) == ["DONE_00000003", "model_00000003.bin",
                                   "state_00000003_00000.bin"]
    assert last == (f"{out} holds the run: its checkpoint at step 3 (model and training state), "
                    f"main.log, loss.png, run.json: python generate.py {out} samples it, "
                    f"train.py -o {out} -y 1 -x MORE trains it on")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    status = subprocess.run(["git", "-C", str(tmp_path), "status", "--porcelain"],
                            capture_output=True, text=True, check=True).stdout
    assert status == ""


def test_ctrl_c_says_how_to_resume(data, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, os.path.join(ROOT, "train.py"),
               *map(str, small(data, "-x", 1000, "-n", 1, "-nk", 2, "-o", out))]
    # SIGINT's default action in the child: a shell starting the tests in the background
    # (`make test &`) leaves it ignored, and Python then never raises KeyboardInterrupt
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as process:
        while not list(out.glob("DONE_*")) and process.poll() is None:   # -nk 2 rotates them
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        stderr = process.stderr.read()
    assert process.returncode == 130, stderr
    step = max(checkpoint.complete_steps(str(out)))
    assert stderr.strip().splitlines()[-1] == (
        f"train.py: interrupted: step {step} is saved in {out}: resume with train.py -o {out} -y 1")
