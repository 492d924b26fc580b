"""
Vocabulary compaction (llmc/vocab.py, train.py --compact-vocab) on a tiny Llama whose data uses
30 of its tokenizer's 300 ids: the map round-trips through its file; training on the data
remapped on load gives bit for bit the losses and model of training a plain model of 31 ids on
shards remapped beforehand; samples decode through the map to the text of the original ids
(train.py's and the dashboard's); a resumed run uses the saved map; an id of the val data that
the training data lacks, and the flags that cannot go with compaction, are one-line errors.
"""
import io
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import needs
from llmc.dataloader import DataError
from llmc.formats import FormatError
from llmc.families import get_family
from llmc.formats.llama2c import write_llama2c_tokenizer, write_llama_model
from llmc.formats.llmc import read_shard, write_shard
from llmc.logger import Console
from llmc.sampler import generate
from llmc.tokenizer import SP_BOS, Tokenizer
from llmc.vocab import MAP_NAME, VocabMap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STEP_LOSS = re.compile(r"^step\s+\d+/\d+ \| loss (\S+) ", re.M)
VAL_LOSS = re.compile(r"^val loss (\S+)$", re.M)
SAMPLE = re.compile(r"generating:\n---\n(.*?)\n---\n", re.S)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """llama2.c's tokenizer of 300 ids (<unk> <s> </s>, 256 bytes, 41 words " w0".." w40") and
    shards of 30 word ids; the same shards remapped to compact ids in another dir."""
    d = tmp_path_factory.mktemp("corpus")
    pieces = ([b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)]
              + [f" w{i}".encode() for i in range(41)])
    write_llama2c_tokenizer(d / "tokenizer.bin", pieces, [0.0] * len(pieces))
    rng = np.random.default_rng(0)
    words = rng.choice(np.arange(259, 300), 30, replace=False)
    train, val = rng.choice(words, 3000), rng.choice(words, 1000)
    write_shard(d / "train_000.bin", train)
    write_shard(d / "val_000.bin", val)
    ids = np.unique(np.append(words, SP_BOS))   # the samples start from <s>
    remapped = d / "remapped"
    remapped.mkdir()
    index = {t: k for k, t in enumerate(ids)}
    write_shard(remapped / "train_000.bin", [index[t] for t in train])
    write_shard(remapped / "val_000.bin", [index[t] for t in val])
    return types.SimpleNamespace(dir=d, ids=ids,
                                 tokenizer=Tokenizer.from_llama2c(d / "tokenizer.bin"),
                                 flags=["--family", "llama", "-e", "d1", "-b", 2, "-t", 16,
                                        "-m", 2, "-v", 2, "-g", 8],
                                 data=["-i", d / "train_000.bin", "-j", d / "val_000.bin"],
                                 remapped=["-i", remapped / "train_000.bin",
                                           "-j", remapped / "val_000.bin"])


def run_train(*args, status=0):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == status, run.stderr
    assert "Traceback" not in run.stderr
    return run


@pytest.mark.parametrize("chunk", [7, 1 << 24])   # shards are read in chunks of CHUNK tokens
def test_map_round_trip(corpus, tmp_path, monkeypatch, chunk):
    from llmc import vocab
    monkeypatch.setattr(vocab, "CHUNK", chunk)
    m = VocabMap.from_shards([corpus.dir / "train_000.bin"], extra=[SP_BOS])
    assert np.array_equal(m.ids, corpus.ids) and len(m) == 31
    val = read_shard(corpus.dir / "val_000.bin")
    last = int(np.flatnonzero(val == val[-1])[0])   # the first place of the val data's last id
    with pytest.raises(DataError, match=rf"val_000.bin: token id {val[-1]} at position {last} "):
        VocabMap(np.setdiff1d(corpus.ids, val[-1])).check_shards([corpus.dir / "val_000.bin"])
    m.save(tmp_path / MAP_NAME)
    loaded = VocabMap.load(tmp_path / MAP_NAME)
    assert np.array_equal(loaded.ids, m.ids) and np.array_equal(loaded.index, m.index)
    tokens = read_shard(corpus.dir / "val_000.bin").astype(np.int32)
    compact = m.compact(tokens)
    assert compact.max() < len(m) and np.array_equal(m.ids[compact], tokens)
    with pytest.raises(DataError, match=r"^x.bin: token id 5 at position 12 is not in the "
                                        r"compacted vocabulary \(the 31 ids"):
        m.compact(np.array([5]), "x.bin", 12)
    write_shard(tmp_path / "bad.bin", [3, 3, 7])   # not increasing: not a map
    with pytest.raises(FormatError, match="not a vocabulary map"):
        VocabMap.load(tmp_path / "bad.bin")


def test_training_equals_remapped_shards(corpus, tmp_path):
    compact = run_train(*corpus.flags, *corpus.data, "-x", 3, "-s", 3, "-n", 3,
                        "-o", tmp_path / "compact", "--compact-vocab", "--json-log").stdout
    plain = run_train(*corpus.flags, *corpus.remapped, "-x", 3, "-s", 0, "-n", 3,
                      "-o", tmp_path / "plain", "--vocab-size", 31).stdout
    assert "| vocab_size V          | 31 " in compact and "31 ids of the data" in compact
    assert STEP_LOSS.findall(compact) == STEP_LOSS.findall(plain)
    assert len(STEP_LOSS.findall(plain)) == 3
    assert VAL_LOSS.findall(compact) == VAL_LOSS.findall(plain)
    model = "model_00000003.bin"
    assert (tmp_path / "compact" / model).read_bytes() == (tmp_path / "plain" / model).read_bytes()
    assert np.array_equal(VocabMap.load(tmp_path / "compact" / MAP_NAME).ids, corpus.ids)

    # the sample: compact ids drawn by the model, decoded as their original ids
    from train_llama2 import Llama2
    m = VocabMap(corpus.ids)
    drawn = generate(Llama2.from_checkpoint(str(tmp_path / "compact" / model)),
                     m.tokenizer(corpus.tokenizer), 8, Console(io.StringIO()))
    text = corpus.tokenizer.decode(m.ids[drawn])   # as printed: <s> decodes to nothing, and
    assert re.fullmatch(r"w\d+( w\d+){6}", text)   # takes the first word's space; the data's words
    assert SAMPLE.findall(compact)[-1] == text

    # the dashboard samples the checkpoint through the saved map too
    needs.package("rich")
    sys.path.insert(0, ROOT)
    from dev import dashboard
    d = dashboard.Dashboard(str(tmp_path / "compact" / "log.jsonl"), gen_tokens=8,
                            background=False)
    d.poll()
    assert d.sample == text


def test_resume_uses_the_saved_map(corpus, tmp_path):
    out = tmp_path / "out"
    common = [*corpus.flags, *corpus.data, "-s", 0, "-o", out]
    run_train(*common, "-x", 2, "-n", 2, "--compact-vocab")
    straight = run_train(*common[:-1], tmp_path / "straight", "-x", 4, "--compact-vocab").stdout
    resumed = run_train(*common, "-x", 4, "-y", 1, "--compact-vocab").stdout
    assert STEP_LOSS.findall(resumed) == STEP_LOSS.findall(straight)[2:]
    carried = run_train(*common, "-x", 5, "-y", 1).stdout   # run.json holds --compact-vocab
    assert "resuming from the checkpoint at step 4" in carried
    os.remove(out / "run.json")   # an older llm.pyx's run: the saved map says what it needs
    err = run_train(*common, "-x", 6, "-y", 1, status=1).stderr
    assert err.count("\n") == 1 and "was trained with --compact-vocab, resume it with it" in err


def test_errors(corpus, tmp_path):
    unseen = next(t for t in range(259, 300) if t not in corpus.ids)   # a word of no shard
    # past the val batches read (-m 2 of 2 x 16): found by the check at the start
    write_shard(tmp_path / "val_000.bin", [int(corpus.ids[1])] * 150 + [unseen] * 40)
    err = run_train(*corpus.flags, "-i", corpus.dir / "train_000.bin", "-j",
                    tmp_path / "val_000.bin", "-x", 1, "--compact-vocab", status=1).stderr
    assert err == (f"train.py: error: {tmp_path / 'val_000.bin'}: token id {unseen} at "
                   f"position 150 "
                   f"is not in the compacted vocabulary (the 31 ids of the training data, "
                   f"--compact-vocab)\n")
    err = run_train(*corpus.flags, *corpus.data, "--compact-vocab", "--vocab-size", 31,
                    status=2).stderr
    assert err.count("\n") == 1 and "drop --vocab-size" in err
    model = tmp_path / "model.bin"   # a model file has its own vocabulary: refused
    llama = get_family("llama")
    config = llama.config_class.from_name("d1", vocab_size=64)
    write_llama_model(model, config, np.zeros(config.num_parameters(), dtype=np.float32))
    err = run_train("--family", "llama", "-e", model, *corpus.data, "--compact-vocab",
                    status=1).stderr
    assert err.count("\n") == 1 and "needs a new random model" in err
