"""The backend `hip-emu`: accel/hip's kernels on the CPU emulator (accel/hip/device.pyx), at
fp32 or bf16."""
from accel.hip.device import PRECISIONS, create_emulated as create

__all__ = ["PRECISIONS", "create"]
