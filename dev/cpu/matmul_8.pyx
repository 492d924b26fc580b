# matmul variant 8: kernels.matmul, with backward's two GEMMs on two halves of the threads
# instead of each GEMM split over all of them.
# Linear layer (llm.c's matmul):  out = inp @ weight^T + bias
#   inp (B,T,C), weight (OC,C), bias (OC,) or NULL  ->  out (B,T,OC)
# Backward, all += :
#   dinp (B,T,C)   += dout @ weight
#   dweight (OC,C) += dout^T @ inp        (summed over the B*T rows)
#   dbias (OC,)    += dout summed over the B*T rows
# The GEMMs go to kernels.blas's sgemm (OpenBLAS or MKL, row-major views of the same buffers),
# run single-threaded inside our own OpenMP threads, each on its own block of output columns:
# one thread pool, so the library's threads never compete for the cores with OpenMP's spinning
# ones.  OpenBLAS's thread count is process-wide and anything may reset it (threadpoolctl,
# another module), so each call checks it (cheap) and sets it back to 1.
# Backward's two GEMMs have the same FLOPs (2*B*T*C*OC each).  With an even number of threads,
# the first half share dinp's and the second half dweight's (and dbias): on 2 threads each runs
# one whole GEMM, instead of two half GEMMs that each pack all of dout (dinp's columns) or all
# of inp (dweight's rows) again; small GEMMs (B*T = 256) gain the most.  With an odd number,
# or without dinp, every thread takes a block of each.
from cython.parallel cimport prange

from kernels.cblas cimport CblasNoTrans, CblasRowMajor, CblasTrans
from kernels.blas cimport sgemm
from kernels.matmul cimport block_start, leading_dim
from kernels.parallel cimport blas_single_threaded, max_threads

include "kernels/_matmul_wrappers.pxi"


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
        # out[:, o0:o1] (BT, o1-o0) = inp (BT,C) @ weight[o0:o1] (o1-o0, C)^T
        if o1 > o0:
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, o1 - o0, C,
                  1.0, inp, leading_dim(C), weight + <Py_ssize_t>o0 * C, leading_dim(C),
                  beta, out + o0, leading_dim(OC))


cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T, parts = max_threads(), part, c0, c1, o0, o1
    cdef bint halves = dinp != NULL and parts % 2 == 0
    cdef int dinp_parts = parts // 2 if halves else parts      # dinp's: threads 0 .. dinp_parts-1
    cdef int dweight_part0 = parts // 2 if halves else 0       # dweight's: dweight_part0 .. parts-1
    cdef Py_ssize_t bt, o
    cdef const float* dout_bt
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        if dinp != NULL and part < dinp_parts:
            # dinp[:, c0:c1] (BT, c1-c0) += dout (BT,OC) @ weight[:, c0:c1] (OC, c1-c0)
            c0 = block_start(part, dinp_parts, C)
            c1 = block_start(part + 1, dinp_parts, C)
            if c1 > c0:
                sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, c1 - c0, OC,
                      1.0, dout, leading_dim(OC), weight + c0, leading_dim(C),
                      1.0, dinp + c0, leading_dim(C))
        if part >= dweight_part0:
            # dweight[o0:o1] (o1-o0, C) += dout[:, o0:o1]^T (o1-o0, BT) @ inp (BT,C)
            o0 = block_start(part - dweight_part0, parts - dweight_part0, OC)
            o1 = block_start(part - dweight_part0 + 1, parts - dweight_part0, OC)
            if o1 > o0:
                sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, BT,
                      1.0, dout + o0, leading_dim(OC), inp, leading_dim(C),
                      1.0, dweight + <Py_ssize_t>o0 * C, leading_dim(C))
                if dbias != NULL:
                    # dbias[o0:o1] += dout[:, o0:o1] summed over rows: contiguous, vectorised
                    for bt in range(BT):
                        dout_bt = dout + bt * OC
                        for o in range(o0, o1):
                            dbias[o] = dbias[o] + dout_bt[o]
