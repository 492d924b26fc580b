# Python wrappers of kernels/zero.pyx: check the arguments, then run the kernel without the GIL.
# Included, not imported, by kernels/zero.pyx and by every dev/cpu/zero_N.pyx variant.

def zero(float[::1] x):
    """x (N,) = 0."""
    if x.shape[0] == 0:
        return
    with nogil:
        zero_bytes(&x[0], <size_t>x.shape[0] * sizeof(float))
