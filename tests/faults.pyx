"""
Planted faults: deliberately wrong table entries, for the tests that prove check: finds them.

    faulty_cpu("gelu_forward")    the CPU backend with that one entry wrong
"""
from accel.backend cimport Backend, BackendTable
from kernels.bf16 cimport bf16, bf16_to_float, float_bits, float_to_bf16, widen
from kernels.classifier cimport classifier_backward
from kernels.flash_attention cimport flash_attention_gqa_forward
from kernels.fp16 cimport fp16, fp16_to_float as fp16_value, float_to_fp16, widen_fp16
from kernels.gelu cimport gelu_forward
from kernels.layernorm cimport layernorm_backward
from kernels.matmul cimport matmul_forward
from kernels.rope cimport rope_forward
from libc.stdint cimport uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from llmc.model cimport Model

from accel import cpu


cdef void faulty_gelu_forward(void* ctx, float* out, const float* inp, Py_ssize_t N) noexcept nogil:
    memcpy(out, inp, N * sizeof(float))   # the identity instead of GELU

cdef void faulty_layernorm_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                                    const float* dout, const float* inp, const float* weight,
                                    const float* mean, const float* rstd, int B, int T, int C) noexcept nogil:
    cdef float* scratch_dbias = dweight   # dbias lands in dweight: both wrong, dinp right
    layernorm_backward(dinp, dweight, scratch_dbias, dout, inp, weight, mean, rstd, B, T, C)

cdef void faulty_rope_backward(void* ctx, float* dinp, const float* dout, const float* freqs_cos,
                               const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil:
    rope_forward(dinp, dout, freqs_cos, freqs_sin, B, T, NH, hs)   # rotates forward, and overwrites

cdef void faulty_flash_attention_backward(void* ctx, float* dinp, const float* dout,
                                          const float* inp, const float* out, const float* lse,
                                          int B, int T, int C, int NH) noexcept nogil:
    pass   # adds nothing into dinp

cdef void faulty_classifier_backward(void* ctx, float* dlogits, const float* dlosses,
                                     const float* logits, const float* logsum, const int* targets,
                                     int B, int T, int V, int Vp) noexcept nogil:
    # a position not scored still gets a gradient: its -1 read as a token that no logit is (the
    # softmax added, no one-hot), not as a row to leave alone
    cdef Py_ssize_t bt, n = <Py_ssize_t>B * T
    cdef int* unmasked = <int*>malloc(n * sizeof(int) + 1)
    if unmasked == NULL:
        return
    for bt in range(n):
        unmasked[bt] = V if targets[bt] < 0 else targets[bt]
    classifier_backward(dlogits, dlosses, logits, logsum, unmasked, B, T, V, Vp)
    free(unmasked)

cdef void bf16_truncating_matmul_forward(void* ctx, float* out, const float* inp,
                                         const float* weight, const float* bias,
                                         int B, int T, int C, int OC) noexcept nogil:
    matmul_forward(out, inp, weight, bias, B, T, C, OC)
    cdef Py_ssize_t i
    cdef uint32_t* bits = <uint32_t*>out
    for i in range(<Py_ssize_t>B * T * OC):   # stored as bf16 by truncation: 2^-8 of each value
        bits[i] &= <uint32_t>0xFFFF0000

cdef float* widened_gelu(const float* inp, Py_ssize_t N, bint fp16_input) noexcept nogil:
    """GELU in float32 on the widened bf16 (fp16) input, as the narrow table's: a buffer of 2N
    floats whose second half is the result (the caller frees it); NULL without memory."""
    cdef float* wide = <float*>malloc(2 * N * sizeof(float) + 1)
    if wide == NULL:
        return NULL
    if fp16_input:
        widen_fp16(wide, <const fp16*>inp, N)
    else:
        widen(wide, <const bf16*>inp, N)
    gelu_forward(wide + N, wide, N)
    return wide

cdef void bf16_truncating_gelu_forward(void* ctx, float* out, const float* inp,
                                       Py_ssize_t N) noexcept nogil:
    # each output stored by dropping its low 16 bits instead of rounding to nearest: off by at
    # most one ulp
    cdef float* wide = widened_gelu(inp, N, False)
    cdef Py_ssize_t i
    if wide == NULL:
        return
    for i in range(N):
        (<bf16*>out)[i] = <bf16>(float_bits(wide[N + i]) >> 16)
    free(wide)

cdef void fp16_truncating_gelu_forward(void* ctx, float* out, const float* inp,
                                       Py_ssize_t N) noexcept nogil:
    # each output rounded toward zero (the fp16 below it in magnitude): off by at most one ulp
    cdef float* wide = widened_gelu(inp, N, True)
    cdef Py_ssize_t i
    cdef fp16 h
    if wide == NULL:
        return
    for i in range(N):
        h = float_to_fp16(wide[N + i])
        if abs(<double>fp16_value(h)) > abs(<double>wide[N + i]) and (h & 0x7fff) != 0:
            h -= 1   # rounded up in magnitude: the neighbour toward zero
        (<fp16*>out)[i] = h
    free(wide)

cdef void bf16_statistic_flash_attention_gqa_forward(void* ctx, float* out, float* lse,
                                                    const float* q, const float* k,
                                                    const float* v, int B, int T, int NH,
                                                    int NKV, int hs) noexcept nogil:
    # the bf16 kernel with its statistic kept in bf16: each row's log-sum-exp rounded, 2^-9 of
    # it, so at T=1024 (lse near 7) about 1.5% of every probability the backward rebuilds
    cdef Py_ssize_t i
    flash_attention_gqa_forward(<bf16*>out, lse, <const bf16*>q, <const bf16*>k,
                                <const bf16*>v, B, T, NH, NKV, hs)
    for i in range(<Py_ssize_t>B * NH * T):
        lse[i] = bf16_to_float(float_to_bf16(lse[i]))

FAULTS = ("gelu_forward", "layernorm_backward",      # found by tests/test_backend.py
          "classifier_backward",
          "flash_attention_backward")                # and tests/test_flash_attention.py
LLAMA_FAULTS = ("rope_backward",)                    # found by tests/test_llama_model.py
SUBTLE_FAULTS = ("matmul_forward",)                  # found at d12's widths by test_check_tolerance.py
BF16_FAULTS = ("bf16_gelu_forward",                  # found by tests/test_bf16.py (a bf16 table)
               "bf16_flash_attention_gqa_forward")   # and tests/test_flash_attention.py
FP16_FAULTS = ("fp16_gelu_forward",)                 # found by tests/test_fp16.py (an fp16 table)


def faulty_cpu(str fault):
    """The CPU backend with one entry (of FAULTS, LLAMA_FAULTS, SUBTLE_FAULTS, BF16_FAULTS or
    FP16_FAULTS, whose backends are the bf16 and fp16 ones) wrong."""
    cdef str precision = ("bf16" if fault in BF16_FAULTS else "fp16" if fault in FP16_FAULTS
                          else "fp32")
    cdef Backend good = cpu.create(precision=precision)
    cdef Backend backend = Backend(f"cpu-with-faulty-{fault}", True, good.groups, good, precision)
    backend.table = good.table
    cdef BackendTable* t = &backend.table
    if fault == "gelu_forward":
        t.gelu_forward = faulty_gelu_forward
    elif fault == "layernorm_backward":
        t.layernorm_backward = faulty_layernorm_backward
    elif fault == "rope_backward":
        t.rope_backward = faulty_rope_backward
    elif fault == "classifier_backward":
        t.classifier_backward = faulty_classifier_backward
    elif fault == "flash_attention_backward":
        t.flash_attention_backward = faulty_flash_attention_backward
    elif fault == "matmul_forward":
        t.matmul_forward = bf16_truncating_matmul_forward
    elif fault == "bf16_gelu_forward":
        t.gelu_forward = bf16_truncating_gelu_forward
    elif fault == "bf16_flash_attention_gqa_forward":
        t.flash_attention_gqa_forward = bf16_statistic_flash_attention_gqa_forward
    elif fault == "fp16_gelu_forward":
        t.gelu_forward = fp16_truncating_gelu_forward
    else:
        raise ValueError(f"no planted fault for {fault!r} (there are: "
                         f"{', '.join(FAULTS + LLAMA_FAULTS + SUBTLE_FAULTS + BF16_FAULTS + FP16_FAULTS)})")
    return backend


# ----------------------------------------------------------------------------
# a family that forgot one of its parts (llmc/model.pyx refuses it)

cdef class FamilyWithoutLayerBackward(Model):
    """Every part a family fills in, each doing nothing, but layer_backward, left out."""
    FAMILY = "gpt2"
    ENTRY_GROUPS = ("core", "linear", "gpt2")

    cdef void point_parameters(self, float* params, float* grads) noexcept:
        pass

    cdef void embedding_forward(self, float* out, const int* inputs, int B, int T) noexcept nogil:
        pass

    cdef void layer_forward(self, int l, float** acts, const float* inp, int B, int T) noexcept nogil:
        pass

    cdef void head_forward(self, float** acts, const float* inp, const int* targets,
                           int B, int T) noexcept nogil:
        pass

    cdef void head_backward(self, float* dinp, float** grads_acts, float** acts, const float* inp,
                            const int* targets, int B, int T) noexcept nogil:
        pass

    cdef void embedding_backward(self, const float* dout, const int* inputs, int B, int T) noexcept nogil:
        pass

    @classmethod
    def activation_shapes(cls, config, int B, int T):
        return ("x", (B, T)), [("y", (B, T))], [("losses", (B, T))]

    @classmethod
    def num_layers_of(cls, config):
        return 1

    @classmethod
    def flops_per_token(cls, config, int T):
        return {}

    @classmethod
    def kv_shape(cls, config):
        return 1, 1
