# Python wrappers of kernels/encoder.pyx: check the arguments, then run the kernel without the GIL.
# Included, not imported, by kernels/encoder.pyx and by every dev/cpu/encoder_N.pyx variant, so
# each module wraps its own cdef functions under the same names and arguments: the tests,
# dev/ab.py and dev/promote.py treat a kernel and its variants alike.

def _check_shape(str where, str name, tuple got, tuple want):
    if got != want:
        raise ValueError(f"encoder.{where}: {name} has shape {got}, expected {want}")


cdef _check_ids(str where, const int[:, ::1] inp, Py_ssize_t num_rows, str table):
    cdef Py_ssize_t b, t
    cdef int ix
    for b in range(inp.shape[0]):
        for t in range(inp.shape[1]):
            ix = inp[b, t]
            if ix < 0 or ix >= num_rows:
                raise ValueError(f"encoder.{where}: inp[{b}, {t}] = {ix} is not a row of {table} "
                                 f"(expected 0 <= id < {num_rows})")


cdef _check_args(str where, str act, tuple act_shape, const int[:, ::1] inp,
                 str table, tuple table_shape, str pos, tuple pos_shape):
    # act (B,T,C) is out or dout, table (Vp,C) is wte or dwte, pos (maxT,C) is wpe or dwpe
    B, T = inp.shape[0], inp.shape[1]
    Vp, C = table_shape
    _check_shape(where, pos, pos_shape, (pos_shape[0], C))
    _check_shape(where, act, act_shape, (B, T, C))
    if T > pos_shape[0]:
        raise ValueError(f"encoder.{where}: T = {T} exceeds the {pos_shape[0]} rows of {pos}")
    _check_ids(where, inp, Vp, table)


def forward(float[:, :, ::1] out, const int[:, ::1] inp,
            const float[:, ::1] wte, const float[:, ::1] wpe):
    """out (B,T,C) = wte[inp] + wpe[:T]; inp (B,T) int32, wte (Vp,C), wpe (maxT,C)."""
    _check_args("forward", "out", (out.shape[0], out.shape[1], out.shape[2]), inp,
                "wte", (wte.shape[0], wte.shape[1]), "wpe", (wpe.shape[0], wpe.shape[1]))
    cdef int B = inp.shape[0], T = inp.shape[1], C = wte.shape[1]
    if B == 0 or T == 0 or C == 0:
        return
    with nogil:
        encoder_forward(&out[0, 0, 0], &inp[0, 0], &wte[0, 0], &wpe[0, 0], B, T, C)


def backward(float[:, ::1] dwte, float[:, ::1] dwpe, const float[:, :, ::1] dout,
             const int[:, ::1] inp):
    """dwte (Vp,C), dwpe (maxT,C) += gradients of the encoder; dout (B,T,C), inp (B,T) int32."""
    _check_args("backward", "dout", (dout.shape[0], dout.shape[1], dout.shape[2]), inp,
                "dwte", (dwte.shape[0], dwte.shape[1]), "dwpe", (dwpe.shape[0], dwpe.shape[1]))
    cdef int B = inp.shape[0], T = inp.shape[1], C = dwte.shape[1]
    if B == 0 or T == 0 or C == 0:
        return
    with nogil:
        encoder_backward(&dwte[0, 0], &dwpe[0, 0], &dout[0, 0, 0], &inp[0, 0], B, T, C)
