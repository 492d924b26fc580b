"""The backend `hip-emu`: accel/hip's kernels on the CPU emulator (accel/hip/device.pyx)."""
from accel.hip.device import create_emulated as create

__all__ = ["create"]
