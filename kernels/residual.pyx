# Residual connection: the sum of a block's input and the block's output.
#   out = inp1 + inp2,  all (N,) with N = B*T*C
# Backward passes dout unchanged to both inputs.
from cython.parallel cimport prange

include "kernels/_residual_wrappers.pxi"

cdef enum:
    # threads take whole chunks of this many floats (64 KiB); the loop inside a chunk is a
    # plain contiguous loop the compiler vectorises
    CHUNK = 16384


cdef void residual_forward(float* out, const float* inp1, const float* inp2, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, start, end, i
    for chunk in prange(num_chunks, schedule="static", use_threads_if=num_chunks > 1):
        start = chunk * CHUNK
        end = min(start + CHUNK, N)
        for i in range(start, end):
            out[i] = inp1[i] + inp2[i]


cdef void residual_backward(float* dinp1, float* dinp2, const float* dout, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, start, end, i
    for chunk in prange(num_chunks, schedule="static", use_threads_if=num_chunks > 1):
        start = chunk * CHUNK
        end = min(start + CHUNK, N)
        for i in range(start, end):
            dinp1[i] = dinp1[i] + dout[i]
            dinp2[i] = dinp2[i] + dout[i]
