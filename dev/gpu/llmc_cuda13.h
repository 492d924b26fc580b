// dev/gpu/llmc_cuda13.h: llm.c's trainers on CUDA 13, force-included by dev/gpu/llmc_peer.py's
// build (nvcc -include). CUDA 13 changed cudaMemAdvise's last parameter from a device number to a
// cudaMemLocation; llm.c (cuda_utils.cuh) still passes the number. This overload takes the number
// and says the same location in the new form (-1, cudaCpuDeviceId: the host). Nothing else of
// llm.c is changed; on CUDA 12 this header adds nothing.
#pragma once
#include <cuda_runtime.h>

#if defined(CUDART_VERSION) && CUDART_VERSION >= 13000
inline cudaError_t cudaMemAdvise(const void* ptr, size_t bytes, cudaMemoryAdvise advice, int device) {
    cudaMemLocation where;
    where.type = device == cudaCpuDeviceId ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    where.id = device == cudaCpuDeviceId ? 0 : device;
    return cudaMemAdvise(ptr, bytes, advice, where);
}
#endif
