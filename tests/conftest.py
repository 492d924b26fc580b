import os

# Idle OpenMP threads sleep instead of spinning: the test suite shares the cores with other
# processes (pytest's subprocesses, PyTorch), where spinning threads slow every kernel launch
# many times over.  Set before any extension module loads libgomp, which reads it once.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
