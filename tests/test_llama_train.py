"""
train.py with a Llama model (--model PRESET, --family llama -e dN): the same run as GPT-2's -
a run stopped at a checkpoint and resumed gives exactly the losses, log and files of an
uninterrupted one, val loss and samples - with its own vocabulary size, the cosine schedule
with restarts through the CLI, and bad combinations refused in one line.  The helpers and the
random-token shards are tests/test_train.py's.
"""
import re

import numpy as np
import pytest

from llmc.formats.llmc import write_shard
from llmc.schedulers import get_scheduler
from test_train import STEP_LINE, data, error_of, run_train, step_losses, train_log  # noqa: F401
from train_llama2 import LlamaConfig
from train_llama2 import Llama2

TINY = ["--family", "llama", "-e", "d1", "-b", 3, "-t", 16, "-m", 1]


def test_llama_resume_is_bit_identical(data, tmp_path):
    common = [*TINY, "-i", data.train, "-j", data.val, "-s", 2, "-g", 4]
    out, straight_dir = tmp_path / "out", tmp_path / "straight"
    first = run_train(*common, "-x", 2, "-n", 2, "-o", out)
    resumed = run_train(*common, "-x", 4, "-o", out, "-y", 1, "-n", 2)
    straight = run_train(*common, "-x", 4, "-n", 2, "-o", straight_dir)

    assert "| model family          | llama" in straight
    assert re.search(r"\| num_kv_heads NKV +\| 1 ", straight)
    assert sorted(step_losses(resumed)) == [3, 4]
    assert {**step_losses(first), **step_losses(resumed)} == step_losses(straight)
    assert train_log(out / "main.log") == train_log(straight_dir / "main.log")
    for name in ("model_00000004.bin", "state_00000004_00000.bin"):
        assert (out / name).read_bytes() == (straight_dir / name).read_bytes(), name
    saved = Llama2.from_checkpoint(straight_dir / "model_00000004.bin")
    assert saved.config == LlamaConfig.from_name("d1", vocab_size=50257)
    assert re.search(r"^val loss \d+\.\d{6}$", straight, re.M)
    assert straight.count("generating:") == 2   # at steps 2 and 4 (as token ids: no tokenizer)


def test_llama_preset_with_its_vocabulary_and_restarts_schedule(data, tmp_path):
    """--vocab-size sets the vocabulary (here the shards' tokens are all below it);
    --lr-schedule cosine-restarts prints llama.cpp's learning rates."""
    small = tmp_path / "small_*.bin"
    rng = np.random.default_rng(1)
    write_shard(tmp_path / "small_000.bin", rng.integers(0, 300, 3000))
    stdout = run_train("--model", "d2", "--family", "llama", "--vocab-size", 300, "-b", 2,
                       "-t", 8, "-i", small, "-j", small, "-m", 1, "-s", 0, "-x", 6, "-u", 1,
                       "-l", 1e-3, "-q", 0.1, "--lr-schedule", "cosine-restarts",
                       "--cos-decay-steps", 2, "--cos-decay-restart", 2)
    assert re.search(r"\| vocab_size V +\| 300 ", stdout)
    schedule = get_scheduler("cosine-restarts", 1e-3, 1, 6, 0.1, decay_steps=2, restart_mult=2)
    lrs = [m.group(5) for m in STEP_LINE.finditer(stdout)]
    assert lrs == [f"{schedule.get_learning_rate(s):.2e}" for s in range(6)]
    # warmup, the first cycle's top, middle and end, then the restart
    assert lrs[:4] == ["1.00e-03", "1.00e-03", "5.50e-04", "1.00e-04"]
    assert float(lrs[4]) > 0.8e-3


def test_llama_bad_combinations(capsys, data, tmp_path):
    files = ["-i", data.train, "-j", data.val, "-s", 0]
    line = error_of(capsys, "--model", "stories15M", "--family", "gpt2", *files, status=2)
    assert "stories15M is a Llama preset" in line
    assert "--vocab-size" in error_of(capsys, *TINY, "--vocab-size", 0, *files, status=2)
    line = error_of(capsys, "--family", "llama", "-e", "stories9M", *files)
    assert "-e stories9M: no such model file (nor dN or a Llama preset)" in line
    # the data's tokens must fit the vocabulary
    line = error_of(capsys, *TINY, "--vocab-size", 1000, *files)
    assert "outside the model's vocabulary of 1000" in line
    # a Llama checkpoint is not a GPT-2 one, and a model file has its own vocabulary
    Llama2(LlamaConfig.from_name("d1", vocab_size=50257)).save(tmp_path / "l.bin")
    assert "not a model checkpoint" in error_of(capsys, "-e", tmp_path / "l.bin", *files)
    line = error_of(capsys, "--family", "llama", "-e", tmp_path / "l.bin", "--vocab-size", 9, *files)
    assert "has its own vocabulary" in line
    line = error_of(capsys, *TINY, "--vocab-size", 50000, "-i", data.train, "-j", data.val)
    assert "-s 20: samples start from GPT-2's <|endoftext|> (50256), outside" in line
    line = error_of(capsys, "--model", "stories15M", "-t", 257, *files)
    assert "-t 257 exceeds the model's max sequence length 256" in line
