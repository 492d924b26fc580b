// accel/metal/flash.metal — flash attention in Metal: causal self-attention that keeps each
// row's log-sum-exp instead of the (B,NH,T,T) scores and probabilities (the table's group
// "flash", accel/spec.py), GPT-2's form and Llama's in one set of kernels. Not a translation
// unit of its own: gpt2.metal #includes it after what every kernel shares (floatX, the
// conventions in its banner), so it builds at the three precisions gpt2.metal does, into the
// same library. The algorithm is kernels/flash_attention.pyx's (the CPU oracle) and
// accel/hip/flash.hip's; the tiles and the threadgroups are described below.

// ---- flash attention -----------------------------------------------------------------------
// Causal self-attention that keeps each row's log-sum-exp (lse) instead of (B,NH,T,T) scores
// and probabilities (the table's "flash" group; semantics kernels/flash_attention.pyx). One set
// of kernels for both forms, through each tensor's row stride (in elements):
//     GPT-2's   q, k, v the thirds of inp (B,T,3C): ldq = ldkv = 3C; out (B,T,C): ldo = C; NKV = NH
//     Llama's   q (B,T,NH,hs), k, v (B,T,NKV,hs): query head h reads key/value head h / (NH/NKV)
//     both      lse (B,NH,T)
// Tiles of R query rows by R keys, staged in threadgroup memory as float with a row stride of hs + 1:
// host.c picks R, the largest of 16, 8, 4, 2, 1 with R (hs + 1) <= FLASH_TILE (R = 16 up to
// hs 64, 8 up to hs 128, ...; past hs 1039 it refuses). Threadgroups of any size
// (host.c: 128); no simdgroup functions, so nothing depends on the simdgroup width.
//     forward    one threadgroup per (query tile, b*NH + h); for each key tile up to the
//                diagonal: S = scale Q K^T (future keys -inf), online softmax (running max m,
//                sum l, the row's output rescaled by exp(m_old - m_new)), O += P V; at the end
//                out = O / l, lse = m + log l.
//     backward   P = exp(scale Q K^T - lse), D = rowsum(dout out), dS = P (dout V^T - D), in
//                two kernels so that each gradient is summed in a threadgroup and added once:
//       dk, dv   one threadgroup per (key tile, b*NKV + kvh): every query head of the group and
//                every query tile from the key tile on; dV += P^T dout, dK += scale dS^T Q
//       dq       one threadgroup per (query tile, b*NH + h): dQ += scale dS K up to the diagonal

enum {
    FLASH_MAX_ROWS = 16,                           // the largest R
    FLASH_TILE = FLASH_MAX_ROWS * 65,              // floats of an (R, hs + 1) tile: R (hs + 1) at most
    FLASH_SQUARE = FLASH_MAX_ROWS * FLASH_MAX_ROWS // floats of an (R, R) tile
};
// threadgroup memory: forward 4 tiles + 1 square + 3 rows (17.8 KB), backward dk/dv 6 tiles
// + 2 squares + 2 rows (27.1 KB), dq 5 tiles + 1 square + 2 rows (21.9 KB): under 32 KB

// n rows of hs elements (row stride ld) into threadgroup memory as float (row stride hs + 1)
void flash_stage(threadgroup float* dst, device const floatX* src, ulong ld, int n, int hs, int tid, int num_threads) {
    for (int i = tid; i < n * hs; i += num_threads) dst[(i / hs) * (hs + 1) + i % hs] = float(src[(i / hs) * ld + i % hs]);
}

// whether query t sees key t2 (causal)
bool flash_visible(int t, int t2) { return t2 <= t; }

// the key/value head query head h reads (grouped-query: NH/NKV query heads per key/value head)
int flash_kv_head(int h, int NH, int NKV) { return h / (NH / NKV); }

float flash_dot(threadgroup const float* a, threadgroup const float* b, int hs) {
    float sum = 0.0f;
    for (int d = 0; d < hs; ++d) sum += a[d] * b[d];
    return sum;
}

// out, lse; grid (query tiles, B*NH) threadgroups, the last query tiles (most keys) first.
kernel void flash_attention_forward(device floatX* out [[buffer(0)]],
                                    device float* lse [[buffer(1)]],
                                    device const floatX* q [[buffer(2)]],
                                    device const floatX* k [[buffer(3)]],
                                    device const floatX* v [[buffer(4)]],
                                    constant int& T [[buffer(5)]],
                                    constant int& NH [[buffer(6)]],
                                    constant int& NKV [[buffer(7)]],
                                    constant int& hs [[buffer(8)]],
                                    constant int& ldq [[buffer(9)]],
                                    constant int& ldkv [[buffer(10)]],
                                    constant int& ldo [[buffer(11)]],
                                    constant float& scale [[buffer(12)]],
                                    constant int& R [[buffer(13)]],
                                    uint2 group [[threadgroup_position_in_grid]],
                                    uint2 num_groups [[threadgroups_per_grid]],
                                    uint tid_ [[thread_index_in_threadgroup]],
                                    uint num_threads_ [[threads_per_threadgroup]]) {
    threadgroup float Qs[FLASH_TILE], Ks[FLASH_TILE], Vs[FLASH_TILE], Os[FLASH_TILE];
    threadgroup float S[FLASH_SQUARE];          // scores, then probabilities
    threadgroup float m[FLASH_MAX_ROWS], l[FLASH_MAX_ROWS], rescale[FLASH_MAX_ROWS];
    const int P = hs + 1, tid = tid_, num_threads = num_threads_;
    const int i0 = (int(num_groups.x) - 1 - int(group.x)) * R, b = group.y / NH, h = group.y % NH;
    const int rows = min(R, T - i0), kvh = flash_kv_head(h, NH, NKV);
    device const floatX* k_b = k + (ulong)b * T * ldkv + kvh * hs;
    device const floatX* v_b = v + (ulong)b * T * ldkv + kvh * hs;
    flash_stage(Qs, q + ((ulong)b * T + i0) * ldq + h * hs, ldq, rows, hs, tid, num_threads);
    // Os, m, l: each element only ever set by the thread that starts it here, until the last barrier
    for (int i = tid; i < rows * hs; i += num_threads) Os[(i / hs) * P + i % hs] = 0.0f;
    for (int r = tid; r < rows; r += num_threads) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    for (int j0 = 0; j0 < i0 + rows; j0 += R) {
        const int cols = min(R, i0 + rows - j0);
        flash_stage(Ks, k_b + (ulong)j0 * ldkv, ldkv, cols, hs, tid, num_threads);
        flash_stage(Vs, v_b + (ulong)j0 * ldkv, ldkv, cols, hs, tid, num_threads);
        threadgroup_barrier(mem_flags::mem_threadgroup);  // K, V (the first time Q too) staged
        for (int i = tid; i < rows * cols; i += num_threads) {
            const int r = i / cols, c = i % cols;
            S[r * R + c] = flash_visible(i0 + r, j0 + c) ? scale * flash_dot(Qs + r * P, Ks + c * P, hs) : -INFINITY;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // online softmax: every row sees key j0 <= i0, so its max is finite
        for (int r = tid; r < rows; r += num_threads) {
            threadgroup float* row = S + r * R;
            float new_max = m[r];
            for (int c = 0; c < cols; ++c) new_max = max(new_max, row[c]);
            float sum = 0.0f;
            for (int c = 0; c < cols; ++c) {
                row[c] = precise::exp(row[c] - new_max);   // 0 for the future keys
                sum += row[c];
            }
            rescale[r] = precise::exp(m[r] - new_max);    // 0 on the first tile
            l[r] = l[r] * rescale[r] + sum;
            m[r] = new_max;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int i = tid; i < rows * hs; i += num_threads) {
            const int r = i / hs, d = i % hs;
            float acc = Os[r * P + d] * rescale[r];
            for (int c = 0; c < cols; ++c) acc += S[r * R + c] * Vs[c * P + d];
            Os[r * P + d] = acc;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the next key tile overwrites K, V, S, rescale
    }
    device floatX* out_i = out + ((ulong)b * T + i0) * ldo + h * hs;
    for (int i = tid; i < rows * hs; i += num_threads) {
        const int r = i / hs, d = i % hs;
        out_i[(ulong)r * ldo + d] = floatX(Os[r * P + d] / l[r]);
    }
    for (int r = tid; r < rows; r += num_threads)
        lse[((ulong)b * NH + h) * T + i0 + r] = m[r] + precise::log(l[r]);
}

// The query rows i0 .. i0 + rows - 1 of head h: q and dout staged, their lse and D = rowsum(dout out)
void flash_stage_queries(threadgroup float* Qs, threadgroup float* dOs, threadgroup float* lse_s,
                         threadgroup float* D, device const floatX* q, device const floatX* dout,
                         device const floatX* out, device const float* lse, int T, int NH, int hs, int ldq,
                         int ldo, int b, int h, int i0, int rows, int tid, int num_threads) {
    const ulong first = (ulong)b * T + i0;
    flash_stage(Qs, q + first * ldq + h * hs, ldq, rows, hs, tid, num_threads);
    flash_stage(dOs, dout + first * ldo + h * hs, ldo, rows, hs, tid, num_threads);
    for (int r = tid; r < rows; r += num_threads) {
        device const floatX* dout_r = dout + (first + r) * ldo + h * hs;
        device const floatX* out_r = out + (first + r) * ldo + h * hs;
        float sum = 0.0f;
        for (int d = 0; d < hs; ++d) sum += float(dout_r[d]) * float(out_r[d]);
        D[r] = sum;
        lse_s[r] = lse[((ulong)b * NH + h) * T + i0 + r];
    }
}

// dS (and P, unless with_p is false) of query rows i0.. against key tile j0..: P = exp(scale
// q.k - lse) (0 for future keys), dS = P (dout.v - D), one (r, c) per thread
void flash_probabilities(threadgroup float* Ps, threadgroup float* dSs, threadgroup const float* Qs,
                         threadgroup const float* dOs, threadgroup const float* Ks, threadgroup const float* Vs,
                         threadgroup const float* lse_s, threadgroup const float* D, bool with_p, int R, int hs, int i0,
                         int rows, int j0, int cols, float scale, int tid, int num_threads) {
    const int P = hs + 1;
    for (int i = tid; i < rows * cols; i += num_threads) {
        const int r = i / cols, c = i % cols;
        float p = 0.0f, ds = 0.0f;
        if (flash_visible(i0 + r, j0 + c)) {
            p = precise::exp(scale * flash_dot(Qs + r * P, Ks + c * P, hs) - lse_s[r]);
            ds = p * (flash_dot(dOs + r * P, Vs + c * P, hs) - D[r]);
        }
        if (with_p) Ps[r * R + c] = p;
        dSs[r * R + c] = ds;
    }
}

// dk, dv (rows of stride ldkv) += their sums over the group's query heads; grid (key tiles,
// B*NKV) threadgroups.
kernel void flash_attention_backward_dkv(device floatX* dk [[buffer(0)]],
                                         device floatX* dv [[buffer(1)]],
                                         device const floatX* dout [[buffer(2)]],
                                         device const floatX* q [[buffer(3)]],
                                         device const floatX* k [[buffer(4)]],
                                         device const floatX* v [[buffer(5)]],
                                         device const floatX* out [[buffer(6)]],
                                         device const float* lse [[buffer(7)]],
                                         constant int& T [[buffer(8)]],
                                         constant int& NH [[buffer(9)]],
                                         constant int& NKV [[buffer(10)]],
                                         constant int& hs [[buffer(11)]],
                                         constant int& ldq [[buffer(12)]],
                                         constant int& ldkv [[buffer(13)]],
                                         constant int& ldo [[buffer(14)]],
                                         constant float& scale [[buffer(15)]],
                                         constant int& R [[buffer(16)]],
                                         uint2 group [[threadgroup_position_in_grid]],
                                         uint tid_ [[thread_index_in_threadgroup]],
                                         uint num_threads_ [[threads_per_threadgroup]]) {
    threadgroup float Ks[FLASH_TILE], Vs[FLASH_TILE], dKs[FLASH_TILE], dVs[FLASH_TILE];
    threadgroup float Qs[FLASH_TILE], dOs[FLASH_TILE];
    threadgroup float Ps[FLASH_SQUARE], dSs[FLASH_SQUARE];
    threadgroup float lse_s[FLASH_MAX_ROWS], D[FLASH_MAX_ROWS];
    const int P = hs + 1, tid = tid_, num_threads = num_threads_;
    const int j0 = group.x * R, b = group.y / NKV, kvh = group.y % NKV;
    const int cols = min(R, T - j0);
    const ulong first = ((ulong)b * T + j0) * ldkv + kvh * hs;
    flash_stage(Ks, k + first, ldkv, cols, hs, tid, num_threads);
    flash_stage(Vs, v + first, ldkv, cols, hs, tid, num_threads);
    // dKs, dVs: each element only ever touched by the thread that zeroes it here
    for (int i = tid; i < cols * hs; i += num_threads) dKs[(i / hs) * P + i % hs] = dVs[(i / hs) * P + i % hs] = 0.0f;
    for (int h = 0; h < NH; ++h) {
        if (flash_kv_head(h, NH, NKV) != kvh) continue;   // a query head of another key/value head
        for (int i0 = j0; i0 < T; i0 += R) {   // earlier queries see none of these keys
            const int rows = min(R, T - i0);
            threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous query tile is done (the first: K, V staged)
            flash_stage_queries(Qs, dOs, lse_s, D, q, dout, out, lse, T, NH, hs, ldq, ldo, b, h, i0, rows, tid,
                                num_threads);
            threadgroup_barrier(mem_flags::mem_threadgroup);
            flash_probabilities(Ps, dSs, Qs, dOs, Ks, Vs, lse_s, D, true, R, hs, i0, rows, j0, cols, scale, tid,
                                num_threads);
            threadgroup_barrier(mem_flags::mem_threadgroup);
            for (int i = tid; i < cols * hs; i += num_threads) {
                const int c = i / hs, d = i % hs;
                float sum_v = 0.0f, sum_k = 0.0f;
                for (int r = 0; r < rows; ++r) {
                    sum_v += Ps[r * R + c] * dOs[r * P + d];
                    sum_k += dSs[r * R + c] * Qs[r * P + d];
                }
                dVs[c * P + d] += sum_v;
                dKs[c * P + d] += scale * sum_k;
            }
        }
    }
    for (int i = tid; i < cols * hs; i += num_threads) {
        const int c = i / hs, d = i % hs;
        const ulong at = first + (ulong)c * ldkv + d;
        dk[at] = floatX(float(dk[at]) + dKs[c * P + d]);
        dv[at] = floatX(float(dv[at]) + dVs[c * P + d]);
    }
}

// dq (rows of stride ldq) += its sum over the key tiles; grid (query tiles, B*NH) threadgroups,
// the last query tiles (most keys) first.
kernel void flash_attention_backward_dq(device floatX* dq [[buffer(0)]],
                                        device const floatX* dout [[buffer(1)]],
                                        device const floatX* q [[buffer(2)]],
                                        device const floatX* k [[buffer(3)]],
                                        device const floatX* v [[buffer(4)]],
                                        device const floatX* out [[buffer(5)]],
                                        device const float* lse [[buffer(6)]],
                                        constant int& T [[buffer(7)]],
                                        constant int& NH [[buffer(8)]],
                                        constant int& NKV [[buffer(9)]],
                                        constant int& hs [[buffer(10)]],
                                        constant int& ldq [[buffer(11)]],
                                        constant int& ldkv [[buffer(12)]],
                                        constant int& ldo [[buffer(13)]],
                                        constant float& scale [[buffer(14)]],
                                        constant int& R [[buffer(15)]],
                                        uint2 group [[threadgroup_position_in_grid]],
                                        uint2 num_groups [[threadgroups_per_grid]],
                                        uint tid_ [[thread_index_in_threadgroup]],
                                        uint num_threads_ [[threads_per_threadgroup]]) {
    threadgroup float Qs[FLASH_TILE], dOs[FLASH_TILE], dQs[FLASH_TILE], Ks[FLASH_TILE], Vs[FLASH_TILE];
    threadgroup float dSs[FLASH_SQUARE];
    threadgroup float lse_s[FLASH_MAX_ROWS], D[FLASH_MAX_ROWS];
    const int P = hs + 1, tid = tid_, num_threads = num_threads_;
    const int i0 = (int(num_groups.x) - 1 - int(group.x)) * R, b = group.y / NH, h = group.y % NH;
    const int rows = min(R, T - i0), kvh = flash_kv_head(h, NH, NKV);
    device const floatX* k_b = k + (ulong)b * T * ldkv + kvh * hs;
    device const floatX* v_b = v + (ulong)b * T * ldkv + kvh * hs;
    flash_stage_queries(Qs, dOs, lse_s, D, q, dout, out, lse, T, NH, hs, ldq, ldo, b, h, i0, rows, tid, num_threads);
    // dQs: each element only ever touched by the thread that zeroes it here
    for (int i = tid; i < rows * hs; i += num_threads) dQs[(i / hs) * P + i % hs] = 0.0f;
    for (int j0 = 0; j0 < i0 + rows; j0 += R) {
        const int cols = min(R, i0 + rows - j0);
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous key tile is done (the first: Q, dout staged)
        flash_stage(Ks, k_b + (ulong)j0 * ldkv, ldkv, cols, hs, tid, num_threads);
        flash_stage(Vs, v_b + (ulong)j0 * ldkv, ldkv, cols, hs, tid, num_threads);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        flash_probabilities(dSs, dSs, Qs, dOs, Ks, Vs, lse_s, D, false, R, hs, i0, rows, j0, cols, scale, tid,
                            num_threads);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int i = tid; i < rows * hs; i += num_threads) {
            const int r = i / hs, d = i % hs;
            float sum = 0.0f;
            for (int c = 0; c < cols; ++c) sum += dSs[r * R + c] * Ks[c * P + d];
            dQs[r * P + d] += scale * sum;
        }
    }
    device floatX* dq_i = dq + ((ulong)b * T + i0) * ldq + h * hs;
    for (int i = tid; i < rows * hs; i += num_threads) {
        const int r = i / hs, d = i % hs;
        dq_i[(ulong)r * ldq + d] = floatX(float(dq_i[(ulong)r * ldq + d]) + dQs[r * P + d]);
    }
}
