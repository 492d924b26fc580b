# llm.pyx — build, test and benchmark.
#   make train_gpt2      install what requirements.txt lists if anything is missing, then build
#                        the product: every .pyx outside dev/ (NO_OMP=1, DEBUG=1, NO_NATIVE=1 switch)
#   make dev             the kernel lab too: the variants in dev/cpu (dev/ab.py, dev/README.md)
#   make test            unit tests (pytest) and the PyTorch parity check (test_gpt2.py); the
#                        variants' tests need `make dev` first, and are skipped without it
#   make bench           time a training step against PyTorch eager (dev/bench_step.py)
#   make hip             the HIP backend for this machine's GPU: nvcc (NVIDIA) where found, else
#                        hipcc (AMD); HIP_PLATFORM=amd|nvidia chooses (accel/hip/README.md)
#   make hip-emu         the HIP backend on the CPU emulator (g++ only; what CI tests)
#   make hip-check-nvcc  compile-check accel/hip for NVIDIA (nvcc, cuBLAS headers)
#   make hip-check-amd   compile-check accel/hip for AMD (hipcc)
#   make clean
PYTHON ?= python3

.PHONY: train_gpt2 dev test bench hip hip-emu hip-check-nvcc hip-check-amd clean

train_gpt2:
	$(PYTHON) dev/ensure_requirements.py requirements.txt
	$(PYTHON) setup.py -q build_ext --inplace

dev: train_gpt2
	LLMPYX_LAB=1 $(PYTHON) setup.py -q build_ext --inplace

test: train_gpt2
	$(PYTHON) -m pytest -q tests
	$(PYTHON) test_gpt2.py

bench: train_gpt2
	$(PYTHON) dev/bench_step.py

hip: train_gpt2
	$(MAKE) -C accel/hip gpu
hip-emu: train_gpt2
	$(MAKE) -C accel/hip emu
hip-check-nvcc hip-check-amd:
	$(MAKE) -C accel/hip $(@:hip-%=%)

# every .pyx's generated C, and the extension modules beside it (hidden folders and virtual
# environments kept in the tree are left alone, as setup.py leaves them)
clean:
	rm -rf build accel/hip/build
	find . \( -name '.?*' -o -exec test -e '{}/pyvenv.cfg' \; \) -prune -o -name '*.pyx' -print | \
	    while read -r f; do rm -f "$${f%.pyx}.c" "$$(dirname "$$f")"/*.so "$$(dirname "$$f")"/*.pyd; done
