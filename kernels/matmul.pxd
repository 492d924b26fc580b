# Linear layer: out = inp @ weight^T + bias.  OC output channels.
cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil
# out (B,T,OC); inp (B,T,C); weight (OC,C); bias (OC,) or NULL
cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil
# dinp (B,T,C) or NULL (not wanted), dweight (OC,C), dbias (OC,) or NULL: all += ...;  dout (B,T,OC)


# Shared with the lab's matmul variants (dev/cpu): blocks of columns start on 64-byte
# boundaries, so threads share no cache lines of the output
cdef enum:
    FLOATS_PER_CACHE_LINE = 16


cdef inline int leading_dim(int n) noexcept nogil:
    # BLAS wants a leading dimension >= 1 even when the matrix is empty
    return n if n > 0 else 1


cdef inline int block_start(int part, int parts, int n) noexcept nogil:
    # start of block `part` of `parts` near-equal blocks of n columns (block_start(parts) == n)
    cdef Py_ssize_t start
    if part >= parts:
        return n
    start = (<Py_ssize_t>n * part // parts) // FLOATS_PER_CACHE_LINE * FLOATS_PER_CACHE_LINE
    return <int>start
