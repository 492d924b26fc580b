/* accel/metal/metal_runtime.h — the C ABI between accel/metal's host side (host.c) and a Metal
 * runtime. Two implementations, each linked with host.c into one shared library:
 *   metal_runtime.m             macOS: Metal itself (Objective-C), libmetal_runtime.dylib
 *   accel/emu/msl_runtime.cpp   Linux: the CPU emulator of MSL, libmetal_emu.so
 * accel/loader.pyx dlopen()s one of them and fills the backend table from host.c's functions.
 *
 * Memory is shared: metal_alloc returns a pointer the CPU can read and write (Metal's shared
 * storage mode), which is also how kernels' buffers are named: an argument is any pointer
 * inside an allocation, bound as (buffer, offset). Dispatches are queued in order; each sees the
 * memory its predecessors wrote. The CPU may touch memory only after metal_synchronize.
 */
#ifndef LLMPYX_METAL_RUNTIME_H
#define LLMPYX_METAL_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct MetalRuntime MetalRuntime;
typedef struct MetalKernel MetalKernel; /* a compiled pipeline, owned by the runtime */

/* One kernel argument, bound at [[buffer(index in the array)]]: `nbytes` 0 binds the
 * allocation holding the pointer `data` (at its offset), otherwise the `nbytes` bytes at
 * `data` are copied into the command (setBytes: scalars, small structs up to 4 KiB). */
typedef struct {
    const void* data;
    uint32_t nbytes;
} MetalArg;

/* The runtime over a kernel library (macOS): `source`, MSL text, compiled where it is not NULL (a
 * .metal file's text with its quoted #includes spliced in: compiling source, Metal resolves no
 * include), else the .metallib file `library` loaded; `library` names the kernels' file in
 * messages either way. Both are ignored by the emulator, whose kernels are built into it.
 * precision ("fp32", "fp16", "bf16"): what `source` is compiled at (its floatX: float, half,
 * bfloat); a .metallib was built at one already. NULL with a one-line reason in `error` on
 * failure. */
MetalRuntime* metal_open(const char* library, const char* source, const char* precision, char* error,
                         size_t error_size);
void metal_close(MetalRuntime* rt);
/* The device's name, for messages. */
const char* metal_device_name(MetalRuntime* rt);

/* nbytes of zeroed shared memory; NULL when there is none. */
void* metal_alloc(MetalRuntime* rt, size_t nbytes);
void metal_free(MetalRuntime* rt, void* ptr);

/* The pipeline of kernel `name` (cached); NULL with metal_error set if the library lacks it. */
const MetalKernel* metal_kernel(MetalRuntime* rt, const char* name);

/* Queue a dispatch of `threads` threads in threadgroups of `group` threads; the threadgroups at
 * the grid's far edges are smaller where `threads` is not a multiple of `group` (non-uniform
 * threadgroups). `threadgroup_bytes[i]` is the length of [[threadgroup(i)]] memory. */
void metal_dispatch_threads(MetalRuntime* rt, const MetalKernel* kernel, const MetalArg* args, int num_args,
                            const uint32_t threads[3], const uint32_t group[3],
                            const uint32_t* threadgroup_bytes, int num_threadgroup_args);
/* The same with the grid counted in whole threadgroups (every threadgroup full size). */
void metal_dispatch_threadgroups(MetalRuntime* rt, const MetalKernel* kernel, const MetalArg* args, int num_args,
                                 const uint32_t groups[3], const uint32_t group[3],
                                 const uint32_t* threadgroup_bytes, int num_threadgroup_args);

/* Commit what is queued and wait until it has run. */
void metal_synchronize(MetalRuntime* rt);
/* The first failure since metal_open (a kernel fault, a command buffer error), or NULL. Once
 * set, later dispatches are skipped. */
const char* metal_error(MetalRuntime* rt);

#ifdef __cplusplus
}
#endif

#endif
