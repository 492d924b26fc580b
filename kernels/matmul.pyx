# Linear layer (llm.c's matmul):  out = inp @ weight^T + bias
#   inp (B,T,C), weight (OC,C), bias (OC,) or NULL  ->  out (B,T,OC)
# Backward, all += (each skipped where its pointer is NULL: a frozen weight saves its GEMM):
#   dinp (B,T,C)   += dout @ weight
#   dweight (OC,C) += dout^T @ inp        (summed over the B*T rows)
#   dbias (OC,)    += dout summed over the B*T rows
# The GEMMs go to kernels.blas's sgemm (OpenBLAS or MKL, row-major views of the same buffers),
# run single-threaded inside our own OpenMP threads, each on its own block of output columns:
# one thread pool, so the library's threads never compete for the cores with OpenMP's spinning
# ones.  OpenBLAS's thread count is process-wide and anything may reset it (threadpoolctl,
# another module), so each call checks it (cheap) and sets it back to 1.
# The forward of one position (B*T = 1: generation's decode step with a KV cache) is a
# matrix-vector product, bound by the bandwidth of reading the weight once: OpenBLAS's sgemv
# streams the weight rows, where an sgemm of one row still packs them into panels first (the
# lab's matmul_9, promoted: 2.5-3.7x at GPT-2's decode shapes, dev/BENCHMARKS.md section 20).
from cython.parallel cimport prange

from kernels.cblas cimport scipy_cblas_sgemv
from kernels.parallel cimport blas_single_threaded, max_threads

include "kernels/matmul_wrappers.pxi"


cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T, parts = max_threads(), part, o0, o1
    cdef Py_ssize_t bt, o
    cdef float* out_bt
    cdef float beta
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        o0 = block_start(part, parts, OC)
        o1 = block_start(part + 1, parts, OC)
        beta = 0.0
        if bias != NULL:
            # start this block of out at the bias and let the GEMM accumulate onto it
            for bt in range(BT):
                out_bt = out + bt * OC
                for o in range(o0, o1):
                    out_bt[o] = bias[o]
            beta = 1.0
        if o1 > o0 and BT == 1:   # out[o0:o1] = weight[o0:o1] (o1-o0, C) @ inp (C,)
            scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, o1 - o0, C, 1.0,
                              weight + <Py_ssize_t>o0 * C, leading_dim(C), inp, 1, beta,
                              out + o0, 1)
        elif o1 > o0:   # out[:, o0:o1] (BT, o1-o0) = inp (BT,C) @ weight[o0:o1] (o1-o0, C)^T
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, o1 - o0, C,
                  1.0, inp, leading_dim(C), weight + <Py_ssize_t>o0 * C, leading_dim(C),
                  beta, out + o0, leading_dim(OC))


cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T, parts = max_threads(), part
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        if dinp != NULL:
            dinp_block(dinp, dout, weight, BT, C, OC,
                       block_start(part, parts, C), block_start(part + 1, parts, C))
        dweight_block(dweight, dbias, dout, inp, BT, C, OC,
                      block_start(part, parts, OC), block_start(part + 1, parts, OC))
