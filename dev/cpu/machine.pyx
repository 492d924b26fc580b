# The machine's DRAM bandwidth, for dev/ab.py to rate the memory-bound kernels against (the sgemm
# peak is llmc.dry_run.measure_gflops, kernels.matmul's own rate):
#   bandwidth_seconds  one pass over four float arrays reading all and writing three (AdamW's
#                   traffic) on the OpenMP threads: the DRAM bandwidth a streaming kernel can get
# Not a kernel variant: dev/ab.py does not list it.
from cython.parallel cimport prange
from libc.stdlib cimport malloc, free
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC


cdef double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + 1e-9 * ts.tv_nsec


def bandwidth_seconds(Py_ssize_t n, int repeats=5):
    """Best-of-`repeats` seconds for one pass over four float arrays of n that reads all four
    and writes three back (28 n bytes): AdamW's memory traffic without its arithmetic.  Seven
    streams keep more misses in flight per core than STREAM's triad does."""
    # four separate allocations, as the model's buffers are (carved from one block, at
    # power-of-two distances, the streams collide in the caches and measure far less)
    cdef float* p = <float*>malloc(n * sizeof(float))
    cdef float* m = <float*>malloc(n * sizeof(float))
    cdef float* v = <float*>malloc(n * sizeof(float))
    cdef float* g = <float*>malloc(n * sizeof(float))
    cdef Py_ssize_t i
    cdef int r
    cdef double best = 1e300, t0
    cdef float decay = 0.9, step = 1e-3
    if p == NULL or m == NULL or v == NULL or g == NULL:
        free(p)
        free(m)
        free(v)
        free(g)
        raise MemoryError(f"machine.bandwidth_seconds: no memory for four arrays of {n} floats")
    with nogil:
        for i in prange(n, schedule="static"):   # first touch by the threads that use the pages
            p[i] = 1.0
            m[i] = 0.0
            v[i] = 0.0
            g[i] = 1e-3
        for r in range(repeats):
            t0 = now()
            for i in prange(n, schedule="static"):
                m[i] = decay * m[i] + g[i]
                v[i] = decay * v[i] + g[i] * g[i]
                p[i] = p[i] - step * m[i]
            best = min(best, now() - t0)
    free(p)
    free(m)
    free(v)
    free(g)
    return best
