"""
dev/ensure_requirements.py: install a requirements file's packages when some are missing.

    python3 dev/ensure_requirements.py requirements.txt     (the first step of `make train_gpt2`)

Each line `name[extras] <op> version, ...` is checked against the installed distributions
(importlib.metadata: no pip, no network).  When all are there it prints nothing.  Otherwise it
names what is missing in one line and runs `python -m pip install -r FILE` with this same
interpreter, so a fresh virtual environment needs no manual pip step.  Without pip, or when pip
fails (a system Python that forbids it, no index), it stops with the command to run.
Versions are compared on their numeric release (2.13.0+cpu is 2.13.0); a line this does not
parse (a URL) only needs its name installed.  A line with an environment marker
(`name==1.0; sys_platform == "darwin"`) counts only where its marker holds, as pip does.
"""
import importlib.metadata
import importlib.util
import operator
import re
import shlex
import subprocess
import sys

OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
       ">": operator.gt, "<": operator.lt}
REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)")
CLAUSE = re.compile(r"(>=|<=|==|!=|>|<)\s*([0-9][0-9.]*)")


def release(version):
    """(2, 13) for '2.13', '2.13.0', '2.13.0+cpu' or '2.13rc1': the leading numeric parts,
    trailing zeros dropped so that 2.13 == 2.13.0."""
    m = re.match(r"[0-9]+(?:\.[0-9]+)*", version)
    parts = [int(p) for p in m.group().split(".")] if m else []
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def applies(marker):
    """Whether an environment marker holds here (pip's own packaging evaluates it)."""
    try:
        from packaging.markers import Marker
    except ImportError:
        try:
            from pip._vendor.packaging.markers import Marker
        except ImportError:   # nothing to evaluate it with: ask for the package
            return True
    return Marker(marker).evaluate()


def unmet(line):
    """Why a requirement line is not met ('missing', 'have 1.2'), or None when it is (or
    when its environment marker does not hold here)."""
    line, _, marker = line.partition(";")
    if marker.strip() and not applies(marker.strip()):
        return None
    name, _, spec = REQUIREMENT.match(line.strip()).groups()
    try:
        have = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"
    for clause in spec.split(","):
        m = CLAUSE.fullmatch(clause.strip())
        if m and not OPS[m.group(1)](release(have), release(m.group(2))):
            return f"have {have}"
    return None


def requirements(path):
    """The requirement lines of a requirements file (comments, blanks and pip options dropped)."""
    with open(path) as f:
        lines = (line.split("#", 1)[0].strip() for line in f)
        return [line for line in lines if line and not line.startswith("-")]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python3 dev/ensure_requirements.py REQUIREMENTS_FILE")
    path = argv[0]
    missing = [(line, why) for line in requirements(path) for why in [unmet(line)] if why]
    if not missing:
        return 0
    command = [sys.executable, "-m", "pip", "install", "-r", path]
    shown = shlex.join(command)
    what = ", ".join(f"{line} ({why})" for line, why in missing)
    if importlib.util.find_spec("pip") is None:
        print(f"{path} needs {what}, and this Python has no pip: install pip (python3 -m ensurepip, "
              f"or the system's python3-pip package), then run\n  {shown}", file=sys.stderr)
        return 1
    print(f"installing {what}: {shown}", flush=True)
    if subprocess.run(command).returncode != 0:
        print(f"pip could not install {path} (see above).  Run it yourself:\n  {shown}\nor, where "
              f"this Python does not allow it, in a virtual environment:\n  python3 -m venv .venv && "
              f". .venv/bin/activate && python -m pip install -r {shlex.quote(path)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
