# encoder variant 1: the straight port of llm.c's CPU encoder, single-threaded.
#   out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) ids, wte (Vp,C), wpe (maxT,C)
#   backward: dwte[inp[b,t]] += dout[b,t];  dwpe[t] += dout[b,t]
include "kernels/encoder_wrappers.pxi"


cdef void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe,
                          int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t b, t, i
    cdef float* out_bt
    cdef const float* wte_ix
    cdef const float* wpe_t
    for b in range(B):
        for t in range(T):
            out_bt = out + (b * T + t) * C
            wte_ix = wte + <Py_ssize_t>inp[b * T + t] * C
            wpe_t = wpe + t * C
            for i in range(C):
                out_bt[i] = wte_ix[i] + wpe_t[i]


cdef void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp,
                           int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t b, t, i
    cdef const float* dout_bt
    cdef float* dwte_ix
    cdef float* dwpe_t
    for b in range(B):
        for t in range(T):
            dout_bt = dout + (b * T + t) * C
            dwte_ix = dwte + <Py_ssize_t>inp[b * T + t] * C
            dwpe_t = dwpe + t * C
            for i in range(C):
                dwte_ix[i] += dout_bt[i]
                dwpe_t[i] += dout_bt[i]
