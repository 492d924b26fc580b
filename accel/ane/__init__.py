"""accel/ane: training Llama-family models on the Apple Neural Engine (issue 11): MIL programs
built with coremltools' Builder, their text and weight blobs, a NumPy interpreter and the
ane-emu backend on Linux; the Mac runtimes and the compile-budget planner."""
