# Inverted dropout (PEFT's nn.Dropout on the input of a LoRA update): each element kept with
# probability 1 - p and scaled by 1 / (1 - p), else zero.  Its mask is a hash of the element's
# index and (seed, stream), never stored: backward, and a forward recomputed under an activation
# checkpoint policy, draw the same mask again.  float32 or bf16 (kernels/bf16.pxd's floatX).
from libc.stdint cimport uint32_t, uint64_t

from kernels.bf16 cimport floatX


cdef inline uint32_t mix32(uint32_t h) noexcept nogil:
    # murmur3's finaliser: a bijection of 32 bits whose every output bit depends on every input bit
    h ^= h >> 16
    h *= <uint32_t>0x85EBCA6B
    h ^= h >> 13
    h *= <uint32_t>0xC2B2AE35
    h ^= h >> 16
    return h


cdef inline uint32_t mask_key(uint32_t seed, uint32_t stream) noexcept nogil:
    # one mask's key: distinct streams of a seed are distinct keys (mix32 is a bijection)
    return mix32(mix32(seed * <uint32_t>0x9E3779B1 + <uint32_t>0x7F4A7C15) ^ stream)


cdef inline uint32_t element_bits(uint64_t index, uint32_t key) noexcept nogil:
    # 24 uniform bits of element index under key: for each key a bijection of the index's low
    # 32 bits (an odd multiply, then mix32), 32-bit arithmetic so that the loop vectorises
    return mix32((<uint32_t>index) * <uint32_t>0x9E3779B1 +
                 (<uint32_t>(index >> 32)) * <uint32_t>0x85EBCA77 + key) >> 8


cdef void dropout_forward(floatX* out, const floatX* inp, float p, int seed, int stream,
                          Py_ssize_t N) noexcept nogil
# out (N,) = inp * keep / (1 - p), keep = element_bits(i, mask_key(seed, stream)) >= p * 2^24
cdef void dropout_backward(floatX* dinp, const floatX* dout, float p, int seed, int stream,
                           Py_ssize_t N) noexcept nogil
# dinp (N,) += dout * keep / (1 - p), the forward's mask of (seed, stream)
