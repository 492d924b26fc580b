# Token embedding, the first layer of Llama: kernels/encoder without the position table
# (encoder reads wpe unconditionally; Llama's positions enter through RoPE instead).
#   out[b,t,:] = wte[inp[b,t],:]
#   inp (B,T) int token ids in [0, Vp), wte (Vp,C) token embeddings, out (B,T,C).
# Backward scatters dout back into the rows of wte that were read.
from cython.parallel cimport prange
from libc.string cimport memcpy

from kernels.bf16 cimport load
from kernels.parallel cimport SERIAL_BELOW

# embedding_backward splits the channels into blocks of this many floats (128 bytes), one
# block per task: a thread owns its columns of dwte, so repeated token ids cannot race
cdef enum:
    CHANNEL_BLOCK = 32


cdef void embedding_forward(floatX* out, const int* inp, const floatX* wte,
                            int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t bt
    for bt in prange(<Py_ssize_t>B * T, schedule="static",
                     use_threads_if=<Py_ssize_t>B * T * C >= SERIAL_BELOW):
        memcpy(out + bt * C, wte + <Py_ssize_t>inp[bt] * C, C * sizeof(floatX))


cdef void embedding_backward(float* dwte, const floatX* dout, const int* inp,
                             int B, int T, int C) noexcept nogil:
    # parallel over channel blocks, sequential over positions: race-free when positions share
    # a token id, and the sum order (hence the result) does not depend on the thread count
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t num_blocks = (C + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK
    cdef Py_ssize_t block, c0, c1, bt, i
    cdef const floatX* dout_bt
    cdef float* dwte_ix
    for block in prange(num_blocks, schedule="static", use_threads_if=BT * C >= SERIAL_BELOW):
        c0 = block * CHANNEL_BLOCK
        c1 = min(c0 + CHANNEL_BLOCK, <Py_ssize_t>C)
        for bt in range(BT):
            dout_bt = dout + bt * C
            dwte_ix = dwte + <Py_ssize_t>inp[bt] * C
            for i in range(c0, c1):
                dwte_ix[i] = dwte_ix[i] + load(dout_bt, i)


# ----------------------------------------------------------------------------
# Python wrappers: check shapes and token ids, then run the kernel without the GIL

cdef _check_args(str where, str act, tuple act_shape, const int[:, ::1] inp, str table,
                 tuple table_shape):
    # act (B,T,C) is out or dout, table (Vp,C) is wte or dwte
    cdef Py_ssize_t b, t
    cdef int ix
    B, T = inp.shape[0], inp.shape[1]
    Vp, C = table_shape
    if act_shape != (B, T, C):
        raise ValueError(f"embedding.{where}: {act} has shape {act_shape}, expected {(B, T, C)}")
    for b in range(B):
        for t in range(T):
            ix = inp[b, t]
            if ix < 0 or ix >= Vp:
                raise ValueError(f"embedding.{where}: inp[{b}, {t}] = {ix} is not a row of "
                                 f"{table} (expected 0 <= id < {Vp})")


def forward(float[:, :, ::1] out, const int[:, ::1] inp, const float[:, ::1] wte):
    """out (B,T,C) = wte[inp]; inp (B,T) int32, wte (Vp,C)."""
    _check_args("forward", "out", (out.shape[0], out.shape[1], out.shape[2]), inp,
                "wte", (wte.shape[0], wte.shape[1]))
    cdef int B = inp.shape[0], T = inp.shape[1], C = wte.shape[1]
    if B == 0 or T == 0 or C == 0:
        return
    with nogil:
        embedding_forward(&out[0, 0, 0], &inp[0, 0], &wte[0, 0], B, T, C)


def backward(float[:, ::1] dwte, const float[:, :, ::1] dout, const int[:, ::1] inp):
    """dwte (Vp,C) += dout (B,T,C) scattered to the rows inp (B,T) int32 read."""
    _check_args("backward", "dout", (dout.shape[0], dout.shape[1], dout.shape[2]), inp,
                "dwte", (dwte.shape[0], dwte.shape[1]))
    cdef int B = inp.shape[0], T = inp.shape[1], C = dwte.shape[1]
    if B == 0 or T == 0 or C == 0:
        return
    with nogil:
        embedding_backward(&dwte[0, 0], &dout[0, 0, 0], &inp[0, 0], B, T, C)
