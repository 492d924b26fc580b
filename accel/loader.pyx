"""
The loader of GPU backends: one host pattern for HIP (accel/hip/device.pyx) and Metal
(accel/metal/metal.pyx). A build is a shared library with a C ABI: PREFIX<entry> for each entry
of the groups it fills (accel/spec.py), with the table's signature, plus PREFIXcreate (arguments
of the backend's own, then an error buffer), and accel/spec.py's LIBRARY: PREFIXdestroy(ctx),
PREFIXdevice_name(ctx), PREFIXprecision().  accel/generated/backend.h declares them all in C, and
the build compiles against it.

    library = DeviceLibrary(path, "hip-emu", "accel_hip_", "`make hip-emu`")
    ctx = (<create_fn>library.symbol("create"))(..., error, sizeof(error))
    backend = library.backend(ctx, error, ("linear", "gpt2"))

The build is opened at run time (dlopen), so nothing here links against a GPU library, and a
missing build, a missing symbol or a context that cannot be made is one BackendError line.
The library stays loaded: a context's code may still be running at exit (atexit, TLS).
"""
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym

from accel.backend cimport BackendTable

import os

from accel.backend import BackendError
from accel.spec import ORDER, entries_of

__all__ = ["DeviceBackend", "DeviceContext", "DeviceLibrary"]


cdef class DeviceContext:
    """A build's context (its device, runtime, scratch memory), destroyed with the last Backend
    that uses it."""

    def __dealloc__(self):
        if self.ctx != NULL:
            self.destroy(self.ctx)


cdef class DeviceBackend(Backend):
    """A Backend over one build of a GPU backend."""

    def __repr__(self):
        return f"<Backend {self.name}: {self.device}, {self.library}>"


cdef class DeviceLibrary:
    """A build loaded: its symbols by entry name, and the Backend over a context it made."""

    def __init__(self, str path, str name, str prefix, str rebuild):
        self.path, self.name, self.prefix, self.rebuild = path, name, prefix, rebuild
        # RTLD_LOCAL: each build keeps its own symbols (tests load several emulated builds at once)
        self.handle = dlopen(os.fsencode(path), RTLD_NOW | RTLD_LOCAL)
        if self.handle == NULL:
            raise BackendError(f"backend '{name}' is unavailable: cannot load {path}: "
                               f"{dlerror().decode(errors='replace')}")
        # looked up before any context exists, so that a context never lacks its destroy
        self.destroy = <destroy_fn>self.symbol("destroy")
        self.device_name = <device_name_fn>self.symbol("device_name")

    cdef void* symbol(self, str entry) except NULL:
        """The build's function PREFIX<entry>."""
        cdef str symbol_name = self.prefix + entry
        cdef void* address = dlsym(self.handle, symbol_name.encode())
        if address == NULL:
            raise BackendError(f"backend '{self.name}': {self.path} has no {symbol_name} (an old "
                               f"build? run {self.rebuild} again)")
        return address

    cdef DeviceBackend backend(self, void* ctx, const char* error, tuple groups,
                               str precision="fp32"):
        """The Backend over ctx, which PREFIXcreate returned (NULL: `error` says why), its table
        filled with the build's functions for the entries of these groups, by name; the other
        groups' entries stay NULL and the Backend's groups say so.  precision: what the build's
        floatX arguments point to (accel/spec.py's PRECISIONS)."""
        if ctx == NULL:
            raise BackendError(f"backend '{self.name}' is unavailable: "
                               f"{(<bytes>error).decode(errors='replace')}")
        cdef DeviceContext owner = DeviceContext()
        owner.ctx = ctx
        owner.destroy = self.destroy
        cdef DeviceBackend backend = DeviceBackend(self.name, False, groups, owner, precision)
        backend.device = (<bytes>self.device_name(ctx)).decode(errors="replace")
        backend.library = self.path
        backend.table.ctx = ctx
        cdef void** entries = <void**>&backend.table.ctx + 1   # the entries, in the spec's ORDER
        for entry in entries_of(backend.groups):
            entries[ORDER.index(entry)] = self.symbol(entry)
        backend.validate()
        return backend
