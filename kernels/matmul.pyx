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
# matrix-vector product, bound by how fast the weight's rows stream in from memory: gemv_rows
# reads 8 rows a pass on each thread (8 vectorised sums, 8 streams of loads in flight, inp
# loaded once for the 8).  It replaced OpenBLAS's sgemv (a row at a time), itself in place of an
# sgemm of one row that packs the weight first: the lab's matmul_9 and matmul_11, promoted
# (dev/BENCHMARKS.md sections 20 and 31).
from cython.parallel cimport prange

from kernels.parallel cimport blas_single_threaded, max_threads

include "kernels/matmul_wrappers.pxi"


cdef void gemv_rows(float* out, const float* inp, const float* weight, const float* bias,
                    int C, int o0, int o1) noexcept nogil:
    # out[o0:o1] = weight[o0:o1] (o1-o0, C) @ inp (C,) + bias[o0:o1] (or NULL), 8 rows a pass
    cdef Py_ssize_t o, c, body = o1 - (o1 - o0) % 8
    cdef const float* row
    cdef float s0, s1, s2, s3, s4, s5, s6, s7
    for o in range(o0, body, 8):
        row = weight + o * C
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
        for c in range(C):
            s0 += inp[c] * row[c]
            s1 += inp[c] * row[C + c]
            s2 += inp[c] * row[2 * C + c]
            s3 += inp[c] * row[3 * C + c]
            s4 += inp[c] * row[4 * C + c]
            s5 += inp[c] * row[5 * C + c]
            s6 += inp[c] * row[6 * C + c]
            s7 += inp[c] * row[7 * C + c]
        out[o] = s0
        out[o + 1] = s1
        out[o + 2] = s2
        out[o + 3] = s3
        out[o + 4] = s4
        out[o + 5] = s5
        out[o + 6] = s6
        out[o + 7] = s7
    for o in range(body, o1):
        row = weight + o * C
        s0 = 0.0
        for c in range(C):
            s0 += inp[c] * row[c]
        out[o] = s0
    if bias != NULL:
        for o in range(o0, o1):
            out[o] += bias[o]


cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T, parts = max_threads(), part, o0, o1
    cdef Py_ssize_t bt, o
    cdef float* out_bt
    if BT == 1:
        for part in prange(parts, schedule="static", num_threads=parts):
            gemv_rows(out, inp, weight, bias, C, block_start(part, parts, OC),
                      block_start(part + 1, parts, OC))
        return
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        o0 = block_start(part, parts, OC)
        o1 = block_start(part + 1, parts, OC)
        if o1 > o0:
            # start this block of out at the bias and let the GEMM accumulate onto it
            if bias != NULL:
                for bt in range(BT):
                    out_bt = out + bt * OC
                    for o in range(o0, o1):
                        out_bt[o] = bias[o]
            # out[:, o0:o1] (BT, o1-o0) = inp (BT,C) @ weight[o0:o1] (o1-o0, C)^T
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, o1 - o0, C,
                  1.0, inp, leading_dim(C), weight + <Py_ssize_t>o0 * C, leading_dim(C),
                  1.0 if bias != NULL else 0.0, out + o0, leading_dim(OC))


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
