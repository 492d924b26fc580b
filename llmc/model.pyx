"""
The model-generic core: what every model family shares, written once.

A family (GPT-2 in train_gpt2.pyx) subclasses Model and gives
    FAMILY                      its name ("gpt2")
    ENTRY_GROUPS                the backend's entry groups it runs on (accel/spec.py)
    MATRICES                    the parameter tensors weight decay applies to (decay_2d_only)
    NO_GRAD                     the activations no backward kernel needs a gradient of
    LORA_TARGETS                its linear layers that LoRA may adapt (parameter names, each
                                (L, OC, C)), which its layers run through linear_forward and
                                linear_backward
    FP32_ACTIVATIONS            the activations that stay float32 at every precision (the
                                kernels' `float` arguments in accel/spec.py: statistics, losses)
    config.param_shapes()       its parameters, [(name, shape)] in file order
    classmethods of the config, so that llmc/dry_run.py prices a model without making it:
      activation_shapes(config, B, T)  its activations: the embedding's output (name, shape),
                                one layer's [(name, shape)] (the last its output, the stream
                                into the next layer), the head's (one of them "losses" (B, T))
      num_layers_of(config), flops_per_token(config, T)
      activation_options(backend)  the keyword options of activation_shapes that the backend
                                decides (GPT-2, Llama: flash attention or not)
    point_parameters            its struct of parameter pointers, from a Layout (the
                                parameters in the model's precision, their gradients float32;
                                a layer's slice of a parameter tensor through self.at)
    embedding_forward / layer_forward(l, ...) / head_forward, and their backwards: its parts,
                                through the backend table, on arrays of tensor pointers in the
                                order of its shape lists (one layer's, the head's)
All but MATRICES, NO_GRAD, LORA_TARGETS, FP32_ACTIVATIONS and activation_options (whose
defaults are "none" and "no options") are required: a family that leaves one to Model is
refused, naming it, when it is defined (llmc/families.py) and when it is constructed
(refuse_unfilled).
And this core does the rest, every byte of it through the backend table (accel/backend.pxd):
the buffers (parameters, gradients, AdamW's m and v, activations and their gradients, the
tokens), the batch in and the mean loss out, the layers in order under an activation
checkpoint policy (which layers' activations are kept, which recomputed in backward:
llmc/recompute.py), the loss gradient, zero_grad, the global gradient norm, and AdamW with
weight decay by tensor.  It never reads or writes a buffer itself, so the same model runs on
device memory; guard:cpu (accel/instrument.pyx) proves it in the tests.

Precision (llm.c's PRECISION): at "fp32" every tensor is float32.  At "bf16" the backend's bf16
table runs the model: the parameters the kernels read and the activations are bf16 (but for
FP32_ACTIVATIONS), the parameter gradients, AdamW's m and v and the master weights are float32
(llm.c's default), and each update rounds the master weights into the bf16 parameters
stochastically, from a hash of each parameter's index and the step, so a resumed run rounds as
the uninterrupted one.  With grad_precision "bf16" (at bf16 alone) the parameter gradients are
bf16, as llm.c keeps them, 2 bytes a parameter less: each kernel sums its contribution in
float32 and adds it into the gradient rounded to nearest once (kernels/bf16.pxd's add_grad);
the norm and AdamW read them widened (LoRA's updates keep float32 gradients).  `params` is
always the float32 master weights; a model made with trainable=False (for inference, or a LoRA
base) keeps none, its parameters loaded straight into the bf16 ones, rounded to nearest, and
`params` widens those; so does one made with master_weights=False (llm.c's -w 0), which trains
all the same: AdamW reads each bf16 parameter widened and rounds its new value stochastically
back into place (the no_master group), 4 bytes a parameter less.  At "fp16" (the GPUs'
half precision, Metal's) likewise, with the parameters rounded to nearest, and with dynamic loss
scaling, since fp16 has 5 exponent bits: backward differentiates the loss times loss_scale, so
that the activation gradients (fp16) stay above its smallest subnormal (2^-24) and the
parameter gradients (float32) are loss_scale times the loss's (grads); grad_norm and update
divide it out.  A step whose gradients are not finite (an fp16 overflow) is skipped and halves
the scale (adjust_loss_scale); LOSS_SCALE_GROWTH_STEPS finite steps in a row double it.  The
scale is a power of two, so scaling and unscaling are exact.

LoRA (attach_lora; Hu et al., 2021, as PEFT implements it): the parameters are frozen, and
beside each adapted linear layer W (OC, C) a rank-R update trains, out = inp W^T +
(alpha/R) (inp A^T) B^T, A (R, C) and B (OC, R) float32 at every precision.  The frozen
parameters' gradients are never computed (their buffer is never allocated: a backward
kernel given a NULL weight gradient skips it), so what trains, and what grads, m, v,
zero_grad, grad_norm, update and the collectives see, is the updates alone (lora_layout).
With a dropout p, a training forward (forward(..., training=True)) drops a fraction p of each
update's input, inp A^T becoming (inp * mask / (1 - p)) A^T, one mask per update as PEFT draws
one per module; the frozen W sees inp whole.  The masks are never stored: a counter-based hash of
(the run's seed, the step, the forward within the step, the update) draws each again in backward
and in a recomputed forward, and a resumed run draws what the uninterrupted one did.  Every other
forward (evaluation, generation) runs without dropout, as a model in PyTorch's eval mode.
"""
from collections import namedtuple

import numpy as np

from accel.backend import BackendError, get_backend
from cpython.pycapsule cimport PyCapsule_GetPointer
from kernels.bf16 import to_bf16, to_float32
from kernels.dropout cimport mask_key
from libc.math cimport isfinite, sqrt
from llmc import recompute

__all__ = ["Layout", "LoraConfig", "Model", "LOSS_SCALE_INITIAL", "LOSS_SCALE_GROWTH_STEPS",
           "refuse_unfilled", "unfilled"]

# fp16's dynamic loss scaling (as PyTorch's GradScaler's defaults): the scale a run starts at,
# and the finite steps in a row after which it doubles
LOSS_SCALE_INITIAL = 2.0 ** 16
LOSS_SCALE_GROWTH_STEPS = 2000
LOSS_SCALE_MAX = 2.0 ** 24   # past it an fp16 gradient of 2^-24 * 2^24 = 1 gains nothing
# forward_cached's most positions a forward: its activations and the attention's (NH, T, P+T)
# scratch stay small however long the prompt (llama.cpp's batches are 512)
CACHE_CHUNK = 256
# attach_lora's settings: rank R, alpha (the updates scale by alpha / R), targets (LORA_TARGETS'
# names, in its order), layers (indices, ascending), dropout (p on the updates' input at training)
LoraConfig = namedtuple("LoraConfig", "rank alpha targets layers dropout", defaults=(0.0,))


cdef class Layout:
    """Tensors (name, shape) back to back in one buffer of `size` elements, `nbytes` bytes.
    Each tensor has its itemsize (4 unless given: a bf16 model's activations mix 2 and 4) and
    starts at a multiple of it; offsets are in elements of the tensor's own size."""

    def __init__(self, shapes, itemsizes=None):
        self.names = [name for name, _ in shapes]
        self.shapes = [tuple(int(d) for d in shape) for _, shape in shapes]
        self.sizes = [int(np.prod(shape)) for shape in self.shapes]
        self.itemsizes = [4] * len(self.names) if itemsizes is None else [int(i) for i in itemsizes]
        self.byte_offsets = []
        cdef Py_ssize_t end = 0
        for size, itemsize in zip(self.sizes, self.itemsizes):
            end = (end + itemsize - 1) // itemsize * itemsize
            self.byte_offsets.append(end)
            end += size * itemsize
        self.offsets = [b // i for b, i in zip(self.byte_offsets, self.itemsizes)]
        self.size = sum(self.sizes)
        self.nbytes = end

    cdef void point(self, float** fields, float* base, int itemsize) noexcept:
        """fields[i] = the i-th tensor in base, a buffer of this layout at one itemsize: fills
        a struct of float* in layout order."""
        cdef Py_ssize_t i
        for i in range(len(self.offsets)):
            fields[i] = <float*>(<char*>base + <Py_ssize_t>self.offsets[i] * itemsize)

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


# What a family must fill in (the docstring's list).  Model's own versions are empty and a
# family that left one out would train silently wrong (no gradient from its layers, say), so a
# family is refused when it is constructed, with the names it lacks.  A cdef method is overridden
# where the class's table of C methods (Cython's vtable, the capsule __pyx_vtable__) points
# elsewhere than Model's at that method's slot.
FAMILY_METHODS = ("point_parameters", "embedding_forward", "layer_forward", "head_forward",
                  "head_backward", "layer_backward", "embedding_backward")
FAMILY_CLASSMETHODS = ("activation_shapes", "num_layers_of", "flops_per_token", "kv_shape")
_CHECKED = set()   # the classes already found complete


cdef void** vtable(cls) except NULL:
    return <void**>PyCapsule_GetPointer(cls.__pyx_vtable__, NULL)


cdef dict method_slots():
    """Each family method's slot in Model's vtable: where Model's table holds its address."""
    cdef size_t[7] own = [<size_t><void*>Model.point_parameters,
                          <size_t><void*>Model.embedding_forward, <size_t><void*>Model.layer_forward,
                          <size_t><void*>Model.head_forward, <size_t><void*>Model.head_backward,
                          <size_t><void*>Model.layer_backward, <size_t><void*>Model.embedding_backward]
    cdef void** table = vtable(Model)
    slots, i = {}, 0
    while len(slots) < len(FAMILY_METHODS):   # every one is in the table: the scan stops there
        for k in range(len(FAMILY_METHODS)):
            if <size_t>table[i] == own[k]:
                slots[FAMILY_METHODS[k]] = i
        i += 1
    return slots


def unfilled(cls):
    """The names of what the family class cls (a subclass of Model) leaves to Model's empty
    defaults: its class attributes FAMILY and ENTRY_GROUPS, C methods, classmethods."""
    missing = [name for name in ("FAMILY", "ENTRY_GROUPS") if not getattr(cls, name)]
    cdef void** table = vtable(cls)
    cdef void** own = vtable(Model)
    missing += [name for name, slot in method_slots().items() if table[slot] == own[slot]]
    missing += [name for name in FAMILY_CLASSMETHODS   # the class that defines it is Model
                if next(k for k in cls.__mro__ if name in vars(k)) is Model]
    return missing


def refuse_unfilled(cls):
    """TypeError in one line when the family class cls leaves something to Model."""
    if cls in _CHECKED:
        return
    missing = unfilled(cls)
    if missing:
        raise TypeError(f"{cls.__name__} does not fill in {', '.join(missing)}: a model family "
                        f"implements each (llmc/model.pyx)")
    _CHECKED.add(cls)


cdef class Model:
    FAMILY = None
    ENTRY_GROUPS = ()
    MATRICES = frozenset()
    NO_GRAD = frozenset()
    LORA_TARGETS = ()
    FP32_ACTIVATIONS = frozenset()

    def __init__(self, config, backend="cpu", recompute="all", precision=None, trainable=True,
                 grad_precision=None, master_weights=True):
        """A model of this config with all parameters zero, on a backend (a name, see
        accel.backend.get_backend, or a Backend), at a precision ("fp32", "bf16", "fp16"; None:
        the Backend's, or fp32), its parameter gradients float32 or, at bf16, bf16
        (grad_precision "fp32" or "bf16"; None: the Backend's, or fp32), keeping activations by
        a recompute policy (llmc.recompute.POLICIES).  trainable=False: for inference or a LoRA
        base, which update never trains, so at bf16 (fp16) no float32 master weights: the
        parameters are held, and loaded, in the model's precision alone (rounded to nearest),
        half the memory.  master_weights=False (llm.c's -w 0, at bf16 alone): it trains so too,
        AdamW updating the bf16 parameters themselves and rounding each stochastically."""
        refuse_unfilled(type(self))
        if precision is None:
            precision = getattr(backend, "precision", "fp32")
        if grad_precision is None:
            grad_precision = getattr(backend, "grad_precision", "fp32")
        self.backend = get_backend(backend, precision, grad_precision)
        self.precision = self.backend.precision
        self.itemsize = self.backend.itemsize
        self.grad_precision = self.backend.grad_precision
        self.grad_itemsize = self.backend.grad_itemsize
        self.backend.require(self.ENTRY_GROUPS + (("mixed",) if self.precision != "fp32" else ()),
                             self.FAMILY)
        self.table = self.backend.table
        self.config = config
        self.param_layout = Layout(config.param_shapes())
        self._params = self.backend.alloc(self.param_layout.size * self.itemsize)
        self.trainable = trainable
        if not master_weights and trainable:
            if self.precision != "bf16":
                why = "has none" if self.precision == "fp32" else "rounds to nearest"
                raise ValueError(f"training without master weights needs bf16, whose updates "
                                 f"round stochastically ({self.precision} {why})")
            self.backend.require(("no_master",), self.FAMILY)
        if self.precision != "fp32" and trainable and master_weights:
            self._master = self.backend.alloc(self.param_layout.nbytes)
        self.loss_scale = LOSS_SCALE_INITIAL if self.precision == "fp16" else 1.0
        self.loss_scale_steps = 0
        self.point_parameters(floats(self._params), NULL)
        self.recompute = recompute
        self.mean_loss = -1.0
        self.step = 0
        self.shard_start, self.shard_end = 0, self.param_layout.size

    # --- what a family fills in (Model's own are never run: refuse_unfilled) ----------------

    cdef void point_parameters(self, float* params, float* grads) noexcept:
        pass

    cdef void embedding_forward(self, float* out, const int* inputs, int B, int T) noexcept nogil:
        pass

    cdef void layer_forward(self, int l, float** acts, const float* inp, int B, int T) noexcept nogil:
        pass

    cdef void head_forward(self, float** acts, const float* inp, const int* targets,
                           int B, int T) noexcept nogil:
        pass

    cdef void head_backward(self, float* dinp, float** grads_acts, float** acts, const float* inp,
                            const int* targets, int B, int T) noexcept nogil:
        pass

    cdef void layer_backward(self, int l, float* dinp, float** grads_acts, float** acts,
                             const float* inp, int B, int T) noexcept nogil:
        pass

    cdef void embedding_backward(self, const float* dout, const int* inputs, int B, int T) noexcept nogil:
        pass

    @classmethod
    def activation_shapes(cls, config, int B, int T):
        raise NotImplementedError

    @classmethod
    def num_layers_of(cls, config):
        raise NotImplementedError

    @classmethod
    def activation_options(cls, backend):
        return {}

    @classmethod
    def flops_per_token(cls, config, int T):
        raise NotImplementedError

    @classmethod
    def kv_shape(cls, config):
        """(floats of one position's keys in a layer, query heads): the KV cache's shape."""
        raise NotImplementedError

    # --- buffers ---------------------------------------------------------------------------

    cdef Buffer _lazy(self, Buffer buffer, Layout layout):
        """buffer, or a zeroed one of the layout's size when it is not there yet."""
        return buffer if buffer is not None else self.backend.alloc(layout.nbytes)

    def _ensure_grads(self):
        if self.frozen:
            if self._lora_grads is None:
                self._lora_grads = self._lazy(None, self.lora_layout)
                self.lora_da = <float**>self._lora_table("da", self._lora_grads, "lora_A")
                self.lora_db = <float**>self._lora_table("db", self._lora_grads, "lora_B")
        elif self._grads is None:
            self._grads = self.backend.alloc(self.param_layout.size * self.grad_itemsize)
            self.point_parameters(floats(self._params), floats(self._grads))

    @property
    def master_weights(self):
        """Whether it keeps float32 master weights (at bf16 and fp16 when it trains, unless made
        with master_weights=False; at fp32 the parameters are float32 themselves)."""
        return self._master is not None

    @property
    def frozen(self):
        """Whether the parameters are frozen: LoRA attached (in nogil code, lora_a != NULL)."""
        return self.lora is not None

    @property
    def num_trained(self):
        """How many parameters train: all of them, or with LoRA the updates'."""
        return self.lora_layout.size if self.frozen else self.param_layout.size

    cdef Buffer _trained_grads(self):
        return self._lora_grads if self.frozen else self._grads

    def _host(self, Buffer buffer, Py_ssize_t offset, Py_ssize_t count):
        """count floats of buffer from float offset: a zero-copy view where the backend's memory
        is the host's, else a read-only copy (so that writing to it fails instead of getting lost)."""
        if self.backend.host_visible:
            return buffer.view(np.float32, offset * sizeof(float), count)
        array = buffer.to_numpy(np.float32, offset * sizeof(float), count)
        array.flags.writeable = False
        return array

    def _load(self, Buffer buffer, array, what, Py_ssize_t size=-1, bint narrow=False):
        """buffer = array (float32; with narrow, in the model's 2-byte precision, which bf16
        gradients share)."""
        size = self.param_layout.size if size < 0 else size
        array = np.asarray(array, dtype=np.float32)
        if array.shape != (size,):
            raise ValueError(f"{what} must have shape ({size},), got {array.shape}")
        buffer.load(self._narrow(array) if narrow else array)

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
        """All parameters, one (num_parameters,) float32 array (at bf16: the master weights;
        frozen under LoRA, it keeps none: a widened copy of the bf16 ones); assign to load
        new ones (at bf16, the kernels' parameters are then the master weights rounded to
        nearest)."""
        if self._master is None and self.precision != "fp32":
            return self.params_as_run()
        return self._host(self._master if self._master is not None else self._params, 0,
                          self.param_layout.size)

    @params.setter
    def params(self, values):
        self._require_unfrozen()
        if self._master is None:
            self._load(self._params, values, "params", narrow=self.precision != "fp32")
            return
        self._load(self._master, values, "params")
        self.round_params(-1)

    def fill_params(self, fill):
        """Load the parameters from fill(flat, store), which writes all of them into flat, a
        (num_parameters,) array, each part through store(part, float32 values): the model's
        own buffer (float32, its master weights at bf16; without them, bf16 or fp16 bits, which
        store rounds to nearest) where the backend's memory is the host's, so that a model
        file is read into place with no second copy of it; else a host array, then loaded."""
        self._require_unfrozen()
        narrow = self._master is None and self.precision != "fp32"
        buffer = self._master if self._master is not None else self._params
        dtype = np.uint16 if narrow else np.float32
        if self.backend.host_visible:
            fill(buffer.view(dtype, 0, self.param_layout.size), self._store)
        else:
            flat = np.empty(self.param_layout.size, dtype=dtype)
            fill(flat, self._store)
            buffer.load(flat)
        self.round_params(-1)

    def _store(self, part, values):
        """part[...] = values (float32), in part's format: float32, or this model's 2-byte
        precision's bits rounded to nearest."""
        if part.dtype == np.float32:
            part[...] = values
        else:
            part[...] = self._narrow(np.asarray(values, dtype=np.float32))

    def _require_unfrozen(self):
        if self.frozen:
            raise RuntimeError("the parameters are frozen (LoRA attached): load them before "
                               "attach_lora")

    def round_params(self, int seed):
        """At bf16: the parameters the kernels read, from the float32 master weights: rounded
        stochastically from (each parameter's index, seed), or to nearest with seed -1 (the
        update rounds its shard with the step as the seed; llmc/distributed.py rounds the rest
        after its all-gather alike).  At fp32 there is nothing to round."""
        if self._master is None:
            return
        cdef float* params = floats(self._params)
        cdef const float* master = floats(self._master)
        cdef Py_ssize_t n = self.param_layout.size
        with nogil:
            self.table.narrow_params(self.table.ctx, params, master, n, 0, seed)
        self.backend.check_error()

    def set_master_weights(self, values):
        """Load the float32 master weights alone (at fp32: the parameters; without master
        weights: the bf16 parameters, rounded to nearest), leaving the bf16 parameters the
        kernels read as they are: a resume (llmc/checkpoint.py), whose bf16 parameters come
        from the model file or from round_params, and the all-gather of llmc/distributed.py,
        which rounds them after it."""
        if self._master is None:
            self._load(self._params, values, "params", narrow=self.precision != "fp32")
            return
        self._load(self._master, values, "params")

    def params_as_run(self):
        """The parameters the kernels read, as float32 (at bf16, the bf16 values widened; at
        fp32, params itself): what a model file of the run's precision holds."""
        if self.precision == "fp32":
            return self.params
        return self._widen(self._params.to_numpy(np.uint16, 0, self.param_layout.size))

    def _narrow(self, values):
        """float32 values as the model's 2-byte elements (uint16 bits), rounded to nearest."""
        if self.precision == "fp16":
            return values.astype(np.float16).view(np.uint16)
        return to_bf16(values)

    def _widen(self, bits):
        """The model's 2-byte elements (uint16 bits, bf16 or fp16) as float32, exactly."""
        if self.precision == "fp16":
            return bits.view(np.float16).astype(np.float32)
        return to_float32(bits)

    @property
    def grads(self):
        """The gradients of what trains (all parameters, laid out as params; with LoRA the
        updates, laid out as lora_params), of the loss times loss_scale (fp16; 1 elsewhere),
        as float32 (bf16 gradients: a widened copy); assign to load new ones (the all-reduce
        of a backend whose memory is not the host's, llmc/distributed.py; bf16 ones rounded to
        nearest)."""
        self._ensure_grads()
        if self.grad_itemsize == 2 and not self.frozen:
            return to_float32(self._grads.to_numpy(np.uint16, 0, self.num_trained))
        return self._host(self._trained_grads(), 0, self.num_trained)

    @grads.setter
    def grads(self, values):
        self._ensure_grads()
        self._load(self._trained_grads(), values, "grads", self.num_trained,
                   narrow=self.grad_itemsize == 2 and not self.frozen)

    def collective_buffers(self):
        """(gradients, master weights) of what trains: the float32 Buffers that
        llmc/distributed.py sums and gathers in place on the device (the backend's collectives
        group); the master weights are the parameters at fp32, the updates with LoRA."""
        self._ensure_grads()
        if self.frozen:
            return self._lora_grads, self._lora
        return self._grads, self._master if self._master is not None else self._params

    @property
    def optimizer_shard(self):
        """(start, end): the span of params that update() changes and whose AdamW m and v this
        model keeps; all of them unless set.  ZeRO-1 sets each process's own span
        (llmc/distributed.py), so m and v take (end - start) floats instead of two per parameter."""
        return self.shard_start, self.shard_end

    @optimizer_shard.setter
    def optimizer_shard(self, span):
        start, end = (int(x) for x in span)
        if not 0 <= start < end <= self.num_trained:
            raise ValueError(f"optimizer shard [{start}, {end}) is not a non-empty span of the "
                             f"{self.num_trained} parameters that train")
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
        """name -> shaped view (or copy; at bf16, a float32 copy of a bf16 tensor) of the last
        forward's activation tensors.  Under a recompute policy other than "all" a layer tensor
        holds the slots (its output: the outputs) the policy keeps, not L layers
        (llmc/recompute.py)."""
        self._require_forward()
        return {name: self.activation(name) for name in self.act_layout.names}

    def activation(self, name):
        """One activation tensor of the last forward (copies only that one off a device)."""
        self._require_forward()
        layout = self.act_layout
        i = layout.names.index(name)
        if layout.itemsizes[i] == 4:
            flat = self._host(self._acts, layout.offsets[i], layout.sizes[i])
        else:
            flat = self._widen(self._acts.to_numpy(np.uint16, layout.byte_offsets[i], layout.sizes[i]))
        return flat.reshape(layout.shapes[i])

    def memory(self):
        """Bytes allocated on the backend: {params, grads, adamw, activations,
        activation_grads, tokens} (what llmc.dry_run.memory_plan predicts; LoRA's updates
        count as params, grads and activations)."""
        def size(*buffers):
            return sum(buf.nbytes for buf in buffers if buf is not None)
        return dict(params=size(self._params, self._master, self._lora),
                    grads=size(self._grads, self._lora_grads), adamw=size(self._m, self._v),
                    activations=size(self._acts, self._lora_hidden, self._lora_dropped),
                    activation_grads=size(self._grads_acts),
                    tokens=size(self._inputs, self._targets))

    @property
    def recompute(self):
        """The activation checkpoint policy (llmc/recompute.py); setting it frees the
        activations, laid out anew by the next forward."""
        return self.recompute_plan.policy

    @recompute.setter
    def recompute(self, policy):
        self.recompute_plan = recompute.RecomputePlan(policy, self.num_layers)
        self._acts = self._grads_acts = None
        self.act_layout = self.act_grad_layout = None
        self.B = self.T = 0

    @property
    def num_layers(self):
        return self.num_layers_of(self.config)

    def _require_forward(self):
        if self.B == 0:
            raise RuntimeError("no forward pass has been run yet")

    # --- LoRA ------------------------------------------------------------------------------

    def attach_lora(self, int rank, float alpha, targets, layers, dropout=0.0, int seed=0):
        """Freeze the parameters and train rank-`rank` updates, scaled by alpha / rank, beside
        the linear layers `targets` (names of LORA_TARGETS) of `layers` (layer indices):
        lora_params, zero until loaded (llmc/adapter.py initialises them as PEFT does).  A
        training forward drops a fraction `dropout` of their input, its masks drawn from seed."""
        if not self.backend.supports("lora"):
            raise BackendError(f"backend '{self.backend.name}' has no LoRA kernels "
                               f"(accel/spec.py's lora group; the CPU's fill it)")
        if self.grad_precision != "fp32":
            raise ValueError(f"LoRA's updates keep float32 gradients: {self.grad_precision} "
                             f"gradients are for training every parameter")
        unknown = [t for t in targets if t not in self.LORA_TARGETS]
        if unknown or not targets:
            raise ValueError(f"LoRA targets {', '.join(unknown) or 'none'}: {self.FAMILY} "
                             f"adapts {', '.join(self.LORA_TARGETS)}")
        if not layers or not all(0 <= l < self.num_layers for l in layers):
            raise ValueError(f"LoRA layers {list(layers)}: the model's are 0.."
                             f"{self.num_layers - 1}")
        if rank < 1:
            raise ValueError(f"LoRA rank {rank}: must be at least 1")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"LoRA dropout {dropout:g}: must be at least 0 and below 1")
        if self.frozen or self._grads is not None:
            raise RuntimeError("attach_lora: once, before any backward")
        self._master = None   # frozen in the model's precision: no float32 master weights
        self.lora = LoraConfig(rank, alpha, tuple(t for t in self.LORA_TARGETS if t in targets),
                               tuple(sorted(set(layers))), float(dropout))
        self.lora_rank, self.lora_scale = rank, alpha / rank
        self.lora_dropout, self.lora_seed, self.lora_draw_step = dropout, seed, -1
        self.lora_num_targets = len(self.LORA_TARGETS)
        shapes = dict(zip(self.param_layout.names, self.param_layout.shapes))
        n = len(self.lora.layers)
        self.lora_layout = Layout([item for t in self.lora.targets for item in (
            (f"{t}.lora_A", (n, rank, shapes[t][2])), (f"{t}.lora_B", (n, shapes[t][1], rank)))])
        self._lora = self.backend.alloc(self.lora_layout.nbytes)
        self._lora_tables = {}
        self.lora_a = <float**>self._lora_table("a", self._lora, "lora_A")
        self.lora_b = <float**>self._lora_table("b", self._lora, "lora_B")
        self._m = self._v = None
        self.shard_start, self.shard_end = 0, self.lora_layout.size
        if self.B:
            self._allocate_lora_hidden(self.B * self.T)

    cdef void* _lora_table(self, str name, Buffer buffer, str matrix):
        """A table of each (layer, target)'s pointer to its `matrix` ("lora_A" or "lora_B") in
        buffer (laid out as lora_layout), NULL where it has no update; its address."""
        cdef size_t base = <size_t>buffer.ptr
        table = np.zeros(self.num_layers * self.lora_num_targets, dtype=np.uintp)
        for t in self.lora.targets:
            i = self.lora_layout.names.index(f"{t}.{matrix}")
            stride = self.lora_layout.sizes[i] // len(self.lora.layers) * sizeof(float)
            for j, l in enumerate(self.lora.layers):
                table[l * self.lora_num_targets + self.LORA_TARGETS.index(t)] = (
                    base + self.lora_layout.byte_offsets[i] + j * stride)
        self._lora_tables[name] = table
        return <void*><size_t>table.ctypes.data

    def _allocate_lora_hidden(self, Py_ssize_t rows):
        """hidden (rows, R) of each update, and backward's dhidden, for a forward of rows; with
        dropout, the dropped input and its gradient (rows, the widest input), shared by all."""
        cdef size_t updates = len(self.lora.layers) * len(self.lora.targets)
        cdef size_t one = rows * self.lora_rank * sizeof(float)
        if self._lora_hidden is None or self._lora_hidden.nbytes < (updates + 1) * one:
            self._lora_hidden = None   # freed before its successor is allocated
            self._lora_hidden = self.backend.alloc((updates + 1) * one)
        cdef size_t base = <size_t>self._lora_hidden.ptr
        a = self._lora_tables["a"]
        order = np.cumsum(a != 0) - 1   # the updates in (layer, target) order
        self._lora_tables["hidden"] = np.where(a != 0, base + order * one, 0).astype(np.uintp)
        self.lora_hidden = <float**><size_t>self._lora_tables["hidden"].ctypes.data
        self.lora_dhidden = <float*>(base + updates * one)
        if self.lora_dropout == 0:
            return
        shapes = dict(zip(self.param_layout.names, self.param_layout.shapes))
        cdef size_t dropped = rows * max(shapes[t][2] for t in self.lora.targets) * self.itemsize
        if self._lora_dropped is None or self._lora_dropped.nbytes < 2 * dropped:
            self._lora_dropped = None
            self._lora_dropped = self.backend.alloc(2 * dropped)
        self.lora_dropped = floats(self._lora_dropped)
        self.lora_ddropped = <float*>(<char*>self._lora_dropped.ptr + dropped)

    @property
    def lora_params(self):
        """The LoRA updates, one (lora_layout.size,) float32 array; assign to load them."""
        if not self.frozen:
            raise RuntimeError("no LoRA attached (attach_lora)")
        return self._host(self._lora, 0, self.lora_layout.size)

    @lora_params.setter
    def lora_params(self, values):
        if not self.frozen:
            raise RuntimeError("no LoRA attached (attach_lora)")
        self._load(self._lora, values, "lora_params", self.lora_layout.size)

    def lora_tensors(self):
        """name -> shaped view (or copy) of each LoRA update tensor, (layers, ...) each."""
        return self.lora_layout.views(self.lora_params)

    cdef void linear_forward(self, int target, int l, float* out, const float* inp,
                             const float* weight, const float* bias, int B, int T, int C,
                             int OC) noexcept nogil:
        self.table.matmul_forward(self.table.ctx, out, inp, weight, bias, B, T, C, OC)
        cdef Py_ssize_t k = <Py_ssize_t>l * self.lora_num_targets + target
        if self.lora_a == NULL or self.lora_a[k] == NULL:
            return
        if self.lora_dropping:   # the update reads its input dropped, the frozen W whole
            self.table.dropout_forward(self.table.ctx, self.lora_dropped, inp, self.lora_dropout,
                                       self.lora_draw_seed, k, <Py_ssize_t>B * T * C)
            inp = self.lora_dropped
        self.table.lora_forward(self.table.ctx, out, self.lora_hidden[k], inp, self.lora_a[k],
                                self.lora_b[k], self.lora_scale, B, T, C, OC, self.lora_rank)

    cdef void linear_backward(self, int target, int l, float* dinp, float* dweight, float* dbias,
                              const float* dout, const float* inp, const float* weight, int B,
                              int T, int C, int OC) noexcept nogil:
        self.table.matmul_backward(self.table.ctx, dinp, dweight, dbias, dout, inp, weight,
                                   B, T, C, OC)
        cdef Py_ssize_t k = <Py_ssize_t>l * self.lora_num_targets + target
        cdef Py_ssize_t n = <Py_ssize_t>B * T * C
        if self.lora_a == NULL or self.lora_a[k] == NULL:
            return
        if not self.lora_dropping:
            self.table.lora_backward(self.table.ctx, dinp, self.lora_da[k], self.lora_db[k],
                                     self.lora_dhidden, dout, inp, self.lora_hidden[k],
                                     self.lora_a[k], self.lora_b[k], self.lora_scale, B, T, C,
                                     OC, self.lora_rank)
            return
        # the forward's dropped input drawn again (for dA), the update's gradient of it into
        # scratch, then through the same mask into dinp
        self.table.dropout_forward(self.table.ctx, self.lora_dropped, inp, self.lora_dropout,
                                   self.lora_draw_seed, k, n)
        self.table.zero(self.table.ctx, self.lora_ddropped, n * self.itemsize)
        self.table.lora_backward(self.table.ctx, self.lora_ddropped, self.lora_da[k],
                                 self.lora_db[k], self.lora_dhidden, dout, self.lora_dropped,
                                 self.lora_hidden[k], self.lora_a[k], self.lora_b[k],
                                 self.lora_scale, B, T, C, OC, self.lora_rank)
        self.table.dropout_backward(self.table.ctx, dinp, self.lora_ddropped, self.lora_dropout,
                                    self.lora_draw_seed, k, n)

    # --- forward ---------------------------------------------------------------------------

    def _batch(self, tokens, what, bint masked=False, bint packed=False):
        """tokens as a contiguous int32 (B, T), checked; masked: targets, where -1 marks a
        position not scored; packed: texts end to end (forward_segments), of any length."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1:
            raise ValueError(f"{what} must have shape (B, T), got {tokens.shape}")
        if tokens.shape[1] > self.config.max_seq_len and not packed:
            raise ValueError(f"{what}: sequence length {tokens.shape[1]} exceeds the model's "
                             f"max_seq_len {self.config.max_seq_len}")
        if tokens.min() < (-1 if masked else 0) or tokens.max() >= self.config.vocab_size:
            raise ValueError(f"{what}: token ids must be in [0, {self.config.vocab_size})"
                             f"{' or -1 (not scored)' if masked else ''}, "
                             f"got [{tokens.min()}, {tokens.max()}]")
        return tokens

    def _allocate_activations(self, int B, int T):
        embedding, layer, head = self.activation_shapes(self.config, B, T,
                                                        **self.activation_options(self.backend))
        layout = self._activation_layout(
            recompute.activation_shapes(self.recompute_plan, embedding, layer, head))
        grad_layout = self._activation_layout(recompute.gradient_shapes(layer, head, self.NO_GRAD))
        if self._acts is None or layout.nbytes > self._acts.nbytes:
            self._acts = None  # freed before its successor is allocated
            self._acts = self.backend.alloc(layout.nbytes)
        if self._grads_acts is not None and grad_layout.nbytes > self._grads_acts.nbytes:
            self._grads_acts = None  # reallocated, at this size, by the next backward
        if self._inputs is None or B * T * sizeof(int) > self._inputs.nbytes:
            self._inputs = self.backend.alloc(B * T * sizeof(int))
            self._targets = self.backend.alloc(B * T * sizeof(int))
        self.act_layout, self.act_grad_layout = layout, grad_layout
        if self.frozen:
            self._allocate_lora_hidden(B * T)
        self._tables = dict(layer=[name for name, _ in layer], head=[name for name, _ in head])
        self._point_activations()
        if self._grads_acts is not None:
            self._point_gradients()
        self.B, self.T = B, T

    def _activation_layout(self, shapes):
        """Activations (or their gradients) in the model's precision, FP32_ACTIVATIONS float32."""
        return Layout(shapes, [4 if name in self.FP32_ACTIVATIONS else self.itemsize
                               for name, _ in shapes])

    cdef void* _table(self, str name, values, dtype=np.uintp):
        """A table of pointers (or ints) in a numpy array that _tables keeps: its address."""
        array = self._tables[name] = np.ascontiguousarray(values, dtype=dtype)
        return <void*><size_t>array.ctypes.data

    def _point_activations(self):
        """The tables of where the activations are: each slot's internals, the outputs, the
        head's; every slot empty."""
        plan, layout, names = self.recompute_plan, self.act_layout, self.act_layout.names
        cdef size_t base = <size_t>self._acts.ptr

        def address(name, index=0):  # of name[index], in a stack of a layer's tensor
            i = names.index(name)
            if index == 0:   # an empty tensor's too
                return base + layout.byte_offsets[i]
            stride = layout.sizes[i] // layout.shapes[i][0]
            return base + layout.byte_offsets[i] + index * stride * layout.itemsizes[i]
        *internals, output = self._tables["layer"]
        self.L, self.layer_fields = plan.num_layers, len(internals) + 1
        self.slot_of = <const int*>self._table("slot_of", plan.slot_of, np.int32)
        self.output_of = <const int*>self._table("output_of", plan.output_of, np.int32)
        self.segment_start = <const int*>self._table("segment_start", plan.segment_start, np.int32)
        self.resident = <int*>self._table("resident", np.full(plan.slots, -1), np.int32)
        self.slot_fields = <float**>self._table(
            "slot_fields", [address(name, s) for s in range(plan.slots) for name in internals])
        self.outputs = <float**>self._table(
            "outputs", [address(output, o) for o in range(plan.outputs)])
        self.layer_acts = <float**>self._table("layer_acts", np.zeros(self.layer_fields))
        self.head_acts = <float**>self._table(
            "head_acts", [address(name) for name in self._tables["head"]])
        self.embedded = <float*>self._acts.ptr   # the layout's first tensor
        self.losses = <float*><size_t>address("losses")

    def _point_gradients(self):
        """The tables of where the activation gradients are (NULL for NO_GRAD's tensors)."""
        layout = self.act_grad_layout
        cdef size_t base = <size_t>self._grads_acts.ptr

        def address(name):
            if name not in layout.names:
                return 0
            return base + layout.byte_offsets[layout.names.index(name)]
        *internals, _ = self._tables["layer"]
        i = layout.names.index("dstream")
        stream = layout.sizes[i] // 2 * layout.itemsizes[i]   # bytes of one of the two
        self.layer_grads = <float**>self._table(  # the last, its output's, is set per layer
            "layer_grads", [address(name) for name in internals] + [0])
        self.head_grads = <float**>self._table(
            "head_grads", [address(name) for name in self._tables["head"]])
        self.dstream = <float**>self._table(
            "dstream", [address("dstream"), address("dstream") + stream])
        self.dlosses = <float*><size_t>address("losses")
        # the three regions zeroed apart: the head's gradients, one layer's, each stream's
        layer_start = min(address(name) for name in internals if name in layout.names)
        self.grads_acts_head = <float*>self._grads_acts.ptr
        self.head_grad_bytes = layer_start - base
        self.layer_grads_base = <float*><size_t>layer_start
        self.layer_grad_bytes = address("dstream") - layer_start
        self.stream_bytes = stream

    def forward(self, inputs, targets=None, bint training=False):
        """Run the model on inputs (B, T) token ids.  With targets (B, T), also the loss:
        returns the mean cross-entropy over the positions whose target is not -1 (not scored:
        transformers' -100), else None.  Logits and probs stay in activations().  training: a
        forward that a backward and an update follow, the one that LoRA's dropout applies to
        (its masks drawn anew: the step's first training forward, its second, ...)."""
        inputs = self._batch(inputs, "inputs")
        if targets is not None:
            targets = self._batch(targets, "targets", masked=True)
            if targets.shape != inputs.shape:
                raise ValueError(f"targets shape {targets.shape} != inputs shape {inputs.shape}")
        cdef int B = inputs.shape[0], T = inputs.shape[1]
        if (B, T) != (self.B, self.T):
            self._allocate_activations(B, T)
        self._inputs.load(inputs)
        self.has_targets = targets is not None
        if self.has_targets:
            self._targets.load(targets)
            self.scored = np.count_nonzero(targets >= 0)
        self.lora_dropping = training and self.frozen and self.lora_dropout > 0
        if self.lora_dropping:
            if self.step != self.lora_draw_step:   # an update since: the step's first draw
                self.lora_draw_step, self.lora_draws = self.step, 0
            self.lora_draw_seed = <int>mask_key(mask_key(self.lora_seed, self.step),
                                                self.lora_draws)
            self.lora_draws += 1
        cdef const int* inp = ints(self._inputs)
        cdef const int* tgt = ints(self._targets) if self.has_targets else NULL
        with nogil:
            self._forward_pass(inp, tgt, B, T)
            if tgt != NULL:
                self.mean_loss = self.table.mean(self.table.ctx, self.losses, <Py_ssize_t>B * T)
        self.backend.check_error()
        if not self.has_targets:
            return None
        # the masked positions' losses are 0, so the mean over all B*T, rescaled, is the mean
        # over the scored ones.  None scored: 0.0, not PyTorch's nan (0/0): such a batch (a
        # prompt without its answer in fine-tuning) carries no signal, and its loss adds nothing
        # to an average, nor breaks the logged curve or the outlier z-scores
        return float(self.mean_loss) * (B * T) / self.scored if self.scored > 0 else 0.0

    # --- generation with a KV cache ------------------------------------------------------

    @property
    def has_kv_cache(self):
        """Whether generation can keep a KV cache here: the backend fills accel/spec.py's
        "cache" group (else each new token is a forward over the whole text)."""
        return self.backend.supports("cache")

    def start_cache(self, int capacity):
        """An empty KV cache for a text of up to capacity positions: forward_cached then runs
        the text's positions from the first."""
        if not self.has_kv_cache:
            raise RuntimeError(f"backend {self.backend.name} has no KV cache (accel/spec.py's "
                               f"cache group)")
        if not 1 <= capacity <= self.config.max_seq_len:
            raise ValueError(f"a KV cache of {capacity} positions: must be in 1.."
                             f"{self.config.max_seq_len}, the model's max_seq_len")
        width, _ = self.kv_shape(self.config)
        cdef size_t nbytes = (<size_t>self.num_layers_of(self.config) * 2 * capacity * width *
                              self.itemsize)
        if self._kv_cache is None or self._kv_cache.nbytes < nbytes:
            self._kv_cache = None   # freed before its successor is allocated
            self._kv_cache = self.backend.alloc(nbytes)
        self.kv_capacity, self.kv_width, self.kv_positions = capacity, width, 0

    def rewind_cache(self, int positions):
        """Keep only the first positions of the cache: forward_cached goes on from there (a
        chat whose rendered text differs from what the cache saw after that point)."""
        if not 0 <= positions <= self.kv_positions:
            raise ValueError(f"rewind_cache({positions}): the cache holds {self.kv_positions} "
                             f"positions")
        self.kv_positions = positions

    def forward_cached(self, tokens):
        """The logits (V,) that follow tokens, the text's next positions after the cached ones
        (the prompt, a generated token, a chat's next turn): their keys and values go into the
        cache, and each attends over the positions before it there. The head runs on the last
        position only. Runs chunks of at most CACHE_CHUNK positions (the attention's scratch
        grows with the chunk times the text)."""
        tokens = self._batch(np.asarray(tokens, dtype=np.int32).reshape(1, -1), "tokens")
        cdef int n = tokens.shape[1], T, start
        if self.kv_capacity == 0:
            raise RuntimeError("forward_cached needs a cache: start_cache first")
        if self.kv_positions + n > self.kv_capacity:
            raise ValueError(f"{n} more positions after {self.kv_positions} do not fit the KV "
                             f"cache of {self.kv_capacity}")
        for start in range(0, n, CACHE_CHUNK):
            chunk = tokens[:, start:start + CACHE_CHUNK]
            T = chunk.shape[1]
            # a chunk before the last: no head
            self._run_segments(chunk, [(0, T, self.kv_positions)], T - 1 if start + T == n else T)
            self.kv_positions += T
        return self.logits[0, 0, :self.config.vocab_size]

    def forward_segments(self, tokens, segments, int head_from, targets):
        """The losses (n - head_from,) float32 of positions head_from.. of tokens (n,), texts
        packed in one row that share their beginnings through the KV cache: segments (rows from,
        length, position) run in order, each the positions position.. of a text whose first
        `position` positions the cache holds, written by the segments before it (a shared
        context, then each continuation of it in turn; position 0 starts a text). The rows
        head_from.. are scored against targets (n - head_from,), the head computed on them
        alone. A segment longer than CACHE_CHUNK runs as several. The cache is left empty."""
        tokens = self._batch(np.asarray(tokens, dtype=np.int32).reshape(1, -1), "tokens",
                             packed=True)
        cdef int n = tokens.shape[1]
        targets = np.asarray(targets, dtype=np.int32)
        if not 0 <= head_from < n or targets.shape != (n - head_from,):
            raise ValueError(f"head from row {head_from} of {n}: targets of shape "
                             f"{targets.shape}, not ({n - head_from},)")
        pieces = []
        for row, length, position in segments:
            if length < 1 or row < 0 or row + length > n or position < 0:
                raise ValueError(f"segment {(row, length, position)}: not within the {n} rows")
            if position + length > self.config.max_seq_len:
                raise ValueError(f"segment {(row, length, position)}: its positions run past "
                                 f"the model's max_seq_len {self.config.max_seq_len}")
            for start in range(0, length, CACHE_CHUNK):
                pieces.append((row + start, min(CACHE_CHUNK, length - start), position + start))
        capacity = max(position + length for _, length, position in pieces)
        self.start_cache(capacity)
        self._run_segments(tokens, pieces, head_from,
                           self._batch(targets.reshape(1, -1), "targets", packed=True))
        return self.activation("losses")[0, :n - head_from].copy()

    def _run_segments(self, tokens, segments, int head_from, targets=None):
        """One forward over tokens (1, n) as segments (see kv_caching in model.pxd), the head
        on rows head_from.. (none where head_from is n), with targets (1, n - head_from)."""
        cdef int n = tokens.shape[1]
        if (1, n) != (self.B, self.T):
            self._allocate_activations(1, n)
        self._segments = np.ascontiguousarray(segments, dtype=np.int32).reshape(-1, 3)
        cdef const int[:, ::1] rows = self._segments
        self.segments, self.num_segments = &rows[0, 0], rows.shape[0]
        _, heads = self.kv_shape(self.config)
        cdef size_t score_bytes = max(heads * int(length) * int(position + length)
                                      for _, length, position in segments) * self.itemsize
        if self._kv_scores is None or self._kv_scores.nbytes < score_bytes:
            self._kv_scores = None
            self._kv_scores = self.backend.alloc(score_bytes)
            self.kv_scores = floats(self._kv_scores)
        self._inputs.load(tokens)
        self.has_targets = targets is not None
        if self.has_targets:
            self._targets.load(np.pad(targets, ((0, 0), (head_from, 0)), constant_values=-1))
        self.lora_dropping = False
        cdef const int* inp = ints(self._inputs)
        cdef const int* tgt = ints(self._targets) + head_from if self.has_targets else NULL
        cdef Py_ssize_t C = self.act_layout.shapes[0][2]   # the stream's (B, T, C): C
        with nogil:
            self.kv_caching = True
            self._forward_segments(inp, tgt, n, head_from, C)
            self.kv_caching = False
        self.backend.check_error()

    cdef void _forward_segments(self, const int* inputs, const int* targets, int n,
                                int head_from, Py_ssize_t C) noexcept nogil:
        """_run_segments' forward: the embedding of each segment at its position, the layers,
        and the head on rows head_from .. n-1 of the last layer's output (streams of C)."""
        cdef int l, s
        self.table.mark(self.table.ctx, self.step, -1)
        for s in range(self.num_segments):
            self.position = self.segment_position(s)
            self.embedding_forward(self.at(self.embedded, self.segment_row(s) * C),
                                   inputs + self.segment_row(s), 1, self.segment_length(s))
        self.position = 0
        for l in range(self.L):
            self._run_layer_forward(l, 1, n)
        if head_from == n:
            return
        self.table.mark(self.table.ctx, self.step, -1)
        self.head_forward(self.head_acts, self.at(self._layer_input(self.L), head_from * C),
                          targets, 1, n - head_from)

    cdef void _point_layer(self, int l) noexcept nogil:
        """layer_acts = layer l's activations: its slot's internals, then its output."""
        cdef int i, n = self.layer_fields - 1
        cdef float** slot = self.slot_fields + <Py_ssize_t>self.slot_of[l] * n
        for i in range(n):
            self.layer_acts[i] = slot[i]
        self.layer_acts[n] = self.outputs[self.output_of[l]]

    cdef const float* _layer_input(self, int l) noexcept nogil:
        """The residual stream into layer l: the embedding's output or layer l-1's."""
        return self.embedded if l == 0 else self.outputs[self.output_of[l - 1]]

    cdef void _run_layer_forward(self, int l, int B, int T) noexcept nogil:
        self.table.mark(self.table.ctx, self.step, l)
        self._point_layer(l)
        self.layer_forward(l, self.layer_acts, self._layer_input(l), B, T)
        self.resident[self.slot_of[l]] = l

    cdef void _forward_pass(self, const int* inputs, const int* targets, int B, int T) noexcept nogil:
        cdef int l
        self.table.mark(self.table.ctx, self.step, -1)
        self.embedding_forward(self.embedded, inputs, B, T)
        for l in range(self.L):
            self._run_layer_forward(l, B, T)
        self.table.mark(self.table.ctx, self.step, -1)
        self.head_forward(self.head_acts, self._layer_input(self.L), targets, B, T)

    # --- backward --------------------------------------------------------------------------

    def zero_grad(self):
        """Set the parameter gradients to zero (backward adds to them)."""
        self._ensure_grads()
        cdef Buffer buffer = self._trained_grads()
        cdef void* grads = buffer.ptr
        cdef size_t nbytes = buffer.nbytes
        with nogil:
            self.table.zero(self.table.ctx, grads, nbytes)
        self.backend.check_error()

    def backward(self, scored_in_step=None):
        """Add the gradient of the last forward's mean loss to grads (needs targets).  With
        scored_in_step, of its scored positions' summed loss divided by scored_in_step instead:
        micro-batches that score different numbers of positions, each given their step's total,
        add up to the gradient of the step's mean over all its scored positions (transformers'
        num_items_in_batch; finetune.py's gradient accumulation)."""
        if not self.has_targets:
            raise RuntimeError("backward needs a forward pass with targets")
        cdef Py_ssize_t denominator = self.scored if scored_in_step is None else scored_in_step
        if denominator < self.scored:
            raise ValueError(f"scored_in_step {scored_in_step}: fewer than the "
                             f"{self.scored} positions this batch scores")
        # the loss is a mean over the scored positions (times the loss scale: fp16), divided
        # float by Py_ssize_t as C does
        cdef float dloss = self.loss_scale / denominator if denominator > 0 else 0.0
        self._ensure_grads()
        if self._grads_acts is None:
            self._grads_acts = self._lazy(None, self.act_grad_layout)
            self._point_gradients()
        cdef const int* inp = ints(self._inputs)
        cdef const int* tgt = ints(self._targets)
        with nogil:
            self._backward_pass(inp, tgt, self.B, self.T, dloss)
        self.backend.check_error()

    cdef void _backward_pass(self, const int* inputs, const int* targets, int B, int T,
                             float dloss) noexcept nogil:
        """The head's backward, dloss the loss's gradient at each scored position, then each
        layer's from the last (first recomputing, from its segment's stored input, a layer whose
        internals are no longer in its slot), then the embedding's.  Activation gradients are
        added into, so each starts at zero; dstream[b % 2] is the gradient of the stream at
        boundary b (into layer b)."""
        cdef void* ctx = self.table.ctx
        cdef Py_ssize_t BT = <Py_ssize_t>B * T
        cdef int j, l, L = self.L, n = self.layer_fields - 1
        if self.scored == 0:   # no position scored: a loss of 0, nothing to add
            return
        self.table.mark(ctx, self.step, -1)
        self.table.zero(ctx, self.grads_acts_head, self.head_grad_bytes)
        # the masked positions' dlosses are never read (their rows of dlogits get nothing)
        self.table.fill(ctx, self.dlosses, dloss, BT)
        self.table.zero(ctx, self.dstream[L % 2], self.stream_bytes)
        self.head_backward(self.dstream[L % 2], self.head_grads, self.head_acts,
                           self._layer_input(L), targets, B, T)
        for l in range(L - 1, -1, -1):
            if self.resident[self.slot_of[l]] != l:
                for j in range(self.segment_start[l], l + 1):
                    self._run_layer_forward(j, B, T)
            self.table.mark(ctx, self.step, l)
            self._point_layer(l)
            self.layer_grads[n] = self.dstream[(l + 1) % 2]   # the gradient of its output
            self.table.zero(ctx, self.layer_grads_base, self.layer_grad_bytes)
            self.table.zero(ctx, self.dstream[l % 2], self.stream_bytes)
            self.layer_backward(l, self.dstream[l % 2], self.layer_grads, self.layer_acts,
                                self._layer_input(l), B, T)
        if self.lora_a == NULL:   # the embedding trains: not frozen under LoRA
            self.table.mark(ctx, self.step, -1)
            self.embedding_backward(self.dstream[0], inputs, B, T)

    # --- optimizer -------------------------------------------------------------------------

    def grad_norm(self, bint shard_only=False):
        """Global L2 norm of all parameter gradients (of the loss: the loss scale divided out);
        with shard_only, of the optimizer shard's alone (ZeRO-1: the other processes hold the
        rest, reduced).  Not finite where a gradient is not (fp16: an overflow)."""
        self._ensure_grads()
        cdef const float* grads = floats(self._trained_grads())
        cdef Py_ssize_t n = self.num_trained
        if shard_only:
            grads = self.grad_at(grads, self.shard_start)
            n = self.shard_end - self.shard_start
        cdef double norm_squared
        with nogil:
            norm_squared = self.table.global_norm_squared(self.table.ctx, grads, n)
        self.backend.check_error()
        return sqrt(norm_squared) / self.loss_scale

    def gradients_overflowed(self, double grad_norm):
        """Whether a step's gradients, of this grad_norm, overflowed fp16 (not finite): its
        update is to be skipped (elsewhere never: fp32 and bf16 do not scale their loss)."""
        return self.precision == "fp16" and not isfinite(grad_norm)

    def adjust_loss_scale(self, bint finite):
        """After a step's gradients (fp16's dynamic loss scaling; elsewhere nothing): not
        finite, the scale halves (the caller skips the update); LOSS_SCALE_GROWTH_STEPS finite
        ones in a row, it doubles.  Returns whether the scale changed."""
        if self.precision != "fp16":
            return False
        cdef float before = self.loss_scale
        if not finite:
            self.loss_scale = max(self.loss_scale / 2, 1.0)
            self.loss_scale_steps = 0
        else:
            self.loss_scale_steps += 1
            if self.loss_scale_steps >= LOSS_SCALE_GROWTH_STEPS:
                self.loss_scale = min(self.loss_scale * 2, LOSS_SCALE_MAX)
                self.loss_scale_steps = 0
        return self.loss_scale != before

    def set_loss_scale(self, float scale, int steps=0):
        """Set the loss scale (a power of two; a resume, tests) and the finite steps since it
        last changed."""
        if self.precision != "fp16" and scale != 1.0:
            raise ValueError(f"a {self.precision} model has no loss scale (fp16 has)")
        if not (scale >= 1.0 and isfinite(scale)):
            raise ValueError(f"the loss scale must be a finite power of two >= 1, got {scale}")
        self.loss_scale, self.loss_scale_steps = scale, steps

    def _decay_spans(self, bint decay_2d_only):
        """[(start, size, decayed)]: runs of neighbouring tensors that share their decay (LoRA's
        updates: one run of matrices)."""
        cdef bint decayed
        if self.frozen:
            return [(0, self.lora_layout.size, True)]
        spans = []
        for name, start, size in zip(self.param_layout.names, self.param_layout.offsets,
                                     self.param_layout.sizes):
            decayed = not decay_2d_only or name in self.MATRICES
            # compared as C ints: an object comparison inlines CPython's bytes paths, and GCC
            # warns (-Warray-bounds) about them applied to True and False
            if spans and <bint>spans[len(spans) - 1][2] == decayed:
                last_start, last_size, _ = spans.pop()
                start, size = last_start, last_size + size
            spans.append((start, size, decayed))
        return spans

    def update(self, float lr, float beta1, float beta2, float eps, float weight_decay, int t,
               float grad_scale=1.0, bint decay_2d_only=False):
        """One AdamW step (t counts from 1) on grads * grad_scale / loss_scale, of the
        parameters in the optimizer shard (all unless sharded).  Weight decay applies to every tensor, as llm.c's
        train_gpt2.c, or with decay_2d_only to MATRICES alone, as llm.c's CUDA trainer."""
        if t < 1:
            raise ValueError(f"the AdamW step t counts from 1, got {t}")
        if not (self.trainable or self.frozen):
            raise RuntimeError("update: the model was made with trainable=False (for inference "
                               "or a LoRA base: no master weights), so only LoRA trains it")
        grad_scale /= self.loss_scale   # exact: a power of two
        self._ensure_grads()
        self._m = self._moments(self._m)
        self._v = self._moments(self._v)
        # at bf16 AdamW updates the master weights and rounds each into the bf16 ones, seeded
        # by t (as round_params(t) would), in the same pass; without master weights the bf16
        # ones themselves, rounded alike
        cdef bint mixed = self._master is not None   # (never under LoRA: attach_lora drops it)
        cdef bint narrow = not mixed and not self.frozen and self.precision != "fp32"
        cdef float* params = floats(self._lora if self.frozen else
                                    self._master if mixed else self._params)
        cdef float* rounded = floats(self._params)
        cdef float* grads = floats(self._trained_grads())
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
                if narrow:
                    self.table.adamw_update_narrow(
                        self.table.ctx, self.at(rounded, start), m + (start - self.shard_start),
                        v + (start - self.shard_start), self.grad_at(grads, start), end - start,
                        lr, beta1, beta2, eps, decay, grad_scale, t, start)
                elif mixed:
                    self.table.adamw_update_rounded(
                        self.table.ctx, self.at(rounded, start), params + start,
                        m + (start - self.shard_start), v + (start - self.shard_start),
                        self.grad_at(grads, start), end - start, lr, beta1, beta2, eps, decay,
                        grad_scale, t, start)
                else:
                    self.table.adamw_update(self.table.ctx, params + start, m + (start - self.shard_start),
                                        v + (start - self.shard_start), grads + start, end - start,
                                        lr, beta1, beta2, eps, decay, grad_scale, t)
        self.step = t
        self.backend.check_error()
