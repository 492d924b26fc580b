# Thread helpers shared by the CPU kernels and their dev/cpu variants: OpenMP's thread count,
# and OpenBLAS set to one thread for GEMMs called from inside OpenMP's threads.
from kernels.cblas cimport scipy_openblas_get_num_threads, scipy_openblas_set_num_threads

# OpenMP's thread count for the calling thread's next parallel region, or 1 where the build has
# no OpenMP (NO_OMP=1, or a compiler without it); set_max_threads sets it (nothing without).
# The count is the calling thread's own: a limit set on the main thread (threadpoolctl,
# omp_set_num_threads) does not reach a thread started later.
cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int max_threads(void) { return omp_get_max_threads(); }
    static void set_max_threads(int n) { omp_set_num_threads(n); }
    #else
    static int max_threads(void) { return 1; }
    static void set_max_threads(int n) { (void)n; }
    #endif
    """
    int max_threads() noexcept nogil
    void set_max_threads(int n) noexcept nogil


# OpenBLAS's thread count is process-wide and anything may reset it (threadpoolctl, another
# module): a kernel that calls OpenBLAS from OpenMP's threads sets it back to 1 on every call
# (a cheap check), so that only one thread pool ever runs.
cdef inline void blas_single_threaded() noexcept nogil:
    if scipy_openblas_get_num_threads() != 1:
        scipy_openblas_set_num_threads(1)


# Elementwise kernels run on one thread below this many floats of output: they take well under
# a millisecond on one core there, less than what waking a second thread costs on a busy
# machine (a descheduled thread holds the others at the region's end for a time slice).
cdef enum:
    SERIAL_BELOW = 1 << 20
