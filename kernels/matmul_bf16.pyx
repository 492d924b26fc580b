# Linear layer in bf16:  out = inp @ weight^T + bias,  llm.c's matmul with bf16 storage.
#   inp (B,T,C), weight (OC,C), bias (OC,) or NULL  ->  out (B,T,OC), all bf16
# Backward, all += (each skipped where its pointer is NULL: a frozen weight saves its GEMM):
#   dinp (B,T,C) bf16      += dout @ weight
#   dweight (OC,C) float32 or bf16 += dout^T @ inp        (summed over the B*T rows)
#   dbias (OC,) float32 or bf16    += dout summed over the B*T rows
# As kernels/matmul.pyx, each OpenMP thread takes a block of output columns and calls the GEMM
# single-threaded.  A bf16 output is computed in float32 a block of ROWS rows at a time (the
# bias, or the old gradient, first; the GEMM adds onto it) and rounded once into place: so is
# a bf16 dweight, its sum over the B*T rows never rounded on the way.
# The forward of one position (B*T = 1: generation's decode step with a KV cache) is a
# matrix-vector product, bound by the bandwidth of reading the weight once: gemv_rows reads the
# bf16 weight as it is (dot_bf16: half fp32's bytes), where the GEMM path would widen it first.
from cython.parallel cimport prange
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset

from kernels.bf16 cimport add_grad, bf16_to_float, float_to_bf16
from kernels.blas cimport bf16_gemm_widens, gemm_bf16, gemm_bf16_widened_b, widened
from kernels.cblas cimport CBLAS_TRANSPOSE, CblasNoTrans, CblasRowMajor, CblasTrans
from kernels.matmul cimport block_start, leading_dim
from kernels.parallel cimport blas_single_threaded, max_threads
from kernels.prefetch cimport prefetch_bytes

cdef enum:
    ROWS = 128       # rows of a float32 block of output: 128 x 768 floats is 384 KiB
    ROWS_AHEAD = 4   # gemv_rows fetches the weight's row this many ahead


cdef int gemm_rounded(bf16* out, int ldo, const bf16* bias, bint accumulate, int BT, int n,
                      int K, CBLAS_TRANSPOSE transa, const bf16* A, int lda,
                      CBLAS_TRANSPOSE transb, const bf16* W, int ldw) noexcept nogil:
    """out (BT, n), row stride ldo, = op(A) (BT, K) @ op(W) (K, n) plus a start, ROWS rows at a
    time in float32, each element rounded once: the start is bias (n,) where given, out's own
    values when accumulating (a gradient added into), else 0.  op(A) = A^T: A is (K, BT)."""
    cdef int chunk, r0, rows, failed = 0, ldw32 = 0
    cdef Py_ssize_t r, j
    cdef float* W32 = NULL
    cdef const bf16* A_rows
    if n <= 0:
        return 0
    if bf16_gemm_widens():   # W widened once for every block, not once a block
        W32 = widened(transb, K, n, W, ldw, &ldw32)
        if W32 == NULL:
            return -1
    cdef float* block = <float*>malloc(<size_t>ROWS * n * sizeof(float))
    if block == NULL:
        free(W32)
        return -1
    for chunk in range((BT + ROWS - 1) // ROWS):
        r0 = chunk * ROWS
        rows = min(ROWS, BT - r0)
        # the start, each case its own loop so that each vectorises
        if accumulate:
            for r in range(rows):
                for j in range(n):
                    block[r * n + j] = bf16_to_float(out[(r0 + r) * <Py_ssize_t>ldo + j])
        elif bias != NULL:
            for r in range(rows):
                for j in range(n):
                    block[r * n + j] = bf16_to_float(bias[j])
        else:
            memset(block, 0, <size_t>rows * n * sizeof(float))
        # op(A)'s rows r0.. are A's columns r0.. when transposed
        A_rows = A + (r0 if transa == CblasTrans else <Py_ssize_t>r0 * lda)
        if W32 != NULL:
            failed |= gemm_bf16_widened_b(CblasRowMajor, transa, transb, rows, n, K, 1.0, A_rows,
                                          lda, W32, ldw32, 1.0, block, n)
        else:
            failed |= gemm_bf16(CblasRowMajor, transa, transb, rows, n, K, 1.0, A_rows, lda, W,
                                ldw, 1.0, block, n)
        for r in range(rows):
            for j in range(n):
                out[(r0 + r) * <Py_ssize_t>ldo + j] = float_to_bf16(block[r * n + j])
    free(block)
    free(W32)
    return failed


cdef int dweight_block(floatG* dweight, floatG* dbias, const bf16* dout, const bf16* inp,
                       int BT, int C, int OC, int o0, int o1) noexcept nogil:
    """dweight[o0:o1] += dout[:, o0:o1]^T @ inp; dbias[o0:o1] too (each skipped where NULL).
    float32: the GEMM adds straight into dweight.  bf16: summed in float32, rounded once."""
    cdef Py_ssize_t bt, o
    cdef int failed = 0
    cdef float* sums
    if o1 <= o0:
        return 0
    if dweight != NULL:
        if floatG is float:
            failed = gemm_bf16(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, BT,
                               1.0, dout + o0, leading_dim(OC), inp, leading_dim(C),
                               1.0, dweight + <Py_ssize_t>o0 * C, leading_dim(C))
        else:
            failed = gemm_rounded(dweight + <Py_ssize_t>o0 * C, C, NULL, True, o1 - o0, C, BT,
                                  CblasTrans, dout + o0, leading_dim(OC), CblasNoTrans, inp,
                                  leading_dim(C))
    if dbias != NULL:
        if floatG is float:
            for bt in range(BT):
                for o in range(o0, o1):
                    dbias[o] = dbias[o] + bf16_to_float(dout[bt * OC + o])
        else:
            # the B*T rows summed in float32 (rows outer: contiguous reads), added once
            sums = <float*>calloc(o1 - o0, sizeof(float))
            if sums == NULL:
                return -1
            for bt in range(BT):
                for o in range(o0, o1):
                    sums[o - o0] = sums[o - o0] + bf16_to_float(dout[bt * OC + o])
            for o in range(o0, o1):
                add_grad(dbias, o, sums[o - o0])
            free(sums)
    return failed


cdef void gemv_rows(bf16* out, const bf16* weight, const float* x_even, const float* x_odd,
                    const bf16* bias, int C, int o0, int o1) noexcept nogil:
    """out[o0:o1] = weight[o0:o1] (o1-o0, C) @ x (C,) + bias[o0:o1] (or NULL), x as
    split_pairs's halves: each row's dot_bf16, then its bias, rounded once.  The row
    ROWS_AHEAD on is fetched while this one is summed: a decode token streams every weight from
    memory, and a row at a time left the hardware prefetchers too little to go on (on a Zen 3
    each run's best token of matmuls 6-21% faster on stories15M and stories110M, the 1B's no
    slower end to end: dev/BENCHMARKS.md section 31)."""
    cdef Py_ssize_t o
    cdef float total
    for o in range(o0, o1):
        if o + ROWS_AHEAD < o1:
            prefetch_bytes(weight + (o + ROWS_AHEAD) * <Py_ssize_t>C, C * <Py_ssize_t>sizeof(bf16))
        total = dot_bf16(weight + o * <Py_ssize_t>C, x_even, x_odd, C)
        if bias != NULL:
            total += bf16_to_float(bias[o])
        out[o] = float_to_bf16(total)


cdef int matmul_forward_bf16(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                             int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T, parts = max_threads(), part, o0, o1, failed = 0
    cdef float* x
    if BT == 1:   # out (OC,) = weight (OC,C) @ inp (C,) + bias, the input widened once
        x = <float*>malloc(<size_t>(C + 1) * sizeof(float))
        if x == NULL:
            return -1
        split_pairs(x, x + (C + 1) // 2, inp, C)
        for part in prange(parts, schedule="static", num_threads=parts):
            gemv_rows(out, weight, x, x + (C + 1) // 2, bias, C, block_start(part, parts, OC),
                      block_start(part + 1, parts, OC))
        free(x)
        return 0
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        o0 = block_start(part, parts, OC)
        o1 = block_start(part + 1, parts, OC)
        # out[:, o0:o1] = inp @ weight[o0:o1]^T + bias[o0:o1]
        failed |= gemm_rounded(out + o0, OC, bias + o0 if bias != NULL else NULL, False, BT,
                               o1 - o0, C, CblasNoTrans, inp, leading_dim(C), CblasTrans,
                               weight + <Py_ssize_t>o0 * C, leading_dim(C))
    return -1 if failed else 0


cdef int matmul_backward_bf16(bf16* dinp, floatG* dweight, floatG* dbias, const bf16* dout,
                              const bf16* inp, const bf16* weight, int B, int T, int C,
                              int OC) noexcept nogil:
    cdef int BT = B * T, parts = max_threads(), part, c0, c1, failed = 0
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        if dinp != NULL:
            # dinp[:, c0:c1] += dout @ weight[:, c0:c1]
            c0 = block_start(part, parts, C)
            c1 = block_start(part + 1, parts, C)
            failed |= gemm_rounded(dinp + c0, C, NULL, True, BT, c1 - c0, OC, CblasNoTrans, dout,
                                   leading_dim(OC), CblasNoTrans, weight + c0, leading_dim(C))
        failed |= dweight_block(dweight, dbias, dout, inp, BT, C, OC,
                                block_start(part, parts, OC), block_start(part + 1, parts, OC))
    return -1 if failed else 0


# --- Python wrappers (tests, dev/bench_blas.py): bf16 tensors as uint16 arrays of their bits ---

def forward(unsigned short[:, :, ::1] out, const unsigned short[:, :, ::1] inp,
            const unsigned short[:, ::1] weight, const unsigned short[::1] bias=None):
    """out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,), all bf16 bits (uint16)."""
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2], OC = weight.shape[0]
    if weight.shape[1] != C or (out.shape[0], out.shape[1], out.shape[2]) != (B, T, OC) or \
            (bias is not None and bias.shape[0] != OC):
        raise ValueError("matmul_bf16.forward: shapes do not match (B,T,C) @ (OC,C)^T -> (B,T,OC)")
    if B * T == 0 or OC == 0:
        return
    cdef const bf16* bias_ptr = <const bf16*>&bias[0] if bias is not None else NULL
    cdef int failed
    with nogil:
        failed = matmul_forward_bf16(<bf16*>&out[0, 0, 0], <const bf16*>&inp[0, 0, 0],
                                     <const bf16*>&weight[0, 0], bias_ptr, B, T, C, OC)
    if failed:
        raise MemoryError("matmul_bf16.forward: no memory for its float32 blocks")


def _check_backward(str where, dinp, dweight, dbias, dout, inp, weight):
    B, T, C = inp.shape[0], inp.shape[1], inp.shape[2]
    OC = weight.shape[0]
    if weight.shape[1] != C or tuple(dout.shape[:3]) != (B, T, OC) or \
            tuple(dinp.shape[:3]) != (B, T, C) or tuple(dweight.shape[:2]) != (OC, C) or \
            (dbias is not None and dbias.shape[0] != OC):
        raise ValueError(f"matmul_bf16.{where}: shapes do not match the forward's")


def backward(unsigned short[:, :, ::1] dinp, float[:, ::1] dweight, float[::1] dbias,
             const unsigned short[:, :, ::1] dout, const unsigned short[:, :, ::1] inp,
             const unsigned short[:, ::1] weight):
    """dinp (B,T,C) bf16, dweight (OC,C) float32, dbias (OC,) float32 or None += gradients from
    dout (B,T,OC) bf16."""
    _check_backward("backward", dinp, dweight, dbias, dout, inp, weight)
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2], OC = weight.shape[0]
    if B * T == 0 or OC == 0:
        return
    cdef float* dbias_ptr = &dbias[0] if dbias is not None else NULL
    cdef int failed
    with nogil:
        failed = matmul_backward_bf16(<bf16*>&dinp[0, 0, 0], &dweight[0, 0], dbias_ptr,
                                      <const bf16*>&dout[0, 0, 0], <const bf16*>&inp[0, 0, 0],
                                      <const bf16*>&weight[0, 0], B, T, C, OC)
    if failed:
        raise MemoryError("matmul_bf16.backward: no memory for its float32 blocks")


def backward_bf16_grads(unsigned short[:, :, ::1] dinp, unsigned short[:, ::1] dweight,
                        unsigned short[::1] dbias, const unsigned short[:, :, ::1] dout,
                        const unsigned short[:, :, ::1] inp, const unsigned short[:, ::1] weight):
    """backward with bf16 gradients: dweight (OC,C), dbias (OC,) or None bf16 bits too, each
    element rounded once."""
    _check_backward("backward_bf16_grads", dinp, dweight, dbias, dout, inp, weight)
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2], OC = weight.shape[0]
    if B * T == 0 or OC == 0:
        return
    cdef bf16* dbias_ptr = <bf16*>&dbias[0] if dbias is not None else NULL
    cdef int failed
    with nogil:
        failed = matmul_backward_bf16(<bf16*>&dinp[0, 0, 0], <bf16*>&dweight[0, 0], dbias_ptr,
                                      <const bf16*>&dout[0, 0, 0], <const bf16*>&inp[0, 0, 0],
                                      <const bf16*>&weight[0, 0], B, T, C, OC)
    if failed:
        raise MemoryError("matmul_bf16.backward_bf16_grads: no memory for its float32 blocks")
