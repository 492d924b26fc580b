# The model-generic core (llmc/model.pyx): buffers laid out from name -> shape lists on a
# backend, the batch moved in and the loss out, zero_grad, the global norm and AdamW.  A model
# family (train_gpt2.pyx) subclasses Model and fills in its shapes, forward and backward.
from accel.backend cimport Backend, BackendTable, Buffer


cdef class Layout:
    """Tensors (name, shape) back to back in one buffer."""
    cdef readonly list names, shapes, offsets, sizes
    cdef readonly Py_ssize_t size
    cdef void point(self, float** fields, float* base) noexcept


cdef class Model:
    cdef readonly Backend backend
    cdef BackendTable b                  # the backend's table, ctx first
    cdef readonly object config
    cdef readonly Layout param_layout
    cdef readonly Layout act_layout      # of the current (B, T); None before the first forward
    cdef Buffer _params, _grads, _m, _v, _acts, _grads_acts, _inputs, _targets
    cdef readonly int B, T               # shape of the last forward
    cdef bint has_targets                # the last forward had targets
    cdef float mean_loss
    cdef readonly int step               # AdamW updates done (the check backend reports it)
    cdef readonly Py_ssize_t shard_start, shard_end  # the parameters AdamW updates (ZeRO-1: a span)

    # what a model family fills in
    cdef void point_parameters(self, float* params, float* grads) noexcept
    cdef void point_activations(self, float* acts, float* grads_acts) noexcept
    cdef void forward_pass(self, const int* inputs, const int* targets, int B, int T) noexcept nogil
    cdef void backward_pass(self, const int* inputs, const int* targets, int B, int T) noexcept nogil

    cdef Buffer _lazy(self, Buffer buffer, Layout layout)
    cdef Buffer _moments(self, Buffer buffer)
