"""
GGUF export beyond Llama 2's block (dev/export.py --format gguf: llmc/formats/gguf.py's
write_gguf), on models transformers makes at test time: a Qwen2-shaped one (a bias on q, k and
v; llama.cpp's "qwen2"), a Qwen3-shaped one (QK-norm, 4 heads of 32 on 64 channels; "qwen3")
a Llama 3-shaped one given a head size of its own (Llama 3's RoPE scaling as rope_freqs;
"llama"), and a TinyLlama-shaped one (Llama 2's block, 4 key/value heads), the Qwen ones with
Qwen's tokenizer.json pre-tokenizer and NFC normalizer, TinyLlama's with a SentencePiece-style
one (llama.cpp's "llama" tokenizer: scores from the merges).

Without llama.cpp: the GGUF holds llama.cpp's keys and tensor names, transformers' tensors in
the order llama.cpp's converter writes them (q and k rows, biases and norms as they are for the
Qwen layouts, which rotate halves; permuted to adjacent pairs for "llama"), rope_freqs as the
converter computes it; the Qwen GGUFs read back as the models they came from, Llama 3's is
refused in one line, and so is a config no architecture written here runs.  Where
llama-cpp-python is installed: llama.cpp's logits within TOLERANCE of ours, its greedy decode
ours token for token, a LoRA adapter on the Qwen3 GGUF the same; llama.cpp's tokenizer splits
NFC text as the tokenizers package does (llama.cpp does not apply Qwen's NFC normalizer), and
any text as TinyLlama's does.
Planted faults fail: q and k rows left in our order, the bias or the QK-norm left out,
rope_freqs left out, a LoRA B's q and k rows in our order.
"""
import dataclasses
import json
import unicodedata

import numpy as np
import pytest

from dev import export
from llmc import adapter as lora
from llmc.families import family_of_file
from llmc.formats import gguf as gguf_format
from llmc.formats.common import FormatError
from llmc.formats.gguf import GGUFVocab, read_gguf, write_gguf
from llmc.formats.hf_tokenizer import hf_gguf_vocab, read_hf_tokenizer
from llmc.formats.huggingface import read_hf_checkpoint
from tests import needs
from tests.hf_models import make_hf_model
from tests.hf_tokenizers import corpus, random_strings
from tests.test_lora_gguf import (PROMPT, STEPS, TOLERANCE, error_of, llama_cpp_greedy,
                                  llama_cpp_logits, load, our_greedy, our_logits)

gguf = needs.package("gguf")
needs.package("torch")
needs.package("transformers")

# tests/hf_models.py's architecture -> llama.cpp's, and the changes made to its config
ARCHITECTURES = {"qwen2": "qwen2", "qwen3": "qwen3", "llama3": "llama", "tinyllama": "llama"}
CHANGES = {"llama3": dict(head_dim=32)}   # 4 heads of 32 on 64 channels
# Qwen2.5's and Qwen3's tokenizer.json, as they spell it: NFC, then this split, then ByteLevel
QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_PRE_TOKENIZER = dict(type="Sequence", pretokenizers=[
    dict(type="Split", pattern=dict(Regex=QWEN_REGEX), behavior="Isolated", invert=False),
    dict(type="ByteLevel", add_prefix_space=False, trim_offsets=False, use_regex=False)])
# transformers' names -> llama.cpp's (its converter's map; {l}: blk.l. and model.layers.l.)
GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
              "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.up_proj.weight": "ffn_up.weight"}


def give_qwens_tokenizer(folder):
    """The folder's byte-level tokenizer.json made Qwen's kind: its NFC normalizer and
    pre-tokenizer (the merges learnt after GPT-2's split still make a BPE over these pieces)."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["normalizer"], spec["pre_tokenizer"] = {"type": "NFC"}, QWEN_PRE_TOKENIZER
    spec["model"]["ignore_merges"] = False
    (folder / "tokenizer.json").write_text(json.dumps(spec))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> the model of ARCHITECTURES made on first use: its folder, its GGUF (written by
    dev/export.py, the Qwen ones with --check), config.json and our model of the folder."""
    root, made = tmp_path_factory.mktemp("gguf_qwen"), {}

    def get(name):
        if name not in made:
            folder, path = root / name, root / f"{name}.gguf"
            # weights drawn wider than transformers' init, whose greedy text repeats one token
            make_hf_model(name, folder, initializer_range=0.2, **CHANGES.get(name, {}))
            if name.startswith("qwen"):
                give_qwens_tokenizer(folder)
            export.main([str(folder), "--format", "gguf", "-o", str(path)]
                        + ["--check"] * (name != "llama3"))
            family, _ = family_of_file(folder)
            made[name] = dict(folder=folder, gguf=path, family=family,
                              hf_config=json.loads((folder / "config.json").read_text()),
                              model=family.model_class.from_checkpoint(folder))
        return made[name]
    return get


def fields(path):
    reader = gguf.GGUFReader(path)
    return reader, lambda key: None if reader.get_field(key) is None else \
        reader.get_field(key).contents()


def adjacent_pairs(rows, n_head):
    """llama.cpp's converter's LlamaModel.permute: transformers' q or k rows to the adjacent
    pairs of its "llama" architecture."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]) \
        .swapaxes(1, 2).reshape(rows.shape)


def converters_rope_freqs(hf_config):
    """rope_freqs as llama.cpp's converter computes it (LlamaModel.generate_extra_tensors)."""
    rope, dim = hf_config["rope_parameters"], hf_config["head_dim"]
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    context, factor = rope["original_max_position_embeddings"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    divisors = []
    for freq in freqs:
        wavelength = 2 * np.pi / freq
        smooth = (context / wavelength - low) / (high - low)
        divisors.append(1.0 if wavelength < context / high else factor if wavelength > context / low
                        else 1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_the_gguf_is_llama_cpps_layout(exported, name):
    made = exported(name)
    reader, field = fields(made["gguf"])
    arch, hf_config = ARCHITECTURES[name], made["hf_config"]
    heads, channels = hf_config["num_attention_heads"], hf_config["hidden_size"]
    head_dim = hf_config.get("head_dim") or channels // heads
    assert field("general.architecture") == arch
    assert field(f"{arch}.rope.dimension_count") == head_dim
    own_head_size = head_dim * heads != channels
    assert field(f"{arch}.attention.key_length") == field(f"{arch}.attention.value_length") == \
        (head_dim if own_head_size else None)
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)
    expected = {}
    for hf_name, value in read_hf_checkpoint(made["folder"])[0].items():
        layer = hf_name.split(".")[2] if hf_name.startswith("model.layers.") else None
        if layer is None:
            theirs = GGUF_NAMES[hf_name]
        else:
            theirs = f"blk.{layer}.{GGUF_LAYER_NAMES[hf_name.split('.', 3)[3]]}"
        rotated = {"attn_q": heads, "attn_k": hf_config["num_key_value_heads"]}.get(
            theirs.split(".")[-2])
        if arch == "llama" and rotated:   # "llama" pairs adjacent channels; qwen2/3 halves
            value = adjacent_pairs(value, rotated)
        expected[theirs] = value
    if name == "llama3":
        np.testing.assert_allclose(tensors.pop("rope_freqs.weight"),
                                   converters_rope_freqs(hf_config), rtol=1e-6)
    assert set(tensors) == set(expected)
    for theirs, value in expected.items():
        np.testing.assert_array_equal(tensors[theirs].reshape(value.shape), value, theirs)


def test_qwens_tokenizer_is_ggufs_qwen2(exported):
    _, field = fields(exported("qwen2")["gguf"])
    assert (field("tokenizer.ggml.model"), field("tokenizer.ggml.pre")) == ("gpt2", "qwen2")
    assert field("tokenizer.ggml.add_bos_token") is False   # Qwen puts no BOS


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_a_qwen_gguf_reads_back_as_its_model(exported, name):
    made = exported(name)
    config, params = made["family"].read_model(made["folder"])
    config_back, params_back, _ = read_gguf(made["gguf"], made["family"].config_class)
    assert config_back == config and config.architecture.lower().startswith(name)
    np.testing.assert_array_equal(params_back, params)


def test_llama3s_rope_scaling_is_not_read_back(exported):
    made = exported("llama3")
    with pytest.raises(FormatError, match="rope_freqs.weight .* is not read back here") as e:
        read_gguf(made["gguf"], made["family"].config_class)
    assert len(str(e.value).splitlines()) == 1


def test_a_config_no_architecture_runs_is_refused(exported, tmp_path):
    made = exported("qwen3")
    config, params = made["family"].read_model(made["folder"])
    vocab = GGUFVocab("gpt2", ["x"] * config.vocab_size, [1] * config.vocab_size)
    both = dataclasses.replace(config, qkv_bias=True)
    with pytest.raises(ValueError, match="QK-norm beside a bias on q, k and v"):
        write_gguf(tmp_path / "m.gguf", both, np.zeros(both.num_parameters(), np.float32), vocab)
    scaled = dataclasses.replace(config, rope_scaling=("llama3", 8.0, 1.0, 4.0, 32.0))
    with pytest.raises(ValueError, match="Llama 3's RoPE scaling on a Qwen block"):
        write_gguf(tmp_path / "m.gguf", scaled, params, vocab)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------
# in llama.cpp

@pytest.fixture(scope="module")
def llama_cpp():
    return needs.package("llama_cpp")


TOKENS = [int(t) for t in np.random.default_rng(0).integers(3, 400, 40)]


def logits_error(llama_cpp, made, path=None):
    """max |llama.cpp's logits - ours| / max |ours| on TOKENS, of made's GGUF or path."""
    llm = load(llama_cpp, path or made["gguf"])
    return error_of(llama_cpp_logits(llm, TOKENS), our_logits(made["model"], TOKENS))


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_llama_cpp_runs_the_gguf_as_we_do(llama_cpp, exported, name):
    made = exported(name)
    assert logits_error(llama_cpp, made) <= TOLERANCE
    prompt = read_hf_tokenizer(made["folder"]).encode(PROMPT)
    ours = our_greedy(made["model"], prompt, STEPS)
    assert len(set(ours)) > 2   # a continuation, not one token repeated
    assert llama_cpp_greedy(load(llama_cpp, made["gguf"]), prompt, STEPS) == ours


@pytest.mark.parametrize("name", ["qwen3", "tinyllama"])
def test_llama_cpp_runs_a_bf16_gguf_as_near_as_our_bf16_model(llama_cpp, exported, name, tmp_path):
    """dev/export.py --dtype bfloat16 (llama.cpp's BF16: the matrices bf16): llama.cpp's logits
    on it are as near the float32 model's as our own bf16 model's are (both round the weights
    and their activations to bf16, in different places), and the file reads back."""
    made = exported(name)
    path = tmp_path / "m.gguf"
    export.main([str(made["folder"]), "--format", "gguf", "-o", str(path), "--dtype", "bfloat16",
                 "--check"])
    want = our_logits(made["model"], TOKENS)
    narrow = made["family"].model_class.from_checkpoint(made["folder"], precision="bf16",
                                                        trainable=False)
    ours = error_of(our_logits(narrow, TOKENS), want)
    theirs = error_of(llama_cpp_logits(load(llama_cpp, path), TOKENS), want)
    assert 0 < ours < 0.05 and theirs <= 3 * ours, (ours, theirs)


@pytest.mark.parametrize("name", ["qwen2", "tinyllama"])
def test_llama_cpp_tokenizes_as_the_models_tokenizer(llama_cpp, exported, name):
    """Qwen's (byte-level, "gpt2") on NFC text; TinyLlama's (SentencePiece-style, "llama") on
    any."""
    made = exported(name)
    llm = load(llama_cpp, made["gguf"], vocab_only=True)
    ours = read_hf_tokenizer(made["folder"])
    texts = corpus(40, seed=1) + random_strings(100, ()) + ["In 1984, 12345 apples cost $678.90"]
    for text in texts:
        if name == "qwen2":
            text = unicodedata.normalize("NFC", text)
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == \
            ours.encode_text(text), text
    # GGUF_NORMALIZERS: llama.cpp does not apply Qwen's NFC, so e + U+0301 splits otherwise
    if name == "qwen2":
        assert llm.tokenize("e\u0301".encode(), add_bos=False, special=False) != \
            ours.encode_text("e\u0301")


def test_tinyllamas_tokenizer_is_ggufs_llama(exported):
    """SentencePiece-style: llama.cpp's "llama" tokenizer, BOS before a text, <unk> UNKNOWN,
    the 256 byte tokens BYTE, and the merges' order as scores (the first merge highest)."""
    made = exported("tinyllama")
    reader, field = fields(made["gguf"])
    assert field("tokenizer.ggml.model") == "llama" and field("tokenizer.ggml.add_bos_token")
    spec = json.loads((made["folder"] / "tokenizer.json").read_text())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    types = reader.fields["tokenizer.ggml.token_type"]
    types = [int(types.parts[i][0]) for i in types.data]
    assert types[:4] == [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
                         gguf.TokenType.BYTE] and types.count(gguf.TokenType.BYTE) == 256
    scores = reader.fields["tokenizer.ggml.scores"]
    scores = [float(scores.parts[i][0]) for i in scores.data]
    made_by = [vocab["".join(m if isinstance(m, list) else m.split(" "))] for m in merges]
    assert [scores[i] for i in made_by[:3]] == [0.0, -1.0, -2.0]


def write_as_planted(made, path, config=None):
    """made's model written to GGUF at path by write_gguf as it stands (a fault planted in
    it), config in place of the model's own where given."""
    model_config, params = made["family"].read_model(made["folder"])
    write_gguf(path, config or model_config, params,
               hf_gguf_vocab(made["folder"], model_config.vocab_size))


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_planted_fault_qk_rows_in_our_order(llama_cpp, exported, tmp_path, monkeypatch, name):
    monkeypatch.setattr(gguf_format, "hf_rotate_half_rows", lambda rows, heads: rows)
    write_as_planted(exported(name), tmp_path / "m.gguf")
    assert logits_error(llama_cpp, exported(name), tmp_path / "m.gguf") > 100 * TOLERANCE


def test_planted_fault_bias_left_out(llama_cpp, exported, tmp_path, monkeypatch):
    names = {k: v for k, v in gguf_format.GGUF_LLAMA_TENSORS.items() if k not in ("bq", "bk", "bv")}
    monkeypatch.setattr(gguf_format, "GGUF_LLAMA_TENSORS", names)
    write_as_planted(exported("qwen2"), tmp_path / "m.gguf")   # llama.cpp runs it without
    assert logits_error(llama_cpp, exported("qwen2"), tmp_path / "m.gguf") > 100 * TOLERANCE


def test_planted_fault_qk_norm_left_out(llama_cpp, exported, tmp_path, monkeypatch):
    names = {k: v for k, v in gguf_format.GGUF_LLAMA_TENSORS.items() if not k.endswith("_norm")
             or k in ("attention_norm", "ffn_norm")}
    monkeypatch.setattr(gguf_format, "GGUF_LLAMA_TENSORS", names)
    write_as_planted(exported("qwen3"), tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="Failed to load model"):   # qwen3 requires them
        load(llama_cpp, tmp_path / "m.gguf")


def test_planted_fault_rope_freqs_left_out(llama_cpp, exported, tmp_path):
    made = exported("llama3")
    config, _ = made["family"].read_model(made["folder"])
    write_as_planted(made, tmp_path / "m.gguf", dataclasses.replace(config, rope_scaling=()))
    assert logits_error(llama_cpp, made, tmp_path / "m.gguf") > 100 * TOLERANCE


@pytest.fixture(scope="module")
def qwen3_adapter(exported, tmp_path_factory):
    """A LoRA adapter of random B on all seven projections of the Qwen3 model (PEFT's layout),
    our model with it attached, and its GGUF written by dev/export.py."""
    made, root = exported("qwen3"), tmp_path_factory.mktemp("qwen3_lora")
    model = made["family"].model_class.from_checkpoint(made["folder"])
    lora.attach(model, 4, 8.0)
    values = np.array(model.lora_params)
    rng = np.random.default_rng(1)
    for name, view in model.lora_layout.views(values).items():
        if name.endswith(".lora_B"):
            view[...] = rng.standard_normal(view.shape) * 0.05
    model.lora_params = values
    lora.write_adapter(root / "adapter", model, base_model=str(made["folder"]))
    export.main([str(root / "adapter"), "--format", "gguf", "-o", str(root / "adapter.gguf")])
    return dict(folder=root / "adapter", gguf=root / "adapter.gguf", model=model)


def test_llama_cpp_runs_a_qwen3_lora_adapter_as_we_do(llama_cpp, exported, qwen3_adapter):
    made = exported("qwen3")
    _, field = fields(qwen3_adapter["gguf"])
    assert (field("general.type"), field("general.architecture")) == ("adapter", "qwen3")
    ours = our_logits(qwen3_adapter["model"], TOKENS)
    assert error_of(our_logits(made["model"], TOKENS), ours) > 100 * TOLERANCE   # it moves them
    llm = load(llama_cpp, made["gguf"], qwen3_adapter["gguf"])
    assert error_of(llama_cpp_logits(llm, TOKENS), ours) <= TOLERANCE


def test_planted_fault_lora_b_rows_in_our_order(llama_cpp, exported, qwen3_adapter, tmp_path,
                                                monkeypatch):
    monkeypatch.setattr(gguf_format, "hf_rotate_half_rows", lambda rows, heads: rows)
    export.main([str(qwen3_adapter["folder"]), "--format", "gguf", "-o", str(tmp_path / "a.gguf")])
    llm = load(llama_cpp, exported("qwen3")["gguf"], tmp_path / "a.gguf")
    ours = our_logits(qwen3_adapter["model"], TOKENS)
    assert error_of(llama_cpp_logits(llm, TOKENS), ours) > 100 * TOLERANCE
