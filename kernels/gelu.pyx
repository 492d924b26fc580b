# GELU activation, the tanh approximation used by GPT-2:
#   out = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
#   out, inp (N,) with N = B*T*4C (the MLP's hidden layer)
# Backward: dinp += gelu'(inp) * dout.
from cython.parallel cimport prange
from libc.math cimport tanhf

cdef enum:
    # threads take whole chunks of this many floats (64 KiB)
    CHUNK = 16384

cdef extern from *:
    """
    #define GELU_SCALING_FACTOR 0.7978845608028654f  /* sqrt(2/pi) */
    #define GELU_CUBIC 0.044715f
    """
    float GELU_SCALING_FACTOR
    float GELU_CUBIC


cdef void gelu_forward(float* out, const float* inp, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, start, end, i
    cdef float x, cube
    for chunk in prange(num_chunks, schedule="static", use_threads_if=num_chunks > 1):
        start = chunk * CHUNK
        end = min(start + CHUNK, N)
        for i in range(start, end):
            x = inp[i]
            cube = GELU_CUBIC * x * x * x
            out[i] = 0.5 * x * (1.0 + tanhf(GELU_SCALING_FACTOR * (x + cube)))


cdef void gelu_backward(float* dinp, const float* inp, const float* dout, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, start, end, i
    cdef float x, tanh_out, sech2, local_grad
    for chunk in prange(num_chunks, schedule="static", use_threads_if=num_chunks > 1):
        start = chunk * CHUNK
        end = min(start + CHUNK, N)
        for i in range(start, end):
            x = inp[i]
            tanh_out = tanhf(GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x))
            # sech^2 = 1 - tanh^2: no coshf, which overflows for large |x|
            sech2 = 1.0 - tanh_out * tanh_out
            local_grad = (0.5 * (1.0 + tanh_out)
                          + 0.5 * x * sech2 * GELU_SCALING_FACTOR * (1.0 + 3.0 * GELU_CUBIC * x * x))
            dinp[i] = dinp[i] + local_grad * dout[i]


# ----------------------------------------------------------------------------
# Python wrappers: flat (N,) float32 arrays (pass x.reshape(-1) for a (B,T,4C) tensor)

def _check_size(str where, str name, Py_ssize_t got, Py_ssize_t want):
    if got != want:
        raise ValueError(f"gelu.{where}: {name} has {got} elements, expected {want}")


def forward(float[::1] out, const float[::1] inp):
    """out (N,) = gelu(inp)."""
    cdef Py_ssize_t N = inp.shape[0]
    _check_size("forward", "out", out.shape[0], N)
    if N == 0:
        return
    with nogil:
        gelu_forward(&out[0], &inp[0], N)


def backward(float[::1] dinp, const float[::1] inp, const float[::1] dout):
    """dinp (N,) += gelu'(inp) * dout."""
    cdef Py_ssize_t N = inp.shape[0]
    _check_size("backward", "dinp", dinp.shape[0], N)
    _check_size("backward", "dout", dout.shape[0], N)
    if N == 0:
        return
    with nogil:
        gelu_backward(&dinp[0], &inp[0], &dout[0], N)
