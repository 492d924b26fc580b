"""Backend metal-emu: accel/metal's kernels on the CPU emulator of MSL (`make metal-emu`)."""
from accel.metal.metal import create_emulated as create  # noqa: F401
