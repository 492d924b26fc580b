# Rotary position embedding (RoPE), as Meta's Llama reference and llama2.c apply it to q and k:
#   angle[t,i] = t * theta^(-2i/hs)           t = 0..T-1, i = 0..hs/2-1, theta 10000 in Llama 2
#   out[.., 2i]   = inp[.., 2i] cos - inp[.., 2i+1] sin
#   out[.., 2i+1] = inp[.., 2i] sin + inp[.., 2i+1] cos
# i.e. the adjacent pair (2i, 2i+1) of every head is a complex number multiplied by
# exp(i angle).  inp, out (B,T,NH,hs): B batch, T time, NH heads (n_heads for q, n_kv_heads
# for k), hs head size (even).  The rotation is orthogonal, so backward rotates dout by -angle:
#   dinp[.., 2i]   += dout[.., 2i] cos + dout[.., 2i+1] sin
#   dinp[.., 2i+1] += dout[.., 2i+1] cos - dout[.., 2i] sin
# cos and sin come from tables (maxT, hs/2) computed once (llmc/rope_tables.py: in double, rounded to
# float at the end): the same table serves q and k, every layer, forward and backward, so the
# kernels do no transcendental math (libm's sinf/cosf would not vectorise).
from cython.parallel cimport prange

from kernels.bf16 cimport load, store
from kernels.parallel cimport SERIAL_BELOW


cdef void rope_forward(floatX* out, const floatX* inp, const float* freqs_cos,
                       const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef int half = hs // 2
    cdef Py_ssize_t bt, h, i
    cdef const float* c
    cdef const float* s
    cdef const floatX* x
    cdef floatX* y
    cdef float x0, x1
    for bt in prange(BT, schedule="static", use_threads_if=BT * NH * hs >= SERIAL_BELOW):
        c = freqs_cos + (bt % T) * half
        s = freqs_sin + (bt % T) * half
        for h in range(NH):
            x = inp + (bt * NH + h) * hs
            y = out + (bt * NH + h) * hs
            for i in range(half):
                # both read before either is written: out may be inp
                x0 = load(x, 2 * i)
                x1 = load(x, 2 * i + 1)
                store(y, 2 * i, x0 * c[i] - x1 * s[i])
                store(y, 2 * i + 1, x0 * s[i] + x1 * c[i])


cdef void rope_backward(floatX* dinp, const floatX* dout, const float* freqs_cos,
                        const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef int half = hs // 2
    cdef Py_ssize_t bt, h, i
    cdef const float* c
    cdef const float* s
    cdef const floatX* dy
    cdef floatX* dx
    for bt in prange(BT, schedule="static", use_threads_if=BT * NH * hs >= SERIAL_BELOW):
        c = freqs_cos + (bt % T) * half
        s = freqs_sin + (bt % T) * half
        for h in range(NH):
            dy = dout + (bt * NH + h) * hs
            dx = dinp + (bt * NH + h) * hs
            for i in range(half):
                store(dx, 2 * i, load(dx, 2 * i) + (load(dy, 2 * i) * c[i] + load(dy, 2 * i + 1) * s[i]))
                store(dx, 2 * i + 1, load(dx, 2 * i + 1) + (load(dy, 2 * i + 1) * c[i] - load(dy, 2 * i) * s[i]))


# ----------------------------------------------------------------------------
# Python wrappers: check shapes, then run the kernel without the GIL

cdef tuple shape4(const Py_ssize_t* shape):
    return (shape[0], shape[1], shape[2], shape[3])


def _check_shape(str where, str name, tuple got, tuple want):
    if got != want:
        raise ValueError(f"rope.{where}: {name} has shape {got}, expected {want}")


cdef _check_args(str where, str act, tuple act_shape, tuple x_shape, tuple cos_shape,
                 tuple sin_shape):
    # act (B,T,NH,hs) is out or dinp, x the input (inp or dout); the tables cover >= T rows
    B, T, NH, hs = x_shape
    if hs % 2 != 0:
        raise ValueError(f"rope.{where}: head size hs = {hs} is odd; RoPE rotates pairs")
    _check_shape(where, act, act_shape, x_shape)
    _check_shape(where, "freqs_cos", cos_shape, (cos_shape[0], hs // 2))
    _check_shape(where, "freqs_sin", sin_shape, cos_shape)
    if T > cos_shape[0]:
        raise ValueError(f"rope.{where}: T = {T} exceeds the {cos_shape[0]} rows of freqs_cos")


def forward(float[:, :, :, ::1] out, const float[:, :, :, ::1] inp,
            const float[:, ::1] freqs_cos, const float[:, ::1] freqs_sin):
    """out (B,T,NH,hs) = inp rotated by position; out may be inp. Tables from llmc.rope_tables."""
    _check_args("forward", "out", shape4(out.shape), shape4(inp.shape),
                (freqs_cos.shape[0], freqs_cos.shape[1]), (freqs_sin.shape[0], freqs_sin.shape[1]))
    cdef int B = inp.shape[0], T = inp.shape[1], NH = inp.shape[2], hs = inp.shape[3]
    if B * T * NH * hs == 0:
        return
    with nogil:
        rope_forward(&out[0, 0, 0, 0], &inp[0, 0, 0, 0], &freqs_cos[0, 0], &freqs_sin[0, 0],
                     B, T, NH, hs)


def backward(float[:, :, :, ::1] dinp, const float[:, :, :, ::1] dout,
             const float[:, ::1] freqs_cos, const float[:, ::1] freqs_sin):
    """dinp (B,T,NH,hs) += dout rotated back by position; dinp must not be dout."""
    _check_args("backward", "dinp", shape4(dinp.shape), shape4(dout.shape),
                (freqs_cos.shape[0], freqs_cos.shape[1]), (freqs_sin.shape[0], freqs_sin.shape[1]))
    cdef int B = dout.shape[0], T = dout.shape[1], NH = dout.shape[2], hs = dout.shape[3]
    if B * T * NH * hs == 0:
        return
    with nogil:
        rope_backward(&dinp[0, 0, 0, 0], &dout[0, 0, 0, 0], &freqs_cos[0, 0], &freqs_sin[0, 0],
                      B, T, NH, hs)
