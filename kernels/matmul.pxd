# Linear layer: out = inp @ weight^T + bias.  OC output channels.  (The sgemm and CBLAS names
# below are also kernels/matmul.pyx's.)
from kernels.blas cimport sgemm
from kernels.cblas cimport CblasNoTrans, CblasRowMajor, CblasTrans

cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil
# out (B,T,OC); inp (B,T,C); weight (OC,C); bias (OC,) or NULL
cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil
# dinp (B,T,C), dweight (OC,C), dbias (OC,), each NULL where not wanted (dweight: a frozen
# weight, its GEMM skipped): all += ...;  dout (B,T,OC)


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


# One thread's share of matmul_backward (shared with the lab's variants, which divide the
# threads differently):  dinp[:, c0:c1] (BT, c1-c0) += dout (BT,OC) @ weight[:, c0:c1]
cdef inline void dinp_block(float* dinp, const float* dout, const float* weight,
                            int BT, int C, int OC, int c0, int c1) noexcept nogil:
    if c1 > c0:
        sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, c1 - c0, OC,
              1.0, dout, leading_dim(OC), weight + c0, leading_dim(C),
              1.0, dinp + c0, leading_dim(C))


# dweight[o0:o1] (o1-o0, C) (or NULL) += dout[:, o0:o1]^T (o1-o0, BT) @ inp (BT,C), and
# dbias[o0:o1] (or NULL) += dout[:, o0:o1] summed over rows: contiguous, vectorised
cdef inline void dweight_block(float* dweight, float* dbias, const float* dout, const float* inp,
                               int BT, int C, int OC, int o0, int o1) noexcept nogil:
    cdef Py_ssize_t bt, o
    cdef const float* dout_bt
    if o1 <= o0:
        return
    if dweight != NULL:
        sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, BT,
              1.0, dout + o0, leading_dim(OC), inp, leading_dim(C),
              1.0, dweight + <Py_ssize_t>o0 * C, leading_dim(C))
    if dbias != NULL:
        for bt in range(BT):
            dout_bt = dout + bt * OC
            for o in range(o0, o1):
                dbias[o] = dbias[o] + dout_bt[o]
