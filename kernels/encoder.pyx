# Encoder: the first layer of GPT-2, token embedding plus position embedding.
#   out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
#   inp (B,T) int token ids in [0, Vp), wte (Vp,C) token embeddings,
#   wpe (maxT,C) position embeddings with T <= maxT, out (B,T,C).
# Backward scatters dout back into the rows of wte and wpe that were read.
from cython.parallel cimport prange

include "kernels/_encoder_wrappers.pxi"

# encoder_backward splits the channels into blocks of this many floats (128 bytes), one block
# per task: a thread owns its columns of dwte and dwpe, so repeated token ids cannot race
cdef enum:
    CHANNEL_BLOCK = 32


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


cdef void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp,
                           int B, int T, int C) noexcept nogil:
    # parallel over channel blocks, sequential over positions: race-free even when many
    # positions share a token id, and the sum order (hence the result) does not depend on
    # the number of threads
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t num_blocks = (C + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK
    cdef Py_ssize_t block, c0, c1, bt, i
    cdef const float* dout_bt
    cdef float* dwte_ix
    cdef float* dwpe_t
    for block in prange(num_blocks, schedule="static"):
        c0 = block * CHANNEL_BLOCK
        c1 = min(c0 + CHANNEL_BLOCK, <Py_ssize_t>C)
        for bt in range(BT):
            dout_bt = dout + bt * C
            dwte_ix = dwte + <Py_ssize_t>inp[bt] * C
            dwpe_t = dwpe + (bt % T) * C
            for i in range(c0, c1):
                dwte_ix[i] = dwte_ix[i] + dout_bt[i]
                dwpe_t[i] = dwpe_t[i] + dout_bt[i]
