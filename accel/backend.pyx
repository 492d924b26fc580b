"""
Backends: the registry by name, the Backend object that holds a table (accel/backend.pxd), and
Buffer, memory allocated through one.

    get_backend("cpu")            the Cython kernels of kernels/ on this machine
    get_backend("check:cpu")      every call run on cpu and on the CPU oracle, and compared
    get_backend("profile:cpu")    every call timed
    backend_names()               what can be asked for, and why a name is unavailable here

A backend module (accel/cpu.pyx, later accel/hip, accel/metal, ...) has a function `create()`
that returns a Backend over its table; `register_backend` adds it under a name.  The table is
validated when the Backend is made: a missing entry is refused, by name.
"""
import importlib.util
import os
import sys

import accel.hip as _hip

import numpy as np

cimport cython
from cpython.buffer cimport PyBUF_WRITABLE
from libc.stdint cimport uintptr_t

__all__ = ["Backend", "BackendError", "Buffer", "backend_names", "get_backend",
           "register_backend", "ENTRY_GROUPS"]


class BackendError(RuntimeError):
    """A backend that cannot be had or cannot serve a model; the message is one line."""


# ----------------------------------------------------------------------------
# the table's entries, by group (the order of accel/backend.pxd)

cdef list missing_entries(BackendTable* t, tuple groups):
    """The names of the entries of these groups that t leaves NULL."""
    entries = [
        ("core", "alloc", t.alloc != NULL),
        ("core", "free", t.free != NULL),
        ("core", "zero", t.zero != NULL),
        ("core", "copy_to_backend", t.copy_to_backend != NULL),
        ("core", "copy_to_host", t.copy_to_host != NULL),
        ("core", "synchronize", t.synchronize != NULL),
        ("core", "last_error", t.last_error != NULL),
        ("core", "mark", t.mark != NULL),
        ("core", "fill", t.fill != NULL),
        ("core", "mean", t.mean != NULL),
        ("core", "adamw_update", t.adamw_update != NULL),
        ("core", "global_norm_squared", t.global_norm_squared != NULL),
        ("gpt2", "encoder_forward", t.encoder_forward != NULL),
        ("gpt2", "encoder_backward", t.encoder_backward != NULL),
        ("gpt2", "layernorm_forward", t.layernorm_forward != NULL),
        ("gpt2", "layernorm_backward", t.layernorm_backward != NULL),
        ("gpt2", "matmul_forward", t.matmul_forward != NULL),
        ("gpt2", "matmul_backward", t.matmul_backward != NULL),
        ("gpt2", "attention_forward", t.attention_forward != NULL),
        ("gpt2", "attention_backward", t.attention_backward != NULL),
        ("gpt2", "gelu_forward", t.gelu_forward != NULL),
        ("gpt2", "gelu_backward", t.gelu_backward != NULL),
        ("gpt2", "residual_forward", t.residual_forward != NULL),
        ("gpt2", "residual_backward", t.residual_backward != NULL),
        ("gpt2", "softmax_forward", t.softmax_forward != NULL),
        ("gpt2", "crossentropy_forward", t.crossentropy_forward != NULL),
        ("gpt2", "crossentropy_softmax_backward", t.crossentropy_softmax_backward != NULL),
        ("llama", "embedding_forward", t.embedding_forward != NULL),
        ("llama", "embedding_backward", t.embedding_backward != NULL),
        ("llama", "rmsnorm_forward", t.rmsnorm_forward != NULL),
        ("llama", "rmsnorm_backward", t.rmsnorm_backward != NULL),
        ("llama", "rope_forward", t.rope_forward != NULL),
        ("llama", "rope_backward", t.rope_backward != NULL),
        ("llama", "swiglu_forward", t.swiglu_forward != NULL),
        ("llama", "swiglu_backward", t.swiglu_backward != NULL),
        ("llama", "attention_gqa_forward", t.attention_gqa_forward != NULL),
        ("llama", "attention_gqa_backward", t.attention_gqa_backward != NULL),
        ("llama", "classifier_forward", t.classifier_forward != NULL),
        ("llama", "classifier_backward", t.classifier_backward != NULL),
        ("flash", "flash_attention_forward", t.flash_attention_forward != NULL),
        ("flash", "flash_attention_backward", t.flash_attention_backward != NULL),
    ]
    return [name for group, name, present in entries if group in groups and not present]


cdef BackendTable _empty_table
ENTRY_GROUPS = {group: missing_entries(&_empty_table, (group,))
                for group in ("core", "gpt2", "llama", "flash")}
# the groups a model family runs on, where it is more than its own: Llama's projections and
# residual connections are gpt2's entries (matmul without bias, residual)
FAMILY_GROUPS = {"llama": ("gpt2", "llama")}


def family_groups(tuple families):
    """The entry groups a backend running these model families must fill, core first."""
    groups = ["core"]
    for family in families:
        groups += [g for g in FAMILY_GROUPS.get(family, (family,)) if g not in groups]
    return tuple(groups)


# Teardown: who owns what, and the order it goes in.  A Buffer holds its Backend; a Backend
# holds `keepalive`, the owner of its ctx (a HIP device context, a Metal runtime, the backends a
# wrapper calls); the libraries their code is in (BLAS, HIP and Metal builds) are never unloaded,
# and their thread pools end with the process.  So reference counting frees every buffer before
# its backend, and a backend before its context.  The cyclic collector could break that chain:
# when a model is garbage in a reference cycle (a kept exception whose traceback holds the frame
# that holds the model), it calls tp_clear on the cycle's objects in an order of its own, and
# Cython's tp_clear would set a live Buffer's backend, or a live Backend's keepalive, to None.
# no_gc_clear keeps them (here and on InstrumentedBackend); the collector breaks the cycle at
# the objects around them (a frame, a list, a Model), whose clearing frees them in that order.

@cython.no_gc_clear
cdef class Backend:
    """A context and its table.  Made by a backend module's create(), checked on the spot."""

    def __init__(self, str name, bint host_visible, tuple families, keepalive=None):
        self.name = name
        self.host_visible = host_visible
        self.families = families
        self.keepalive = keepalive

    cdef void validate(self) except *:
        """Refuse a table that lacks an entry of the core or of a family it claims."""
        unknown = [f for f in self.families if f not in ENTRY_GROUPS]
        if unknown:
            raise BackendError(f"backend '{self.name}': unknown model family {unknown[0]!r} "
                               f"(known: {', '.join(g for g in ENTRY_GROUPS if g != 'core')})")
        missing = missing_entries(&self.table, family_groups(self.families))
        if missing:
            raise BackendError(f"backend '{self.name}': its table has no entry '{missing[0]}'"
                               + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""))

    def _without_entry(self, str entry):
        """A copy of this backend with one entry left out (tests of the validation); raises
        BackendError as a backend module's create() would."""
        names = [name for group in ENTRY_GROUPS.values() for name in group]   # the table's order
        assert sizeof(BackendTable) == (1 + len(names)) * sizeof(void*)
        cdef Backend copy = Backend(self.name, self.host_visible, self.families, self)
        copy.table = self.table
        (<void**>&copy.table.alloc)[names.index(entry)] = NULL
        copy.validate()
        return copy

    def _with_families(self, tuple families):
        """A copy of this backend claiming only these model families (tests of
        Model's refusal of a backend without its family)."""
        cdef Backend copy = Backend(self.name, self.host_visible, families, self)
        copy.table = self.table
        copy.validate()
        return copy

    def supports(self, str family):
        return family in self.families

    def require(self, str family):
        """Raise BackendError unless this backend has the kernels of this model family."""
        if family not in self.families:
            raise BackendError(f"backend '{self.name}' has no {family} kernels (it runs: "
                               f"{', '.join(self.families) or 'no model'})")

    def alloc(self, Py_ssize_t nbytes):
        """A zeroed Buffer of nbytes on this backend."""
        return Buffer(self, nbytes)

    def synchronize(self):
        with nogil:
            self.table.synchronize(self.table.ctx)

    def check_error(self):
        """Raise BackendError with the backend's message if a call since the last check failed."""
        cdef const char* message = self.table.last_error(self.table.ctx)
        if message != NULL:
            raise BackendError(f"backend '{self.name}': {message.decode(errors='replace')}")

    def call(self, str entry, *args):
        """Run one entry of the table from Python (tests, dev/ab.py): a Buffer or None for each
        pointer, numbers for the rest, in the entry's order without ctx.  Returns what the entry
        returns (mean, global_norm_squared), else None."""
        cdef BackendTable* t = &self.table
        cdef void* c = t.ctx
        for group, names in ENTRY_GROUPS.items():
            if group != "core" and entry in names:
                self.require(group)   # its entries may be NULL
        a = args
        try:
            if entry == "fill":
                t.fill(c, f(a[0]), a[1], a[2])
            elif entry == "mean":
                return t.mean(c, f(a[0]), a[1])
            elif entry == "adamw_update":
                t.adamw_update(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), a[4], a[5], a[6], a[7], a[8],
                               a[9], a[10], a[11])
            elif entry == "global_norm_squared":
                return t.global_norm_squared(c, f(a[0]), a[1])
            elif entry == "encoder_forward":
                t.encoder_forward(c, f(a[0]), i(a[1]), f(a[2]), f(a[3]), a[4], a[5], a[6])
            elif entry == "encoder_backward":
                t.encoder_backward(c, f(a[0]), f(a[1]), f(a[2]), i(a[3]), a[4], a[5], a[6], a[7])
            elif entry == "layernorm_forward":
                t.layernorm_forward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), f(a[4]), f(a[5]),
                                    a[6], a[7], a[8])
            elif entry == "layernorm_backward":
                t.layernorm_backward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), f(a[4]), f(a[5]),
                                     f(a[6]), f(a[7]), a[8], a[9], a[10])
            elif entry == "matmul_forward":
                t.matmul_forward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), a[4], a[5], a[6], a[7])
            elif entry == "matmul_backward":
                t.matmul_backward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), f(a[4]), f(a[5]),
                                  a[6], a[7], a[8], a[9])
            elif entry == "attention_forward":
                t.attention_forward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), a[4], a[5], a[6], a[7])
            elif entry == "attention_backward":
                t.attention_backward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), f(a[4]), f(a[5]),
                                     a[6], a[7], a[8], a[9])
            elif entry == "gelu_forward":
                t.gelu_forward(c, f(a[0]), f(a[1]), a[2])
            elif entry == "gelu_backward":
                t.gelu_backward(c, f(a[0]), f(a[1]), f(a[2]), a[3])
            elif entry == "residual_forward":
                t.residual_forward(c, f(a[0]), f(a[1]), f(a[2]), a[3])
            elif entry == "residual_backward":
                t.residual_backward(c, f(a[0]), f(a[1]), f(a[2]), a[3])
            elif entry == "softmax_forward":
                t.softmax_forward(c, f(a[0]), f(a[1]), a[2], a[3], a[4], a[5])
            elif entry == "crossentropy_forward":
                t.crossentropy_forward(c, f(a[0]), f(a[1]), i(a[2]), a[3], a[4], a[5])
            elif entry == "crossentropy_softmax_backward":
                t.crossentropy_softmax_backward(c, f(a[0]), f(a[1]), f(a[2]), i(a[3]), a[4], a[5],
                                                a[6], a[7])
            elif entry == "embedding_forward":
                t.embedding_forward(c, f(a[0]), i(a[1]), f(a[2]), a[3], a[4], a[5])
            elif entry == "embedding_backward":
                t.embedding_backward(c, f(a[0]), f(a[1]), i(a[2]), a[3], a[4], a[5], a[6])
            elif entry == "rmsnorm_forward":
                t.rmsnorm_forward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), a[4], a[5], a[6], a[7])
            elif entry == "rmsnorm_backward":
                t.rmsnorm_backward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), f(a[4]), f(a[5]),
                                   a[6], a[7], a[8])
            elif entry == "rope_forward":
                t.rope_forward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), a[4], a[5], a[6], a[7])
            elif entry == "rope_backward":
                t.rope_backward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), a[4], a[5], a[6], a[7])
            elif entry == "swiglu_forward":
                t.swiglu_forward(c, f(a[0]), f(a[1]), f(a[2]), a[3])
            elif entry == "swiglu_backward":
                t.swiglu_backward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), f(a[4]), a[5])
            elif entry == "attention_gqa_forward":
                t.attention_gqa_forward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), f(a[4]),
                                        a[5], a[6], a[7], a[8], a[9])
            elif entry == "attention_gqa_backward":
                t.attention_gqa_backward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), f(a[4]), f(a[5]),
                                         f(a[6]), f(a[7]), a[8], a[9], a[10], a[11], a[12])
            elif entry == "classifier_forward":
                t.classifier_forward(c, f(a[0]), f(a[1]), f(a[2]), i(a[3]), a[4], a[5], a[6])
            elif entry == "classifier_backward":
                t.classifier_backward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), i(a[4]), a[5], a[6],
                                      a[7])
            elif entry == "flash_attention_forward":
                t.flash_attention_forward(c, f(a[0]), f(a[1]), f(a[2]), a[3], a[4], a[5], a[6])
            elif entry == "flash_attention_backward":
                t.flash_attention_backward(c, f(a[0]), f(a[1]), f(a[2]), f(a[3]), f(a[4]), a[5],
                                           a[6], a[7], a[8])
            else:
                raise ValueError(f"no kernel entry {entry!r} (memory goes through Buffer)")
        except IndexError:
            raise TypeError(f"{entry}: too few arguments ({len(args)})") from None
        self.check_error()

    def __repr__(self):
        return f"<Backend {self.name}>"


cdef float* f(buffer) except? NULL:
    return NULL if buffer is None else <float*>(<Buffer?>buffer).ptr


cdef int* i(buffer) except? NULL:
    return NULL if buffer is None else <int*>(<Buffer?>buffer).ptr


@cython.no_gc_clear   # __dealloc__ frees through self.backend (see Teardown above)
cdef class Buffer:
    """nbytes of a backend's memory, zeroed at allocation, freed when the Buffer goes.
    Host-visible backends export it through the buffer protocol (zero-copy NumPy views)."""

    def __cinit__(self, Backend backend, Py_ssize_t nbytes):
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        self.backend = backend
        self.nbytes = max(nbytes, 1)
        with nogil:
            self.ptr = backend.table.alloc(backend.table.ctx, self.nbytes)
        if self.ptr == NULL:
            raise MemoryError(f"backend '{backend.name}' could not allocate {nbytes:,} bytes")
        self.shape[0] = self.nbytes

    def __dealloc__(self):
        if self.ptr != NULL:
            self.backend.table.free(self.backend.table.ctx, self.ptr, self.nbytes)

    @property
    def address(self):
        return <uintptr_t>self.ptr

    def __getbuffer__(self, Py_buffer* view, int flags):
        if not self.backend.host_visible:
            raise BufferError(f"backend '{self.backend.name}' memory is not host-visible: "
                              f"copy it with to_numpy()")
        view.buf = self.ptr
        view.obj = self
        view.len = self.nbytes
        view.readonly = 0
        view.itemsize = 1
        view.format = "B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = &view.itemsize
        view.suboffsets = NULL
        view.internal = NULL

    def view(self, dtype=np.float32, Py_ssize_t offset=0, count=-1):
        """A zero-copy NumPy array over the buffer (host-visible backends only)."""
        return np.frombuffer(self, dtype=dtype, count=count, offset=offset)

    def to_numpy(self, dtype=np.float32, Py_ssize_t offset=0, Py_ssize_t count=-1):
        """A host copy of count elements from byte offset (all of the rest with -1)."""
        dtype = np.dtype(dtype)
        if count < 0:
            count = (<Py_ssize_t>self.nbytes - offset) // dtype.itemsize
        self._check_range(offset, count * dtype.itemsize)
        out = np.empty(count, dtype=dtype)
        cdef char[::1] dst = out.view(np.int8) if count else None
        cdef size_t nbytes = out.nbytes
        if nbytes:
            with nogil:
                self.backend.table.copy_to_host(self.backend.table.ctx, &dst[0],
                                                <char*>self.ptr + offset, nbytes)
        return out

    def load(self, array, Py_ssize_t offset=0):
        """Copy a host array into the buffer at byte offset."""
        array = np.ascontiguousarray(array)
        self._check_range(offset, array.nbytes)
        cdef const char[::1] src = array.reshape(-1).view(np.int8) if array.nbytes else None
        cdef size_t nbytes = array.nbytes
        if nbytes:
            with nogil:
                self.backend.table.copy_to_backend(self.backend.table.ctx, <char*>self.ptr + offset,
                                                   &src[0], nbytes)

    def zero(self):
        with nogil:
            self.backend.table.zero(self.backend.table.ctx, self.ptr, self.nbytes)

    def _check_range(self, Py_ssize_t offset, Py_ssize_t nbytes):
        if offset < 0 or offset + nbytes > <Py_ssize_t>self.nbytes:
            raise ValueError(f"bytes [{offset}, {offset + nbytes}) are outside a buffer of "
                             f"{self.nbytes}")


# ----------------------------------------------------------------------------
# the registry

# name -> (module with create(), what it is, why it cannot be had here or None)
_REGISTRY = {}
WRAPPERS = {"check": "runs each call on NAME and on the cpu oracle and compares them",
            "profile": "times each call on NAME",
            "guard": "NAME's memory unreadable outside its own calls (host backends)"}


def register_backend(str name, str module, str description, unavailable=None):
    """Make get_backend(name) call module.create(); `unavailable` (a reason, or a function
    returning one or None, asked each time: a build may appear after import) marks a backend
    this machine cannot run."""
    if ":" in name:
        raise ValueError(f"backend names have no ':' (it separates wrappers): {name!r}")
    _REGISTRY[name] = (module, description, unavailable)


_ACCEL = os.path.dirname(os.path.abspath(__file__))


def _not_built(library, target):
    """Why a backend whose library (under accel/) is missing is unavailable; asked each time,
    so a build made after import is seen."""
    return None if os.path.exists(os.path.join(_ACCEL, library)) else f"not built: run `make {target}`"


register_backend("cpu", "accel.cpu", "the Cython kernels of kernels/, OpenMP, and OpenBLAS or MKL")
register_backend("hip", "accel.hip.device",
                 "HIP on AMD or NVIDIA GPUs (hip-emu where only the emulated build exists)",
                 lambda: _hip.unavailable("hip"))
register_backend("hip-emu", "accel.hip.emulated", "the HIP kernels on the CPU emulator (tests)",
                 lambda: _hip.unavailable("hip-emu"))
register_backend("metal", "accel.metal.metal", "Metal on Apple GPUs",
                 "Metal needs macOS" if sys.platform != "darwin" else
                 lambda: _not_built("metal/build/libmetal_runtime.dylib", "metal"))
register_backend("metal-emu", "accel.metal.emulated", "accel/metal's kernels on the CPU emulator of MSL",
                 "the Metal emulator runs on Linux" if not sys.platform.startswith("linux") else
                 lambda: _not_built("metal/build/libmetal_emu.so", "metal-emu"))
register_backend("ane-emu", "accel.ane.emulated",
                 "the ANE's MIL programs run by a NumPy interpreter on Linux (slow; tests)",
                 lambda: None if importlib.util.find_spec("coremltools") else
                 "ane-emu needs coremltools (pip install -r requirements.txt)")
register_backend("ane", "accel.ane.device", "the Apple Neural Engine through Core ML (Llama; accel/ane/README.md)",
                 "the Neural Engine needs macOS (here: ane-emu runs the same programs, and "
                 "train.py --backend ane --dry-run plans a run)" if sys.platform != "darwin" else
                 lambda: None if importlib.util.find_spec("coremltools") else
                 "ane needs coremltools (pip install -r requirements.txt)")


def backend_names():
    """[(name, description, reason it is unavailable or None)] of the registered backends."""
    return [(name, desc, why() if callable(why) else why) for name, (_, desc, why) in _REGISTRY.items()]


def _available_line():
    names = [name for name, _, why in backend_names() if why is None]
    return (f"available here: {', '.join(names)}, and "
            f"{', '.join(w + ':NAME' for w in WRAPPERS)} around any of them")


def get_backend(name):
    """The Backend called name ("cpu", "check:cpu", ...); BackendError in one line if there is
    no such backend or it cannot run here."""
    if isinstance(name, Backend):
        return name
    wrapper, _, inner = name.partition(":")
    if inner:
        if wrapper not in WRAPPERS:
            raise BackendError(f"unknown backend wrapper '{wrapper}:' in '{name}' ({_available_line()})")
        from accel import instrument
        return instrument.create(wrapper, get_backend(inner))
    if name not in _REGISTRY:
        raise BackendError(f"unknown backend '{name}' ({_available_line()})")
    module, _, unavailable = _REGISTRY[name]
    if callable(unavailable):
        unavailable = unavailable()
    if unavailable is not None:
        raise BackendError(f"backend '{name}' is unavailable: {unavailable} ({_available_line()})")
    try:
        backend = importlib.import_module(module).create()
    except ImportError as e:
        raise BackendError(f"backend '{name}' is not built ({e}): run `make train_gpt2`") from None
    (<Backend?>backend).validate()
    return backend
