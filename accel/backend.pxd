# The backend interface: the one way a model reaches memory and kernels.
#
# A backend is a context (`ctx`, whatever the backend needs: a device, a stream, its own
# bookkeeping) plus one table of C function pointers, each taking the context first.  A model
# allocates its buffers through the table, moves tokens in and losses out through it, and runs
# every layer, the loss bookkeeping and the optimizer through it, so it never dereferences a
# backend pointer: the same model runs on host memory (cpu), device memory (hip, metal) or a
# checking wrapper (check:NAME) unchanged.
#
# Pointers returned by alloc are the backend's; a model may offset them (a tensor inside a
# buffer) and pass them back, nothing else.  The entries, their groups (core, which every
# backend has, then groups by what the kernels are: linear, gpt2, llama, flash) and their
# arguments are declared once, in accel/spec.py; accel/codegen.py writes the struct from it.
# Kernel semantics are those of the CPU kernels, declared in kernels/*.pxd (backward entries
# add into their gradients).  A model family names the groups it needs; Backend.validate
# refuses a table with an entry of its groups missing.

include "accel/generated/table.pxi"


cdef class Backend:
    cdef BackendTable table
    cdef readonly str name
    cdef readonly bint host_visible   # alloc's pointers are host memory the caller may view
    cdef readonly tuple groups        # the entry groups the table fills (accel/spec.py)
    cdef object keepalive             # what owns ctx (and anything the table's functions use)
    cdef public dict tolerances       # check:'s tolerance by entry, for lower-precision entries
    cdef readonly str precision       # what the floatX arguments point to: "fp32" or "bf16"
    cdef readonly int itemsize        # bytes of one floatX element
    cdef readonly str grad_precision  # what the floatG arguments point to: "fp32" or "bf16"
    cdef readonly int grad_itemsize   # bytes of one floatG element
    cdef void validate(self) except *


cdef class Buffer:
    """Memory allocated through a backend; freed with it."""
    cdef readonly Backend backend
    cdef void* ptr
    cdef readonly size_t nbytes
    cdef Py_ssize_t shape[1]
