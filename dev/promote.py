"""
dev/promote.py: move a staged variant into kernels/ as the promoted kernel.

    python dev/promote.py gelu 2              dev/cpu/gelu_2.pyx -> kernels/gelu.pyx (moved)
    python dev/promote.py gelu 2 --to /tmp/k  write a copy into another folder (to try it first)
    python dev/promote.py gelu 2 --diff       show what would change in kernels/gelu.pyx

A variant is written as a promoted kernel is: the same cdef functions with the same
signatures (kernels/<kernel>.pxd), and Python wrappers with the same names and arguments.  The
variant's shared wrappers (`include "_<kernel>_wrappers.pxi"`) are pasted in at the end.
The variant's file is then removed: kernels.<kernel> is its row in dev/ab.py from then on.
Then rebuild (make train_gpt2), run the kernel's tests and `python dev/ab.py <kernel>`.
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

    def paste(match):
        # the wrappers, under a heading of their own instead of the .pxi's note about variants
        with open(os.path.join(CPU, match.group(1))) as f:
            lines = f.read().rstrip("\n").splitlines()
        while lines and (lines[0].startswith("#") or not lines[0].strip()):
            lines.pop(0)
        heading = ["# " + "-" * 76,
                   "# Python wrappers: check shapes, then run the kernel without the GIL", ""]
        return "\n".join(heading + lines)

    # the include line goes; the wrappers it stood for go to the end, after the kernels
    wrappers = [paste(m) for m in re.finditer(r'^include "([^"]+\.pxi)"\n', text, flags=re.M)]
    text = re.sub(r'^include "([^"]+\.pxi)"\n\n?', "", text, flags=re.M)
    text = text.rstrip("\n") + "".join("\n\n\n" + w for w in wrappers) + "\n"
    # the banner says where it came from
    text = re.sub(rf"^# {kernel} variant {number}:", f"# {kernel} (promoted from dev/cpu/{kernel}_{number}.pyx):",
                  text, count=1)
    return text


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
    if args.to == DEFAULT_TARGET:  # promoted: the one copy now lives in kernels/
        os.remove(source)
        print(f"removed {source} (its row is kernels.{args.kernel} now)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
