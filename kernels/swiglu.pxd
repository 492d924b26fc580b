# SwiGLU, the gate of Llama's FFN:  out = silu(a) * b,  silu(a) = a * sigmoid(a)
cdef void swiglu_forward(float* out, const float* a, const float* b, Py_ssize_t N) noexcept nogil
# out (N,); a = w1 x, b = w3 x (N,) (N = B*T*hidden_dim)
cdef void swiglu_backward(float* da, float* db, const float* dout, const float* a,
                          const float* b, Py_ssize_t N) noexcept nogil
# da, db (N,) += ...;  dout (N,)
