// accel/hip/cuda/hipblas/hipblas.h — for the nvcc build: the HIP names gpt2.hip uses, on CUDA.
#pragma once
#include "../../hip_to_cuda.h"
