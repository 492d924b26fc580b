// accel/emu/include/hip/hip_bf16.h — `#include <hip/hip_bf16.h>` for the emulated build: the
// CPU emulator's bfloat16 (__hip_bfloat16, __hip_bfloat162 and their conversions).
#pragma once
#include "../../hip_bf16_emu.h"
