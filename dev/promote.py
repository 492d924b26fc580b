"""
dev/promote.py: move a staged variant into kernels/ as the promoted kernel.

    python dev/promote.py gelu 2              dev/cpu/gelu_2.pyx -> kernels/gelu.pyx (moved)
    python dev/promote.py gelu 2 --to /tmp/k  write a copy into another folder (to try it first)
    python dev/promote.py gelu 2 --diff       show what would change in kernels/gelu.pyx

A variant is written as a promoted kernel is: the same cdef functions with the same
signatures (kernels/<kernel>.pxd), and the same Python wrappers, included from
kernels/<kernel>_wrappers.pxi by both.  So promotion is a move: only the banner changes, to
say where the kernel came from.  The variant's file is then removed: kernels.<kernel> is its
row in dev/ab.py from then on.  Then rebuild (make dev), run the kernel's tests and
`python dev/ab.py <kernel>`.
"""
import argparse
import difflib
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CPU = os.path.join(HERE, "cpu")
DEFAULT_TARGET = os.path.join(ROOT, "kernels")


def promoted_source(kernel, number):
    """The text of kernels/<kernel>.pyx made from the variant."""
    path = os.path.join(CPU, f"{kernel}_{number}.pyx")
    if not os.path.exists(path):
        raise SystemExit(f"dev/promote.py: {path} does not exist (see python dev/ab.py --list)")
    with open(path) as f:
        text = f.read()
    include = f'include "kernels/{kernel}_wrappers.pxi"'
    if not re.search(rf"^{re.escape(include)}$", text, flags=re.M):
        raise SystemExit(f"dev/promote.py: {path} does not `{include}`: the promoted kernel "
                         f"must keep the wrappers the tests and dev/ab.py call")
    banner = f"# {kernel} (promoted from dev/cpu/{kernel}_{number}.pyx):"
    return re.sub(rf"^# {kernel} variant {number}:", banner, text, count=1)


def main(argv=None):
    p = argparse.ArgumentParser(description="Write dev/cpu/<kernel>_<N>.pyx out as kernels/<kernel>.pyx.")
    p.add_argument("kernel")
    p.add_argument("number", type=int)
    p.add_argument("--to", default=DEFAULT_TARGET,
                   help="folder to write into (another than kernels/ keeps the variant)")
    p.add_argument("--diff", action="store_true", help="print the diff against the current file, write nothing")
    args = p.parse_args(argv)

    source = os.path.join(CPU, f"{args.kernel}_{args.number}.pyx")
    text = promoted_source(args.kernel, args.number)
    target = os.path.join(args.to, f"{args.kernel}.pyx")
    if args.diff:
        old = open(target).read().splitlines(True) if os.path.exists(target) else []
        sys.stdout.writelines(difflib.unified_diff(old, text.splitlines(True), target,
                                                   f"dev/cpu/{args.kernel}_{args.number}.pyx"))
        return 0
    os.makedirs(args.to, exist_ok=True)
    with open(target, "w") as f:
        f.write(text)
    print(f"wrote {target}")
    if os.path.abspath(args.to) == DEFAULT_TARGET:  # promoted: the one copy now lives in kernels/
        os.remove(source)
        print(f"removed {source} (its row is kernels.{args.kernel} now)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
