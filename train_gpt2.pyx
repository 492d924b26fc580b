"""
GPT-2 training in Cython: the model of llm.c's train_gpt2.c, on any backend.

The GPT-2 family in one place: its config (llm.c's sizes and named depths), its parameter and
activation shapes beside the pointer structs they fill, its init, its model file (llm.c's
checkpoint, llmc/formats/llmc.py), its FLOPs, and the forward and backward of its embedding,
of one layer and of its head; it registers itself as "gpt2" (llmc/families.py).  Everything
else (buffers, tokens in and loss out, running the layers under an activation checkpoint
policy, zero_grad, the gradient norm, AdamW) is the model-generic core, llmc/model.pyx, and
every kernel call goes through the backend table (accel/backend.pxd):
GPT2(config, backend="cpu", recompute="all").  One parameter buffer cut into 16 tensors, one
activation buffer cut into 25: llm.c's 23, the attention's log-sum-exp and the classifier's
(with recompute="all", the default; other policies keep the layer tensors of fewer layers:
llmc/recompute.py).  Attention is flash attention (only a (B,NH,T) log-sum-exp per layer kept)
where the backend has the "flash" kernels, else llm.c's with its (B,NH,T,T) pre-softmax and
softmax buffers; the loss is the classifier's (only a (B,T) log-sum-exp kept, as llm.c's fused
classifier) where the backend has the "classifier" kernels, else llm.c's softmax into a
(B,T,Vp) probability buffer and its cross-entropy.  The buffers of the ones not used are empty.

Dimension letters:
    B batch size, T sequence length, C channels, L layers, NH heads,
    V vocabulary size, Vp padded vocabulary (rows of wte; a multiple of 128),
    maxT the longest sequence the position table holds.
"""
import os
from dataclasses import dataclass, fields

import numpy as np

from llmc.families import Family, define_family
from llmc.formats import HF_FORMATS, model_format
from llmc.formats.huggingface import read_hf_model
from llmc.formats.llmc import read_checkpoint, write_checkpoint

from llmc.model cimport Model

__all__ = ["GPT2", "GPT2Config", "activation_shapes", "padded_vocab_size", "param_shapes", "read_model"]

# -e's default: GPT-2 124M's weights (python dev/download_gpt2.py), else a random d12
PRETRAINED = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                          "gpt2_124M.bin"))

# ----------------------------------------------------------------------------
# the configuration: llm.c's sizes

# channels and heads of llm.c's named depths; any other depth N gets C=64N, NH=N
LLMC_DEPTHS = {6: (384, 6), 12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}
VOCAB_PAD_MULTIPLE = 128


def padded_vocab_size(vocab_size, multiple=VOCAB_PAD_MULTIPLE):
    """The vocab rounded up to a multiple of 128, as llm.c pads wte (50257 -> 50304)."""
    return (vocab_size + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class GPT2Config:
    max_seq_len: int        # maxT, the longest sequence the position embedding covers
    vocab_size: int         # V, the real vocab
    padded_vocab_size: int  # Vp >= V, the rows of wte (padded for efficiency)
    num_layers: int         # L
    num_heads: int          # NH
    channels: int           # C

    def __post_init__(self):
        # plain Python ints: sizes read from a header arrive as int32, whose products overflow
        for field in fields(self):
            object.__setattr__(self, field.name, int(getattr(self, field.name)))
        problem = self.size_problem(*(getattr(self, field.name) for field in fields(self)))
        if problem:
            raise ValueError(f"GPT2Config: {problem}")

    @staticmethod
    def size_problem(max_seq_len, vocab_size, padded_vocab_size, num_layers, num_heads, channels):
        """What is wrong with these sizes, or None when they make a model."""
        sizes = dict(max_seq_len=max_seq_len, vocab_size=vocab_size,
                     padded_vocab_size=padded_vocab_size, num_layers=num_layers,
                     num_heads=num_heads, channels=channels)
        bad = [f"{name}={value}" for name, value in sizes.items() if value <= 0]
        if bad:
            return f"sizes must be positive: {', '.join(bad)}"
        if channels % num_heads != 0:
            return f"channels={channels} is not divisible by num_heads={num_heads}"
        if padded_vocab_size < vocab_size:
            return f"padded_vocab_size={padded_vocab_size} is smaller than vocab_size={vocab_size}"
        return None

    @staticmethod
    def padded_vocab_size_of(vocab_size):
        """The rows of wte for a vocabulary of vocab_size (padded_vocab_size)."""
        return padded_vocab_size(vocab_size)

    @classmethod
    def from_depth(cls, depth, max_seq_len=1024, vocab_size=50257):
        """llm.c's dN model: d6, d12 (GPT-2 124M), d24, d36, d48 sizes; else C=64N, NH=N."""
        if depth <= 0:
            raise ValueError(f"GPT2Config.from_depth: depth must be positive, got {depth}")
        channels, num_heads = LLMC_DEPTHS.get(depth, (64 * depth, depth))
        return cls(max_seq_len=max_seq_len, vocab_size=vocab_size,
                   padded_vocab_size=padded_vocab_size(vocab_size), num_layers=depth,
                   num_heads=num_heads, channels=channels)

    @classmethod
    def from_name(cls, name, **sizes):
        """dN: llm.c's model of depth N (from_depth, which takes the sizes)."""
        if name[:1] == "d" and name[1:].isdigit() and int(name[1:]) > 0:
            return cls.from_depth(int(name[1:]), **sizes)
        raise ValueError(f"GPT2Config.from_name: {name!r} is not dN (N >= 1)")

    def param_shapes(self):
        """The 16 parameter tensors as (name, shape), in llm.c's order (param_shapes)."""
        return param_shapes(self)

    def num_parameters(self):
        return sum(int(np.prod(shape)) for _, shape in self.param_shapes())

    def describe(self):
        return (f"maxT={self.max_seq_len} V={self.vocab_size} Vp={self.padded_vocab_size} "
                f"L={self.num_layers} NH={self.num_heads} C={self.channels}")

    def table_rows(self):
        """(label, value) of each size, for train.py's console table."""
        return [("max_sequence_length T", self.max_seq_len), ("vocab_size V", self.vocab_size),
                ("padded_vocab_size Vp", self.padded_vocab_size),
                ("num_layers L", self.num_layers), ("num_heads NH", self.num_heads),
                ("channels C", self.channels)]


# ----------------------------------------------------------------------------
# the parameters: 16 tensors in llm.c's order, the order of this struct's fields (Layout.point
# fills it from param_shapes, whose shapes are keyed by these fields)

ctypedef struct ParameterTensors:
    float* wte        # (Vp, C)   token embedding, tied to the output head
    float* wpe        # (maxT, C) position embedding
    float* ln1w       # (L, C)
    float* ln1b       # (L, C)
    float* qkvw       # (L, 3C, C)
    float* qkvb       # (L, 3C)
    float* attprojw   # (L, C, C)
    float* attprojb   # (L, C)
    float* ln2w       # (L, C)
    float* ln2b       # (L, C)
    float* fcw        # (L, 4C, C)
    float* fcb        # (L, 4C)
    float* fcprojw    # (L, C, 4C)
    float* fcprojb    # (L, C)
    float* lnfw       # (C,)
    float* lnfb       # (C,)


def param_shapes(config):
    """The 16 parameter tensors as (name, shape), in llm.c's order and layout: each shape is
    keyed by the address of its ParameterTensors field, so the list comes out in the struct's
    order, and a field without a shape fails the size check."""
    cdef ParameterTensors field
    Vp, maxT = config.padded_vocab_size, config.max_seq_len
    L, C = config.num_layers, config.channels
    by_field = {
        <size_t>&field.wte: ("wte", (Vp, C)),
        <size_t>&field.wpe: ("wpe", (maxT, C)),
        <size_t>&field.ln1w: ("ln1w", (L, C)),
        <size_t>&field.ln1b: ("ln1b", (L, C)),
        <size_t>&field.qkvw: ("qkvw", (L, 3 * C, C)),
        <size_t>&field.qkvb: ("qkvb", (L, 3 * C)),
        <size_t>&field.attprojw: ("attprojw", (L, C, C)),
        <size_t>&field.attprojb: ("attprojb", (L, C)),
        <size_t>&field.ln2w: ("ln2w", (L, C)),
        <size_t>&field.ln2b: ("ln2b", (L, C)),
        <size_t>&field.fcw: ("fcw", (L, 4 * C, C)),
        <size_t>&field.fcb: ("fcb", (L, 4 * C)),
        <size_t>&field.fcprojw: ("fcprojw", (L, C, 4 * C)),
        <size_t>&field.fcprojb: ("fcprojb", (L, C)),
        <size_t>&field.lnfw: ("lnfw", (C,)),
        <size_t>&field.lnfb: ("lnfb", (C,)),
    }
    assert len(by_field) * sizeof(float*) == sizeof(ParameterTensors), "a field has no shape"
    return [by_field[address] for address in sorted(by_field)]


# ----------------------------------------------------------------------------
# the activations: llm.c's 23 tensors and att_lse, as the checkpoint core (llmc/model.pyx) takes
# them: the embedding's output, one layer's 17 (stacked over the layers the policy keeps) and
# the head's 6

ctypedef struct LayerActivations:
    float* ln1        # (B, T, C)
    float* ln1_mean   # (B, T)
    float* ln1_rstd   # (B, T)
    float* qkv        # (B, T, 3C)
    float* atty       # (B, T, C)
    float* preatt     # (B, NH, T, T)  llm.c's attention; empty with flash attention
    float* att        # (B, NH, T, T)  llm.c's attention; empty with flash attention
    float* att_lse    # (B, NH, T)     flash attention: each row's log-sum-exp; else empty
    float* attproj    # (B, T, C)
    float* residual2  # (B, T, C)
    float* ln2        # (B, T, C)
    float* ln2_mean   # (B, T)
    float* ln2_rstd   # (B, T)
    float* fch        # (B, T, 4C)
    float* fch_gelu   # (B, T, 4C)
    float* fcproj     # (B, T, C)
    float* residual3  # (B, T, C)   the layer's output, the residual stream into the next

ctypedef struct HeadActivations:
    float* lnf        # (B, T, C)
    float* lnf_mean   # (B, T)
    float* lnf_rstd   # (B, T)
    float* logits     # (B, T, Vp)
    float* probs      # (B, T, Vp)  llm.c's softmax; empty with the classifier
    float* logsum     # (B, T)      the classifier: each row's log-sum-exp; else empty
    float* losses     # (B, T)


def activation_shapes(config, int B, int T, bint flash=True, bint classifier=True):
    """The activations of a batch of B sequences of T tokens, with flash attention or llm.c's,
    the classifier or llm.c's softmax, as (name, shape): (the embedding's output "encoded", one
    layer's 17 tensors, the head's 7).  The model's 25 tensors (llm.c's 23, att_lse and logsum)
    are these with each layer tensor stacked over the L layers."""
    cdef int C = config.channels, NH = config.num_heads
    Vp = config.padded_vocab_size
    empty = (0,)
    scores = empty if flash else (B, NH, T, T)
    lse = (B, NH, T) if flash else empty
    layer = [
        ("ln1", (B, T, C)), ("ln1_mean", (B, T)), ("ln1_rstd", (B, T)), ("qkv", (B, T, 3 * C)),
        ("atty", (B, T, C)), ("preatt", scores), ("att", scores), ("att_lse", lse),
        ("attproj", (B, T, C)), ("residual2", (B, T, C)), ("ln2", (B, T, C)),
        ("ln2_mean", (B, T)), ("ln2_rstd", (B, T)), ("fch", (B, T, 4 * C)),
        ("fch_gelu", (B, T, 4 * C)), ("fcproj", (B, T, C)), ("residual3", (B, T, C)),
    ]
    head = [("lnf", (B, T, C)), ("lnf_mean", (B, T)), ("lnf_rstd", (B, T)),
            ("logits", (B, T, Vp)), ("probs", empty if classifier else (B, T, Vp)),
            ("logsum", (B, T) if classifier else empty), ("losses", (B, T))]
    return ("encoded", (B, T, C)), layer, head


# ----------------------------------------------------------------------------
# the model


cdef class GPT2(Model):
    """GPT-2 with llm.c's memory layout.  See the module docstring for the dimension letters."""
    FAMILY = "gpt2"
    ENTRY_GROUPS = ("core", "linear", "gpt2")   # its kernels (accel/spec.py); flash and
    #                                             classifier when the backend has them
    # the matrices: weight decay applies to them alone with decay_2d_only (llm.c's CUDA trainer)
    MATRICES = frozenset(("wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"))
    # the activations whose gradients no backward kernel takes: none are allocated
    NO_GRAD = frozenset(("ln1_mean", "ln1_rstd", "att_lse", "ln2_mean", "ln2_rstd", "lnf_mean",
                         "lnf_rstd", "probs", "logsum"))
    # float32 at every precision: the statistics, the probabilities and the losses
    FP32_ACTIVATIONS = frozenset(("ln1_mean", "ln1_rstd", "att_lse", "ln2_mean", "ln2_rstd",
                                  "lnf_mean", "lnf_rstd", "probs", "logsum", "losses"))
    cdef int NH, C, V, Vp
    cdef readonly bint flash                    # flash attention (the backend has it)
    cdef readonly bint classifier               # the classifier's loss (the backend has it)
    cdef ParameterTensors params_c, grads_c     # pointers into the buffers, llm.c's structs

    def __init__(self, config, backend="cpu", recompute="all", precision=None, trainable=True,
                 **options):
        """A model of this GPT2Config with all parameters zero (see random / from_checkpoint),
        on a backend: "cpu", "check:cpu", ... (accel.backend.backend_names()), keeping its
        activations by a recompute policy: "all", "sqrt", ... (llmc/recompute.py), at a precision:
        "fp32" or "bf16" (llmc/model.pyx; None: the backend's, else fp32); trainable=False: for
        inference or a LoRA base (llmc/model.pyx: no master weights at bf16); options: Model's
        grad_precision and master_weights (llmc/model.pyx)."""
        assert sizeof(LayerActivations) == 17 * sizeof(float*)
        assert sizeof(HeadActivations) == 7 * sizeof(float*)
        self.NH, self.C = config.num_heads, config.channels
        self.V, self.Vp = config.vocab_size, config.padded_vocab_size
        super().__init__(config, backend, recompute, precision, trainable, **options)
        self.flash = self.backend.supports("flash")
        self.classifier = self.backend.supports("classifier")

    cdef void point_parameters(self, float* params, float* grads) noexcept:
        self.param_layout.point(<float**>&self.params_c, params, self.itemsize)
        if grads != NULL:
            self.param_layout.point(<float**>&self.grads_c, grads, self.grad_itemsize)

    @classmethod
    def activation_shapes(cls, config, int B, int T, bint flash=True, bint classifier=True):
        return activation_shapes(config, B, T, flash, classifier)

    @classmethod
    def activation_options(cls, backend):
        return dict(flash=backend.supports("flash"), classifier=backend.supports("classifier"))

    @classmethod
    def kv_shape(cls, config):
        """(C, NH): a position's keys in a layer are C floats, NH heads of C / NH."""
        return config.channels, config.num_heads

    @classmethod
    def flops_per_token(cls, config, int T):
        """Forward FLOPs per token of a sequence of T: {layer_matmul, layer_attention,
        head_matmul}, each layer's and the head's (backward is twice the forward).  A matmul
        is 2*C*OC per token: per layer 2*(3C*C + C*C + 4C*C + C*4C) = 24C^2; causal attention
        averages (T+1)/2 keys per query for q.k and for att.v: 2*C*(T+1) per layer."""
        C = config.channels
        return dict(layer_matmul=24.0 * C * C, layer_attention=2.0 * C * (T + 1),
                    head_matmul=2.0 * C * config.padded_vocab_size)

    @classmethod
    def num_layers_of(cls, config):
        return config.num_layers

    @classmethod
    def from_checkpoint(cls, path, backend="cpu", recompute="all", precision=None,
                        trainable=True, **options):
        """Load an llm.c model file (version 3 fp32 or 5 bf16); trainable, options: see Model."""
        config, params = read_model(path)
        model = cls(config, backend, recompute, precision, trainable, **options)
        model.params = params
        return model

    @classmethod
    def random(cls, config, seed=0, backend="cpu", recompute="all", precision=None, **options):
        """GPT-2's initialisation: N(0, 0.02) weights, residual projections scaled by
        1/sqrt(2L), LayerNorm weights 1, biases 0, padded vocabulary rows 0."""
        model = cls(config, backend, recompute, precision, **options)
        rng = np.random.default_rng(seed)
        params = np.zeros(model.num_parameters, dtype=np.float32)
        tensors = model.param_layout.views(params)
        for name, tensor in tensors.items():
            if name in ("ln1w", "ln2w", "lnfw"):
                tensor[...] = 1.0
            elif name in cls.MATRICES:
                std = 0.02 / np.sqrt(2 * config.num_layers) if name in ("attprojw", "fcprojw") else 0.02
                tensor[...] = rng.standard_normal(tensor.shape, dtype=np.float32) * np.float32(std)
        tensors["wte"][config.vocab_size:] = 0.0
        model.params = params
        return model

    def save(self, path, dtype=None):
        """Write an llm.c model file: "float32" (version 3: params, at bf16 the master weights)
        or "bfloat16" (version 5); None: the model's precision, at bf16 version 5 of the bf16
        parameters the kernels read (params_as_run), as llm.c's bf16 runs write."""
        if dtype is None:
            if self.precision == "bf16":
                write_checkpoint(path, self.config, self.params_as_run(), dtype="bfloat16")
                return
            dtype = "float32"
        write_checkpoint(path, self.config, self.params, dtype=dtype)

    @property
    def logits(self):
        """(B, T, Vp) logits of the last forward; columns V..Vp are padding."""
        return self.activation("logits")

    @property
    def probs(self):
        """(B, T, Vp) softmax of the logits over the first V columns, zeros in the padding
        (computed here from the logits and logsum where the classifier keeps no probabilities:
        sampling is their only use)."""
        if not self.classifier:
            return self.activation("probs")
        logits = self.activation("logits")
        V = self.config.vocab_size
        probs = np.zeros(logits.shape, dtype=np.float32)
        real = logits[..., :V]
        probs[..., :V] = np.exp(real - real.max(axis=-1, keepdims=True)) / \
            np.exp(self.activation("logsum"))[..., None]
        return probs

    # --- forward ---------------------------------------------------------------

    cdef void embedding_forward(self, float* out, const int* inputs, int B, int T) noexcept nogil:
        # positions from the first one's (a KV cache's next ones, llmc/model.pyx)
        cdef const float* wpe = self.at(self.params_c.wpe, <Py_ssize_t>self.first_position() * self.C)
        self.table.encoder_forward(self.table.ctx, out, inputs, self.params_c.wte, wpe, B, T, self.C)

    cdef void layer_forward(self, int layer, float** layer_acts, const float* residual, int B, int T) noexcept nogil:
        cdef Py_ssize_t l = layer   # weight offsets outgrow an int in big models
        cdef void* ctx = self.table.ctx
        cdef ParameterTensors params = self.params_c
        cdef LayerActivations* acts = <LayerActivations*>layer_acts
        cdef int NH = self.NH, C = self.C, s
        cdef Py_ssize_t BTC = <Py_ssize_t>B * T * C, row
        # this layer's weights
        l_ln1w = self.at(params.ln1w, l * C)
        l_ln1b = self.at(params.ln1b, l * C)
        l_qkvw = self.at(params.qkvw, l * 3 * C * C)
        l_qkvb = self.at(params.qkvb, l * 3 * C)
        l_attprojw = self.at(params.attprojw, l * C * C)
        l_attprojb = self.at(params.attprojb, l * C)
        l_ln2w = self.at(params.ln2w, l * C)
        l_ln2b = self.at(params.ln2b, l * C)
        l_fcw = self.at(params.fcw, l * 4 * C * C)
        l_fcb = self.at(params.fcb, l * 4 * C)
        l_fcprojw = self.at(params.fcprojw, l * C * 4 * C)
        l_fcprojb = self.at(params.fcprojb, l * C)

        self.table.layernorm_forward(ctx, acts.ln1, acts.ln1_mean, acts.ln1_rstd, residual, l_ln1w, l_ln1b, B, T, C)
        self.table.matmul_forward(ctx, acts.qkv, acts.ln1, l_qkvw, l_qkvb, B, T, C, 3 * C)
        if self.kv_caching:   # each segment over the cached positions too (B = 1, llmc/model.pxd)
            for s in range(self.num_segments):
                row = self.segment_row(s)
                self.table.attention_cached_forward(ctx, self.at(acts.atty, row * C), self.kv_scores,
                                                    self.kv_keys(layer), self.kv_values(layer),
                                                    self.at(acts.qkv, row * 3 * C), self.segment_length(s),
                                                    self.segment_position(s), C, NH)
        elif self.flash:
            self.table.flash_attention_forward(ctx, acts.atty, acts.att_lse, acts.qkv, B, T, C, NH)
        else:
            self.table.attention_forward(ctx, acts.atty, acts.preatt, acts.att, acts.qkv, B, T, C, NH)
        self.table.matmul_forward(ctx, acts.attproj, acts.atty, l_attprojw, l_attprojb, B, T, C, C)
        self.table.residual_forward(ctx, acts.residual2, residual, acts.attproj, BTC)
        self.table.layernorm_forward(ctx, acts.ln2, acts.ln2_mean, acts.ln2_rstd, acts.residual2, l_ln2w, l_ln2b, B, T, C)
        self.table.matmul_forward(ctx, acts.fch, acts.ln2, l_fcw, l_fcb, B, T, C, 4 * C)
        self.table.gelu_forward(ctx, acts.fch_gelu, acts.fch, BTC * 4)
        self.table.matmul_forward(ctx, acts.fcproj, acts.fch_gelu, l_fcprojw, l_fcprojb, B, T, 4 * C, C)
        self.table.residual_forward(ctx, acts.residual3, acts.residual2, acts.fcproj, BTC)

    cdef void head_forward(self, float** head_acts, const float* residual, const int* targets,
                           int B, int T) noexcept nogil:
        cdef void* ctx = self.table.ctx
        cdef ParameterTensors params = self.params_c
        cdef HeadActivations* acts = <HeadActivations*>head_acts
        cdef int C = self.C, V = self.V, Vp = self.Vp
        self.table.layernorm_forward(ctx, acts.lnf, acts.lnf_mean, acts.lnf_rstd, residual, params.lnfw, params.lnfb, B, T, C)
        self.table.matmul_forward(ctx, acts.logits, acts.lnf, params.wte, NULL, B, T, C, Vp)
        if self.classifier:
            self.table.classifier_forward(ctx, acts.losses if targets != NULL else NULL,
                                          acts.logsum, acts.logits, targets, B, T, V, Vp)
            return
        self.table.softmax_forward(ctx, acts.probs, acts.logits, B, T, V, Vp)
        if targets != NULL:
            self.table.crossentropy_forward(ctx, acts.losses, acts.probs, targets, B, T, Vp)

    # --- backward --------------------------------------------------------------

    cdef void head_backward(self, float* dresidual, float** head_grads, float** head_acts,
                            const float* residual, const int* targets, int B, int T) noexcept nogil:
        cdef void* ctx = self.table.ctx
        cdef ParameterTensors params = self.params_c, grads = self.grads_c
        cdef HeadActivations* acts = <HeadActivations*>head_acts
        cdef HeadActivations* grads_acts = <HeadActivations*>head_grads
        cdef int C = self.C, V = self.V, Vp = self.Vp
        if self.classifier:
            self.table.classifier_backward(ctx, grads_acts.logits, grads_acts.losses, acts.logits,
                                           acts.logsum, targets, B, T, V, Vp)
        else:
            self.table.crossentropy_softmax_backward(ctx, grads_acts.logits, grads_acts.losses,
                                                     acts.probs, targets, B, T, V, Vp)
        self.table.matmul_backward(ctx, grads_acts.lnf, grads.wte, NULL, grads_acts.logits, acts.lnf, params.wte, B, T, C, Vp)
        self.table.layernorm_backward(ctx, dresidual, grads.lnfw, grads.lnfb, grads_acts.lnf, residual, params.lnfw,
                                  acts.lnf_mean, acts.lnf_rstd, B, T, C)

    cdef void layer_backward(self, int layer, float* dresidual, float** layer_grads, float** layer_acts,
                             const float* residual, int B, int T) noexcept nogil:
        cdef Py_ssize_t l = layer   # weight offsets outgrow an int in big models
        cdef void* ctx = self.table.ctx
        cdef ParameterTensors params = self.params_c, grads = self.grads_c
        cdef LayerActivations* acts = <LayerActivations*>layer_acts
        cdef LayerActivations* grads_acts = <LayerActivations*>layer_grads
        cdef int NH = self.NH, C = self.C, s
        cdef Py_ssize_t BTC = <Py_ssize_t>B * T * C, row
        # this layer's weights
        l_ln1w = self.at(params.ln1w, l * C)
        l_qkvw = self.at(params.qkvw, l * 3 * C * C)
        l_attprojw = self.at(params.attprojw, l * C * C)
        l_ln2w = self.at(params.ln2w, l * C)
        l_fcw = self.at(params.fcw, l * 4 * C * C)
        l_fcprojw = self.at(params.fcprojw, l * C * 4 * C)
        # this layer's weight gradients
        dl_ln1w = self.grad_at(grads.ln1w, l * C)
        dl_ln1b = self.grad_at(grads.ln1b, l * C)
        dl_qkvw = self.grad_at(grads.qkvw, l * 3 * C * C)
        dl_qkvb = self.grad_at(grads.qkvb, l * 3 * C)
        dl_attprojw = self.grad_at(grads.attprojw, l * C * C)
        dl_attprojb = self.grad_at(grads.attprojb, l * C)
        dl_ln2w = self.grad_at(grads.ln2w, l * C)
        dl_ln2b = self.grad_at(grads.ln2b, l * C)
        dl_fcw = self.grad_at(grads.fcw, l * 4 * C * C)
        dl_fcb = self.grad_at(grads.fcb, l * 4 * C)
        dl_fcprojw = self.grad_at(grads.fcprojw, l * C * 4 * C)
        dl_fcprojb = self.grad_at(grads.fcprojb, l * C)

        # the forward's steps, in reverse (grads_acts.residual3 is the gradient of the output)
        self.table.residual_backward(ctx, grads_acts.residual2, grads_acts.fcproj, grads_acts.residual3, BTC)
        self.table.matmul_backward(ctx, grads_acts.fch_gelu, dl_fcprojw, dl_fcprojb, grads_acts.fcproj, acts.fch_gelu, l_fcprojw, B, T, 4 * C, C)
        self.table.gelu_backward(ctx, grads_acts.fch, acts.fch, grads_acts.fch_gelu, BTC * 4)
        self.table.matmul_backward(ctx, grads_acts.ln2, dl_fcw, dl_fcb, grads_acts.fch, acts.ln2, l_fcw, B, T, C, 4 * C)
        self.table.layernorm_backward(ctx, grads_acts.residual2, dl_ln2w, dl_ln2b, grads_acts.ln2, acts.residual2, l_ln2w,
                                  acts.ln2_mean, acts.ln2_rstd, B, T, C)
        self.table.residual_backward(ctx, dresidual, grads_acts.attproj, grads_acts.residual2, BTC)
        self.table.matmul_backward(ctx, grads_acts.atty, dl_attprojw, dl_attprojb, grads_acts.attproj, acts.atty, l_attprojw, B, T, C, C)
        if self.flash:
            self.table.flash_attention_backward(ctx, grads_acts.qkv, grads_acts.atty, acts.qkv, acts.atty, acts.att_lse, B, T, C, NH)
        else:
            self.table.attention_backward(ctx, grads_acts.qkv, grads_acts.preatt, grads_acts.att, grads_acts.atty, acts.qkv, acts.att, B, T, C, NH)
        self.table.matmul_backward(ctx, grads_acts.ln1, dl_qkvw, dl_qkvb, grads_acts.qkv, acts.ln1, l_qkvw, B, T, C, 3 * C)
        self.table.layernorm_backward(ctx, dresidual, dl_ln1w, dl_ln1b, grads_acts.ln1, residual, l_ln1w,
                                  acts.ln1_mean, acts.ln1_rstd, B, T, C)

    cdef void embedding_backward(self, const float* dencoded, const int* inputs, int B, int T) noexcept nogil:
        self.table.encoder_backward(self.table.ctx, self.grads_c.wte, self.grads_c.wpe, dencoded, inputs, B, T, self.C, self.Vp)


# ----------------------------------------------------------------------------
# the family, as train.py, the tests and dev/ find it: llmc.families.get_family("gpt2")

def read_model(path):
    """(GPT2Config, float32 params) of an llm.c model file (version 3 fp32 or 5 bf16), or of a
    Hugging Face GPT2LMHeadModel (its folder, or a safetensors file)."""
    if model_format(path) in HF_FORMATS:
        return read_hf_model(path, {"gpt2": GPT2Config})
    return read_checkpoint(path, GPT2Config)


define_family(Family(
    name="gpt2", title="GPT-2", model_class=GPT2, config_class=GPT2Config, presets={},
    preset_noun=None, random_inits="dN, a random GPT-2 of depth N", default_init=PRETRAINED,
    stand_in="d12", download="python dev/download_gpt2.py, online", read_model=read_model,
    formats=("llmc", "hf", "safetensors"), hf_architectures=("GPT2LMHeadModel",),
    reference="train_gpt2_torch"))
