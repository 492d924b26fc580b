# The loader of GPU backends (accel/loader.pyx): a build is a shared library exporting one C
# function PREFIX<entry> per table entry, with the table's signature, plus PREFIXcreate (whose
# arguments are the backend's own), PREFIXdestroy(ctx) and PREFIXdevice_name(ctx).

from accel.backend cimport Backend

ctypedef void (*destroy_fn)(void* ctx) noexcept nogil
ctypedef const char* (*name_fn)(void* ctx) noexcept nogil


cdef class DeviceContext:
    cdef void* ctx
    cdef destroy_fn destroy


cdef class DeviceBackend(Backend):
    cdef readonly str device     # the GPU's name, or the emulator's
    cdef readonly str library    # the shared library loaded


cdef class DeviceLibrary:
    cdef void* handle
    cdef readonly str path       # the build
    cdef readonly str name       # the backend's name, for messages
    cdef str prefix              # of its symbols: "accel_hip_", "accel_metal_"
    cdef str rebuild             # how to rebuild it, for messages
    cdef destroy_fn destroy
    cdef name_fn device_name
    cdef void* symbol(self, str entry) except NULL
    cdef DeviceBackend backend(self, void* ctx, const char* error, tuple families, str precision=*)
