"""
The HIP backend from Python: loads a build of accel/hip/gpt2.hip (a shared library with a C ABI
whose functions have the backend table's signatures) and points the table at them.

    hip       the GPU build (make hip); where only the emulated build exists, that one,
              named hip-emu so that nobody mistakes it for a GPU
    hip-emu   the emulated build (make hip-emu): the same kernels run thread by thread on the
              CPU emulator (accel/emu), for tests

Nothing here links against a GPU library: the build is opened at run time (dlopen), so the CPU
product builds and runs everywhere, and a missing build, toolchain library or GPU is one line
from get_backend. Memory is the device's: host_visible is False even for the emulated build, so
the model is tested on the copies a GPU needs.
"""
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym

from accel.backend cimport Backend, BackendTable

import os

from accel.backend import BackendError
from accel.spec import ORDER, entries_of
from accel.hip import EMU_LIBRARY, GPU_LIBRARY, NOT_BUILT

__all__ = ["HipBackend", "configure_emulator", "create", "create_emulated", "load"]

ctypedef void* (*create_fn)(char* error, size_t error_size) noexcept nogil
ctypedef void (*destroy_fn)(void* ctx) noexcept nogil
ctypedef const char* (*name_fn)(void* ctx) noexcept nogil
ctypedef const char* (*configure_fn)(const char* schedule, unsigned long long seed,
                                     int warp_size, int compute_units) noexcept nogil

# the entry groups gpt2.hip fills (accel/spec.py); the build's symbols are accel_hip_ENTRY
GROUPS = ("core", "linear", "gpt2")


cdef void* open_library(str path, str name) except NULL:
    # RTLD_LOCAL: each build keeps its own symbols (tests load several emulated builds at once)
    cdef void* handle = dlopen(os.fsencode(path), RTLD_NOW | RTLD_LOCAL)
    if handle == NULL:
        raise BackendError(f"backend '{name}' is unavailable: cannot load {path}: "
                           f"{dlerror().decode(errors='replace')}")
    return handle


cdef void* symbol(void* handle, str symbol_name, str path, str name) except NULL:
    cdef void* address = dlsym(handle, symbol_name.encode())
    if address == NULL:
        raise BackendError(f"backend '{name}': {path} has no {symbol_name} (an old build? run "
                           f"`make hip` or `make hip-emu` again)")
    return address


cdef class DeviceContext:
    """The build's context (its device, BLAS handle, scratch memory), destroyed with the last
    Backend that uses it."""
    cdef void* ctx
    cdef destroy_fn destroy

    def __dealloc__(self):
        if self.ctx != NULL:
            self.destroy(self.ctx)


cdef class HipBackend(Backend):
    """A Backend over one build of accel/hip/gpt2.hip."""
    cdef readonly str device     # the GPU's name, or the emulator's
    cdef readonly str library    # the shared library loaded

    def __repr__(self):
        return f"<Backend {self.name}: {self.device}, {self.library}>"


def load(str path, str name):
    """The Backend `name` over the build of gpt2.hip at `path`; BackendError in one line when it
    cannot be loaded or finds no device."""
    cdef void* handle = open_library(path, name)
    cdef create_fn create_context = <create_fn>symbol(handle, "accel_hip_create", path, name)
    cdef char error[512]
    error[0] = 0
    cdef void* ctx
    with nogil:
        ctx = create_context(error, sizeof(error))
    if ctx == NULL:
        raise BackendError(f"backend '{name}' is unavailable: {error.decode(errors='replace')}")
    cdef DeviceContext owner = DeviceContext()
    owner.ctx = ctx
    owner.destroy = <destroy_fn>symbol(handle, "accel_hip_destroy", path, name)
    cdef HipBackend backend = HipBackend(name, False, GROUPS, owner)
    backend.device = (<name_fn>symbol(handle, "accel_hip_device_name", path, name))(ctx).decode()
    backend.library = path
    # the entries of the other groups (llama, flash) stay NULL, and GROUPS says so
    backend.table.ctx = ctx
    cdef void** entries = <void**>&backend.table.ctx + 1   # the entries, in ORDER
    for entry in entries_of(GROUPS):
        entries[ORDER.index(entry)] = symbol(handle, "accel_hip_" + entry, path, name)
    backend.validate()
    return backend


def create():
    """The backend `hip`: the GPU build, or the emulated build where only that one is built."""
    if os.path.exists(GPU_LIBRARY):
        return load(GPU_LIBRARY, "hip")
    if os.path.exists(EMU_LIBRARY):
        return load(EMU_LIBRARY, "hip-emu")
    raise BackendError(f"backend 'hip' is unavailable: {NOT_BUILT}")


def create_emulated():
    """The backend `hip-emu`: the emulated build."""
    if not os.path.exists(EMU_LIBRARY):
        raise BackendError("backend 'hip-emu' is unavailable: not built (run `make hip-emu`)")
    return load(EMU_LIBRARY, "hip-emu")


def configure_emulator(str schedule="lockstep", unsigned long long seed=1, int warp_size=32,
                       int compute_units=64, str library=EMU_LIBRARY):
    """Set the emulator of the emulated build at `library`: its schedule (lockstep,
    lockstep-reverse, warp-ahead, warp-ahead-reverse, shuffled with its seed), warp size (32 or
    64), and the compute units it reports (fewer: smaller grids, so grid-stride loops wrap at
    small shapes). A context reads the device once, when it is created: configure, then load."""
    cdef void* handle = open_library(library, "hip-emu")
    cdef configure_fn configure = <configure_fn>symbol(handle, "accel_hip_emu_configure", library,
                                                       "hip-emu")
    cdef const char* refused = configure(schedule.encode(), seed, warp_size, compute_units)
    if refused != NULL:
        raise ValueError(f"configure_emulator({schedule!r}, {seed}, {warp_size}, {compute_units}): "
                         f"{refused.decode()}")
