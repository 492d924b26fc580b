// accel/emu/include/hip/hip_runtime.h — `#include <hip/hip_runtime.h>` for the emulated build:
// with `-I accel/emu/include`, a .hip file compiled by g++ gets the CPU emulator's front-end.
#pragma once
#include "../../hip_emu.h"
