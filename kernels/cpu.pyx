# The CPU backend: this folder's Cython kernels, gathered into the Kernels table.
from kernels.backend cimport Kernels
from kernels.encoder cimport encoder_forward, encoder_backward
from kernels.layernorm cimport layernorm_forward, layernorm_backward
from kernels.matmul cimport matmul_forward, matmul_backward
from kernels.attention cimport attention_forward, attention_backward
from kernels.gelu cimport gelu_forward, gelu_backward
from kernels.residual cimport residual_forward, residual_backward
from kernels.crossentropy cimport softmax_forward, crossentropy_forward, crossentropy_softmax_backward
from kernels.adamw cimport adamw_update, global_norm_squared


cdef Kernels cpu_kernels() noexcept nogil:
    cdef Kernels k
    k.encoder_forward = encoder_forward
    k.encoder_backward = encoder_backward
    k.layernorm_forward = layernorm_forward
    k.layernorm_backward = layernorm_backward
    k.matmul_forward = matmul_forward
    k.matmul_backward = matmul_backward
    k.attention_forward = attention_forward
    k.attention_backward = attention_backward
    k.gelu_forward = gelu_forward
    k.gelu_backward = gelu_backward
    k.residual_forward = residual_forward
    k.residual_backward = residual_backward
    k.softmax_forward = softmax_forward
    k.crossentropy_forward = crossentropy_forward
    k.crossentropy_softmax_backward = crossentropy_softmax_backward
    k.adamw_update = adamw_update
    k.global_norm_squared = global_norm_squared
    return k
