# llm.pyx — build, test and benchmark.
#   make train_gpt2      build every Cython extension in place (NO_OMP=1, DEBUG=1, NO_NATIVE=1 switch)
#   make test            unit tests (pytest) and the PyTorch parity check (test_gpt2.py)
#   make bench           time a training step against PyTorch eager (dev/bench_step.py)
#   make clean
PYTHON ?= python3

.PHONY: train_gpt2 test bench clean

train_gpt2:
	$(PYTHON) setup.py -q build_ext --inplace

test: train_gpt2
	$(PYTHON) -m pytest -q tests
	$(PYTHON) test_gpt2.py

bench: train_gpt2
	$(PYTHON) dev/bench_step.py

clean:
	rm -rf build *.so kernels/*.so dev/cpu/*.so train_gpt2.c kernels/*.c dev/cpu/*.c
