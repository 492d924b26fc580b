"""
The Llama family's files: llama2.c's model files (legacy and version 1) and tokenizer.bin,
built byte for byte from their descriptions; Hugging Face checkpoints in; GGUF out, read back
with gguf's own reader; SentencePiece vocabularies trained and exported; bad files refused.
"""
import json
import math
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

import needs
from llmc import tokenizer
from llmc.formats import FormatError, param_views
from llmc.formats.gguf import (bpe_merges, gguf_vocab, gpt2_byte_text, gpt2_gguf_vocab, read_gguf,
                               write_gguf)
from llmc.formats.huggingface import HF_LLAMA_NAMES, hf_adjacent_pair_rows, hf_rotate_half_rows
from llmc.formats.llama2c import (read_llama2c_tokenizer, read_llama_model, write_llama2c_tokenizer,
                                  write_llama_model)
from llmc.formats.llmc import read_shard, write_tokenizer
from llmc.rope_tables import rope_tables
from train_llama2 import LlamaConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(shared=True, **overrides):
    """d3 with grouped-query attention (3 heads, 1 kv head) at odd sizes."""
    return LlamaConfig(dim=18, n_layers=3, n_heads=3, n_kv_heads=1, vocab_size=37, hidden_dim=40,
                       max_seq_len=11, shared_classifier=shared, **overrides)


def random_params(config, seed=0):
    return np.random.default_rng(seed).standard_normal(config.num_parameters()).astype(np.float32)


def fp32(array):
    return struct.pack(f"<{array.size}f", *array.reshape(-1).tolist())


def tensors(config, params):
    return param_views(config, params)


# --- llama2.c's model files, from the format's description ---------------------------------

@pytest.mark.parametrize("shared", [True, False])
def test_version1_bytes_as_described(tmp_path, shared):
    config, params = tiny(shared), random_params(tiny(shared))
    t = tensors(config, params)
    expected = struct.pack("<I", 0x616B3432) + struct.pack("<i", 1)
    expected += struct.pack("<7i", 18, 40, 3, 3, 1, 37, 11) + struct.pack("B", int(shared))
    expected += b"\0" * (256 - len(expected))
    order = ["attention_norm", "ffn_norm", "norm", "tok_embeddings", "wq", "wk", "wv", "wo",
             "w1", "w2", "w3"] + ([] if shared else ["output"])
    expected += b"".join(fp32(t[name]) for name in order)
    write_llama_model(tmp_path / "m.bin", config, params, version=1)
    assert (tmp_path / "m.bin").read_bytes() == expected
    config_back, params_back = read_llama_model(tmp_path / "m.bin", LlamaConfig)
    assert config_back == config and np.array_equal(params_back, params)


@pytest.mark.parametrize("shared", [True, False])
def test_legacy_bytes_as_described(tmp_path, shared):
    config, params = tiny(shared), random_params(tiny(shared), seed=1)
    t = tensors(config, params)
    hs = config.head_size
    # RoPE's tables: cos and sin of the angles t * theta^(-2i/hs) in double, rounded to float32
    angles = [[pos * 10000.0 ** (-2 * i / hs) for i in range(hs // 2)] for pos in range(11)]
    cos = np.array([[math.cos(a) for a in row] for row in angles], dtype=np.float32)
    sin = np.array([[math.sin(a) for a in row] for row in angles], dtype=np.float32)
    expected = struct.pack("<7i", 18, 40, 3, 3, 1, 37 if shared else -37, 11)
    order = ["tok_embeddings", "attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2",
             "w3", "norm"]
    expected += b"".join(fp32(t[name]) for name in order) + fp32(cos) + fp32(sin)
    expected += b"" if shared else fp32(t["output"])
    write_llama_model(tmp_path / "m.bin", config, params, version=0)
    assert (tmp_path / "m.bin").read_bytes() == expected
    config_back, params_back = read_llama_model(tmp_path / "m.bin", LlamaConfig)
    assert config_back == config and np.array_equal(params_back, params)


def test_versions_convert_both_ways_byte_for_byte(tmp_path):
    config, params = tiny(False), random_params(tiny(False), seed=2)
    write_llama_model(tmp_path / "v0.bin", config, params, version=0)
    write_llama_model(tmp_path / "v1.bin", *read_llama_model(tmp_path / "v0.bin", LlamaConfig))
    write_llama_model(tmp_path / "v0b.bin", *read_llama_model(tmp_path / "v1.bin", LlamaConfig),
                      version=0)
    assert (tmp_path / "v0.bin").read_bytes() == (tmp_path / "v0b.bin").read_bytes()


def test_rope_tables_match_llama2c_up_to_its_float32_angles():
    # llama2.c's model.py (here as PyTorch computes it) rounds the frequencies and the angles
    # to float32, which moves an angle by up to about 13 float32 roundings of it (theta's
    # power of a rounded exponent amplifies one by ln(theta)): within angle * 2^-20, on any
    # CPU; the tables' own rounding and PyTorch's float32 cos and sin add an ulp or two
    torch = needs.package("torch")
    hs, T = 48, 256  # stories15M
    freqs = 1.0 / (10000.0 ** (torch.arange(0, hs, 2)[: (hs // 2)].float() / hs))
    angles = torch.outer(torch.arange(T), freqs).float()
    cos, sin = rope_tables(T, hs)
    exact = np.outer(np.arange(T), 10000.0 ** (-np.arange(0, hs, 2) / hs))
    for ours, theirs in ((cos, torch.cos(angles).numpy()), (sin, torch.sin(angles).numpy())):
        assert np.all(np.abs(ours.astype(np.float64) - theirs) <= exact * 2.0 ** -20 + 2.0 ** -23)


def test_bad_model_files_one_line_errors(tmp_path):
    config, params = tiny(), random_params(tiny())
    write_llama_model(tmp_path / "m.bin", config, params)
    good = (tmp_path / "m.bin").read_bytes()

    def error(data):
        (tmp_path / "bad.bin").write_bytes(data)
        with pytest.raises(FormatError) as e:
            read_llama_model(tmp_path / "bad.bin", LlamaConfig)
        assert "\n" not in str(e.value)
        return str(e.value)
    assert "truncated: expected" in error(good[:-4])
    assert "too long" in error(good + b"\0\0\0\0")
    assert "version 2 (int8 Q8_0" in error(good[:4] + struct.pack("<i", 2) + good[8:])
    assert "truncated" in error(good[:100])
    assert "not a llama2.c model" in error(struct.pack("<7i", 18, 40, 3, 3, 2, 37, 11) + good[256:])
    assert "model checkpoint of llm.c" in error(struct.pack("<256i", 20240326, 3, *[0] * 254))
    assert "no such file" in str(pytest.raises(FormatError, read_llama_model,
                                               tmp_path / "missing.bin", LlamaConfig).value)


def test_write_refuses_what_llama2c_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="export to GGUF or hf instead"):
        write_llama_model(tmp_path / "m.bin", tiny(rope_theta=500000.0),
                          random_params(tiny()))
    with pytest.raises(ValueError, match="expected"):
        write_llama_model(tmp_path / "m.bin", tiny(), np.zeros(5, np.float32))
    assert not (tmp_path / "m.bin").exists()


# --- llama2.c's tokenizer.bin --------------------------------------------------------------

def test_tokenizer_bin_as_described(tmp_path):
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n", b"<0x0A>", b" the", "\u00e9t\u00e9".encode()]
    scores = [0.0, 0.0, 0.0, 0.0, -1.5, -7.25]
    expected = struct.pack("<I", 6) + b"".join(struct.pack("<fI", s, len(p)) + p
                                               for p, s in zip(pieces, scores))
    write_llama2c_tokenizer(tmp_path / "t.bin", pieces, scores)
    assert (tmp_path / "t.bin").read_bytes() == expected
    pieces_back, scores_back = read_llama2c_tokenizer(tmp_path / "t.bin")
    assert pieces_back == pieces and scores_back.tolist() == scores
    tok = tokenizer.load_tokenizer(str(tmp_path / "t.bin"))
    assert tok.eot_token == 1 and tok.decode([1, 4, 3, 5]) == "the\n\u00e9t\u00e9"
    (tmp_path / "bad.bin").write_bytes(expected[:-2])
    with pytest.raises(FormatError, match="claims 5 bytes"):
        read_llama2c_tokenizer(tmp_path / "bad.bin")


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    """A 400-token SentencePiece vocabulary trained on some Shakespeare, as the data script
    trains them, and its tokenizer.bin."""
    needs.package("sentencepiece")
    out = tmp_path_factory.mktemp("sp")
    text = out / "text.txt"
    if os.path.exists(needs.TINYSHAKESPEARE):
        text.write_text(open(needs.TINYSHAKESPEARE, encoding="utf-8").read()[:200_000])
    else:
        # without the shared data: enough varied text for the val split (32,768 tokens) and more
        rng = np.random.default_rng(0)
        words = ("first citizen before we proceed any further hear me speak all resolved rather "
                 "to die than famish you know caius marcius is chief enemy the people let us kill "
                 "him and we'll have corn at our own price is't a verdict no more talking on't "
                 "away away one word good citizens 1234567890 thou thee thy art hath doth").split()
        blocks = []
        for _ in range(3000):
            lines = [" ".join(rng.choice(words, rng.integers(4, 12))).capitalize() + "."
                     for _ in range(rng.integers(1, 4))]
            blocks.append("Citizen:\n" + "\n".join(lines))
        text.write_text("\n\n".join(blocks) + "\n")
    model = tokenizer.train_sentencepiece(str(text), str(out / "tokenizer"), 400)
    tokenizer.export_llama2c_tokenizer(model, str(out / "tokenizer.bin"))
    return model, out / "tokenizer.bin", text


def test_trained_vocabulary_decodes_as_sentencepiece(vocabulary):
    model, bin_path, text = vocabulary
    sp = tokenizer.sentencepiece_processor(model)
    pieces, _ = read_llama2c_tokenizer(bin_path)
    assert len(pieces) == sp.vocab_size() == 400 and pieces[1] == b"\n<s>\n"
    sample = "First Citizen:\nSpeak, speak \u00e9\u00e8 \u4e16!\n"  # unseen characters: bytes
    ids = sp.encode(sample)
    tok = tokenizer.load_tokenizer(str(bin_path))
    assert tok.decode([sp.bos_id()] + ids) == sp.decode(ids) == sample
    stream = tok.stream_decoder()
    assert "".join(stream(i) for i in [sp.bos_id()] + ids) == sample
    stream = tok.stream_decoder(after=sp.bos_id())   # a sample: BOS there, not printed
    assert "".join(stream(i) for i in ids) == sample


def test_data_script_writes_shards_and_tokenizer(vocabulary, tmp_path):
    _, _, text = vocabulary
    script = os.path.join(REPO, "dev", "data", "tinyshakespeare.py")
    run = subprocess.run([sys.executable, script, "--input-text", str(text), "--output-dir",
                          str(tmp_path), "--sentencepiece", "400"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = tmp_path / "sp400"
    train = read_shard(out / "tiny_shakespeare_train.bin")
    assert train.max() < 400 and len(read_llama2c_tokenizer(out / "tokenizer.bin")[0]) == 400
    tok = tokenizer.load_tokenizer(str(out / "tokenizer.bin"))
    val = [int(i) for i in read_shard(out / "tiny_shakespeare_val.bin")]
    assert val[0] == 1 and tok.decode(val).startswith(text.read_text()[:20])


# --- Hugging Face in, GGUF out -------------------------------------------------------------

def write_safetensors(path, named):
    header, blobs, offset = {}, [], 0
    for name, array in named.items():
        raw = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    meta = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(meta)) + meta + b"".join(blobs))


def rope_adjacent_pairs(x, angles):    # ours, llama2.c's and Meta's: pairs (2i, 2i+1)
    re, im = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = re * np.cos(angles) - im * np.sin(angles)
    out[..., 1::2] = re * np.sin(angles) + im * np.cos(angles)
    return out


def rope_rotate_half(x, angles):       # Hugging Face's: pairs (i, i + hs/2)
    half = x.shape[-1] // 2
    re, im = x[..., :half], x[..., half:]
    return np.concatenate([re * np.cos(angles) - im * np.sin(angles),
                           re * np.sin(angles) + im * np.cos(angles)], axis=-1)


def test_hf_row_order_is_what_rotate_half_rope_expects():
    rng = np.random.default_rng(3)
    n_heads, hs, C = 3, 8, 10
    w, x = rng.standard_normal((n_heads * hs, C)), rng.standard_normal(C)
    angles = rng.uniform(0, 6, hs // 2)
    ours = rope_adjacent_pairs((w @ x).reshape(n_heads, hs), angles)
    theirs = rope_rotate_half((hf_rotate_half_rows(w, n_heads) @ x).reshape(n_heads, hs),
                              angles)
    # the same rotated vectors, each head's channels in the other order: dot products agree
    np.testing.assert_allclose(theirs @ theirs.T, ours @ ours.T, rtol=1e-12)
    assert np.array_equal(hf_adjacent_pair_rows(hf_rotate_half_rows(w, 3), 3), w)


def test_hf_checkpoint_converts(tmp_path):
    config, params = tiny(False), random_params(tiny(False), seed=4)
    t = tensors(config, params)
    named = {}
    for ours, theirs in HF_LLAMA_NAMES.items():
        if ours not in t:   # the switches' tensors (Qwen's)
            continue
        for l in range(config.n_layers if "{l}" in theirs else 1):
            value = t[ours][l] if "{l}" in theirs else t[ours]
            if ours in ("wq", "wk"):
                value = hf_rotate_half_rows(value, 3 if ours == "wq" else 1)
            named[theirs.format(l=l)] = value
    (tmp_path / "hf").mkdir()
    write_safetensors(tmp_path / "hf" / "model.safetensors", named)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(dict(
        model_type="llama", hidden_size=18, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1,
        vocab_size=37, intermediate_size=40, max_position_embeddings=11, rms_norm_eps=1e-5,
        tie_word_embeddings=False)))
    script = os.path.join(REPO, "dev", "download_llama.py")
    run = subprocess.run([sys.executable, script, "--from-safetensors", str(tmp_path / "hf"),
                          "-o", str(tmp_path / "m.bin")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    config_back, params_back = read_llama_model(tmp_path / "m.bin", LlamaConfig)
    assert config_back == config and np.array_equal(params_back, params)
    del named["model.layers.2.mlp.up_proj.weight"]
    write_safetensors(tmp_path / "hf" / "model.safetensors", named)
    run = subprocess.run([sys.executable, script, "--from-safetensors", str(tmp_path / "hf"),
                          "-o", str(tmp_path / "m.bin")], capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.count("\n") == 1
    assert "no tensor model.layers.2.mlp.up_proj.weight" in run.stderr


@pytest.mark.parametrize("shared", [True, False])
def test_gguf_reads_back_with_gguf(vocabulary, tmp_path, shared):
    gguf = needs.package("gguf")
    _, bin_path, _ = vocabulary
    config = LlamaConfig.from_name("d3", vocab_size=400, max_seq_len=64, shared_classifier=shared)
    params = random_params(config, seed=5)
    write_llama_model(tmp_path / "m.bin", config, params)
    script = os.path.join(REPO, "dev", "export.py")
    run = subprocess.run([sys.executable, script, str(tmp_path / "m.bin"), "--format", "gguf",
                          "--tokenizer", str(bin_path), "-o", str(tmp_path / "m.gguf"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0 and "read back equal" in run.stdout, run.stderr
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    field = lambda key: reader.get_field(key).contents()
    assert field("general.architecture") == "llama" and field("llama.block_count") == 3
    assert field("llama.attention.head_count_kv") == 1 and field("llama.rope.dimension_count") == 64
    assert field("tokenizer.ggml.model") == "llama"
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and tokens[3] == "<0x00>"
    assert types[:4] == [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
                         gguf.TokenType.BYTE]
    names = {t.name for t in reader.tensors}
    assert ("output.weight" in names) == (not shared) and "blk.2.ffn_gate.weight" in names
    t = tensors(config, params)
    gate = next(x for x in reader.tensors if x.name == "blk.1.ffn_gate.weight")
    assert np.array_equal(np.asarray(gate.data).reshape(t["w1"][1].shape), t["w1"][1])


def test_a_mistral_folder_goes_to_gguf_and_reads_back_as_the_llama_it_is(vocabulary, tmp_path):
    """Mistral's block (no sliding window) is Llama's: GGUF holds it as "llama", as llama.cpp's
    converter does, so --check reads back a Llama with the same sizes and values: equal."""
    needs.package("gguf")
    needs.package("torch")
    needs.package("transformers")
    from hf_models import make_hf_model, V
    _, _, text = vocabulary
    model = tokenizer.train_sentencepiece(str(text), str(tmp_path / "sp"), V)
    tokenizer.export_llama2c_tokenizer(model, str(tmp_path / "tokenizer.bin"))
    make_hf_model("mistral", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["MistralForCausalLM"]
    run = subprocess.run([sys.executable, os.path.join(REPO, "dev", "export.py"), str(tmp_path / "hf"),
                          "--format", "gguf", "--tokenizer", str(tmp_path / "tokenizer.bin"),
                          "-o", str(tmp_path / "m.gguf"), "--check"], capture_output=True, text=True)
    assert run.returncode == 0 and "read back equal" in run.stdout, run.stderr
    config, _, _ = read_gguf(tmp_path / "m.gguf", LlamaConfig)
    assert config.architecture == "" and config.norm_eps == 1e-6


def test_gguf_refuses_a_vocabulary_of_another_size(vocabulary, tmp_path):
    needs.package("gguf")
    _, bin_path, _ = vocabulary
    vocab = gguf_vocab(bin_path, tiny().vocab_size)
    with pytest.raises(ValueError, match="the tokenizer has 400 tokens"):
        write_gguf(tmp_path / "m.gguf", tiny(), random_params(tiny()), vocab)
    assert os.listdir(tmp_path) == []


def tiny_bpe():
    """A byte-level BPE vocabulary built from known merges, in rank order as GPT-2's: the 256
    bytes (shuffled, as GPT-2 orders them), then one token per merge, then an end-of-text."""
    merges = [(b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"e", b"r"), (b" ", b"t"),
              (b"the", b"r"), (b" the", b"r"), (b"a", b"b"), (b"ab", b"ab")]
    byte_order = np.random.default_rng(3).permutation(256)
    tokens = [bytes([int(b)]) for b in byte_order] + [a + b for a, b in merges]
    return tokens + [b"<|endoftext|>"], merges, len(tokens)


def test_bpe_merges_rebuilt_from_the_ranks():
    tokens, merges, eot = tiny_bpe()
    assert bpe_merges(tokens, special=(eot,)) == merges
    with pytest.raises(ValueError, match=r"token 263 \(b'abab'\) is not made by merging"):
        bpe_merges(tokens[:-3] + [b"abab", b"ab"])   # "ab" comes after it
    text = gpt2_byte_text()
    assert text[ord(" ")] == "\u0120" and text[ord("\n")] == "\u010a" and text[ord("a")] == "a"
    assert len(set(text.values())) == 256


def test_gguf_with_a_gpt2_style_vocabulary(tmp_path):
    """llm.c's tokenizer file in: GGUF's "gpt2" tokenizer with merges, padded to the model's
    vocabulary with unused tokens; the end-of-text as BOS/EOS, a control token."""
    gguf = needs.package("gguf")
    tokens, merges, eot = tiny_bpe()
    write_tokenizer(tmp_path / "tok.bin", tokens, eot)
    config = LlamaConfig.from_name("d2", vocab_size=len(tokens) + 3, max_seq_len=16)
    params = random_params(config, seed=2)
    write_gguf(tmp_path / "m.gguf", config, params,
               gguf_vocab(tmp_path / "tok.bin", config.vocab_size))
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    field = lambda key: reader.get_field(key).contents()
    assert field("tokenizer.ggml.model") == "gpt2" and field("tokenizer.ggml.pre") == "gpt-2"
    assert field("tokenizer.ggml.merges")[:4] == ["t h", "th e", "\u0120 the", "e r"]
    got = field("tokenizer.ggml.tokens")
    assert got[eot] == "<|endoftext|>" and got[-3:] == [f"[PAD{eot + i}]" for i in (1, 2, 3)]
    assert got[256 + 2] == "\u0120the"
    types = field("tokenizer.ggml.token_type")
    assert types[eot] == gguf.TokenType.CONTROL and types[-1] == gguf.TokenType.UNUSED
    assert field("tokenizer.ggml.bos_token_id") == eot == field("tokenizer.ggml.eos_token_id")
    config_back, params_back, _ = read_gguf(tmp_path / "m.gguf", LlamaConfig)
    assert config_back == config and np.array_equal(params_back, params)
    with pytest.raises(ValueError, match="more than the model's vocabulary"):
        gguf_vocab(tmp_path / "tok.bin", len(tokens) - 1)


def test_gguf_gpt2_merges_as_gpt2s(tmp_path):
    """With GPT-2's own ranks at hand, the rebuilt merges start as GPT-2's merges.txt does."""
    gguf = needs.package("gguf")
    enc = needs.gpt2_encoding()
    vocab = gpt2_gguf_vocab([enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)],
                            enc.eot_token, 50304)
    assert len(vocab.merges) == 50000 and vocab.tokens[50256] == "<|endoftext|>"
    assert vocab.merges[:5] == ["\u0120 t", "\u0120 a", "h e", "i n", "r e"]
    assert vocab.tokens[262] == "\u0120the" and len(vocab.tokens) == 50304
    config = LlamaConfig.from_name("d1", vocab_size=enc.n_vocab, max_seq_len=16)
    write_llama_model(tmp_path / "m.bin", config, random_params(config))
    run = subprocess.run([sys.executable, os.path.join(REPO, "dev", "export.py"),
                          str(tmp_path / "m.bin"), "--format", "gguf", "--tokenizer", "gpt2",
                          "-o", str(tmp_path / "m.gguf"), "--check"], capture_output=True, text=True)
    assert run.returncode == 0 and "read back equal" in run.stdout, run.stderr
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    assert reader.get_field("tokenizer.ggml.merges").contents()[:5] == vocab.merges[:5]


def test_train_takes_the_vocabulary_beside_the_shards(vocabulary, tmp_path):
    """train.py sizes a new Llama's vocabulary from the tokenizer.bin beside its shards, and
    decodes its samples with it."""
    _, _, text = vocabulary
    script = os.path.join(REPO, "dev", "data", "tinyshakespeare.py")
    subprocess.run([sys.executable, script, "--input-text", str(text), "--output-dir",
                    str(tmp_path), "--sentencepiece", "400"], check=True, capture_output=True)
    data = tmp_path / "sp400"
    run = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "-e", "d1",
                          "--family", "llama", "-i", str(data / "tiny_shakespeare_train.bin"),
                          "-j", str(data / "tiny_shakespeare_val.bin"), "-b", "2", "-t", "16",
                          "-x", "2", "-s", "2", "-g", "8", "-v", "2"],
                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr
    assert re.search(r"vocab_size V\s*\|\s*400\b", run.stdout), run.stdout
    assert "token ids" not in run.stderr
