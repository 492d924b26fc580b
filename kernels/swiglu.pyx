# SwiGLU, the gated activation of Llama's feed-forward block (Meta's w2(silu(w1 x) * w3 x)):
#   out = silu(a) * b,  silu(a) = a s,  s = sigmoid(a) = 1 / (1 + exp(-a))
# Backward:
#   da += dout * b * s (1 + a (1 - s))      (silu'(a) = s + a s (1 - s))
#   db += dout * silu(a)
# a, b, out and their gradients are flat (N,) arrays.  exp is kernels.vexp's vectorisable vexpf
# (clamped, so a very negative a gives s ~ 1e-38, not 0, and silu(a) ~ 0); threads take
# 64 KiB chunks, as in gelu, from kernels.parallel's SERIAL_BELOW floats on.
from cython.parallel cimport prange
from kernels.bf16 cimport load, store
from kernels.parallel cimport SERIAL_BELOW
from kernels.vexp cimport vexpf

cdef enum:
    CHUNK = 16384   # floats per task: 64 KiB, a whole number of cache lines


cdef void swiglu_forward(floatX* out, const floatX* a, const floatX* b, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, i
    cdef float x
    for chunk in prange(num_chunks, schedule="static", use_threads_if=N >= SERIAL_BELOW):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, N)):
            x = load(a, i)
            store(out, i, x / (1.0 + vexpf(-x)) * load(b, i))


cdef void swiglu_backward(floatX* da, floatX* db, const floatX* dout, const floatX* a,
                          const floatX* b, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, i
    cdef float x, s
    for chunk in prange(num_chunks, schedule="static", use_threads_if=N >= SERIAL_BELOW):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, N)):
            x = load(a, i)
            s = 1.0 / (1.0 + vexpf(-x))
            store(da, i, load(da, i) + load(dout, i) * load(b, i) * s * (1.0 + x * (1.0 - s)))
            store(db, i, load(db, i) + load(dout, i) * x * s)


# ----------------------------------------------------------------------------
# Python wrappers: check sizes, then run the kernel without the GIL

def forward(float[::1] out, const float[::1] a, const float[::1] b):
    """out (N,) = silu(a) * b."""
    cdef Py_ssize_t N = a.shape[0]
    if b.shape[0] != N or out.shape[0] != N:
        raise ValueError(f"swiglu.forward: out, a, b have {out.shape[0]}, {N}, {b.shape[0]} "
                         f"elements, expected the same number")
    if N == 0:
        return
    with nogil:
        swiglu_forward(&out[0], &a[0], &b[0], N)


def backward(float[::1] da, float[::1] db, const float[::1] dout, const float[::1] a,
             const float[::1] b):
    """da, db (N,) += gradients of silu(a) * b from dout (N,)."""
    cdef Py_ssize_t N = a.shape[0]
    for name, n in (("da", da.shape[0]), ("db", db.shape[0]), ("dout", dout.shape[0]),
                    ("b", b.shape[0])):
        if n != N:
            raise ValueError(f"swiglu.backward: {name} has {n} elements, expected {N} (as a)")
    if N == 0:
        return
    with nogil:
        swiglu_backward(&da[0], &db[0], &dout[0], &a[0], &b[0], N)
