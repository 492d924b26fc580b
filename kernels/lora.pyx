# LoRA (Hu et al., 2021): a frozen linear layer W (OUT,IN) plus a trained low-rank update
#   out += scale * hidden @ B^T,   hidden = inp @ A^T            (scale = alpha / R)
#   inp (N,IN), A (R,IN), B (OUT,R), hidden (N,R), out (N,OUT); N = B*T positions, IN = C and
#   OUT = OC as matmul's
# Backward (dhidden written, the rest +=):
#   dhidden (N,R)  = scale * dout @ B
#   dB (OUT,R)    += scale * dout^T @ hidden
#   dA (R,IN)     += dhidden^T @ inp
#   dinp (N,IN)   += dhidden @ A
# R is small (8 to 64) next to IN and OUT, so each GEMM is thin: threads split the long side
# of each (the N rows for hidden and dhidden, OUT for out and dB, IN for dA and dinp), each
# thread one single-threaded sgemm on its block (kernels/matmul.pyx's scheme), so that no two
# write the same cache line.  Four of the six GEMMs of a trained W's backward are these thin
# ones; the frozen W's own dweight GEMM is never run (matmul_backward with dweight NULL).
from cython.parallel cimport prange

from kernels.matmul cimport block_start, leading_dim
from kernels.parallel cimport blas_single_threaded, max_threads


cdef void lora_forward(float* out, float* hidden, const float* inp, const float* A,
                       const float* Bm, float scale, int B, int T, int IN, int OUT,
                       int R) noexcept nogil:
    cdef int N = B * T, parts = max_threads(), part, r0, r1, o0, o1
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        # hidden[r0:r1] (r1-r0, R) = inp[r0:r1] (r1-r0, IN) @ A^T (IN, R)
        r0 = block_start(part, parts, N)
        r1 = block_start(part + 1, parts, N)
        if r1 > r0:
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, R, IN, 1.0,
                  inp + <Py_ssize_t>r0 * IN, leading_dim(IN), A, leading_dim(IN), 0.0,
                  hidden + <Py_ssize_t>r0 * R, leading_dim(R))
    for part in prange(parts, schedule="static", num_threads=parts):
        # out[:, o0:o1] (N, o1-o0) += scale * hidden (N,R) @ B[o0:o1]^T (R, o1-o0)
        o0 = block_start(part, parts, OUT)
        o1 = block_start(part + 1, parts, OUT)
        if o1 > o0:
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, o1 - o0, R, scale,
                  hidden, leading_dim(R), Bm + <Py_ssize_t>o0 * R, leading_dim(R), 1.0,
                  out + o0, leading_dim(OUT))


cdef void lora_backward(float* dinp, float* dA, float* dB, float* dhidden, const float* dout,
                        const float* inp, const float* hidden, const float* A, const float* Bm,
                        float scale, int B, int T, int IN, int OUT, int R) noexcept nogil:
    cdef int N = B * T, parts = max_threads(), part, r0, r1, o0, o1, i0, i1
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        # dhidden[r0:r1] (r1-r0, R) = scale * dout[r0:r1] (r1-r0, OUT) @ B (OUT, R)
        r0 = block_start(part, parts, N)
        r1 = block_start(part + 1, parts, N)
        if r1 > r0:
            sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, R, OUT, scale,
                  dout + <Py_ssize_t>r0 * OUT, leading_dim(OUT), Bm, leading_dim(R), 0.0,
                  dhidden + <Py_ssize_t>r0 * R, leading_dim(R))
        # dB[o0:o1] (o1-o0, R) += scale * dout[:, o0:o1]^T (o1-o0, N) @ hidden (N, R)
        o0 = block_start(part, parts, OUT)
        o1 = block_start(part + 1, parts, OUT)
        if o1 > o0:
            sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, R, N, scale,
                  dout + o0, leading_dim(OUT), hidden, leading_dim(R), 1.0,
                  dB + <Py_ssize_t>o0 * R, leading_dim(R))
    for part in prange(parts, schedule="static", num_threads=parts):
        i0 = block_start(part, parts, IN)
        i1 = block_start(part + 1, parts, IN)
        if i1 > i0:
            # dA[:, i0:i1] (R, i1-i0) += dhidden^T (R, N) @ inp[:, i0:i1] (N, i1-i0)
            sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, R, i1 - i0, N, 1.0,
                  dhidden, leading_dim(R), inp + i0, leading_dim(IN), 1.0,
                  dA + i0, leading_dim(IN))
            # dinp[:, i0:i1] (N, i1-i0) += dhidden (N, R) @ A[:, i0:i1] (R, i1-i0)
            sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, i1 - i0, R, 1.0,
                  dhidden, leading_dim(R), A + i0, leading_dim(IN), 1.0,
                  dinp + i0, leading_dim(IN))


def forward(float[:, ::1] out, float[:, ::1] hidden, const float[:, ::1] inp,
            const float[:, ::1] A, const float[:, ::1] Bm, float scale):
    """out (N,OUT) += scale * hidden @ Bm^T with hidden (N,R) = inp (N,IN) @ A (R,IN)^T."""
    cdef int N = inp.shape[0], IN = inp.shape[1], R = A.shape[0], OUT = Bm.shape[0]
    _check("forward", dict(out=out, hidden=hidden, A=A, Bm=Bm),
           dict(out=(N, OUT), hidden=(N, R), A=(R, IN), Bm=(OUT, R)))
    with nogil:
        lora_forward(&out[0, 0], &hidden[0, 0], &inp[0, 0], &A[0, 0], &Bm[0, 0], scale,
                     1, N, IN, OUT, R)


def backward(float[:, ::1] dinp, float[:, ::1] dA, float[:, ::1] dB, float[:, ::1] dhidden,
             const float[:, ::1] dout, const float[:, ::1] inp, const float[:, ::1] hidden,
             const float[:, ::1] A, const float[:, ::1] Bm, float scale):
    """dinp, dA, dB += the gradients of lora_forward's out (dout); dhidden written."""
    cdef int N = inp.shape[0], IN = inp.shape[1], R = A.shape[0], OUT = Bm.shape[0]
    _check("backward", dict(dinp=dinp, dA=dA, dB=dB, dhidden=dhidden, dout=dout, hidden=hidden,
                            Bm=Bm),
           dict(dinp=(N, IN), dA=(R, IN), dB=(OUT, R), dhidden=(N, R), dout=(N, OUT),
                hidden=(N, R), Bm=(OUT, R)))
    with nogil:
        lora_backward(&dinp[0, 0], &dA[0, 0], &dB[0, 0], &dhidden[0, 0], &dout[0, 0],
                      &inp[0, 0], &hidden[0, 0], &A[0, 0], &Bm[0, 0], scale, 1, N, IN, OUT,
                      R)


def _check(where, arrays, shapes):
    for name, array in arrays.items():
        got = tuple(array.shape[:2])
        if got != shapes[name]:
            raise ValueError(f"lora.{where}: {name} has shape {got}, expected {shapes[name]}")
