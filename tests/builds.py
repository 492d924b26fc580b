"""The checkout's build folders (accel/hip/build, accel/metal/build) are shared by the test files
that build into them, and `make test` runs the files on several workers at once (pytest-xdist):
a make into the checkout runs under one lock, so that two workers never build the same object
at once (the second finds it built). A make into a folder of its own (BUILD=tmp_path) needs no
lock. Where flock(1) (util-linux) is absent, a make runs unlocked: one worker is safe as before.
"""
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCK = os.path.join(ROOT, "build", "tests-make.lock")


def locked(command):
    """command (a make into the checkout, as a list) run under the checkout's build lock."""
    flock = shutil.which("flock")
    if flock is None:
        return list(command)
    os.makedirs(os.path.dirname(LOCK), exist_ok=True)
    return [flock, LOCK] + list(command)
