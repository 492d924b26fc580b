# Causal self-attention with grouped-query heads (GQA), as in Llama 2 70B, TinyLlama, Llama 3:
#   q (B,T,NH,hs), k, v (B,T,NKV,hs), out (B,T,NH,hs), att (B,NH,T,T);  NKV divides NH
#   query head h attends with key/value head h // (NH/NKV) (Meta's repeat_kv order);
#   NKV = NH is ordinary multi-head attention, NKV = 1 multi-query attention.
#   att[b,h,t,:] = softmax over t2 <= t of  q[b,t,h] . k[b,t2,h'] / sqrt(hs);  zero for t2 > t
#   out[b,t,h] = sum_t2 att[b,h,t,t2] v[b,t2,h']
# The design of kernels/attention.pyx (the GPT-2 kernel): one OpenMP task per (b, h) head,
# whose products are single-threaded sgemm calls (kernels.blas) on strided views of q, k, v (row
# strides NH*hs and NKV*hs, no copies), in blocks of TB rows so that row block i only
# multiplies columns 0 .. (i+1)TB (the causal mask skips about half the square at large T):
#   forward   att = softmax(scale q k^T),  out = att v
#   backward  S = dout v^T,  dv += att^T dout,  S = att (S - rowsum(att S)),
#             dq += scale S k,  dk += scale S^T q
# Only att is stored (the pre-softmax scores are not needed for backward), and backward's
# scores S live in one TB x T scratch block per thread instead of two (B,NH,T,T) buffers.
# With NKV < NH, the NH/NKV query heads of a group add into the same rows of dk and dv: to
# keep one task per query head (all B*NH of them in parallel, even at NKV = 1), each head
# adds into its own (T,hs) rows of a scratch buffer, and a second pass sums each group's rows
# into dk, dv in a fixed order (the result does not depend on the number of threads).
# The BLAS must run single-threaded for calls from OpenMP threads: the kernels see to it, as
# kernels/matmul does.  The softmax uses kernels.vexp's vectorisable exp.
from cython.parallel cimport prange, threadid
from libc.math cimport sqrtf
from libc.stdlib cimport calloc, free, malloc

from kernels.cblas cimport CblasNoTrans, CblasRowMajor, CblasTrans
from kernels.blas cimport sgemm
from kernels.attention cimport softmax_rows
from kernels.parallel cimport blas_single_threaded, max_threads

cdef enum:
    TB = 64   # rows of the scores per block of the causal mask


cdef void forward_head(float* out, float* att, const float* q, const float* k, const float* v,
                       int b, int h, int T, int NH, int NKV, int hs) noexcept nogil:
    cdef int ldq = NH * hs, ldkv = NKV * hs
    cdef int kvh = h // (NH // NKV)
    cdef float scale = 1.0 / sqrtf(hs)
    cdef const float* q_bh = q + <Py_ssize_t>b * T * ldq + h * hs
    cdef const float* k_bh = k + <Py_ssize_t>b * T * ldkv + kvh * hs
    cdef const float* v_bh = v + <Py_ssize_t>b * T * ldkv + kvh * hs
    cdef float* att_bh = att + (<Py_ssize_t>b * NH + h) * T * T
    cdef float* out_bh = out + <Py_ssize_t>b * T * ldq + h * hs
    cdef int t0 = 0, rows, cols
    while t0 < T:
        rows = min(<int>TB, T - t0)
        cols = t0 + rows
        # att[t0:t0+rows, :cols] = scale q[t0:t0+rows] k[:cols]^T, then softmax in place
        sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale,
              q_bh + <Py_ssize_t>t0 * ldq, ldq, k_bh, ldkv, 0.0,
              att_bh + <Py_ssize_t>t0 * T, T)
        softmax_rows(att_bh, att_bh, t0, t0 + rows, T)  # in place
        # out[t0:t0+rows] = att[t0:t0+rows, :cols] v[:cols]
        sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0,
              att_bh + <Py_ssize_t>t0 * T, T, v_bh, ldkv, 0.0,
              out_bh + <Py_ssize_t>t0 * ldq, ldq)
        t0 += TB


cdef void backward_head(float* dq, float* dk_bh, float* dv_bh, int lddkv, float* scores,
                        const float* dout, const float* q, const float* k, const float* v,
                        const float* att, int b, int h, int T, int NH, int NKV, int hs) noexcept nogil:
    # dk_bh, dv_bh (T rows, leading dimension lddkv): where this head's dk, dv go;
    # scores (TB, T): this thread's scratch block
    cdef int ldq = NH * hs, ldkv = NKV * hs
    cdef int kvh = h // (NH // NKV)
    cdef float scale = 1.0 / sqrtf(hs)
    cdef const float* q_bh = q + <Py_ssize_t>b * T * ldq + h * hs
    cdef const float* k_bh = k + <Py_ssize_t>b * T * ldkv + kvh * hs
    cdef const float* v_bh = v + <Py_ssize_t>b * T * ldkv + kvh * hs
    cdef const float* att_bh = att + (<Py_ssize_t>b * NH + h) * T * T
    cdef const float* dout_bh = dout + <Py_ssize_t>b * T * ldq + h * hs
    cdef float* dq_bh = dq + <Py_ssize_t>b * T * ldq + h * hs
    cdef const float* att_t
    cdef float* s_i
    cdef int t0 = 0, rows, cols, i
    cdef Py_ssize_t t, t2
    cdef float dot
    while t0 < T:
        rows = min(<int>TB, T - t0)
        cols = t0 + rows
        # out = att v:  S = dout[t0:] v[:cols]^T (the gradient of att's rows),
        # dv[:cols] += att[t0:, :cols]^T dout[t0:] (att is zero above the diagonal)
        sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, 1.0,
              dout_bh + <Py_ssize_t>t0 * ldq, ldq, v_bh, ldkv, 0.0, scores, T)
        sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, 1.0,
              att_bh + <Py_ssize_t>t0 * T, T, dout_bh + <Py_ssize_t>t0 * ldq, ldq,
              1.0, dv_bh, lddkv)
        # softmax: S[t2] = att[t2] (S[t2] - sum_t3 att[t3] S[t3]) for t2 <= t, zero above
        for i in range(rows):
            t = t0 + i
            att_t = att_bh + t * T
            s_i = scores + <Py_ssize_t>i * T
            dot = 0.0
            for t2 in range(t + 1):
                dot = dot + att_t[t2] * s_i[t2]
            for t2 in range(t + 1):
                s_i[t2] = att_t[t2] * (s_i[t2] - dot)
            for t2 in range(t + 1, cols):
                s_i[t2] = 0.0
        # att = softmax(scale q k^T):  dq[t0:] += scale S k[:cols],  dk[:cols] += scale S^T q[t0:]
        sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, scale,
              scores, T, k_bh, ldkv, 1.0, dq_bh + <Py_ssize_t>t0 * ldq, ldq)
        sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, scale,
              scores, T, q_bh + <Py_ssize_t>t0 * ldq, ldq, 1.0, dk_bh, lddkv)
        t0 += TB


cdef void attention_gqa_forward(float* out, float* att, const float* q, const float* k,
                                const float* v, int B, int T, int NH, int NKV, int hs) noexcept nogil:
    cdef Py_ssize_t bh
    blas_single_threaded()
    for bh in prange(<Py_ssize_t>B * NH, schedule="static"):
        forward_head(out, att, q, k, v, <int>(bh // NH), <int>(bh % NH), T, NH, NKV, hs)


cdef int attention_gqa_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* q, const float* k, const float* v, const float* att,
                                int B, int T, int NH, int NKV, int hs) noexcept nogil:
    cdef int n_rep = NH // NKV
    cdef int num_threads = max_threads()
    cdef Py_ssize_t head_size = <Py_ssize_t>T * hs   # one head's rows of a (B,NH,T,hs) buffer
    cdef float* scores = <float*>malloc(<Py_ssize_t>num_threads * TB * T * sizeof(float))
    # per query head dk, dv rows (B,NH,T,hs) each, summed per group afterwards; only for GQA
    cdef float* dkv_heads = NULL
    cdef Py_ssize_t bh, bt, r, i
    cdef int b, h, kvh
    cdef float* dk_row
    cdef float* dv_row
    cdef const float* dk_head
    cdef const float* dv_head
    if scores == NULL:
        return -1
    if n_rep > 1:
        dkv_heads = <float*>calloc(2 * <Py_ssize_t>B * NH * head_size, sizeof(float))
        if dkv_heads == NULL:
            free(scores)
            return -1
    blas_single_threaded()
    for bh in prange(<Py_ssize_t>B * NH, schedule="static", num_threads=num_threads):
        b = <int>(bh // NH)
        h = <int>(bh % NH)
        if n_rep == 1:
            backward_head(dq, dk + <Py_ssize_t>b * T * NKV * hs + h * hs,
                          dv + <Py_ssize_t>b * T * NKV * hs + h * hs, NKV * hs,
                          scores + <Py_ssize_t>threadid() * TB * T, dout, q, k, v, att,
                          b, h, T, NH, NKV, hs)
        else:
            backward_head(dq, dkv_heads + bh * head_size,
                          dkv_heads + (<Py_ssize_t>B * NH + bh) * head_size, hs,
                          scores + <Py_ssize_t>threadid() * TB * T, dout, q, k, v, att,
                          b, h, T, NH, NKV, hs)
    free(scores)
    if n_rep > 1:
        # dk[b,t,kvh] += sum over the group's heads h of dkv_heads[b,h,t], in head order
        for bt in prange(<Py_ssize_t>B * T, schedule="static"):
            b = <int>(bt // T)
            for kvh in range(NKV):
                dk_row = dk + (bt * NKV + kvh) * hs
                dv_row = dv + (bt * NKV + kvh) * hs
                for r in range(n_rep):
                    dk_head = dkv_heads + (<Py_ssize_t>b * NH + kvh * n_rep + r) * head_size + (bt % T) * hs
                    dv_head = dk_head + <Py_ssize_t>B * NH * head_size
                    for i in range(hs):
                        dk_row[i] = dk_row[i] + dk_head[i]
                        dv_row[i] = dv_row[i] + dv_head[i]
        free(dkv_heads)
    return 0


# ----------------------------------------------------------------------------
# Python wrappers: check shapes, then run the kernel without the GIL

cdef tuple shape4(const Py_ssize_t* shape):
    return (shape[0], shape[1], shape[2], shape[3])


def _check_shape(str where, str name, tuple got, tuple want):
    if got != want:
        raise ValueError(f"attention_gqa.{where}: {name} has shape {got}, expected {want}")


def _check_args(str where, tuple q_shape, tuple k_shape, tuple v_shape, tuple att_shape):
    B, T, NH, hs = q_shape
    NKV = k_shape[2]
    if NKV <= 0 or NH % NKV != 0:
        raise ValueError(f"attention_gqa.{where}: k has {NKV} heads, which must divide the "
                         f"{NH} heads of q")
    _check_shape(where, "k", k_shape, (B, T, NKV, hs))
    _check_shape(where, "v", v_shape, (B, T, NKV, hs))
    _check_shape(where, "att", att_shape, (B, NH, T, T))
    return B, T, NH, NKV, hs


def forward(float[:, :, :, ::1] out, float[:, :, :, ::1] att, const float[:, :, :, ::1] q,
            const float[:, :, :, ::1] k, const float[:, :, :, ::1] v):
    """out (B,T,NH,hs), att (B,NH,T,T)  <-  causal attention of q (B,T,NH,hs) over
    k, v (B,T,NKV,hs)."""
    cdef int B, T, NH, NKV, hs
    B, T, NH, NKV, hs = _check_args("forward", shape4(q.shape), shape4(k.shape),
                                    shape4(v.shape), shape4(att.shape))
    _check_shape("forward", "out", shape4(out.shape), (B, T, NH, hs))
    if B * T * NH * hs == 0:
        return
    with nogil:
        attention_gqa_forward(&out[0, 0, 0, 0], &att[0, 0, 0, 0], &q[0, 0, 0, 0],
                              &k[0, 0, 0, 0], &v[0, 0, 0, 0], B, T, NH, NKV, hs)


def backward(float[:, :, :, ::1] dq, float[:, :, :, ::1] dk, float[:, :, :, ::1] dv,
             const float[:, :, :, ::1] dout, const float[:, :, :, ::1] q,
             const float[:, :, :, ::1] k, const float[:, :, :, ::1] v,
             const float[:, :, :, ::1] att):
    """dq (B,T,NH,hs), dk, dv (B,T,NKV,hs) += gradients from dout (B,T,NH,hs); att from forward."""
    cdef int B, T, NH, NKV, hs, status
    B, T, NH, NKV, hs = _check_args("backward", shape4(q.shape), shape4(k.shape),
                                    shape4(v.shape), shape4(att.shape))
    _check_shape("backward", "dout", shape4(dout.shape), (B, T, NH, hs))
    _check_shape("backward", "dq", shape4(dq.shape), (B, T, NH, hs))
    _check_shape("backward", "dk", shape4(dk.shape), (B, T, NKV, hs))
    _check_shape("backward", "dv", shape4(dv.shape), (B, T, NKV, hs))
    if B * T * NH * hs == 0:
        return
    with nogil:
        status = attention_gqa_backward(&dq[0, 0, 0, 0], &dk[0, 0, 0, 0], &dv[0, 0, 0, 0],
                                        &dout[0, 0, 0, 0], &q[0, 0, 0, 0], &k[0, 0, 0, 0],
                                        &v[0, 0, 0, 0], &att[0, 0, 0, 0], B, T, NH, NKV, hs)
    if status != 0:
        raise MemoryError("attention_gqa.backward: no memory for the scratch buffers")
