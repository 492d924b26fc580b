# Zeroing a buffer: the backend's `zero` (zero_grad, the activation gradients).
cdef void zero_bytes(void* ptr, size_t nbytes) noexcept nogil
# ptr[0..nbytes) = 0
