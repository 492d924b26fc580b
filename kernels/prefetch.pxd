# Software prefetch, shared by the kernels that stream memory the hardware prefetchers do not
# follow on their own: a head's columns of the KV cache (strided rows), and a bf16 weight's
# short rows read one after another in decoding's matrix-vector products.  A hint only: the
# line is fetched towards the caches and nothing waits for it.  Locality 0 (non-temporal):
# what is fetched is read once a token, so it should not push out what is read again.
cdef extern from *:
    """
    #define prefetch_read(p) __builtin_prefetch((p), 0, 0)
    """
    void prefetch_read(const void* p) noexcept nogil


cdef inline void prefetch_bytes(const void* p, Py_ssize_t n) noexcept nogil:
    # every 64-byte line of the n bytes at p
    cdef Py_ssize_t b
    for b in range(0, n, 64):
        prefetch_read(<const char*>p + b)
