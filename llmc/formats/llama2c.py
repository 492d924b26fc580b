"""
llama2.c's files: its model files (fp32), as its export.py writes them and run.c reads them,
and its tokenizer.bin.

    model file, version 0, "legacy" (run.c's): 7 int32 dim, hidden_dim, n_layers, n_heads,
        n_kv_heads, vocab_size (negated when the classifier is not the embedding),
        max_seq_len; then fp32 tok_embeddings, attention_norm, wq, wk, wv, wo, ffn_norm, w1,
        w2, w3, norm (our flat order, train_llama2.param_shapes), RoPE's cos then sin table
        (max_seq_len, head_size/2) each (llmc/rope_tables.py's; run.c never reads them), and output
        when the classifier is separate.
    model file, version 1: 256 bytes of header: uint32 magic 0x616b3432 ("ak42"), int32
        version 1, the 7 int32 above (vocab_size positive), uint8 shared_classifier, zeros;
        then fp32 attention_norm, ffn_norm, norm, tok_embeddings, wq, wk, wv, wo, w1, w2, w3,
        [output].
    tokenizer.bin: uint32 max_token_length, then per token float32 score, uint32 length, that
        many bytes (SentencePiece's pieces with U+2581 turned into a space, BOS as "\\n<s>\\n"
        and EOS as "\\n</s>\\n", byte-fallback tokens spelled "<0x0A>").  The file does not
        store the number of tokens: it ends after the last.

Neither model file stores norm_eps nor rope_theta: llama2.c's are 1e-5 and 10000, and only
models with those are written (GGUF, llmc/formats/gguf.py, stores both).
"""
import os

import numpy as np

from llmc.formats.common import (FormatError, atomic_write, check_size, open_file, param_views,
                                 read_array)
from llmc.formats.llmc import FILE_KINDS
from llmc.rope_tables import rope_tables

LLAMA2C_MAGIC = 0x616B3432
LLAMA2C_V1_HEADER_BYTES = 256
LLAMA2C_LEGACY_HEADER_BYTES = 7 * 4
LLAMA2C_VERSIONS = (0, 1)
LLAMA2C_NORM_EPS, LLAMA2C_ROPE_THETA = 1e-5, 10000.0
# version 1's tensor order, by our names
LLAMA2C_V1_ORDER = ("attention_norm", "ffn_norm", "norm", "tok_embeddings", "wq", "wk", "wv",
                    "wo", "w1", "w2", "w3", "output")


# ----------------------------------------------------------------------------
# model files

def _llama2c_sizes(config):
    return [config.dim, config.hidden_dim, config.n_layers, config.n_heads, config.n_kv_heads,
            config.vocab_size, config.max_seq_len]


def legacy_model_bytes(sizes):
    """The size in bytes of a version-0 file whose header holds these seven int32 sizes, or
    None when they are not a model's (a file without llama2.c's magic is told by this)."""
    dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len = map(int, sizes)
    if min(dim, hidden_dim, n_layers, n_heads, n_kv_heads, max_seq_len) <= 0 or vocab_size == 0:
        return None
    if dim % n_heads or n_heads % n_kv_heads or (dim // n_heads) % 2:
        return None
    head_size = dim // n_heads
    kv_dim = n_kv_heads * head_size
    per_layer = 2 * dim + 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden_dim
    floats = (abs(vocab_size) * dim * (1 if vocab_size > 0 else 2) + n_layers * per_layer + dim
              + max_seq_len * head_size)   # RoPE's cos and sin, (max_seq_len, head_size/2) each
    return LLAMA2C_LEGACY_HEADER_BYTES + 4 * floats


def llama2c_problem(config):
    """What of a Llama config llama2.c's files cannot hold (they know Llama 2's block, its
    eps and theta), or None."""
    if (config.head_dim or config.qkv_bias or config.qk_norm or config.rope_scaling
            or config.architecture):
        return (f"{config.architecture or 'a Llama'} with {', '.join(config.switches()) or 'its sizes'}"
                f" (only Llama 2's block); export to hf instead")
    if (config.norm_eps, config.rope_theta) != (LLAMA2C_NORM_EPS, LLAMA2C_ROPE_THETA):
        return (f"norm_eps={config.norm_eps} rope_theta={config.rope_theta} (only "
                f"{LLAMA2C_NORM_EPS} and {LLAMA2C_ROPE_THETA}); export to GGUF or hf instead")
    return None


def write_llama_model(path, config, params, version=1):
    """Write a llama2.c model file: version 1 (default; header + fp32) or 0 (run.c's legacy)."""
    if version not in LLAMA2C_VERSIONS:
        raise ValueError(f"write_llama_model: version {version} is not one of {LLAMA2C_VERSIONS} "
                         f"(llama2.c's fp32 formats)")
    problem = llama2c_problem(config)
    if problem is not None:
        raise ValueError(f"write_llama_model: llama2.c's files cannot hold {problem}")
    params = np.asarray(params)
    if params.shape != (config.num_parameters(),):
        raise ValueError(f"write_llama_model: expected {config.num_parameters()} parameters for "
                         f"{config.describe()}, got an array of shape {params.shape}")
    views = param_views(config, np.ascontiguousarray(params, dtype="<f4"))
    sizes = _llama2c_sizes(config)
    if version == 0:
        if not config.shared_classifier:
            sizes[5] = -sizes[5]
        cos, sin = rope_tables(config.max_seq_len, config.head_size, config.rope_theta)
        chunks = [np.array(sizes, dtype="<i4").tobytes()]
        chunks += [views[name] for name in views if name != "output"]
        chunks += [cos.astype("<f4"), sin.astype("<f4")]
        chunks += [views["output"]] if "output" in views else []
    else:
        header = bytearray(LLAMA2C_V1_HEADER_BYTES)
        header[0:4] = np.array([LLAMA2C_MAGIC], dtype="<u4").tobytes()
        header[4:36] = np.array([1, *sizes], dtype="<i4").tobytes()
        header[36] = int(config.shared_classifier)
        chunks = [bytes(header)] + [views[name] for name in LLAMA2C_V1_ORDER if name in views]
    atomic_write(path, chunks)


def read_llama_model(path, config_class):
    """(config, params float32 1-D in config.param_shapes() order) from a llama2.c model file of
    either version, the config a config_class (train_llama2.LlamaConfig); raises FormatError
    naming what is wrong."""
    with open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(LLAMA2C_V1_HEADER_BYTES)
        if len(raw) < LLAMA2C_LEGACY_HEADER_BYTES:
            raise FormatError(path, f"truncated: {size} bytes, shorter than any llama2.c model "
                                    f"header")
        first = int.from_bytes(raw[:4], "little")
        if first == LLAMA2C_MAGIC:
            if len(raw) < LLAMA2C_V1_HEADER_BYTES:
                raise FormatError(path, f"truncated: {size} bytes, shorter than the "
                                        f"{LLAMA2C_V1_HEADER_BYTES}-byte header of version 1")
            version = int.from_bytes(raw[4:8], "little", signed=True)
            if version != 1:
                what = " (int8 Q8_0, not fp32)" if version == 2 else ""
                raise FormatError(path, f"llama2.c model version {version}{what} is not "
                                        f"supported; supported: 0, 1")
            sizes = [int(v) for v in np.frombuffer(raw[8:36], dtype="<i4")]
            shared, header_bytes = bool(raw[36]), LLAMA2C_V1_HEADER_BYTES
        else:
            if int.from_bytes(raw[:4], "little", signed=True) in FILE_KINDS:
                kind = FILE_KINDS[int.from_bytes(raw[:4], "little", signed=True)]
                raise FormatError(path, f"this is {kind} of llm.c, not a llama2.c model")
            version, header_bytes = 0, LLAMA2C_LEGACY_HEADER_BYTES
            sizes = [int(v) for v in np.frombuffer(raw[:28], dtype="<i4")]
            shared = sizes[5] > 0
            sizes[5] = abs(sizes[5])
        try:
            dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len = sizes
            config = config_class(dim=dim, n_layers=n_layers, n_heads=n_heads,
                                  n_kv_heads=n_kv_heads, vocab_size=vocab_size,
                                  hidden_dim=hidden_dim, max_seq_len=max_seq_len,
                                  shared_classifier=shared)
        except ValueError as e:
            kind = "version 1" if version == 1 else "legacy (version 0)"
            raise FormatError(path, f"not a llama2.c model: its {kind} header {sizes} is bad "
                                    f"({e})") from None
        count = config.num_parameters()
        rope_floats = 2 * config.max_seq_len * (config.head_size // 2) if version == 0 else 0
        check_size(path, size, header_bytes + 4 * (count + rope_floats),
                   f"a version {version} header, {count} float32 parameters"
                   + (" and RoPE's tables" if rope_floats else "") + f" for {config.describe()}")
        f.seek(header_bytes)
        data = read_array(f, path, "<f4", count + rope_floats)
    params = np.empty(count, dtype=np.float32)
    views = param_views(config, params)
    if version == 0:
        layer_floats = count - (0 if shared else views["output"].size)
        params[:layer_floats] = data[:layer_floats]
        if not shared:
            params[layer_floats:] = data[layer_floats + rope_floats:]
    else:
        offset = 0
        for name in LLAMA2C_V1_ORDER:
            if name in views:
                views[name].reshape(-1)[...] = data[offset:offset + views[name].size]
                offset += views[name].size
    return config, params


# ----------------------------------------------------------------------------
# tokenizer.bin

def write_llama2c_tokenizer(path, pieces, scores):
    """pieces: the bytes of each token; scores: one float per token."""
    if len(pieces) == 0 or len(pieces) != len(scores):
        raise ValueError(f"write_llama2c_tokenizer: {len(pieces)} pieces and {len(scores)} scores")
    body = bytearray(np.array([max(len(p) for p in pieces)], dtype="<u4").tobytes())
    for piece, score in zip(pieces, scores):
        body += np.array([score], dtype="<f4").tobytes() + np.array([len(piece)], "<u4").tobytes()
        body += piece
    atomic_write(path, bytes(body))


def sentencepiece_processor(model_path):
    """The SentencePiece model file at model_path (the tokenizer.model llama2.c's vocabulary
    comes from), loaded by the sentencepiece package."""
    import sentencepiece as spm
    return spm.SentencePieceProcessor(model_file=model_path)


def read_llama2c_tokenizer(path):
    """(pieces: list of bytes, scores: float32 array) of a llama2.c tokenizer.bin."""
    with open_file(path) as f:
        data = f.read()
    if len(data) < 4:
        raise FormatError(path, f"truncated: {len(data)} bytes, not a llama2.c tokenizer")
    max_len = int.from_bytes(data[:4], "little")
    if int.from_bytes(data[:4], "little", signed=True) in FILE_KINDS:
        raise FormatError(path, "this is an llm.c file, not a llama2.c tokenizer.bin")
    pieces, scores, pos = [], [], 4
    while pos < len(data):
        if pos + 8 > len(data):
            raise FormatError(path, f"truncated: token {len(pieces)} has no room for its score "
                                    f"and length at byte {pos}")
        score = float(np.frombuffer(data, "<f4", 1, pos)[0])
        length = int.from_bytes(data[pos + 4:pos + 8], "little")
        if length > max_len or pos + 8 + length > len(data):
            raise FormatError(path, f"not a llama2.c tokenizer: token {len(pieces)} claims "
                                    f"{length} bytes (max_token_length {max_len}, "
                                    f"{len(data) - pos - 8} left)")
        pieces.append(data[pos + 8:pos + 8 + length])
        scores.append(score)
        pos += 8 + length
    if not pieces:
        raise FormatError(path, "no tokens")
    return pieces, np.array(scores, dtype=np.float32)
