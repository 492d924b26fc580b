# llm.pyx — build, test and benchmark.
#   make train_gpt2      install what requirements.txt lists if anything is missing, then build
#                        the product: every .pyx outside dev/ (NO_OMP=1, DEBUG=1, NO_NATIVE=1 switch),
#                        its modules beside their .pyx, Cython's C under build/cython
#   make generate        rewrite accel/generated/ from accel/spec.py (accel/codegen.py): after a change
#                        to the spec; the build checks that it is current and stops if not
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

.PHONY: train_gpt2 generate dev test bench hip hip-emu hip-check-nvcc hip-check-amd ane-private clean

train_gpt2:
	$(PYTHON) dev/ensure_requirements.py requirements.txt
	$(PYTHON) setup.py -q build_ext --inplace

generate:
	$(PYTHON) accel/codegen.py

dev: train_gpt2
	LLMPYX_LAB=1 $(PYTHON) setup.py -q build_ext --inplace

# pytest's workers (pytest-xdist, optional in requirements.txt): one a core, at most 4 (each
# holds up to a few GiB at once); each test file runs whole on one worker, as its fixtures expect
PYTEST_WORKERS = $(shell $(PYTHON) -c "import os, xdist; cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count(); print('-n', min(cores, 4), '--dist loadfile')" 2>/dev/null)
test: train_gpt2
	$(PYTHON) -m pytest -q $(PYTEST_WORKERS) tests
	$(PYTHON) test_gpt2.py
	$(PYTHON) test_llama2.py
	$(PYTHON) test_gpt2.py --precision bf16
	$(PYTHON) test_llama2.py --precision bf16
	$(PYTHON) test_gpt2.py --precision fp16
	$(PYTHON) test_llama2.py --precision fp16

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

# the build folders (Cython's C, the objects, the GPU libraries), and the extension modules beside
# each .pyx (hidden folders and virtual environments kept in the tree are left alone, as setup.py
# leaves them); accel/generated/ is a source, committed, and stays
clean:
	rm -rf build accel/metal/build accel/hip/build accel/ane/build
	find . \( -name '.?*' -o -exec test -e '{}/pyvenv.cfg' \; \) -prune -o -name '*.pyx' -print | \
	    while read -r f; do rm -f "$$(dirname "$$f")"/*.so "$$(dirname "$$f")"/*.pyd; done

# Metal on Linux: accel/metal/gpt2.metal (with the files it #includes, llama.metal and
# flash.metal, spliced in) rewritten for the CPU emulator of MSL (accel/emu) and
# built with the emulator and the host side (accel/metal/host.c) into the libraries that backend
# metal-emu loads, one per precision (floatX float, half, bfloat: accel/metal/README.md):
# libmetal_emu.so (fp32), libmetal_emu_fp16.so, libmetal_emu_bf16.so. The tests build other
# variants (planted faults) with METAL_SOURCE and METAL_EMU_LIB (then that library alone, at
# METAL_PRECISION, default fp32), and with ASAN=1 under AddressSanitizer; the emulator's objects
# are shared, the host side's one per precision (accel/metal/build/*.o).
#   make metal-emu
# On macOS: the Metal runtime with the same host side, and the compiled kernel libraries, one of
# each per precision (needs Xcode's command-line tools; bf16 needs MSL 3.1: macOS 14).
#   make metal
# On Linux, metal_runtime.m is checked by clang against stubs: make metal-syntax (below).
METAL_SOURCE ?= accel/metal/gpt2.metal
# the files a build of METAL_SOURCE depends on: it and the .metal files beside it, where its
# #includes are found (accel/metal: llama.metal, flash.metal)
METAL_SOURCES = $(sort $(METAL_SOURCE) $(wildcard $(dir $(METAL_SOURCE))*.metal))
METAL_PRECISION ?= fp32
METAL_PRECISIONS = fp32 fp16 bf16
METAL_DEFINES_fp32 =
METAL_DEFINES_fp16 = -DACCEL_METAL_FP16
METAL_DEFINES_bf16 = -DACCEL_METAL_BF16
metal_suffix = $(if $(filter fp32,$(1)),,_$(1))
METAL_EMU_FLAGS = -std=c++17 -O2 -g -Wall -fPIC -fvisibility=hidden -I accel/emu/include
METAL_HOST_FLAGS = -std=c11 -O2 -g -Wall -fPIC -fvisibility=hidden
ifeq ($(ASAN),1)
METAL_EMU_FLAGS += -fsanitize=address -fno-omit-frame-pointer
METAL_HOST_FLAGS += -fsanitize=address -fno-omit-frame-pointer
METAL_EMU_FLAVOR = .asan
endif
METAL_EMU_OBJECTS := accel/metal/build/emu_core$(METAL_EMU_FLAVOR).o accel/metal/build/msl_runtime$(METAL_EMU_FLAVOR).o

.PHONY: metal-emu metal
accel/metal/build/emu_core$(METAL_EMU_FLAVOR).o: accel/emu/emu_core.cpp accel/emu/emu_core.h
	mkdir -p $(dir $@)
	$(CXX) $(METAL_EMU_FLAGS) -c $< -o $@
accel/metal/build/msl_runtime$(METAL_EMU_FLAVOR).o: accel/emu/msl_runtime.cpp accel/emu/msl_emu.h accel/emu/msl_half.h \
        accel/emu/emu_core.h accel/metal/metal_runtime.h
	mkdir -p $(dir $@)
	$(CXX) $(METAL_EMU_FLAGS) -c $< -o $@
accel/metal/build/host_%$(METAL_EMU_FLAVOR).o: accel/metal/host.c accel/metal/metal_runtime.h accel/generated/backend.h
	mkdir -p $(dir $@)
	$(CC) $(METAL_HOST_FLAGS) $(METAL_DEFINES_$*) -c $< -o $@

# $(1): the emulator library, $(2): its precision
define METAL_EMU_LIBRARY
$(1): $(METAL_SOURCES) $(METAL_EMU_OBJECTS) accel/metal/build/host_$(2)$(METAL_EMU_FLAVOR).o accel/emu/msl_rewrite.py \
        accel/emu/msl_emu.h accel/emu/msl_half.h accel/emu/blas/bf16_bits.h
	mkdir -p $$(dir $$@)
	$(PYTHON) accel/emu/msl_rewrite.py $(METAL_SOURCE) -o $$@.cpp
	$(CXX) $(METAL_EMU_FLAGS) $(METAL_DEFINES_$(2)) -shared $$@.cpp $(METAL_EMU_OBJECTS) \
	    accel/metal/build/host_$(2)$(METAL_EMU_FLAVOR).o -o $$@
endef
ifeq ($(origin METAL_EMU_LIB),command line)
$(eval $(call METAL_EMU_LIBRARY,$(METAL_EMU_LIB),$(METAL_PRECISION)))
metal-emu: $(METAL_EMU_LIB)
else
$(foreach p,$(METAL_PRECISIONS),$(eval $(call METAL_EMU_LIBRARY,accel/metal/build/libmetal_emu$(call metal_suffix,$(p)).so,$(p))))
metal-emu: $(foreach p,$(METAL_PRECISIONS),accel/metal/build/libmetal_emu$(call metal_suffix,$(p)).so)
endif

metal: $(foreach p,$(METAL_PRECISIONS),accel/metal/build/libmetal_runtime$(call metal_suffix,$(p)).dylib \
    accel/metal/build/gpt2$(call metal_suffix,$(p)).metallib)

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

# $(1): precision; bf16's bfloat needs MSL 3.1
define METAL_MACOS_LIBRARIES
accel/metal/build/libmetal_runtime$(call metal_suffix,$(1)).dylib: accel/metal/metal_runtime.m accel/metal/host.c \
        accel/metal/metal_runtime.h accel/generated/backend.h
	mkdir -p $$(dir $$@)
	xcrun clang -fobjc-arc -O2 -Wall -dynamiclib -framework Metal -framework Foundation $(METAL_DEFINES_$(1)) \
	    accel/metal/metal_runtime.m accel/metal/host.c -o $$@
accel/metal/build/gpt2$(call metal_suffix,$(1)).metallib: $(wildcard accel/metal/*.metal)
	mkdir -p $$(dir $$@)
	xcrun -sdk macosx metal $(if $(filter bf16,$(1)),-std=metal3.1) $(METAL_DEFINES_$(1)) -c accel/metal/gpt2.metal \
	    -o accel/metal/build/gpt2$(call metal_suffix,$(1)).air
	xcrun -sdk macosx metallib accel/metal/build/gpt2$(call metal_suffix,$(1)).air -o $$@
endef
$(foreach p,$(METAL_PRECISIONS),$(eval $(call METAL_MACOS_LIBRARIES,$(p))))
