# llm.pyx — build, test and benchmark.
#   make train_gpt2      install what requirements.txt lists if anything is missing, then build
#                        the product: every .pyx outside dev/ (NO_OMP=1, DEBUG=1, NO_NATIVE=1 switch)
#   make dev             the kernel lab too: the variants in dev/cpu (dev/ab.py, dev/README.md)
#   make test            unit tests (pytest) and the PyTorch parity checks (test_gpt2.py,
#                        test_llama2.py); the variants' tests need `make dev` first, and are
#                        skipped without it
#   make bench           time a training step against PyTorch eager (dev/bench_step.py)
#   make clean
PYTHON ?= python3

.PHONY: train_gpt2 dev test bench clean

train_gpt2:
	$(PYTHON) dev/ensure_requirements.py requirements.txt
	$(PYTHON) setup.py -q build_ext --inplace

dev: train_gpt2
	LLMPYX_LAB=1 $(PYTHON) setup.py -q build_ext --inplace

test: train_gpt2
	$(PYTHON) -m pytest -q tests
	$(PYTHON) test_gpt2.py
	$(PYTHON) test_llama2.py

bench: train_gpt2
	$(PYTHON) dev/bench_step.py

# every .pyx's generated C, and the extension modules beside it (hidden folders and virtual
# environments kept in the tree are left alone, as setup.py leaves them)
clean:
	rm -rf build
	find . \( -name '.?*' -o -exec test -e '{}/pyvenv.cfg' \; \) -prune -o -name '*.pyx' -print | \
	    while read -r f; do rm -f "$${f%.pyx}.c" "$$(dirname "$$f")"/*.so "$$(dirname "$$f")"/*.pyd; done
