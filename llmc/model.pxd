# The model-generic core (llmc/model.pyx): buffers laid out from name -> shape lists on a
# backend, the batch moved in and the loss out, the layers run under an activation checkpoint
# policy (llmc/recompute.py), zero_grad, the global norm and AdamW.  A model family
# (train_gpt2.pyx) subclasses Model and fills in its shapes, its embedding, one layer and its
# head, forward and backward.
from accel.backend cimport Backend, BackendTable, Buffer


cdef class Layout:
    """Tensors (name, shape) back to back in one buffer."""
    cdef readonly list names, shapes, offsets, sizes, itemsizes, byte_offsets
    cdef readonly Py_ssize_t size, nbytes
    cdef void point(self, float** fields, float* base, int itemsize) noexcept


cdef class Model:
    cdef readonly Backend backend
    cdef BackendTable table              # the backend's table, ctx first
    cdef readonly object config
    cdef readonly str precision          # "fp32", "bf16" or "fp16": the backend's (accel/spec.py)
    cdef readonly int itemsize           # bytes of a parameter or activation the kernels read
    cdef readonly str grad_precision     # the parameter gradients': "fp32", or "bf16" at bf16
    cdef readonly int grad_itemsize      # bytes of a parameter gradient (LoRA's: 4 always)
    cdef readonly bint trainable         # update trains it (False: no master weights at bf16)
    cdef readonly Layout param_layout
    cdef readonly object recompute_plan  # llmc.recompute.RecomputePlan of the policy
    cdef readonly Layout act_layout      # the kept activations of the current (B, T) under the
                                         # policy; None before the first forward
    cdef readonly Layout act_grad_layout # their gradients; None before the first backward
    cdef Buffer _params, _grads, _m, _v, _acts, _grads_acts, _inputs, _targets
    cdef Buffer _master                  # bf16, fp16: the float32 master weights (None at fp32)
    cdef readonly float loss_scale       # what backward scales the loss by (fp16; 1 elsewhere)
    cdef readonly int loss_scale_steps   # finite steps since the loss scale last changed
    cdef readonly int B, T               # shape of the last forward
    cdef bint has_targets                # the last forward had targets
    cdef Py_ssize_t scored               # its positions whose target is not -1 (not scored)
    cdef float mean_loss
    cdef public int step                 # the AdamW t of the last update, 0 before any (the
                                         # check backend reports it; bf16: the seed that update
                                         # rounded with; a resume sets it)
    cdef readonly Py_ssize_t shard_start, shard_end  # the parameters AdamW updates (ZeRO-1: a span)

    # where the layers' activations are, set by _point_activations (pointer tables in numpy
    # arrays that _tables keeps alive)
    cdef object _tables
    cdef int L, layer_fields             # layers; tensors per layer (the last its output)
    cdef const int* slot_of              # (L,) the plan's slot, output, segment start of
    cdef const int* output_of            #      each layer
    cdef const int* segment_start
    cdef int* resident                   # (slots,) the layer whose internals a slot holds, or -1
    cdef float** slot_fields             # (slots, layer_fields - 1) each slot's internals
    cdef float** outputs                 # (outputs,) the kept layer outputs
    cdef float* embedded                 # the embedding's output, the stream into layer 0
    cdef float* losses                   # (B, T) in the head's activations
    cdef float** layer_acts              # (layer_fields,) the layer being run, for the family
    cdef float** head_acts               # the head's activations
    cdef float** layer_grads             # (layer_fields,) one layer's gradients; the last is
                                         # the gradient of its output (one of dstream)
    cdef float** head_grads              # the head's gradients (NULL where NO_GRAD)
    cdef float** dstream                 # (2,) gradients of the streams in and out of a layer
    cdef float* dlosses
    cdef float* grads_acts_head          # the head's gradients, head_grad_bytes
    cdef float* layer_grads_base         # one layer's gradients, layer_grad_bytes
    cdef size_t head_grad_bytes, layer_grad_bytes, stream_bytes

    # the KV cache (start_cache, forward_cached, forward_segments): each layer's keys, then
    # values, of the positions of a text, (kv_capacity, kv_width) each, in the model's
    # precision.  While kv_caching, the forward's one row of tokens is segments: segment s is
    # rows segment_row(s) .. + segment_length(s) - 1, the positions segment_position(s) .. of a
    # text whose earlier positions the cache holds; a family's layer_forward runs each segment
    # in order over the cache (accel/spec.py's "cache" group), writing its keys and values
    # there (forward_cached: one segment, the text's next positions; forward_segments: texts
    # sharing a beginning, each continuation after it in turn)
    cdef Buffer _kv_cache, _kv_scores
    cdef readonly int kv_positions       # P: the positions cached so far
    cdef readonly int kv_capacity        # the positions the cache holds at most
    cdef Py_ssize_t kv_width             # floats of one position's keys (or values) in a layer
    cdef bint kv_caching                 # the forward running now is over segments
    cdef float* kv_scores                # (NH, T, P+T) the cached attention's probabilities
    cdef object _segments                # (num_segments, 3) int32: row, length, position
    cdef const int* segments
    cdef int num_segments
    cdef int position                    # first_position(): the embedding's, set per segment

    cdef inline int segment_row(self, int s) noexcept nogil:
        return self.segments[3 * s]

    cdef inline int segment_length(self, int s) noexcept nogil:
        return self.segments[3 * s + 1]

    cdef inline int segment_position(self, int s) noexcept nogil:
        return self.segments[3 * s + 2]

    cdef inline int first_position(self) noexcept nogil:
        """The position in its text of the embedding's first token: 0 but in a segment."""
        return self.position

    cdef inline float* kv_keys(self, int l) noexcept nogil:
        return <float*>(<char*>self._kv_cache.ptr +
                        2 * l * self.kv_capacity * self.kv_width * self.itemsize)

    cdef inline float* kv_values(self, int l) noexcept nogil:
        return <float*>(<char*>self._kv_cache.ptr +
                        (2 * l + 1) * self.kv_capacity * self.kv_width * self.itemsize)

    # LoRA (attach_lora, llmc/adapter.py): the parameters frozen (their gradients never computed:
    # grads stays unallocated and a family's gradient pointers NULL), and rank-R updates beside
    # the linear layers of LORA_TARGETS trained instead, float32 at every precision.  Update k =
    # l * lora_num_targets + target's A (R, C), B (OC, R), their gradients and hidden (B*T, R),
    # through tables of pointers, NULL where (layer, target) has none (lora_a itself NULL: no
    # LoRA attached, the parameters train)
    cdef readonly object lora            # llmc.lora.LoraConfig, or None
    cdef object _lora_tables             # the pointer tables' numpy arrays, kept alive
    cdef readonly Layout lora_layout     # the updates' tensors, (name, (layers, ...)) each
    cdef Buffer _lora, _lora_grads, _lora_hidden, _lora_dropped
    cdef float lora_scale                # alpha / R
    cdef int lora_rank, lora_num_targets
    # dropout on the updates' input at training (forward(training=True)): update k's mask is
    # kernels/dropout.pxd's of (lora_draw_seed, stream k), drawn again by backward and by a
    # recomputed forward, none where lora_dropping is off (evaluation, generation)
    cdef float lora_dropout              # p, 0 <= p < 1
    cdef public int lora_seed            # the run's (each MPI process its own)
    cdef bint lora_dropping              # the last forward was a training one with p > 0
    cdef readonly int lora_draw_seed     # its masks' seed: from lora_seed, step and the draw
    cdef int lora_draw_step, lora_draws  # training forwards since the step last changed
    cdef float* lora_dropped             # (B*T, widest C) the dropped input, scratch
    cdef float* lora_ddropped            # (B*T, widest C) its gradient, backward's scratch
    cdef float** lora_a
    cdef float** lora_b
    cdef float** lora_da
    cdef float** lora_db
    cdef float** lora_hidden             # set by _allocate_activations, for its (B, T)
    cdef float* lora_dhidden             # (B*T, R) backward's scratch

    # element `offset` of a parameter or activation tensor (a layer's slice, a segment's rows):
    # both are in the model's precision, so a family never adds to their pointers itself
    cdef inline float* at(self, const float* tensor, Py_ssize_t offset) noexcept nogil:
        return <float*>(<const char*>tensor + offset * self.itemsize)

    # a parameter gradient's element `offset` (float32 or bf16: grad_precision), or NULL where
    # the parameters are frozen (LoRA)
    cdef inline float* grad_at(self, const float* tensor, Py_ssize_t offset) noexcept nogil:
        return NULL if tensor == NULL else <float*>(<const char*>tensor + offset * self.grad_itemsize)

    # matmul_forward and matmul_backward of the linear layer of LORA_TARGETS[target] in layer l,
    # with its LoRA update where it has one (a family calls these for its targets)
    cdef void linear_forward(self, int target, int l, float* out, const float* inp,
                             const float* weight, const float* bias, int B, int T, int C,
                             int OC) noexcept nogil
    cdef void linear_backward(self, int target, int l, float* dinp, float* dweight, float* dbias,
                              const float* dout, const float* inp, const float* weight, int B,
                              int T, int C, int OC) noexcept nogil

    # what a model family fills in
    cdef void point_parameters(self, float* params, float* grads) noexcept
    cdef void embedding_forward(self, float* out, const int* inputs, int B, int T) noexcept nogil
    cdef void layer_forward(self, int l, float** acts, const float* inp, int B, int T) noexcept nogil
    cdef void head_forward(self, float** acts, const float* inp, const int* targets,
                           int B, int T) noexcept nogil
    cdef void head_backward(self, float* dinp, float** grads_acts, float** acts, const float* inp,
                            const int* targets, int B, int T) noexcept nogil
    cdef void layer_backward(self, int l, float* dinp, float** grads_acts, float** acts,
                             const float* inp, int B, int T) noexcept nogil
    cdef void embedding_backward(self, const float* dout, const int* inputs, int B, int T) noexcept nogil

    # the core's forward and backward through the layers
    cdef Buffer _lazy(self, Buffer buffer, Layout layout)
    cdef Buffer _moments(self, Buffer buffer)
    cdef Buffer _trained_grads(self)
    cdef void* _lora_table(self, str name, Buffer buffer, str matrix)
    cdef void* _table(self, str name, values, dtype=*)
    cdef void _point_layer(self, int l) noexcept nogil
    cdef const float* _layer_input(self, int l) noexcept nogil
    cdef void _run_layer_forward(self, int l, int B, int T) noexcept nogil
    cdef void _forward_pass(self, const int* inputs, const int* targets, int B, int T) noexcept nogil
    cdef void _forward_segments(self, const int* inputs, const int* targets, int n, int head_from,
                                Py_ssize_t C) noexcept nogil
    cdef void _backward_pass(self, const int* inputs, const int* targets, int B, int T,
                             float dloss) noexcept nogil
