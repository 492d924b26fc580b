"""
Llama 2 training in Cython: the model of llama2.c and Meta's reference, on any backend.

Llama 2's shapes, its forward and its backward, as train_llama2_torch.py defines them; all else
(buffers, tokens in and loss out, zero_grad, the gradient norm, AdamW) is the model-generic
core, llmc/model.pyx, and every kernel call goes through the backend table (accel/backend.pxd):
Llama2(config, backend="cpu").  Per layer, with no biases anywhere:

    x += wo(attention(rope(wq(rmsnorm(x))), rope(wk(rmsnorm(x))), wv(rmsnorm(x))))
    x += w2(silu(w1(rmsnorm(x))) * w3(rmsnorm(x)))

after the token embedding (positions enter through RoPE), then a final RMSNorm and the output
head (the embedding itself with a shared classifier).  One parameter buffer cut into 11 tensors
(12 with a separate classifier), one activation buffer cut into 24.

Dimension letters:
    B batch size, T sequence length, C channels (dim), L layers, NH query heads,
    NKV key/value heads (dividing NH), hs head size (C / NH), QD = NH*hs, KVD = NKV*hs,
    H the FFN's hidden size, V vocabulary size, maxT the longest sequence (RoPE's tables).
"""
import numpy as np

from kernels import rope
from llmc_io import LlamaConfig, read_llama_model, write_llama_model

from accel.backend cimport Buffer
from llmc.model cimport Model

__all__ = ["Llama2", "LlamaConfig", "activation_shapes"]

# ----------------------------------------------------------------------------
# the parameters: llama2.c's checkpoint order (LlamaConfig.param_shapes has their shapes, in
# the order of these fields: Layout.point fills the struct from it)

ctypedef struct ParameterTensors:
    float* tok_embeddings   # (V, C)
    float* attention_norm   # (L, C)
    float* wq               # (L, QD, C)
    float* wk               # (L, KVD, C)
    float* wv               # (L, KVD, C)
    float* wo               # (L, C, QD)
    float* ffn_norm         # (L, C)
    float* w1               # (L, H, C)
    float* w2               # (L, C, H)
    float* w3               # (L, H, C)
    float* norm             # (C,)
    float* output           # (V, C); tok_embeddings itself with a shared classifier

# ----------------------------------------------------------------------------
# the activations: the embedding, 18 per layer (stacked along L), and the head's 5

ctypedef struct ActivationTensors:
    float* encoded      # (B, T, C)     the token embeddings: layer 0's residual input
    float* ln1          # (L, B, T, C)  attention_norm's output
    float* ln1_rstd     # (L, B, T)
    float* q            # (L, B, T, QD)
    float* k            # (L, B, T, KVD)
    float* v            # (L, B, T, KVD)
    float* qr           # (L, B, T, QD)  q rotated by RoPE
    float* kr           # (L, B, T, KVD) k rotated by RoPE
    float* att          # (L, B, NH, T, T) attention probabilities
    float* atty         # (L, B, T, QD)  the heads' outputs side by side
    float* attproj      # (L, B, T, C)
    float* residual2    # (L, B, T, C)
    float* ln2          # (L, B, T, C)  ffn_norm's output
    float* ln2_rstd     # (L, B, T)
    float* h1           # (L, B, T, H)  w1's output, the gate
    float* h3           # (L, B, T, H)  w3's output
    float* hgated       # (L, B, T, H)  silu(h1) * h3
    float* ffnproj      # (L, B, T, C)
    float* residual3    # (L, B, T, C)  the layer's output
    float* lnf          # (B, T, C)
    float* lnf_rstd     # (B, T)
    float* logits       # (B, T, V)
    float* probs        # (B, T, V)
    float* losses       # (B, T)

# one layer's slice of the 18 per-layer activations (or of their gradients)
ctypedef struct LayerActivations:
    float* ln1          # (B, T, C)
    float* ln1_rstd     # (B, T)
    float* q            # (B, T, QD)
    float* k            # (B, T, KVD)
    float* v            # (B, T, KVD)
    float* qr           # (B, T, QD)
    float* kr           # (B, T, KVD)
    float* att          # (B, NH, T, T)
    float* atty         # (B, T, QD)
    float* attproj      # (B, T, C)
    float* residual2    # (B, T, C)
    float* ln2          # (B, T, C)
    float* ln2_rstd     # (B, T)
    float* h1           # (B, T, H)
    float* h3           # (B, T, H)
    float* hgated       # (B, T, H)
    float* ffnproj      # (B, T, C)
    float* residual3    # (B, T, C)


def activation_shapes(config, int B, int T):
    """The 24 activation tensors' (name, shape) for a batch of B sequences of T tokens."""
    cdef int L = config.n_layers, C = config.dim, NH = config.n_heads, H = config.hidden_dim
    cdef int QD = NH * config.head_size, KVD = config.n_kv_heads * config.head_size
    V = config.vocab_size
    return [
        ("encoded", (B, T, C)), ("ln1", (L, B, T, C)), ("ln1_rstd", (L, B, T)),
        ("q", (L, B, T, QD)), ("k", (L, B, T, KVD)), ("v", (L, B, T, KVD)),
        ("qr", (L, B, T, QD)), ("kr", (L, B, T, KVD)), ("att", (L, B, NH, T, T)),
        ("atty", (L, B, T, QD)), ("attproj", (L, B, T, C)), ("residual2", (L, B, T, C)),
        ("ln2", (L, B, T, C)), ("ln2_rstd", (L, B, T)), ("h1", (L, B, T, H)),
        ("h3", (L, B, T, H)), ("hgated", (L, B, T, H)), ("ffnproj", (L, B, T, C)),
        ("residual3", (L, B, T, C)), ("lnf", (B, T, C)), ("lnf_rstd", (B, T)),
        ("logits", (B, T, V)), ("probs", (B, T, V)), ("losses", (B, T)),
    ]


# ----------------------------------------------------------------------------
# the model


cdef class Llama2(Model):
    """Llama 2 with one buffer per kind, as llm.c.  See the module docstring for the letters."""
    FAMILY = "llama"
    # the matrices: weight decay applies to them alone with decay_2d_only (not the norms)
    MATRICES = frozenset(("tok_embeddings", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "output"))
    cdef int L, NH, NKV, hs, C, H, V
    cdef float eps
    cdef ParameterTensors params_c, grads_c     # pointers into the buffers, llm.c's structs
    cdef ActivationTensors acts_c, grads_acts_c
    cdef Buffer _rope                           # RoPE's cos and sin tables, (maxT, hs/2) each
    cdef const float* freqs_cos
    cdef const float* freqs_sin

    def __init__(self, config, backend="cpu"):
        """A model of this LlamaConfig with all parameters zero (see random / from_checkpoint),
        on a backend: "cpu", "check:cpu", ... (accel.backend.backend_names())."""
        assert sizeof(ParameterTensors) == 12 * sizeof(float*)
        assert sizeof(ActivationTensors) == 24 * sizeof(float*)
        assert sizeof(LayerActivations) == 18 * sizeof(float*)
        self.L, self.NH, self.NKV = config.n_layers, config.n_heads, config.n_kv_heads
        self.hs, self.C, self.H = config.head_size, config.dim, config.hidden_dim
        self.V, self.eps = config.vocab_size, config.norm_eps
        super().__init__(config, backend)
        # the rotation tables, computed once on the host and uploaded (read-only from here on)
        freqs_cos, freqs_sin = rope.freqs(config.max_seq_len, self.hs, config.rope_theta)
        cdef Py_ssize_t table_size = freqs_cos.size
        self._rope = self.backend.alloc(2 * table_size * sizeof(float))
        self._rope.load(np.concatenate([freqs_cos.ravel(), freqs_sin.ravel()]))
        self.freqs_cos = <float*>self._rope.ptr
        self.freqs_sin = self.freqs_cos + table_size

    cdef void point_parameters(self, float* params, float* grads) noexcept:
        self.param_layout.point(<float**>&self.params_c, params)
        if self.config.shared_classifier:
            self.params_c.output = self.params_c.tok_embeddings
        if grads != NULL:
            self.param_layout.point(<float**>&self.grads_c, grads)
            if self.config.shared_classifier:   # both uses add into the one gradient
                self.grads_c.output = self.grads_c.tok_embeddings

    cdef void point_activations(self, float* acts, float* grads_acts) noexcept:
        self.act_layout.point(<float**>&self.acts_c, acts)
        if grads_acts != NULL:
            self.act_layout.point(<float**>&self.grads_acts_c, grads_acts)

    def activation_shapes(self, int B, int T):
        return activation_shapes(self.config, B, T)

    @classmethod
    def from_checkpoint(cls, path, backend="cpu"):
        """Load a Llama model file (llmc_io.read_llama_model)."""
        config, params = read_llama_model(path)
        model = cls(config, backend)
        model.params = params
        return model

    @classmethod
    def random(cls, config, seed=0, backend="cpu"):
        """llama2.c's initialisation (as train_llama2_torch.init_params, from NumPy's generator):
        every matrix and the embedding N(0, 0.02), wo and w3 N(0, 0.02/sqrt(2L)), norms 1."""
        model = cls(config, backend)
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
        """Write the model file (llmc_io.write_llama_model)."""
        write_llama_model(path, self.config, self.params)

    @property
    def logits(self):
        """(B, T, V) logits of the last forward."""
        return self.activation("logits")

    @property
    def probs(self):
        """(B, T, V) softmax of the logits."""
        return self.activation("probs")

    cdef LayerActivations layer_slice(self, ActivationTensors* a, Py_ssize_t l, int B, int T) noexcept nogil:
        """Layer l's activations (or gradients) inside the stacked (L, ...) tensors of a."""
        cdef Py_ssize_t BT = <Py_ssize_t>B * T
        cdef Py_ssize_t BTC = BT * self.C, BTH = BT * self.H
        cdef Py_ssize_t BTQ = BT * self.NH * self.hs, BTKV = BT * self.NKV * self.hs
        cdef Py_ssize_t att_size = <Py_ssize_t>B * self.NH * T * T
        cdef LayerActivations la
        la.ln1 = a.ln1 + l * BTC
        la.ln1_rstd = a.ln1_rstd + l * BT
        la.q = a.q + l * BTQ
        la.k = a.k + l * BTKV
        la.v = a.v + l * BTKV
        la.qr = a.qr + l * BTQ
        la.kr = a.kr + l * BTKV
        la.att = a.att + l * att_size
        la.atty = a.atty + l * BTQ
        la.attproj = a.attproj + l * BTC
        la.residual2 = a.residual2 + l * BTC
        la.ln2 = a.ln2 + l * BTC
        la.ln2_rstd = a.ln2_rstd + l * BT
        la.h1 = a.h1 + l * BTH
        la.h3 = a.h3 + l * BTH
        la.hgated = a.hgated + l * BTH
        la.ffnproj = a.ffnproj + l * BTC
        la.residual3 = a.residual3 + l * BTC
        return la

    # --- forward ---------------------------------------------------------------

    cdef void layer_forward(self, Py_ssize_t l, const float* residual, LayerActivations* a,
                            int B, int T) noexcept nogil:
        """Layer l on its input residual (B, T, C), into its activations a."""
        cdef void* ctx = self.b.ctx
        cdef ParameterTensors p = self.params_c
        cdef int C = self.C, H = self.H, NH = self.NH, NKV = self.NKV, hs = self.hs
        cdef int QD = NH * hs, KVD = NKV * hs
        cdef Py_ssize_t BTC = <Py_ssize_t>B * T * C
        # this layer's weights
        cdef const float* l_attention_norm = p.attention_norm + l * C
        cdef const float* l_wq = p.wq + l * QD * C
        cdef const float* l_wk = p.wk + l * KVD * C
        cdef const float* l_wv = p.wv + l * KVD * C
        cdef const float* l_wo = p.wo + l * C * QD
        cdef const float* l_ffn_norm = p.ffn_norm + l * C
        cdef const float* l_w1 = p.w1 + l * H * C
        cdef const float* l_w2 = p.w2 + l * C * H
        cdef const float* l_w3 = p.w3 + l * H * C

        self.b.rmsnorm_forward(ctx, a.ln1, a.ln1_rstd, residual, l_attention_norm, self.eps, B, T, C)
        self.b.matmul_forward(ctx, a.q, a.ln1, l_wq, NULL, B, T, C, QD)
        self.b.matmul_forward(ctx, a.k, a.ln1, l_wk, NULL, B, T, C, KVD)
        self.b.matmul_forward(ctx, a.v, a.ln1, l_wv, NULL, B, T, C, KVD)
        self.b.rope_forward(ctx, a.qr, a.q, self.freqs_cos, self.freqs_sin, B, T, NH, hs)
        self.b.rope_forward(ctx, a.kr, a.k, self.freqs_cos, self.freqs_sin, B, T, NKV, hs)
        self.b.attention_gqa_forward(ctx, a.atty, a.att, a.qr, a.kr, a.v, B, T, NH, NKV, hs)
        self.b.matmul_forward(ctx, a.attproj, a.atty, l_wo, NULL, B, T, QD, C)
        self.b.residual_forward(ctx, a.residual2, residual, a.attproj, BTC)
        self.b.rmsnorm_forward(ctx, a.ln2, a.ln2_rstd, a.residual2, l_ffn_norm, self.eps, B, T, C)
        self.b.matmul_forward(ctx, a.h1, a.ln2, l_w1, NULL, B, T, C, H)
        self.b.matmul_forward(ctx, a.h3, a.ln2, l_w3, NULL, B, T, C, H)
        self.b.swiglu_forward(ctx, a.hgated, a.h1, a.h3, <Py_ssize_t>B * T * H)
        self.b.matmul_forward(ctx, a.ffnproj, a.hgated, l_w2, NULL, B, T, H, C)
        self.b.residual_forward(ctx, a.residual3, a.residual2, a.ffnproj, BTC)

    cdef void forward_pass(self, const int* inputs, const int* targets, int B, int T) noexcept nogil:
        cdef void* ctx = self.b.ctx
        cdef ParameterTensors p = self.params_c
        cdef ActivationTensors acts = self.acts_c
        cdef int C = self.C, V = self.V
        cdef Py_ssize_t l
        cdef const float* residual = acts.encoded
        cdef LayerActivations la

        self.b.embedding_forward(ctx, acts.encoded, inputs, p.tok_embeddings, B, T, C)  # (B,T,C)
        for l in range(self.L):
            self.b.mark(ctx, self.step, l)
            la = self.layer_slice(&acts, l, B, T)
            self.layer_forward(l, residual, &la, B, T)
            residual = la.residual3

        self.b.mark(ctx, self.step, -1)
        self.b.rmsnorm_forward(ctx, acts.lnf, acts.lnf_rstd, residual, p.norm, self.eps, B, T, C)
        self.b.matmul_forward(ctx, acts.logits, acts.lnf, p.output, NULL, B, T, C, V)
        self.b.softmax_forward(ctx, acts.probs, acts.logits, B, T, V, V)
        if targets != NULL:
            self.b.crossentropy_forward(ctx, acts.losses, acts.probs, targets, B, T, V)

    # --- backward --------------------------------------------------------------

    cdef void layer_backward(self, Py_ssize_t l, const float* residual, float* dresidual,
                             LayerActivations* a, LayerActivations* da, int B, int T) noexcept nogil:
        """Layer l's gradients: from da.residual3 into its weights' gradients, its activation
        gradients da, and dresidual (B, T, C), the gradient of its input residual (all +=)."""
        cdef void* ctx = self.b.ctx
        cdef ParameterTensors p = self.params_c, g = self.grads_c
        cdef int C = self.C, H = self.H, NH = self.NH, NKV = self.NKV, hs = self.hs
        cdef int QD = NH * hs, KVD = NKV * hs
        cdef Py_ssize_t BTC = <Py_ssize_t>B * T * C
        # this layer's weights
        cdef const float* l_attention_norm = p.attention_norm + l * C
        cdef const float* l_wq = p.wq + l * QD * C
        cdef const float* l_wk = p.wk + l * KVD * C
        cdef const float* l_wv = p.wv + l * KVD * C
        cdef const float* l_wo = p.wo + l * C * QD
        cdef const float* l_ffn_norm = p.ffn_norm + l * C
        cdef const float* l_w1 = p.w1 + l * H * C
        cdef const float* l_w2 = p.w2 + l * C * H
        cdef const float* l_w3 = p.w3 + l * H * C
        # this layer's weight gradients
        cdef float* dl_attention_norm = g.attention_norm + l * C
        cdef float* dl_wq = g.wq + l * QD * C
        cdef float* dl_wk = g.wk + l * KVD * C
        cdef float* dl_wv = g.wv + l * KVD * C
        cdef float* dl_wo = g.wo + l * C * QD
        cdef float* dl_ffn_norm = g.ffn_norm + l * C
        cdef float* dl_w1 = g.w1 + l * H * C
        cdef float* dl_w2 = g.w2 + l * C * H
        cdef float* dl_w3 = g.w3 + l * H * C

        # the forward's steps, in reverse
        self.b.residual_backward(ctx, da.residual2, da.ffnproj, da.residual3, BTC)
        self.b.matmul_backward(ctx, da.hgated, dl_w2, NULL, da.ffnproj, a.hgated, l_w2, B, T, H, C)
        self.b.swiglu_backward(ctx, da.h1, da.h3, da.hgated, a.h1, a.h3, <Py_ssize_t>B * T * H)
        self.b.matmul_backward(ctx, da.ln2, dl_w3, NULL, da.h3, a.ln2, l_w3, B, T, C, H)
        self.b.matmul_backward(ctx, da.ln2, dl_w1, NULL, da.h1, a.ln2, l_w1, B, T, C, H)
        self.b.rmsnorm_backward(ctx, da.residual2, dl_ffn_norm, da.ln2, a.residual2, l_ffn_norm,
                                a.ln2_rstd, B, T, C)
        self.b.residual_backward(ctx, dresidual, da.attproj, da.residual2, BTC)
        self.b.matmul_backward(ctx, da.atty, dl_wo, NULL, da.attproj, a.atty, l_wo, B, T, QD, C)
        self.b.attention_gqa_backward(ctx, da.qr, da.kr, da.v, da.atty, a.qr, a.kr, a.v, a.att,
                                      B, T, NH, NKV, hs)
        self.b.rope_backward(ctx, da.q, da.qr, self.freqs_cos, self.freqs_sin, B, T, NH, hs)
        self.b.rope_backward(ctx, da.k, da.kr, self.freqs_cos, self.freqs_sin, B, T, NKV, hs)
        self.b.matmul_backward(ctx, da.ln1, dl_wv, NULL, da.v, a.ln1, l_wv, B, T, C, KVD)
        self.b.matmul_backward(ctx, da.ln1, dl_wk, NULL, da.k, a.ln1, l_wk, B, T, C, KVD)
        self.b.matmul_backward(ctx, da.ln1, dl_wq, NULL, da.q, a.ln1, l_wq, B, T, C, QD)
        self.b.rmsnorm_backward(ctx, dresidual, dl_attention_norm, da.ln1, residual,
                                l_attention_norm, a.ln1_rstd, B, T, C)

    cdef void backward_pass(self, const int* inputs, const int* targets, int B, int T) noexcept nogil:
        cdef void* ctx = self.b.ctx
        cdef ParameterTensors p = self.params_c, g = self.grads_c
        cdef ActivationTensors acts = self.acts_c, grads_acts = self.grads_acts_c
        cdef int C = self.C, V = self.V, L = self.L
        cdef Py_ssize_t l
        cdef LayerActivations la, dla
        cdef const float* residual
        cdef float* dresidual

        # the core has zeroed the activation gradients and set dlosses to 1/(B*T)
        self.b.mark(ctx, self.step, -1)
        self.b.crossentropy_softmax_backward(ctx, grads_acts.logits, grads_acts.losses, acts.probs,
                                             targets, B, T, V, V)
        self.b.matmul_backward(ctx, grads_acts.lnf, g.output, NULL, grads_acts.logits, acts.lnf,
                               p.output, B, T, C, V)
        la = self.layer_slice(&acts, L - 1, B, T)
        dla = self.layer_slice(&grads_acts, L - 1, B, T)
        self.b.rmsnorm_backward(ctx, dla.residual3, g.norm, grads_acts.lnf, la.residual3, p.norm,
                                acts.lnf_rstd, B, T, C)

        for l in range(L - 1, -1, -1):
            self.b.mark(ctx, self.step, l)
            la = self.layer_slice(&acts, l, B, T)
            dla = self.layer_slice(&grads_acts, l, B, T)
            if l == 0:
                residual, dresidual = acts.encoded, grads_acts.encoded
            else:
                residual = self.layer_slice(&acts, l - 1, B, T).residual3
                dresidual = self.layer_slice(&grads_acts, l - 1, B, T).residual3
            self.layer_backward(l, residual, dresidual, &la, &dla, B, T)

        self.b.mark(ctx, self.step, -1)
        self.b.embedding_backward(ctx, g.tok_embeddings, grads_acts.encoded, inputs, B, T, C, V)
