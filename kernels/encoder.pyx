# Encoder: the first layer of GPT-2, token embedding plus position embedding.
#   out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
#   inp (B,T) int token ids in [0, Vp), wte (Vp,C) token embeddings,
#   wpe (maxT,C) position embeddings with T <= maxT, out (B,T,C).
# Backward scatters dout back into the rows of wte (kernels/embedding's backward) and wpe
# that were read.
from cython.parallel cimport prange

from kernels.bf16 cimport bf16_to_float, float_to_bf16, load
from kernels.embedding cimport embedding_backward

include "kernels/_encoder_wrappers.pxi"


cdef void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe,
                          int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i
    cdef float* out_bt
    cdef const float* wte_ix
    cdef const float* wpe_t
    for bt in prange(BT, schedule="static"):
        out_bt = out + bt * C
        wte_ix = wte + <Py_ssize_t>inp[bt] * C
        wpe_t = wpe + (bt % T) * C
        for i in range(C):
            out_bt[i] = wte_ix[i] + wpe_t[i]


cdef void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const int* inp,
                           int B, int T, int C) noexcept nogil:
    # dwte: race-free even when many positions share a token id, and in an order that does not
    # depend on the number of threads; dwpe: a thread owns each position's row, summed over b
    embedding_backward(dwte, dout, inp, B, T, C)
    cdef Py_ssize_t t, b, i
    cdef const floatX* dout_bt
    cdef float* dwpe_t
    for t in prange(T, schedule="static"):
        dwpe_t = dwpe + t * C
        for b in range(B):
            dout_bt = dout + (b * <Py_ssize_t>T + t) * C
            for i in range(C):
                dwpe_t[i] = dwpe_t[i] + load(dout_bt, i)


cdef void encoder_forward_bf16(bf16* out, const int* inp, const bf16* wte, const bf16* wpe,
                               int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i
    cdef bf16* out_bt
    cdef const bf16* wte_ix
    cdef const bf16* wpe_t
    for bt in prange(BT, schedule="static"):
        out_bt = out + bt * C
        wte_ix = wte + <Py_ssize_t>inp[bt] * C
        wpe_t = wpe + (bt % T) * C
        for i in range(C):
            out_bt[i] = float_to_bf16(bf16_to_float(wte_ix[i]) + bf16_to_float(wpe_t[i]))
