"""
dev/export.py: every format from either family, and the Hugging Face export checked against
transformers itself (AutoModelForCausalLM's logits equal ours, AutoTokenizer's ids equal
tiktoken's and SentencePiece's), and lm-evaluation-harness run offline on an export, its
loglikelihoods equal to ours.  transformers and lm-eval are test oracles: their tests skip
without them.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import needs
from llmc import tokenizer
from llmc.checkpoint import checkpoint_paths
from llmc.families import family_of_file
from llmc.formats import FormatError
from llmc.formats.gguf import gguf_vocab, write_gguf
from llmc.formats.huggingface import (llama_to_hf, read_hf_model, read_safetensors,
                                      sentencepiece_hf_vocab, write_hf_model)
from llmc.formats.llama2c import LLAMA2C_MAGIC, write_llama_model
from llmc.formats.llmc import checkpoint_dtype, read_checkpoint, write_checkpoint
from train_gpt2 import GPT2, GPT2Config
from train_llama2 import Llama2, LlamaConfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "dev"))
import export  # noqa: E402

PRETRAINED = os.path.join(REPO, "gpt2_124M.bin")
FIXED_TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, "
              "speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n")
TOLERANCE = 1e-5   # max |ours - theirs| / max |ours|, both float32


def text():
    if os.path.exists(needs.TINYSHAKESPEARE):
        with open(needs.TINYSHAKESPEARE, encoding="utf-8") as f:
            return f.read()[:20_000]
    return FIXED_TEXT * 20


@pytest.fixture(scope="module")
def gpt2():
    """tiktoken's GPT-2 encoding, or a skip where its ranks cannot be had."""
    return needs.gpt2_encoding()


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    """A 400-token SentencePiece vocabulary trained on some Shakespeare as the data script
    trains them: (tokenizer.model, tokenizer.bin) side by side."""
    needs.package("sentencepiece")
    out = tmp_path_factory.mktemp("sp")
    (out / "text.txt").write_text(text() * (1 if os.path.exists(needs.TINYSHAKESPEARE) else 5))
    model = tokenizer.train_sentencepiece(str(out / "text.txt"), str(out / "tokenizer"), 400)
    tokenizer.export_llama2c_tokenizer(model, str(out / "tokenizer.bin"))
    return out / "tokenizer.model", out / "tokenizer.bin"


def gpt2_batch(gpt2, B, T):
    ids = gpt2.encode(text())
    return np.array([ids[b * T:(b + 1) * T] for b in range(B)], dtype=np.int32)


def run_export(capsys, *args):
    """dev/export.py's main on these arguments: (exit status, its one line of output)."""
    try:
        export.main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    if isinstance(code, str):   # sys.exit(message)
        return 1, code
    return code, (out if code == 0 else err).strip()


def our_logits(model_path, batch):
    family, _ = family_of_file(model_path)
    model = family.model_class.from_checkpoint(str(model_path))
    model.forward(batch)
    return model.activation("logits")


def hf_logits(folder, batch):
    """transformers' logits of the exported folder, in float32 whatever its file's dtype."""
    torch = needs.package("torch")
    transformers = needs.package("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        return model(torch.from_numpy(batch.astype(np.int64))).logits.numpy()


def assert_same_logits(ours, theirs):
    vocab = theirs.shape[-1]
    error = np.abs(ours[..., :vocab] - theirs).max() / np.abs(ours).max()
    assert error < TOLERANCE, f"max |diff| / max |logit| = {error:.2e}"


# --- GPT-2 to Hugging Face ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpt2_d2_exports_to_transformers(gpt2, tmp_path, capsys, dtype):
    """A d2 GPT-2 from llm.c's fp32 (version 3) and bf16 (version 5) files: GPT2LMHeadModel's
    logits equal ours, the safetensors in the file's dtype, the real vocabulary only."""
    needs.package("transformers")
    model = GPT2.random(GPT2Config.from_depth(2, max_seq_len=64), seed=3)
    model.save(str(tmp_path / "m.bin"), dtype=dtype)
    code, line = run_export(capsys, tmp_path / "m.bin", "--format", "hf", "-o", tmp_path / "hf",
                            "--check")
    assert code == 0 and f"Hugging Face transformers, {dtype}" in line and "read back equal" in line
    batch = gpt2_batch(gpt2, 2, 32)
    assert_same_logits(our_logits(tmp_path / "m.bin", batch), hf_logits(tmp_path / "hf", batch))
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["vocab_size"] == 50257 and hf_config["dtype"] == dtype
    with open(tmp_path / "hf" / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert header["transformer.wte.weight"]["shape"] == [50257, 128]
    assert header["transformer.h.1.attn.c_attn.weight"]["dtype"] == {"float32": "F32",
                                                                      "bfloat16": "BF16"}[dtype]


def test_gpt2_124M_exports_to_transformers(gpt2, tmp_path, capsys):
    """GPT-2 124M (gpt2_124M.bin where it is here, else d12 at random): the slowest test here,
    500 MB a file; one forward at T=16."""
    needs.package("transformers")
    model_path = PRETRAINED
    if not os.path.exists(PRETRAINED):
        model_path = tmp_path / "d12.bin"
        GPT2.random(GPT2Config.from_depth(12), seed=1).save(str(model_path))
    code, line = run_export(capsys, model_path, "--format", "hf", "-o", tmp_path / "hf")
    assert code == 0, line
    batch = gpt2_batch(gpt2, 1, 16)
    assert_same_logits(our_logits(model_path, batch), hf_logits(tmp_path / "hf", batch))
    shutil.rmtree(tmp_path / "hf")   # 1 GB that pytest would keep
    if model_path != PRETRAINED:
        os.remove(model_path)


def test_gpt2_tokenizer_encodes_as_tiktoken(gpt2, tmp_path, capsys):
    transformers = needs.package("transformers")
    GPT2.random(GPT2Config.from_depth(1, max_seq_len=32)).save(str(tmp_path / "m.bin"))
    assert run_export(capsys, tmp_path / "m.bin", "--format", "hf", "-o", tmp_path / "hf")[0] == 0
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    for sentence in ("Hello world, it's   a test: ünïcødé 123\n\n  x!", text()[:2000]):
        assert theirs.encode(sentence) == gpt2.encode(sentence)
    assert theirs.eos_token_id == 50256 and theirs.decode(gpt2.encode(text()[:500])) == text()[:500]


# --- Llama to Hugging Face ------------------------------------------------------------------

def llama_files(tmp_path, sentencepiece):
    """A d3 Llama (3 query heads on 1 kv head, its own classifier) as llama2.c's version 1, and
    a d2 (2 heads on 1) with a shared classifier, rope_theta and norm_eps other than llama2.c's
    as GGUF (which keeps both), each with the 400-token SentencePiece vocabulary."""
    d3 = LlamaConfig.from_name("d3", vocab_size=400, max_seq_len=64, shared_classifier=False)
    write_llama_model(tmp_path / "d3.bin", d3, Llama2.random(d3, seed=4).params)
    d2 = LlamaConfig.from_name("d2", vocab_size=400, max_seq_len=64, rope_theta=500000.0,
                               norm_eps=1e-6)
    assert (d2.n_heads, d2.n_kv_heads, d2.shared_classifier) == (2, 1, True)
    write_gguf(tmp_path / "d2.gguf", d2, Llama2.random(d2, seed=5).params,
               gguf_vocab(sentencepiece[1], 400))
    return tmp_path / "d3.bin", tmp_path / "d2.gguf"


def sentencepiece_batch(model_path, B, T):
    sp = tokenizer.sentencepiece_processor(str(model_path))
    ids = [sp.bos_id()] + sp.encode(text())
    return np.array([ids[b * T:(b + 1) * T] for b in range(B)], dtype=np.int32)


def test_llama_exports_to_transformers(sentencepiece, tmp_path, capsys):
    """LlamaForCausalLM's logits equal ours, grouped-query heads, a separate or shared head,
    rope_theta and norm_eps; the tokenizer found from tokenizer.bin beside tokenizer.model."""
    needs.package("transformers")
    batch = sentencepiece_batch(sentencepiece[0], 2, 24)
    for model_path, vocabulary in zip(llama_files(tmp_path, sentencepiece), sentencepiece):
        out = tmp_path / f"hf_{model_path.stem}"
        code, line = run_export(capsys, model_path, "--format", "hf", "-o", out, "--tokenizer",
                                vocabulary, "--check")
        assert code == 0 and "read back equal" in line, line
        assert_same_logits(our_logits(model_path, batch), hf_logits(out, batch))
    hf_config = json.loads((tmp_path / "hf_d2" / "config.json").read_text())
    assert hf_config["rope_parameters"]["rope_theta"] == 500000.0
    assert hf_config["rms_norm_eps"] == 1e-6 and hf_config["tie_word_embeddings"]
    assert "lm_head.weight" not in read_safetensors(tmp_path / "hf_d2" / "model.safetensors")


def test_unpermuted_qk_rows_give_other_logits(sentencepiece, tmp_path):
    """The planted fault: q and k rows left in our adjacent-pair order, which transformers'
    rotate-half RoPE reads otherwise, change the logits far beyond the tolerance."""
    needs.package("transformers")
    d3_path, _ = llama_files(tmp_path, sentencepiece)
    config, params = family_of_file(d3_path)[0].read_model(d3_path)
    tensors, hf_config = llama_to_hf(config, params, rotate_half_rows=False)
    write_hf_model(tmp_path / "hf", tensors, hf_config,
                   sentencepiece_hf_vocab(sentencepiece[0], config.max_seq_len))
    batch = sentencepiece_batch(sentencepiece[0], 2, 24)
    with pytest.raises(AssertionError, match="max |diff|"):
        assert_same_logits(our_logits(d3_path, batch), hf_logits(tmp_path / "hf", batch))


def test_sentencepiece_tokenizer_encodes_as_sentencepiece(sentencepiece, tmp_path, capsys):
    """BOS, then SentencePiece's own ids: its extra spaces removed as SentencePiece removes them."""
    transformers = needs.package("transformers")
    needs.package("google.protobuf")   # transformers reads a tokenizer.model through it
    d3_path, _ = llama_files(tmp_path, sentencepiece)
    assert run_export(capsys, d3_path, "--format", "hf", "-o", tmp_path / "hf", "--tokenizer",
                      sentencepiece[0])[0] == 0
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    sp = tokenizer.sentencepiece_processor(str(sentencepiece[0]))
    for sentence in ("Hello world, it's   a test: ünïcødé 123\n\n  x! ", " First Citizen:",
                     text()[:2000]):
        assert theirs.encode(sentence) == [sp.bos_id()] + sp.encode(sentence)
    assert (theirs.bos_token_id, theirs.eos_token_id) == (sp.bos_id(), sp.eos_id())


def test_llama_on_gpt2_tokens_gets_gpt2s_tokenizer(gpt2, tmp_path, capsys):
    """A Llama trained on GPT-2 tokens (the data scripts' default): GPT-2's tokenizer files,
    the default for a model of its 50257 tokens."""
    transformers = needs.package("transformers")
    config = LlamaConfig.from_name("d1", vocab_size=50257, max_seq_len=32)
    write_llama_model(tmp_path / "m.bin", config, Llama2.random(config, seed=6).params)
    code, line = run_export(capsys, tmp_path / "m.bin", "--format", "hf", "-o", tmp_path / "hf")
    assert code == 0, line
    assert sorted(os.listdir(tmp_path / "hf")) == [
        "config.json", "generation_config.json", "merges.txt", "model.safetensors",
        "tokenizer_config.json", "vocab.json"]
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert theirs.encode(text()[:1000]) == gpt2.encode(text()[:1000])
    batch = gpt2_batch(gpt2, 1, 16)
    assert_same_logits(our_logits(tmp_path / "m.bin", batch), hf_logits(tmp_path / "hf", batch))


# --- every format, from any model file or a run's output dir ---------------------------------

def test_every_format_reads_back(sentencepiece, tmp_path, capsys):
    """llm.c's fp32 <-> bf16, llama2.c's version 0 (the default) and 1, GGUF and Hugging Face:
    each read back equal (--check; to bf16 its values rounded), whatever format it came from."""
    needs.package("gguf")
    needs.package("safetensors")
    GPT2.random(GPT2Config.from_depth(1, max_seq_len=16, vocab_size=400)).save(str(tmp_path / "g.bin"))
    d3_path, d2_path = llama_files(tmp_path, sentencepiece)
    for args in (("g.bin", "llmc", "g16.bin", "--dtype", "bfloat16"), ("g16.bin", "llmc", "g16_again.bin"),
                 ("g16.bin", "llmc", "g32.bin", "--dtype", "float32"),
                 ("g.bin", "hf", "g_hf", "--tokenizer", sentencepiece[0], "--dtype", "bfloat16"),
                 ("g16.bin", "hf", "g16_hf", "--tokenizer", sentencepiece[0]),
                 (d3_path, "llama2c", "v0.bin"), ("v0.bin", "llama2c", "v1.bin", "--version", "1"),
                 ("v1.bin", "gguf", "d3.gguf", "--tokenizer", sentencepiece[0]),
                 ("v1.bin", "gguf", "d3_bf16.gguf", "--tokenizer", sentencepiece[0], "--dtype",
                  "bfloat16"),
                 (d2_path, "gguf", "d2_again.gguf", "--tokenizer", sentencepiece[1])):
        source, fmt, out, *rest = args
        code, line = run_export(capsys, tmp_path / source, "--format", fmt, "-o", tmp_path / out,
                                "--check", *rest)
        assert code == 0 and "read back equal" in line, (args, line)
    assert [checkpoint_dtype(tmp_path / name) for name in ("g16.bin", "g16_again.bin", "g32.bin")] \
        == ["bfloat16", "bfloat16", "float32"]   # --dtype's default: the file's
    magics = [int.from_bytes((tmp_path / name).read_bytes()[:4], "little")
              for name in ("v0.bin", "v1.bin")]
    assert magics[0] != LLAMA2C_MAGIC and magics[1] == LLAMA2C_MAGIC   # version 0 has none
    # GGUF's BF16 as llama.cpp's converter writes it: the matrices bf16, the norms float32
    import gguf
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(tmp_path / "d3_bf16.gguf").tensors}
    assert types["blk.0.attn_q.weight"] == types["token_embd.weight"] == "BF16"
    assert types["blk.0.attn_norm.weight"] == types["output_norm.weight"] == "F32"
    config, params = read_checkpoint(tmp_path / "g16.bin", GPT2Config)
    for folder in ("g_hf", "g16_hf"):
        assert json.loads((tmp_path / folder / "config.json").read_text())["dtype"] == "bfloat16"
        config_back, params_back = read_hf_model(tmp_path / folder, {"gpt2": GPT2Config})
        assert config_back == config and np.array_equal(params_back, params)


def test_check_finds_a_file_that_does_not_read_back(tmp_path, capsys, monkeypatch):
    """--check compares what it reads back: a writer that changes one value is caught."""
    GPT2.random(GPT2Config.from_depth(1, max_seq_len=16, vocab_size=300)).save(str(tmp_path / "g.bin"))

    def one_value_off(path, config, params, dtype):
        params = params.copy()
        params[12345] += 1e-3
        write_checkpoint(path, config, params, dtype)
    monkeypatch.setattr(export, "write_checkpoint", one_value_off)
    code, line = run_export(capsys, tmp_path / "g.bin", "--format", "llmc", "-o",
                            tmp_path / "out.bin", "--check")
    assert code == 1 and line.endswith("out.bin does not read back as written"), line


def test_a_run_dir_gives_its_newest_complete_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    config = GPT2Config.from_depth(1, max_seq_len=16, vocab_size=300)
    models = {step: GPT2.random(config, seed=step) for step in (3, 6, 9)}
    for step, model in models.items():
        model_path, state_path, done_path = checkpoint_paths(run, step)
        model.save(str(model_path))
        open(state_path, "wb").close()   # not read: a complete checkpoint has one
        if step != 9:   # step 9 is not complete: no DONE
            open(done_path, "wb").close()
    code, line = run_export(capsys, run, "--format", "llmc", "-o", tmp_path / "out.bin")
    assert code == 0 and line.endswith(f"from {checkpoint_paths(run, 6)[0]}"), line
    assert np.array_equal(read_checkpoint(tmp_path / "out.bin", GPT2Config)[1], models[6].params)
    open(run / "vocab_map.bin", "wb").close()   # --compact-vocab's map: ids not the tokenizer's
    code, line = run_export(capsys, run, "--format", "hf", "-o", tmp_path / "hf", "--tokenizer",
                            "gpt2")
    assert code == 1 and "trained with --compact-vocab" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    code, line = run_export(capsys, empty, "--format", "llmc", "-o", tmp_path / "x.bin")
    assert code == 1 and "without a complete checkpoint" in line


def test_bad_exports_are_one_line(sentencepiece, tmp_path, capsys):
    """Each refusal is one line, exit status 2 for the arguments and 1 otherwise, and writes
    nothing."""
    GPT2.random(GPT2Config.from_depth(1, max_seq_len=16, vocab_size=300)).save(str(tmp_path / "g.bin"))
    d3_path, d2_path = llama_files(tmp_path, sentencepiece)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "taken.bin").write_text("x")
    (tmp_path / "lonely.bin").write_bytes(sentencepiece[1].read_bytes())
    cases = [
        ((tmp_path / "g.bin", "--format", "gguf"), 2, "a GPT-2 model goes to llmc or hf, not gguf"),
        ((d3_path, "--format", "llmc"), 2, "a Llama 2 model goes to llama2c, gguf or hf, not llmc"),
        ((d3_path, "--format", "hf"), 2, "argument --tokenizer: --format hf writes the vocabulary"),
        ((d3_path, "--format", "llama2c", "--dtype", "bfloat16"), 2, "llama2c is float32 only"),
        ((d3_path, "--format", "gguf", "--version", "1"), 2, "only llama2c has versions"),
        ((d3_path, "--format", "llama2c", "--tokenizer", "gpt2"), 2, "llama2c holds no vocabulary"),
        ((d2_path, "--format", "llama2c"), 1, "llama2.c's files cannot hold norm_eps"),
        ((d3_path, "--format", "hf", "--tokenizer", "gpt2"), 1,
         "the tokenizer has 50257 tokens, more than the model's vocabulary of 400"),
        ((d3_path, "--format", "gguf", "--tokenizer", tmp_path / "none.model"), 1,
         "GGUF takes llama2.c's tokenizer.bin, and there is no"),
        ((d3_path, "--format", "hf", "--tokenizer", tmp_path / "lonely.bin"), 1,
         "Hugging Face's tokenizer is built from SentencePiece's tokenizer.model, and there is no"),
        ((tmp_path / "taken.bin", "--format", "hf"), 1, "not a model file"),
    ]
    for args, status, message in cases:
        code, line = run_export(capsys, *args, "-o", tmp_path / "out")
        assert (code, len(line.splitlines())) == (status, 1) and message in line, (args, line)
        assert line.startswith("export.py: error: ")
        assert not (tmp_path / "out").exists()
    for fmt, output, message in (("hf", "full", "the folder is not empty"),
                                 ("hf", "taken.bin", "is a file"), ("llama2c", "taken.bin", "exists"),
                                 ("llama2c", "full", "is a folder")):
        code, line = run_export(capsys, d3_path, "--format", fmt, "-o", tmp_path / output,
                                *(("--tokenizer", sentencepiece[0]) if fmt == "hf" else ()))
        assert code == 1 and message in line, line
    assert (tmp_path / "taken.bin").read_text() == "x" and os.listdir(tmp_path / "full") == ["x"]
    assert not glob.glob(str(tmp_path / ".*.tmp"))


def test_a_failed_hf_export_leaves_nothing(tmp_path, monkeypatch):
    """A write that fails half-way (here the tokenizer's files) leaves neither the folder nor
    the one it was built in."""
    from llmc.formats import huggingface
    config = GPT2Config.from_depth(1, max_seq_len=16, vocab_size=300)
    tensors, hf_config = huggingface.gpt2_to_hf(config, GPT2.random(config).params)

    def fail(path, data):
        raise OSError(28, "No space left on device", str(path))
    vocab = huggingface.HFVocab({"vocab.json": b"{}"}, 1, 0, 0)
    monkeypatch.setattr(huggingface, "atomic_write", fail)
    with pytest.raises(OSError, match="No space left"):
        write_hf_model(tmp_path / "hf", tensors, hf_config, vocab)
    assert os.listdir(tmp_path) == []


def test_bad_hf_folders_are_format_errors(tmp_path):
    both = {"gpt2": GPT2Config, "llama": LlamaConfig}
    with pytest.raises(FormatError, match="no such file"):
        read_hf_model(tmp_path, both)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(FormatError, match="model_type 'bert' is not implemented"):
        read_hf_model(tmp_path, both)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(FormatError, match="GPT2LMHeadModel: not llama"):
        read_hf_model(tmp_path, {"llama": LlamaConfig})


# --- lm-evaluation-harness, offline ----------------------------------------------------------

TINY_TASK = [  # llmpyx_tiny's documents (tests/fixtures/lm_eval/llmpyx_tiny.yaml)
    {"context": "First Citizen:\nBefore we proceed any further, hear me",
     "choices": ["speak.", "run away.", "sleep"], "label": 0},
    {"context": "All:\nSpeak,", "choices": ["speak.", "never"], "label": 0},
    {"context": "You are all resolved rather to die than to", "choices": ["famish?", "eat"],
     "label": 0},
]


def loglikelihood(model, gpt2, context, continuation):
    """log P(continuation | context) and whether it is the greedy one, computed with our
    model: the continuation's tokens are those of the whole after the context's, as lm-eval
    splits them."""
    context_ids = gpt2.encode(context)
    continuation_ids = gpt2.encode(context + continuation)[len(context_ids):]
    ids = context_ids + continuation_ids
    model.forward(np.array([ids[:-1]], dtype=np.int32))
    logits = model.activation("logits")[0, :, :model.config.vocab_size].astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    rows = np.arange(len(context_ids) - 1, len(ids) - 1)
    return (float(logprobs[rows, continuation_ids].sum()),
            bool(np.all(logprobs[rows].argmax(-1) == continuation_ids)))


def run_lm_eval(tmp_path, name, command):
    """lm-eval's command line (command: its program and model options) on llmpyx_tiny, offline,
    from a folder holding the task's documents: (accuracy, the logged samples)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "tiny_task.jsonl").write_text("".join(json.dumps(d) + "\n" for d in TINY_TASK))
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1")
    results = tmp_path / f"results_{name}"
    run = subprocess.run(
        [sys.executable, *command, "--tasks", "llmpyx_tiny", "--include_path",
         os.path.join(HERE, "fixtures", "lm_eval"), "--batch_size", "1", "--output_path",
         str(results), "--log_samples"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    scores = json.loads(open(glob.glob(str(results / "*" / "results_*.json"))[0]).read())
    samples = [json.loads(line) for line in
               open(glob.glob(str(results / "*" / "samples_llmpyx_tiny_*.jsonl"))[0])]
    return scores["results"]["llmpyx_tiny"]["acc,none"], sorted(samples, key=lambda s: s["doc_id"])


def test_lm_eval_runs_offline_on_an_export_and_on_ours(gpt2, tmp_path, capsys):
    """lm-eval's Hugging Face model on the export of a d2, the task from a local file with no
    network: it gives an accuracy, and each choice's loglikelihood is our model's; and lm-eval
    on our model itself (dev/eval/lm_eval_llmpyx.py: the contexts once, over the KV cache)
    gives the same loglikelihoods, greedy flags and accuracy."""
    needs.package("lm_eval")
    needs.package("accelerate")   # lm-eval's Hugging Face model needs it
    model_path = tmp_path / "d2.bin"
    GPT2.random(GPT2Config.from_depth(2, max_seq_len=64), seed=7).save(str(model_path))
    assert run_export(capsys, model_path, "--format", "hf", "-o", tmp_path / "hf")[0] == 0
    accuracy, samples = run_lm_eval(tmp_path, "hf", [
        "-m", "lm_eval", "run", "--model", "hf", "--device", "cpu", "--model_args",
        f"pretrained={tmp_path / 'hf'},dtype=float32"])
    assert len(samples) == len(TINY_TASK)
    model = GPT2.from_checkpoint(str(model_path))
    right = 0
    for sample in samples:
        ours = [loglikelihood(model, gpt2, args["arg_0"], args["arg_1"])
                for args in sample["arguments"].values()]
        theirs = [(float(ll), greedy == "True") for ll, greedy in sample["filtered_resps"]]
        assert len(ours) == len(TINY_TASK[sample["doc_id"]]["choices"]) == len(theirs)
        for (ll, greedy), (their_ll, their_greedy) in zip(ours, theirs):
            assert abs(ll - their_ll) < 1e-4 * max(1.0, abs(ll)) and greedy == their_greedy
        right += int(np.argmax([ll for ll, _ in ours]) == sample["doc"]["label"])
    assert accuracy == right / len(TINY_TASK)

    direct, direct_samples = run_lm_eval(tmp_path, "ours", [
        os.path.join(ROOT, "dev", "eval", "lm_eval_llmpyx.py"), "run", "--model", "llmpyx",
        "--model_args", f"model={model_path},tokenizer=gpt2"])
    assert direct == accuracy
    for sample, theirs in zip(direct_samples, samples):
        assert sample["doc_id"] == theirs["doc_id"]
        for (ll, greedy), (their_ll, their_greedy) in zip(sample["filtered_resps"],
                                                          theirs["filtered_resps"]):
            assert abs(float(ll) - float(their_ll)) < 1e-4 * max(1.0, abs(float(ll)))
            assert greedy == their_greedy


FAKE_LM_EVAL = '''
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LM_EVAL_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
out = os.path.join(args[args.index("--output_path") + 1], "model")
os.makedirs(out)
scores = {"acc,none": 0.25, "acc_norm,none": 0.5, "exact_match,strict-match": 0.125}
with open(os.path.join(out, "results_1.json"), "w") as f:
    json.dump({"results": {args[args.index("--tasks") + 1]: scores}}, f)
'''


def test_run_eval_runs_the_leaderboard_tasks(tmp_path):
    """dev/eval/run_eval.sh with a stand-in for lm-eval that records its arguments and reports
    scores: the six tasks at the leaderboard's shots on the export, then the six scores (each
    task's own metric) and their average; without lm-eval, one line saying what to install."""
    fake = tmp_path / "fake" / "lm_eval"
    (fake / "models").mkdir(parents=True)
    for name in ("__init__.py", "models/__init__.py", "models/huggingface.py"):
        (fake / name).write_text("")
    (fake / "__main__.py").write_text(FAKE_LM_EVAL)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    script = os.path.join(REPO, "dev", "eval", "run_eval.sh")
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(tmp_path / "fake"),
               FAKE_LM_EVAL_LOG=str(tmp_path / "calls.jsonl"), LM_EVAL_ARGS="--limit 3")
    run = subprocess.run(["bash", script, str(tmp_path / "hf"), str(tmp_path / "out")], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    calls = [json.loads(line) for line in open(tmp_path / "calls.jsonl")]
    asked = [(c[c.index("--tasks") + 1], c[c.index("--num_fewshot") + 1]) for c in calls]
    assert asked == [("arc_challenge", "25"), ("hellaswag", "10"), ("mmlu", "5"),
                     ("truthfulqa_mc2", "0"), ("winogrande", "5"), ("gsm8k", "5")]
    assert all(c[:5] == ["run", "--model", "hf", "--model_args",
                         f"pretrained={tmp_path / 'hf'},dtype=float32"] and c[-2:] == ["--limit", "3"]
               for c in calls)
    lines = run.stdout.splitlines()
    assert ["arc_challenge", "25-shot", "acc_norm", "50.00"] in [line.split() for line in lines]
    assert ["gsm8k", "5-shot", "exact_match", "12.50"] in [line.split() for line in lines]
    assert lines[-1].split() == ["average", "31.25"]   # (50 + 50 + 25 + 25 + 25 + 12.5) / 6
    (fake / "models" / "huggingface.py").write_text("import accelerate_not_here\n")
    run = subprocess.run(["bash", script, str(tmp_path / "hf")], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 1 and run.stderr.count("\n") == 1
    assert "pip install 'lm-eval[hf]'" in run.stderr
    run = subprocess.run(["bash", script, str(tmp_path)], env=env, capture_output=True, text=True)
    assert run.returncode == 1 and "no config.json" in run.stderr
