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
from accel.spec import ENTRY_GROUPS, GRAD_PRECISIONS, GROUPS, ORDER, PRECISIONS

import numpy as np

cimport cython
from cpython.buffer cimport PyBUF_WRITABLE
from libc.stdint cimport uintptr_t

__all__ = ["Backend", "BackendError", "Buffer", "backend_module", "backend_names", "get_backend",
           "register_backend", "require_available", "require_grad_precision", "require_precision",
           "ENTRY_GROUPS"]


class BackendError(RuntimeError):
    """A backend that cannot be had or cannot serve a model; the message is one line."""


# the struct is the context and then one pointer per entry, in the spec's order
assert sizeof(BackendTable) == (1 + len(ORDER)) * sizeof(void*), "accel/generated/table.pxi is stale"


cdef void** entry_slots(BackendTable* t) noexcept:
    """The table's entries as an array, in accel/spec.py's order."""
    return <void**>&t.ctx + 1


cdef list missing_entries(BackendTable* t, tuple groups):
    """The names of the entries of these groups that t leaves NULL."""
    cdef void** slots = entry_slots(t)
    return [name for i, name in enumerate(ORDER)
            if slots[i] == NULL and any(name in ENTRY_GROUPS[g] for g in groups)]


def _with_core(groups):
    return ("core",) + tuple(g for g in groups if g != "core")


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
    """A context and its table.  Made by a backend module's create(), checked on the spot.

    Optional features, with their defaults here, which a backend overrides where it has them:
    tolerances (check:'s relative tolerance by entry, where the backend computes in lower
    precision), peak_tflops, compile_seconds (time spent compiling programs), runs_fused (a
    model runs the fused group), summary()."""

    def __init__(self, str name, bint host_visible, tuple groups, keepalive=None,
                 str precision="fp32", str grad_precision="fp32"):
        self.name = name
        self.host_visible = host_visible
        self.groups = _with_core(groups)
        self.keepalive = keepalive
        self.tolerances = {}
        self.precision = precision
        self.itemsize = PRECISIONS[precision][1]
        self.grad_precision = grad_precision
        self.grad_itemsize = GRAD_PRECISIONS[grad_precision][1]

    cdef void validate(self) except *:
        """Refuse a table that lacks an entry of a group it claims."""
        unknown = [g for g in self.groups if g not in GROUPS]
        if unknown:
            raise BackendError(f"backend '{self.name}': unknown entry group {unknown[0]!r} "
                               f"(known: {', '.join(GROUPS)})")
        missing = missing_entries(&self.table, self.groups)
        if missing:
            raise BackendError(f"backend '{self.name}': its table has no entry '{missing[0]}'"
                               + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""))

    def _without_entry(self, str entry):
        """A copy of this backend with one entry left out (tests of the validation); raises
        BackendError as a backend module's create() would."""
        cdef Backend copy = Backend(self.name, self.host_visible, self.groups, self, self.precision,
                                    self.grad_precision)
        copy.table = self.table
        entry_slots(&copy.table)[ORDER.index(entry)] = NULL
        copy.validate()
        return copy

    def _with_groups(self, tuple groups):
        """A copy of this backend claiming only these entry groups (tests of a model's
        refusal of a backend without its kernels)."""
        cdef Backend copy = Backend(self.name, self.host_visible, groups, self, self.precision,
                                    self.grad_precision)
        copy.table = self.table
        copy.validate()
        return copy

    def supports(self, str group):
        """Whether the table fills this entry group (flash: the model uses it when there)."""
        return group in self.groups

    def require(self, tuple groups, str who):
        """Raise BackendError unless this backend fills these entry groups, which `who` (a
        model family) needs."""
        missing = [g for g in groups if g not in self.groups]
        if missing:
            raise BackendError(f"backend '{self.name}' has no {missing[0]} kernels, which the {who} "
                               f"family needs (it fills: {', '.join(self.groups)})")

    peak_tflops = None
    compile_seconds = 0.0
    # a model runs the fused group's block entries (accel/spec.py) instead of their pieces
    # in turn: where a block is one program (the ANE); the CPU's fused entries are the pieces
    # in turn, there as check:'s oracle, so its models run the pieces themselves
    runs_fused = False

    def summary(self):
        """One line on what a wrapper saw (check:, profile:); None for a plain backend."""
        return None

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
        pointer (a NumPy array for host memory), numbers for the rest, in the entry's order
        without ctx (accel/spec.py).
        Returns what the entry returns (mean, global_norm_squared), else None."""
        if entry in ORDER:
            group = next(g for g, names in ENTRY_GROUPS.items() if entry in names)
            if group not in self.groups:   # its entries may be NULL
                raise BackendError(f"backend '{self.name}' has no {group} kernels ({entry})")
        return call_entry(self, entry, args)

    def __repr__(self):
        return f"<Backend {self.name}>"


cdef void* pointer(str entry, str name, value, bint optional, Py_ssize_t nbytes) except? NULL:
    """A Buffer's pointer for an entry's argument, or NULL for None where the entry allows it;
    a Buffer shorter than what the entry touches (nbytes, 0 if unknown) is refused."""
    if value is None:
        if not optional:
            raise ValueError(f"{entry}: argument '{name}' cannot be None")
        return NULL
    cdef Buffer buffer = <Buffer?>value
    if <Py_ssize_t>buffer.nbytes < nbytes:
        raise ValueError(f"{entry}: argument '{name}' has {buffer.nbytes} bytes, the call "
                         f"touches {nbytes}")
    return buffer.ptr


cdef void* host_pointer(str entry, str name, value, Py_ssize_t nbytes) except NULL:
    """A NumPy array's memory for an entry's host argument (at least nbytes of it, contiguous
    and writable); it lives as long as the array, which the call's arguments hold."""
    if not isinstance(value, np.ndarray) or not value.flags.c_contiguous or not value.flags.writeable:
        raise ValueError(f"{entry}: argument '{name}' is host memory: a contiguous, writable "
                         f"NumPy array")
    if value.nbytes < max(nbytes, 1):
        raise ValueError(f"{entry}: argument '{name}' has {value.nbytes} bytes, the call "
                         f"touches {nbytes}")
    cdef char[::1] data = value.reshape(-1).view(np.int8)
    return &data[0]


cdef void arity(str entry, tuple args, Py_ssize_t count) except *:
    if len(args) != count:
        raise TypeError(f"{entry}: takes {count} arguments after ctx ({len(args)} given)")


include "accel/generated/call.pxi"


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
# the wrappers' module (create(wrapper, backend)), found by name as the backends' modules are:
# like them, it is built on this one
WRAPPERS_MODULE = "accel.instrument"


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
                 "HIP on AMD or NVIDIA GPUs (make hip; the CPU emulator is hip-emu)",
                 lambda: _hip.unavailable("hip"))
register_backend("hip-emu", "accel.hip.emulated", "the HIP kernels on the CPU emulator (tests)",
                 lambda: _hip.unavailable("hip-emu"))
register_backend("metal", "accel.metal.metal", "Metal on Apple GPUs",
                 "Metal needs macOS" if sys.platform != "darwin" else
                 lambda: _not_built("metal/build/libmetal_runtime.dylib", "metal"))
register_backend("metal-emu", "accel.metal.emulated", "accel/metal's kernels on the CPU emulator of MSL",
                 "the Metal emulator runs on Linux" if not sys.platform.startswith("linux") else
                 lambda: _not_built("metal/build/libmetal_emu.so", "metal-emu"))
register_backend("ane-emu", "accel.ane.table",
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


def backend_module(str name):
    """The dotted name of the module registered for the backend `name`, None for a name not
    registered (a wrapped one, check:cpu, included): accel/hooks.py finds its hooks there."""
    return _REGISTRY[name][0] if name in _REGISTRY else None


def _available_line():
    names = [name for name, _, why in backend_names() if why is None]
    return (f"available here: {', '.join(names)}, and "
            f"{', '.join(w + ':NAME' for w in WRAPPERS)} around any of them")


def require_available(name):
    """Raise the BackendError get_backend(name) would for a name that is unknown or cannot run
    here, in one line, without making the backend (train.py asks before it prepares data)."""
    wrapper, _, inner = name.partition(":")
    if inner:
        if wrapper not in WRAPPERS:
            raise BackendError(f"unknown backend wrapper '{wrapper}:' in '{name}' ({_available_line()})")
        require_available(inner)
        return
    if name not in _REGISTRY:
        raise BackendError(f"unknown backend '{name}' ({_available_line()}; NVIDIA GPUs run "
                           f"through hip (make hip), as AMD's do)")
    _, _, unavailable = _REGISTRY[name]
    if callable(unavailable):
        unavailable = unavailable()
    if unavailable is not None:
        raise BackendError(f"backend '{name}' is unavailable: {unavailable} ({_available_line()})")


def runs_at(str precision):
    """The registered backends with a table of this precision (their modules' PRECISIONS; one
    that cannot be imported here is left out), for the line that refuses one."""
    names = []
    for name, (module_name, _, _) in _REGISTRY.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if precision in getattr(module, "PRECISIONS", ("fp32",)):
            names.append(name)
    return ", ".join(names)


def require_precision(name, str precision, str grad_precision="fp32"):
    """Raise the BackendError get_backend(name, precision, grad_precision) would for a backend
    with no table of that precision (and gradients), in one line, without making the backend
    (its module says: PRECISIONS, GRAD_PRECISIONS, default fp32 alone); returns that module,
    None for a name not registered."""
    if precision not in PRECISIONS:
        raise BackendError(f"unknown precision {precision!r} (known: {', '.join(PRECISIONS)})")
    name = name.rpartition(":")[2]   # a wrapper runs at its backend's precision
    module = None
    if name in _REGISTRY:
        try:
            module = importlib.import_module(_REGISTRY[name][0])
        except ImportError as e:
            raise BackendError(f"backend '{name}' is not built ({e}): run "
                               f"`make train_gpt2`") from None
        precisions = getattr(module, "PRECISIONS", ("fp32",))
        if precision not in precisions:
            raise BackendError(f"backend '{name}' has no {precision} kernels (it runs "
                               f"{', '.join(precisions)}; {precision} runs on: "
                               f"{runs_at(precision)})")
    require_grad_precision(module, name, precision, grad_precision)
    return module


def require_grad_precision(module, name, str precision, str grad_precision):
    """Raise the BackendError for a backend module that has no table with gradients of
    grad_precision at this precision (its GRAD_PRECISIONS, default fp32 alone)."""
    if grad_precision not in GRAD_PRECISIONS:
        raise BackendError(f"unknown gradient precision {grad_precision!r} (known: "
                           f"{', '.join(GRAD_PRECISIONS)})")
    if grad_precision == "fp32":
        return
    if precision != grad_precision:
        raise BackendError(f"{grad_precision} gradients need precision {grad_precision} (the "
                           f"parameters and activations in it), not {precision}")
    if module is not None and grad_precision not in getattr(module, "GRAD_PRECISIONS", ("fp32",)):
        raise BackendError(f"backend '{name}' keeps float32 parameter gradients ({grad_precision} "
                           f"gradients run on the CPU's bf16 table)")


def get_backend(name, str precision="fp32", str grad_precision="fp32"):
    """The Backend called name ("cpu", "check:cpu", ...) at a precision ("fp32", "bf16": what
    its tables' floatX arguments point to, accel/spec.py), its parameter gradients of
    grad_precision (floatG: "fp32", or "bf16" at bf16); BackendError in one line if there is
    no such backend, it cannot run here, or it has no table of that precision."""
    if isinstance(name, Backend):
        if (<Backend>name).precision != precision:
            raise BackendError(f"backend '{name.name}' runs at {name.precision}, not {precision}")
        if (<Backend>name).grad_precision != grad_precision:
            raise BackendError(f"backend '{name.name}' keeps {name.grad_precision} gradients, "
                               f"not {grad_precision}")
        return name
    require_available(name)
    wrapper, _, inner = name.partition(":")
    if inner:
        return importlib.import_module(WRAPPERS_MODULE).create(
            wrapper, get_backend(inner, precision, grad_precision))
    module = require_precision(name, precision, grad_precision)
    try:
        options = {} if precision == "fp32" else dict(precision=precision)
        if grad_precision != "fp32":
            options["grad_precision"] = grad_precision
        backend = module.create(**options)
    except ImportError as e:
        raise BackendError(f"backend '{name}' is not built ({e}): run `make train_gpt2`") from None
    (<Backend?>backend).validate()
    return backend
