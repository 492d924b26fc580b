"""
The CPU backend: host memory and the Cython kernels of kernels/, gathered into the backend
table (accel/backend.pxd).  Most entries are the kernel itself behind a one-line adapter that
drops the context, which the CPU does not need; those are written from accel/spec.py
(accel/_cpu_table.pxi).  What is here is what is not a kernel: memory, the loss's fill and mean,
and the one entry that reports an error.

Memory comes from mmap: page-aligned (so guard:cpu can protect it), zero pages until first
written, and large buffers advised to transparent huge pages as NumPy does for its arrays.
"""
from accel.backend cimport Backend, BackendTable
from kernels.attention_gqa cimport attention_gqa_backward
from kernels.zero cimport zero_bytes
from libc.string cimport memcpy
from posix.mman cimport mmap, munmap, madvise, MAP_FAILED, MAP_PRIVATE, MAP_ANONYMOUS, PROT_READ, PROT_WRITE

cdef extern from "<sys/mman.h>" nogil:
    int MADV_HUGEPAGE

cdef enum:
    HUGEPAGE_MIN_BYTES = 4 << 20   # NumPy's threshold for advising huge pages


# --- memory ------------------------------------------------------------------------------

cdef void* cpu_alloc(void* ctx, size_t nbytes) noexcept nogil:
    cdef void* ptr = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if ptr == MAP_FAILED:
        return NULL
    if nbytes >= HUGEPAGE_MIN_BYTES:
        madvise(ptr, nbytes, MADV_HUGEPAGE)   # advice only: a kernel without THP ignores it
    return ptr

cdef void cpu_free(void* ctx, void* ptr, size_t nbytes) noexcept nogil:
    munmap(ptr, nbytes)

cdef void cpu_zero(void* ctx, void* ptr, size_t nbytes) noexcept nogil:
    zero_bytes(ptr, nbytes)

cdef void cpu_copy(void* ctx, void* dst, const void* src, size_t nbytes) noexcept nogil:
    memcpy(dst, src, nbytes)

cdef void cpu_synchronize(void* ctx) noexcept nogil:
    pass

# the message of a kernel that failed (out of scratch memory), until last_error hands it out
cdef const char* pending_error = NULL

cdef const char* cpu_last_error(void* ctx) noexcept nogil:
    global pending_error
    cdef const char* message = pending_error
    pending_error = NULL
    return message

cdef void cpu_mark(void* ctx, int step, int layer) noexcept nogil:
    pass

# --- loss bookkeeping and the optimizer ---------------------------------------------------

cdef void cpu_fill(void* ctx, float* out, float value, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        out[i] = value

cdef float cpu_mean(void* ctx, const float* x, Py_ssize_t n) noexcept nogil:
    cdef double total = 0.0
    cdef Py_ssize_t i
    for i in range(n):
        total += x[i]
    return <float>(total / n)

# --- the entry whose kernel reports running out of memory ------------------------------

cdef void cpu_attention_gqa_backward(void* ctx, float* dq, float* dk, float* dv, const float* dout,
                                     const float* q, const float* k, const float* v,
                                     const float* att, int B, int T, int NH, int NKV,
                                     int hs) noexcept nogil:
    global pending_error
    if attention_gqa_backward(dq, dk, dv, dout, q, k, v, att, B, T, NH, NKV, hs) != 0:
        pending_error = "attention_gqa_backward: out of memory for its scratch buffers"


include "accel/_cpu_table.pxi"


def create(bint flash=True):
    """The CPU backend; with flash=False without the flash group (as a backend that has no
    flash attention), for tests."""
    cdef Backend backend = Backend("cpu" if flash else "cpu-without-flash", True,
                                   ("linear", "gpt2", "llama", "flash") if flash else
                                   ("linear", "gpt2", "llama"))
    cdef BackendTable* t = &backend.table
    t.ctx = NULL
    t.alloc = cpu_alloc
    t.free = cpu_free
    t.zero = cpu_zero
    t.copy_to_backend = cpu_copy
    t.copy_to_host = cpu_copy
    t.synchronize = cpu_synchronize
    t.last_error = cpu_last_error
    t.mark = cpu_mark
    t.fill = cpu_fill
    t.mean = cpu_mean
    fill_kernels(t)
    t.attention_gqa_backward = cpu_attention_gqa_backward
    if not flash:
        t.flash_attention_forward = NULL
        t.flash_attention_backward = NULL
    backend.validate()
    return backend
