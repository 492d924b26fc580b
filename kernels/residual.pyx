# Residual connection: the sum of a block's input and the block's output.
#   out = inp1 + inp2,  all (N,) with N = B*T*C
# Backward passes dout unchanged to both inputs.
from cython.parallel cimport prange

from kernels.bf16 cimport load, store

include "kernels/residual_wrappers.pxi"

cdef enum:
    # threads take whole chunks of this many floats (64 KiB); the loop inside a chunk is a
    # plain contiguous loop the compiler vectorises
    CHUNK = 16384


cdef void residual_forward(floatX* out, const floatX* inp1, const floatX* inp2, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, start, end, i
    for chunk in prange(num_chunks, schedule="static", use_threads_if=num_chunks > 1):
        start = chunk * CHUNK
        end = min(start + CHUNK, N)
        for i in range(start, end):
            store(out, i, load(inp1, i) + load(inp2, i))


cdef void residual_backward(floatX* dinp1, floatX* dinp2, const floatX* dout, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, start, end, i
    for chunk in prange(num_chunks, schedule="static", use_threads_if=num_chunks > 1):
        start = chunk * CHUNK
        end = min(start + CHUNK, N)
        for i in range(start, end):
            store(dinp1, i, load(dinp1, i) + load(dout, i))
            store(dinp2, i, load(dinp2, i) + load(dout, i))
