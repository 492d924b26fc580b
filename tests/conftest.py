"""tests/conftest.py: what every test shares: OpenMP's idle threads asleep, MPI's launcher (the
mpiexec fixture), and a line after the run counting its skips by reason."""
import os
import re
from collections import Counter

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


# The part of a skip's reason that differs from test to test, so that one absence is counted once:
# an emulated backend's build whatever the precision and library file a test asked for
# (needs.emulator), a file of ../shared whichever file (needs.shared).
PER_TEST_DETAIL = [
    (re.compile(r"^(\S+) is not built at \w+: no \S+"), r"\1 is not built"),
    (re.compile(r"^no \.\./shared/\S+"), "no file of ../shared"),
]


def skip_reason(report):
    """A skip's reason as the summary counts it: pytest's "Skipped: " and PER_TEST_DETAIL taken
    off."""
    reason = report.longrepr[2].removeprefix("Skipped: ")
    for detail, common in PER_TEST_DETAIL:
        reason = detail.sub(common, reason)
    return reason


def pytest_terminal_summary(terminalreporter):
    """One line counting the run's skips by reason, most frequent first: `make test` skips some
    190 tests where an optional package, tool or build is absent (tests/needs.py), and pytest
    counts them without saying why (-rs lists each)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts = Counter(skip_reason(report) for report in skipped)
    by_frequency = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    terminalreporter.write_line(
        "skips by reason: " + ", ".join(f"{n} {reason}" for reason, n in by_frequency))
