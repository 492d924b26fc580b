# fp16 conversions of whole arrays (kernels/fp16.pxd has the element-wise ones and the format),
# in chunks across the OpenMP threads.
from cython.parallel cimport prange

from kernels.parallel cimport SERIAL_BELOW

import numpy as np

cdef enum:
    CHUNK = 16384


cdef void widen_fp16(float* out, const fp16* inp, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t chunks = (n + CHUNK - 1) // CHUNK, chunk, i
    for chunk in prange(chunks, schedule="static", use_threads_if=n >= SERIAL_BELOW):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, n)):
            out[i] = fp16_to_float(inp[i])


cdef void narrow_fp16(fp16* out, const float* inp, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t chunks = (n + CHUNK - 1) // CHUNK, chunk, i
    for chunk in prange(chunks, schedule="static", use_threads_if=n >= SERIAL_BELOW):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, n)):
            out[i] = float_to_fp16(inp[i])


# --- Python wrappers (tests): fp16 arrays as NumPy's float16 --------------------------------

def to_fp16(x):
    """x rounded to fp16 by narrow_fp16 (a float16 array of x's shape)."""
    cdef float[::1] src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(src.shape[0], dtype=np.float16)
    cdef fp16[::1] dst = out.view(np.uint16)
    if src.shape[0]:
        with nogil:
            narrow_fp16(&dst[0], &src[0], src.shape[0])
    return out.reshape(np.shape(x))


def from_fp16(x):
    """fp16 values (a float16 array) widened by widen_fp16 (float32)."""
    cdef fp16[::1] src = np.ascontiguousarray(x, dtype=np.float16).reshape(-1).view(np.uint16)
    out = np.empty(src.shape[0], dtype=np.float32)
    cdef float[::1] dst = out
    if src.shape[0]:
        with nogil:
            widen_fp16(&dst[0], &src[0], src.shape[0])
    return out.reshape(np.shape(x))
