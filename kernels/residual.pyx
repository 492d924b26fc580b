# Residual connection: the sum of a block's input and the block's output.
#   out = inp1 + inp2,  all (N,) with N = B*T*C
# Backward passes dout unchanged to both inputs.
from cython.parallel cimport prange

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


# ----------------------------------------------------------------------------
# Python wrappers: flat (N,) float32 arrays (pass x.reshape(-1) for a (B,T,C) tensor)

def _check_size(str where, str name, Py_ssize_t got, Py_ssize_t want):
    if got != want:
        raise ValueError(f"residual.{where}: {name} has {got} elements, expected {want}")


def forward(float[::1] out, const float[::1] inp1, const float[::1] inp2):
    """out (N,) = inp1 + inp2."""
    cdef Py_ssize_t N = out.shape[0]
    _check_size("forward", "inp1", inp1.shape[0], N)
    _check_size("forward", "inp2", inp2.shape[0], N)
    if N == 0:
        return
    with nogil:
        residual_forward(&out[0], &inp1[0], &inp2[0], N)


def backward(float[::1] dinp1, float[::1] dinp2, const float[::1] dout):
    """dinp1, dinp2 (N,) += dout."""
    cdef Py_ssize_t N = dout.shape[0]
    _check_size("backward", "dinp1", dinp1.shape[0], N)
    _check_size("backward", "dinp2", dinp2.shape[0], N)
    if N == 0:
        return
    with nogil:
        residual_backward(&dinp1[0], &dinp2[0], &dout[0], N)
