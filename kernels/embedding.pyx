# Token embedding, the first layer of Llama: kernels/encoder without the position table
# (encoder reads wpe unconditionally; Llama's positions enter through RoPE instead).
#   out[b,t,:] = wte[inp[b,t],:]
#   inp (B,T) int token ids in [0, Vp), wte (Vp,C) token embeddings, out (B,T,C).
# Backward scatters dout back into the rows of wte that were read.  A bf16 dwte gets each row's
# whole contribution summed in float32 first and added once: the positions sorted by token id,
# so that each run of one id is summed before its one rounding.
from cython.parallel cimport prange
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcpy

from kernels.bf16 cimport add_grad, load
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


cdef int compare_keys(const void* a, const void* b) noexcept nogil:
    cdef uint64_t x = (<const uint64_t*>a)[0], y = (<const uint64_t*>b)[0]
    return (x > y) - (x < y)


cdef inline void add_token_runs(floatG* dwte, const floatX* dout, const uint64_t* keys,
                                Py_ssize_t BT, int C, Py_ssize_t c0, Py_ssize_t c1) noexcept nogil:
    """dwte[:, c0:c1] += dout's rows summed per token id in float32, each row of dwte added
    into once; keys: the positions sorted by (id, position), the id in the upper 32 bits."""
    cdef float sums[CHANNEL_BLOCK]   # on this call's stack: one per thread
    cdef Py_ssize_t start = 0, end, i
    cdef int ix
    cdef const floatX* dout_bt
    while start < BT:
        ix = <int>(keys[start] >> 32)
        for i in range(c1 - c0):
            sums[i] = 0.0
        end = start
        while end < BT and <int>(keys[end] >> 32) == ix:
            dout_bt = dout + <Py_ssize_t><uint32_t>keys[end] * C + c0
            for i in range(c1 - c0):
                sums[i] += load(dout_bt, i)
            end += 1
        for i in range(c1 - c0):
            add_grad(dwte, <Py_ssize_t>ix * C + c0 + i, sums[i])
        start = end


cdef inline void add_token_scans(floatG* dwte, const floatX* dout, const int* inp,
                                 Py_ssize_t BT, int C, Py_ssize_t c0, Py_ssize_t c1) noexcept nogil:
    """add_token_runs's sums in its order without the keys: each id's positions found by
    scanning inp from its first, quadratic in B*T (where malloc failed)."""
    cdef float sums[CHANNEL_BLOCK]
    cdef Py_ssize_t bt, j, i
    cdef const floatX* dout_j
    for bt in range(BT):
        j = 0
        while j < bt and inp[j] != inp[bt]:
            j += 1
        if j < bt:   # not the id's first position: summed already
            continue
        for i in range(c1 - c0):
            sums[i] = 0.0
        for j in range(bt, BT):
            if inp[j] == inp[bt]:
                dout_j = dout + j * C + c0
                for i in range(c1 - c0):
                    sums[i] += load(dout_j, i)
        for i in range(c1 - c0):
            add_grad(dwte, <Py_ssize_t>inp[bt] * C + c0 + i, sums[i])


cdef void embedding_backward(floatG* dwte, const floatX* dout, const int* inp,
                             int B, int T, int C) noexcept nogil:
    # parallel over channel blocks, sequential over positions: race-free when positions share
    # a token id, and the sum order (hence the result) does not depend on the thread count
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t num_blocks = (C + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK
    cdef Py_ssize_t block, c0, c1, bt, i
    cdef const floatX* dout_bt
    cdef floatG* dwte_ix
    cdef uint64_t* keys
    if floatG is float:
        for block in prange(num_blocks, schedule="static", use_threads_if=BT * C >= SERIAL_BELOW):
            c0 = block * CHANNEL_BLOCK
            c1 = min(c0 + CHANNEL_BLOCK, <Py_ssize_t>C)
            for bt in range(BT):
                dout_bt = dout + bt * C
                dwte_ix = dwte + <Py_ssize_t>inp[bt] * C
                for i in range(c0, c1):
                    dwte_ix[i] = dwte_ix[i] + load(dout_bt, i)
    else:
        # bf16: one rounding per element of each row read, so a token id's positions are summed
        # first, in position order.  They are sorted once per call as (id, position) keys, all
        # distinct (ids >= 0 and positions < 2^31 each fit 32 bits), so qsort's order is the
        # only one, whatever the thread count.  Without memory for the keys, the same sums are
        # found by scanning (add_token_scans): slower, the same result.
        keys = <uint64_t*>malloc(<size_t>BT * sizeof(uint64_t))
        if keys != NULL:
            for bt in range(BT):
                keys[bt] = ((<uint64_t><uint32_t>inp[bt]) << 32) | <uint64_t>bt
            qsort(keys, <size_t>BT, sizeof(uint64_t), compare_keys)
        for block in prange(num_blocks, schedule="static", use_threads_if=BT * C >= SERIAL_BELOW):
            c0 = block * CHANNEL_BLOCK
            c1 = min(c0 + CHANNEL_BLOCK, <Py_ssize_t>C)
            if keys != NULL:
                add_token_runs(dwte, dout, keys, BT, C, c0, c1)
            else:
                add_token_scans(dwte, dout, inp, BT, C, c0, c1)
        free(keys)


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


def backward_bf16_grads(bf16[:, ::1] dwte, const floatX[:, :, ::1] dout, const int[:, ::1] inp):
    """backward with a bf16 gradient: dwte (Vp,C) bf16 bits (uint16) += dout (B,T,C), float32
    or bf16 bits, scattered to the rows inp read; each element of dwte rounded once."""
    _check_args("backward_bf16_grads", "dout", (dout.shape[0], dout.shape[1], dout.shape[2]),
                inp, "dwte", (dwte.shape[0], dwte.shape[1]))
    cdef int B = inp.shape[0], T = inp.shape[1], C = dwte.shape[1]
    if B == 0 or T == 0 or C == 0:
        return
    with nogil:
        embedding_backward(&dwte[0, 0], &dout[0, 0, 0], &inp[0, 0], B, T, C)
