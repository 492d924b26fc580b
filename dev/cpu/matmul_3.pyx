# matmul variant 3: the three GEMMs handed to OpenBLAS (scipy-openblas32's CBLAS, row-major).
#   forward:  out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,)
#   backward: dinp (B,T,C) += dout @ weight;  dweight (OC,C) += dout^T @ inp;  dbias += sum(dout)
# OpenBLAS parallelises each GEMM with its own pthread pool (size: OPENBLAS_NUM_THREADS, or
# threadpoolctl); the bias fill and the bias-gradient sum are ours, over OpenMP threads.
from cython.parallel cimport prange

include "kernels/matmul_wrappers.pxi"

from kernels.cblas cimport CblasNoTrans, CblasRowMajor, CblasTrans, scipy_cblas_sgemm

cdef enum:
    BIAS_BLOCK = 64   # dbias columns per task: whole cache lines, so threads never share one


cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T
    cdef Py_ssize_t bt, o
    cdef float* out_bt
    cdef float beta = 0.0
    if bias != NULL:
        # rows of out start at the bias and the GEMM accumulates onto them (beta = 1)
        for bt in prange(BT, schedule="static"):
            out_bt = out + bt * OC
            for o in range(OC):
                out_bt[o] = bias[o]
        beta = 1.0
    # out (BT,OC) = inp (BT,C) @ weight (OC,C)^T
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C,
                      1.0, inp, C, weight, C, beta, out, OC)


cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T
    cdef Py_ssize_t block, o, bt
    cdef const float* dout_bt
    # dinp (BT,C) += dout (BT,OC) @ weight (OC,C)
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC,
                      1.0, dout, OC, weight, C, 1.0, dinp, C)
    # dweight (OC,C) += dout^T (OC,BT) @ inp (BT,C)
    scipy_cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT,
                      1.0, dout, OC, inp, C, 1.0, dweight, C)
    if dbias != NULL:
        for block in prange((OC + BIAS_BLOCK - 1) // BIAS_BLOCK, schedule="static"):
            for bt in range(BT):
                dout_bt = dout + bt * OC
                for o in range(block * BIAS_BLOCK, min(block * BIAS_BLOCK + BIAS_BLOCK, <Py_ssize_t>OC)):
                    dbias[o] = dbias[o] + dout_bt[o]
