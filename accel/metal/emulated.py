"""Backend metal-emu: accel/metal's kernels on the CPU emulator of MSL (`make metal-emu`), at fp32,
fp16 and bf16 (a library each)."""
from accel.metal.metal import PRECISIONS, create_emulated as create  # noqa: F401
