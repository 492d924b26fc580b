# Causal self-attention over a KV cache (kernels/attention_cached.pxd): generation's attention.
#   k_cache[P+t] = k[t],  v_cache[P+t] = v[t]                     (t < T: the new positions)
#   att[h,t,:] = softmax over p <= P+t of  q[t,h] . k_cache[p,h'] / sqrt(hs);  zero for p > P+t
#   out[t,h] = sum_p att[h,t,p] v_cache[p,h']                     (h' = h / (NH/NKV))
# A prompt is T positions after P = 0, a generated token T = 1 after the text so far, a chat's
# next turn T positions after the turns before.  One OpenMP task per query head, whose two
# products are single-threaded sgemm calls (kernels.blas) on strided views of q and the caches
# (row strides NH*hs and NKV*hs, no copies): att = scale q k_cache^T (T x (P+T)), softmax of
# each row over its P+t+1 keys, out = att v_cache.  At T = 1 (decode) they are matrix-vector
# products (sgemv) reading the cache once, unpacked: decode is bound by the bandwidth of the
# weights and the cache.
from cython.parallel cimport prange
from libc.math cimport sqrtf
from libc.string cimport memcpy

from kernels.cblas cimport CblasNoTrans, CblasRowMajor, CblasTrans, scipy_cblas_sgemv
from kernels.blas cimport sgemm
from kernels.parallel cimport blas_single_threaded
from kernels.rowmax cimport row_max
from kernels.vexp cimport vexpf


cdef void head(float* out, int ldo, float* att, const float* q, int ldq, const float* k_cache,
               const float* v_cache, int ldkv, int T, int P, int hs) noexcept nogil:
    # one query head: out (T rows, ldo), att (T, P+T), q (T rows, ldq), its key/value head's
    # columns of the caches (P+T rows, ldkv)
    cdef int keys = P + T
    cdef float scale = 1.0 / sqrtf(hs)
    cdef Py_ssize_t t, p
    cdef float* att_t
    cdef float maxval, expsum, inv, e
    if T == 1:   # decode: matrix-vector products, which stream the cache (no packing)
        scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, keys, hs, scale, k_cache, ldkv, q, 1,
                          0.0, att, 1)
    else:
        sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, keys, hs, scale, q, ldq, k_cache,
              ldkv, 0.0, att, keys)
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
    if T == 1:
        scipy_cblas_sgemv(CblasRowMajor, CblasTrans, keys, hs, 1.0, v_cache, ldkv, att, 1, 0.0,
                          out, 1)
    else:
        sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, keys, 1.0, att, keys, v_cache,
              ldkv, 0.0, out, ldo)


cdef inline void append(float* cache, const float* rows, int ld_rows, int T, int P,
                        int width) noexcept nogil:
    # the T rows of width floats (row stride ld_rows) into cache rows P .. P+T-1
    cdef Py_ssize_t t
    for t in range(T):
        memcpy(cache + (P + t) * <Py_ssize_t>width, rows + t * <Py_ssize_t>ld_rows,
               width * sizeof(float))


cdef void attention_cached_forward(float* out, float* att, float* k_cache, float* v_cache,
                                   const float* inp, int T, int P, int C, int NH) noexcept nogil:
    cdef int hs = C // NH
    cdef Py_ssize_t h
    append(k_cache, inp + C, 3 * C, T, P, C)
    append(v_cache, inp + 2 * C, 3 * C, T, P, C)
    blas_single_threaded()
    for h in prange(NH, schedule="static"):
        head(out + h * hs, C, att + h * <Py_ssize_t>T * (P + T), inp + h * hs, 3 * C,
             k_cache + h * hs, v_cache + h * hs, C, T, P, hs)


cdef void attention_gqa_cached_forward(float* out, float* att, float* k_cache, float* v_cache,
                                       const float* q, const float* k, const float* v,
                                       int T, int P, int NH, int NKV, int hs) noexcept nogil:
    cdef int kvd = NKV * hs
    cdef Py_ssize_t h, kvh
    append(k_cache, k, kvd, T, P, kvd)
    append(v_cache, v, kvd, T, P, kvd)
    blas_single_threaded()
    for h in prange(NH, schedule="static"):
        kvh = h // (NH // NKV)
        head(out + h * hs, NH * hs, att + h * <Py_ssize_t>T * (P + T), q + h * hs, NH * hs,
             k_cache + kvh * hs, v_cache + kvh * hs, kvd, T, P, hs)
