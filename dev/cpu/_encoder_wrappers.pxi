# Python wrappers shared by the dev/cpu/encoder_N variants: the same names and arguments as
# kernels.encoder, so dev/ab.py drives every variant the same way.

cdef int _check(str where, const int[:, ::1] inp, Py_ssize_t Vp, Py_ssize_t maxT,
                tuple out_shape, Py_ssize_t C) except -1:
    cdef Py_ssize_t B = inp.shape[0], T = inp.shape[1], b, t
    if out_shape != (B, T, C):
        raise ValueError(f"encoder.{where}: out/dout has shape {out_shape}, expected {(B, T, C)}")
    if T > maxT:
        raise ValueError(f"encoder.{where}: T = {T} exceeds the {maxT} rows of wpe")
    for b in range(B):
        for t in range(T):
            if not 0 <= inp[b, t] < Vp:
                raise ValueError(f"encoder.{where}: inp[{b}, {t}] = {inp[b, t]} is not a row of wte")
    return 0


def forward(float[:, :, ::1] out, const int[:, ::1] inp, const float[:, ::1] wte, const float[:, ::1] wpe):
    """out (B,T,C) = wte[inp] + wpe[:T]; inp (B,T) int32, wte (Vp,C), wpe (maxT,C)."""
    if wpe.shape[1] != wte.shape[1]:
        raise ValueError(f"encoder.forward: wpe has {wpe.shape[1]} channels, wte {wte.shape[1]}")
    _check("forward", inp, wte.shape[0], wpe.shape[0], (out.shape[0], out.shape[1], out.shape[2]), wte.shape[1])
    cdef int B = inp.shape[0], T = inp.shape[1], C = wte.shape[1]
    if B * T * C == 0:
        return
    with nogil:
        encoder_forward(&out[0, 0, 0], &inp[0, 0], &wte[0, 0], &wpe[0, 0], B, T, C)


def backward(float[:, ::1] dwte, float[:, ::1] dwpe, const float[:, :, ::1] dout, const int[:, ::1] inp):
    """dwte (Vp,C), dwpe (maxT,C) += gradients of the encoder; dout (B,T,C), inp (B,T) int32."""
    if dwpe.shape[1] != dwte.shape[1]:
        raise ValueError(f"encoder.backward: dwpe has {dwpe.shape[1]} channels, dwte {dwte.shape[1]}")
    _check("backward", inp, dwte.shape[0], dwpe.shape[0], (dout.shape[0], dout.shape[1], dout.shape[2]), dwte.shape[1])
    cdef int B = inp.shape[0], T = inp.shape[1], C = dwte.shape[1]
    if B * T * C == 0:
        return
    with nogil:
        encoder_backward(&dwte[0, 0], &dwpe[0, 0], &dout[0, 0, 0], &inp[0, 0], B, T, C)
