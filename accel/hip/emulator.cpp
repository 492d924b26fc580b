// accel/hip/emulator.cpp — linked into the emulated build of gpt2.hip only: lets Python
// (accel/hip/device.pyx, configure_emulator) choose the emulator's schedule, warp size and
// reported compute units between calls, so that one process runs the kernels under every
// schedule and both warp sizes, on a large or a small device.
#include <string>

#include "emu_core.h"

// Returns NULL, or why the settings were refused (they are then left as they were).
extern "C" __attribute__((visibility("default"))) const char* accel_hip_emu_configure(const char* schedule,
                                                                                      unsigned long long seed,
                                                                                      int warp_size,
                                                                                      int compute_units) {
    emu::Config settings = emu::config();
    if (!emu::parse_schedule(schedule, settings))
        return "unknown schedule (lockstep, lockstep-reverse, warp-ahead, warp-ahead-reverse, shuffled)";
    if (warp_size != 32 && warp_size != 64) return "warp size must be 32 or 64";
    if (compute_units < 1) return "compute units must be at least 1";
    settings.seed = seed;
    settings.warp_size = warp_size;
    settings.compute_units = compute_units;
    emu::config() = settings;
    return nullptr;
}
