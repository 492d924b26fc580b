"""
dev/gpu/bare_box.py: dev/gpu/check_and_time.sh's build steps where only what a lent GPU machine
has is installed, and pip reaches no index: what shows that the script builds there.

    bash dev/gpu/check_and_time.sh --download      first, once (the wheels it brings)
    python3 dev/gpu/bare_box.py                    the whole product (minutes)
    python3 dev/gpu/bare_box.py --only kernels.blas --keep /tmp/box     one module; keep the folder

1. a virtual environment of this Python (python -m venv: its own pip, not the system's
   site-packages), without setuptools (a Python that lacks it: the wheel brings it);
2. the machine's own packages the build needs, NumPy, Cython, tiktoken and sentencepiece (with
   what they require), made importable in it from this Python's installation: each distribution's
   files linked into the environment's site-packages, nothing downloaded (PyTorch is left out:
   nothing in the build imports it);
3. a copy of the repository as the device tool sends it: the files git tracks or does not
   ignore, and the wheels folder (dev/gpu/wheels: carried by name), no build outputs;
4. there, `STEPS="wheels build-product" PYTHON=<the environment's> bash dev/gpu/check_and_time.sh`
   (the script sets PIP_NO_INDEX=1): the wheels installed, every optional package skipped in one
   line, the product built;
5. the product run in it: the BLAS its GEMMs use (OpenBLAS from the wheel: MKL was skipped) and,
   with the whole product built, a training step of a GPT-2 d1 on the CPU.
Exits 0 when all of that passes; prints each step's output.
"""
import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# what a lent GPU machine has that the build needs (requirements.txt's required lines, less the wheels)
MACHINE_HAS = ("numpy", "Cython", "tiktoken", "sentencepiece")
STEP = """
import numpy as np
from kernels import blas
import sys, scipy_openblas32
print("kernels.blas:", blas.LIBRARY, "from", scipy_openblas32.get_lib_dir())
assert "OpenBLAS" in blas.LIBRARY and scipy_openblas32.__file__.startswith(sys.prefix), scipy_openblas32.__file__
if {whole}:
    from train_gpt2 import GPT2, GPT2Config
    config = GPT2Config(max_seq_len=16, vocab_size=64, padded_vocab_size=64, num_layers=1, num_heads=2, channels=32)
    model = GPT2.random(config, seed=0)
    tokens = np.random.default_rng(0).integers(0, 64, (2, 9)).astype(np.int32)
    losses = []
    for t in (1, 2):
        losses.append(model.forward(tokens[:, :-1], tokens[:, 1:]))
        model.zero_grad()
        model.backward()
        model.update(1e-3, 0.9, 0.999, 1e-8, 0.0, t)
    assert losses[1] < losses[0], losses
    print("a GPT-2 step on the CPU: loss", losses[0], "->", losses[1])
"""


def with_requirements(names):
    """The distributions named and every one they require (extras left out), by name."""
    from pip._vendor.packaging.requirements import Requirement
    found, todo = {}, list(names)
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in found:
            continue
        found[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def link_distributions(names, site_packages):
    """Link each distribution's top-level files and folders (its packages, its .libs, its
    .dist-info) into site_packages; the names linked."""
    linked = []
    for dist in with_requirements(names).values():
        base = str(dist.locate_file(""))
        tops = {str(f).split("/")[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops):
            source, target = os.path.join(base, top), os.path.join(site_packages, top)
            if os.path.exists(source) and not os.path.lexists(target):
                os.symlink(source, target)
        linked.append(f"{dist.metadata['Name']} {dist.version}")
    return linked


def run(command, label=None, **kw):
    print("$", label or " ".join(command), flush=True)
    done = subprocess.run(command, **kw)
    if done.returncode != 0:
        sys.exit(f"dev/gpu/bare_box.py: failed ({done.returncode}): {' '.join(command)}")


def copy_repository(target, wheels):
    """The files git tracks or does not ignore, and the wheels folder, into target."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = os.path.join(ROOT, name)
        if os.path.isfile(source):
            os.makedirs(os.path.dirname(os.path.join(target, name)), exist_ok=True)
            shutil.copy2(source, os.path.join(target, name))
    shutil.copytree(wheels, os.path.join(target, "dev", "gpu", "wheels"), dirs_exist_ok=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--only", default="", help="build only the modules whose name contains this (LLMPYX_ONLY)")
    p.add_argument("--keep", help="work in this folder (made) and leave it; default: a temporary one, removed")
    p.add_argument("--wheels", default=os.path.join(HERE, "wheels"), help="the wheels folder (default: dev/gpu/wheels)")
    args = p.parse_args(argv)
    if not [f for f in os.listdir(args.wheels) if f.endswith(".whl")]:
        sys.exit(f"dev/gpu/bare_box.py: no wheels in {args.wheels}: "
                 "run `bash dev/gpu/check_and_time.sh --download` first")
    work = args.keep or tempfile.mkdtemp(prefix="bare_box_")
    os.makedirs(work, exist_ok=True)
    try:
        venv, repo = os.path.join(work, "venv"), os.path.join(work, "repo")
        run([sys.executable, "-m", "venv", venv])
        python = os.path.join(venv, "bin", "python")
        run([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"])
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        print("linked from", sysconfig.get_paths()["purelib"], ":", ", ".join(link_distributions(MACHINE_HAS, site)))
        copy_repository(repo, args.wheels)
        env = dict(os.environ, STEPS="wheels build-product", PYTHON=python, OUT=os.path.join(work, "out"),
                   LLMPYX_ONLY=args.only, PIP_NO_INDEX="1")
        env.pop("PYTHONPATH", None)
        run(["bash", "dev/gpu/check_and_time.sh"], cwd=repo, env=env)
        installed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                                   check=True).stdout.split()
        print("the environment holds:", ", ".join(installed))
        assert not any(re.match(r"(mkl|torch|coremltools)==", line) for line in installed), installed
        # LLMPYX_BLAS=openblas: this Python's own lib/ may hold MKL (pip's mkl wheel), which the
        # loader still finds from the environment through the interpreter's RUNPATH; the machine has none
        run([python, "-c", STEP.format(whole=not args.only)], label=f"{python} -c <the product's step>", cwd=repo,
            env=dict(env, OMP_NUM_THREADS="1", LLMPYX_BLAS="openblas"))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("dev/gpu/bare_box.py: the build steps pass with only the machine's packages and the wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
