# matmul variant 5: OpenBLAS GEMMs on OpenMP's threads (one thread pool for the whole step).
#   forward:  out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,)
#   backward: dinp (B,T,C) += dout @ weight;  dweight (OC,C) += dout^T @ inp;  dbias += sum(dout)
# Each OpenMP thread makes one single-threaded OpenBLAS call on its own slice of the output:
# a block of output channels for out and dweight (with their bias and bias gradient), a block
# of input channels for dinp.  The slices never overlap, every weight element is read by one
# thread only, and the only threads running are OpenMP's, so no BLAS thread pool spins against
# the OpenMP team between layers.  OpenBLAS's own pool must be one thread for this; its thread
# count is process-wide and anything may reset it (threadpoolctl, another module), so every
# call checks it (cheap) and sets it back to 1: with 2, each call from an OpenMP thread would
# start OpenBLAS threads of its own ("Detect OpenMP Loop" warning, 3x slower steps).
from cython.parallel cimport prange

include "_matmul_wrappers.pxi"

from kernels.cblas cimport (CblasNoTrans, CblasRowMajor, CblasTrans, scipy_cblas_sgemm,
                            scipy_openblas_get_num_threads, scipy_openblas_set_num_threads)

from kernels.parallel cimport max_threads

cdef enum:
    ALIGN = 16   # slice boundaries on 16 floats: every slice starts on a cache line


cdef inline void blas_single_threaded() noexcept nogil:
    if scipy_openblas_get_num_threads() != 1:
        scipy_openblas_set_num_threads(1)


cdef inline int slice_start(int n, int part, int parts) noexcept nogil:
    # start of slice `part` of `parts` near-equal slices of range(n), on ALIGN boundaries
    if part >= parts:
        return n
    return <int>((<long long>n * part // parts) // ALIGN * ALIGN)


cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T
    cdef int parts = max_threads()
    cdef int part, o0, o1
    cdef Py_ssize_t bt, o
    cdef float* out_bt
    cdef float beta
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        o0 = slice_start(OC, part, parts)
        o1 = slice_start(OC, part + 1, parts)
        if o1 > o0:
            beta = 0.0
            if bias != NULL:
                # this thread's columns of out start at the bias, and its GEMM adds onto them
                for bt in range(BT):
                    out_bt = out + bt * OC
                    for o in range(o0, o1):
                        out_bt[o] = bias[o]
                beta = 1.0
            # out[:, o0:o1] = inp (BT,C) @ weight[o0:o1]^T
            scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, o1 - o0, C,
                              1.0, inp, C, weight + <Py_ssize_t>o0 * C, C, beta, out + o0, OC)


cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T
    cdef int parts = max_threads()
    cdef int part, c0, c1, o0, o1
    cdef Py_ssize_t o, bt
    cdef const float* dout_bt
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        # dinp[:, c0:c1] += dout (BT,OC) @ weight[:, c0:c1]
        c0 = slice_start(C, part, parts)
        c1 = slice_start(C, part + 1, parts)
        if c1 > c0:
            scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, c1 - c0, OC,
                              1.0, dout, OC, weight + c0, C, 1.0, dinp + c0, C)
        # dweight[o0:o1] += dout[:, o0:o1]^T @ inp (BT,C);  dbias[o0:o1] += column sums of dout
        o0 = slice_start(OC, part, parts)
        o1 = slice_start(OC, part + 1, parts)
        if o1 > o0:
            scipy_cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, BT,
                              1.0, dout + o0, OC, inp, C, 1.0, dweight + <Py_ssize_t>o0 * C, C)
            if dbias != NULL:
                for bt in range(BT):
                    dout_bt = dout + bt * OC
                    for o in range(o0, o1):
                        dbias[o] = dbias[o] + dout_bt[o]
