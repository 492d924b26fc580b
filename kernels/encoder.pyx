# Encoder: the first layer of GPT-2, token embedding plus position embedding.
#   out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
#   inp (B,T) int token ids in [0, Vp), wte (Vp,C) token embeddings,
#   wpe (maxT,C) position embeddings with T <= maxT, out (B,T,C).
# Backward scatters dout back into the rows of wte (kernels/embedding's backward) and wpe
# that were read; into bf16 gradients, each element's contribution summed in float32 and
# added once.
from cython.parallel cimport prange

from kernels.bf16 cimport add_grad, load, store
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


cdef void encoder_backward(floatG* dwte, floatG* dwpe, const floatX* dout, const int* inp,
                           int B, int T, int C) noexcept nogil:
    # dwte: race-free even when many positions share a token id, and in an order that does not
    # depend on the number of threads; dwpe: a thread owns each position's row, summed over b
    embedding_backward(dwte, dout, inp, B, T, C)
    cdef Py_ssize_t t, b, i
    cdef const floatX* dout_bt
    cdef floatG* dwpe_t
    cdef float total
    for t in prange(T, schedule="static"):
        dwpe_t = dwpe + t * C
        if floatG is float:
            for b in range(B):
                dout_bt = dout + (b * <Py_ssize_t>T + t) * C
                for i in range(C):
                    dwpe_t[i] = dwpe_t[i] + load(dout_bt, i)
        else:
            # bf16: each element's sum over b in float32 first, rounded into dwpe_t once
            for i in range(C):
                total = 0.0
                for b in range(B):
                    total = total + load(dout, (b * <Py_ssize_t>T + t) * C + i)
                add_grad(dwpe_t, i, total)


# ----------------------------------------------------------------------------
# Python wrapper with bf16 gradients (tests), here rather than in kernels/encoder_wrappers.pxi:
# the dev/cpu variants that include that file take float32 gradients only

def backward_bf16_grads(bf16[:, ::1] dwte, bf16[:, ::1] dwpe, const floatX[:, :, ::1] dout,
                        const int[:, ::1] inp):
    """backward with bf16 gradients: dwte (Vp,C), dwpe (maxT,C) bf16 bits (uint16) += the
    gradients from dout (B,T,C), float32 or bf16 bits; each element rounded once."""
    _check_args("backward_bf16_grads", "dout", (dout.shape[0], dout.shape[1], dout.shape[2]),
                inp, "dwte", (dwte.shape[0], dwte.shape[1]), "dwpe", (dwpe.shape[0], dwpe.shape[1]))
    cdef int B = inp.shape[0], T = inp.shape[1], C = dwte.shape[1]
    if B == 0 or T == 0 or C == 0:
        return
    with nogil:
        encoder_backward(&dwte[0, 0], &dwpe[0, 0], &dout[0, 0, 0], &inp[0, 0], B, T, C)
