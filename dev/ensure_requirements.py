"""
dev/ensure_requirements.py: install a requirements file's packages when some are missing.

    python3 dev/ensure_requirements.py requirements.txt     (the first step of `make train_gpt2`)

Each line `name[extras] <op> version, ...` is checked against the installed distributions
(importlib.metadata: no pip, no network).  When all are there it prints nothing.  Otherwise it
names what is missing in one line and runs `python -m pip install` on those lines with this same
interpreter, so a fresh virtual environment needs no manual pip step.  Without pip, or when pip
fails (a system Python that forbids it, no index), it stops with the command to run.
A line whose comment says `# optional` (MKL, the dashboard, the exporters, pytest, coremltools:
nothing the build or training needs) is installed the same way, but where pip cannot install it
(a GPU machine that reaches no index: PIP_NO_INDEX=1, PIP_FIND_LINKS=a folder of wheels) it is
skipped, said in one line, and the build goes on.
Versions are compared on their numeric release (2.13.0+cpu is 2.13.0); a line this does not
parse (a URL) only needs its name installed.  A line with an environment marker
(`name==1.0; sys_platform == "darwin"`) counts only where its marker holds, as pip does.
"""
import importlib.metadata
import importlib.util
import operator
import os
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
    """[(requirement, optional)] of a requirements file: each requirement line without its
    comment, and whether that comment says `optional` (comments, blanks and pip options dropped)."""
    found = []
    with open(path) as f:
        for line in f:
            line, _, comment = line.partition("#")
            line = line.strip()
            if line and not line.startswith("-"):
                found.append((line, comment.strip().split(":")[0].strip() == "optional"))
    return found


def pip_error(lines):
    """pip install these lines with pip's output captured and one try (no retries against an
    index that is not there): None, or why not (pip's first ERROR line)."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--retries", "0", "--timeout", "10", *lines],
                          capture_output=True, text=True)
    if done.returncode == 0:
        return None
    if os.environ.get("PIP_NO_INDEX", "") not in ("", "0", "false", "no", "off"):
        return "PIP_NO_INDEX: pip reaches no index"
    errors = [line.strip() for line in done.stderr.splitlines() if line.strip()] or ["pip failed"]
    return next((line for line in errors if line.startswith("ERROR")), errors[-1])


def install_optional(lines):
    """Install the optional lines where pip can (together, else one by one), in one line of
    output: what was installed, and what was skipped and why."""
    names = {line: REQUIREMENT.match(line).group(1) for line in lines}
    print(f"dev/ensure_requirements.py: optional {', '.join(names.values())}: ", end="", flush=True)
    if importlib.util.find_spec("pip") is None:
        skipped, why = lines, "this Python has no pip"
    else:
        why = pip_error(lines)
        skipped = [line for line in lines if pip_error([line])] if why else []
    installed = [names[line] for line in lines if line not in skipped]
    said = [f"installed {', '.join(installed)}"] if installed else []
    if skipped:
        what = f" {', '.join(names[line] for line in skipped)}" if installed else ""
        said.append(f"skipped{what} ({why}); not needed to build or train (later, where an index is "
                    f"reachable: {shlex.join(['pip', 'install', *skipped])})")
    print("; ".join(said), flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python3 dev/ensure_requirements.py REQUIREMENTS_FILE")
    path = argv[0]
    unmet_lines = [(line, optional, why) for line, optional in requirements(path) for why in [unmet(line)] if why]
    missing = [(line, why) for line, optional, why in unmet_lines if not optional]
    extras = [line for line, optional, _ in unmet_lines if optional]
    if missing and install_required(path, missing) != 0:
        return 1
    if extras:
        install_optional(extras)
    return 0


def install_required(path, missing):
    """pip install the unmet required lines; 0, or 1 after saying how to do it by hand."""
    command = [sys.executable, "-m", "pip", "install", *(line for line, _ in missing)]
    shown = shlex.join(command)
    what = ", ".join(f"{line} ({why})" for line, why in missing)
    if importlib.util.find_spec("pip") is None:
        print(f"{path} needs {what}, and this Python has no pip: install pip (python3 -m ensurepip, "
              f"or the system's python3-pip package), then run\n  {shown}", file=sys.stderr)
        return 1
    print(f"installing {what}: {shown}", flush=True)
    if subprocess.run(command).returncode != 0:
        print(f"pip could not install what {path} needs (see above).  Run it yourself:\n  {shown}\n"
              f"or, where this Python does not allow it, in a virtual environment:\n  python3 -m venv "
              f".venv && . .venv/bin/activate && python -m pip install -r {shlex.quote(path)}\n"
              f"(a machine that reaches no index: pip install --no-index --find-links DIR, DIR a folder "
              f"of wheels: dev/gpu/README.md)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
