"""
The Metal backend: the kernels of accel/metal/gpt2.metal behind the backend table
(accel/backend.pxd). The host side (grids, argument binding, the sums to the host) is
accel/metal/host.c, compiled into each runtime library with the runtime of
accel/metal/metal_runtime.h:

    metal       macOS: Metal itself, build/libmetal_runtime.dylib (`make metal`)
    metal-emu   Linux: the CPU emulator of MSL, build/libmetal_emu.so (`make metal-emu`)

Either library exports accel_metal_ENTRY for each entry of the table, and the loader HIP shares
(accel/loader.pyx) fills the table from them. Both are loaded with dlopen, so this module builds
everywhere. The backend is not host_visible: memory is Metal's shared storage, but a dispatch
may still be running when the host looks, so a model goes through copy_to_host too.
"""
import os
import sys

from accel.backend import BackendError
from accel.loader cimport DeviceLibrary

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "build")
EMULATOR_LIBRARY = os.path.join(BUILD, "libmetal_emu.so")
MACOS_RUNTIME = os.path.join(BUILD, "libmetal_runtime.dylib")
MACOS_METALLIB = os.path.join(BUILD, "gpt2.metallib")   # `make metal`; else the source is compiled at run time
SOURCE = os.path.join(HERE, "gpt2.metal")

# the entry groups the build fills (accel/spec.py): the symbols the loader looks up
GROUPS = ("linear", "gpt2", "llama", "classifier", "flash")

ctypedef void* (*create_fn)(const char* kernels, char* error, size_t error_size) noexcept nogil


def create(library=None, str name="metal", kernels=None):
    """The backend `name` over the runtime library (default: the Metal runtime on macOS, the
    emulator elsewhere); tests pass other builds of the emulator (planted faults, ASan), and
    dev/metal/ab.py other kernel sources for the Metal runtime (`kernels`: a .metal or .metallib
    file; the emulator's kernels are built into it, so it ignores them)."""
    if library is None:
        library, name = (MACOS_RUNTIME, "metal") if sys.platform == "darwin" else (EMULATOR_LIBRARY, "metal-emu")
    target = "metal" if library.endswith(".dylib") else "metal-emu"
    if not os.path.exists(library):
        raise BackendError(f"{library} is not built: run `make {target}`")
    # the kernels: a .metallib or .metal file (macOS); the emulator's are built into it
    if kernels is None:
        kernels = MACOS_METALLIB if target == "metal" and os.path.exists(MACOS_METALLIB) else SOURCE
    cdef DeviceLibrary runtime = DeviceLibrary(library, name, "accel_metal_", f"`make {target}`")
    cdef create_fn create_context = <create_fn>runtime.symbol("create")
    cdef bytes kernels_path = os.fsencode(kernels)
    cdef const char* kernels_c = kernels_path
    cdef char error[512]
    error[0] = 0
    cdef void* ctx
    with nogil:
        ctx = create_context(kernels_c, error, sizeof(error))
    return runtime.backend(ctx, error, GROUPS)


def create_emulated():
    """Backend metal-emu: the emulator library (`make metal-emu`)."""
    return create(EMULATOR_LIBRARY, "metal-emu")
