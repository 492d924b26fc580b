# matmul variant 7: kernels.matmul (single-threaded GEMMs inside OpenMP threads), with
# each GEMM split along the longer side of its output instead of always along its columns.
#   forward:  out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,)
#   backward: dinp (B,T,C) += dout @ weight;  dweight (OC,C) += dout^T @ inp;  dbias += sum(dout)
# A thread's GEMM packs the rows of A it needs and the columns of B it needs.  Split along the
# columns, every thread packs all of A; split along the rows, every thread packs all of B.  So
# the cheaper split copies the smaller operand twice: rows when the output has more rows than
# columns (B*T >= OC in the forward, B*T >= C for dinp, OC >= C for dweight).
from cython.parallel cimport prange

from kernels.cblas cimport CBLAS_TRANSPOSE, CblasNoTrans, CblasRowMajor, CblasTrans
from kernels.blas cimport sgemm
from kernels.matmul cimport block_start, leading_dim
from kernels.parallel cimport blas_single_threaded, max_threads

include "kernels/matmul_wrappers.pxi"

cdef inline void gemm_part(int part, int parts, CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b,
                           int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                           float beta, float* C, int ldc) noexcept nogil:
    # this thread's block of C (M,N) = op(A) (M,K) @ op(B) (K,N) + beta C, row-major
    cdef int s0, s1
    if M >= N:
        s0 = block_start(part, parts, M)
        s1 = block_start(part + 1, parts, M)
        if s1 > s0:
            sgemm(CblasRowMajor, trans_a, trans_b, s1 - s0, N, K, 1.0,
                  A + (<Py_ssize_t>s0 * lda if trans_a == CblasNoTrans else s0), lda,
                  B, ldb, beta, C + <Py_ssize_t>s0 * ldc, ldc)
    else:
        s0 = block_start(part, parts, N)
        s1 = block_start(part + 1, parts, N)
        if s1 > s0:
            sgemm(CblasRowMajor, trans_a, trans_b, M, s1 - s0, K, 1.0,
                  A, lda, B + (s0 if trans_b == CblasNoTrans else <Py_ssize_t>s0 * ldb), ldb,
                  beta, C + s0, ldc)


cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T, parts = max_threads(), part, r0, r1
    cdef Py_ssize_t bt, o
    cdef float* out_bt
    cdef float beta = 1.0 if bias != NULL else 0.0
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        if bias != NULL:
            # start this thread's rows of out at the bias and let the GEMM accumulate onto it
            # (whichever way the GEMM is split, a barrier-free fill: each thread its own rows
            # of the rows-split, or all rows of its own columns)
            r0 = block_start(part, parts, BT)
            r1 = block_start(part + 1, parts, BT)
            if BT >= OC:
                for bt in range(r0, r1):
                    out_bt = out + bt * OC
                    for o in range(OC):
                        out_bt[o] = bias[o]
            else:
                r0 = block_start(part, parts, OC)
                r1 = block_start(part + 1, parts, OC)
                for bt in range(BT):
                    out_bt = out + bt * OC
                    for o in range(r0, r1):
                        out_bt[o] = bias[o]
        # out (BT,OC) = inp (BT,C) @ weight (OC,C)^T
        gemm_part(part, parts, CblasNoTrans, CblasTrans, BT, OC, C, inp, leading_dim(C),
                  weight, leading_dim(C), beta, out, leading_dim(OC))


cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T, parts = max_threads(), part, o0, o1
    cdef Py_ssize_t bt, o
    cdef const float* dout_bt
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        # dinp (BT,C) += dout (BT,OC) @ weight (OC,C)
        gemm_part(part, parts, CblasNoTrans, CblasNoTrans, BT, C, OC, dout, leading_dim(OC),
                  weight, leading_dim(C), 1.0, dinp, leading_dim(C))
        # dweight (OC,C) += dout^T (OC,BT) @ inp (BT,C)
        gemm_part(part, parts, CblasTrans, CblasNoTrans, OC, C, BT, dout, leading_dim(OC),
                  inp, leading_dim(C), 1.0, dweight, leading_dim(C))
        if dbias != NULL:
            # dbias[o0:o1] += dout[:, o0:o1] summed over rows: contiguous, vectorised
            o0 = block_start(part, parts, OC)
            o1 = block_start(part + 1, parts, OC)
            for bt in range(BT):
                dout_bt = dout + bt * OC
                for o in range(o0, o1):
                    dbias[o] = dbias[o] + dout_bt[o]
