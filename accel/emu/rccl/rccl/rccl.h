// accel/emu/rccl/rccl/rccl.h — the part of RCCL's API (NCCL's names: RCCL keeps them) that
// accel/hip/collectives.hip uses, declared as ROCm's rccl/rccl.h declares it (names, enum
// values, signatures), for two builds:
//   - the emulated one (`make hip-emu`): rccl_emu.cpp implements these on the CPU, each rank a
//     process of its own and the ranks meeting in POSIX shared memory;
//   - the AMD compile check (`make hip-check-amd`) where no RCCL is installed: the calls are
//     checked against these declarations.
// Builds put accel/emu/rccl on the include path, so `#include <rccl/rccl.h>` lands here.
#pragma once

#include <cstddef>

typedef struct ihipStream_t* hipStream_t;  // as HIP's runtime declares it

#define NCCL_VERSION_CODE 21300  // the API declared here is NCCL 2.13's (ncclGetLastError)
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct ncclComm* ncclComm_t;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

// the reduction and the element type collectives.hip uses (the emulation has no others)
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef enum { ncclFloat32 = 7, ncclFloat = 7 } ncclDataType_t;

extern "C" {
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, hipStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, hipStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, hipStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, hipStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, hipStream_t stream);
}
