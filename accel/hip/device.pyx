"""
The HIP backend from Python: loads a build of accel/hip/gpt2.hip (a shared library with a C ABI
whose functions have the backend table's signatures) and points the table at them, through the
loader that Metal shares (accel/loader.pyx).

    hip       the GPU build (make hip), and only it: where there is none, `hip` is unavailable
              in one line naming hip-emu, so that an emulated run is never taken for a GPU's
    hip-emu   the emulated build (make hip-emu): the same kernels run thread by thread on the
              CPU emulator (accel/emu), for tests; it runs only when asked for by name

Each at two precisions (PRECISIONS; get_backend(name, precision)): fp32, and bf16, a build of its
own (libgpt2_hip[_emu]_bf16.so, gpt2.hip with -DACCEL_HIP_BF16) whose floatX arguments are bf16
and which fills the mixed group (narrow_params, adamw_update_rounded) too. A build with NCCL/RCCL
(every emulated one) fills the collectives group as well (accel/hip/collectives.hip).

Nothing here links against a GPU library: the build is opened at run time (dlopen), so the CPU
product builds and runs everywhere, and a missing build, toolchain library or GPU is one line
from get_backend. Memory is the device's: host_visible is False even for the emulated build, so
the model is tested on the copies a GPU needs.
"""
from accel.loader cimport DeviceLibrary, precision_fn

import os

from accel.backend import BackendError
from accel.hip import EMU_LIBRARY, EMU_LIBRARY_BF16, GPU_LIBRARY, GPU_LIBRARY_BF16, NO_GPU_BUILD

__all__ = ["PRECISIONS", "configure_emulator", "create", "create_emulated", "load"]

PRECISIONS = ("fp32", "bf16")
# the entry groups a build fills at each precision (accel/spec.py): the symbols the loader looks up
GROUPS = {"fp32": ("linear", "gpt2", "llama", "classifier", "flash", "cache"),
          "bf16": ("linear", "gpt2", "llama", "classifier", "flash", "cache", "mixed")}
# and the device collectives (NCCL/RCCL), where the build has them: every emulated build; a GPU
# build made where no NCCL/RCCL was found has not (accel/hip/Makefile)
OPTIONAL_GROUPS = (("collectives", "comm_init"),)
# the builds of each precision: (GPU, emulated)
LIBRARIES = {"fp32": (GPU_LIBRARY, EMU_LIBRARY), "bf16": (GPU_LIBRARY_BF16, EMU_LIBRARY_BF16)}

ctypedef void* (*create_fn)(char* error, size_t error_size) noexcept nogil
ctypedef const char* (*configure_fn)(const char* schedule, unsigned long long seed,
                                     int warp_size, int compute_units) noexcept nogil

REBUILD = "`make hip` or `make hip-emu`"


def load(str path, str name, str precision="fp32"):
    """The Backend `name` over the build of gpt2.hip at `path` (symbols accel_hip_ENTRY, filled
    by accel/loader.pyx), a build of this precision; BackendError in one line when it cannot be
    loaded, is of another precision, or finds no device."""
    if precision not in PRECISIONS:
        raise BackendError(f"backend '{name}' has no {precision} kernels (it runs {', '.join(PRECISIONS)})")
    cdef DeviceLibrary library = DeviceLibrary(path, name, "accel_hip_", REBUILD)
    cdef str built = (<precision_fn>library.symbol("precision"))().decode()
    if built != precision:
        raise BackendError(f"backend '{name}': {path} is a {built} build, not {precision} "
                           f"(run {REBUILD} again)")
    cdef create_fn create_context = <create_fn>library.symbol("create")
    cdef char error[512]
    error[0] = 0
    groups = GROUPS[precision]
    for group, entry in OPTIONAL_GROUPS:
        try:
            library.symbol(entry)
            groups += (group,)
        except BackendError:
            pass
    cdef void* ctx
    with nogil:
        ctx = create_context(error, sizeof(error))
    return library.backend(ctx, error, groups, precision)


def _suffix(str precision):
    return "" if precision == "fp32" else f" at {precision}"


def create(str precision="fp32"):
    """The backend `hip` at a precision: the GPU build. Never the emulated build in its place,
    which is `hip-emu`, asked for by name (create_emulated)."""
    if precision not in PRECISIONS:
        raise BackendError(f"backend 'hip' has no {precision} kernels (it runs {', '.join(PRECISIONS)})")
    gpu = LIBRARIES[precision][0]
    if not os.path.exists(gpu):
        raise BackendError(f"backend 'hip' is unavailable{_suffix(precision)}: {NO_GPU_BUILD}")
    return load(gpu, "hip", precision)


def create_emulated(str precision="fp32"):
    """The backend `hip-emu` at a precision: the emulated build."""
    if precision not in PRECISIONS:
        raise BackendError(f"backend 'hip-emu' has no {precision} kernels (it runs {', '.join(PRECISIONS)})")
    library = LIBRARIES[precision][1]
    if not os.path.exists(library):
        raise BackendError(f"backend 'hip-emu' is unavailable{_suffix(precision)}: not built "
                           f"(run `make hip-emu`)")
    return load(library, "hip-emu", precision)


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
