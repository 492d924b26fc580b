// accel/emu/emu_core.h — the language-neutral core of the CPU emulator of GPU kernels.
//
// A grid launch runs its blocks one after another on the calling OS thread; the threads of a
// block run as cooperative fibers that switch only at barriers, warp collectives and exit.
// Which fiber runs next at each of those points is the schedule (see Schedule), so a kernel
// whose result depends on the order of its threads between barriers gives different results
// under different schedules. Faults a GPU punishes silently (a thread leaving while others
// wait at a barrier, barriers at different source lines, collectives with lanes missing) stop
// the launch with a report naming kernel, block, thread and source line.
//
// Front-ends (hip_emu.h, msl_emu.h) map a kernel language's names onto this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

namespace emu {

struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
};

struct SourceLocation {
    const char* file;
    int line;
};

// Order in which runnable threads of a block resume at a scheduling point.
enum class Schedule {
    lockstep,    // round-robin: every thread runs to its next scheduling point in turn
    warp_ahead,  // the first runnable warp keeps running until it waits at a barrier
    shuffled,    // a seeded random runnable thread each time; blocks in random order too
};

struct Config {
    Schedule schedule = Schedule::lockstep;
    bool reverse = false;   // highest thread (and block) index first: the lane-order variation
    uint64_t seed = 1;      // for Schedule::shuffled
    int warp_size = 32;     // any power of two up to 64; the same build runs 32 and 64
    size_t stack_bytes = 64 * 1024;  // per GPU thread
    // What the front-ends report as the device's multiprocessors (compute units): kernels that
    // size their grids by it get fewer blocks on a smaller device, so that a test can make
    // grid-stride loops wrap at small shapes. Launches do not depend on it.
    int compute_units = 64;
};

// The process-wide configuration, read at first use from the environment:
//   EMU_SCHEDULE  lockstep | lockstep-reverse | warp-ahead | warp-ahead-reverse | shuffled
//   EMU_SEED      seed of the shuffled schedule (default 1)
//   EMU_WARP_SIZE 32 or 64 (default 32)
//   EMU_STACK_KB  fiber stack size (default 64)
//   EMU_COMPUTE_UNITS  the device's reported multiprocessors (default 64)
// Change it through this reference between launches.
Config& config();

// Parses a name of EMU_SCHEDULE into `out`; false if the name is unknown.
bool parse_schedule(const std::string& name, Config& out);

// Everything a running GPU thread can ask about itself.
struct ThreadContext {
    Dim3 thread_index, block_index, block_dim, grid_dim;
    int linear_index;  // x + y*bx + z*bx*by within the block
    int lane, warp;
};

// The GPU thread now running (valid only inside a kernel).
extern const ThreadContext* current_thread;

// Runs `thread_body` once per GPU thread of the grid. `shared_anchor` is the address of any
// thread_local variable of the module that declares the kernel's shared variables: the
// front-ends make shared variables thread_local, and the module's whole thread-local block is
// poisoned with 0xFF bytes (a NaN in every float type, -1 in every integer) at each block start,
// like the dynamic shared memory. Returns false, with the report in last_error(), on a fault.
bool launch(const char* kernel_name, Dim3 grid, Dim3 block, size_t dynamic_shared_bytes,
            const void* shared_anchor, const std::function<void()>& thread_body);

// The report of the last failed launch ("" if none), and clearing it.
const std::string& last_error();
void clear_error();

// Dynamic shared memory of the running block: dynamic_shared_bytes, 16-byte aligned.
void* dynamic_shared_memory();

// Block-wide barrier. Every thread still running must reach the same one (same source line).
// `name` (the language's spelling, e.g. "__syncthreads()") appears in reports.
void barrier(const char* name, SourceLocation where);

// Warp collectives: every lane of the warp that exists (the block's last warp may be partial)
// must reach one at the same source line, none may have exited. `name` appears in reports.
// shuffle: returns the `value` that lane `source_lane` passed.
uint64_t warp_shuffle(uint64_t value, int source_lane, const char* name, SourceLocation where);
// ballot: bit i set when lane i passed true.
uint64_t warp_ballot(bool predicate, const char* name, SourceLocation where);

// Bit i set for each lane i that exists in the running thread's warp.
uint64_t warp_lanes_mask();

// Reports a misuse detected by a front-end (a bad mask, a lane out of range) and ends the
// launch as a fault does.
[[noreturn]] void fail(const std::string& what, SourceLocation where);

// A value of up to 8 bytes as the 64 bits a warp collective moves, and back.
template <class T>
uint64_t to_bits(T value) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp collectives move up to 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof value);
    return bits;
}

template <class T>
T from_bits(uint64_t bits) {
    T value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

}  // namespace emu
