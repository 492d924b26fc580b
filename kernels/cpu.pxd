from kernels.backend cimport Kernels

cdef Kernels cpu_kernels() noexcept nogil
