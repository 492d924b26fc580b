# flash_attention (promoted from dev/cpu/flash_attention_3.pyx): tiles of queries x keys, their
# products through kernels.blas's sgemm, the softmax never stored.  Two forms of one kernel:
#   GPT-2's   inp (B,T,3C) = q, k, v;  out (B,T,C);  NH heads of hs = C/NH
#   Llama's   q (B,T,NH,hs);  k, v (B,T,NKV,hs), grouped-query: query head h reads key/value
#             head h / (NH/NKV), NKV dividing NH (kernels/attention_gqa.pyx's order);
#             out (B,T,NH,hs)
#   both      lse (B,NH,T): each row's log-sum-exp of its scaled scores
# GPT-2's form is Llama's with NKV = NH and q, k, v strided views of inp (row stride 3C): the
# tiles below take q, k, v, out and their gradients as separate pointers with row strides.
# dev/cpu/flash_attention_1's algorithm on tiles of BQ query rows x BK keys, so that each
# product is one single-threaded sgemm on strided views of q, k, v, out and the gradients (no
# copies), and the scores of a tile stay in the thread's L2:
#   forward   S = scale Q K^T;  online softmax over the tile's rows (running max m and sum l,
#             the rows of out rescaled by exp(m_old - m_new) when the max grows);  out += P V;
#             at the end out /= l, lse = m + log l
#   backward  P = exp(S - lse);  dV += P^T dO;  dP = dO V^T;  dS = P (dP - D), D = rowsum(dO out);
#             dQ += scale dS K;  dK += scale dS^T Q
# Causal: a query tile only visits the key blocks up to its last row; inside a block that
# crosses the diagonal the scores above it are set to probability 0 before any product.
# Threads: forward over (b, h, query tile), longest tiles first; backward over (b, key/value
# head), each taking the NH/NKV query heads that share it in order, since a query tile adds into
# the k and v gradients of every key block before it (and the heads of a group into the same
# ones): no two threads write the same gradient rows, and the sums do not depend on the threads.
# Variant 3 over variant 2 (64 x 64 tiles; dev/BENCHMARKS.md section 6): GCC does not vectorise
# a max reduction without -ffinite-math-only (never used here), so variant 2's row maximum was
# one serial chain of compares; here it is kernels.rowmax's, in 16 independent lanes, which
# GCC keeps in registers, 16 compares in flight; and tiles of 128 x 256, a quarter of the
# sgemm calls.
# The scratch tiles (128 KB each, two in backward) live on the thread's stack.  The exponentials
# use kernels.vexp's vectorisable exp; the BLAS is held to one thread (kernels.parallel's
# blas_single_threaded), as in every kernel that calls it from OpenMP's threads.
# bf16 (floatX, kernels/bf16.pxd): q, k, v, out and their gradients bf16, the softmax's
# statistics (m, l, lse, D) and every sum float32.  Each product is kernels.blas's gemm_bf16
# (bf16 operands, float32 products and sums: MKL's AMX/AVX512_BF16 GEMM where the CPU has them,
# else sgemm on widened tiles), so the float32 tiles that enter one, P and dS, are rounded to
# bf16 first, as FlashAttention-2 does on a GPU: one numerics on every CPU.  The outputs are
# summed in float32 (a tile of out and of dq, a head group's whole dk and dv, in per-thread
# scratch) and rounded once, added to what the gradients held.  No float32 copy of q, k, v or
# out is made (the fp32 kernel on widened copies, check:'s oracle, holds 8 floats per token
# and channel in backward: dinp and inp of 3C each, dout and out).
from cython.parallel cimport prange, threadid
from libc.math cimport logf, sqrtf, INFINITY
from libc.stdlib cimport free, malloc

from kernels.bf16 cimport floatX, float_to_bf16, load
from kernels.cblas cimport CBLAS_TRANSPOSE, CblasNoTrans, CblasRowMajor, CblasTrans
from kernels.blas cimport gemm_bf16, sgemm
from kernels.parallel cimport blas_single_threaded, max_threads
from kernels.rowmax cimport row_max
from kernels.vexp cimport vexpf

include "kernels/flash_attention_wrappers.pxi"

cdef enum:
    BQ = 128   # query rows per tile
    BK = 256   # keys per block


cdef inline int visible(int t, int j0, int cols) noexcept nogil:
    # how many of the keys j0 .. j0+cols-1 query t sees (t2 <= t)
    return max(0, min(cols, t - j0 + 1))


# Where one head's rows are: its first row (b, t=0, head) and the stride between rows.
ctypedef struct Strides:
    int q      # q, dq (GPT-2: 3C; Llama: NH*hs)
    int kv     # k, v, dk, dv (GPT-2: 3C; Llama: NKV*hs)
    int o      # out, dout (GPT-2: C; Llama: NH*hs)


cdef inline int product(CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb, int M, int N, int K,
                        float alpha, const floatX* A, int lda, const floatX* B, int ldb,
                        float beta, float* C, int ldc) noexcept nogil:
    # C (M,N) float32 = alpha op(A) op(B) + beta C, in the kernel's precision's GEMM;
    # -1 where the bf16 GEMM found no memory for its widened operands
    if floatX is float:
        sgemm(CblasRowMajor, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
        return 0
    else:
        return gemm_bf16(CblasRowMajor, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta,
                         C, ldc)


cdef inline const floatX* operand(const float* tile, floatX* rounded, int rows,
                                  int cols) noexcept nogil:
    # a float32 tile (rows, cols), row stride BK, as a GEMM operand: itself at fp32, rounded to
    # bf16 into `rounded` (same strides) at bf16
    cdef int r, c
    if floatX is float:
        return tile
    else:
        for r in range(rows):
            for c in range(cols):
                rounded[r * BK + c] = float_to_bf16(tile[r * BK + c])
        return rounded


cdef int forward_tile(floatX* out, float* lse, const floatX* q, const floatX* k,
                      const floatX* v, Strides ld, int b, int h, int i0, int T, int NH, int NKV,
                      int hs, float* acc, floatX* P_rounded) noexcept nogil:
    # acc (BQ, hs), P_rounded (BQ, BK): this thread's scratch at bf16 (the tile's float32 out
    # and its probabilities in bf16); at fp32 the tile sums into out itself
    cdef int kvh = h // (NH // NKV)
    cdef float scale = 1.0 / sqrtf(hs)
    cdef const floatX* q_bh = q + <Py_ssize_t>b * T * ld.q + h * hs
    cdef const floatX* k_bh = k + <Py_ssize_t>b * T * ld.kv + kvh * hs
    cdef const floatX* v_bh = v + <Py_ssize_t>b * T * ld.kv + kvh * hs
    cdef floatX* out_i = out + (<Py_ssize_t>b * T + i0) * ld.o + h * hs
    cdef float* lse_i = lse + (<Py_ssize_t>b * NH + h) * T + i0
    cdef int rows = min(<int>BQ, T - i0)
    cdef float S[BQ * BK]      # scores, then probabilities (unnormalised) of one block
    cdef float m[BQ]           # running max of each row's scores
    cdef float l[BQ]           # running sum of exp(score - m)
    cdef float* o_sum          # the tile's rows of out, unnormalised, float32
    cdef int ld_sum
    cdef float* row
    cdef float* o
    cdef float new_max, correction, total, e
    cdef int r, c, d, j0, cols, n, failed = 0
    if floatX is float:
        o_sum, ld_sum = out_i, ld.o
    else:
        o_sum, ld_sum = acc, hs
    for r in range(rows):
        m[r] = -INFINITY
        l[r] = 0.0
        o = o_sum + <Py_ssize_t>r * ld_sum
        for d in range(hs):
            o[d] = 0.0
    j0 = 0
    while j0 < i0 + rows:
        cols = min(<int>BK, i0 + rows - j0)
        # S (rows, cols) = scale Q[i0:] K[j0:]^T
        failed |= product(CblasNoTrans, CblasTrans, rows, cols, hs, scale,
                          q_bh + <Py_ssize_t>i0 * ld.q, ld.q, k_bh + <Py_ssize_t>j0 * ld.kv,
                          ld.kv, 0.0, S, BK)
        for r in range(rows):
            row = S + r * BK
            n = visible(i0 + r, j0, cols)
            new_max = max(m[r], row_max(row, n))
            total = 0.0
            for c in range(n):
                e = vexpf(row[c] - new_max)
                row[c] = e
                total = total + e
            for c in range(n, cols):
                row[c] = 0.0
            if new_max != m[r]:
                correction = vexpf(m[r] - new_max) if l[r] > 0.0 else 0.0
                l[r] = l[r] * correction
                o = o_sum + <Py_ssize_t>r * ld_sum
                for d in range(hs):
                    o[d] = o[d] * correction
                m[r] = new_max
            l[r] = l[r] + total
        # out[i0:] += P V[j0:]
        failed |= product(CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0,
                          operand(S, P_rounded, rows, cols), BK, v_bh + <Py_ssize_t>j0 * ld.kv,
                          ld.kv, 1.0, o_sum, ld_sum)
        j0 += BK
    for r in range(rows):
        o = o_sum + <Py_ssize_t>r * ld_sum
        e = 1.0 / l[r]
        for d in range(hs):
            if floatX is float:
                o[d] = o[d] * e
            else:
                out_i[<Py_ssize_t>r * ld.o + d] = float_to_bf16(o[d] * e)
        lse_i[r] = m[r] + logf(l[r])
    return failed


cdef int backward_head(floatX* dq, float* dk_sum, float* dv_sum, int ld_sum, const floatX* dout,
                       const floatX* q, const floatX* k, const floatX* v, const floatX* out,
                       const float* lse, Strides ld, int b, int h, int T, int NH, int NKV,
                       int hs, float* dq_tile, floatX* P_rounded,
                       floatX* dS_rounded) noexcept nogil:
    # dk_sum, dv_sum: this head's key/value head's gradient rows (row stride ld_sum), summed
    # into: dk and dv themselves at fp32, the thread's float32 copies at bf16.  dq_tile (BQ,
    # hs), P_rounded, dS_rounded (BQ, BK): this thread's scratch at bf16
    cdef float scale = 1.0 / sqrtf(hs)
    cdef Py_ssize_t q_base = <Py_ssize_t>b * T * ld.q + h * hs
    cdef Py_ssize_t kv_base = <Py_ssize_t>b * T * ld.kv + (h // (NH // NKV)) * hs
    cdef Py_ssize_t o_base = <Py_ssize_t>b * T * ld.o + h * hs
    cdef const floatX* q_bh = q + q_base
    cdef const floatX* k_bh = k + kv_base
    cdef const floatX* v_bh = v + kv_base
    cdef floatX* dq_bh = dq + q_base
    cdef const floatX* dout_bh = dout + o_base
    cdef const floatX* out_bh = out + o_base
    cdef const float* lse_bh = lse + (<Py_ssize_t>b * NH + h) * T
    cdef float P[BQ * BK]      # probabilities of one tile
    cdef float dS[BQ * BK]     # their gradient, then the scores' gradient
    cdef float D[BQ]           # rowsum(dO * out): the softmax gradient's per-row term
    cdef const floatX* Pn      # P, dS as GEMM operands (rounded to bf16 at bf16)
    cdef const floatX* dSn
    cdef float* dq_sum         # the query tile's dq rows, summed into
    cdef int ld_dq
    cdef float* p_r
    cdef float* ds_r
    cdef float dot, lse_r
    cdef int i0, j0, rows, cols, r, c, d, n, failed = 0
    i0 = 0
    while i0 < T:
        rows = min(<int>BQ, T - i0)
        for r in range(rows):
            dot = 0.0
            for d in range(hs):
                dot = dot + (load(dout_bh, <Py_ssize_t>(i0 + r) * ld.o + d) *
                             load(out_bh, <Py_ssize_t>(i0 + r) * ld.o + d))
            D[r] = dot
        if floatX is float:
            dq_sum, ld_dq = dq_bh + <Py_ssize_t>i0 * ld.q, ld.q
        else:
            dq_sum, ld_dq = dq_tile, hs
            for r in range(rows):
                for d in range(hs):
                    dq_sum[r * hs + d] = load(dq_bh, <Py_ssize_t>(i0 + r) * ld.q + d)
        j0 = 0
        while j0 < i0 + rows:
            cols = min(<int>BK, i0 + rows - j0)
            # P = exp(scale Q K^T - lse), 0 where the key is in the future
            failed |= product(CblasNoTrans, CblasTrans, rows, cols, hs, scale,
                              q_bh + <Py_ssize_t>i0 * ld.q, ld.q, k_bh + <Py_ssize_t>j0 * ld.kv,
                              ld.kv, 0.0, P, BK)
            for r in range(rows):
                p_r = P + r * BK
                n = visible(i0 + r, j0, cols)
                lse_r = lse_bh[i0 + r]
                for c in range(n):
                    p_r[c] = vexpf(p_r[c] - lse_r)
                for c in range(n, cols):
                    p_r[c] = 0.0
            Pn = operand(P, P_rounded, rows, cols)
            # dV[j0:] += P^T dO[i0:]
            failed |= product(CblasTrans, CblasNoTrans, cols, hs, rows, 1.0, Pn, BK,
                              dout_bh + <Py_ssize_t>i0 * ld.o, ld.o, 1.0,
                              dv_sum + <Py_ssize_t>j0 * ld_sum, ld_sum)
            # dP = dO[i0:] V[j0:]^T, then dS = P (dP - D)
            failed |= product(CblasNoTrans, CblasTrans, rows, cols, hs, 1.0,
                              dout_bh + <Py_ssize_t>i0 * ld.o, ld.o,
                              v_bh + <Py_ssize_t>j0 * ld.kv, ld.kv, 0.0, dS, BK)
            for r in range(rows):
                p_r = P + r * BK
                ds_r = dS + r * BK
                for c in range(cols):
                    ds_r[c] = p_r[c] * (ds_r[c] - D[r])
            dSn = operand(dS, dS_rounded, rows, cols)
            # dQ[i0:] += scale dS K[j0:];  dK[j0:] += scale dS^T Q[i0:]
            failed |= product(CblasNoTrans, CblasNoTrans, rows, hs, cols, scale, dSn, BK,
                              k_bh + <Py_ssize_t>j0 * ld.kv, ld.kv, 1.0, dq_sum, ld_dq)
            failed |= product(CblasTrans, CblasNoTrans, cols, hs, rows, scale, dSn, BK,
                              q_bh + <Py_ssize_t>i0 * ld.q, ld.q, 1.0,
                              dk_sum + <Py_ssize_t>j0 * ld_sum, ld_sum)
            j0 += BK
        if floatX is not float:
            for r in range(rows):
                for d in range(hs):
                    dq_bh[<Py_ssize_t>(i0 + r) * ld.q + d] = float_to_bf16(dq_sum[r * hs + d])
        i0 += BQ
    return failed


cdef int flash_forward(floatX* out, float* lse, const floatX* q, const floatX* k,
                       const floatX* v, Strides ld, int B, int T, int NH, int NKV,
                       int hs) noexcept nogil:
    cdef Py_ssize_t tiles = (T + BQ - 1) // BQ, unit, bh, tile
    cdef int num_threads = max_threads(), failed = 0
    # at bf16 each thread's tile of float32 out (BQ, hs) and its probabilities in bf16 (BQ, BK)
    cdef Py_ssize_t per_thread = <Py_ssize_t>BQ * hs + BQ * BK // 2
    cdef float* scratch = NULL
    cdef float* mine
    if floatX is not float:
        scratch = <float*>malloc(num_threads * per_thread * sizeof(float))
        if scratch == NULL:
            return -1
    blas_single_threaded()
    # the last query tiles see the most keys: hand them out first, the short ones fill the gaps
    for unit in prange(<Py_ssize_t>B * NH * tiles, schedule="dynamic", num_threads=num_threads):
        tile = tiles - 1 - unit // (B * NH)
        bh = unit % (B * NH)
        mine = scratch + threadid() * per_thread if scratch != NULL else NULL
        failed += forward_tile(out, lse, q, k, v, ld, <int>(bh // NH), <int>(bh % NH),
                               <int>(tile * BQ), T, NH, NKV, hs, mine,
                               <floatX*>(mine + BQ * hs) if mine != NULL else <floatX*>NULL)
    free(scratch)
    return -1 if failed else 0


cdef int flash_backward(floatX* dq, floatX* dk, floatX* dv, const floatX* dout,
                        const floatX* q, const floatX* k, const floatX* v, const floatX* out,
                        const float* lse, Strides ld, int B, int T, int NH, int NKV,
                        int hs) noexcept nogil:
    cdef int group = NH // NKV, num_threads = max_threads(), failed = 0
    # at bf16 each thread's float32 dk and dv rows of one key/value head (T, hs) each, a query
    # tile's dq (BQ, hs), and P and dS in bf16 (BQ, BK) each
    cdef Py_ssize_t per_thread = 2 * <Py_ssize_t>T * hs + BQ * hs + BQ * BK
    cdef float* scratch = NULL
    cdef float* mine
    cdef float* dk_sum
    cdef float* dv_sum
    cdef floatX* P_rounded
    cdef Py_ssize_t bkv, kv_base, t
    cdef int h, d, ld_sum
    if floatX is not float:
        scratch = <float*>malloc(num_threads * per_thread * sizeof(float))
        if scratch == NULL:
            return -1
    blas_single_threaded()
    for bkv in prange(<Py_ssize_t>B * NKV, schedule="static", num_threads=num_threads):
        kv_base = (bkv // NKV) * T * ld.kv + (bkv % NKV) * hs
        if floatX is float:
            mine, P_rounded = NULL, NULL
            dk_sum, dv_sum, ld_sum = dk + kv_base, dv + kv_base, ld.kv
        else:
            mine = scratch + threadid() * per_thread
            P_rounded = <floatX*>(mine + 2 * <Py_ssize_t>T * hs + BQ * hs)
            dk_sum, dv_sum, ld_sum = mine, mine + <Py_ssize_t>T * hs, hs
            for t in range(T):
                for d in range(hs):
                    dk_sum[t * hs + d] = load(dk, kv_base + t * ld.kv + d)
                    dv_sum[t * hs + d] = load(dv, kv_base + t * ld.kv + d)
        for h in range(<int>(bkv % NKV) * group, <int>(bkv % NKV + 1) * group):
            failed += backward_head(dq, dk_sum, dv_sum, ld_sum, dout, q, k, v, out, lse, ld,
                                    <int>(bkv // NKV), h, T, NH, NKV, hs,
                                    mine + 2 * <Py_ssize_t>T * hs if mine != NULL else NULL,
                                    P_rounded, P_rounded + BQ * BK if mine != NULL else NULL)
        if floatX is not float:
            for t in range(T):
                for d in range(hs):
                    dk[kv_base + t * ld.kv + d] = float_to_bf16(dk_sum[t * hs + d])
                    dv[kv_base + t * ld.kv + d] = float_to_bf16(dv_sum[t * hs + d])
    free(scratch)
    return -1 if failed else 0


cdef int flash_attention_forward(floatX* out, float* lse, const floatX* inp,
                                 int B, int T, int C, int NH) noexcept nogil:
    cdef Strides ld = Strides(3 * C, 3 * C, C)
    return flash_forward(out, lse, inp, inp + C, inp + 2 * C, ld, B, T, NH, NH, C // NH)


cdef int flash_attention_backward(floatX* dinp, const floatX* dout, const floatX* inp,
                                  const floatX* out, const float* lse,
                                  int B, int T, int C, int NH) noexcept nogil:
    cdef Strides ld = Strides(3 * C, 3 * C, C)
    return flash_backward(dinp, dinp + C, dinp + 2 * C, dout, inp, inp + C, inp + 2 * C, out,
                          lse, ld, B, T, NH, NH, C // NH)


cdef int flash_attention_gqa_forward(floatX* out, float* lse, const floatX* q, const floatX* k,
                                     const floatX* v, int B, int T, int NH, int NKV,
                                     int hs) noexcept nogil:
    cdef Strides ld = Strides(NH * hs, NKV * hs, NH * hs)
    return flash_forward(out, lse, q, k, v, ld, B, T, NH, NKV, hs)


cdef int flash_attention_gqa_backward(floatX* dq, floatX* dk, floatX* dv, const floatX* dout,
                                      const floatX* q, const floatX* k, const floatX* v,
                                      const floatX* out, const float* lse, int B, int T, int NH,
                                      int NKV, int hs) noexcept nogil:
    cdef Strides ld = Strides(NH * hs, NKV * hs, NH * hs)
    return flash_backward(dq, dk, dv, dout, q, k, v, out, lse, ld, B, T, NH, NKV, hs)


# ----------------------------------------------------------------------------
# Python wrappers of Llama's form (GPT-2's are in flash_attention_wrappers.pxi)

cdef tuple shape4(const Py_ssize_t* shape):
    return (shape[0], shape[1], shape[2], shape[3])


cdef tuple gqa_dims(str where, tuple q_shape, tuple k_shape, tuple v_shape):
    B, T, NH, hs = q_shape
    NKV = k_shape[2]
    if NKV <= 0 or NH % NKV != 0:
        raise ValueError(f"flash_attention.{where}: k has {NKV} heads, which must divide the "
                         f"{NH} heads of q")
    _check(where, k_shape, (B, T, NKV, hs), "k")
    _check(where, v_shape, (B, T, NKV, hs), "v")
    return B, T, NH, NKV, hs


def forward_gqa(float[:, :, :, ::1] out, float[:, :, ::1] lse, const float[:, :, :, ::1] q,
                const float[:, :, :, ::1] k, const float[:, :, :, ::1] v):
    """out (B,T,NH,hs), lse (B,NH,T)  <-  causal attention of q (B,T,NH,hs) over k, v
    (B,T,NKV,hs), grouped-query, and each row's log-sum-exp of its scaled scores."""
    cdef int B, T, NH, NKV, hs
    B, T, NH, NKV, hs = gqa_dims("forward_gqa", shape4(q.shape), shape4(k.shape), shape4(v.shape))
    _check("forward_gqa", shape4(out.shape), (B, T, NH, hs), "out")
    _check("forward_gqa", (lse.shape[0], lse.shape[1], lse.shape[2]), (B, NH, T), "lse")
    if B * T * NH * hs == 0:
        return
    with nogil:
        flash_attention_gqa_forward(&out[0, 0, 0, 0], &lse[0, 0, 0], &q[0, 0, 0, 0],
                                    &k[0, 0, 0, 0], &v[0, 0, 0, 0], B, T, NH, NKV, hs)


def backward_gqa(float[:, :, :, ::1] dq, float[:, :, :, ::1] dk, float[:, :, :, ::1] dv,
                 const float[:, :, :, ::1] dout, const float[:, :, :, ::1] q,
                 const float[:, :, :, ::1] k, const float[:, :, :, ::1] v,
                 const float[:, :, :, ::1] out, const float[:, :, ::1] lse):
    """dq (B,T,NH,hs), dk, dv (B,T,NKV,hs)  +=  the gradient from dout (B,T,NH,hs), recomputing
    the softmax from q, k and the forward's out and lse."""
    cdef int B, T, NH, NKV, hs
    B, T, NH, NKV, hs = gqa_dims("backward_gqa", shape4(q.shape), shape4(k.shape), shape4(v.shape))
    for name, got, want in (("dq", shape4(dq.shape), (B, T, NH, hs)),
                            ("dk", shape4(dk.shape), (B, T, NKV, hs)),
                            ("dv", shape4(dv.shape), (B, T, NKV, hs)),
                            ("dout", shape4(dout.shape), (B, T, NH, hs)),
                            ("out", shape4(out.shape), (B, T, NH, hs)),
                            ("lse", (lse.shape[0], lse.shape[1], lse.shape[2]), (B, NH, T))):
        _check("backward_gqa", got, want, name)
    if B * T * NH * hs == 0:
        return
    with nogil:
        flash_attention_gqa_backward(&dq[0, 0, 0, 0], &dk[0, 0, 0, 0], &dv[0, 0, 0, 0],
                                     &dout[0, 0, 0, 0], &q[0, 0, 0, 0], &k[0, 0, 0, 0],
                                     &v[0, 0, 0, 0], &out[0, 0, 0, 0], &lse[0, 0, 0],
                                     B, T, NH, NKV, hs)
