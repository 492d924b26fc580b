"""
The HIP backend from Python: loads a build of accel/hip/gpt2.hip (a shared library with a C ABI
whose functions have the backend table's signatures) and points the table at them, through the
loader that Metal shares (accel/loader.pyx).

    hip       the GPU build (make hip); where only the emulated build exists, that one,
              named hip-emu so that nobody mistakes it for a GPU
    hip-emu   the emulated build (make hip-emu): the same kernels run thread by thread on the
              CPU emulator (accel/emu), for tests

Nothing here links against a GPU library: the build is opened at run time (dlopen), so the CPU
product builds and runs everywhere, and a missing build, toolchain library or GPU is one line
from get_backend. Memory is the device's: host_visible is False even for the emulated build, so
the model is tested on the copies a GPU needs.
"""
from accel.loader cimport DeviceLibrary

import os

from accel.backend import BackendError
from accel.hip import EMU_LIBRARY, GPU_LIBRARY, NOT_BUILT

__all__ = ["configure_emulator", "create", "create_emulated", "load"]

# the entry groups the build fills (accel/spec.py): the symbols the loader looks up
GROUPS = ("linear", "gpt2")

ctypedef void* (*create_fn)(char* error, size_t error_size) noexcept nogil
ctypedef const char* (*configure_fn)(const char* schedule, unsigned long long seed,
                                     int warp_size, int compute_units) noexcept nogil

REBUILD = "`make hip` or `make hip-emu`"


def load(str path, str name):
    """The Backend `name` over the build of gpt2.hip at `path` (symbols accel_hip_ENTRY, filled
    by accel/loader.pyx); BackendError in one line when it cannot be loaded or finds no device."""
    cdef DeviceLibrary library = DeviceLibrary(path, name, "accel_hip_", REBUILD)
    cdef create_fn create_context = <create_fn>library.symbol("create")
    cdef char error[512]
    error[0] = 0
    cdef void* ctx
    with nogil:
        ctx = create_context(error, sizeof(error))
    return library.backend(ctx, error, GROUPS)


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
    cdef DeviceLibrary build = DeviceLibrary(library, "hip-emu", "accel_hip_", REBUILD)
    cdef configure_fn configure = <configure_fn>build.symbol("emu_configure")
    cdef const char* refused = configure(schedule.encode(), seed, warp_size, compute_units)
    if refused != NULL:
        raise ValueError(f"configure_emulator({schedule!r}, {seed}, {warp_size}, {compute_units}): "
                         f"{refused.decode()}")
