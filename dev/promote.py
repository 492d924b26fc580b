"""
dev/promote.py: write a staged variant out as the promoted kernel.

    python dev/promote.py gelu 2              dev/cpu/gelu_2.pyx -> kernels/gelu.pyx
    python dev/promote.py gelu 2 --to /tmp/k  write into another folder (to try it first)
    python dev/promote.py gelu 2 --diff       show what would change in kernels/gelu.pyx

A variant is written as a promoted kernel is: the same cdef functions with the same
signatures (kernels/<kernel>.pxd), and Python wrappers with the same names and arguments.  The
variant's shared wrappers (`include "_<kernel>_wrappers.pxi"`) are pasted in, and a cimport of
dev.cpu.vexp becomes kernels.vexp (the .pxd is copied along).  Then rebuild (make train_gpt2),
run the kernel's tests and `python dev/ab.py <kernel>`: the kernels.<kernel> row must now
match the variant's.
"""
import argparse
import difflib
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CPU = os.path.join(HERE, "cpu")


def promoted_source(kernel, number):
    """(text of kernels/<kernel>.pyx made from the variant, extra files {name: source path})."""
    path = os.path.join(CPU, f"{kernel}_{number}.pyx")
    if not os.path.exists(path):
        raise SystemExit(f"dev/promote.py: {path} does not exist (see python dev/ab.py --list)")
    with open(path) as f:
        text = f.read()
    extra = {}

    def paste(match):
        with open(os.path.join(CPU, match.group(1))) as f:
            return f.read().rstrip("\n")

    text = re.sub(r'^include "([^"]+\.pxi)"$', paste, text, flags=re.M)
    if "dev.cpu.vexp" in text:
        text = text.replace("dev.cpu.vexp", "kernels.vexp")
        extra["vexp.pxd"] = os.path.join(CPU, "vexp.pxd")
    return text, extra


def main(argv=None):
    p = argparse.ArgumentParser(description="Write dev/cpu/<kernel>_<N>.pyx out as kernels/<kernel>.pyx.")
    p.add_argument("kernel")
    p.add_argument("number", type=int)
    p.add_argument("--to", default=os.path.join(ROOT, "kernels"), help="folder to write into")
    p.add_argument("--diff", action="store_true", help="print the diff against the current file, write nothing")
    args = p.parse_args(argv)

    text, extra = promoted_source(args.kernel, args.number)
    target = os.path.join(args.to, f"{args.kernel}.pyx")
    if args.diff:
        old = open(target).read().splitlines(True) if os.path.exists(target) else []
        sys.stdout.writelines(difflib.unified_diff(old, text.splitlines(True), target,
                                                   f"dev/cpu/{args.kernel}_{args.number}.pyx"))
        return 0
    os.makedirs(args.to, exist_ok=True)
    with open(target, "w") as f:
        f.write(text)
    for name, source in extra.items():
        shutil.copyfile(source, os.path.join(args.to, name))
    print(f"wrote {target}" + "".join(f", {os.path.join(args.to, n)}" for n in extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
