"""
RoPE's tables, computed once for everything that rotates by position: the Llama model
(train_llama2.pyx, whose kernels/rope.pyx reads them), llama2.c's legacy model file
(llmc/formats/llama2c.py) and the PyTorch reference (train_llama2_torch.py).

    angle[t, i] = t * theta^(-2i/hs)      t = 0..maxT-1, i = 0..hs/2-1 (theta 10000 in Llama 2)
    cos[t, i], sin[t, i]                  (maxT, hs/2) float32 each

Llama 3.1's scaling ("llama3": factor, low and high frequency factors, the original context
Lo) stretches the slow frequencies to a longer context and keeps the fast ones: a frequency
whose wavelength 2pi/f is longer than Lo/low_freq_factor is divided by factor, one shorter
than Lo/high_freq_factor is kept, and those between are blended linearly in Lo/wavelength
(Meta's apply_scaling, transformers' "llama3" rope_type).

in float64 throughout and rounded to float32 once at the end: the angles in float32 (Meta's
and llama2.c's way) lose about t * 6e-8 radians, 2e-4 at t = 4096.  Rounding once also makes
the tables the same on every machine: NumPy's float64 power, cos and sin take different SIMD
paths by CPU (SVML on AVX-512) that differ in a float64's last bits, and those survive the
rounding to float32 only for a value within them of a float32 rounding boundary, which no
preset's table has (tests/test_rope.py compares the tables under NumPy's baseline dispatch).
"""
import numpy as np

__all__ = ["ROPE_SCALINGS", "rope_tables"]

ROPE_SCALINGS = ("llama3",)   # the scalings rope_tables knows, by transformers' rope_type


def rope_tables(max_seq_len, head_size, theta=10000.0, scaling=()):
    """(cos, sin), each (max_seq_len, head_size/2) float32: the rotation tables of positions
    0..max_seq_len-1 for an even head_size; scaling () or ("llama3", factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings)."""
    if max_seq_len < 0 or head_size <= 0 or head_size % 2 != 0:
        raise ValueError(f"rope_tables: need max_seq_len >= 0 and an even head size > 0, "
                         f"got max_seq_len={max_seq_len}, head_size={head_size}")
    if not theta > 0:
        raise ValueError(f"rope_tables: theta must be positive, got {theta}")
    freqs = np.float64(theta) ** (-np.arange(0, head_size, 2, dtype=np.float64) / head_size)
    if scaling:
        freqs = llama3_scaled(freqs, *scaling[1:]) if scaling[0] == "llama3" else None
        if freqs is None:
            raise ValueError(f"rope_tables: unknown RoPE scaling {scaling[0]!r} (llama3 only)")
    angles = np.outer(np.arange(max_seq_len, dtype=np.float64), freqs)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def llama3_scaled(freqs, factor, low_freq_factor, high_freq_factor, original_context):
    """Llama 3.1's frequencies from the unscaled ones (float64)."""
    wavelength = 2 * np.pi / freqs
    blend = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - blend) * freqs / factor + blend * freqs
    return np.where(wavelength < original_context / high_freq_factor, freqs,
                    np.where(wavelength > original_context / low_freq_factor, freqs / factor,
                             blended))
