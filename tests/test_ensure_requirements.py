"""
dev/ensure_requirements.py (make train_gpt2's first step): which requirement lines are unmet,
versions compared on their release, environment markers honoured as pip honours them, so a
package without a wheel for this machine (coremltools off macOS and x86_64 Linux) does not stop
the build; a line marked `# optional` that pip cannot install (no index: a GPU machine) is
skipped in one line, a required one stops the build.
"""
import os
import platform
import subprocess
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
    assert any(line.startswith("coremltools") and ";" in line for line, _ in lines)
    for line, _ in lines:
        er.unmet(line)   # parses, and evaluates its marker


def test_optional_lines_are_marked_and_the_build_needs_none_of_them():
    marked = {er.REQUIREMENT.match(line).group(1): optional
              for line, optional in er.requirements(os.path.join(REPO, "requirements.txt"))}
    assert marked["mkl"] and marked["coremltools"] and marked["rich"] and marked["pytest"]
    assert not any(marked[name] for name in ("setuptools", "Cython", "numpy", "scipy-openblas32"))


def ensure(tmp_path, text):
    """dev/ensure_requirements.py on a requirements file of `text`, pip reaching no index."""
    path = tmp_path / "requirements.txt"
    path.write_text(text)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run([sys.executable, os.path.join(REPO, "dev", "ensure_requirements.py"), str(path)],
                          env=env, capture_output=True, text=True, timeout=300)


def test_without_an_index_an_optional_package_is_skipped_in_one_line(tmp_path):
    done = ensure(tmp_path, "numpy>=1.0\nsurely-not-installed-pkg==1.0  # optional: a test\n"
                            "also-not-installed-pkg>=2 ; python_version >= '3'  # optional\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    assert lines[0].startswith("dev/ensure_requirements.py: optional surely-not-installed-pkg, also-not-installed-pkg: "
                               "skipped (PIP_NO_INDEX: pip reaches no index")
    assert "not needed to build or train" in lines[0]


def test_without_an_index_a_missing_required_package_stops_the_build(tmp_path):
    done = ensure(tmp_path, "surely-not-installed-pkg==1.0\nmkl-surely-not==1  # optional\n")
    assert done.returncode == 1
    assert "installing surely-not-installed-pkg==1.0 (missing)" in done.stdout
    assert "--find-links" in done.stderr and "skipped" not in done.stdout


def test_all_installed_says_nothing(tmp_path):
    done = ensure(tmp_path, "numpy>=1.0\npytest>=1  # optional\n")
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""
