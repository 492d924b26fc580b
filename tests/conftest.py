"""tests/conftest.py: what every test shares: OpenMP's idle threads asleep, and MPI's launcher
(the mpiexec fixture)."""
import os

# Idle OpenMP threads sleep instead of spinning: the test suite shares the cores with other
# processes (pytest's subprocesses, PyTorch), where spinning threads slow every kernel launch
# many times over.  Set before any extension module loads libgomp, which reads it once.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

import needs  # noqa: E402  (after the variable: it loads the extension modules)


@pytest.fixture(scope="session")
def mpiexec():
    """MPI's launcher, or a skip where mpi4py or mpiexec is absent (tests/needs.py): the tests
    that start ranks use it (test_mpi.py's needs_mpi)."""
    return needs.mpiexec()
