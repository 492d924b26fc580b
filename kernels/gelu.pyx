# GELU, tanh approximation (promoted from dev/cpu/gelu_2.pyx): multi-threaded and vectorised.
#   out = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3);  dinp += gelu'(inp) * dout
# Rewritten with the logistic sigmoid s = 1 / (1 + exp(-2u)), since 0.5 (1 + tanh(u)) = s:
#   gelu(x)  = x s
#   gelu'(x) = s + x s (1 - s) 2 sqrt(2/pi) (1 + 3 0.044715 x^2)     (sech^2(u) = 4 s (1 - s))
# One exp per element, and no cancellation where tanh(u) is near -1.  exp is kernels.vexp's
# vectorisable vexpf, so the loops compile to SIMD code; threads take 64 KiB chunks.
from cython.parallel cimport prange
from kernels.bf16 cimport load, store
from kernels.vexp cimport vexpf

include "kernels/gelu_wrappers.pxi"


cdef enum:
    CHUNK = 16384   # floats per task: 64 KiB, a whole number of cache lines

cdef float GELU_SCALING_FACTOR = 0.7978845608028654   # sqrt(2/pi)
cdef float GELU_CUBIC = 0.044715


cdef void gelu_forward(floatX* out, const floatX* inp, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, i
    cdef float x, u
    for chunk in prange(num_chunks, schedule="static", use_threads_if=num_chunks > 1):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, N)):
            x = load(inp, i)
            u = GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x)
            store(out, i, x / (1.0 + vexpf(-2.0 * u)))


cdef void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, i
    cdef float x, u, s, local_grad
    for chunk in prange(num_chunks, schedule="static", use_threads_if=num_chunks > 1):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, N)):
            x = load(inp, i)
            u = GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x)
            s = 1.0 / (1.0 + vexpf(-2.0 * u))
            local_grad = s + x * s * (1.0 - s) * (2.0 * GELU_SCALING_FACTOR) * (1.0 + 3.0 * GELU_CUBIC * x * x)
            store(dinp, i, load(dinp, i) + local_grad * load(dout, i))
