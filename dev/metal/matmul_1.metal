// dev/metal/matmul_1.metal — the matmul kernel of accel/metal/gpt2.metal before simdgroup
// matrices: a 16x16-thread tiled kernel on plain floats. The A/B peer of gpt2.metal's
// (dev/metal/README.md): dev/metal/ab.py splices it in place of gpt2.metal's matmul section, so it
// keeps that kernel's name, arguments and grid (64x64 outputs per threadgroup of 16x16 threads).
// ---- matmul --------------------------------------------------------------------------------

enum {
    TILE = 64,         // outputs per threadgroup side
    TILE_K = 16,       // the K-slice of A and B held in threadgroup memory at a time
    TILE_THREADS = 16  // threads per threadgroup side: each computes 4 x 4 outputs
};

// out (M,N) = A B (+ bias), or += with accumulate, where A(m,k) = a[m*a_row + k*a_k] and
// B(k,n) = b[k*b_k + n*b_col]: the strides give every transpose the layers need. A threadgroup
// of 16 x 16 threads computes a 64 x 64 tile of out, each thread 4 x 4 outputs strided by 16
// (so neighbouring threads write neighbouring outputs), from K-slices of A and B staged in
// threadgroup memory as float. Threadgroups are whole: past M, N or K they load zeros, write
// nothing. out is floatX (matmul) or float (matmul_float_out: dweight), rounded once.
template <typename OutT>
void matmul_tile(device OutT* out, device const floatX* a, device const floatX* b, device const floatX* bias, int M,
                 int N, int K, int a_row, int a_k, int b_k, int b_col, int accumulate, int has_bias, uint2 tid,
                 uint2 group, threadgroup float* a_tile, threadgroup float* b_tile) {
    // a_tile[k * TILE + row], b_tile[k * TILE + col]
    int row0 = group.y * TILE, col0 = group.x * TILE;
    int t = tid.y * TILE_THREADS + tid.x;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE_K) {
        for (int e = t; e < TILE * TILE_K; e += TILE_THREADS * TILE_THREADS) {
            int r = e / TILE_K, k = e % TILE_K;  // A: neighbouring threads, neighbouring k
            a_tile[k * TILE + r] = row0 + r < M && k0 + k < K ? float(a[(long)(row0 + r) * a_row + (long)(k0 + k) * a_k]) : 0.0f;
            int kb = e / TILE, c = e % TILE;     // B: neighbouring threads, neighbouring columns
            b_tile[kb * TILE + c] = k0 + kb < K && col0 + c < N ? float(b[(long)(k0 + kb) * b_k + (long)(col0 + c) * b_col]) : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // each slice summed on its own, then added: two-level summation keeps the rounding
        // error of long sums (K = 50304 for the logits' dinp) within the oracle's tolerance
        float slice[4][4];
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) slice[i][j] = 0.0f;
        for (int k = 0; k < TILE_K; ++k) {
            float av[4], bv[4];
            for (int i = 0; i < 4; ++i) av[i] = a_tile[k * TILE + tid.y + TILE_THREADS * i];
            for (int j = 0; j < 4; ++j) bv[j] = b_tile[k * TILE + tid.x + TILE_THREADS * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) slice[i][j] += av[i] * bv[j];
        }
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) acc[i][j] += slice[i][j];
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the tiles are read before the next load
    }
    for (int i = 0; i < 4; ++i) {
        int row = row0 + tid.y + TILE_THREADS * i;
        for (int j = 0; j < 4; ++j) {
            int col = col0 + tid.x + TILE_THREADS * j;
            if (row < M && col < N) {
                device OutT* o = out + (long)row * N + col;
                float v = has_bias ? acc[i][j] + float(bias[col]) : acc[i][j];
                *o = OutT(accumulate ? float(*o) + v : v);
            }
        }
    }
}

// out floatX: the forward's output, dinp
kernel void matmul(device floatX* out [[buffer(0)]],
                   device const floatX* a [[buffer(1)]],
                   device const floatX* b [[buffer(2)]],
                   device const floatX* bias [[buffer(3)]],
                   constant int& M [[buffer(4)]],
                   constant int& N [[buffer(5)]],
                   constant int& K [[buffer(6)]],
                   constant int& a_row [[buffer(7)]],
                   constant int& a_k [[buffer(8)]],
                   constant int& b_k [[buffer(9)]],
                   constant int& b_col [[buffer(10)]],
                   constant int& accumulate [[buffer(11)]],
                   constant int& has_bias [[buffer(12)]],
                   uint2 tid [[thread_position_in_threadgroup]],
                   uint2 group [[threadgroup_position_in_grid]]) {
    threadgroup float a_tile[TILE_K * TILE];
    threadgroup float b_tile[TILE_K * TILE];
    matmul_tile(out, a, b, bias, M, N, K, a_row, a_k, b_k, b_col, accumulate, has_bias, tid, group, a_tile, b_tile);
}

// out float: dweight
kernel void matmul_float_out(device float* out [[buffer(0)]],
                             device const floatX* a [[buffer(1)]],
                             device const floatX* b [[buffer(2)]],
                             device const floatX* bias [[buffer(3)]],
                             constant int& M [[buffer(4)]],
                             constant int& N [[buffer(5)]],
                             constant int& K [[buffer(6)]],
                             constant int& a_row [[buffer(7)]],
                             constant int& a_k [[buffer(8)]],
                             constant int& b_k [[buffer(9)]],
                             constant int& b_col [[buffer(10)]],
                             constant int& accumulate [[buffer(11)]],
                             constant int& has_bias [[buffer(12)]],
                             uint2 tid [[thread_position_in_threadgroup]],
                             uint2 group [[threadgroup_position_in_grid]]) {
    threadgroup float a_tile[TILE_K * TILE];
    threadgroup float b_tile[TILE_K * TILE];
    matmul_tile(out, a, b, bias, M, N, K, a_row, a_k, b_k, b_col, accumulate, has_bias, tid, group, a_tile, b_tile);
}
