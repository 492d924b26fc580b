"""
dev/ensure_requirements.py (make train_gpt2's first step): which requirement lines are unmet,
versions compared on their release, environment markers honoured as pip honours them, so a
package without a wheel for this machine (coremltools off macOS and x86_64 Linux) does not stop
the build.
"""
import os
import platform
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "dev"))
import ensure_requirements as er  # noqa: E402


def test_versions_and_missing_packages():
    assert er.release("2.13.0+cpu") == er.release("2.13") == (2, 13)
    assert er.unmet("numpy>=1.0") is None
    assert er.unmet("numpy>=999") == f"have {__import__('numpy').__version__}"
    assert er.unmet("surely-not-installed-pkg>=1") == "missing"


def test_a_marker_that_does_not_hold_here_is_not_needed():
    here = platform.machine()
    assert er.unmet(f'surely-not-installed-pkg==1.0; platform_machine == "{here}"') == "missing"
    assert er.unmet(f'surely-not-installed-pkg==1.0; platform_machine != "{here}"') is None
    assert er.unmet('numpy>=1.0 ; python_version >= "3"') is None


def test_every_line_of_requirements_txt_is_understood():
    lines = er.requirements(os.path.join(REPO, "requirements.txt"))
    assert any(line.startswith("coremltools") and ";" in line for line in lines)
    for line in lines:
        er.unmet(line)   # parses, and evaluates its marker
