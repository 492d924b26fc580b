// accel/emu/msl_runtime.cpp — accel/metal/metal_runtime.h on the CPU emulator: the Linux side
// of the Metal backend. Linked into one shared object with the emulator core and the kernels
// of a rewritten .metal file (msl_rewrite.py), which register themselves by name.
//
// Memory is malloc'ed at its exact size (so an AddressSanitizer build sees a kernel's access
// past a buffer); dispatches run at once, one after another, on the calling thread. A
// dispatch of non-uniform threadgroups runs as up to eight launches of the core, one per
// region of equal threadgroup size (the interior, then the far edges in x, y, z).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../metal/metal_runtime.h"
#include "msl_emu.h"

#define EMU_MSL_EXPORT extern "C" __attribute__((visibility("default")))

namespace emu_msl {
const Dispatch* current_dispatch = nullptr;

std::map<std::string, Kernel>& registry() {
    static std::map<std::string, Kernel> kernels;
    return kernels;
}
}  // namespace emu_msl

namespace {
// Any thread-local variable of this module: the core poisons the module's whole thread-local
// block, where the rewrite puts the kernels' `threadgroup` variables, at each threadgroup start.
thread_local char shared_anchor;
}  // namespace

struct MetalRuntime {
    std::map<const char*, size_t> allocations;  // base -> bytes
    std::string error;
    std::string device_name;
};

struct MetalKernel {
    emu_msl::Kernel kernel;
};

namespace {

// The allocation holding p, or null.
bool inside_allocation(const MetalRuntime* rt, const void* p) {
    const char* c = static_cast<const char*>(p);
    auto it = rt->allocations.upper_bound(c);
    if (it == rt->allocations.begin()) return false;
    --it;
    return c < it->first + it->second || (it->second == 0 && c == it->first);
}

void dispatch(MetalRuntime* rt, const MetalKernel* kernel, const MetalArg* args, int num_args,
              const uint32_t threads[3], const uint32_t group[3], const uint32_t* threadgroup_bytes,
              int num_threadgroup_args) {
    if (!rt->error.empty()) return;
    const char* name = kernel->kernel.name;
    std::vector<void*> pointers(num_args);
    for (int i = 0; i < num_args; ++i) {
        if (args[i].nbytes == 0 && args[i].data && !inside_allocation(rt, args[i].data)) {
            rt->error = "metal-emu: kernel '" + std::string(name) + "': [[buffer(" + std::to_string(i) +
                        ")]] is not a pointer into memory from metal_alloc";
            return;
        }
        pointers[i] = const_cast<void*>(args[i].data);
    }
    // The [[threadgroup(n)]] slices, 16-byte aligned, one after another in the dynamic block.
    std::vector<size_t> offsets(num_threadgroup_args);
    size_t threadgroup_total = 0;
    for (int i = 0; i < num_threadgroup_args; ++i) {
        offsets[i] = threadgroup_total;
        threadgroup_total += (threadgroup_bytes[i] + 15) / 16 * 16;
    }
    emu_msl::Dispatch d;
    d.args = pointers.data();
    d.num_args = num_args;
    d.threads_per_grid = {threads[0], threads[1], threads[2]};
    d.threads_per_threadgroup = {group[0], group[1], group[2]};
    d.threadgroup_offsets = offsets.data();
    d.num_threadgroup_args = num_threadgroup_args;

    // Each dimension: the whole threadgroups, then the partial one at the far edge if any.
    struct Part {
        unsigned start, count, size;
    };
    std::vector<Part> parts[3];
    for (int k = 0; k < 3; ++k) {
        if (threads[k] == 0) return;  // an empty grid
        if (group[k] == 0) {
            rt->error = "metal-emu: kernel '" + std::string(name) + "': a threadgroup size of 0";
            return;
        }
        const unsigned whole = threads[k] / group[k], rest = threads[k] % group[k];
        if (whole) parts[k].push_back({0, whole, group[k]});
        if (rest) parts[k].push_back({whole, 1, rest});
    }
    emu_msl::current_dispatch = &d;
    const auto body = [&] { kernel->kernel.run(); };
    for (const Part& z : parts[2])
        for (const Part& y : parts[1])
            for (const Part& x : parts[0]) {
                d.group_offset = {x.start, y.start, z.start};
                if (!emu::launch(name, {x.count, y.count, z.count}, {x.size, y.size, z.size}, threadgroup_total,
                                 &shared_anchor, body)) {
                    rt->error = emu::last_error();
                    emu_msl::current_dispatch = nullptr;
                    return;
                }
            }
    emu_msl::current_dispatch = nullptr;
}

}  // namespace

EMU_MSL_EXPORT MetalRuntime* metal_open(const char*, const char*, const char*, char* error, size_t error_size) {
    auto* rt = new MetalRuntime;
    char name[96];
    std::snprintf(name, sizeof name, "metal-emu (CPU emulator of MSL, simdgroups of %d)", emu::config().warp_size);
    rt->device_name = name;
    if (emu_msl::registry().empty()) {
        std::snprintf(error, error_size, "metal-emu: no kernels were built into this library");
        delete rt;
        return nullptr;
    }
    return rt;
}

EMU_MSL_EXPORT void metal_close(MetalRuntime* rt) {
    for (auto& [base, bytes] : rt->allocations) std::free(const_cast<char*>(base));
    delete rt;
}

EMU_MSL_EXPORT const char* metal_device_name(MetalRuntime* rt) { return rt->device_name.c_str(); }

EMU_MSL_EXPORT void* metal_alloc(MetalRuntime* rt, size_t nbytes) {
    void* p = std::calloc(nbytes ? nbytes : 1, 1);
    if (p) rt->allocations[static_cast<const char*>(p)] = nbytes;
    return p;
}

EMU_MSL_EXPORT void metal_free(MetalRuntime* rt, void* ptr) {
    if (rt->allocations.erase(static_cast<const char*>(ptr))) std::free(ptr);
}

EMU_MSL_EXPORT const MetalKernel* metal_kernel(MetalRuntime* rt, const char* name) {
    auto& kernels = emu_msl::registry();
    auto it = kernels.find(name);
    if (it == kernels.end()) {
        if (rt->error.empty()) rt->error = "metal-emu: no kernel '" + std::string(name) + "' in the library";
        return nullptr;
    }
    // Kernel and MetalKernel have one layout: the registry's entry is the handle.
    static_assert(sizeof(MetalKernel) == sizeof(emu_msl::Kernel));
    return reinterpret_cast<const MetalKernel*>(&it->second);
}

EMU_MSL_EXPORT void metal_dispatch_threads(MetalRuntime* rt, const MetalKernel* kernel, const MetalArg* args,
                                           int num_args, const uint32_t threads[3], const uint32_t group[3],
                                           const uint32_t* threadgroup_bytes, int num_threadgroup_args) {
    dispatch(rt, kernel, args, num_args, threads, group, threadgroup_bytes, num_threadgroup_args);
}

EMU_MSL_EXPORT void metal_dispatch_threadgroups(MetalRuntime* rt, const MetalKernel* kernel, const MetalArg* args,
                                                int num_args, const uint32_t groups[3], const uint32_t group[3],
                                                const uint32_t* threadgroup_bytes, int num_threadgroup_args) {
    const uint32_t threads[3] = {groups[0] * group[0], groups[1] * group[1], groups[2] * group[2]};
    dispatch(rt, kernel, args, num_args, threads, group, threadgroup_bytes, num_threadgroup_args);
}

EMU_MSL_EXPORT void metal_synchronize(MetalRuntime*) {}

EMU_MSL_EXPORT const char* metal_error(MetalRuntime* rt) { return rt->error.empty() ? nullptr : rt->error.c_str(); }

// Emulator only (not in metal_runtime.h): the schedule ("lockstep", "shuffled", ... as
// EMU_SCHEDULE names them), its seed and the simdgroup size for the dispatches that follow.
// Returns 0, or -1 for an unknown schedule or a simdgroup size that is not a power of two up to 64.
EMU_MSL_EXPORT int metal_emu_configure(const char* schedule, uint64_t seed, int simdgroup_size) {
    emu::Config c = emu::config();
    if (!emu::parse_schedule(schedule, c) || simdgroup_size < 1 || simdgroup_size > 64 ||
        (simdgroup_size & (simdgroup_size - 1)))
        return -1;
    c.seed = seed;
    c.warp_size = simdgroup_size;
    emu::config() = c;
    return 0;
}
