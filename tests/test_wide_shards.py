"""
Token shards past 65,536 tokens (llmc/formats/llmc.py): uint32 shards in llm.c's Llama 3 layout
(magic 20240801, version 7) are written for a vocabulary that needs them, read both ways, and
refused by name where the other layout is taken; a 151,936-token vocabulary's text goes into
shards with dev/data/text_to_shards.py --tokenizer and trains.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from llmc.dataloader import DataError, DataLoader
from llmc.formats import FormatError
from llmc.formats.llmc import read_shard, shard_dtype, write_shard
from tests import needs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN_VOCABULARY = 151936


def test_the_layout_follows_the_vocabulary():
    assert shard_dtype(50257) == np.uint16 and shard_dtype(65536) == np.uint16
    assert shard_dtype(65537) == np.uint32 and shard_dtype(QWEN_VOCABULARY) == np.uint32


def test_uint32_shards_read_back_and_each_layout_refuses_the_other(tmp_path):
    wide = np.array([0, 65535, 65536, QWEN_VOCABULARY - 1, 7], dtype=np.int64)
    write_shard(tmp_path / "wide.bin", wide, np.uint32)
    write_shard(tmp_path / "narrow.bin", [1, 2, 3], np.uint16)
    with open(tmp_path / "wide.bin", "rb") as f:
        assert np.frombuffer(f.read(8), "<i4").tolist() == [20240801, 7]
    assert read_shard(tmp_path / "wide.bin").tolist() == wide.tolist()
    assert read_shard(tmp_path / "wide.bin", mmap=True).dtype == np.uint32
    assert read_shard(tmp_path / "narrow.bin").dtype == np.uint16
    with pytest.raises(FormatError, match="this is a uint32 token shard .llm.c's Llama 3 layout., "
                                          "not a GPT-2 token shard .magic number 20240801"):
        read_shard(tmp_path / "wide.bin", dtype=np.uint16)
    with pytest.raises(FormatError, match="this is a GPT-2 token shard, not a uint32 token shard"):
        read_shard(tmp_path / "narrow.bin", dtype=np.uint32)
    with pytest.raises(ValueError, match=r"must be in \[0, 65536\) in uint16 shards"):
        write_shard(tmp_path / "x.bin", wide, np.uint16)


def test_a_run_of_mixed_layouts_is_refused_in_one_line(tmp_path):
    write_shard(tmp_path / "d_000.bin", np.arange(100), np.uint16)
    write_shard(tmp_path / "d_001.bin", np.arange(100), np.uint32)
    with pytest.raises(DataError, match="d_001.bin: this is a uint32 token shard") as e:
        DataLoader(str(tmp_path / "d_*.bin"), 2, 8, shuffle=False)
    assert "\n" not in str(e.value)


def qwen_sized_tokenizer(folder):
    """A byte-level BPE tokenizer.json of Qwen2.5's 151,936 ids whose bytes and merges sit at
    the top of the range (the ids below are tokens no text makes), so every token of a text is
    past 65,535."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    small = Tokenizer(models.BPE())
    small.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    small.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50,
                              trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    learnt = json.loads(small.to_str())["model"]
    low = QWEN_VOCABULARY - len(learnt["vocab"])
    vocab = {f"unused{i}": i for i in range(low)}
    vocab.update({piece: low + i for piece, i in learnt["vocab"].items()})
    backend = Tokenizer(models.BPE(vocab, [tuple(m) if not isinstance(m, str) else tuple(m.split())
                                           for m in learnt["merges"]]))
    backend.pre_tokenizer = small.pre_tokenizer
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|endoftext|>"])
    folder.mkdir()
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(eos_token="<|endoftext|>")))


def test_a_qwen_sized_vocabulary_goes_into_shards_and_trains(tmp_path):
    needs.package("tokenizers")
    qwen_sized_tokenizer(tmp_path / "tok")
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 300)
    run = subprocess.run([sys.executable, os.path.join(REPO, "dev", "data", "text_to_shards.py"),
                          str(tmp_path / "text.txt"), "--tokenizer", str(tmp_path / "tok"),
                          "-o", str(tmp_path / "data"), "--name", "t"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "llm.c's shard format (uint32)" in run.stdout
    tokens = read_shard(tmp_path / "data" / "t_train_000001.bin")
    assert tokens.dtype == np.uint32 and 65536 <= tokens.min() and tokens.max() < QWEN_VOCABULARY
    train = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "--family", "llama",
                            "-e", "d1", "-i", str(tmp_path / "data" / "t_train_*.bin"),
                            "-j", str(tmp_path / "data" / "t_val_*.bin"), "-b", "1", "-t", "32",
                            "-x", "2", "-v", "100", "-s", "0", "-o", str(tmp_path / "run")],
                           capture_output=True, text=True)
    assert train.returncode == 0, train.stderr
    assert f"vocab_size V          | {QWEN_VOCABULARY}" in train.stdout
    losses = [float(line.split("loss ")[1].split()[0]) for line in train.stdout.splitlines()
              if line.startswith("step")]
    assert len(losses) == 2 and all(abs(loss - np.log(QWEN_VOCABULARY)) < 0.5 for loss in losses)
