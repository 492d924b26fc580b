# Causal self-attention over a KV cache (kernels/attention_cached.pxd): generation's attention.
#   k_cache[P+t] = k[t],  v_cache[P+t] = v[t]                     (t < T: the new positions)
#   att[h,t,:] = softmax over p <= P+t of  q[t,h] . k_cache[p,h'] / sqrt(hs);  zero for p > P+t
#   out[t,h] = sum_p att[h,t,p] v_cache[p,h']                     (h' = h / (NH/NKV))
# A prompt is T positions after P = 0, a generated token T = 1 after the text so far, a chat's
# next turn T positions after the turns before.  One OpenMP task per query head, whose two
# products are single-threaded sgemm calls (kernels.blas) on strided views of q and the caches
# (row strides NH*hs and NKV*hs, no copies): att = scale q k_cache^T (T x (P+T)), softmax of
# each row over its P+t+1 keys, out = att v_cache.  At T = 1 (decode) they are matrix-vector
# products reading the head's columns of the cache once, 4 rows a pass, fetched ahead
# (decode_scores, decode_values): decode is bound by the bandwidth of the weights and the cache.
# In bf16 (q, k, v, the caches, att and out; every sum and the softmax in float32, each output
# rounded once): at T = 1 the same two products read the bf16 cache as it is (half fp32's
# bytes), the query widened once; at T > 1 (a prompt, once a text) the head's rows are widened
# into float32 scratch and run through the float32 head.
from cython.parallel cimport prange
from libc.math cimport sqrtf
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from kernels.bf16 cimport bf16, bf16_to_float, float_to_bf16, floatX, load
from kernels.cblas cimport CblasNoTrans, CblasRowMajor, CblasTrans
from kernels.blas cimport sgemm
from kernels.parallel cimport blas_single_threaded
from kernels.prefetch cimport prefetch_bytes
from kernels.rowmax cimport row_max
from kernels.vexp cimport vexpf


cdef void softmax_causal(float* att, int T, int P) noexcept nogil:
    # each row t of att (T, P+T) the probabilities over its first P+t+1 scores, zero after
    cdef int keys = P + T
    cdef Py_ssize_t t, p
    cdef float* att_t
    cdef float maxval, expsum, inv, e
    for t in range(T):   # position P+t sees keys 0 .. P+t
        att_t = att + t * keys
        maxval = row_max(att_t, P + t + 1)
        expsum = 0.0
        for p in range(P + t + 1):
            e = vexpf(att_t[p] - maxval)
            att_t[p] = e
            expsum = expsum + e
        inv = 1.0 / expsum
        for p in range(P + t + 1):
            att_t[p] = att_t[p] * inv
        for p in range(P + t + 1, keys):
            att_t[p] = 0.0


cdef inline void prefetch_rows(const floatX* row, int ldkv, int hs) noexcept nogil:
    # a head's columns of 4 cached rows, fetched ahead of their pass: a head reads hs elements
    # of each row of ldkv, a stride the hardware prefetchers did not follow (the bf16 entry
    # at 1,000 cached keys ran 2.2-2.6x as fast with this, dev/BENCHMARKS.md section 30)
    cdef Py_ssize_t r
    for r in range(4):
        prefetch_bytes(row + r * ldkv, hs * <Py_ssize_t>sizeof(floatX))


cdef void decode_scores(float* scores, const float* q, const floatX* k_cache, int ldkv, int keys,
                        int hs, float scale) noexcept nogil:
    # scores (keys,) = scale k_cache (keys rows, ldkv) @ q (hs,): a head's row is short
    # (64-128), so 4 rows a pass, each sum vectorised, their loads in flight together
    cdef Py_ssize_t p, d, body = keys - keys % 4
    cdef const floatX* row
    cdef float s0, s1, s2, s3
    for p in range(0, body, 4):
        row = k_cache + p * ldkv
        if p + 12 <= keys:
            prefetch_rows(row + 8 * ldkv, ldkv, hs)
        s0 = s1 = s2 = s3 = 0.0
        for d in range(hs):
            s0 += q[d] * load(row, d)
            s1 += q[d] * load(row, ldkv + d)
            s2 += q[d] * load(row, 2 * ldkv + d)
            s3 += q[d] * load(row, 3 * ldkv + d)
        scores[p] = scale * s0
        scores[p + 1] = scale * s1
        scores[p + 2] = scale * s2
        scores[p + 3] = scale * s3
    for p in range(body, keys):
        row = k_cache + p * ldkv
        s0 = 0.0
        for d in range(hs):
            s0 += q[d] * load(row, d)
        scores[p] = scale * s0


cdef void decode_values(float* out, const float* probs, const floatX* v_cache, int ldkv,
                        int keys, int hs) noexcept nogil:
    # out (hs,) = probs (keys,) @ v_cache (keys rows, ldkv), 4 rows a pass: out read and
    # written once a pass, and each element's 4 products summed before they meet out
    cdef Py_ssize_t p, d, body = keys - keys % 4
    cdef const floatX* row
    cdef float p0, p1, p2, p3
    for d in range(hs):
        out[d] = 0.0
    for p in range(0, body, 4):
        row = v_cache + p * ldkv
        if p + 12 <= keys:
            prefetch_rows(row + 8 * ldkv, ldkv, hs)
        p0 = probs[p]
        p1 = probs[p + 1]
        p2 = probs[p + 2]
        p3 = probs[p + 3]
        for d in range(hs):
            out[d] += (p0 * load(row, d) + p1 * load(row, ldkv + d) +
                       p2 * load(row, 2 * ldkv + d) + p3 * load(row, 3 * ldkv + d))
    for p in range(body, keys):
        row = v_cache + p * ldkv
        for d in range(hs):
            out[d] += probs[p] * load(row, d)


cdef void decode_head(float* out, float* att, const float* q, const floatX* k_cache,
                      const floatX* v_cache, int ldkv, int P, int hs) noexcept nogil:
    # one query head at T = 1, float32 q, out (hs,) and att (P+1,): the cache, of either
    # precision, streamed once for the keys and once for the values
    decode_scores(att, q, k_cache, ldkv, P + 1, hs, 1.0 / sqrtf(hs))
    softmax_causal(att, 1, P)
    decode_values(out, att, v_cache, ldkv, P + 1, hs)


cdef void head(float* out, int ldo, float* att, const float* q, int ldq, const float* k_cache,
               const float* v_cache, int ldkv, int T, int P, int hs) noexcept nogil:
    # one query head: out (T rows, ldo), att (T, P+T), q (T rows, ldq), its key/value head's
    # columns of the caches (P+T rows, ldkv)
    cdef int keys = P + T
    cdef float scale = 1.0 / sqrtf(hs)
    if T == 1:
        decode_head(out, att, q, k_cache, v_cache, ldkv, P, hs)
        return
    sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, keys, hs, scale, q, ldq, k_cache, ldkv,
          0.0, att, keys)
    softmax_causal(att, T, P)
    sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, keys, 1.0, att, keys, v_cache, ldkv,
          0.0, out, ldo)


cdef int head_bf16(bf16* out, int ldo, bf16* att, const bf16* q, int ldq, const bf16* k_cache,
                   const bf16* v_cache, int ldkv, int T, int P, int hs) noexcept nogil:
    # head()'s in bf16; -1 where its float32 scratch could not be had
    cdef int keys = P + T
    cdef Py_ssize_t t, p, d
    cdef size_t floats = (<size_t>hs + keys + hs if T == 1 else
                          <size_t>T * hs * 2 + <size_t>keys * hs * 2 + <size_t>T * keys)
    cdef float* scratch = <float*>malloc(floats * sizeof(float))
    if scratch == NULL:
        return -1
    cdef float* qf = scratch                                # (T, hs)
    cdef float* scores = scratch + <Py_ssize_t>T * hs       # (T, keys)
    cdef float* outf = scores + <Py_ssize_t>T * keys        # (T, hs)
    cdef float* kf = outf + <Py_ssize_t>T * hs              # (keys, hs), T > 1 only
    cdef float* vf = kf + <Py_ssize_t>keys * hs
    if T == 1:   # decode: the cache read as it is, once for the keys and once for the values
        for d in range(hs):
            qf[d] = bf16_to_float(q[d])
        decode_head(outf, scores, qf, k_cache, v_cache, ldkv, P, hs)
    else:
        for t in range(T):
            for d in range(hs):
                qf[t * hs + d] = bf16_to_float(q[t * ldq + d])
        for p in range(keys):
            for d in range(hs):
                kf[p * hs + d] = bf16_to_float(k_cache[p * ldkv + d])
                vf[p * hs + d] = bf16_to_float(v_cache[p * ldkv + d])
        head(outf, hs, scores, qf, hs, kf, vf, hs, T, P, hs)
    for t in range(T):
        for d in range(hs):
            out[t * ldo + d] = float_to_bf16(outf[t * hs + d])
    for p in range(<Py_ssize_t>T * keys):
        att[p] = float_to_bf16(scores[p])
    free(scratch)
    return 0


cdef inline void append(floatX* cache, const floatX* rows, int ld_rows, int T, int P,
                        int width) noexcept nogil:
    # the T rows of width elements (row stride ld_rows) into cache rows P .. P+T-1
    cdef Py_ssize_t t
    for t in range(T):
        memcpy(cache + (P + t) * <Py_ssize_t>width, rows + t * <Py_ssize_t>ld_rows,
               width * sizeof(floatX))


cdef int attention_cached_forward(floatX* out, floatX* att, floatX* k_cache, floatX* v_cache,
                                  const floatX* inp, int T, int P, int C, int NH) noexcept nogil:
    cdef int hs = C // NH, failed = 0
    cdef Py_ssize_t h
    append(k_cache, inp + C, 3 * C, T, P, C)
    append(v_cache, inp + 2 * C, 3 * C, T, P, C)
    blas_single_threaded()
    for h in prange(NH, schedule="static"):
        if floatX is float:
            head(out + h * hs, C, att + h * <Py_ssize_t>T * (P + T), inp + h * hs, 3 * C,
                 k_cache + h * hs, v_cache + h * hs, C, T, P, hs)
        else:
            failed |= head_bf16(out + h * hs, C, att + h * <Py_ssize_t>T * (P + T), inp + h * hs,
                                3 * C, k_cache + h * hs, v_cache + h * hs, C, T, P, hs)
    return -1 if failed else 0


cdef int attention_gqa_cached_forward(floatX* out, floatX* att, floatX* k_cache, floatX* v_cache,
                                      const floatX* q, const floatX* k, const floatX* v,
                                      int T, int P, int NH, int NKV, int hs) noexcept nogil:
    cdef int kvd = NKV * hs, failed = 0
    cdef Py_ssize_t h, kvh
    append(k_cache, k, kvd, T, P, kvd)
    append(v_cache, v, kvd, T, P, kvd)
    blas_single_threaded()
    for h in prange(NH, schedule="static"):
        kvh = h // (NH // NKV)
        if floatX is float:
            head(out + h * hs, NH * hs, att + h * <Py_ssize_t>T * (P + T), q + h * hs, NH * hs,
                 k_cache + kvh * hs, v_cache + kvh * hs, kvd, T, P, hs)
        else:
            failed |= head_bf16(out + h * hs, NH * hs, att + h * <Py_ssize_t>T * (P + T),
                                q + h * hs, NH * hs, k_cache + kvh * hs, v_cache + kvh * hs,
                                kvd, T, P, hs)
    return -1 if failed else 0
