# matmul variant 1: the straight port of llm.c's CPU matmul (train_gpt2.c).
#   forward:  out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,)
#   backward: dinp (B,T,C) += dout @ weight;  dweight (OC,C) += dout^T @ inp;  dbias += sum(dout)
# Forward computes 8 rows of out at once so each weight element loaded is used 8 times (the
# naive loop, for B*T not a multiple of 8, uses it once).  Backward is two loops: over rows
# for dinp and over output channels for dweight/dbias, so no two threads write the same float.
from cython.parallel cimport prange

include "kernels/matmul_wrappers.pxi"

cdef enum:
    LOOP_UNROLL = 8


cdef inline void forward_row(float* out_bt, const float* inp_bt, const float* weight,
                             const float* bias, int C, int OC) noexcept nogil:
    cdef Py_ssize_t o, i
    cdef const float* wrow
    cdef float val
    for o in range(OC):
        val = bias[o] if bias != NULL else 0.0
        wrow = weight + o * C
        for i in range(C):
            val += inp_bt[i] * wrow[i]
        out_bt[o] = val


cdef inline void forward_rows8(float* out, const float* inp, const float* weight,
                               const float* bias, Py_ssize_t obt, int C, int OC) noexcept nogil:
    # out rows obt .. obt+7, one output channel at a time
    cdef float result[LOOP_UNROLL]
    cdef Py_ssize_t o, i, ibt
    cdef float w
    for o in range(OC):
        for ibt in range(LOOP_UNROLL):
            result[ibt] = bias[o] if bias != NULL else 0.0
        for i in range(C):
            w = weight[i + o * C]
            for ibt in range(LOOP_UNROLL):
                result[ibt] += inp[(obt + ibt) * C + i] * w
        for ibt in range(LOOP_UNROLL):
            out[(obt + ibt) * OC + o] = result[ibt]


cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, block
    if BT % LOOP_UNROLL != 0:
        for bt in prange(BT, schedule="static"):
            forward_row(out + bt * OC, inp + bt * C, weight, bias, C, OC)
        return
    for block in prange(BT // LOOP_UNROLL, schedule="static"):
        forward_rows8(out, inp, weight, bias, block * LOOP_UNROLL, C, OC)


cdef inline void backward_dinp_row(float* dinp_bt, const float* dout_bt, const float* weight,
                                   int C, int OC) noexcept nogil:
    cdef Py_ssize_t o, i
    cdef const float* wrow
    cdef float d
    for o in range(OC):
        wrow = weight + o * C
        d = dout_bt[o]
        for i in range(C):
            dinp_bt[i] += wrow[i] * d


cdef inline void backward_dweight_row(float* dwrow, float* dbias, const float* dout,
                                      const float* inp, Py_ssize_t o, Py_ssize_t BT,
                                      int C, int OC) noexcept nogil:
    cdef Py_ssize_t bt, i
    cdef const float* inp_bt
    cdef float d
    for bt in range(BT):
        inp_bt = inp + bt * C
        d = dout[bt * OC + o]
        if dbias != NULL:
            dbias[o] += d
        for i in range(C):
            dwrow[i] += inp_bt[i] * d


cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, o
    for bt in prange(BT, schedule="static"):
        backward_dinp_row(dinp + bt * C, dout + bt * OC, weight, C, OC)
    for o in prange(OC, schedule="static"):
        backward_dweight_row(dweight + o * C, dbias, dout, inp, o, BT, C, OC)
