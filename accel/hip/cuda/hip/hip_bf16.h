// accel/hip/cuda/hip/hip_bf16.h — for the nvcc build: HIP's bfloat16 names on CUDA's (cuda_bf16.h).
#pragma once
#include "../../hip_to_cuda.h"
