# Inverted dropout, as PEFT applies it to the input of each LoRA update in training:
#   out = inp * keep / (1 - p)               keep: 1 with probability 1 - p, else 0
#   dinp += dout * keep / (1 - p)            the same keep
# keep of element i is drawn from 24 bits of a counter-based hash of (i, seed, stream)
# (kernels/dropout.pxd): the same for whichever thread computes it, the same in backward as in
# forward, and the same in a resumed run, with no mask in memory.  A model draws one mask per
# update and forward (llmc/model.pyx: stream = the (layer, target), seed = the run's and step's).
from cython.parallel cimport prange
from libc.stdint cimport uint32_t

from kernels.bf16 cimport load, store

cdef enum:
    # threads take whole chunks of this many elements (64 KiB of float32); inside a chunk a
    # plain loop the compiler vectorises
    CHUNK = 16384


cdef inline uint32_t drop_below(float p) noexcept nogil:
    # element_bits below this are dropped: a fraction p of the 2^24 values
    return <uint32_t>(<double>p * (1 << 24) + 0.5)


cdef void dropout_forward(floatX* out, const floatX* inp, float p, int seed, int stream,
                          Py_ssize_t N) noexcept nogil:
    cdef uint32_t key = mask_key(<uint32_t>seed, <uint32_t>stream), threshold = drop_below(p)
    cdef float scale = 1.0 / (1.0 - p)
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, i
    for chunk in prange(num_chunks, schedule="static", use_threads_if=num_chunks > 1):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, N)):
            store(out, i, load(inp, i) * scale if element_bits(i, key) >= threshold else 0.0)


cdef void dropout_backward(floatX* dinp, const floatX* dout, float p, int seed, int stream,
                           Py_ssize_t N) noexcept nogil:
    cdef uint32_t key = mask_key(<uint32_t>seed, <uint32_t>stream), threshold = drop_below(p)
    cdef float scale = 1.0 / (1.0 - p)
    cdef Py_ssize_t num_chunks = (N + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, i
    for chunk in prange(num_chunks, schedule="static", use_threads_if=num_chunks > 1):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, N)):
            if element_bits(i, key) >= threshold:
                store(dinp, i, load(dinp, i) + load(dout, i) * scale)


def forward(float[::1] out, const float[::1] inp, float p, int seed, int stream):
    """out (N,) = inp with a fraction p dropped, the rest scaled by 1 / (1 - p): the mask of
    (seed, stream)."""
    cdef Py_ssize_t N = inp.shape[0]
    _check("forward", "out", out.shape[0], N, p)
    if N:
        with nogil:
            dropout_forward(&out[0], &inp[0], p, seed, stream, N)


def backward(float[::1] dinp, const float[::1] dout, float p, int seed, int stream):
    """dinp (N,) += dout through forward's mask of (seed, stream)."""
    cdef Py_ssize_t N = dout.shape[0]
    _check("backward", "dinp", dinp.shape[0], N, p)
    if N:
        with nogil:
            dropout_backward(&dinp[0], &dout[0], p, seed, stream, N)


def _check(where, written, Py_ssize_t n, Py_ssize_t N, float p):
    if n != N:
        raise ValueError(f"dropout.{where}: {written} has {n} elements, expected {N}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout.{where}: p {p:g} must be at least 0 and below 1")
