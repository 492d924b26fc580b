// accel/metal/metal_runtime.m — accel/metal/metal_runtime.h on Metal (macOS): the runtime the
// `metal` backend loads (libmetal_runtime.dylib, built with host.c by `make metal`).
//
// NOT YET RUN ON APPLE HARDWARE: written against Apple's documentation (accel/metal/README.md
// lists each API called and what was checked), never compiled by Apple's clang. On Linux CI
// checks it with clang -fsyntax-only against stub declarations of the Foundation and Metal APIs
// it uses (accel/metal/stubs, `make metal-syntax`). The emulator (accel/emu) implements the
// same ABI and is what CI runs.
//
// One device, one queue. Dispatches are encoded into one compute encoder of one command buffer
// until metal_synchronize ends it, commits it and waits; buffers use shared storage, so the
// pointers metal_alloc returns are the CPU's view of the same memory the kernels use. Buffers
// keep Metal's default hazard tracking, and the encoder is the default (serial) kind, so each
// dispatch sees what the ones before it wrote.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metal_runtime.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct {
    char* base;
    size_t nbytes;
    void* buffer;  // id<MTLBuffer>, retained
} Allocation;

struct MetalKernel {
    char name[128];
    void* pipeline;  // id<MTLComputePipelineState>, retained
    NSUInteger max_threads;
};

struct MetalRuntime {
    void* device;          // id<MTLDevice>
    void* queue;           // id<MTLCommandQueue>
    void* library;         // id<MTLLibrary>
    void* command_buffer;  // id<MTLCommandBuffer> being encoded, or NULL
    void* encoder;         // id<MTLComputeCommandEncoder> of it
    Allocation* allocations;  // sorted by base
    size_t num_allocations, capacity;
    MetalKernel** kernels;    // the pipeline cache
    size_t num_kernels;
    char name[256];
    char error[1024];      // "" until the first failure
};

static void set_error(MetalRuntime* rt, const char* what, NSError* error) {
    if (rt->error[0]) return;
    snprintf(rt->error, sizeof rt->error, "metal: %s%s%s", what, error ? ": " : "",
             error ? [[error localizedDescription] UTF8String] : "");
    // one line: the compiler's messages span several
    for (char* c = rt->error; *c; ++c)
        if (*c == '\n') *c = ' ';
}

// The options gpt2.metal is compiled with at a precision: floatX by its macro (host.c's and the
// Makefile's), and for bf16's bfloat MSL 3.1 (macOS 14); default options otherwise: fast math, as
// `xcrun metal` compiles, gpt2.metal asking for precise math where it needs it. nil, with the
// reason in `error`, where this macOS cannot compile that precision.
static MTLCompileOptions* compile_options(const char* precision, char* error, size_t error_size) {
    MTLCompileOptions* options = [MTLCompileOptions new];
    if (strcmp(precision, "fp16") == 0) {
        options.preprocessorMacros = [NSDictionary dictionaryWithObject:@"1" forKey:@"ACCEL_METAL_FP16"];
    } else if (strcmp(precision, "bf16") == 0) {
        if (@available(macOS 14.0, *)) {
            options.languageVersion = MTLLanguageVersion3_1;
        } else {
            snprintf(error, error_size, "metal: bf16 needs MSL 3.1 (its bfloat type): macOS 14 or later");
            return nil;
        }
        options.preprocessorMacros = [NSDictionary dictionaryWithObject:@"1" forKey:@"ACCEL_METAL_BF16"];
    }
    return options;
}

EXPORT MetalRuntime* metal_open(const char* library, const char* source, const char* precision, char* error,
                                size_t error_size) {
    @autoreleasepool {
        id<MTLDevice> device = MTLCreateSystemDefaultDevice();
        if (!device) {
            snprintf(error, error_size, "metal: no Metal device on this Mac");
            return NULL;
        }
        // gpt2.metal's matmul runs on simdgroup matrices (Apple7: every Apple-silicon Mac; Mac2
        // as read in Apple's feature tables, to be confirmed on such a Mac), and dispatchThreads'
        // non-uniform threadgroups need Apple4 or Mac2: Apple7 or Mac2 covers both
        if (![device supportsFamily:MTLGPUFamilyApple7] && ![device supportsFamily:MTLGPUFamilyMac2]) {
            snprintf(error, error_size,
                     "metal: %s has no simdgroup matrices (an Apple7 or Mac2 family GPU is needed)",
                     [[device name] UTF8String]);
            return NULL;
        }
        NSError* err = nil;
        id<MTLLibrary> lib = nil;
        if (source) {
            // the compiler's messages name each line's own file: the text's #line directives
            MTLCompileOptions* options = compile_options(precision, error, error_size);
            if (!options) return NULL;
            lib = [device newLibraryWithSource:[NSString stringWithUTF8String:source] options:options error:&err];
        } else {
            lib = [device newLibraryWithURL:[NSURL fileURLWithPath:[NSString stringWithUTF8String:library]]
                                      error:&err];
        }
        if (!lib) {
            // (at bf16 the likely reason is a GPU or macOS without MSL 3.1's bfloat)
            snprintf(error, error_size, "metal: cannot load the %s kernels of %s%s: %s", precision, library,
                     strcmp(precision, "bf16") == 0 ? " (bf16 needs MSL 3.1's bfloat: macOS 14 and a GPU that has it)" : "",
                     err ? [[err localizedDescription] UTF8String] : "unknown error");
            for (char* c = error; *c; ++c)
                if (*c == '\n') *c = ' ';
            return NULL;
        }
        MetalRuntime* rt = calloc(1, sizeof *rt);
        rt->device = (void*)CFBridgingRetain(device);
        rt->queue = (void*)CFBridgingRetain([device newCommandQueue]);
        rt->library = (void*)CFBridgingRetain(lib);
        snprintf(rt->name, sizeof rt->name, "%s", [[device name] UTF8String]);
        return rt;
    }
}

EXPORT void metal_synchronize(MetalRuntime* rt) {
    if (!rt->command_buffer) return;
    @autoreleasepool {
        id<MTLComputeCommandEncoder> encoder = CFBridgingRelease(rt->encoder);
        id<MTLCommandBuffer> command_buffer = CFBridgingRelease(rt->command_buffer);
        rt->encoder = rt->command_buffer = NULL;
        [encoder endEncoding];
        [command_buffer commit];
        [command_buffer waitUntilCompleted];
        if ([command_buffer status] == MTLCommandBufferStatusError)
            set_error(rt, "a command buffer failed", [command_buffer error]);
    }
}

EXPORT void metal_close(MetalRuntime* rt) {
    metal_synchronize(rt);
    for (size_t i = 0; i < rt->num_allocations; ++i) CFBridgingRelease(rt->allocations[i].buffer);
    for (size_t i = 0; i < rt->num_kernels; ++i) {
        CFBridgingRelease(rt->kernels[i]->pipeline);
        free(rt->kernels[i]);
    }
    free(rt->allocations);
    free(rt->kernels);
    CFBridgingRelease(rt->library);
    CFBridgingRelease(rt->queue);
    CFBridgingRelease(rt->device);
    free(rt);
}

EXPORT const char* metal_device_name(MetalRuntime* rt) { return rt->name; }

// Index of the first allocation whose base is above p.
static size_t upper_bound(const MetalRuntime* rt, const char* p) {
    size_t lo = 0, hi = rt->num_allocations;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (rt->allocations[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static const Allocation* find(const MetalRuntime* rt, const void* ptr) {
    const char* p = ptr;
    size_t i = upper_bound(rt, p);
    if (i == 0) return NULL;
    const Allocation* a = &rt->allocations[i - 1];
    return p < a->base + a->nbytes ? a : NULL;
}

EXPORT void* metal_alloc(MetalRuntime* rt, size_t nbytes) {
    @autoreleasepool {
        id<MTLDevice> device = (__bridge id<MTLDevice>)rt->device;
        // zero-filled, as the documentation of newBufferWithLength:options: says
        id<MTLBuffer> buffer = [device newBufferWithLength:(nbytes ? nbytes : 1) options:MTLResourceStorageModeShared];
        if (!buffer) return NULL;
        if (rt->num_allocations == rt->capacity) {
            size_t capacity = rt->capacity ? 2 * rt->capacity : 64;
            Allocation* grown = realloc(rt->allocations, capacity * sizeof *grown);
            if (!grown) return NULL;
            rt->allocations = grown;
            rt->capacity = capacity;
        }
        char* base = [buffer contents];
        size_t i = upper_bound(rt, base);
        memmove(&rt->allocations[i + 1], &rt->allocations[i], (rt->num_allocations - i) * sizeof(Allocation));
        rt->allocations[i] = (Allocation){base, nbytes ? nbytes : 1, (void*)CFBridgingRetain(buffer)};
        rt->num_allocations++;
        return base;
    }
}

EXPORT void metal_free(MetalRuntime* rt, void* ptr) {
    size_t i = upper_bound(rt, ptr);
    if (i == 0 || rt->allocations[i - 1].base != ptr) return;
    // a command buffer retains the buffers it uses, so releasing ours is safe even mid-flight
    CFBridgingRelease(rt->allocations[i - 1].buffer);
    memmove(&rt->allocations[i - 1], &rt->allocations[i], (rt->num_allocations - i) * sizeof(Allocation));
    rt->num_allocations--;
}

EXPORT const MetalKernel* metal_kernel(MetalRuntime* rt, const char* name) {
    for (size_t i = 0; i < rt->num_kernels; ++i)
        if (strcmp(rt->kernels[i]->name, name) == 0) return rt->kernels[i];
    @autoreleasepool {
        id<MTLLibrary> library = (__bridge id<MTLLibrary>)rt->library;
        id<MTLFunction> function = [library newFunctionWithName:[NSString stringWithUTF8String:name]];
        if (!function) {
            char what[192];
            snprintf(what, sizeof what, "no kernel '%s' in the library", name);
            set_error(rt, what, nil);
            return NULL;
        }
        NSError* err = nil;
        id<MTLComputePipelineState> pipeline =
            [(__bridge id<MTLDevice>)rt->device newComputePipelineStateWithFunction:function error:&err];
        if (!pipeline) {
            set_error(rt, "cannot make a compute pipeline", err);
            return NULL;
        }
        MetalKernel** grown = realloc(rt->kernels, (rt->num_kernels + 1) * sizeof *grown);
        MetalKernel* kernel = calloc(1, sizeof *kernel);
        if (!grown || !kernel) {
            free(kernel);
            return NULL;
        }
        rt->kernels = grown;
        snprintf(kernel->name, sizeof kernel->name, "%s", name);
        kernel->max_threads = [pipeline maxTotalThreadsPerThreadgroup];
        kernel->pipeline = (void*)CFBridgingRetain(pipeline);
        rt->kernels[rt->num_kernels++] = kernel;
        return kernel;
    }
}

// The encoder of the command buffer being filled; NULL on a failure (already reported).
static id<MTLComputeCommandEncoder> bind(MetalRuntime* rt, const MetalKernel* kernel, const MetalArg* args,
                                         int num_args, const uint32_t group[3],
                                         const uint32_t* threadgroup_bytes, int num_threadgroup_args) {
    if (rt->error[0] || !kernel) return nil;
    if ((NSUInteger)group[0] * group[1] * group[2] > kernel->max_threads) {
        char what[192];
        snprintf(what, sizeof what, "kernel '%s': a threadgroup of %u threads (its pipeline takes at most %lu)",
                 kernel->name, group[0] * group[1] * group[2], (unsigned long)kernel->max_threads);
        set_error(rt, what, nil);
        return nil;
    }
    if (!rt->command_buffer) {
        id<MTLCommandBuffer> command_buffer = [(__bridge id<MTLCommandQueue>)rt->queue commandBuffer];
        rt->command_buffer = (void*)CFBridgingRetain(command_buffer);
        rt->encoder = (void*)CFBridgingRetain([command_buffer computeCommandEncoder]);
    }
    id<MTLComputeCommandEncoder> encoder = (__bridge id<MTLComputeCommandEncoder>)rt->encoder;
    [encoder setComputePipelineState:(__bridge id<MTLComputePipelineState>)kernel->pipeline];
    for (int i = 0; i < num_args; ++i) {
        if (args[i].nbytes) {
            [encoder setBytes:args[i].data length:args[i].nbytes atIndex:i];  // under 4 KB
            continue;
        }
        const Allocation* a = find(rt, args[i].data);
        if (!a) {
            char what[192];
            snprintf(what, sizeof what, "kernel '%s': [[buffer(%d)]] is not a pointer into memory from metal_alloc",
                     kernel->name, i);
            set_error(rt, what, nil);
            return nil;
        }
        [encoder setBuffer:(__bridge id<MTLBuffer>)a->buffer offset:(const char*)args[i].data - a->base atIndex:i];
    }
    for (int i = 0; i < num_threadgroup_args; ++i)  // lengths are multiples of 16 bytes
        [encoder setThreadgroupMemoryLength:(threadgroup_bytes[i] + 15) / 16 * 16 atIndex:i];
    return encoder;
}

EXPORT void metal_dispatch_threads(MetalRuntime* rt, const MetalKernel* kernel, const MetalArg* args, int num_args,
                                   const uint32_t threads[3], const uint32_t group[3],
                                   const uint32_t* threadgroup_bytes, int num_threadgroup_args) {
    @autoreleasepool {
        id<MTLComputeCommandEncoder> encoder =
            bind(rt, kernel, args, num_args, group, threadgroup_bytes, num_threadgroup_args);
        if (encoder)
            [encoder dispatchThreads:MTLSizeMake(threads[0], threads[1], threads[2])
                threadsPerThreadgroup:MTLSizeMake(group[0], group[1], group[2])];
    }
}

EXPORT void metal_dispatch_threadgroups(MetalRuntime* rt, const MetalKernel* kernel, const MetalArg* args,
                                        int num_args, const uint32_t groups[3], const uint32_t group[3],
                                        const uint32_t* threadgroup_bytes, int num_threadgroup_args) {
    @autoreleasepool {
        id<MTLComputeCommandEncoder> encoder =
            bind(rt, kernel, args, num_args, group, threadgroup_bytes, num_threadgroup_args);
        if (encoder)
            [encoder dispatchThreadgroups:MTLSizeMake(groups[0], groups[1], groups[2])
                    threadsPerThreadgroup:MTLSizeMake(group[0], group[1], group[2])];
    }
}

EXPORT const char* metal_error(MetalRuntime* rt) { return rt->error[0] ? rt->error : NULL; }
