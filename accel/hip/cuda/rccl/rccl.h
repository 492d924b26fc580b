// accel/hip/cuda/rccl/rccl.h — for the nvcc build: RCCL's API is NCCL's, names and all, so
// collectives.hip's `#include <rccl/rccl.h>` is NCCL's header (toolchain.sh nccl-include).
#pragma once
#include "../../hip_to_cuda.h"
#include <nccl.h>
