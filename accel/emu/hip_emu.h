// accel/emu/hip_emu.h — HIP front-end of the CPU emulator: lets g++ compile HIP kernels and
// their host code, and runs the kernels on the emulator core (emu_core.h).
//
// A .hip file keeps `#include <hip/hip_runtime.h>`; building with `-I accel/emu/include`
// resolves that to this header. Kernels are launched with hipLaunchKernelGGL (never <<<>>>),
// and dynamic shared memory is declared with HIP_DYNAMIC_SHARED(type, name), HIP's own macro:
// `extern __shared__ T name[]` cannot be given a meaning by a macro for g++.
// "Device" memory is host memory; streams and async copies are synchronous.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sys/mman.h>
#include <tuple>
#include <type_traits>

#include "emu_core.h"

// ---- qualifiers ---------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// One instance per OS thread, and blocks run one at a time on it: exactly one instance per
// running block. Being thread-local puts every shared variable (of templates and inline
// functions too) in the module's thread-local block, which the core poisons at each block start.
#define __shared__ thread_local
#define HIP_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::emu::dynamic_shared_memory());
#define HIP_KERNEL_NAME(...) __VA_ARGS__

// ---- thread geometry ----------------------------------------------------------------------

struct dim3 : emu::Dim3 {
    constexpr dim3(unsigned x = 1, unsigned y = 1, unsigned z = 1) : emu::Dim3{x, y, z} {}
    constexpr dim3(const emu::Dim3& d) : emu::Dim3(d) {}
};

#define threadIdx (::emu::current_thread->thread_index)
#define blockIdx (::emu::current_thread->block_index)
#define blockDim (::emu::current_thread->block_dim)
#define gridDim (::emu::current_thread->grid_dim)
// A variable rather than a macro, so that hipDeviceProp_t can have a member of the same name;
// it follows emu::config().warp_size.
inline const int& warpSize = emu::config().warp_size;

inline unsigned __lane_id() { return unsigned(emu::current_thread->lane); }

#define EMU_HIP_HERE (::emu::SourceLocation{__FILE__, __LINE__})
#define __syncthreads() ::emu::barrier("__syncthreads()", EMU_HIP_HERE)
// Blocks run one after another, so memory written by one block is seen by the next.
inline void __threadfence() {}
inline void __threadfence_block() {}

// ---- warp collectives ---------------------------------------------------------------------
// Lane arithmetic follows HIP's amd_warp_functions.h; the core checks that every lane takes part.

namespace emu_hip {

inline int checked_width(int width, const char* name, emu::SourceLocation where) {
    if (width < 1 || width > warpSize || (width & (width - 1)))
        emu::fail(std::string(name) + " with width " + std::to_string(width) + " (a power of two up to warpSize " +
                      std::to_string(warpSize) + ")",
                  where);
    return width;
}

// The _sync forms: only full masks are emulated, and a 32-bit mask at warp size 64 is not one.
inline void check_full_mask(uint64_t mask, const char* name, emu::SourceLocation where) {
    const uint64_t lanes = emu::warp_lanes_mask();
    if ((mask & lanes) != lanes) {
        char text[160];
        std::snprintf(text, sizeof text, "%s with mask 0x%llx, which leaves out lanes of this warp (lanes 0x%llx)", name,
                      (unsigned long long)mask, (unsigned long long)lanes);
        emu::fail(text, where);
    }
}

template <class T>
T shuffle_from(T var, int source_lane, const char* name, emu::SourceLocation where) {
    return emu::from_bits<T>(emu::warp_shuffle(emu::to_bits(var), source_lane, name, where));
}

template <class T>
T shfl(emu::SourceLocation where, T var, int src_lane, int width = warpSize) {
    width = checked_width(width, "__shfl", where);
    const int self = int(__lane_id());
    return shuffle_from(var, (src_lane & (width - 1)) + (self & ~(width - 1)), "__shfl", where);
}

template <class T>
T shfl_xor(emu::SourceLocation where, T var, int lane_mask, int width = warpSize) {
    width = checked_width(width, "__shfl_xor", where);
    const int self = int(__lane_id());
    int index = self ^ lane_mask;
    if (index >= ((self + width) & ~(width - 1))) index = self;
    return shuffle_from(var, index, "__shfl_xor", where);
}

template <class T>
T shfl_down(emu::SourceLocation where, T var, unsigned delta, int width = warpSize) {
    width = checked_width(width, "__shfl_down", where);
    const int self = int(__lane_id());
    const int index = (self & (width - 1)) + int(delta) >= width ? self : self + int(delta);
    return shuffle_from(var, index, "__shfl_down", where);
}

template <class T>
T shfl_up(emu::SourceLocation where, T var, unsigned delta, int width = warpSize) {
    width = checked_width(width, "__shfl_up", where);
    const int self = int(__lane_id());
    const int index = self - int(delta) < (self & ~(width - 1)) ? self : self - int(delta);
    return shuffle_from(var, index, "__shfl_up", where);
}

template <class T>
T shfl_sync(emu::SourceLocation where, uint64_t mask, T var, int src_lane, int width = warpSize) {
    check_full_mask(mask, "__shfl_sync", where);
    return shfl(where, var, src_lane, width);
}

template <class T>
T shfl_xor_sync(emu::SourceLocation where, uint64_t mask, T var, int lane_mask, int width = warpSize) {
    check_full_mask(mask, "__shfl_xor_sync", where);
    return shfl_xor(where, var, lane_mask, width);
}

template <class T>
T shfl_down_sync(emu::SourceLocation where, uint64_t mask, T var, unsigned delta, int width = warpSize) {
    check_full_mask(mask, "__shfl_down_sync", where);
    return shfl_down(where, var, delta, width);
}

template <class T>
T shfl_up_sync(emu::SourceLocation where, uint64_t mask, T var, unsigned delta, int width = warpSize) {
    check_full_mask(mask, "__shfl_up_sync", where);
    return shfl_up(where, var, delta, width);
}

}  // namespace emu_hip

#define __shfl(...) ::emu_hip::shfl(EMU_HIP_HERE, __VA_ARGS__)
#define __shfl_xor(...) ::emu_hip::shfl_xor(EMU_HIP_HERE, __VA_ARGS__)
#define __shfl_down(...) ::emu_hip::shfl_down(EMU_HIP_HERE, __VA_ARGS__)
#define __shfl_up(...) ::emu_hip::shfl_up(EMU_HIP_HERE, __VA_ARGS__)
#define __shfl_sync(...) ::emu_hip::shfl_sync(EMU_HIP_HERE, __VA_ARGS__)
#define __shfl_xor_sync(...) ::emu_hip::shfl_xor_sync(EMU_HIP_HERE, __VA_ARGS__)
#define __shfl_down_sync(...) ::emu_hip::shfl_down_sync(EMU_HIP_HERE, __VA_ARGS__)
#define __shfl_up_sync(...) ::emu_hip::shfl_up_sync(EMU_HIP_HERE, __VA_ARGS__)
#define __ballot(predicate) ((unsigned long long)::emu::warp_ballot((predicate) != 0, "__ballot", EMU_HIP_HERE))
#define __any(predicate) int(::emu::warp_ballot((predicate) != 0, "__any", EMU_HIP_HERE) != 0)
#define __all(predicate) \
    int(::emu::warp_ballot((predicate) != 0, "__all", EMU_HIP_HERE) == ::emu::warp_lanes_mask())

// ---- atomics ------------------------------------------------------------------------------
// Plain read-modify-writes: all GPU threads run on one OS thread and switch only at barriers
// and collectives, so nothing can come between the read and the write.

#define EMU_HIP_ATOMIC(name, T, update) \
    inline T name(T* address, T value) {   \
        const T old = *address;            \
        *address = (update);               \
        return old;                        \
    }
EMU_HIP_ATOMIC(atomicAdd, int, old + value)
EMU_HIP_ATOMIC(atomicAdd, unsigned, old + value)
EMU_HIP_ATOMIC(atomicAdd, unsigned long long, old + value)
EMU_HIP_ATOMIC(atomicAdd, float, old + value)
EMU_HIP_ATOMIC(atomicAdd, double, old + value)
EMU_HIP_ATOMIC(atomicSub, int, old - value)
EMU_HIP_ATOMIC(atomicSub, unsigned, old - value)
EMU_HIP_ATOMIC(atomicMax, int, old > value ? old : value)
EMU_HIP_ATOMIC(atomicMax, unsigned, old > value ? old : value)
EMU_HIP_ATOMIC(atomicMin, int, old < value ? old : value)
EMU_HIP_ATOMIC(atomicMin, unsigned, old < value ? old : value)
EMU_HIP_ATOMIC(atomicExch, int, value)
EMU_HIP_ATOMIC(atomicExch, unsigned, value)
EMU_HIP_ATOMIC(atomicExch, float, value)
#undef EMU_HIP_ATOMIC

inline int atomicCAS(int* address, int compare, int value) {
    const int old = *address;
    if (old == compare) *address = value;
    return old;
}

inline unsigned atomicCAS(unsigned* address, unsigned compare, unsigned value) {
    const unsigned old = *address;
    if (old == compare) *address = value;
    return old;
}

// ---- math ---------------------------------------------------------------------------------
// <cmath> gives expf, tanhf, fmaxf, ... The fast intrinsics are the accurate functions here:
// the emulator checks logic, not a GPU's rounding.

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanhf(float x) { return std::tanh(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
template <class T>
T __ldg(const T* address) {
    return *address;
}
// Device code's min and max take mixed argument types.
template <class A, class B>
constexpr std::common_type_t<A, B> min(A a, B b) {
    return b < a ? b : a;
}
template <class A, class B>
constexpr std::common_type_t<A, B> max(A a, B b) {
    return a < b ? b : a;
}

// ---- runtime API --------------------------------------------------------------------------

enum hipError_t {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorLaunchFailure = 719,
};

enum hipMemcpyKind {
    hipMemcpyHostToHost = 0,
    hipMemcpyHostToDevice = 1,
    hipMemcpyDeviceToHost = 2,
    hipMemcpyDeviceToDevice = 3,
    hipMemcpyDefault = 4,
};

typedef struct ihipStream_t* hipStream_t;

struct hipDeviceProp_t {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int multiProcessorCount;
};

namespace emu_hip {
// Like a GPU's, a failed launch's error stays until hipGetLastError takes it.
inline hipError_t pending_error = hipSuccess;
// Any thread_local of this module lets the core find the module's shared variables.
[[maybe_unused]] static thread_local char shared_anchor;

template <class... Params, class... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                   hipStream_t, Args&&... args) {
    // Arguments are converted to the parameter types once, as a GPU launch copies them; each
    // thread then gets its own copy of those.
    const std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
    if (!emu::launch(name, grid, block, dynamic_shared_bytes, &shared_anchor, [&] { std::apply(kernel, params); }))
        pending_error = hipErrorLaunchFailure;
}
}  // namespace emu_hip

#define hipLaunchKernelGGL(kernel, ...) ::emu_hip::launch_kernel(#kernel, kernel, __VA_ARGS__)

inline hipError_t hipGetLastError() {
    const hipError_t e = emu_hip::pending_error;
    emu_hip::pending_error = hipSuccess;
    return e;
}
inline hipError_t hipPeekAtLastError() { return emu_hip::pending_error; }
inline hipError_t hipDeviceSynchronize() { return emu_hip::pending_error; }
inline hipError_t hipStreamSynchronize(hipStream_t) { return emu_hip::pending_error; }
inline hipError_t hipStreamCreate(hipStream_t* stream) {
    *stream = nullptr;
    return hipSuccess;
}
inline hipError_t hipStreamDestroy(hipStream_t) { return hipSuccess; }

// A failed launch's message is the emulator's report (also on stderr), valid until the next launch.
inline const char* hipGetErrorString(hipError_t e) {
    switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorLaunchFailure:
        return emu::last_error().empty() ? "hipErrorLaunchFailure" : emu::last_error().c_str();
    }
    return "unknown hipError_t";
}

// Large allocations are 2 MiB aligned and advised to transparent huge pages: a grid-stride loop
// emulated thread after thread jumps by gridDim.x * blockDim.x elements at every step, and on
// 4 KiB pages nearly every one of those accesses would miss the TLB.
inline hipError_t hipMalloc(void** pointer, size_t bytes) {
    constexpr size_t huge_page = size_t(2) << 20;
    if (bytes >= huge_page && posix_memalign(pointer, huge_page, bytes) == 0) {
        madvise(*pointer, bytes / huge_page * huge_page, MADV_HUGEPAGE);  // advice: ignored without THP
        return hipSuccess;
    }
    *pointer = std::malloc(bytes ? bytes : 1);
    return *pointer ? hipSuccess : hipErrorOutOfMemory;
}
template <class T>
hipError_t hipMalloc(T** pointer, size_t bytes) {
    return hipMalloc(reinterpret_cast<void**>(pointer), bytes);
}
inline hipError_t hipFree(void* pointer) {
    std::free(pointer);
    return hipSuccess;
}
inline hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, hipMemcpyKind) {
    std::memmove(dst, src, bytes);
    return hipSuccess;
}
inline hipError_t hipMemcpyAsync(void* dst, const void* src, size_t bytes, hipMemcpyKind kind, hipStream_t = nullptr) {
    return hipMemcpy(dst, src, bytes, kind);
}
inline hipError_t hipMemset(void* dst, int value, size_t bytes) {
    std::memset(dst, value, bytes);
    return hipSuccess;
}
inline hipError_t hipMemsetAsync(void* dst, int value, size_t bytes, hipStream_t = nullptr) {
    return hipMemset(dst, value, bytes);
}

// One emulated device.
inline hipError_t hipGetDeviceCount(int* count) {
    *count = 1;
    return hipSuccess;
}

inline hipError_t hipSetDevice(int device) { return device == 0 ? hipSuccess : hipErrorInvalidValue; }

inline hipError_t hipGetDeviceProperties(hipDeviceProp_t* prop, int) {
    *prop = {};
    std::snprintf(prop->name, sizeof prop->name, "emu (CPU emulator, warp size %d)", warpSize);
    prop->totalGlobalMem = size_t(1) << 34;
    prop->sharedMemPerBlock = 64 * 1024;
    prop->warpSize = warpSize;
    prop->maxThreadsPerBlock = 1024;
    prop->multiProcessorCount = emu::config().compute_units;
    return hipSuccess;
}
