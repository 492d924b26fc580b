# bfloat16 conversions of whole arrays (kernels/bf16.pxd has the element-wise ones and the
# format).  Contiguous loops the compiler vectorises, in chunks across the OpenMP threads.
from cython.parallel cimport prange

from kernels.parallel cimport SERIAL_BELOW

import numpy as np

cdef enum:
    CHUNK = 16384


cdef void widen(float* out, const bf16* inp, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t chunks = (n + CHUNK - 1) // CHUNK, chunk, i
    for chunk in prange(chunks, schedule="static", use_threads_if=n >= SERIAL_BELOW):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, n)):
            out[i] = bf16_to_float(inp[i])


cdef void narrow(bf16* out, const float* inp, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t chunks = (n + CHUNK - 1) // CHUNK, chunk, i
    for chunk in prange(chunks, schedule="static", use_threads_if=n >= SERIAL_BELOW):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, n)):
            out[i] = float_to_bf16(inp[i])


cdef void narrow_stochastic(bf16* out, const float* inp, Py_ssize_t n, Py_ssize_t first,
                            uint32_t seed) noexcept nogil:
    cdef Py_ssize_t chunks = (n + CHUNK - 1) // CHUNK, chunk, i
    for chunk in prange(chunks, schedule="static", use_threads_if=n >= SERIAL_BELOW):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, n)):
            out[i] = float_to_bf16_stochastic(inp[i], <uint64_t>(first + i), seed)


# --- Python wrappers (tests, the formats): bf16 arrays are uint16 arrays of the bits -----------

def to_bf16(x, seed=None, Py_ssize_t first=0):
    """x as bf16 bits (a uint16 array of x's shape): rounded to nearest even, or with a seed
    stochastically (element i's bits from (first + i, seed))."""
    cdef float[::1] src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(src.shape[0], dtype=np.uint16)
    cdef bf16[::1] dst = out
    cdef Py_ssize_t n = src.shape[0]
    cdef uint32_t s = 0 if seed is None else <uint32_t>seed
    if n:
        with nogil:
            if seed is None:
                narrow(&dst[0], &src[0], n)
            else:
                narrow_stochastic(&dst[0], &src[0], n, first, s)
    return out.reshape(np.shape(x))


def to_float32(bits):
    """bf16 bits (a uint16 array) as float32 values, exactly."""
    cdef bf16[::1] src = np.ascontiguousarray(bits, dtype=np.uint16).reshape(-1)
    out = np.empty(src.shape[0], dtype=np.float32)
    cdef float[::1] dst = out
    if src.shape[0]:
        with nogil:
            widen(&dst[0], &src[0], src.shape[0])
    return out.reshape(np.shape(bits))
