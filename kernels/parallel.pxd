# OpenMP's thread count for the next parallel region, or 1 where the build has no OpenMP
# (NO_OMP=1, or a compiler without it).
cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int max_threads(void) { return omp_get_max_threads(); }
    #else
    static int max_threads(void) { return 1; }
    #endif
    """
    int max_threads() noexcept nogil
