/*
accel/hip/cache.hip — generation's attention over a KV cache in HIP (the table's "cache" group,
accel/spec.py): T new positions of one sequence (B = 1) after P cached ones. #included by
gpt2.hip after its context, helpers and precision (floatX).

Two forms, one set of kernels (as kernels/attention_cached.pyx, the CPU oracle):
    GPT-2's   inp (T,3C) = q, k, v side by side; out (T,C); caches (P+T, C); NH heads of hs = C/NH
    Llama's   q (T,NH*hs); k, v (T,NKV*hs); out (T,NH*hs); caches (P+T, NKV*hs), grouped-query:
              query head h reads key/value head h / (NH/NKV)
    both      att (NH,T,P+T): row (h,t) the probabilities of query t over keys 0..P+t, zero past
GPT-2's form is Llama's with NKV = NH and q, k, v strided views of inp (row stride 3C).

Two kernels:
    append     the T new rows of k and v copied into rows P .. P+T-1 of the caches (a
               grid-stride copy: bf16 stays bf16, bit for bit)
    attention  one block per (query row t, head h), over keys 0 .. P+t of the caches: the query
               staged in shared memory as float32; each thread the scores of every blockDim-th
               key; the row's max and sum of exponentials by block reductions; the
               probabilities into att (zero past P+t); then out's row, one thread per channel
               summing probability times value over the keys.
All arithmetic in float32; the row's float32 probabilities stay in scratch memory at bf16 (att
itself at fp32) so that out is computed from them, as the CPU's bf16 entry does, and each output
is rounded once. Blocks of BLOCK threads: the block reductions serve any warp size.
*/

// Where the two forms' rows are (row strides in elements): GPT-2's with NKV = NH
struct CachedShape {
    int T, P, NH, NKV, hs;
    long ldq;    // q: GPT-2 3C, Llama NH hs
    long ldnew;  // the new k, v rows: GPT-2 3C, Llama NKV hs
};

// k_cache, v_cache (P+T, NKV hs) rows P .. P+T-1 = the T rows of k and v (row stride ldnew)
__global__ void cache_append_kernel(floatX* k_cache, floatX* v_cache, const floatX* k, const floatX* v,
                                    CachedShape s) {
    const int width = s.NKV * s.hs;
    const long N = long(s.T) * width;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const long t = i / width, c = i % width;
        k_cache[(s.P + t) * width + c] = k[t * s.ldnew + c];
        v_cache[(s.P + t) * width + c] = v[t * s.ldnew + c];
    }
}

// Block (t, h): att's row (h, t) (P+T keys) = softmax over keys 0 .. P+t of q[t,h] . k_cache[p,kvh]
// / sqrt(hs), zero past P+t; out[t,h] = that row times v_cache's rows of key/value head kvh.
// scores (NH,T,P+T) holds the rows' float32 values (att itself at fp32); the query is staged in
// shared memory (hs floats, dynamic).
__global__ void cached_attention_kernel(floatX* out, floatX* att, float* scores, const floatX* q,
                                        const floatX* k_cache, const floatX* v_cache, CachedShape s) {
    HIP_DYNAMIC_SHARED(float, query)
    __shared__ float reduce_scratch[MAX_WARPS];
    const int t = blockIdx.x, h = blockIdx.y, hs = s.hs;
    const int keys = s.P + s.T, visible = s.P + t + 1;  // position P+t sees keys 0 .. P+t
    const int kvh = h / (s.NH / s.NKV);
    const long ldkv = long(s.NKV) * hs;
    const floatX* k_h = k_cache + kvh * hs;
    const floatX* v_h = v_cache + kvh * hs;
    const long row = (long(h) * s.T + t) * keys;
    float* p_row = scores + row;
    floatX* att_row = att + row;
    for (int d = threadIdx.x; d < hs; d += blockDim.x) query[d] = to_float(q[t * s.ldq + h * hs + d]);
    __syncthreads();
    const float scale = 1.0f / sqrtf(float(hs));
    float maxval = -INFINITY;
    for (int p = threadIdx.x; p < visible; p += blockDim.x) {
        const floatX* key = k_h + p * ldkv;
        float dot = 0.0f;
        for (int d = 0; d < hs; ++d) dot += query[d] * to_float(key[d]);
        p_row[p] = scale * dot;
        maxval = fmaxf(maxval, p_row[p]);
    }
    maxval = block_reduce(maxval, Max(), -INFINITY, reduce_scratch);
    float sum = 0.0f;
    for (int p = threadIdx.x; p < visible; p += blockDim.x) {
        const float e = expf(p_row[p] - maxval);
        p_row[p] = e;
        sum += e;
    }
    const float inv = 1.0f / block_reduce(sum, Sum(), 0.0f, reduce_scratch);
    for (int p = threadIdx.x; p < visible; p += blockDim.x) {
        const float probability = p_row[p] * inv;
        p_row[p] = probability;
        att_row[p] = to_floatX(probability);
    }
    for (int p = visible + threadIdx.x; p < keys; p += blockDim.x) att_row[p] = to_floatX(0.0f);
    __syncthreads();  // each thread below reads every probability of the row
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float sum_d = 0.0f;
        for (int p = 0; p < visible; ++p) sum_d += p_row[p] * to_float(v_h[p * ldkv + d]);
        out[t * long(s.NH) * hs + h * hs + d] = to_floatX(sum_d);
    }
}

// --- the host side ------------------------------------------------------------------------------

// Both forms: the new rows into the caches, then the attention of every (query row, head).
void cached_attention(Context* c, floatX* out, floatX* att, floatX* k_cache, floatX* v_cache, const floatX* q,
                      const floatX* k, const floatX* v, CachedShape s, const char* where) {
    if (long(s.T) * s.NH * s.hs == 0) return;
    hipLaunchKernelGGL(cache_append_kernel, dim3(grid_for(c, long(s.T) * s.NKV * s.hs)), dim3(BLOCK), 0, 0, k_cache,
                       v_cache, k, v, s);
    check_launch(c, where);
    float* scores = reinterpret_cast<float*>(att);
    if (BF16) {  // the probabilities' float32 values, which out is computed from
        scores = reinterpret_cast<float*>(scratch(c, size_t(s.NH) * s.T * (s.P + s.T) * sizeof(float), where));
        if (!scores) return;
    }
    hipLaunchKernelGGL(cached_attention_kernel, dim3(unsigned(s.T), unsigned(s.NH)), dim3(BLOCK), s.hs * sizeof(float),
                       0, out, att, scores, q, k_cache, v_cache, s);
    check_launch(c, where);
}

// --- cache: the table's entries ------------------------------------------------------------------

ACCEL_HIP_API void accel_hip_attention_cached_forward(void* ctx, floatX* out, floatX* att, floatX* k_cache,
                                                      floatX* v_cache, const floatX* inp, int T, int P, int C,
                                                      int NH) {
    // GPT-2's form: q, k, v the thirds of inp's rows
    const CachedShape s{T, P, NH, NH, C / NH, 3L * C, 3L * C};
    cached_attention(context(ctx), out, att, k_cache, v_cache, inp, inp + C, inp + 2 * C, s,
                     "attention_cached_forward");
}

ACCEL_HIP_API void accel_hip_attention_gqa_cached_forward(void* ctx, floatX* out, floatX* att, floatX* k_cache,
                                                          floatX* v_cache, const floatX* q, const floatX* k,
                                                          const floatX* v, int T, int P, int NH, int NKV, int hs) {
    const CachedShape s{T, P, NH, NKV, hs, long(NH) * hs, long(NKV) * hs};
    cached_attention(context(ctx), out, att, k_cache, v_cache, q, k, v, s, "attention_gqa_cached_forward");
}
