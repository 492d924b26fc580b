# Python wrappers of the matmul + GELU lab kernels (dev/cpu/matmul_gelu_N.pyx): check the
# arguments, then run the kernel without the GIL.  Included by every variant.

def forward(float[:, :, ::1] out, float[:, :, ::1] out_gelu, const float[:, :, ::1] inp,
            const float[:, ::1] weight, const float[::1] bias):
    """out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,);  out_gelu = gelu(out)."""
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2], OC = weight.shape[0]
    if weight.shape[1] != C or bias.shape[0] != OC:
        raise ValueError(f"matmul_gelu.forward: weight {tuple(weight.shape)[:2]} and bias "
                         f"({bias.shape[0]},) do not fit inp's C={C}")
    for name, buf in (("out", out), ("out_gelu", out_gelu)):
        if (buf.shape[0], buf.shape[1], buf.shape[2]) != (B, T, OC):
            raise ValueError(f"matmul_gelu.forward: {name} has shape "
                             f"{(buf.shape[0], buf.shape[1], buf.shape[2])}, expected {(B, T, OC)}")
    if B * T * OC == 0:
        return
    with nogil:
        matmul_gelu_forward(&out[0, 0, 0], &out_gelu[0, 0, 0], &inp[0, 0, 0], &weight[0, 0],
                            &bias[0], B, T, C, OC)
