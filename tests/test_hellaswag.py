"""
HellaSwag during training (train.py -h 1): llm.c's eval file (llmc/formats/llmc.py) round-trips
byte for byte in its layout and refuses bad files in one line; the scorer (llmc/evalloader.py)
gives each completion the loss PyTorch gives it on the same model, GPT-2 and Llama, both ways
(over the KV cache, in batches), across forward and batch boundaries, longer-than-T rows and rows
cut to the model's context, and at bf16 as near fp32's as the batched way; train.py -h 1 prints and logs
the accuracy of the model it trains; -h alone is still the help; dev/data/hellaswag.py tokenizes
as llm.c's and writes nothing offline. The examples are made up here (no download).
"""
import importlib
import json
import os
import re
import shutil

import numpy as np
import pytest

import needs
from llmc import evalloader
from llmc.distributed import SINGLE
from llmc.families import get_family
from llmc.formats import FormatError
from llmc.formats.llmc import EvalExample, read_evalfile, write_evalfile, write_shard
from llmc.tokenizer import gpt2_encoding
from test_mpi import needs_mpi, run_train as mpi_train
from test_run_folder import run_train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 97


def made_up_examples(count, vocab=VOCAB, context=(1, 20), completion=(1, 10), seed=0):
    """count examples of random token ids: contexts and completions of lengths in those ranges."""
    rng = np.random.default_rng(seed)

    def tokens(lengths):
        return rng.integers(0, vocab, rng.integers(lengths[0], lengths[1] + 1)).astype(np.int32)
    return [EvalExample(context=tokens(context), completions=[tokens(completion) for _ in range(4)],
                        label=int(rng.integers(0, 4))) for _ in range(count)]


def same_examples(a, b):
    return len(a) == len(b) and all(
        x.label == y.label and np.array_equal(x.context, y.context) and
        len(x.completions) == len(y.completions) and
        all(np.array_equal(p, q) for p, q in zip(x.completions, y.completions))
        for x, y in zip(a, b))


# ----------------------------------------------------------------------------
# the eval file

def test_evalfile_is_llmcs_layout_and_round_trips(tmp_path):
    example = EvalExample(context=np.array([5, 6]), completions=[[7], [8, 9], [10], [11]], label=2)
    write_evalfile(tmp_path / "one.bin", [example, example])
    raw = (tmp_path / "one.bin").read_bytes()
    header = np.frombuffer(raw, "<i4", 256)
    stream = [65535, 34, 0, 2, 4, 2, 5, 6, 1, 7, 2, 8, 9, 1, 10, 1, 11]   # 17 uint16 = 34 bytes
    assert list(header[:4]) == [20240522, 1, 2, 34] and not header[4:].any()
    assert np.frombuffer(raw, "<u2", offset=1024).tolist() == stream + [65535, 34, 1] + stream[3:]

    examples = made_up_examples(30, vocab=50257, context=(1, 200), completion=(1, 60))
    write_evalfile(tmp_path / "many.bin", examples)
    assert same_examples(read_evalfile(tmp_path / "many.bin", vocab_size=50257), examples)


def corrupt(tmp_path, name, edit):
    """A copy of a good eval file of 3 examples whose uint16 stream (after the header) and
    header edit() changes in place."""
    path = tmp_path / "good.bin"
    write_evalfile(path, made_up_examples(3))
    raw = bytearray(path.read_bytes())
    header = np.frombuffer(raw, "<i4", 256).copy()
    stream = np.frombuffer(raw, "<u2", offset=1024).copy()
    stream, header = edit(stream, header) or (stream, header)
    (tmp_path / name).write_bytes(header.astype("<i4").tobytes() + stream.astype("<u2").tobytes())
    return tmp_path / name


def with_completions(stream, header, count):
    """The first example with `count` completions: its field and its bytes cut to match."""
    ctx = stream[5]
    at = 6 + ctx
    for _ in range(count):
        at += 1 + stream[at]
    first = np.concatenate([stream[:at], stream[stream[1] // 2:]])
    first[4], first[1] = count, 2 * at
    return first, header


@pytest.mark.parametrize("edit, message", [
    (lambda s, h: (s[:-3], h), "truncated"),
    (lambda s, h: (np.concatenate([s, [1, 2]]), h), "too long: 4 bytes after the 3 examples"),
    (lambda s, h: s.__setitem__(0, 7), "example 0 (at byte 1024): starts with 7, not 65535"),
    (lambda s, h: s.__setitem__(2, 1), "has index 1"),
    (lambda s, h: s.__setitem__(3, 4), "label 4 is not a completion's index"),
    (lambda s, h: with_completions(s, h, 3), "has 3 completions, not 4"),
    (lambda s, h: s.__setitem__(5, s[5] + 1), "its lengths do not fill its"),
    (lambda s, h: h.__setitem__(3, h[3] + 2), "bad header: the longest example has"),
    (lambda s, h: h.__setitem__(2, 0), "bad header: 0 examples"),
    (lambda s, h: h.__setitem__(1, 2), "unsupported eval file version 2"),
])
def test_bad_evalfiles_are_refused_in_one_line(tmp_path, edit, message):
    path = corrupt(tmp_path, "bad.bin", edit)
    with pytest.raises(FormatError, match=re.escape(message)) as e:
        read_evalfile(path)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_evalfile_tokens_and_kind_are_checked(tmp_path):
    path = tmp_path / "e.bin"
    write_evalfile(path, made_up_examples(3, vocab=50257, seed=1))
    with pytest.raises(FormatError, match=r"token id \d+ is outside the model's vocabulary of 97"):
        read_evalfile(path, vocab_size=VOCAB)
    write_shard(tmp_path / "shard.bin", np.arange(10))
    with pytest.raises(FormatError, match="this is a GPT-2 token shard, not an eval file"):
        read_evalfile(tmp_path / "shard.bin")
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(FormatError, match="empty file"):
        read_evalfile(tmp_path / "empty.bin")
    with pytest.raises(ValueError, match="3 completions"):
        write_evalfile(path, [EvalExample(np.array([1]), [[1], [2], [3]], 0)])
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 65535\)"):
        write_evalfile(path, [EvalExample(np.array([65535]), [[1], [2], [3], [4]], 0)])
    assert len(read_evalfile(path)) == 3   # the refused writes left the file as it was


# ----------------------------------------------------------------------------
# the scores, against PyTorch

def reference_losses(family, config, params, examples):
    """(N, 4): each completion's mean cross-entropy after its context, from the family's
    PyTorch reference model, one row at a time at its own length (cut to max_seq_len + 1
    tokens from the left)."""
    import torch
    import torch.nn.functional as F
    ref = importlib.import_module(family.reference)
    model = ref.build_model(config, params)
    losses = np.empty((len(examples), 4))
    with torch.no_grad():
        for e, example in enumerate(examples):
            for c, completion in enumerate(example.completions):
                tokens = np.concatenate([example.context, completion])[-(config.max_seq_len + 1):]
                x = torch.tensor(tokens[None, :-1], dtype=torch.long)
                y = torch.tensor(tokens[None, 1:], dtype=torch.long)
                logits, _ = model(x, y)
                per_token = F.cross_entropy(logits[0].double(), y[0], reduction="none")
                losses[e, c] = per_token[-len(completion):].mean().item()
    return losses


@pytest.mark.parametrize("way", ["cached", "batched"])
@pytest.mark.parametrize("family_name", ["gpt2", "llama"])
def test_scores_match_pytorch(family_name, way, monkeypatch):
    """Both ways of evalloader: over the KV cache, packed 40 tokens a forward (the examples and
    their rows split between forwards, rows cut to the context not sharing their examples'
    beginnings), and in batches of 3 rows."""
    torch = needs.package("torch")
    torch.set_num_threads(1)
    family = get_family(family_name)
    # maxT 24 < the longest rows (30 tokens): those lose their oldest tokens; rows run at 16
    # (RUN_MULTIPLE) and at 24, the model's context; B = 3 packs rows of unequal lengths
    # across examples (4 completions each)
    config = family.config_class.from_name("d2", vocab_size=VOCAB, max_seq_len=24)
    model = family.model_class.random(config, seed=5)
    examples = made_up_examples(12, seed=3)
    assert max(len(e.context) + max(map(len, e.completions)) for e in examples) > 25
    monkeypatch.setattr(evalloader, "PACKED_ROWS", 40)
    rows = evalloader.scored_rows(model, examples)
    losses = (evalloader.packed_losses(model, rows) if way == "cached" else
              evalloader.batched_losses(model, rows, 3))
    ours = losses.reshape(len(examples), -1)
    expected = reference_losses(family, config, model.params, examples)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=2e-5)
    order = np.sort(expected, axis=1)
    assert (order[:, 1] - order[:, 0]).min() > 1e-4   # no near tie: the choices must agree
    right = sum(int(np.argmin(row) == e.label) for row, e in zip(expected, examples))
    assert evalloader.count_correct(ours, examples) == right
    assert model.has_kv_cache   # so evaluate is the cached way
    assert evalloader.evaluate(model, examples, 3, SINGLE) == right


@pytest.mark.parametrize("family_name", ["gpt2", "llama"])
def test_cached_scores_at_bf16_are_as_near_fp32_as_batched(family_name):
    """At bf16 the two ways round in different places: each within bf16's error of the fp32
    model's scores, the cached no farther than twice the batched."""
    family = get_family(family_name)
    config = family.config_class.from_name("d2", vocab_size=VOCAB, max_seq_len=64)
    fp32 = family.model_class.random(config, seed=5)
    narrow = family.model_class(config, precision="bf16", trainable=False)
    narrow.params = fp32.params
    examples = made_up_examples(6, seed=2)
    want = evalloader.batched_losses(fp32, evalloader.scored_rows(fp32, examples), 4)
    rows = evalloader.scored_rows(narrow, examples)
    cached = np.abs(evalloader.packed_losses(narrow, rows) - want).max()
    batched = np.abs(evalloader.batched_losses(narrow, rows, 4) - want).max()
    assert 0 < cached < 0.02 * np.abs(want).max() and cached < 2 * batched, (cached, batched)


def test_processes_share_the_examples_as_llmc():
    shares = [evalloader.process_share(10, r, 4) for r in range(4)]
    assert [(s.start, s.stop) for s in shares] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert evalloader.process_share(2, 3, 4) == slice(2, 2)   # nothing left for the last


# ----------------------------------------------------------------------------
# train.py -h 1

@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """Shards of token ids below VOCAB and an eval file of 10 made-up examples."""
    d = tmp_path_factory.mktemp("hellaswag")
    rng = np.random.default_rng(0)
    write_shard(d / "train.bin", rng.integers(0, VOCAB, 3000))
    write_shard(d / "val.bin", rng.integers(0, VOCAB, 1000))
    write_evalfile(d / "hellaswag.bin", made_up_examples(10, seed=7))
    return d


def test_train_h1_prints_and_logs_the_accuracy(small_data, tmp_path):
    from train_gpt2 import GPT2
    d, out = small_data, tmp_path / "out"
    common = ["-e", "d2", "--vocab-size", VOCAB, "-b", 3, "-t", 8, "-i", d / "train.bin", "-j",
              d / "val.bin", "-m", 1, "-s", 0, "-x", 3, "-v", 2]
    run = run_train(*common, "-n", 3, "-o", out, "--json-log", "-h", 1, "-hm", 8, "--hellaswag",
                    d / "hellaswag.bin")
    # the evals' other shapes leave the training as it was, bit for bit
    assert re.findall(r"^step .*\| lr \S+", run.stdout, re.M) == \
        re.findall(r"^step .*\| lr \S+", run_train(*common).stdout, re.M)
    lines = [line for line in run.stdout.splitlines() if line.startswith("HellaSwag")]
    assert len(lines) == 2   # at step 2 and the last, 3; not at step 0
    assert "| run hellaswag         | 8 of the 10 examples of" in run.stdout
    # the last one is the accuracy of the final model, on the first 8 examples
    model = GPT2.from_checkpoint(str(out / "model_00000003.bin"))
    examples = read_evalfile(d / "hellaswag.bin")[:8]
    correct = evalloader.count_correct(evalloader.completion_losses(model, examples, 3),
                                       examples)
    assert lines[-1] == f"HellaSwag: {correct}/8 = {correct / 8:f}"
    log = (out / "main.log").read_text().splitlines()
    evals = [line for line in log if " eval:" in line]
    assert evals[0].startswith("s:2 eval:") and evals[1] == f"s:3 eval:{correct / 8:.4f}"
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    last = [r for r in records if r["type"] == "eval"][-1]
    assert last.pop("seconds") > 0 and last == dict(
        type="eval", step=3, accuracy=correct / 8, correct=correct, examples=8)
    assert re.search(r"^time in HellaSwag \(-h 1\): \S+ s, 2 evals of 8 examples \(\S+ s an "
                     r"example\)$", run.stdout, re.M)


def test_a_resumed_run_logs_each_eval_once(small_data, tmp_path):
    d = small_data
    common = ["-e", "d2", "--vocab-size", VOCAB, "-b", 3, "-t", 8, "-i", d / "train.bin", "-j",
              d / "val.bin", "-m", 1, "-s", 0, "-v", 2, "-n", 2, "-h", 1, "-hm", 4,
              "--hellaswag", d / "hellaswag.bin", "--json-log"]
    # a run that stopped in its checkpoint at step 4: resumed from step 2, its lines of the
    # steps after that (step 4's eval too) are dropped from the logs, not there twice
    run_train(*common, "-x", 4, "-o", tmp_path / "resumed")
    os.remove(tmp_path / "resumed" / "DONE_00000004")
    resumed = run_train(*common, "-x", 4, "-o", tmp_path / "resumed", "-y", 1).stdout
    straight = run_train(*common, "-x", 4, "-o", tmp_path / "straight").stdout
    assert re.findall(r"^HellaSwag.*$", resumed, re.M) == \
        re.findall(r"^HellaSwag.*$", straight, re.M)[1:]   # step 2's is the first run's
    assert (tmp_path / "resumed" / "main.log").read_text() == \
        (tmp_path / "straight" / "main.log").read_text()

    def evals(out):   # each eval's record but its time
        records = map(json.loads, (out / "log.jsonl").read_text().splitlines())
        return [{k: v for k, v in r.items() if k != "seconds"} for r in records
                if r["type"] == "eval"]
    assert evals(tmp_path / "resumed") == evals(tmp_path / "straight")


@needs_mpi
def test_two_processes_share_the_examples_and_sum(small_data):
    """-x 0: the random model's score at step 0, the last; 9 examples split 5 + 4."""
    d = small_data
    common = ["-e", "d2", "--vocab-size", VOCAB, "-b", 3, "-t", 8, "-i", d / "train.bin", "-j",
              d / "val.bin", "-m", 1, "-s", 0, "-x", 0, "-h", 1, "-hm", 9, "--hellaswag",
              d / "hellaswag.bin"]
    one, two = (mpi_train(n, *common).stdout for n in (1, 2))
    assert re.search(r"\| num_processes\s+\| 2\s+\|", two)
    scores = [re.findall(r"^HellaSwag: .*$", out, re.M) for out in (one, two)]
    assert len(scores[0]) == 1 and scores[0] == scores[1]


def test_h_alone_is_the_help_and_bad_h_is_one_line(small_data, tmp_path):
    helped = run_train("-h")
    assert helped.stdout == run_train("--help").stdout and helped.stdout.startswith("usage:")
    assert run_train("-e", "d2", "-h").stdout == helped.stdout   # -h before nothing or a flag
    common = ["-e", "d2", "--vocab-size", VOCAB, "-i", small_data / "train.bin", "-j",
              small_data / "val.bin", "-s", 0]
    for flags, message in ((["-h", 2], "argument -h: invalid choice: 2"),
                           (["-h", 1, "-hm", 0], "argument -hm"),
                           (["-h", 1, "--compact-vocab"], "argument -h: HellaSwag's tokens")):
        line = run_train(*common, *flags, status=2).stderr.strip()
        assert line.startswith("train.py: error: ") and message in line, line
    missing = tmp_path / "none.bin"
    line = run_train(*common, "-h", 1, "--hellaswag", missing, status=1).stderr.strip()
    assert line == (f"train.py: error: -h 1: {missing}: no such file (`python "
                    f"dev/data/hellaswag.py` writes HellaSwag's, {evalloader.HELLASWAG})")
    write_evalfile(tmp_path / "gpt2.bin", made_up_examples(2, vocab=50257, seed=1))
    line = run_train(*common, "-h", 1, "--hellaswag", tmp_path / "gpt2.bin", status=1).stderr
    assert "is outside the model's vocabulary of 97 (an eval file of another tokenizer?)" in line


# ----------------------------------------------------------------------------
# dev/data/hellaswag.py

JSONL = [
    {"ctx": "A man is sitting on a roof. he", "label": 3, "endings": [
        "is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
        "is holding a rubik's cube.", "starts pulling up roofing on a roof."]},
    {"ctx": "Two dogs play.", "label": 0, "endings": ["They run.", "A cat.", "Rain.", "Snow."]},
]


@pytest.fixture
def script(monkeypatch, tmp_path):
    """dev/data/hellaswag.py as a module, its download dir in tmp_path."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "dev", "data"))
    import hellaswag
    monkeypatch.setattr(hellaswag, "DATA_CACHE_DIR", str(tmp_path / "hellaswag"))
    return hellaswag


def test_script_offline_says_so_and_writes_nothing(script, monkeypatch, tmp_path):
    def offline(*args, **kwargs):
        raise OSError("no network")
    monkeypatch.setattr(script, "download_file", offline)
    with pytest.raises(SystemExit, match=r"^hellaswag.py: error: cannot download HellaSwag "
                                         r"\(no network\): it needs the internet"):
        script.main(["--output", str(tmp_path / "out.bin")])
    assert not (tmp_path / "hellaswag").exists() and not (tmp_path / "out.bin").exists()


def test_script_tokenizes_as_llmc(script, monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copy(needs.shared(needs.GPT2_RANKS), cache / "gpt2.tiktoken")
    monkeypatch.setenv("LLMPYX_CACHE_DIR", str(cache))
    (tmp_path / "hellaswag").mkdir()
    (tmp_path / "hellaswag" / "hellaswag_val.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in JSONL))
    script.main(["--output", str(tmp_path / "out.bin")])
    gpt2 = gpt2_encoding()
    examples = read_evalfile(tmp_path / "out.bin", vocab_size=50257)
    assert [e.label for e in examples] == [3, 0]
    for example, record in zip(examples, JSONL):   # llm.c: the context, then " " + each ending
        assert example.context.tolist() == gpt2.encode(record["ctx"])
        assert [c.tolist() for c in example.completions] == [gpt2.encode(" " + ending)
                                                             for ending in record["endings"]]
    assert examples[0].context.tolist()[:4] == [32, 582, 318, 5586]   # "A man is sitting"


def test_script_with_a_sentencepiece_tokenizer(script, tmp_path):
    needs.package("sentencepiece")
    from llmc.tokenizer import (export_llama2c_tokenizer, sentencepiece_processor,
                                train_sentencepiece)
    text = tmp_path / "text.txt"
    text.write_text("".join(f"{r['ctx']} {' '.join(r['endings'])}\n" for r in JSONL) * 20)
    data = tmp_path / "sp"
    data.mkdir()
    model = train_sentencepiece(str(text), str(data / "tokenizer"), 300)
    export_llama2c_tokenizer(model, str(data / "tokenizer.bin"))
    (tmp_path / "hellaswag").mkdir()
    (tmp_path / "hellaswag" / "hellaswag_val.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in JSONL))
    script.main(["--tokenizer", str(data / "tokenizer.bin")])
    sp = sentencepiece_processor(model)
    examples = read_evalfile(data / "hellaswag_val.bin", vocab_size=300)
    for example, record in zip(examples, JSONL):   # a document's BOS, then the context
        assert example.context.tolist() == [sp.bos_id()] + sp.encode(record["ctx"])
        assert [c.tolist() for c in example.completions] == [sp.encode(ending)
                                                             for ending in record["endings"]]
