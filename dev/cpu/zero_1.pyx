# zero variant 1: one memset, on the calling thread (what the CPU backend's zero did first).
from libc.string cimport memset

include "kernels/zero_wrappers.pxi"


cdef void zero_bytes(void* ptr, size_t nbytes) noexcept nogil:
    memset(ptr, 0, nbytes)
