"""
accel/hip: the HIP backend. gpt2.hip holds the kernels and a C ABI; the Makefile builds it into
a shared library (a GPU build, an emulated one); device.pyx loads a build at run time and fills
the backend table. This module knows where the builds go and, for the registry
(accel/backend.pyx), why a backend cannot be had here. See README.md.
"""
import os

BUILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build")
GPU_LIBRARY = os.path.join(BUILD, "libgpt2_hip.so")
EMU_LIBRARY = os.path.join(BUILD, "libgpt2_hip_emu.so")
# the bf16 builds (-DACCEL_HIP_BF16): the same symbols, floatX bf16
GPU_LIBRARY_BF16 = os.path.join(BUILD, "libgpt2_hip_bf16.so")
EMU_LIBRARY_BF16 = os.path.join(BUILD, "libgpt2_hip_emu_bf16.so")

NO_GPU_BUILD = ("no GPU build (run `make hip` on a machine with hipcc or nvcc; the CPU emulator is "
                "--backend hip-emu)")


def unavailable(name):
    """Why the backend `name` ("hip" or "hip-emu") cannot be had here; None when its build is
    there (a missing GPU is found when the build is loaded). For `hip` only the GPU build
    counts: the emulated one runs when asked for by name, so that a run on `hip` is a GPU's."""
    if name == "hip-emu":
        return None if os.path.exists(EMU_LIBRARY) else "not built (run `make hip-emu`)"
    return None if os.path.exists(GPU_LIBRARY) else NO_GPU_BUILD
