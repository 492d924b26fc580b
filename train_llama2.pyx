"""
Llama 2 training in Cython: the model of llama2.c and Meta's reference, on any backend.

The Llama family in one place: its config and presets (llama2.c's TinyStories models,
TinyLlama, Llama-2-7B), its parameter and activation shapes beside the pointer structs they
fill, its init, its model file (llama2.c's, llmc/formats/llama2c.py), its FLOPs, and the
forward and backward of its embedding, of one layer and of its head, as train_llama2_torch.py
defines them; it registers itself as "llama" (llmc/families.py).  All else (buffers, tokens
in and loss out, running the layers under an activation checkpoint policy, zero_grad, the
gradient norm, AdamW) is the model-generic core, llmc/model.pyx, and every kernel call goes
through the backend table (accel/backend.pxd): Llama2(config, backend="cpu",
recompute="all").  Per layer, with no biases anywhere in Llama 2:

    x += wo(attention(rope(wq(rmsnorm(x))), rope(wk(rmsnorm(x))), wv(rmsnorm(x))))
    x += w2(silu(w1(rmsnorm(x))) * w3(rmsnorm(x)))

after the token embedding (positions enter through RoPE), then a final RMSNorm and the output
head (the embedding itself with a shared classifier).  Today's Hugging Face models are this
block with switches (LlamaConfig): a bias on wq, wk and wv (Qwen2), an RMSNorm over each
head of q and of k before RoPE (QK-norm, Qwen3), a head size of its own (Qwen3: NH*hs need
not be C), Llama 3's RoPE scaling (llmc/rope_tables.py), the norms' eps and RoPE's theta.

On a backend that prefers them (runs_fused: the ANE) the Q, K, V projections (without a bias)
and the FFN run as the fused group's block entries, forward and backward (the same
arithmetic, one program each on the engine).  One parameter buffer cut into 11 tensors (12
with a separate classifier, 3 more with the qkv bias, 2 more with QK-norm), one activation
buffer cut into 29 (with recompute="all", the default; other policies keep the layer tensors of
fewer layers: llmc/recompute.py).  Attention is flash attention (only a (B,NH,T) log-sum-exp
per layer kept) where the backend has the "flash" kernels, else kernels/attention_gqa's with
its (B,NH,T,T) probabilities.

Dimension letters:
    B batch size, T sequence length, C channels (dim), L layers, NH query heads,
    NKV key/value heads (dividing NH), hs head size (C / NH unless head_dim sets it),
    QD = NH*hs, KVD = NKV*hs,
    H the FFN's hidden size, V vocabulary size, maxT the longest sequence (RoPE's tables).
"""
from dataclasses import dataclass, fields, replace

import numpy as np

from llmc.families import Family, define_family
from llmc.formats import HF_FORMATS, model_format
from llmc.formats.gguf import read_gguf
from llmc.formats.huggingface import (llama_config_from_hf, llama_from_hf, llama_to_hf,
                                      read_hf_checkpoint, read_hf_model, write_hf_model_file)
from llmc.formats.llama2c import llama2c_problem, read_llama_model, write_llama_model
from llmc.rope_tables import ROPE_SCALINGS, rope_tables

from accel.backend cimport Buffer
from llmc.model cimport Model

__all__ = ["Llama2", "LlamaConfig", "PRESETS", "activation_shapes", "llama2c_hidden_dim",
           "param_shapes"]


# ----------------------------------------------------------------------------
# the configuration and presets (Llama-2's block as llama2.c and Meta define it)

MULTIPLE_OF = 32             # llama2.c's rounding of the FFN's hidden size


def llama2c_hidden_dim(dim, multiple_of=MULTIPLE_OF):
    """llama2.c's (and Meta's) FFN size: 2/3 of 4*dim, rounded up to a multiple of multiple_of."""
    hidden_dim = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class LlamaConfig:
    dim: int                 # C, the residual stream's channels
    n_layers: int            # L
    n_heads: int             # NH query heads, of head size hs
    n_kv_heads: int          # NKV key/value heads; divides NH (NKV = NH: no grouping)
    vocab_size: int          # V
    hidden_dim: int          # H, the FFN's inner size
    max_seq_len: int         # maxT, the longest sequence (RoPE has no table to outgrow)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    shared_classifier: bool = True   # the output head is the token embedding (llama2.c's stories)
    # the switches of today's Hugging Face models (llmc/formats/huggingface.py reads them)
    head_dim: int = 0        # hs; 0: dim / NH (Llama's), set on its own in Qwen3 and Mistral
    qkv_bias: bool = False   # a bias on the q, k and v projections (Qwen2)
    qk_norm: bool = False    # RMSNorm over each head of q and of k, before RoPE (Qwen3)
    rope_scaling: tuple = ()  # () or ("llama3", factor, low_freq_factor, high_freq_factor,
    #                           original_max_position_embeddings): llmc/rope_tables.py
    architecture: str = ""   # the Hugging Face class it came from and goes back to ("": Llama's,
    #                          LlamaForCausalLM, as llama2.c's and GGUF's models are too)

    def __post_init__(self):
        kinds = {"norm_eps": float, "rope_theta": float, "shared_classifier": bool,
                 "qkv_bias": bool, "qk_norm": bool, "architecture": str,
                 "rope_scaling": lambda s: tuple(v if i == 0 else float(v) for i, v in enumerate(s))}
        for field in fields(self):  # plain Python numbers: header values arrive as numpy ints
            kind = kinds.get(field.name, int)
            object.__setattr__(self, field.name, kind(getattr(self, field.name)))
        if self.head_dim * self.n_heads == self.dim:   # one way to say Llama's own head size
            object.__setattr__(self, "head_dim", 0)
        problem = self.problem()
        if problem:
            raise ValueError(f"LlamaConfig: {problem}")

    def problem(self):
        """What is wrong with these sizes, or None."""
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim",
                     "max_seq_len"):
            if getattr(self, name) <= 0:
                return f"{name} must be positive, got {getattr(self, name)}"
        if self.head_dim < 0:
            return f"head_dim must be positive (or 0: dim / n_heads), got {self.head_dim}"
        if self.head_dim == 0 and self.dim % self.n_heads != 0:
            return f"dim={self.dim} is not a multiple of n_heads={self.n_heads}"
        if self.head_size % 2 != 0:
            return f"head size {self.head_size} is odd; RoPE rotates pairs"
        if self.n_heads % self.n_kv_heads != 0:
            return f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}"
        if not (self.norm_eps > 0 and self.rope_theta > 0):
            return f"norm_eps={self.norm_eps} and rope_theta={self.rope_theta} must be positive"
        if self.rope_scaling and (self.rope_scaling[0] not in ROPE_SCALINGS
                                  or len(self.rope_scaling) != 5):
            return (f"rope_scaling={self.rope_scaling}: not (\"llama3\", factor, low_freq_factor, "
                    f"high_freq_factor, original_max_position_embeddings)")
        return None

    def switches(self):
        """The switches set beyond Llama 2's block, in words (empty for llama2.c's models)."""
        said = [f"rms eps {self.norm_eps:g}"] * (self.norm_eps != 1e-5)
        said += [f"rope theta {self.rope_theta:g}"] * (self.rope_theta != 10000.0)
        if self.head_dim and self.head_dim * self.n_heads != self.dim:
            said.append(f"head_dim {self.head_dim}")
        said += ["qkv bias"] * self.qkv_bias + ["QK-norm"] * self.qk_norm
        if self.rope_scaling:
            said.append(f"{self.rope_scaling[0]} RoPE scaling x{self.rope_scaling[1]:g}")
        return said

    @property
    def head_size(self):
        return self.head_dim or self.dim // self.n_heads

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
        """The parameter tensors as (name, shape) in the flat buffer's order (param_shapes)."""
        return param_shapes(self)

    def num_parameters(self):
        return sum(int(np.prod(shape)) for _, shape in self.param_shapes())

    def describe(self):
        return (f"dim={self.dim} L={self.n_layers} NH={self.n_heads} NKV={self.n_kv_heads} "
                f"V={self.vocab_size} H={self.hidden_dim} maxT={self.max_seq_len} "
                f"{'shared' if self.shared_classifier else 'separate'} classifier"
                + "".join(f", {switch}" for switch in self.switches()))

    def table_rows(self):
        """(label, value) of each size, for train.py's console table."""
        return [("max_sequence_length T", self.max_seq_len), ("vocab_size V", self.vocab_size),
                ("num_layers L", self.n_layers), ("num_heads NH", self.n_heads),
                ("num_kv_heads NKV", self.n_kv_heads), ("channels C", self.dim),
                ("hidden_dim H", self.hidden_dim),
                ("classifier", "shared" if self.shared_classifier else "separate")] + \
               [("switches", ", ".join(self.switches()))] * bool(self.switches())


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
# ... and the shapes of today's small open models, as their config.json give them (their
# weights come from Hugging Face: dev/download_hf.py; a preset is a random model of that shape;
# llama-1b above is TinyLlama-1.1B's)
LLAMA3_SCALING = ("llama3", 32.0, 1.0, 4.0, 8192.0)
PRESETS.update({
    "SmolLM2-135M": LlamaConfig(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, vocab_size=49152,
                                hidden_dim=1536, max_seq_len=8192, rope_theta=100000.0),
    "SmolLM2-360M": LlamaConfig(dim=960, n_layers=32, n_heads=15, n_kv_heads=5, vocab_size=49152,
                                hidden_dim=2560, max_seq_len=8192, rope_theta=100000.0),
    "SmolLM2-1.7B": LlamaConfig(dim=2048, n_layers=24, n_heads=32, n_kv_heads=32,
                                vocab_size=49152, hidden_dim=8192, max_seq_len=8192,
                                rope_theta=130000.0),
    "Llama-3.2-1B": LlamaConfig(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                                vocab_size=128256, hidden_dim=8192, max_seq_len=131072,
                                rope_theta=500000.0, rope_scaling=LLAMA3_SCALING),
    "Llama-3.2-3B": LlamaConfig(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8,
                                vocab_size=128256, hidden_dim=8192, max_seq_len=131072,
                                rope_theta=500000.0, rope_scaling=LLAMA3_SCALING),
    "Qwen2.5-0.5B": LlamaConfig(dim=896, n_layers=24, n_heads=14, n_kv_heads=2, vocab_size=151936,
                                hidden_dim=4864, max_seq_len=32768, norm_eps=1e-6,
                                rope_theta=1e6, qkv_bias=True, architecture="Qwen2ForCausalLM"),
    "Qwen2.5-1.5B": LlamaConfig(dim=1536, n_layers=28, n_heads=12, n_kv_heads=2,
                                vocab_size=151936, hidden_dim=8960, max_seq_len=32768,
                                norm_eps=1e-6, rope_theta=1e6, qkv_bias=True,
                                architecture="Qwen2ForCausalLM"),
    "Qwen3-0.6B": LlamaConfig(dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, vocab_size=151936,
                              hidden_dim=3072, max_seq_len=40960, norm_eps=1e-6, rope_theta=1e6,
                              head_dim=128, qk_norm=True, architecture="Qwen3ForCausalLM"),
    "Qwen3-1.7B": LlamaConfig(dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, vocab_size=151936,
                              hidden_dim=6144, max_seq_len=40960, norm_eps=1e-6, rope_theta=1e6,
                              head_dim=128, qk_norm=True, architecture="Qwen3ForCausalLM"),
    "Mistral-7B-v0.3": LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                                   vocab_size=32768, hidden_dim=14336, max_seq_len=32768,
                                   rope_theta=1e6, shared_classifier=False,
                                   architecture="MistralForCausalLM"),
})


# ----------------------------------------------------------------------------
# the parameters: llama2.c's checkpoint order, the order of this struct's fields (Layout.point
# fills it from param_shapes, whose shapes are keyed by these fields)

ctypedef struct ParameterTensors:
    float* tok_embeddings   # (V, C)
    float* attention_norm   # (L, C)
    float* wq               # (L, QD, C)
    float* wk               # (L, KVD, C)
    float* wv               # (L, KVD, C)
    float* bq               # (L, QD)   with qkv_bias only
    float* bk               # (L, KVD)  with qkv_bias only
    float* bv               # (L, KVD)  with qkv_bias only
    float* q_norm           # (L, hs)   with qk_norm only
    float* k_norm           # (L, hs)   with qk_norm only
    float* wo               # (L, C, QD)
    float* ffn_norm         # (L, C)
    float* w1               # (L, H, C)
    float* w2               # (L, C, H)
    float* w3               # (L, H, C)
    float* norm             # (C,)
    float* output           # (V, C); tok_embeddings itself with a shared classifier


def param_shapes(config):
    """The parameter tensors as (name, shape) in the flat buffer's order: llama2.c's
    checkpoint order, Meta's names, per-layer tensors stacked along a leading L axis, each
    matrix as nn.Linear keeps it (out_features, in_features); output only with a separate
    classifier, the biases and the q/k norms only with their switches."""
    return [(name, shape) for _, name, shape in param_fields(config)]


def param_fields(config):
    """(its ParameterTensors field's index, name, shape) of each parameter tensor, in the
    struct's order.  Each shape is keyed by the address of its field, so the list comes out in
    the struct's order, and a field without a shape fails the size check."""
    cdef ParameterTensors field
    C, L, V, H, hs = config.dim, config.n_layers, config.vocab_size, config.hidden_dim, config.head_size
    q_dim, kv_dim = config.n_heads * hs, config.n_kv_heads * hs
    by_field = {
        <size_t>&field.tok_embeddings: ("tok_embeddings", (V, C)),
        <size_t>&field.attention_norm: ("attention_norm", (L, C)),
        <size_t>&field.wq: ("wq", (L, q_dim, C)),
        <size_t>&field.wk: ("wk", (L, kv_dim, C)),
        <size_t>&field.wv: ("wv", (L, kv_dim, C)),
        <size_t>&field.bq: ("bq", (L, q_dim)),
        <size_t>&field.bk: ("bk", (L, kv_dim)),
        <size_t>&field.bv: ("bv", (L, kv_dim)),
        <size_t>&field.q_norm: ("q_norm", (L, hs)),
        <size_t>&field.k_norm: ("k_norm", (L, hs)),
        <size_t>&field.wo: ("wo", (L, C, q_dim)),
        <size_t>&field.ffn_norm: ("ffn_norm", (L, C)),
        <size_t>&field.w1: ("w1", (L, H, C)),
        <size_t>&field.w2: ("w2", (L, C, H)),
        <size_t>&field.w3: ("w3", (L, H, C)),
        <size_t>&field.norm: ("norm", (C,)),
        <size_t>&field.output: ("output", (V, C)),
    }
    assert len(by_field) * sizeof(float*) == sizeof(ParameterTensors), "a field has no shape"
    if config.shared_classifier:   # output is tok_embeddings itself (point_parameters)
        del by_field[<size_t>&field.output]
    if not config.qkv_bias:
        for address in (<size_t>&field.bq, <size_t>&field.bk, <size_t>&field.bv):
            del by_field[address]
    if not config.qk_norm:
        del by_field[<size_t>&field.q_norm], by_field[<size_t>&field.k_norm]
    return [((address - <size_t>&field) // sizeof(float*), *by_field[address])
            for address in sorted(by_field)]


# ----------------------------------------------------------------------------
# the activations, as the checkpoint core (llmc/model.pyx) takes them: the embedding's output
# "encoded" (B, T, C), one layer's 23 (stacked over the layers the policy keeps; the four of
# QK-norm empty without it), the head's 5

ctypedef struct LayerActivations:
    float* ln1          # (B, T, C)  attention_norm's output
    float* ln1_rstd     # (B, T)
    float* q            # (B, T, QD)
    float* k            # (B, T, KVD)
    float* v            # (B, T, KVD)
    float* qn           # (B, T, QD)  q's heads RMS-normalised (qk_norm; else empty)
    float* qn_rstd      # (B, T, NH)
    float* kn           # (B, T, KVD) k's heads RMS-normalised (qk_norm; else empty)
    float* kn_rstd      # (B, T, NKV)
    float* qr           # (B, T, QD)  q (qn with qk_norm) rotated by RoPE
    float* kr           # (B, T, KVD) k (kn with qk_norm) rotated by RoPE
    float* att          # (B, NH, T, T) attention probabilities; empty with flash attention
    float* att_lse      # (B, NH, T)    flash attention: each row's log-sum-exp; else empty
    float* atty         # (B, T, QD)  the heads' outputs side by side
    float* attproj      # (B, T, C)
    float* residual2    # (B, T, C)
    float* ln2          # (B, T, C)  ffn_norm's output
    float* ln2_rstd     # (B, T)
    float* h1           # (B, T, H)  w1's output, the gate
    float* h3           # (B, T, H)  w3's output
    float* hgated       # (B, T, H)  silu(h1) * h3
    float* ffnproj      # (B, T, C)
    float* residual3    # (B, T, C)  the layer's output, the residual stream into the next

ctypedef struct HeadActivations:
    float* lnf          # (B, T, C)
    float* lnf_rstd     # (B, T)
    float* logits       # (B, T, V)
    float* logsum       # (B, T)  log of the softmax's normaliser (kernels/classifier: no probs)
    float* losses       # (B, T)


def activation_shapes(config, int B, int T, bint flash=True):
    """The activations of a batch of B sequences of T tokens, with flash attention or the
    (B,NH,T,T) probabilities, as (name, shape): (the embedding's output "encoded", one layer's 23
    tensors, the head's 5).  The model's 29 tensors are these with each layer tensor stacked
    over the L layers."""
    cdef int C = config.dim, NH = config.n_heads, NKV = config.n_kv_heads, H = config.hidden_dim
    cdef int QD = NH * config.head_size, KVD = NKV * config.head_size
    normed = config.qk_norm
    V = config.vocab_size
    empty = (0,)
    layer = [
        ("ln1", (B, T, C)), ("ln1_rstd", (B, T)), ("q", (B, T, QD)), ("k", (B, T, KVD)),
        ("v", (B, T, KVD)), ("qn", (B, T, QD) if normed else empty),
        ("qn_rstd", (B, T, NH) if normed else empty), ("kn", (B, T, KVD) if normed else empty),
        ("kn_rstd", (B, T, NKV) if normed else empty), ("qr", (B, T, QD)), ("kr", (B, T, KVD)),
        ("att", empty if flash else (B, NH, T, T)), ("att_lse", (B, NH, T) if flash else empty),
        ("atty", (B, T, QD)), ("attproj", (B, T, C)), ("residual2", (B, T, C)),
        ("ln2", (B, T, C)), ("ln2_rstd", (B, T)), ("h1", (B, T, H)), ("h3", (B, T, H)),
        ("hgated", (B, T, H)), ("ffnproj", (B, T, C)), ("residual3", (B, T, C)),
    ]
    head = [("lnf", (B, T, C)), ("lnf_rstd", (B, T)), ("logits", (B, T, V)),
            ("logsum", (B, T)), ("losses", (B, T))]
    return ("encoded", (B, T, C)), layer, head


# ----------------------------------------------------------------------------
# the model


# LORA_TARGETS' indices: which linear layer linear_forward and linear_backward run
cdef enum:
    WQ, WK, WV, WO, W1, W2, W3


cdef class Llama2(Model):
    """Llama 2 with one buffer per kind, as llm.c.  See the module docstring for the letters."""
    FAMILY = "llama"
    ENTRY_GROUPS = ("core", "linear", "llama", "classifier")   # its kernels (accel/spec.py);
    #                                                           flash when the backend has it
    # the matrices: weight decay applies to them alone with decay_2d_only (not the norms)
    MATRICES = frozenset(("tok_embeddings", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "output"))
    #            (the biases and the q/k norms are vectors, as the norms)
    # the activations whose gradients no backward kernel takes: none are allocated
    NO_GRAD = frozenset(("ln1_rstd", "qn_rstd", "kn_rstd", "att", "att_lse", "ln2_rstd",
                         "lnf_rstd", "logsum"))
    # the linear layers LoRA may adapt, each's index the enum's below (llmc/model.pyx)
    LORA_TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
    # float32 at every precision: the statistics, the log-sum-exps and the losses
    FP32_ACTIVATIONS = frozenset(("ln1_rstd", "qn_rstd", "kn_rstd", "att_lse", "ln2_rstd",
                                  "lnf_rstd", "logsum",
                                  "losses"))
    cdef int NH, NKV, hs, C, H, V
    cdef readonly bint flash                    # flash attention (the backend has it)
    cdef float eps
    cdef readonly bint fused                    # the fused group's blocks (runs_fused: the ANE)
    cdef bint fused_qkv                         # ... its Q, K, V block too (it has no bias)
    cdef bint qkv_bias, qk_norm                 # the config's switches
    cdef list param_slots                       # each parameter tensor's field in the structs
    cdef ParameterTensors params_c, grads_c     # pointers into the buffers, llm.c's structs
    cdef Buffer _rope                           # RoPE's cos and sin tables, (maxT, hs/2) each
    cdef const float* freqs_cos
    cdef const float* freqs_sin

    def __init__(self, config, backend="cpu", recompute="all", precision=None, trainable=True,
                 **options):
        """A model of this LlamaConfig with all parameters zero (see random / from_checkpoint),
        on a backend: "cpu", "check:cpu", ... (accel.backend.backend_names()), keeping its
        activations by a recompute policy: "all", "sqrt", ... (llmc/recompute.py), at a precision:
        "fp32" or "bf16" (llmc/model.pyx; None: the backend's, else fp32); trainable=False: for
        inference or a LoRA base (llmc/model.pyx: no master weights at bf16); options: Model's
        grad_precision and master_weights (llmc/model.pyx)."""
        assert sizeof(LayerActivations) == 23 * sizeof(float*)
        assert sizeof(HeadActivations) == 5 * sizeof(float*)
        self.NH, self.NKV = config.n_heads, config.n_kv_heads
        self.hs, self.C, self.H = config.head_size, config.dim, config.hidden_dim
        self.V, self.eps = config.vocab_size, config.norm_eps
        self.qkv_bias, self.qk_norm = config.qkv_bias, config.qk_norm
        self.param_slots = [slot for slot, _, _ in param_fields(config)]
        super().__init__(config, backend, recompute, precision, trainable, **options)
        self.flash = self.backend.supports("flash")
        self.fused = self.backend.supports("fused") and self.backend.runs_fused
        self.fused_qkv = self.fused and not self.qkv_bias
        # the rotation tables, computed once on the host and uploaded (read-only from here on)
        freqs_cos, freqs_sin = rope_tables(config.max_seq_len, self.hs, config.rope_theta,
                                           config.rope_scaling)
        cdef Py_ssize_t table_size = freqs_cos.size
        self._rope = self.backend.alloc(2 * table_size * sizeof(float))
        self._rope.load(np.concatenate([freqs_cos.ravel(), freqs_sin.ravel()]))
        self.freqs_cos = <float*>self._rope.ptr
        self.freqs_sin = self.freqs_cos + table_size

    cdef void point_fields(self, float** fields, float* base, int itemsize) noexcept:
        """Each parameter tensor's field (param_slots) at its place in base; the fields of
        tensors this config has not stay NULL."""
        for slot, offset in zip(self.param_slots, self.param_layout.offsets):
            fields[<int>slot] = <float*>(<char*>base + <Py_ssize_t>offset * itemsize)

    cdef void point_parameters(self, float* params, float* grads) noexcept:
        self.point_fields(<float**>&self.params_c, params, self.itemsize)
        if self.config.shared_classifier:
            self.params_c.output = self.params_c.tok_embeddings
        if grads != NULL:
            self.point_fields(<float**>&self.grads_c, grads, self.grad_itemsize)
            if self.config.shared_classifier:   # both uses add into the one gradient
                self.grads_c.output = self.grads_c.tok_embeddings

    @classmethod
    def activation_shapes(cls, config, int B, int T, bint flash=True):
        return activation_shapes(config, B, T, flash)

    @classmethod
    def activation_options(cls, backend):
        return dict(flash=backend.supports("flash"))

    @classmethod
    def num_layers_of(cls, config):
        return config.n_layers

    @classmethod
    def kv_shape(cls, config):
        """(NKV*hs, NH): the keys of a position in a layer are its NKV key/value heads'."""
        return config.n_kv_heads * config.head_size, config.n_heads

    @classmethod
    def flops_per_token(cls, config, int T):
        """Forward FLOPs per token of a sequence of T: {layer_matmul, layer_attention,
        head_matmul}, each layer's and the head's (backward is twice the forward).  A matmul
        is 2*C*OC per token: per layer 2*(C*QD + 2*C*KVD + QD*C + 3*C*H); causal attention
        averages (T+1)/2 keys per query for q.k and for att.v in each of the NH heads:
        2*QD*(T+1) per layer (GQA shares k and v, not the FLOPs)."""
        C, H = config.dim, config.hidden_dim
        QD, KVD = config.n_heads * config.head_size, config.n_kv_heads * config.head_size
        return dict(layer_matmul=2.0 * (2 * C * QD + 2 * C * KVD + 3 * C * H),
                    layer_attention=2.0 * QD * (T + 1), head_matmul=2.0 * C * config.vocab_size)

    @classmethod
    def from_checkpoint(cls, path, backend="cpu", recompute="all", precision=None,
                        trainable=True, **options):
        """Load a llama2.c model file (version 0 or 1), a float32 GGUF or a Hugging Face model
        (read_model); the last read tensor by tensor into the model's own buffer (trainable,
        options: see Model)."""
        if model_format(path) in HF_FORMATS:
            tensors, hf_config = read_hf_checkpoint(path)
            model = cls(llama_config_from_hf(hf_config, LlamaConfig, path), backend, recompute,
                        precision, trainable, **options)
            model.fill_params(lambda flat, store: llama_from_hf(
                tensors, hf_config, LlamaConfig, path, into=flat, store=store))
            return model
        config, params = read_model(path)
        model = cls(config, backend, recompute, precision, trainable, **options)
        model.params = params
        return model

    @classmethod
    def random(cls, config, seed=0, backend="cpu", recompute="all", precision=None, **options):
        """llama2.c's initialisation (as train_llama2_torch.init_params, from NumPy's generator):
        every matrix and the embedding N(0, 0.02), wo and w3 N(0, 0.02/sqrt(2L)), norms 1."""
        model = cls(config, backend, recompute, precision, **options)
        rng = np.random.default_rng(seed)
        params = np.zeros(model.num_parameters, dtype=np.float32)
        residual_std = 0.02 / np.sqrt(2 * config.n_layers)
        for name, tensor in model.param_layout.views(params).items():
            if name in ("attention_norm", "ffn_norm", "norm"):
                tensor[...] = 1.0
            else:
                std = residual_std if name in ("wo", "w3") else 0.02
                tensor[...] = rng.standard_normal(tensor.shape, dtype=np.float32) * np.float32(std)
        model.params = params
        return model

    def save(self, path):
        """Write a llama2.c model file (version 1), or where llama2.c's format cannot hold the
        model (a Hugging Face model's switches) a safetensors file with its config.json inside;
        float32 at every precision (at bf16: the master weights)."""
        if llama2c_problem(self.config) is None:
            write_llama_model(path, self.config, self.params)
        else:
            write_hf_model_file(path, *llama_to_hf(self.config, self.params))

    @property
    def logits(self):
        """(B, T, V) logits of the last forward."""
        return self.activation("logits")

    @property
    def probs(self):
        """(B, T, V) softmax of the logits, computed here from the logits and logsum (the
        model keeps no probabilities: sampling is their only use)."""
        logits = self.activation("logits")
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return shifted / np.exp(self.activation("logsum"))[..., None]

    # --- forward ---------------------------------------------------------------

    cdef void embedding_forward(self, float* out, const int* inputs, int B, int T) noexcept nogil:
        self.table.embedding_forward(self.table.ctx, out, inputs, self.params_c.tok_embeddings, B, T, self.C)

    cdef void layer_forward(self, int layer, float** layer_acts, const float* residual, int B, int T) noexcept nogil:
        """Layer l on its input residual (B, T, C), into its activations."""
        cdef Py_ssize_t l = layer   # weight offsets outgrow an int in big models
        cdef void* ctx = self.table.ctx
        cdef ParameterTensors p = self.params_c
        cdef LayerActivations* a = <LayerActivations*>layer_acts
        cdef int C = self.C, H = self.H, NH = self.NH, NKV = self.NKV, hs = self.hs
        cdef int QD = NH * hs, KVD = NKV * hs
        cdef Py_ssize_t BTC = <Py_ssize_t>B * T * C
        # this layer's weights
        cdef const float* l_attention_norm = self.at(p.attention_norm, l * C)
        cdef const float* l_wq = self.at(p.wq, l * QD * C)
        cdef const float* l_wk = self.at(p.wk, l * KVD * C)
        cdef const float* l_wv = self.at(p.wv, l * KVD * C)
        cdef const float* l_wo = self.at(p.wo, l * C * QD)
        cdef const float* l_ffn_norm = self.at(p.ffn_norm, l * C)
        cdef const float* l_w1 = self.at(p.w1, l * H * C)
        cdef const float* l_w2 = self.at(p.w2, l * C * H)
        cdef const float* l_w3 = self.at(p.w3, l * H * C)
        cdef const float* l_bq = self.at(p.bq, l * QD) if self.qkv_bias else NULL
        cdef const float* l_bk = self.at(p.bk, l * KVD) if self.qkv_bias else NULL
        cdef const float* l_bv = self.at(p.bv, l * KVD) if self.qkv_bias else NULL
        cdef const float* l_q_norm = self.at(p.q_norm, l * hs) if self.qk_norm else NULL
        cdef const float* l_k_norm = self.at(p.k_norm, l * hs) if self.qk_norm else NULL
        cdef float* q = a.qn if self.qk_norm else a.q    # what RoPE rotates
        cdef float* k = a.kn if self.qk_norm else a.k

        self.table.rmsnorm_forward(ctx, a.ln1, a.ln1_rstd, residual, l_attention_norm, self.eps, B, T, C)
        if self.fused_qkv:
            self.table.qkv_forward(ctx, a.q, a.k, a.v, a.ln1, l_wq, l_wk, l_wv, B, T, C, NH, NKV, hs)
        else:
            self.linear_forward(WQ, layer, a.q, a.ln1, l_wq, l_bq, B, T, C, QD)
            self.linear_forward(WK, layer, a.k, a.ln1, l_wk, l_bk, B, T, C, KVD)
            self.linear_forward(WV, layer, a.v, a.ln1, l_wv, l_bv, B, T, C, KVD)
        if self.qk_norm:   # each head's hs channels a row of its own: B*T*NH rows of hs
            self.table.rmsnorm_forward(ctx, a.qn, a.qn_rstd, a.q, l_q_norm, self.eps, B * T, NH, hs)
            self.table.rmsnorm_forward(ctx, a.kn, a.kn_rstd, a.k, l_k_norm, self.eps, B * T, NKV, hs)
        cdef Py_ssize_t rotations, row
        cdef int s, n
        if self.kv_caching:   # each segment at its positions, over the cached ones too (B = 1,
            for s in range(self.num_segments):   # llmc/model.pxd)
                row, n = self.segment_row(s), self.segment_length(s)
                rotations = <Py_ssize_t>self.segment_position(s) * (hs // 2)
                self.table.rope_forward(ctx, self.at(a.qr, row * QD), self.at(q, row * QD),
                                        self.freqs_cos + rotations, self.freqs_sin + rotations, 1, n, NH, hs)
                self.table.rope_forward(ctx, self.at(a.kr, row * KVD), self.at(k, row * KVD),
                                        self.freqs_cos + rotations, self.freqs_sin + rotations, 1, n, NKV, hs)
                self.table.attention_gqa_cached_forward(ctx, self.at(a.atty, row * QD), self.kv_scores,
                                                        self.kv_keys(layer), self.kv_values(layer),
                                                        self.at(a.qr, row * QD), self.at(a.kr, row * KVD),
                                                        self.at(a.v, row * KVD), n,
                                                        self.segment_position(s), NH, NKV, hs)
        else:
            self.table.rope_forward(ctx, a.qr, q, self.freqs_cos, self.freqs_sin, B, T, NH, hs)
            self.table.rope_forward(ctx, a.kr, k, self.freqs_cos, self.freqs_sin, B, T, NKV, hs)
            if self.flash:
                self.table.flash_attention_gqa_forward(ctx, a.atty, a.att_lse, a.qr, a.kr, a.v, B, T, NH, NKV, hs)
            else:
                self.table.attention_gqa_forward(ctx, a.atty, a.att, a.qr, a.kr, a.v, B, T, NH, NKV, hs)
        self.linear_forward(WO, layer, a.attproj, a.atty, l_wo, NULL, B, T, QD, C)
        self.table.residual_forward(ctx, a.residual2, residual, a.attproj, BTC)
        self.table.rmsnorm_forward(ctx, a.ln2, a.ln2_rstd, a.residual2, l_ffn_norm, self.eps, B, T, C)
        if self.fused:
            self.table.ffn_forward(ctx, a.ffnproj, a.h1, a.h3, a.hgated, a.ln2, l_w1, l_w3, l_w2,
                                   B, T, C, H)
        else:
            self.linear_forward(W1, layer, a.h1, a.ln2, l_w1, NULL, B, T, C, H)
            self.linear_forward(W3, layer, a.h3, a.ln2, l_w3, NULL, B, T, C, H)
            self.table.swiglu_forward(ctx, a.hgated, a.h1, a.h3, <Py_ssize_t>B * T * H)
            self.linear_forward(W2, layer, a.ffnproj, a.hgated, l_w2, NULL, B, T, H, C)
        self.table.residual_forward(ctx, a.residual3, a.residual2, a.ffnproj, BTC)

    cdef void head_forward(self, float** head_acts, const float* residual, const int* targets,
                           int B, int T) noexcept nogil:
        cdef void* ctx = self.table.ctx
        cdef ParameterTensors p = self.params_c
        cdef HeadActivations* acts = <HeadActivations*>head_acts
        cdef int C = self.C, V = self.V
        self.table.rmsnorm_forward(ctx, acts.lnf, acts.lnf_rstd, residual, p.norm, self.eps, B, T, C)
        self.table.matmul_forward(ctx, acts.logits, acts.lnf, p.output, NULL, B, T, C, V)
        self.table.classifier_forward(ctx, acts.losses if targets != NULL else NULL, acts.logsum,
                                  acts.logits, targets, B, T, V, V)

    # --- backward --------------------------------------------------------------

    cdef void head_backward(self, float* dresidual, float** head_grads, float** head_acts,
                            const float* residual, const int* targets, int B, int T) noexcept nogil:
        cdef void* ctx = self.table.ctx
        cdef ParameterTensors p = self.params_c, g = self.grads_c
        cdef HeadActivations* acts = <HeadActivations*>head_acts
        cdef HeadActivations* grads_acts = <HeadActivations*>head_grads
        cdef int C = self.C, V = self.V
        self.table.classifier_backward(ctx, grads_acts.logits, grads_acts.losses, acts.logits,
                                   acts.logsum, targets, B, T, V, V)
        self.table.matmul_backward(ctx, grads_acts.lnf, g.output, NULL, grads_acts.logits, acts.lnf,
                               p.output, B, T, C, V)
        self.table.rmsnorm_backward(ctx, dresidual, g.norm, grads_acts.lnf, residual, p.norm,
                                acts.lnf_rstd, B, T, C)

    cdef void layer_backward(self, int layer, float* dresidual, float** layer_grads, float** layer_acts,
                             const float* residual, int B, int T) noexcept nogil:
        """Layer l's gradients: from da.residual3 (the gradient of its output) into its
        weights' gradients, its activation gradients da, and dresidual (B, T, C), the gradient
        of its input residual (all +=)."""
        cdef Py_ssize_t l = layer   # weight offsets outgrow an int in big models
        cdef void* ctx = self.table.ctx
        cdef ParameterTensors p = self.params_c, g = self.grads_c
        cdef LayerActivations* a = <LayerActivations*>layer_acts
        cdef LayerActivations* da = <LayerActivations*>layer_grads
        cdef int C = self.C, H = self.H, NH = self.NH, NKV = self.NKV, hs = self.hs
        cdef int QD = NH * hs, KVD = NKV * hs
        cdef Py_ssize_t BTC = <Py_ssize_t>B * T * C
        # this layer's weights
        cdef const float* l_attention_norm = self.at(p.attention_norm, l * C)
        cdef const float* l_wq = self.at(p.wq, l * QD * C)
        cdef const float* l_wk = self.at(p.wk, l * KVD * C)
        cdef const float* l_wv = self.at(p.wv, l * KVD * C)
        cdef const float* l_wo = self.at(p.wo, l * C * QD)
        cdef const float* l_ffn_norm = self.at(p.ffn_norm, l * C)
        cdef const float* l_w1 = self.at(p.w1, l * H * C)
        cdef const float* l_w2 = self.at(p.w2, l * C * H)
        cdef const float* l_w3 = self.at(p.w3, l * H * C)
        # this layer's weight gradients (NULL where the parameters are frozen: LoRA)
        cdef float* dl_attention_norm = self.grad_at(g.attention_norm, l * C)
        cdef float* dl_wq = self.grad_at(g.wq, l * QD * C)
        cdef float* dl_wk = self.grad_at(g.wk, l * KVD * C)
        cdef float* dl_wv = self.grad_at(g.wv, l * KVD * C)
        cdef float* dl_wo = self.grad_at(g.wo, l * C * QD)
        cdef float* dl_ffn_norm = self.grad_at(g.ffn_norm, l * C)
        cdef float* dl_w1 = self.grad_at(g.w1, l * H * C)
        cdef float* dl_w2 = self.grad_at(g.w2, l * C * H)
        cdef float* dl_w3 = self.grad_at(g.w3, l * H * C)
        cdef float* dl_bq = self.grad_at(g.bq, l * QD)   # NULL too without the qkv bias
        cdef float* dl_bk = self.grad_at(g.bk, l * KVD)
        cdef float* dl_bv = self.grad_at(g.bv, l * KVD)
        cdef const float* l_q_norm = self.at(p.q_norm, l * hs) if self.qk_norm else NULL
        cdef const float* l_k_norm = self.at(p.k_norm, l * hs) if self.qk_norm else NULL
        cdef float* dl_q_norm = self.grad_at(g.q_norm, l * hs)
        cdef float* dl_k_norm = self.grad_at(g.k_norm, l * hs)
        cdef float* dq = da.qn if self.qk_norm else da.q   # the gradient of what RoPE rotated
        cdef float* dk = da.kn if self.qk_norm else da.k

        # the forward's steps, in reverse
        self.table.residual_backward(ctx, da.residual2, da.ffnproj, da.residual3, BTC)
        if self.fused:
            self.table.ffn_backward(ctx, da.ln2, dl_w1, dl_w3, dl_w2, da.h1, da.h3, da.hgated,
                                    da.ffnproj, a.ln2, a.h1, a.h3, a.hgated, l_w1, l_w3, l_w2,
                                    B, T, C, H)
        else:
            self.linear_backward(W2, layer, da.hgated, dl_w2, NULL, da.ffnproj, a.hgated, l_w2,
                                 B, T, H, C)
            self.table.swiglu_backward(ctx, da.h1, da.h3, da.hgated, a.h1, a.h3, <Py_ssize_t>B * T * H)
            self.linear_backward(W3, layer, da.ln2, dl_w3, NULL, da.h3, a.ln2, l_w3, B, T, C, H)
            self.linear_backward(W1, layer, da.ln2, dl_w1, NULL, da.h1, a.ln2, l_w1, B, T, C, H)
        self.table.rmsnorm_backward(ctx, da.residual2, dl_ffn_norm, da.ln2, a.residual2, l_ffn_norm,
                                a.ln2_rstd, B, T, C)
        self.table.residual_backward(ctx, dresidual, da.attproj, da.residual2, BTC)
        self.linear_backward(WO, layer, da.atty, dl_wo, NULL, da.attproj, a.atty, l_wo, B, T, QD, C)
        if self.flash:
            self.table.flash_attention_gqa_backward(ctx, da.qr, da.kr, da.v, da.atty, a.qr, a.kr, a.v,
                                                a.atty, a.att_lse, B, T, NH, NKV, hs)
        else:
            self.table.attention_gqa_backward(ctx, da.qr, da.kr, da.v, da.atty, a.qr, a.kr, a.v, a.att,
                                          B, T, NH, NKV, hs)
        self.table.rope_backward(ctx, dq, da.qr, self.freqs_cos, self.freqs_sin, B, T, NH, hs)
        self.table.rope_backward(ctx, dk, da.kr, self.freqs_cos, self.freqs_sin, B, T, NKV, hs)
        if self.qk_norm:
            self.table.rmsnorm_backward(ctx, da.q, dl_q_norm, da.qn, a.q, l_q_norm, a.qn_rstd,
                                        B * T, NH, hs)
            self.table.rmsnorm_backward(ctx, da.k, dl_k_norm, da.kn, a.k, l_k_norm, a.kn_rstd,
                                        B * T, NKV, hs)
        if self.fused_qkv:
            self.table.qkv_backward(ctx, da.ln1, dl_wq, dl_wk, dl_wv, da.q, da.k, da.v, a.ln1,
                                    l_wq, l_wk, l_wv, B, T, C, NH, NKV, hs)
        else:
            self.linear_backward(WV, layer, da.ln1, dl_wv, dl_bv, da.v, a.ln1, l_wv, B, T, C, KVD)
            self.linear_backward(WK, layer, da.ln1, dl_wk, dl_bk, da.k, a.ln1, l_wk, B, T, C, KVD)
            self.linear_backward(WQ, layer, da.ln1, dl_wq, dl_bq, da.q, a.ln1, l_wq, B, T, C, QD)
        self.table.rmsnorm_backward(ctx, dresidual, dl_attention_norm, da.ln1, residual,
                                l_attention_norm, a.ln1_rstd, B, T, C)

    cdef void embedding_backward(self, const float* dencoded, const int* inputs, int B, int T) noexcept nogil:
        self.table.embedding_backward(self.table.ctx, self.grads_c.tok_embeddings, dencoded, inputs, B, T,
                                  self.C, self.V)


# ----------------------------------------------------------------------------
# the family, as train.py, the tests and dev/ find it: llmc.families.get_family("llama")

def read_model(path):
    """(LlamaConfig, float32 params) of a llama2.c model file (version 0 or 1), a float32
    GGUF, or a Hugging Face model of the Llama block (its folder, or a safetensors file), told
    apart by their first bytes (llmc.formats.model_format)."""
    found = model_format(path)
    if found == "gguf":
        return read_gguf(path, LlamaConfig)[:2]
    if found in HF_FORMATS:
        return read_hf_model(path, {"llama": LlamaConfig})
    return read_llama_model(path, LlamaConfig)


define_family(Family(
    name="llama", title="Llama 2", model_class=Llama2, config_class=LlamaConfig,
    presets=PRESETS, preset_noun="Llama preset", random_inits="dN or a Llama preset",
    default_init="stories15M", stand_in=None, download=None, read_model=read_model,
    formats=("llama2c", "gguf", "hf", "safetensors"),
    hf_architectures=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                      "Qwen3ForCausalLM"),
    reference="train_llama2_torch"))
