# Linear layer (llm.c's matmul):  out = inp @ weight^T + bias
#   inp (B,T,C), weight (OC,C), bias (OC,) or NULL  ->  out (B,T,OC)
# Backward, all += :
#   dinp (B,T,C)   += dout @ weight
#   dweight (OC,C) += dout^T @ inp        (summed over the B*T rows)
#   dbias (OC,)    += dout summed over the B*T rows
# The three GEMMs go to OpenBLAS (scipy-openblas32, row-major views of the same buffers); its
# own thread pool sizes itself, so no thread count is fixed here.  The bias sum is ours.
from cython.parallel cimport prange
from libc.limits cimport INT_MAX

cdef extern from "cblas.h" nogil:
    enum CBLAS_ORDER:
        CblasRowMajor
    enum CBLAS_TRANSPOSE:
        CblasNoTrans
        CblasTrans
    void scipy_cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb,
                           int M, int N, int K, float alpha, const float* A, int lda,
                           const float* B, int ldb, float beta, float* C, int ldc)

# columns of dbias summed by one thread at a time: a whole number of cache lines, so no two
# threads write the same line, and wide enough for the row loop to vectorise
cdef enum:
    BIAS_BLOCK = 64


cdef inline int leading_dim(int n) noexcept nogil:
    # BLAS wants a leading dimension >= 1 even when the matrix is empty
    return n if n > 0 else 1


cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T
    cdef Py_ssize_t bt, o
    cdef float* out_bt
    cdef float beta = 0.0
    if bias != NULL:
        # start each row of out at the bias and let the GEMM accumulate onto it
        for bt in prange(BT, schedule="static"):
            out_bt = out + bt * OC
            for o in range(OC):
                out_bt[o] = bias[o]
        beta = 1.0
    # out (BT,OC) = inp (BT,C) @ weight(OC,C)^T
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C,
                      1.0, inp, leading_dim(C), weight, leading_dim(C), beta, out, leading_dim(OC))


cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T
    cdef Py_ssize_t block, o, o_end, bt
    cdef Py_ssize_t num_blocks = (OC + BIAS_BLOCK - 1) // BIAS_BLOCK
    cdef const float* dout_bt
    # dinp (BT,C) += dout (BT,OC) @ weight (OC,C)
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC,
                      1.0, dout, leading_dim(OC), weight, leading_dim(C), 1.0, dinp, leading_dim(C))
    # dweight (OC,C) += dout^T (OC,BT) @ inp (BT,C)
    scipy_cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT,
                      1.0, dout, leading_dim(OC), inp, leading_dim(C), 1.0, dweight, leading_dim(C))
    if dbias != NULL:
        # each thread owns a block of columns and sweeps all rows over it: contiguous reads,
        # the inner loop vectorises, and the partial sums stay in cache
        for block in prange(num_blocks, schedule="static"):
            o_end = min((block + 1) * BIAS_BLOCK, OC)
            for bt in range(BT):
                dout_bt = dout + bt * OC
                for o in range(block * BIAS_BLOCK, o_end):
                    dbias[o] = dbias[o] + dout_bt[o]


cdef int expect_shape(str where, str name, const Py_ssize_t* shape, int ndim, tuple expected) except -1:
    got = tuple([shape[i] for i in range(ndim)])
    if got != expected:
        raise ValueError(f"{where}: {name} has shape {got}, expected {expected}")
    return 0


cdef int check_sizes(str where, Py_ssize_t B, Py_ssize_t T, Py_ssize_t C, Py_ssize_t OC) except -1:
    if B * T > INT_MAX or C > INT_MAX or OC > INT_MAX:
        raise ValueError(f"{where}: sizes B*T={B * T}, C={C}, OC={OC} exceed the BLAS int range")
    return 0


def forward(float[:, :, ::1] out, const float[:, :, ::1] inp, const float[:, ::1] weight,
            const float[::1] bias=None):
    """out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,) (bias may be None)."""
    where = "matmul.forward"
    cdef Py_ssize_t B = inp.shape[0], T = inp.shape[1], C = inp.shape[2], OC = weight.shape[0]
    expect_shape(where, "weight", weight.shape, 2, (OC, C))
    expect_shape(where, "out", out.shape, 3, (B, T, OC))
    if bias is not None:
        expect_shape(where, "bias", bias.shape, 1, (OC,))
    check_sizes(where, B, T, C, OC)
    cdef const float* bias_ptr = &bias[0] if bias is not None else NULL
    with nogil:
        matmul_forward(&out[0, 0, 0], &inp[0, 0, 0], &weight[0, 0], bias_ptr, B, T, C, OC)


def backward(float[:, :, ::1] dinp, float[:, ::1] dweight, float[::1] dbias,
             const float[:, :, ::1] dout, const float[:, :, ::1] inp, const float[:, ::1] weight):
    """dinp (B,T,C), dweight (OC,C), dbias (OC,) or None  +=  gradients from dout (B,T,OC)."""
    where = "matmul.backward"
    cdef Py_ssize_t B = inp.shape[0], T = inp.shape[1], C = inp.shape[2], OC = weight.shape[0]
    expect_shape(where, "weight", weight.shape, 2, (OC, C))
    expect_shape(where, "dout", dout.shape, 3, (B, T, OC))
    expect_shape(where, "dinp", dinp.shape, 3, (B, T, C))
    expect_shape(where, "dweight", dweight.shape, 2, (OC, C))
    if dbias is not None:
        expect_shape(where, "dbias", dbias.shape, 1, (OC,))
    check_sizes(where, B, T, C, OC)
    cdef float* dbias_ptr = &dbias[0] if dbias is not None else NULL
    with nogil:
        matmul_backward(&dinp[0, 0, 0], &dweight[0, 0], dbias_ptr, &dout[0, 0, 0], &inp[0, 0, 0],
                        &weight[0, 0], B, T, C, OC)
