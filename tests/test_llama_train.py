"""
train.py with a Llama model (--model PRESET, --family llama -e dN): the same run as GPT-2's -
a run stopped at a checkpoint and resumed gives exactly the losses, log and files of an
uninterrupted one, val loss and samples - with its own vocabulary size, the cosine schedule
with restarts through the CLI, and bad combinations refused in one line; -e FILE without
--family takes the family of the file (llama2.c's versions 0 and 1, GGUF, llm.c's), and
--classifier separate makes a Llama with its own output matrix.  The helpers and the
random-token shards are tests/test_train.py's.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import train
from llmc.formats.gguf import sentencepiece_gguf_vocab, write_gguf
from llmc.formats.llama2c import read_llama_model, write_llama_model
from llmc.formats.llmc import write_shard
from llmc.schedulers import get_scheduler
from test_train import (ROOT, STEP_LINE, data, error_of, run_train, step_losses,  # noqa: F401
                        train_log)
from train_gpt2 import GPT2, GPT2Config
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
    line = error_of(capsys, "--family", "gpt2", "-e", tmp_path / "l.bin", *files, status=2)
    assert "l.bin is a llama2.c model (version 1), of the llama family, not gpt2" in line
    line = error_of(capsys, "--family", "llama", "-e", tmp_path / "l.bin", "--vocab-size", 9, *files)
    assert "has its own vocabulary" in line
    line = error_of(capsys, *TINY, "--vocab-size", 50000, "-i", data.train, "-j", data.val)
    assert "-s 20: samples start from GPT-2's <|endoftext|> (50256), outside" in line
    line = error_of(capsys, "--model", "stories15M", "-t", 257, *files)
    assert "-t 257 exceeds the model's max sequence length 256" in line


def test_model_files_name_their_family(capsys, data, tmp_path):
    """-e FILE without --family: llama2.c's version 0 and 1 and a GGUF are Llamas, llm.c's
    checkpoint a GPT-2, each said in a line and trained a step; --family naming another is
    one line naming both."""
    config = LlamaConfig.from_name("d1", vocab_size=50257, max_seq_len=32)
    params = Llama2.random(config, seed=1).params
    write_llama_model(tmp_path / "v0.bin", config, params, version=0)
    write_llama_model(tmp_path / "v1.bin", config, params, version=1)
    vocab = sentencepiece_gguf_vocab([b"t%d" % i for i in range(50257)], [0.0] * 50257)
    write_gguf(tmp_path / "model.gguf", config, params, vocab)
    GPT2.random(GPT2Config.from_name("d1", max_seq_len=32), seed=1).save(tmp_path / "gpt2.bin")
    files = ["-i", data.train, "-j", data.val, "-b", 2, "-t", 16, "-x", 1, "-m", 1, "-s", 0,
             "-g", 8]
    for name, what, family in [("v0.bin", "a llama2.c model (version 0)", "llama"),
                               ("v1.bin", "a llama2.c model (version 1)", "llama"),
                               ("model.gguf", "a GGUF model (version 3)", "llama"),
                               ("gpt2.bin", "an llm.c model (version 3)", "gpt2")]:
        run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "-e",
                              str(tmp_path / name), *map(str, files)], capture_output=True,
                             text=True, timeout=600)
        out, err = run.stdout, run.stderr
        assert run.returncode == 0 and err.splitlines() == [
            f"train.py: -e {tmp_path / name}: {what}: the {family} family"], err
        assert re.search(rf"\| model family +\| {family} ", out) and STEP_LINE.search(out)
    line = error_of(capsys, "--family", "gpt2", "-e", tmp_path / "v0.bin", *files, status=2)
    assert f"-e {tmp_path / 'v0.bin'} is a llama2.c model (version 0), of the llama family, " \
           f"not gpt2" in line
    line = error_of(capsys, "--family", "llama", "-e", tmp_path / "gpt2.bin", *files, status=2)
    assert "is an llm.c model (version 3), of the gpt2 family, not llama" in line
    args = train.parse_args(["--family", "llama", "-e", str(tmp_path / "v1.bin")])
    assert args.family == "llama" and args.family_note is None   # given: nothing to say


def test_a_separate_classifier_from_the_command_line(capsys, data, tmp_path):
    out = tmp_path / "out"
    stdout = run_train(*TINY, "--classifier", "separate", "-i", data.train, "-j", data.val,
                       "-s", 0, "-x", 1, "-n", 1, "-o", out)
    assert re.search(r"\| classifier +\| separate ", stdout) and STEP_LINE.search(stdout)
    config, _ = read_llama_model(out / "model_00000001.bin", LlamaConfig)
    assert config == LlamaConfig.from_name("d1", vocab_size=50257, shared_classifier=False)
    files = ["-i", data.train, "-j", data.val, "-s", 0]
    line = error_of(capsys, "-e", "d1", "--classifier", "separate", *files, status=2)
    assert "a GPT-2 model's classifier is always the token embedding (shared)" in line
    line = error_of(capsys, "-e", out / "model_00000001.bin", "--classifier", "shared", *files,
                    status=2)
    assert "model_00000001.bin has its own classifier" in line
