# llm.pyx — build, test and benchmark.
#   make train_gpt2      install what requirements.txt lists if anything is missing, then build
#                        the product: every .pyx outside dev/ (NO_OMP=1, DEBUG=1, NO_NATIVE=1 switch)
#   make dev             the kernel lab too: the variants in dev/cpu (dev/ab.py, dev/README.md)
#   make test            unit tests (pytest) and the PyTorch parity checks (test_gpt2.py,
#                        test_llama2.py, each in fp32 and in bf16); the variants' tests need
#                        `make dev` first, and are skipped without it
#   make bench           time a training step against PyTorch eager (dev/bench_step.py)
#   make hip             the HIP backend for this machine's GPU: nvcc (NVIDIA) where found, else
#                        hipcc (AMD); HIP_PLATFORM=amd|nvidia chooses (accel/hip/README.md)
#   make hip-emu         the HIP backend on the CPU emulator, fp32 and bf16 (g++ only; what CI tests)
#   make hip-check-nvcc  compile-check accel/hip for NVIDIA, both precisions (nvcc, cuBLAS headers)
#   make hip-check-amd   compile-check accel/hip for AMD (hipcc)
#   make ane-private     the private ANE runtime (accel/ane/ane_private.m; needs macOS)
#   make clean
PYTHON ?= python3

.PHONY: train_gpt2 dev test bench hip hip-emu hip-check-nvcc hip-check-amd ane-private clean

train_gpt2:
	$(PYTHON) dev/ensure_requirements.py requirements.txt
	$(PYTHON) setup.py -q build_ext --inplace

dev: train_gpt2
	LLMPYX_LAB=1 $(PYTHON) setup.py -q build_ext --inplace

test: train_gpt2
	$(PYTHON) -m pytest -q tests
	$(PYTHON) test_gpt2.py
	$(PYTHON) test_llama2.py
	$(PYTHON) test_gpt2.py --precision bf16
	$(PYTHON) test_llama2.py --precision bf16

bench: train_gpt2
	$(PYTHON) dev/bench_step.py

hip: train_gpt2
	$(MAKE) -C accel/hip gpu
hip-emu: train_gpt2
	$(MAKE) -C accel/hip emu
hip-check-nvcc hip-check-amd:
	$(MAKE) -C accel/hip $(@:hip-%=%)

# the private ANE API's runtime (accel/ane/README.md): macOS only, opt-in, unrun here
ane-private:
ifeq ($(shell uname -s),Darwin)
	mkdir -p accel/ane/build
	xcrun clang -fobjc-arc -O2 -Wall -dynamiclib -framework Foundation -framework IOSurface \
	    accel/ane/ane_private.m -o accel/ane/build/libane_private.dylib
else
	@echo "make ane-private: needs macOS (the private ANE API is Apple's); on Linux: python train.py --backend ane --dry-run" >&2; exit 1
endif

# every .pyx's generated C, and the extension modules beside it (hidden folders and virtual
# environments kept in the tree are left alone, as setup.py leaves them)
clean:
	rm -rf build accel/metal/build accel/hip/build accel/ane/build accel/_*.pxi
	find . \( -name '.?*' -o -exec test -e '{}/pyvenv.cfg' \; \) -prune -o -name '*.pyx' -print | \
	    while read -r f; do rm -f "$${f%.pyx}.c" "$$(dirname "$$f")"/*.so "$$(dirname "$$f")"/*.pyd; done

# Metal on Linux: accel/metal/gpt2.metal rewritten for the CPU emulator of MSL (accel/emu) and
# built with the emulator and the host side (accel/metal/host.c) into the library that backend
# metal-emu loads. The tests build other variants (planted faults) with METAL_SOURCE and
# METAL_EMU_LIB, and with ASAN=1 under AddressSanitizer; the emulator's and the host side's
# objects are shared (accel/metal/build/*.o).
#   make metal-emu
# On macOS: the Metal runtime with the same host side, and the compiled kernel library (needs
# Xcode's command-line tools).
#   make metal
# On Linux, metal_runtime.m is checked by clang against stubs: make metal-syntax (below).
METAL_SOURCE ?= accel/metal/gpt2.metal
METAL_EMU_LIB ?= accel/metal/build/libmetal_emu.so
METAL_EMU_FLAGS = -std=c++17 -O2 -g -Wall -fPIC -fvisibility=hidden -I accel/emu/include
METAL_HOST_FLAGS = -std=c11 -O2 -g -Wall -fPIC -fvisibility=hidden
ifeq ($(ASAN),1)
METAL_EMU_FLAGS += -fsanitize=address -fno-omit-frame-pointer
METAL_HOST_FLAGS += -fsanitize=address -fno-omit-frame-pointer
METAL_EMU_FLAVOR = .asan
endif
METAL_EMU_OBJECTS := accel/metal/build/emu_core$(METAL_EMU_FLAVOR).o accel/metal/build/msl_runtime$(METAL_EMU_FLAVOR).o \
    accel/metal/build/host$(METAL_EMU_FLAVOR).o

.PHONY: metal-emu metal
metal-emu: $(METAL_EMU_LIB)

accel/metal/build/emu_core$(METAL_EMU_FLAVOR).o: accel/emu/emu_core.cpp accel/emu/emu_core.h
	mkdir -p $(dir $@)
	$(CXX) $(METAL_EMU_FLAGS) -c $< -o $@
accel/metal/build/msl_runtime$(METAL_EMU_FLAVOR).o: accel/emu/msl_runtime.cpp accel/emu/msl_emu.h \
        accel/emu/emu_core.h accel/metal/metal_runtime.h
	mkdir -p $(dir $@)
	$(CXX) $(METAL_EMU_FLAGS) -c $< -o $@
accel/metal/build/host$(METAL_EMU_FLAVOR).o: accel/metal/host.c accel/metal/metal_runtime.h
	mkdir -p $(dir $@)
	$(CC) $(METAL_HOST_FLAGS) -c $< -o $@
$(METAL_EMU_LIB): $(METAL_SOURCE) $(METAL_EMU_OBJECTS) accel/emu/msl_rewrite.py accel/emu/msl_emu.h
	mkdir -p $(dir $@)
	$(PYTHON) accel/emu/msl_rewrite.py $(METAL_SOURCE) -o $@.cpp
	$(CXX) $(METAL_EMU_FLAGS) -shared $@.cpp $(METAL_EMU_OBJECTS) -o $@

metal: accel/metal/build/libmetal_runtime.dylib accel/metal/build/gpt2.metallib

# On Linux: metal_runtime.m checked by clang (Objective-C, ARC, every warning an error) against
# stub declarations of the Foundation and Metal APIs it uses (accel/metal/stubs): its syntax,
# types, selectors and ARC's bridging casts; not Apple's headers, so not a Mac build.
#   make metal-syntax        (needs clang: apt-get install clang)
METAL_CLANG ?= $(firstword $(shell for c in clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do command -v $$c; done))
.PHONY: metal-syntax
metal-syntax:
	@test -n "$(METAL_CLANG)" || { echo "make metal-syntax: needs clang (apt-get install clang)" >&2; exit 1; }
	$(METAL_CLANG) -fsyntax-only -x objective-c -fobjc-arc -fobjc-runtime=gnustep-2.0 -Wall -Wextra -Werror \
	    -I accel/metal/stubs $(METAL_RUNTIME_SOURCE)
	@echo "metal_runtime.m: clean under $(METAL_CLANG) against accel/metal/stubs"
METAL_RUNTIME_SOURCE ?= accel/metal/metal_runtime.m

accel/metal/build/libmetal_runtime.dylib: accel/metal/metal_runtime.m accel/metal/host.c accel/metal/metal_runtime.h
	mkdir -p $(dir $@)
	xcrun clang -fobjc-arc -O2 -Wall -dynamiclib -framework Metal -framework Foundation \
	    accel/metal/metal_runtime.m accel/metal/host.c -o $@

accel/metal/build/gpt2.metallib: accel/metal/gpt2.metal
	mkdir -p $(dir $@)
	xcrun -sdk macosx metal -c $< -o accel/metal/build/gpt2.air
	xcrun -sdk macosx metallib accel/metal/build/gpt2.air -o $@
