# Encoder: the first layer of GPT-2, token embedding plus position embedding.
#   out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
#   inp (B,T) int token ids in [0, Vp), wte (Vp,C) token embeddings,
#   wpe (maxT,C) position embeddings with T <= maxT, out (B,T,C).
# Backward scatters dout back into the rows of wte (kernels/embedding's backward) and wpe
# that were read.
from cython.parallel cimport prange

from kernels.bf16 cimport load, store
from kernels.embedding cimport embedding_backward

include "kernels/encoder_wrappers.pxi"


cdef void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                          int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i
    cdef floatX* out_bt
    cdef const floatX* wte_ix
    cdef const floatX* wpe_t
    for bt in prange(BT, schedule="static"):
        out_bt = out + bt * C
        wte_ix = wte + <Py_ssize_t>inp[bt] * C
        wpe_t = wpe + (bt % T) * C
        for i in range(C):
            store(out_bt, i, load(wte_ix, i) + load(wpe_t, i))


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

