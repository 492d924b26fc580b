"""
A LoRA adapter for llama.cpp (dev/export.py ADAPTER --format gguf: llmc/formats/gguf.py's
write_gguf_lora), the merged model's GGUF (--merge), and a Hugging Face byte-level BPE
tokenizer.json as GGUF's vocabulary (llmc/formats/hf_tokenizer.py's hf_gguf_vocab), on a model
of SmolLM2's shape transformers makes at test time (3 query heads on 1 key/value head, tied)
with an adapter of random B on all seven projections of both layers (PEFT's B starts at zero,
which would hide a wrong file behind the base's logits).

Without llama.cpp: the adapter GGUF reads back through gguf with llama.cpp's keys, names,
shapes (the checks llama_adapter_lora_init makes against the base GGUF) and alpha, and B's q
and k rows in the order of the base GGUF's own q and k rows: both are transformers' rows put
through llama.cpp's converter's permute, written here from its definition.  Where
llama-cpp-python is installed: llama.cpp loads the base GGUF with the adapter, its logits on a
stretch of tokens within TOLERANCE of ours with the adapter, and its greedy decode ours token
for token; the merged GGUF the same without the adapter; llama.cpp's tokenizer splits text as
the tokenizers package does, for each pre-tokenizer GGUF export names.  Planted faults (B's q
and k rows left in PEFT's order; alpha written as r) fail the comparison.  Bad input (an
adapter to another format, a base not found or of other shapes, a tokenizer GGUF export does
not take (neither byte-level nor SentencePiece-style, or one that splits otherwise), a model
with switches no architecture it writes has) is one line.
"""
import json
import shutil

import numpy as np
import pytest

from dev import export
from llmc import adapter as lora
from llmc.families import family_of_file
from llmc.formats.gguf import write_gguf, write_gguf_lora
from llmc.formats.hf_tokenizer import LLAMA3_SPLIT, hf_gguf_vocab, read_hf_tokenizer
from llmc.formats.huggingface import read_safetensors
from llmc.sampler import Sampler, continue_prompt
from tests import needs
from tests.hf_models import make_hf_model
from tests.hf_tokenizers import corpus, random_strings
from test_export import run_export  # noqa: E402   (tests/ on the path, as conftest's)

gguf = needs.package("gguf")
torch = needs.package("torch")
needs.package("transformers")

RANK, ALPHA = 4, 8.0   # the updates scale by 2: alpha written as r shows
TOLERANCE = 2e-5       # max |diff| / max |logit|, float32 on both sides (measured 2.3e-6)
PROMPT, STEPS = "the quick brown fox", 16
GGML_TYPE_F32 = 0      # llama.cpp's KV cache in float32, as ours
# ours -> transformers' module, and the heads its rows rotate in (None: not rotated)
MODULES = {"wq": ("self_attn.q_proj", "num_attention_heads"),
           "wk": ("self_attn.k_proj", "num_key_value_heads"), "wv": ("self_attn.v_proj", None),
           "wo": ("self_attn.o_proj", None), "w1": ("mlp.gate_proj", None),
           "w2": ("mlp.down_proj", None), "w3": ("mlp.up_proj", None)}
GGUF_NAMES = {"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
              "w1": "ffn_gate", "w2": "ffn_down", "w3": "ffn_up"}


def llama_cpp_permute(rows, n_head):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: transformers' q or k rows (rotate
    half, per head) to the adjacent pairs of GGUF's "llama" architecture."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]) \
        .swapaxes(1, 2).reshape(rows.shape)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The base model's folder, its transformers config, our model with the adapter attached,
    the adapter's folder (PEFT's layout) and the three GGUF files export.py writes of them:
    base, adapter, merged."""
    root = tmp_path_factory.mktemp("lora_gguf")
    # weights drawn wider than transformers' init (0.02), whose greedy text repeats one token
    hf = make_hf_model("smollm2", root / "base", initializer_range=0.2)
    family, _ = family_of_file(root / "base")
    ours = family.model_class.from_checkpoint(root / "base")
    lora.attach(ours, RANK, ALPHA)
    values = np.array(ours.lora_params)
    rng = np.random.default_rng(1)
    for name, view in ours.lora_layout.views(values).items():
        if name.endswith(".lora_B"):
            view[...] = rng.standard_normal(view.shape) * 0.05
    ours.lora_params = values
    lora.write_adapter(root / "adapter", ours, base_model=str(root / "base"))
    export.main([str(root / "base"), "--format", "gguf", "-o", str(root / "base.gguf")])
    export.main([str(root / "adapter"), "--format", "gguf", "-o", str(root / "adapter.gguf")])
    export.main([str(root / "base"), "--format", "gguf", "-o", str(root / "merged.gguf"),
                 "--merge", str(root / "adapter")])
    return dict(root=root, hf_config=hf.config, ours=ours, base=root / "base",
                adapter=root / "adapter", base_gguf=root / "base.gguf",
                adapter_gguf=root / "adapter.gguf", merged_gguf=root / "merged.gguf")


def field(reader, key):
    return reader.get_field(key).contents()


def test_the_adapter_gguf_is_llama_cpps_layout(files):
    reader, base = gguf.GGUFReader(files["adapter_gguf"]), gguf.GGUFReader(files["base_gguf"])
    assert (field(reader, "general.type"), field(reader, "general.architecture"),
            field(reader, "adapter.type"), field(reader, "adapter.lora.alpha")) == \
        ("adapter", "llama", "lora", ALPHA)
    tensors = {t.name: t for t in reader.tensors}
    base_tensors = {t.name: t for t in base.tensors}
    peft = dict(read_safetensors(files["adapter"] / lora.ADAPTER_WEIGHTS))
    config = files["hf_config"]
    expected = set()
    for layer in range(config.num_hidden_layers):
        for ours, (module, heads) in MODULES.items():
            name = f"blk.{layer}.{GGUF_NAMES[ours]}.weight"
            expected |= {f"{name}.lora_a", f"{name}.lora_b"}
            a, b, w = tensors[f"{name}.lora_a"], tensors[f"{name}.lora_b"], base_tensors[name]
            # ggml's shapes (ne), as llama_adapter_lora_init checks them against the base's
            assert (a.shape[0], b.shape[1], a.shape[1], b.shape[0]) == \
                (w.shape[0], w.shape[1], RANK, RANK), name
            assert a.tensor_type == b.tensor_type == gguf.GGMLQuantizationType.F32
            key = f"base_model.model.model.layers.{layer}.{module}.lora_%s.weight"
            B = peft[key % "B"]
            if heads is not None:   # rows as the base GGUF's: transformers' through permute
                B = llama_cpp_permute(B, getattr(config, heads))
            np.testing.assert_array_equal(np.asarray(a.data), peft[key % "A"])
            np.testing.assert_array_equal(np.asarray(b.data), B)
    assert set(tensors) == expected
    hf_weights = dict(read_safetensors(files["base"] / "model.safetensors"))
    np.testing.assert_array_equal(   # the base GGUF's q rows are transformers' permuted so
        np.asarray(base_tensors["blk.1.attn_q.weight"].data),
        llama_cpp_permute(hf_weights["model.layers.1.self_attn.q_proj.weight"],
                          config.num_attention_heads))


def test_a_hf_tokenizer_json_is_the_ggufs_vocabulary(files):
    reader = gguf.GGUFReader(files["base_gguf"])
    spec = json.loads((files["base"] / "tokenizer.json").read_text())
    tokens = field(reader, "tokenizer.ggml.tokens")
    by_id = {i: text for text, i in spec["model"]["vocab"].items()}
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    assert len(tokens) == 512 and tokens[:len(by_id)] == [by_id[i] for i in range(len(by_id))]
    assert field(reader, "tokenizer.ggml.merges") == [" ".join(m) for m in spec["model"]["merges"]]
    types = field(reader, "tokenizer.ggml.token_type")
    assert [gguf.TokenType(t) for t in (types[0], types[3], types[511])] == \
        [gguf.TokenType.CONTROL, gguf.TokenType.NORMAL, gguf.TokenType.UNUSED]
    assert field(reader, "tokenizer.ggml.add_bos_token") is False   # SmolLM2 puts no BOS


def test_bad_input_is_one_line(files, tmp_path, capsys):
    """Each refusal is one line, exit status 2 for the arguments and 1 otherwise, and writes
    nothing."""
    settings = json.loads((files["adapter"] / lora.ADAPTER_CONFIG).read_text())
    shutil.copytree(files["adapter"], tmp_path / "hub_named")   # PEFT's from the hub
    (tmp_path / "hub_named" / lora.ADAPTER_CONFIG).write_text(
        json.dumps(dict(settings, base_model_name_or_path="HuggingFaceTB/SmolLM2-135M")))
    make_hf_model("tinyllama", tmp_path / "tinyllama")   # 4 heads of 16: every shape differs
    make_hf_model("qwen3", tmp_path / "qwen3_scaled", rope_parameters=dict(
        rope_type="llama3", rope_theta=1e6, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=32))   # no llama.cpp qwen3 has it
    for name, change in (("split_otherwise", dict(normalizer=None, pre_tokenizer=dict(
            type="Metaspace", replacement="\u2581", prepend_scheme="always", split=True))),
            ("neither_kind", dict(model=dict(byte_fallback=False)))):
        shutil.copytree(tmp_path / "tinyllama", tmp_path / name)
        spec = json.loads((tmp_path / name / "tokenizer.json").read_text())
        for key, value in change.items():
            spec[key] = dict(spec[key], **value) if key == "model" else value
        (tmp_path / name / "tokenizer.json").write_text(json.dumps(spec))
    shutil.copytree(files["base"], tmp_path / "unknown_pre")
    spec = json.loads((tmp_path / "unknown_pre" / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["add_prefix_space"] = True
    (tmp_path / "unknown_pre" / "tokenizer.json").write_text(json.dumps(spec))
    capsys.readouterr()   # transformers' progress bars
    cases = [
        ((files["adapter"], "--format", "hf"), 2,
         "a LoRA adapter goes to gguf (llama.cpp's --lora), not hf"),
        ((files["adapter"], "--format", "gguf", "--check"), 2, "not for a LoRA adapter"),
        ((files["base"], "--format", "gguf", "--base", files["base"]), 2,
         "is not a LoRA adapter folder"),
        ((tmp_path / "hub_named", "--format", "gguf"), 1, "is not a path here: name it with --base"),
        ((tmp_path / "hub_named", "--format", "gguf", "--base", tmp_path / "tinyllama"), 1,
         "an adapter of another base model"),
        ((tmp_path / "neither_kind", "--format", "gguf"), 1,
         "GGUF export takes a byte-level BPE tokenizer.json"),
        ((tmp_path / "split_otherwise", "--format", "gguf"), 1,
         "a SentencePiece-style tokenizer.json goes to GGUF with U+2581 before the text"),
        ((tmp_path / "unknown_pre", "--format", "gguf"), 1,
         "is none of those GGUF export names for llama.cpp"),
        ((tmp_path / "qwen3_scaled", "--format", "gguf"), 1,
         "the model has Llama 3's RoPE scaling on a Qwen block"),
    ]
    for args, status, message in cases:
        code, line = run_export(capsys, *args, "-o", tmp_path / "out.gguf")
        assert (code, len(line.splitlines())) == (status, 1) and message in line, (args, line)
        assert line.startswith("export.py: error: ")
        assert not (tmp_path / "out.gguf").exists()


# ----------------------------------------------------------------------------
# in llama.cpp

@pytest.fixture(scope="module")
def llama_cpp():
    return needs.package("llama_cpp")


def load(llama_cpp, path, lora_path=None, vocab_only=False):
    """llama.cpp's model (llama-cpp-python's Llama), float32 KV cache, all positions' logits;
    with lora_path its adapter, once llama.cpp accepts it (llama-cpp-python 0.3.36 misses the
    NULL llama_adapter_lora_init returns for an adapter it refuses, and the process crashes
    later: asked here first, on the model's own pointer)."""
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False,
                          n_threads=2, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32,
                          vocab_only=vocab_only)
    if lora_path is None:
        return llm
    adapter = llama_cpp.llama_adapter_lora_init(llm._model.model, str(lora_path).encode())
    assert adapter, f"llama.cpp refused the adapter {lora_path} (verbose=True says why)"
    llama_cpp.llama_adapter_lora_free(adapter)
    return llama_cpp.Llama(model_path=str(path), lora_path=str(lora_path), n_ctx=128,
                           logits_all=True, verbose=False, n_threads=2, type_k=GGML_TYPE_F32,
                           type_v=GGML_TYPE_F32)


def llama_cpp_logits(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[:len(tokens)], dtype=np.float32)


def llama_cpp_greedy(llm, prompt, steps):
    """llama.cpp's greedy continuation: each next token its logits' argmax."""
    llm.reset()
    llm.eval(prompt)
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(tokens[-1:])
    return tokens


def our_logits(model, tokens):
    model.forward(np.array([tokens], dtype=np.int32))
    return np.asarray(model.logits)[0, :, :model.config.vocab_size].copy()


def our_greedy(model, prompt, steps):
    """generate.py's greedy continuation (temperature 0, the KV cache)."""
    return list(continue_prompt(model, prompt, steps, Sampler(temperature=0), ()))


@pytest.fixture(scope="module")
def ours(files):
    """Our model with the adapter: logits on a stretch of tokens, the greedy continuation of
    PROMPT, and how far the adapter moves the logits from the base's."""
    model = files["ours"]
    tokens = [int(t) for t in np.random.default_rng(0).integers(3, 400, 40)]
    prompt = read_hf_tokenizer(files["base"]).encode(PROMPT)
    logits = our_logits(model, tokens)
    base = family_of_file(files["base"])[0].model_class.from_checkpoint(files["base"])
    moved = np.abs(logits - our_logits(base, tokens)).max() / np.abs(logits).max()
    return dict(tokens=tokens, logits=logits, prompt=prompt,
                greedy=our_greedy(model, prompt, STEPS), moved=moved)


def error_of(theirs, ours):
    return float(np.abs(theirs - ours).max() / np.abs(ours).max())


def test_llama_cpp_runs_the_adapter_as_we_do(llama_cpp, files, ours):
    assert ours["moved"] > 100 * TOLERANCE   # the adapter changes the logits
    llm = load(llama_cpp, files["base_gguf"], files["adapter_gguf"])
    assert error_of(llama_cpp_logits(llm, ours["tokens"]), ours["logits"]) <= TOLERANCE
    assert llama_cpp_greedy(llm, ours["prompt"], STEPS) == ours["greedy"]


def test_the_merged_gguf_decodes_in_llama_cpp_as_we_do(llama_cpp, files, ours):
    llm = load(llama_cpp, files["merged_gguf"])
    assert error_of(llama_cpp_logits(llm, ours["tokens"]), ours["logits"]) <= TOLERANCE
    assert llama_cpp_greedy(llm, ours["prompt"], STEPS) == ours["greedy"]


def test_planted_fault_b_rows_in_pefts_order(llama_cpp, files, ours, tmp_path, monkeypatch):
    monkeypatch.setattr(lora, "hf_adjacent_pair_rows", lambda rows, heads: rows)
    export.main([str(files["adapter"]), "--format", "gguf", "-o", str(tmp_path / "a.gguf")])
    llm = load(llama_cpp, files["base_gguf"], tmp_path / "a.gguf")
    assert error_of(llama_cpp_logits(llm, ours["tokens"]), ours["logits"]) > 100 * TOLERANCE


def test_planted_fault_alpha_written_as_r(llama_cpp, files, ours, tmp_path):
    family, _ = family_of_file(files["base"])
    config = family.read_model(files["base"])[0]
    settings, stacks = lora.read_adapter_file(files["adapter"], config,
                                              family.model_class.LORA_TARGETS, config.n_layers)
    write_gguf_lora(tmp_path / "a.gguf", settings._replace(alpha=float(RANK)), stacks, config)
    llm = load(llama_cpp, files["base_gguf"], tmp_path / "a.gguf")
    assert error_of(llama_cpp_logits(llm, ours["tokens"]), ours["logits"]) > 100 * TOLERANCE


BYTE_LEVEL = dict(type="ByteLevel", add_prefix_space=False, trim_offsets=True)
PRE_TOKENIZERS = {   # GGUF's name -> tokenizer.json's pre_tokenizer, the model's ignore_merges
    "gpt-2": (dict(BYTE_LEVEL, use_regex=True), False),
    "smollm": (dict(type="Sequence", pretokenizers=[
        dict(type="Digits", individual_digits=True), dict(BYTE_LEVEL, use_regex=True)]), False),
    "llama-bpe": (dict(type="Sequence", pretokenizers=[
        dict(type="Split", pattern=dict(Regex=LLAMA3_SPLIT), behavior="Isolated", invert=False),
        dict(BYTE_LEVEL, use_regex=False)]), True),
}


@pytest.mark.parametrize("pre", PRE_TOKENIZERS)
def test_llama_cpp_tokenizes_as_tokenizers_does(llama_cpp, files, tmp_path, pre):
    folder = tmp_path / pre
    shutil.copytree(files["base"], folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"], spec["model"]["ignore_merges"] = PRE_TOKENIZERS[pre]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    config, params = family_of_file(folder)[0].read_model(folder)
    vocab = hf_gguf_vocab(folder, config.vocab_size)
    assert vocab.pre == pre
    write_gguf(tmp_path / "m.gguf", config, params, vocab)
    llm = load(llama_cpp, tmp_path / "m.gguf", vocab_only=True)
    ours = read_hf_tokenizer(folder)
    texts = corpus(40, seed=1) + random_strings(100, ()) + ["In 1984, 12345 apples cost $678.90"]
    for text in texts:
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == \
            ours.encode_text(text), text
