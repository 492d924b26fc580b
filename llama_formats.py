"""
The Llama family's config and a TEMPORARY model file, for llm.pyx's Llama work.

This module is meant to be merged into llmc_io.py, where llama2.c's real checkpoint formats
(its legacy and version-1/2 `.bin` files) will be added.  Until then:

    LlamaConfig, PRESETS      the model's sizes; param_shapes() is the flat parameter layout
    param_views(config, flat) name -> shaped view into a flat parameter (or gradient) vector
    write_model / read_model  TEMPORARY: float32 parameters with a header of our own (below);
                              not a llama2.c format, not meant to outlive the llama2.c readers

Debug states need nothing new: llmc_io.write_debug_state / read_debug_state take any config
with max_seq_len, vocab_size, num_parameters() and describe(), which LlamaConfig has.

Temporary model file (little-endian), a header of 256 int32 as llm.c's files have:
    [0] magic 20251008  [1] version 1  [2] dim  [3] n_layers  [4] n_heads  [5] n_kv_heads
    [6] vocab_size  [7] hidden_dim  [8] max_seq_len  [9] shared_classifier (0/1)
    [10:12] norm_eps and [12:14] rope_theta as float64 (two int32 each, so 1e-5 reads back as 1e-5)
followed by the parameters as float32 in param_shapes() order.
"""
import math
import os
from dataclasses import dataclass, fields, replace

import numpy as np

import llmc_io

TEMP_MODEL_MAGIC = 20251008  # not one of llm.c's or llama2.c's magic numbers
TEMP_MODEL_VERSION = 1
MULTIPLE_OF = 32             # llama2.c's rounding of the FFN's hidden size


def llama2c_hidden_dim(dim, multiple_of=MULTIPLE_OF):
    """llama2.c's (and Meta's) FFN size: 2/3 of 4*dim, rounded up to a multiple of multiple_of."""
    hidden_dim = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class LlamaConfig:
    dim: int                 # C, the residual stream's channels
    n_layers: int            # L
    n_heads: int             # NH query heads, of head size hs = dim / NH
    n_kv_heads: int          # NKV key/value heads; divides NH (NKV = NH: no grouping)
    vocab_size: int          # V
    hidden_dim: int          # H, the FFN's inner size
    max_seq_len: int         # maxT, the longest sequence (RoPE has no table to outgrow)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    shared_classifier: bool = True   # the output head is the token embedding (llama2.c's stories)

    def __post_init__(self):
        for field in fields(self):  # plain Python numbers: header values arrive as numpy ints
            kind = {"norm_eps": float, "rope_theta": float, "shared_classifier": bool}.get(field.name, int)
            object.__setattr__(self, field.name, kind(getattr(self, field.name)))
        problem = self.problem()
        if problem:
            raise ValueError(f"LlamaConfig: {problem}")

    def problem(self):
        """What is wrong with these sizes, or None."""
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim",
                     "max_seq_len"):
            if getattr(self, name) <= 0:
                return f"{name} must be positive, got {getattr(self, name)}"
        if self.dim % self.n_heads != 0:
            return f"dim={self.dim} is not a multiple of n_heads={self.n_heads}"
        if (self.dim // self.n_heads) % 2 != 0:
            return f"head size dim/n_heads={self.dim // self.n_heads} is odd; RoPE rotates pairs"
        if self.n_heads % self.n_kv_heads != 0:
            return f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}"
        if not (self.norm_eps > 0 and self.rope_theta > 0):
            return f"norm_eps={self.norm_eps} and rope_theta={self.rope_theta} must be positive"
        return None

    @property
    def head_size(self):
        return self.dim // self.n_heads

    @classmethod
    def from_name(cls, name, **overrides):
        """A preset by name (PRESETS), or dN: a tiny test model of depth N (from_depth)."""
        if name in PRESETS:
            return replace(PRESETS[name], **overrides)
        if name[:1] == "d" and name[1:].isdigit() and int(name[1:]) > 0:
            return replace(cls.from_depth(int(name[1:])), **overrides)
        raise ValueError(f"LlamaConfig.from_name: {name!r} is neither dN (N >= 1) nor one of "
                         f"{', '.join(PRESETS)}")

    @classmethod
    def from_depth(cls, depth, vocab_size=32000, max_seq_len=1024):
        """dN: N layers of dim 64N with N heads of size 64; N/2 kv heads for even N >= 2, one
        kv head for odd N >= 3 (grouped-query attention from d2 on); llama2.c's hidden_dim."""
        if depth <= 0:
            raise ValueError(f"LlamaConfig.from_depth: depth must be positive, got {depth}")
        n_kv_heads = depth // 2 if depth % 2 == 0 else 1
        return cls(dim=64 * depth, n_layers=depth, n_heads=depth, n_kv_heads=n_kv_heads,
                   vocab_size=vocab_size, hidden_dim=llama2c_hidden_dim(64 * depth),
                   max_seq_len=max_seq_len)

    def param_shapes(self):
        """The parameter tensors as (name, shape) in the flat buffer's order: llama2.c's
        checkpoint order, Meta's names, per-layer tensors stacked along a leading L axis, each
        matrix as nn.Linear keeps it (out_features, in_features)."""
        C, L, V, H = self.dim, self.n_layers, self.vocab_size, self.hidden_dim
        q_dim, kv_dim = self.n_heads * self.head_size, self.n_kv_heads * self.head_size
        shapes = [
            ("tok_embeddings", (V, C)),
            ("attention_norm", (L, C)),
            ("wq", (L, q_dim, C)),
            ("wk", (L, kv_dim, C)),
            ("wv", (L, kv_dim, C)),
            ("wo", (L, C, q_dim)),
            ("ffn_norm", (L, C)),
            ("w1", (L, H, C)),
            ("w2", (L, C, H)),
            ("w3", (L, H, C)),
            ("norm", (C,)),
        ]
        if not self.shared_classifier:
            shapes.append(("output", (V, C)))
        return shapes

    def num_parameters(self):
        return sum(math.prod(shape) for _, shape in self.param_shapes())

    def describe(self):
        return (f"dim={self.dim} L={self.n_layers} NH={self.n_heads} NKV={self.n_kv_heads} "
                f"V={self.vocab_size} H={self.hidden_dim} maxT={self.max_seq_len} "
                f"{'shared' if self.shared_classifier else 'separate'} classifier")


# Published sizes: llama2.c's TinyStories models, TinyLlama-1.1B, Llama-2-7B
PRESETS = {
    "stories15M": LlamaConfig(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=32000,
                              hidden_dim=llama2c_hidden_dim(288), max_seq_len=256),
    "stories42M": LlamaConfig(dim=512, n_layers=8, n_heads=8, n_kv_heads=8, vocab_size=32000,
                              hidden_dim=llama2c_hidden_dim(512), max_seq_len=1024),
    "stories110M": LlamaConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, vocab_size=32000,
                               hidden_dim=llama2c_hidden_dim(768), max_seq_len=1024),
    "llama-1b": LlamaConfig(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, vocab_size=32000,
                            hidden_dim=5632, max_seq_len=2048, shared_classifier=False),
    "llama-7b": LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, vocab_size=32000,
                            hidden_dim=11008, max_seq_len=4096, shared_classifier=False),
}


def param_views(config, flat):
    """dict name -> shaped view into the 1-D parameter (or gradient) vector `flat`."""
    if flat.ndim != 1 or flat.size != config.num_parameters():
        raise ValueError(f"param_views: expected a 1-D vector of {config.num_parameters()} "
                         f"values for {config.describe()}, got shape {flat.shape}")
    views, offset = {}, 0
    for name, shape in config.param_shapes():
        size = math.prod(shape)
        views[name] = flat[offset:offset + size].reshape(shape)
        offset += size
    return views


# ----------------------------------------------------------------------------
# TEMPORARY model file: to be replaced by llama2.c's formats in llmc_io.py

def _float64_ints(value):
    return list(np.array([value], dtype="<f8").view("<i4"))


def _ints_float64(ints):
    return float(np.asarray(ints, dtype="<i4").view("<f8")[0])


def write_model(path, config, params):
    """TEMPORARY: params (1-D float32, config's layout) with this module's header."""
    params = np.asarray(params)
    if params.shape != (config.num_parameters(),):
        raise ValueError(f"write_model: expected {config.num_parameters()} parameters for "
                         f"{config.describe()}, got an array of shape {params.shape}")
    header = np.zeros(llmc_io.HEADER_INTS, dtype="<i4")
    header[:14] = [TEMP_MODEL_MAGIC, TEMP_MODEL_VERSION, config.dim, config.n_layers,
                   config.n_heads, config.n_kv_heads, config.vocab_size, config.hidden_dim,
                   config.max_seq_len, int(config.shared_classifier),
                   *_float64_ints(config.norm_eps), *_float64_ints(config.rope_theta)]
    llmc_io.atomic_write(path, [header.tobytes(), np.ascontiguousarray(params, dtype="<f4")])


def read_model(path):
    """TEMPORARY: (LlamaConfig, params float32 1-D) from a file write_model wrote."""
    fail = lambda problem: llmc_io.FormatError(path, problem)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = np.fromfile(f, dtype="<i4", count=llmc_io.HEADER_INTS)
            if header.size < llmc_io.HEADER_INTS or header[0] != TEMP_MODEL_MAGIC:
                raise fail(f"not a temporary llm.pyx Llama model (magic {TEMP_MODEL_MAGIC})")
            if header[1] != TEMP_MODEL_VERSION:
                raise fail(f"unsupported version {header[1]}; supported: {TEMP_MODEL_VERSION}")
            try:
                config = LlamaConfig(*(int(v) for v in header[2:9]),
                                     norm_eps=_ints_float64(header[10:12]),
                                     rope_theta=_ints_float64(header[12:14]),
                                     shared_classifier=bool(header[9]))
            except ValueError as e:
                raise fail(f"bad header: {e}") from None
            count = config.num_parameters()
            expected = llmc_io.HEADER_BYTES + 4 * count
            if size != expected:
                raise fail(f"expected {expected} bytes (header + {count} float32 parameters "
                           f"for {config.describe()}), found {size}")
            params = np.fromfile(f, dtype="<f4", count=count)
    except OSError as e:
        raise fail(f"cannot read: {e.strerror}") from None
    if params.size != count:
        raise fail(f"truncated: could read only {params.size} of {count} parameters")
    return config, params.astype(np.float32, copy=False)
