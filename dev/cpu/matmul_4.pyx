# matmul variant 4: the three GEMMs through scipy.linalg.cython_blas (SciPy's own OpenBLAS,
# Fortran BLAS, column-major).
#   forward:  out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,)
#   backward: dinp (B,T,C) += dout @ weight;  dweight (OC,C) += dout^T @ inp;  dbias += sum(dout)
# A row-major (R,S) matrix is the column-major (S,R) matrix of its transpose, so each product
# is computed transposed:  out^T (OC,BT) = weight(OC,C) . inp^T  is  sgemm('T','N') on the
# column-major views W^T (C,OC) and inp^T (C,BT), and likewise for the two gradients.
from cython.parallel cimport prange
from scipy.linalg.cython_blas cimport sgemm

include "_matmul_wrappers.pxi"

cdef enum:
    BIAS_BLOCK = 64   # dbias columns per task: whole cache lines, so threads never share one


cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T
    cdef Py_ssize_t bt, o
    cdef float* out_bt
    cdef float alpha = 1.0
    cdef float beta = 0.0
    cdef char trans = b'T'
    cdef char no_trans = b'N'
    if bias != NULL:
        for bt in prange(BT, schedule="static"):
            out_bt = out + bt * OC
            for o in range(OC):
                out_bt[o] = bias[o]
        beta = 1.0
    # column-major: out^T (OC,BT) = (W^T)^T (OC,C) . inp^T (C,BT)
    sgemm(&trans, &no_trans, &OC, &BT, &C, &alpha, <float*>weight, &C, <float*>inp, &C,
          &beta, out, &OC)


cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T
    cdef Py_ssize_t block, o, bt
    cdef const float* dout_bt
    cdef float one = 1.0
    cdef char trans = b'T'
    cdef char no_trans = b'N'
    # column-major: dinp^T (C,BT) += W^T (C,OC) . dout^T (OC,BT)
    sgemm(&no_trans, &no_trans, &C, &BT, &OC, &one, <float*>weight, &C, <float*>dout, &OC,
          &one, dinp, &C)
    # column-major: dweight^T (C,OC) += inp^T (C,BT) . (dout^T)^T (BT,OC)
    sgemm(&no_trans, &trans, &C, &OC, &BT, &one, <float*>inp, &C, <float*>dout, &OC,
          &one, dweight, &C)
    if dbias != NULL:
        for block in prange((OC + BIAS_BLOCK - 1) // BIAS_BLOCK, schedule="static"):
            for bt in range(BT):
                dout_bt = dout + bt * OC
                for o in range(block * BIAS_BLOCK, min(block * BIAS_BLOCK + BIAS_BLOCK, <Py_ssize_t>OC)):
                    dbias[o] = dbias[o] + dout_bt[o]
