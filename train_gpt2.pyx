"""
GPT-2 training in Cython: the model of llm.c's train_gpt2.c, on any backend.

GPT-2's shapes, its forward and its backward; everything else (buffers, tokens in and loss
out, zero_grad, the gradient norm, AdamW) is the model-generic core, llmc/model.pyx, and every
kernel call goes through the backend table (accel/backend.pxd): GPT2(config, backend="cpu").
One parameter buffer cut into 16 tensors, one activation buffer cut into 24: llm.c's 23 and the
attention's log-sum-exp.  Attention is flash attention (only a (B,NH,T) log-sum-exp per layer
kept) where the backend has the "flash" kernels, else llm.c's with its (B,NH,T,T) pre-softmax
and softmax buffers; the buffers of the one not used are empty.

Dimension letters:
    B batch size, T sequence length, C channels, L layers, NH heads,
    V vocabulary size, Vp padded vocabulary (rows of wte; a multiple of 128),
    maxT the longest sequence the position table holds.
"""
import numpy as np

from llmc_io import GPT2Config, read_checkpoint, write_checkpoint

from llmc.model cimport Model

__all__ = ["GPT2", "GPT2Config", "activation_shapes"]

# ----------------------------------------------------------------------------
# the parameters: 16 tensors in llm.c's order (GPT2Config.param_shapes has their shapes, in
# the order of these fields: Layout.point fills the struct from it)

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

# ----------------------------------------------------------------------------
# the activations: llm.c's 23 tensors and att_lse

ctypedef struct ActivationTensors:
    float* encoded    # (B, T, C)
    float* ln1        # (L, B, T, C)
    float* ln1_mean   # (L, B, T)
    float* ln1_rstd   # (L, B, T)
    float* qkv        # (L, B, T, 3C)
    float* atty       # (L, B, T, C)
    float* preatt     # (L, B, NH, T, T)  llm.c's attention; empty with flash attention
    float* att        # (L, B, NH, T, T)  llm.c's attention; empty with flash attention
    float* att_lse    # (L, B, NH, T)     flash attention: each row's log-sum-exp; else empty
    float* attproj    # (L, B, T, C)
    float* residual2  # (L, B, T, C)
    float* ln2        # (L, B, T, C)
    float* ln2_mean   # (L, B, T)
    float* ln2_rstd   # (L, B, T)
    float* fch        # (L, B, T, 4C)
    float* fch_gelu   # (L, B, T, 4C)
    float* fcproj     # (L, B, T, C)
    float* residual3  # (L, B, T, C)
    float* lnf        # (B, T, C)
    float* lnf_mean   # (B, T)
    float* lnf_rstd   # (B, T)
    float* logits     # (B, T, Vp)
    float* probs      # (B, T, Vp)
    float* losses     # (B, T)


def activation_shapes(config, int B, int T, bint flash=True):
    """The 24 activation tensors' (name, shape) for a batch of B sequences of T tokens, with
    flash attention or llm.c's."""
    cdef int L = config.num_layers, C = config.channels, NH = config.num_heads
    Vp = config.padded_vocab_size
    empty = (0,)
    scores = empty if flash else (L, B, NH, T, T)
    lse = (L, B, NH, T) if flash else empty
    return [
        ("encoded", (B, T, C)), ("ln1", (L, B, T, C)), ("ln1_mean", (L, B, T)),
        ("ln1_rstd", (L, B, T)), ("qkv", (L, B, T, 3 * C)), ("atty", (L, B, T, C)),
        ("preatt", scores), ("att", scores), ("att_lse", lse),
        ("attproj", (L, B, T, C)),
        ("residual2", (L, B, T, C)), ("ln2", (L, B, T, C)), ("ln2_mean", (L, B, T)),
        ("ln2_rstd", (L, B, T)), ("fch", (L, B, T, 4 * C)), ("fch_gelu", (L, B, T, 4 * C)),
        ("fcproj", (L, B, T, C)), ("residual3", (L, B, T, C)), ("lnf", (B, T, C)),
        ("lnf_mean", (B, T)), ("lnf_rstd", (B, T)), ("logits", (B, T, Vp)),
        ("probs", (B, T, Vp)), ("losses", (B, T)),
    ]


# ----------------------------------------------------------------------------
# the model


cdef class GPT2(Model):
    """GPT-2 with llm.c's memory layout.  See the module docstring for the dimension letters."""
    FAMILY = "gpt2"
    # the matrices: weight decay applies to them alone with decay_2d_only (llm.c's CUDA trainer)
    MATRICES = frozenset(("wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"))
    cdef int L, NH, C, V, Vp
    cdef readonly bint flash                    # flash attention (the backend has it)
    cdef ParameterTensors params_c, grads_c     # pointers into the buffers, llm.c's structs
    cdef ActivationTensors acts_c, grads_acts_c

    def __init__(self, config, backend="cpu"):
        """A model of this GPT2Config with all parameters zero (see random / from_checkpoint),
        on a backend: "cpu", "check:cpu", ... (accel.backend.backend_names())."""
        assert sizeof(ParameterTensors) == 16 * sizeof(float*)
        assert sizeof(ActivationTensors) == 24 * sizeof(float*)
        self.L, self.NH, self.C = config.num_layers, config.num_heads, config.channels
        self.V, self.Vp = config.vocab_size, config.padded_vocab_size
        super().__init__(config, backend)
        self.flash = self.backend.supports("flash")

    cdef void point_parameters(self, float* params, float* grads) noexcept:
        self.param_layout.point(<float**>&self.params_c, params)
        if grads != NULL:
            self.param_layout.point(<float**>&self.grads_c, grads)

    cdef void point_activations(self, float* acts, float* grads_acts) noexcept:
        self.act_layout.point(<float**>&self.acts_c, acts)
        if grads_acts != NULL:
            self.act_layout.point(<float**>&self.grads_acts_c, grads_acts)

    def activation_shapes(self, int B, int T):
        return activation_shapes(self.config, B, T, self.flash)

    @classmethod
    def from_checkpoint(cls, path, backend="cpu"):
        """Load an llm.c model file (version 3 fp32 or 5 bf16)."""
        config, params = read_checkpoint(path)
        model = cls(config, backend)
        model.params = params
        return model

    @classmethod
    def random(cls, config, seed=0, backend="cpu"):
        """GPT-2's initialisation: N(0, 0.02) weights, residual projections scaled by
        1/sqrt(2L), LayerNorm weights 1, biases 0, padded vocabulary rows 0."""
        model = cls(config, backend)
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

    def save(self, path, dtype="float32"):
        """Write an llm.c model file: "float32" (version 3) or "bfloat16" (version 5)."""
        write_checkpoint(path, self.config, self.params, dtype=dtype)

    @property
    def logits(self):
        """(B, T, Vp) logits of the last forward; columns V..Vp are padding."""
        return self.activation("logits")

    @property
    def probs(self):
        """(B, T, Vp) softmax of the logits over the first V columns."""
        return self.activation("probs")

    # --- forward ---------------------------------------------------------------

    cdef void forward_pass(self, const int* inputs, const int* targets, int B, int T) noexcept nogil:
        cdef void* ctx = self.b.ctx
        cdef ParameterTensors params = self.params_c
        cdef ActivationTensors acts = self.acts_c
        cdef int L = self.L, NH = self.NH, C = self.C, V = self.V, Vp = self.Vp
        cdef Py_ssize_t BT = <Py_ssize_t>B * T, BTC = BT * C, l
        cdef Py_ssize_t att_size = 0 if self.flash else <Py_ssize_t>B * NH * T * T
        cdef Py_ssize_t lse_size = <Py_ssize_t>B * NH * T if self.flash else 0
        cdef float* residual

        self.b.encoder_forward(ctx, acts.encoded, inputs, params.wte, params.wpe, B, T, C)  # (B,T,C)
        for l in range(L):
            self.b.mark(ctx, self.step, l)
            residual = acts.encoded if l == 0 else acts.residual3 + (l - 1) * BTC
            # this layer's weights
            l_ln1w = params.ln1w + l * C
            l_ln1b = params.ln1b + l * C
            l_qkvw = params.qkvw + l * 3 * C * C
            l_qkvb = params.qkvb + l * 3 * C
            l_attprojw = params.attprojw + l * C * C
            l_attprojb = params.attprojb + l * C
            l_ln2w = params.ln2w + l * C
            l_ln2b = params.ln2b + l * C
            l_fcw = params.fcw + l * 4 * C * C
            l_fcb = params.fcb + l * 4 * C
            l_fcprojw = params.fcprojw + l * C * 4 * C
            l_fcprojb = params.fcprojb + l * C
            # this layer's activations
            l_ln1 = acts.ln1 + l * BTC
            l_ln1_mean = acts.ln1_mean + l * BT
            l_ln1_rstd = acts.ln1_rstd + l * BT
            l_qkv = acts.qkv + l * BTC * 3
            l_atty = acts.atty + l * BTC
            l_preatt = acts.preatt + l * att_size
            l_att = acts.att + l * att_size
            l_att_lse = acts.att_lse + l * lse_size
            l_attproj = acts.attproj + l * BTC
            l_residual2 = acts.residual2 + l * BTC
            l_ln2 = acts.ln2 + l * BTC
            l_ln2_mean = acts.ln2_mean + l * BT
            l_ln2_rstd = acts.ln2_rstd + l * BT
            l_fch = acts.fch + l * BTC * 4
            l_fch_gelu = acts.fch_gelu + l * BTC * 4
            l_fcproj = acts.fcproj + l * BTC
            l_residual3 = acts.residual3 + l * BTC

            self.b.layernorm_forward(ctx, l_ln1, l_ln1_mean, l_ln1_rstd, residual, l_ln1w, l_ln1b, B, T, C)
            self.b.matmul_forward(ctx, l_qkv, l_ln1, l_qkvw, l_qkvb, B, T, C, 3 * C)
            if self.flash:
                self.b.flash_attention_forward(ctx, l_atty, l_att_lse, l_qkv, B, T, C, NH)
            else:
                self.b.attention_forward(ctx, l_atty, l_preatt, l_att, l_qkv, B, T, C, NH)
            self.b.matmul_forward(ctx, l_attproj, l_atty, l_attprojw, l_attprojb, B, T, C, C)
            self.b.residual_forward(ctx, l_residual2, residual, l_attproj, BTC)
            self.b.layernorm_forward(ctx, l_ln2, l_ln2_mean, l_ln2_rstd, l_residual2, l_ln2w, l_ln2b, B, T, C)
            self.b.matmul_forward(ctx, l_fch, l_ln2, l_fcw, l_fcb, B, T, C, 4 * C)
            self.b.gelu_forward(ctx, l_fch_gelu, l_fch, BTC * 4)
            self.b.matmul_forward(ctx, l_fcproj, l_fch_gelu, l_fcprojw, l_fcprojb, B, T, 4 * C, C)
            self.b.residual_forward(ctx, l_residual3, l_residual2, l_fcproj, BTC)

        self.b.mark(ctx, self.step, -1)
        residual = acts.residual3 + (L - 1) * BTC  # the last layer's output
        self.b.layernorm_forward(ctx, acts.lnf, acts.lnf_mean, acts.lnf_rstd, residual, params.lnfw, params.lnfb, B, T, C)
        self.b.matmul_forward(ctx, acts.logits, acts.lnf, params.wte, NULL, B, T, C, Vp)
        self.b.softmax_forward(ctx, acts.probs, acts.logits, B, T, V, Vp)

        if targets != NULL:
            self.b.crossentropy_forward(ctx, acts.losses, acts.probs, targets, B, T, Vp)

    # --- backward --------------------------------------------------------------

    cdef void backward_pass(self, const int* inputs, const int* targets, int B, int T) noexcept nogil:
        cdef void* ctx = self.b.ctx
        cdef ParameterTensors params = self.params_c, grads = self.grads_c
        cdef ActivationTensors acts = self.acts_c, grads_acts = self.grads_acts_c
        cdef int L = self.L, NH = self.NH, C = self.C, V = self.V, Vp = self.Vp
        cdef Py_ssize_t BT = <Py_ssize_t>B * T, BTC = BT * C, l
        cdef Py_ssize_t att_size = 0 if self.flash else <Py_ssize_t>B * NH * T * T
        cdef Py_ssize_t lse_size = <Py_ssize_t>B * NH * T if self.flash else 0
        cdef float* residual
        cdef float* dresidual

        # the core has zeroed the activation gradients and set dlosses to 1/(B*T)
        self.b.mark(ctx, self.step, -1)

        self.b.crossentropy_softmax_backward(ctx, grads_acts.logits, grads_acts.losses, acts.probs, targets, B, T, V, Vp)
        self.b.matmul_backward(ctx, grads_acts.lnf, grads.wte, NULL, grads_acts.logits, acts.lnf, params.wte, B, T, C, Vp)
        residual = acts.residual3 + (L - 1) * BTC
        dresidual = grads_acts.residual3 + (L - 1) * BTC
        self.b.layernorm_backward(ctx, dresidual, grads.lnfw, grads.lnfb, grads_acts.lnf, residual, params.lnfw,
                             acts.lnf_mean, acts.lnf_rstd, B, T, C)

        for l in range(L - 1, -1, -1):
            self.b.mark(ctx, self.step, l)
            residual = acts.encoded if l == 0 else acts.residual3 + (l - 1) * BTC
            dresidual = grads_acts.encoded if l == 0 else grads_acts.residual3 + (l - 1) * BTC
            # this layer's weights
            l_ln1w = params.ln1w + l * C
            l_qkvw = params.qkvw + l * 3 * C * C
            l_attprojw = params.attprojw + l * C * C
            l_ln2w = params.ln2w + l * C
            l_fcw = params.fcw + l * 4 * C * C
            l_fcprojw = params.fcprojw + l * C * 4 * C
            # this layer's weight gradients
            dl_ln1w = grads.ln1w + l * C
            dl_ln1b = grads.ln1b + l * C
            dl_qkvw = grads.qkvw + l * 3 * C * C
            dl_qkvb = grads.qkvb + l * 3 * C
            dl_attprojw = grads.attprojw + l * C * C
            dl_attprojb = grads.attprojb + l * C
            dl_ln2w = grads.ln2w + l * C
            dl_ln2b = grads.ln2b + l * C
            dl_fcw = grads.fcw + l * 4 * C * C
            dl_fcb = grads.fcb + l * 4 * C
            dl_fcprojw = grads.fcprojw + l * C * 4 * C
            dl_fcprojb = grads.fcprojb + l * C
            # this layer's activations
            l_ln1 = acts.ln1 + l * BTC
            l_ln1_mean = acts.ln1_mean + l * BT
            l_ln1_rstd = acts.ln1_rstd + l * BT
            l_qkv = acts.qkv + l * BTC * 3
            l_atty = acts.atty + l * BTC
            l_att = acts.att + l * att_size
            l_att_lse = acts.att_lse + l * lse_size
            l_residual2 = acts.residual2 + l * BTC
            l_ln2 = acts.ln2 + l * BTC
            l_ln2_mean = acts.ln2_mean + l * BT
            l_ln2_rstd = acts.ln2_rstd + l * BT
            l_fch = acts.fch + l * BTC * 4
            l_fch_gelu = acts.fch_gelu + l * BTC * 4
            # this layer's activation gradients
            dl_ln1 = grads_acts.ln1 + l * BTC
            dl_qkv = grads_acts.qkv + l * BTC * 3
            dl_atty = grads_acts.atty + l * BTC
            dl_preatt = grads_acts.preatt + l * att_size
            dl_att = grads_acts.att + l * att_size
            dl_attproj = grads_acts.attproj + l * BTC
            dl_residual2 = grads_acts.residual2 + l * BTC
            dl_ln2 = grads_acts.ln2 + l * BTC
            dl_fch = grads_acts.fch + l * BTC * 4
            dl_fch_gelu = grads_acts.fch_gelu + l * BTC * 4
            dl_fcproj = grads_acts.fcproj + l * BTC
            dl_residual3 = grads_acts.residual3 + l * BTC

            # the forward's steps, in reverse
            self.b.residual_backward(ctx, dl_residual2, dl_fcproj, dl_residual3, BTC)
            self.b.matmul_backward(ctx, dl_fch_gelu, dl_fcprojw, dl_fcprojb, dl_fcproj, l_fch_gelu, l_fcprojw, B, T, 4 * C, C)
            self.b.gelu_backward(ctx, dl_fch, l_fch, dl_fch_gelu, BTC * 4)
            self.b.matmul_backward(ctx, dl_ln2, dl_fcw, dl_fcb, dl_fch, l_ln2, l_fcw, B, T, C, 4 * C)
            self.b.layernorm_backward(ctx, dl_residual2, dl_ln2w, dl_ln2b, dl_ln2, l_residual2, l_ln2w,
                                 l_ln2_mean, l_ln2_rstd, B, T, C)
            self.b.residual_backward(ctx, dresidual, dl_attproj, dl_residual2, BTC)
            self.b.matmul_backward(ctx, dl_atty, dl_attprojw, dl_attprojb, dl_attproj, l_atty, l_attprojw, B, T, C, C)
            if self.flash:
                self.b.flash_attention_backward(ctx, dl_qkv, dl_atty, l_qkv, l_atty, l_att_lse, B, T, C, NH)
            else:
                self.b.attention_backward(ctx, dl_qkv, dl_preatt, dl_att, dl_atty, l_qkv, l_att, B, T, C, NH)
            self.b.matmul_backward(ctx, dl_ln1, dl_qkvw, dl_qkvb, dl_qkv, l_ln1, l_qkvw, B, T, C, 3 * C)
            self.b.layernorm_backward(ctx, dresidual, dl_ln1w, dl_ln1b, dl_ln1, residual, l_ln1w,
                                 l_ln1_mean, l_ln1_rstd, B, T, C)

        self.b.mark(ctx, self.step, -1)
        self.b.encoder_backward(ctx, grads.wte, grads.wpe, grads_acts.encoded, inputs, B, T, C, Vp)
