# Python wrappers of kernels/matmul.pyx: check the arguments, then run the kernel without the GIL.
# Included, not imported, by kernels/matmul.pyx and by every dev/cpu/matmul_N.pyx variant, so
# each module wraps its own cdef functions under the same names and arguments: the tests,
# dev/ab.py and dev/promote.py treat a kernel and its variants alike.
from libc.limits cimport INT_MAX

cdef int expect_shape(str where, str name, const Py_ssize_t* shape, int ndim, tuple expected) except -1:
    got = tuple([shape[i] for i in range(ndim)])
    if got != expected:
        raise ValueError(f"{where}: {name} has shape {got}, expected {expected}")
    return 0


cdef int check_sizes(str where, Py_ssize_t B, Py_ssize_t T, Py_ssize_t C, Py_ssize_t OC) except -1:
    if B * T > INT_MAX or C > INT_MAX or OC > INT_MAX:
        raise ValueError(f"{where}: sizes B*T={B * T}, C={C}, OC={OC} exceed the BLAS int range")
    return 0


def forward(float[:, :, ::1] out, const float[:, :, ::1] inp, const float[:, ::1] weight,
            const float[::1] bias=None):
    """out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,) (bias may be None)."""
    where = "matmul.forward"
    cdef Py_ssize_t B = inp.shape[0], T = inp.shape[1], C = inp.shape[2], OC = weight.shape[0]
    expect_shape(where, "weight", weight.shape, 2, (OC, C))
    expect_shape(where, "out", out.shape, 3, (B, T, OC))
    if bias is not None:
        expect_shape(where, "bias", bias.shape, 1, (OC,))
    check_sizes(where, B, T, C, OC)
    if B * T == 0 or OC == 0:
        return
    cdef const float* bias_ptr = &bias[0] if bias is not None else NULL
    with nogil:
        matmul_forward(&out[0, 0, 0], &inp[0, 0, 0], &weight[0, 0], bias_ptr, B, T, C, OC)


def backward(float[:, :, ::1] dinp, float[:, ::1] dweight, float[::1] dbias,
             const float[:, :, ::1] dout, const float[:, :, ::1] inp, const float[:, ::1] weight):
    """dinp (B,T,C), dweight (OC,C), dbias (OC,) or None  +=  gradients from dout (B,T,OC)."""
    where = "matmul.backward"
    cdef Py_ssize_t B = inp.shape[0], T = inp.shape[1], C = inp.shape[2], OC = weight.shape[0]
    expect_shape(where, "weight", weight.shape, 2, (OC, C))
    expect_shape(where, "dout", dout.shape, 3, (B, T, OC))
    expect_shape(where, "dinp", dinp.shape, 3, (B, T, C))
    expect_shape(where, "dweight", dweight.shape, 2, (OC, C))
    if dbias is not None:
        expect_shape(where, "dbias", dbias.shape, 1, (OC,))
    check_sizes(where, B, T, C, OC)
    if B * T == 0 or OC == 0:
        return
    cdef float* dbias_ptr = &dbias[0] if dbias is not None else NULL
    with nogil:
        matmul_backward(&dinp[0, 0, 0], &dweight[0, 0], dbias_ptr, &dout[0, 0, 0], &inp[0, 0, 0],
                        &weight[0, 0], B, T, C, OC)
