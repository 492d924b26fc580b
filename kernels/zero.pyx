# zero (promoted from dev/cpu/zero_2.pyx): the CPU backend's `zero`, the buffer cut into one
# page-aligned block per OpenMP thread, each block one memset.  zero_grad clears 0.5 GB for
# GPT-2 124M each step, and backward each layer's activation gradients: one core's stores do not
# fill the memory bus (on the Intel machine 10.5 GB/s from one thread, 20 from two; on the
# Zen 4 even, dev/BENCHMARKS.md section 9); below PARALLEL_MIN_BYTES the fork-join costs more
# than it saves.
from cython.parallel cimport prange
from libc.string cimport memset

from kernels.parallel cimport max_threads

include "kernels/zero_wrappers.pxi"

cdef enum:
    PAGE = 4096
    PARALLEL_MIN_BYTES = 1 << 20


cdef void zero_bytes(void* ptr, size_t nbytes) noexcept nogil:
    cdef int parts = max_threads(), part
    cdef size_t block, start, end
    if parts == 1 or nbytes < PARALLEL_MIN_BYTES:
        memset(ptr, 0, nbytes)
        return
    block = ((nbytes + parts - 1) // parts + PAGE - 1) // PAGE * PAGE
    for part in prange(parts, schedule="static", num_threads=parts):
        start = part * block
        end = min(nbytes, start + block)
        if end > start:
            memset(<char*>ptr + start, 0, end - start)
