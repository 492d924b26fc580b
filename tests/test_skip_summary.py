"""
tests/conftest.py's line after a run: its skips counted by reason, most frequent first, the reasons
tests/needs.py gives with what differs from test to test (an emulated build's precision and file, a
file of ../shared) taken off, so that one absence is counted once; no line where nothing skipped.
Each case runs pytest on a small test file in a subprocess, with the conftest as a plugin.
"""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SKIPPING = '''
import os

import pytest

import needs


@pytest.mark.parametrize("case", range(2))
def test_package(case):
    needs.package("llmpyx_absent_package")


@pytest.mark.parametrize("name", ["a", "b"])
def test_shared_file(name):
    needs.shared(os.path.join(needs.SHARED, f"llmpyx_absent_{name}"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_emulator(precision, monkeypatch):
    monkeypatch.setitem(needs.hip_device.LIBRARIES, precision,
                        ("", f"/llmpyx_absent/libhip_emu_{precision}.so"))
    needs.emulator("hip-emu", precision)


@pytest.mark.skipif(True, reason="a skip of its own")
def test_marked():
    pass


def test_passes():
    pass
'''

# a whole module skipped, at collection: one skip
SKIPPED_MODULE = '''
import needs

needs.package("llmpyx_absent_package")


def test_never_runs():
    pass
'''


def run_pytest(tmp_path, files):
    """pytest -q on `files` (name: source) written to tmp_path, with tests/conftest.py as a plugin
    (tests/ and the repository on the path, as pytest puts them for the suite): its output."""
    for name, source in files.items():
        (tmp_path / name).write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           *files], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_skips_are_counted_by_reason_most_frequent_first(tmp_path):
    out = run_pytest(tmp_path, {"test_skipping.py": SKIPPING, "test_skipped_module.py": SKIPPED_MODULE})
    summary = [line for line in out.splitlines() if line.startswith("skips by reason: ")]
    assert summary == ["skips by reason: "
                       "3 llmpyx_absent_package is not installed (pip install llmpyx_absent_package), "
                       "2 hip-emu is not built (make hip-emu), "
                       "2 no file of ../shared (llm.c's data, beside the checkout), "
                       "1 a skip of its own"], out
    assert "1 passed, 8 skipped" in out


def test_a_run_without_skips_has_no_such_line(tmp_path):
    out = run_pytest(tmp_path, {"test_passing.py": "def test_passes():\n    pass\n"})
    assert "skips by reason" not in out
    assert "1 passed" in out
