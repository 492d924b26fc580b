# The loader of GPU backends (accel/loader.pyx): a build is a shared library exporting one C
# function PREFIX<entry> per table entry, with the table's signature, plus PREFIXcreate (whose
# arguments are the backend's own) and the functions of accel/spec.py's LIBRARY (PREFIXdestroy,
# PREFIXdevice_name, PREFIXprecision), whose types are these:

from accel.backend cimport Backend

include "accel/generated/library.pxi"


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
    cdef device_name_fn device_name
    cdef void* symbol(self, str entry) except NULL
    cdef DeviceBackend backend(self, void* ctx, const char* error, tuple families, str precision=*)
