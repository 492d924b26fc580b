"""
The Metal backend: the kernels of accel/metal/gpt2.metal (and of llama.metal and flash.metal,
which it #includes) behind the backend table (accel/backend.pxd). The host side (grids, argument binding, the sums to the host) is
accel/metal/host.c, compiled into each runtime library with the runtime of
accel/metal/metal_runtime.h:

    metal       macOS: Metal itself, build/libmetal_runtime.dylib (`make metal`)
    metal-emu   Linux: the CPU emulator of MSL, build/libmetal_emu.so (`make metal-emu`)

Each at three precisions (PRECISIONS; get_backend(name, precision)): fp32, and fp16 and bf16, a
build of their own (libmetal_emu_fp16.so, libmetal_runtime_bf16.dylib, ...: host.c and
gpt2.metal compiled with floatX half or bfloat) which fills the mixed group too. Every library
exports accel_metal_ENTRY for each entry of the table, and the loader HIP shares
(accel/loader.pyx) fills the table from them; accel_metal_precision says which precision a
library was built at. Both are loaded with dlopen, so this module builds everywhere. The backend
is not host_visible: memory is Metal's shared storage, but a dispatch may still be running when
the host looks, so a model goes through copy_to_host too.
"""
import os
import sys

from accel.backend import BackendError
from accel.emu.msl_rewrite import RewriteError, splice
from accel.loader cimport DeviceLibrary, precision_fn

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "build")
SOURCE = os.path.join(HERE, "gpt2.metal")

PRECISIONS = ("fp32", "fp16", "bf16")
# the entry groups a build fills at each precision (accel/spec.py): the symbols the loader looks up
GROUPS = {"fp32": ("linear", "gpt2", "llama", "classifier", "flash"),
          "fp16": ("linear", "gpt2", "llama", "classifier", "flash", "mixed"),
          "bf16": ("linear", "gpt2", "llama", "classifier", "flash", "mixed")}


def _suffix(str precision):
    return "" if precision == "fp32" else f"_{precision}"


def emulator_library(str precision="fp32"):
    """The emulator's library at a precision (`make metal-emu`)."""
    return os.path.join(BUILD, f"libmetal_emu{_suffix(precision)}.so")


def macos_runtime(str precision="fp32"):
    """The Metal runtime's library at a precision (`make metal`)."""
    return os.path.join(BUILD, f"libmetal_runtime{_suffix(precision)}.dylib")


def macos_metallib(str precision="fp32"):
    """The compiled kernels at a precision (`make metal`); else the source is compiled at run time."""
    return os.path.join(BUILD, f"gpt2{_suffix(precision)}.metallib")


EMULATOR_LIBRARY = emulator_library()
MACOS_RUNTIME = macos_runtime()
MACOS_METALLIB = macos_metallib()

ctypedef void* (*create_fn)(const char* kernels, const char* source, char* error, size_t error_size) noexcept nogil


def create(library=None, str name="metal", kernels=None, str precision="fp32"):
    """The backend `name` over the runtime library (default: the Metal runtime on macOS, the
    emulator elsewhere, of this precision); tests pass other builds of the emulator (planted
    faults, ASan), and dev/metal/ab.py other kernel sources for the Metal runtime (`kernels`: a
    .metal or .metallib file; the emulator's are built into it, so it ignores them). The library
    must be a build of this precision."""
    if precision not in PRECISIONS:
        raise BackendError(f"backend '{name}' has no {precision} kernels (it runs {', '.join(PRECISIONS)})")
    if library is None:
        library, name = ((macos_runtime(precision), "metal") if sys.platform == "darwin" else
                         (emulator_library(precision), "metal-emu"))
    target = "metal" if library.endswith(".dylib") else "metal-emu"
    if not os.path.exists(library):
        raise BackendError(f"{library} is not built: run `make {target}`")
    # the kernels: a .metallib or .metal file (macOS); the emulator's are built into it. Metal
    # compiles a .metal file's text, given with its includes spliced in (it resolves none), by
    # the function that splices them for the emulator: one reading of the sources for both
    if kernels is None:
        metallib = macos_metallib(precision)
        kernels = metallib if target == "metal" and os.path.exists(metallib) else SOURCE
    cdef bytes source_text = None
    if target == "metal" and not kernels.endswith(".metallib"):
        try:
            source_text = splice(kernels).encode()
        except RewriteError as e:
            raise BackendError(f"backend '{name}': {e}") from None
    cdef const char* source_c = NULL   # a .metallib, or the emulator's built-in kernels
    if source_text is not None:
        source_c = source_text
    cdef DeviceLibrary runtime = DeviceLibrary(library, name, "accel_metal_", f"`make {target}`")
    cdef str built = (<precision_fn>runtime.symbol("precision"))().decode()
    if built != precision:
        raise BackendError(f"backend '{name}': {library} is a {built} build, not {precision} "
                           f"(run `make {target}` again)")
    cdef create_fn create_context = <create_fn>runtime.symbol("create")
    cdef bytes kernels_path = os.fsencode(kernels)
    cdef const char* kernels_c = kernels_path
    cdef char error[512]
    error[0] = 0
    cdef void* ctx
    with nogil:
        ctx = create_context(kernels_c, source_c, error, sizeof(error))
    return runtime.backend(ctx, error, GROUPS[precision], precision)


def create_emulated(str precision="fp32"):
    """Backend metal-emu at a precision: the emulator library (`make metal-emu`)."""
    if precision not in PRECISIONS:
        raise BackendError(f"backend 'metal-emu' has no {precision} kernels (it runs {', '.join(PRECISIONS)})")
    return create(emulator_library(precision), "metal-emu", precision=precision)
