"""
The model-generic core: what every model family shares, written once.

A family (GPT-2 in train_gpt2.pyx) subclasses Model and gives
    FAMILY                      the backend kernels it needs ("gpt2")
    MATRICES                    the parameter tensors weight decay applies to (decay_2d_only)
    config.param_shapes()       its parameters, [(name, shape)] in file order
    activation_shapes(B, T)     its activations, [(name, shape)], one of them "losses" (B, T)
    point_parameters / point_activations    its structs of tensor pointers, from a Layout
    forward_pass / backward_pass            its layers, through the backend table
and this core does the rest, every byte of it through the backend table (accel/backend.pxd):
the buffers (parameters, gradients, AdamW's m and v, activations and their gradients, the
tokens), the batch in and the mean loss out, the loss gradient, zero_grad, the global gradient
norm, and AdamW with weight decay by tensor.  It never reads or writes a buffer itself, so the
same model runs on device memory; guard:cpu (accel/instrument.pyx) proves it in the tests.
"""
import numpy as np

from accel.backend import get_backend
from libc.math cimport sqrt

__all__ = ["Layout", "Model"]


cdef class Layout:
    """Tensors (name, shape) back to back in one buffer of `size` floats."""

    def __init__(self, shapes):
        self.names = [name for name, _ in shapes]
        self.shapes = [tuple(int(d) for d in shape) for _, shape in shapes]
        self.sizes = [int(np.prod(shape)) for shape in self.shapes]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.size = sum(self.sizes)

    cdef void point(self, float** fields, float* base) noexcept:
        """fields[i] = the i-th tensor in base: fills a struct of float* in layout order."""
        cdef Py_ssize_t i
        for i in range(len(self.offsets)):
            fields[i] = base + <Py_ssize_t>self.offsets[i]

    def offset(self, name):
        return self.offsets[self.names.index(name)]

    def views(self, flat):
        """name -> the tensor's shaped view of flat (a (size,) array)."""
        return {name: flat[o:o + n].reshape(shape)
                for name, shape, o, n in zip(self.names, self.shapes, self.offsets, self.sizes)}


cdef inline float* floats(Buffer buffer) noexcept:
    return NULL if buffer is None else <float*>buffer.ptr


cdef inline int* ints(Buffer buffer) noexcept:
    return NULL if buffer is None else <int*>buffer.ptr


cdef class Model:
    FAMILY = None
    MATRICES = frozenset()

    def __init__(self, config, backend="cpu"):
        """A model of this config with all parameters zero, on a backend (a name, see
        accel.backend.get_backend, or a Backend)."""
        self.backend = get_backend(backend)
        self.backend.require(self.FAMILY)
        self.b = self.backend.table
        self.config = config
        self.param_layout = Layout(config.param_shapes())
        self._params = self.backend.alloc(self.param_layout.size * sizeof(float))
        self.point_parameters(floats(self._params), NULL)
        self.B = self.T = 0
        self.mean_loss = -1.0
        self.step = 0
        self.shard_start, self.shard_end = 0, self.param_layout.size

    # --- what a family fills in ----------------------------------------------------------

    cdef void point_parameters(self, float* params, float* grads) noexcept:
        pass

    cdef void point_activations(self, float* acts, float* grads_acts) noexcept:
        pass

    cdef void forward_pass(self, const int* inputs, const int* targets, int B, int T) noexcept nogil:
        pass

    cdef void backward_pass(self, const int* inputs, const int* targets, int B, int T) noexcept nogil:
        pass

    def activation_shapes(self, int B, int T):
        raise NotImplementedError

    # --- buffers ---------------------------------------------------------------------------

    cdef Buffer _lazy(self, Buffer buffer, Layout layout):
        """buffer, or a zeroed one of the layout's size when it is not there yet."""
        return buffer if buffer is not None else self.backend.alloc(layout.size * sizeof(float))

    def _ensure_grads(self):
        if self._grads is None:
            self._grads = self._lazy(None, self.param_layout)
            self.point_parameters(floats(self._params), floats(self._grads))

    def _host(self, Buffer buffer, Py_ssize_t offset, Py_ssize_t count):
        """count floats of buffer from float offset: a zero-copy view where the backend's memory
        is the host's, else a read-only copy (so that writing to it fails instead of getting lost)."""
        if self.backend.host_visible:
            return buffer.view(np.float32, offset * sizeof(float), count)
        array = buffer.to_numpy(np.float32, offset * sizeof(float), count)
        array.flags.writeable = False
        return array

    def _load(self, Buffer buffer, array, what, Py_ssize_t size=-1):
        size = self.param_layout.size if size < 0 else size
        array = np.asarray(array, dtype=np.float32)
        if array.shape != (size,):
            raise ValueError(f"{what} must have shape ({size},), got {array.shape}")
        buffer.load(array)

    cdef Buffer _moments(self, Buffer buffer):
        """buffer, or zeroed AdamW moments for the optimizer shard when it is not there yet."""
        if buffer is not None:
            return buffer
        return self.backend.alloc((self.shard_end - self.shard_start) * sizeof(float))

    @property
    def num_parameters(self):
        return self.param_layout.size

    @property
    def params(self):
        """All parameters, one (num_parameters,) float32 array; assign to load new ones."""
        return self._host(self._params, 0, self.param_layout.size)

    @params.setter
    def params(self, values):
        self._load(self._params, values, "params")

    @property
    def grads(self):
        """All parameter gradients, laid out as params; assign to load new ones (the
        all-reduce of a backend whose memory is not the host's, llmc/distributed.py)."""
        self._ensure_grads()
        return self._host(self._grads, 0, self.param_layout.size)

    @grads.setter
    def grads(self, values):
        self._ensure_grads()
        self._load(self._grads, values, "grads")

    @property
    def optimizer_shard(self):
        """(start, end): the span of params that update() changes and whose AdamW m and v this
        model keeps; all of them unless set.  ZeRO-1 sets each process's own span
        (llmc/distributed.py), so m and v take (end - start) floats instead of two per parameter."""
        return self.shard_start, self.shard_end

    @optimizer_shard.setter
    def optimizer_shard(self, span):
        start, end = (int(x) for x in span)
        if not 0 <= start < end <= self.param_layout.size:
            raise ValueError(f"optimizer shard [{start}, {end}) is not a non-empty span of the "
                             f"{self.param_layout.size} parameters")
        if (start, end) != (self.shard_start, self.shard_end):
            self._m = self._v = None  # moments of another span mean nothing here
        self.shard_start, self.shard_end = start, end

    @property
    def m(self):
        """AdamW's first moments of the optimizer shard (all parameters unless sharded), laid
        out as params[start:end] (zeros until the first update)."""
        self._m = self._moments(self._m)
        return self._host(self._m, 0, self.shard_end - self.shard_start)

    @m.setter
    def m(self, values):
        self._m = self._moments(self._m)
        self._load(self._m, values, "m", self.shard_end - self.shard_start)

    @property
    def v(self):
        """AdamW's second moments, laid out as m."""
        self._v = self._moments(self._v)
        return self._host(self._v, 0, self.shard_end - self.shard_start)

    @v.setter
    def v(self, values):
        self._v = self._moments(self._v)
        self._load(self._v, values, "v", self.shard_end - self.shard_start)

    def param_tensors(self):
        """name -> shaped view (or copy, see params) of each parameter tensor, in file order."""
        return self.param_layout.views(self.params)

    def grad_tensors(self):
        """name -> shaped view (or copy) of each parameter's gradient."""
        return self.param_layout.views(self.grads)

    def activations(self):
        """name -> shaped view (or copy) of the last forward's activation tensors."""
        self._require_forward()
        return self.act_layout.views(self._host(self._acts, 0, self.act_layout.size))

    def activation(self, name):
        """One activation tensor of the last forward (copies only that one off a device)."""
        self._require_forward()
        i = self.act_layout.names.index(name)
        flat = self._host(self._acts, self.act_layout.offsets[i], self.act_layout.sizes[i])
        return flat.reshape(self.act_layout.shapes[i])

    def memory(self):
        """Bytes allocated on the backend: {params, grads, adamw, activations}."""
        def size(*buffers):
            return sum(buf.nbytes for buf in buffers if buf is not None)
        return dict(params=size(self._params), grads=size(self._grads),
                    adamw=size(self._m, self._v),
                    activations=size(self._acts, self._grads_acts, self._inputs, self._targets))

    def _require_forward(self):
        if self.B == 0:
            raise RuntimeError("no forward pass has been run yet")

    # --- forward ---------------------------------------------------------------------------

    def _batch(self, tokens, what):
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1:
            raise ValueError(f"{what} must have shape (B, T), got {tokens.shape}")
        if tokens.shape[1] > self.config.max_seq_len:
            raise ValueError(f"{what}: sequence length {tokens.shape[1]} exceeds the model's "
                             f"max_seq_len {self.config.max_seq_len}")
        if tokens.min() < 0 or tokens.max() >= self.config.vocab_size:
            raise ValueError(f"{what}: token ids must be in [0, {self.config.vocab_size}), "
                             f"got [{tokens.min()}, {tokens.max()}]")
        return tokens

    def _allocate_activations(self, int B, int T):
        layout = Layout(self.activation_shapes(B, T))
        if self._acts is None or layout.size * sizeof(float) > self._acts.nbytes:
            self._acts = None  # freed before its successor is allocated
            self._grads_acts = None  # reallocated, at this size, by the next backward
            self._acts = self.backend.alloc(layout.size * sizeof(float))
        if self._inputs is None or B * T * sizeof(int) > self._inputs.nbytes:
            self._inputs = self.backend.alloc(B * T * sizeof(int))
            self._targets = self.backend.alloc(B * T * sizeof(int))
        self.act_layout = layout
        self.point_activations(floats(self._acts), floats(self._grads_acts))
        self.B, self.T = B, T

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
        self._inputs.load(inputs)
        self.has_targets = targets is not None
        if self.has_targets:
            self._targets.load(targets)
        cdef const int* inp = ints(self._inputs)
        cdef const int* tgt = ints(self._targets) if self.has_targets else NULL
        cdef float* losses = floats(self._acts) + <Py_ssize_t>self.act_layout.offset("losses")
        with nogil:
            self.forward_pass(inp, tgt, B, T)
            if tgt != NULL:
                self.mean_loss = self.b.mean(self.b.ctx, losses, <Py_ssize_t>B * T)
        self.backend.check_error()
        return float(self.mean_loss) if self.has_targets else None

    # --- backward --------------------------------------------------------------------------

    def zero_grad(self):
        """Set the parameter gradients to zero (backward adds to them)."""
        self._ensure_grads()
        cdef void* grads = self._grads.ptr
        cdef size_t nbytes = self._grads.nbytes
        with nogil:
            self.b.zero(self.b.ctx, grads, nbytes)
        self.backend.check_error()

    def backward(self):
        """Add the gradient of the last forward's mean loss to grads (needs targets)."""
        if not self.has_targets:
            raise RuntimeError("backward needs a forward pass with targets")
        self._ensure_grads()
        if self._grads_acts is None:
            self._grads_acts = self.backend.alloc(self._acts.nbytes)
            self.point_activations(floats(self._acts), floats(self._grads_acts))
        cdef int B = self.B, T = self.T
        cdef Py_ssize_t BT = <Py_ssize_t>B * T
        cdef float* grads_acts = floats(self._grads_acts)
        cdef float* dlosses = grads_acts + <Py_ssize_t>self.act_layout.offset("losses")
        cdef size_t nbytes = self.act_layout.size * sizeof(float)
        cdef const int* inp = ints(self._inputs)
        cdef const int* tgt = ints(self._targets)
        with nogil:
            # activation gradients are accumulated into, so they start at zero; the loss is the
            # mean over B*T positions
            self.b.zero(self.b.ctx, grads_acts, nbytes)
            self.b.fill(self.b.ctx, dlosses, 1.0 / BT, BT)
            self.backward_pass(inp, tgt, B, T)
        self.backend.check_error()

    # --- optimizer -------------------------------------------------------------------------

    def grad_norm(self, bint shard_only=False):
        """Global L2 norm of all parameter gradients; with shard_only, of the optimizer
        shard's alone (ZeRO-1: the other processes hold the rest, reduced)."""
        self._ensure_grads()
        cdef const float* grads = floats(self._grads)
        cdef Py_ssize_t n = self.param_layout.size
        if shard_only:
            grads += self.shard_start
            n = self.shard_end - self.shard_start
        cdef double norm_squared
        with nogil:
            norm_squared = self.b.global_norm_squared(self.b.ctx, grads, n)
        self.backend.check_error()
        return sqrt(norm_squared)

    def _decay_spans(self, bint decay_2d_only):
        """[(start, size, decayed)]: runs of neighbouring tensors that share their decay."""
        spans = []
        for name, start, size in zip(self.param_layout.names, self.param_layout.offsets,
                                     self.param_layout.sizes):
            decayed = not decay_2d_only or name in self.MATRICES
            if spans and spans[len(spans) - 1][2] == decayed:
                last_start, last_size, _ = spans.pop()
                start, size = last_start, last_size + size
            spans.append((start, size, decayed))
        return spans

    def update(self, float lr, float beta1, float beta2, float eps, float weight_decay, int t,
               float grad_scale=1.0, bint decay_2d_only=False):
        """One AdamW step (t counts from 1) on grads * grad_scale, of the parameters in the
        optimizer shard (all unless sharded).  Weight decay applies to every tensor, as llm.c's
        train_gpt2.c, or with decay_2d_only to MATRICES alone, as llm.c's CUDA trainer."""
        if t < 1:
            raise ValueError(f"the AdamW step t counts from 1, got {t}")
        self._ensure_grads()
        self._m = self._moments(self._m)
        self._v = self._moments(self._v)
        cdef float* params = floats(self._params)
        cdef float* grads = floats(self._grads)
        cdef float* m = floats(self._m)  # m[i - shard_start] is parameter i's moment
        cdef float* v = floats(self._v)
        cdef Py_ssize_t start, end
        cdef float decay
        for span_start, span_size, decayed in self._decay_spans(decay_2d_only):
            # the part of this run of tensors that lies in the shard
            start = max(<Py_ssize_t>span_start, self.shard_start)
            end = min(<Py_ssize_t>(span_start + span_size), self.shard_end)
            if start >= end:
                continue
            decay = weight_decay if decayed else 0.0
            with nogil:
                self.b.adamw_update(self.b.ctx, params + start, m + (start - self.shard_start),
                                    v + (start - self.shard_start), grads + start, end - start,
                                    lr, beta1, beta2, eps, decay, grad_scale, t)
        self.step = t
        self.backend.check_error()
