"""
GPT-2 training on the CPU, in Cython: the model of llm.c's train_gpt2.c.

One parameter buffer cut into 16 tensors, one activation buffer cut into 23, a forward pass,
zero_grad, a backward pass and an AdamW update, each a sequence of layer kernels from kernels/,
called through the Kernels table (kernels/backend.pxd).  All buffers are NumPy arrays, so
parameters, gradients and activations can be read from Python without a copy.

Dimension letters:
    B batch size, T sequence length, C channels, L layers, NH heads,
    V vocabulary size, Vp padded vocabulary (rows of wte; a multiple of 128),
    maxT the longest sequence the position table holds.
"""
import numpy as np

from llmc_io import GPT2Config, param_views, read_checkpoint, write_checkpoint

from kernels.backend cimport Kernels
from kernels.cpu cimport cpu_kernels
from libc.math cimport sqrt
from libc.string cimport memset

__all__ = ["GPT2", "GPT2Config"]

# ----------------------------------------------------------------------------
# the parameters: 16 tensors in llm.c's order (GPT2Config.param_shapes has their shapes)

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

# the matrices get weight decay when decay_2d_only is asked for (llm.c's CUDA trainer)
MATRIX_TENSORS = frozenset(("wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"))


cdef ParameterTensors point_parameters(float* base, list offsets) noexcept:
    cdef ParameterTensors p
    p.wte = base + <Py_ssize_t>offsets[0]
    p.wpe = base + <Py_ssize_t>offsets[1]
    p.ln1w = base + <Py_ssize_t>offsets[2]
    p.ln1b = base + <Py_ssize_t>offsets[3]
    p.qkvw = base + <Py_ssize_t>offsets[4]
    p.qkvb = base + <Py_ssize_t>offsets[5]
    p.attprojw = base + <Py_ssize_t>offsets[6]
    p.attprojb = base + <Py_ssize_t>offsets[7]
    p.ln2w = base + <Py_ssize_t>offsets[8]
    p.ln2b = base + <Py_ssize_t>offsets[9]
    p.fcw = base + <Py_ssize_t>offsets[10]
    p.fcb = base + <Py_ssize_t>offsets[11]
    p.fcprojw = base + <Py_ssize_t>offsets[12]
    p.fcprojb = base + <Py_ssize_t>offsets[13]
    p.lnfw = base + <Py_ssize_t>offsets[14]
    p.lnfb = base + <Py_ssize_t>offsets[15]
    return p

# ----------------------------------------------------------------------------
# the activations: 23 tensors, as llm.c

ctypedef struct ActivationTensors:
    float* encoded    # (B, T, C)
    float* ln1        # (L, B, T, C)
    float* ln1_mean   # (L, B, T)
    float* ln1_rstd   # (L, B, T)
    float* qkv        # (L, B, T, 3C)
    float* atty       # (L, B, T, C)
    float* preatt     # (L, B, NH, T, T)
    float* att        # (L, B, NH, T, T)
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


def activation_shapes(config, int B, int T):
    """The 23 activation tensors' (name, shape) for a batch of B sequences of T tokens."""
    cdef int L = config.num_layers, C = config.channels, NH = config.num_heads
    Vp = config.padded_vocab_size
    return [
        ("encoded", (B, T, C)), ("ln1", (L, B, T, C)), ("ln1_mean", (L, B, T)),
        ("ln1_rstd", (L, B, T)), ("qkv", (L, B, T, 3 * C)), ("atty", (L, B, T, C)),
        ("preatt", (L, B, NH, T, T)), ("att", (L, B, NH, T, T)), ("attproj", (L, B, T, C)),
        ("residual2", (L, B, T, C)), ("ln2", (L, B, T, C)), ("ln2_mean", (L, B, T)),
        ("ln2_rstd", (L, B, T)), ("fch", (L, B, T, 4 * C)), ("fch_gelu", (L, B, T, 4 * C)),
        ("fcproj", (L, B, T, C)), ("residual3", (L, B, T, C)), ("lnf", (B, T, C)),
        ("lnf_mean", (B, T)), ("lnf_rstd", (B, T)), ("logits", (B, T, Vp)),
        ("probs", (B, T, Vp)), ("losses", (B, T)),
    ]


cdef ActivationTensors point_activations(float* base, list offsets) noexcept:
    cdef ActivationTensors a
    a.encoded = base + <Py_ssize_t>offsets[0]
    a.ln1 = base + <Py_ssize_t>offsets[1]
    a.ln1_mean = base + <Py_ssize_t>offsets[2]
    a.ln1_rstd = base + <Py_ssize_t>offsets[3]
    a.qkv = base + <Py_ssize_t>offsets[4]
    a.atty = base + <Py_ssize_t>offsets[5]
    a.preatt = base + <Py_ssize_t>offsets[6]
    a.att = base + <Py_ssize_t>offsets[7]
    a.attproj = base + <Py_ssize_t>offsets[8]
    a.residual2 = base + <Py_ssize_t>offsets[9]
    a.ln2 = base + <Py_ssize_t>offsets[10]
    a.ln2_mean = base + <Py_ssize_t>offsets[11]
    a.ln2_rstd = base + <Py_ssize_t>offsets[12]
    a.fch = base + <Py_ssize_t>offsets[13]
    a.fch_gelu = base + <Py_ssize_t>offsets[14]
    a.fcproj = base + <Py_ssize_t>offsets[15]
    a.residual3 = base + <Py_ssize_t>offsets[16]
    a.lnf = base + <Py_ssize_t>offsets[17]
    a.lnf_mean = base + <Py_ssize_t>offsets[18]
    a.lnf_rstd = base + <Py_ssize_t>offsets[19]
    a.logits = base + <Py_ssize_t>offsets[20]
    a.probs = base + <Py_ssize_t>offsets[21]
    a.losses = base + <Py_ssize_t>offsets[22]
    return a


def _offsets(shapes):
    """Start of each tensor in a buffer holding them back to back, and the total size."""
    offsets, total = [], 0
    for _, shape in shapes:
        offsets.append(total)
        total += int(np.prod(shape))
    return offsets, total


cdef float* data_pointer(array) except NULL:
    cdef float[::1] view = array
    return &view[0]

# ----------------------------------------------------------------------------
# the model


cdef class GPT2:
    """GPT-2 with llm.c's memory layout.  See the module docstring for the dimension letters."""
    cdef Kernels k
    cdef readonly object config
    cdef int L, NH, C, V, Vp, maxT
    # the buffers, as NumPy arrays (None until first needed, as llm.c allocates lazily)
    cdef object _params, _grads, _m, _v, _acts, _grads_acts
    cdef list param_offsets
    cdef ParameterTensors params_c, grads_c     # pointers into the buffers, llm.c's structs
    cdef ActivationTensors acts_c, grads_acts_c
    cdef list act_offsets
    cdef Py_ssize_t act_size           # floats the activations of the current (B, T) take
    cdef int B, T                       # shape of the last forward
    cdef object inputs, targets         # (B, T) int32 copies of the last forward's batch
    cdef float mean_loss                # -1 when the last forward had no targets

    def __init__(self, config):
        """A model of this GPT2Config with all parameters zero (see random / from_checkpoint)."""
        self.k = cpu_kernels()
        self.config = config
        self.L, self.NH, self.C = config.num_layers, config.num_heads, config.channels
        self.V, self.Vp, self.maxT = config.vocab_size, config.padded_vocab_size, config.max_seq_len
        self.param_offsets, num_parameters = _offsets(config.param_shapes())
        self._params = np.zeros(num_parameters, dtype=np.float32)
        self.params_c = point_parameters(data_pointer(self._params), self.param_offsets)
        self.B = self.T = 0
        self.mean_loss = -1.0

    @classmethod
    def from_checkpoint(cls, path):
        """Load an llm.c model file (version 3 fp32 or 5 bf16)."""
        config, params = read_checkpoint(path)
        model = cls(config)
        model.params[:] = params
        return model

    @classmethod
    def random(cls, config, seed=0):
        """GPT-2's initialisation: N(0, 0.02) weights, residual projections scaled by
        1/sqrt(2L), LayerNorm weights 1, biases 0, padded vocabulary rows 0."""
        model = cls(config)
        rng = np.random.default_rng(seed)
        tensors = model.param_tensors()
        for name, tensor in tensors.items():
            if name in ("ln1w", "ln2w", "lnfw"):
                tensor[...] = 1.0
            elif name in MATRIX_TENSORS:
                std = 0.02 / np.sqrt(2 * config.num_layers) if name in ("attprojw", "fcprojw") else 0.02
                tensor[...] = rng.standard_normal(tensor.shape, dtype=np.float32) * np.float32(std)
        tensors["wte"][config.vocab_size:] = 0.0
        return model

    def save(self, path, dtype="float32"):
        """Write an llm.c model file: "float32" (version 3) or "bfloat16" (version 5)."""
        write_checkpoint(path, self.config, self._params, dtype=dtype)

    # --- views for Python ----------------------------------------------------

    @property
    def params(self):
        """All parameters, one 1-D float32 array (zero-copy)."""
        return self._params

    @property
    def grads(self):
        """All parameter gradients, laid out as params."""
        if self._grads is None:
            self._grads = np.zeros_like(self._params)
            self.grads_c = point_parameters(data_pointer(self._grads), self.param_offsets)
        return self._grads

    @property
    def m(self):
        """AdamW first moments, laid out as params (zeros until the first update)."""
        if self._m is None:
            self._m = np.zeros_like(self._params)
        return self._m

    @property
    def v(self):
        """AdamW second moments, laid out as params (zeros until the first update)."""
        if self._v is None:
            self._v = np.zeros_like(self._params)
        return self._v

    def param_tensors(self):
        """name -> shaped view of the parameter buffer, in llm.c's order."""
        return param_views(self.config, self._params)

    def grad_tensors(self):
        """name -> shaped view of the gradient buffer, in llm.c's order."""
        return param_views(self.config, self.grads)

    def activations(self):
        """name -> shaped view of the last forward's 23 activation tensors."""
        self._require_forward()
        return {name: self._acts[start:start + int(np.prod(shape))].reshape(shape)
                for (name, shape), start in zip(activation_shapes(self.config, self.B, self.T),
                                                self.act_offsets)}

    @property
    def logits(self):
        """(B, T, Vp) logits of the last forward; columns V..Vp are padding."""
        return self.activations()["logits"]

    @property
    def probs(self):
        """(B, T, Vp) softmax of the logits over the first V columns."""
        return self.activations()["probs"]

    def _require_forward(self):
        if self.B == 0:
            raise RuntimeError("no forward pass has been run yet")

    def _batch(self, tokens, what):
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1:
            raise ValueError(f"{what} must have shape (B, T), got {tokens.shape}")
        if tokens.shape[1] > self.maxT:
            raise ValueError(f"{what}: sequence length {tokens.shape[1]} exceeds the model's "
                             f"max_seq_len {self.maxT}")
        if tokens.min() < 0 or tokens.max() >= self.V:
            raise ValueError(f"{what}: token ids must be in [0, {self.V}), "
                             f"got [{tokens.min()}, {tokens.max()}]")
        return tokens.copy()

    # --- forward ---------------------------------------------------------------

    def forward(self, inputs, targets=None):
        """Run the model on inputs (B, T) token ids.  With targets (B, T), also the loss:
        returns the mean cross-entropy, else None.  Logits and probs stay in activations()."""
        inputs = self._batch(inputs, "inputs")
        if targets is not None:
            targets = self._batch(targets, "targets")
            if targets.shape != inputs.shape:
                raise ValueError(f"targets shape {targets.shape} != inputs shape {inputs.shape}")
        cdef int B = inputs.shape[0], T = inputs.shape[1]
        if (B, T) != (self.B, self.T):
            self._allocate_activations(B, T)
        self.inputs, self.targets = inputs, targets

        cdef int[:, ::1] inp = inputs
        cdef int[:, ::1] tgt = targets if targets is not None else inputs
        cdef bint has_targets = targets is not None
        with nogil:
            self._forward(&inp[0, 0], &tgt[0, 0] if has_targets else NULL, B, T)
        return float(self.mean_loss) if has_targets else None

    def _allocate_activations(self, int B, int T):
        self.act_offsets, size = _offsets(activation_shapes(self.config, B, T))
        if self._acts is None or size > self._acts.shape[0]:
            self._acts = np.zeros(size, dtype=np.float32)
            self._grads_acts = None  # reallocated, at this size, by the next backward
        self.act_size = size
        self.acts_c = point_activations(data_pointer(self._acts), self.act_offsets)
        if self._grads_acts is not None:
            self.grads_acts_c = point_activations(data_pointer(self._grads_acts), self.act_offsets)
        self.B, self.T = B, T

    cdef void _forward(self, const int* inputs, const int* targets, int B, int T) noexcept nogil:
        cdef Kernels k = self.k
        cdef ParameterTensors params = self.params_c
        cdef ActivationTensors acts = self.acts_c
        cdef int L = self.L, NH = self.NH, C = self.C, V = self.V, Vp = self.Vp
        cdef Py_ssize_t BT = <Py_ssize_t>B * T, BTC = BT * C, l, i
        cdef Py_ssize_t att_size = <Py_ssize_t>B * NH * T * T
        cdef float* residual
        cdef double loss_sum

        k.encoder_forward(acts.encoded, inputs, params.wte, params.wpe, B, T, C)  # (B,T,C)
        for l in range(L):
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
            l_attproj = acts.attproj + l * BTC
            l_residual2 = acts.residual2 + l * BTC
            l_ln2 = acts.ln2 + l * BTC
            l_ln2_mean = acts.ln2_mean + l * BT
            l_ln2_rstd = acts.ln2_rstd + l * BT
            l_fch = acts.fch + l * BTC * 4
            l_fch_gelu = acts.fch_gelu + l * BTC * 4
            l_fcproj = acts.fcproj + l * BTC
            l_residual3 = acts.residual3 + l * BTC

            k.layernorm_forward(l_ln1, l_ln1_mean, l_ln1_rstd, residual, l_ln1w, l_ln1b, B, T, C)
            k.matmul_forward(l_qkv, l_ln1, l_qkvw, l_qkvb, B, T, C, 3 * C)
            k.attention_forward(l_atty, l_preatt, l_att, l_qkv, B, T, C, NH)
            k.matmul_forward(l_attproj, l_atty, l_attprojw, l_attprojb, B, T, C, C)
            k.residual_forward(l_residual2, residual, l_attproj, BTC)
            k.layernorm_forward(l_ln2, l_ln2_mean, l_ln2_rstd, l_residual2, l_ln2w, l_ln2b, B, T, C)
            k.matmul_forward(l_fch, l_ln2, l_fcw, l_fcb, B, T, C, 4 * C)
            k.gelu_forward(l_fch_gelu, l_fch, BTC * 4)
            k.matmul_forward(l_fcproj, l_fch_gelu, l_fcprojw, l_fcprojb, B, T, 4 * C, C)
            k.residual_forward(l_residual3, l_residual2, l_fcproj, BTC)

        residual = acts.residual3 + (L - 1) * BTC  # the last layer's output
        k.layernorm_forward(acts.lnf, acts.lnf_mean, acts.lnf_rstd, residual, params.lnfw, params.lnfb, B, T, C)
        k.matmul_forward(acts.logits, acts.lnf, params.wte, NULL, B, T, C, Vp)
        k.softmax_forward(acts.probs, acts.logits, B, T, V, Vp)

        if targets == NULL:
            self.mean_loss = -1.0
            return
        k.crossentropy_forward(acts.losses, acts.probs, targets, B, T, Vp)
        loss_sum = 0.0
        for i in range(BT):
            loss_sum += acts.losses[i]
        self.mean_loss = <float>(loss_sum / BT)

    # --- backward --------------------------------------------------------------

    def zero_grad(self):
        """Set the parameter gradients to zero (backward adds to them)."""
        self.grads.fill(0.0)

    def backward(self):
        """Add the gradient of the last forward's mean loss to grads (needs targets)."""
        if self.targets is None:
            raise RuntimeError("backward needs a forward pass with targets")
        self.grads  # allocates the gradient buffer on first use
        if self._grads_acts is None:
            self._grads_acts = np.zeros(self._acts.shape[0], dtype=np.float32)
            self.grads_acts_c = point_activations(data_pointer(self._grads_acts), self.act_offsets)
        cdef int[:, ::1] inp = self.inputs
        cdef int[:, ::1] tgt = self.targets
        with nogil:
            self._backward(&inp[0, 0], &tgt[0, 0], self.B, self.T)

    cdef void _backward(self, const int* inputs, const int* targets, int B, int T) noexcept nogil:
        cdef Kernels k = self.k
        cdef ParameterTensors params = self.params_c, grads = self.grads_c
        cdef ActivationTensors acts = self.acts_c, grads_acts = self.grads_acts_c
        cdef int L = self.L, NH = self.NH, C = self.C, V = self.V, Vp = self.Vp
        cdef Py_ssize_t BT = <Py_ssize_t>B * T, BTC = BT * C, l, i
        cdef Py_ssize_t att_size = <Py_ssize_t>B * NH * T * T
        cdef float* residual
        cdef float* dresidual

        # the activation gradients are accumulated into, so they start at zero
        memset(grads_acts.encoded, 0, self.act_size * sizeof(float))
        # the loss is the mean over B*T positions
        for i in range(BT):
            grads_acts.losses[i] = 1.0 / BT

        k.crossentropy_softmax_backward(grads_acts.logits, grads_acts.losses, acts.probs, targets, B, T, V, Vp)
        k.matmul_backward(grads_acts.lnf, grads.wte, NULL, grads_acts.logits, acts.lnf, params.wte, B, T, C, Vp)
        residual = acts.residual3 + (L - 1) * BTC
        dresidual = grads_acts.residual3 + (L - 1) * BTC
        k.layernorm_backward(dresidual, grads.lnfw, grads.lnfb, grads_acts.lnf, residual, params.lnfw,
                             acts.lnf_mean, acts.lnf_rstd, B, T, C)

        for l in range(L - 1, -1, -1):
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
            k.residual_backward(dl_residual2, dl_fcproj, dl_residual3, BTC)
            k.matmul_backward(dl_fch_gelu, dl_fcprojw, dl_fcprojb, dl_fcproj, l_fch_gelu, l_fcprojw, B, T, 4 * C, C)
            k.gelu_backward(dl_fch, l_fch, dl_fch_gelu, BTC * 4)
            k.matmul_backward(dl_ln2, dl_fcw, dl_fcb, dl_fch, l_ln2, l_fcw, B, T, C, 4 * C)
            k.layernorm_backward(dl_residual2, dl_ln2w, dl_ln2b, dl_ln2, l_residual2, l_ln2w,
                                 l_ln2_mean, l_ln2_rstd, B, T, C)
            k.residual_backward(dresidual, dl_attproj, dl_residual2, BTC)
            k.matmul_backward(dl_atty, dl_attprojw, dl_attprojb, dl_attproj, l_atty, l_attprojw, B, T, C, C)
            k.attention_backward(dl_qkv, dl_preatt, dl_att, dl_atty, l_qkv, l_att, B, T, C, NH)
            k.matmul_backward(dl_ln1, dl_qkvw, dl_qkvb, dl_qkv, l_ln1, l_qkvw, B, T, C, 3 * C)
            k.layernorm_backward(dresidual, dl_ln1w, dl_ln1b, dl_ln1, residual, l_ln1w,
                                 l_ln1_mean, l_ln1_rstd, B, T, C)

        k.encoder_backward(grads.wte, grads.wpe, grads_acts.encoded, inputs, B, T, C)

    # --- optimizer -------------------------------------------------------------

    def grad_norm(self):
        """Global L2 norm of all parameter gradients."""
        cdef float* grads = data_pointer(self.grads)
        cdef Py_ssize_t n = self._params.shape[0]
        cdef double norm_squared
        with nogil:
            norm_squared = self.k.global_norm_squared(grads, n)
        return sqrt(norm_squared)

    def update(self, float lr, float beta1, float beta2, float eps, float weight_decay, int t,
               float grad_scale=1.0, bint decay_2d_only=False):
        """One AdamW step (t counts from 1) on grads * grad_scale.  Weight decay applies to
        every tensor, as llm.c's train_gpt2.c, or with decay_2d_only to the matrices alone,
        as llm.c's CUDA trainer."""
        if t < 1:
            raise ValueError(f"the AdamW step t counts from 1, got {t}")
        cdef float* params = data_pointer(self._params)
        cdef float* grads = data_pointer(self.grads)
        cdef float* m = data_pointer(self.m)
        cdef float* v = data_pointer(self.v)
        cdef Py_ssize_t start, size
        cdef float decay
        for (name, shape), start in zip(self.config.param_shapes(), self.param_offsets):
            size = int(np.prod(shape))
            decay = weight_decay if (not decay_2d_only or name in MATRIX_TENSORS) else 0.0
            with nogil:
                self.k.adamw_update(params + start, m + start, v + start, grads + start, size,
                                    lr, beta1, beta2, eps, decay, grad_scale, t)
