"""
RoPE's tables, computed once for everything that rotates by position: the Llama model
(train_llama2.pyx, whose kernels/rope.pyx reads them), llama2.c's legacy model file
(llmc/formats/llama2c.py) and the PyTorch reference (train_llama2_torch.py).

    angle[t, i] = t * theta^(-2i/hs)      t = 0..maxT-1, i = 0..hs/2-1 (theta 10000 in Llama 2)
    cos[t, i], sin[t, i]                  (maxT, hs/2) float32 each

in float64 throughout and rounded to float32 once at the end: the angles in float32 (Meta's
and llama2.c's way) lose about t * 6e-8 radians, 2e-4 at t = 4096.  Rounding once also makes
the tables the same on every machine: NumPy's float64 power, cos and sin take different SIMD
paths by CPU (SVML on AVX-512) that differ in a float64's last bits, and those survive the
rounding to float32 only for a value within them of a float32 rounding boundary, which no
preset's table has (tests/test_rope.py compares the tables under NumPy's baseline dispatch).
"""
import numpy as np

__all__ = ["rope_tables"]


def rope_tables(max_seq_len, head_size, theta=10000.0):
    """(cos, sin), each (max_seq_len, head_size/2) float32: the rotation tables of positions
    0..max_seq_len-1 for an even head_size."""
    if max_seq_len < 0 or head_size <= 0 or head_size % 2 != 0:
        raise ValueError(f"rope_tables: need max_seq_len >= 0 and an even head size > 0, "
                         f"got max_seq_len={max_seq_len}, head_size={head_size}")
    if not theta > 0:
        raise ValueError(f"rope_tables: theta must be positive, got {theta}")
    freqs = np.float64(theta) ** (-np.arange(0, head_size, 2, dtype=np.float64) / head_size)
    angles = np.outer(np.arange(max_seq_len, dtype=np.float64), freqs)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
