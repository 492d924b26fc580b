"""
accel/metal/lint.py — checks a .metal file for what the CPU emulator cannot police, because g++
accepts it: C++ that the Metal Shading Language lacks, pointer and reference parameters without
an address space, and 3-vectors in buffers (16 bytes each in MSL, 12 in a host array).

    python accel/metal/lint.py accel/metal/gpt2.metal      # exit status 1 if it finds anything

Reads a file as the compiler does, its quoted includes spliced in (gpt2.metal's llama.metal and
flash.metal: accel/emu/msl_rewrite.py's splice), and prints `file:line: what` for each finding,
naming the file the line was written in. CI runs it on gpt2.metal (tests/test_metal_emu.py).
"""
import argparse
import os
import re
import sys

if __package__ in (None, ""):   # run as a script: the repository root is where accel/ is found
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from accel.emu.msl_rewrite import Origins, RewriteError, blank_comments, matching_paren, splice, split_params

ADDRESS_SPACE = re.compile(r"\b(device|constant|threadgroup|thread|threadgroup_imageblock|ray_data|object_data)\b")
# C++ that MSL does not have (MSL spec, "Restrictions"): exceptions, dynamic allocation, RTTI,
# virtual functions, the standard library, thread_local storage, recursion-prone goto, and
# double precision (no Apple GPU has it).
FORBIDDEN = [
    (re.compile(r"\bnew\b"), "dynamic allocation (new): MSL has none"),
    (re.compile(r"\bdelete\b"), "dynamic allocation (delete): MSL has none"),
    (re.compile(r"\b(throw|try|catch)\b"), "exceptions: MSL has none"),
    (re.compile(r"\bvirtual\b"), "virtual functions: MSL has none"),
    (re.compile(r"\b(dynamic_cast|typeid)\b"), "RTTI: MSL has none"),
    (re.compile(r"\bstd::"), "the C++ standard library: MSL has its own (metal::)"),
    (re.compile(r"\bthread_local\b"), "thread_local: MSL has none (threadgroup memory is `threadgroup`)"),
    (re.compile(r"\bgoto\b"), "goto: MSL has none"),
    (re.compile(r"\b(long\s+)?double\b"), "double: Apple GPUs have no double precision"),
    (re.compile(r"#\s*include\s*<(?!metal_)[^>]*>"), "a C++ header: MSL has only its metal_* headers"),
    (re.compile(r"\bmalloc\b|\bfree\s*\("), "malloc/free: MSL has no dynamic allocation"),
]
FUNCTION = re.compile(r"(?:\bkernel\s+)?\b[A-Za-z_][\w:<>]*[\s*&]+([A-Za-z_]\w*)\s*\(")
VECTOR3 = re.compile(r"\b(float|half|int|uint|short|ushort|char|uchar|bool)3\b")


def functions(text):
    """(name, start of its parameters, their end, is a kernel) of each function defined at
    program scope."""
    depth, found = 0, []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif depth == 0:
            m = FUNCTION.match(text, i)
            if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                open_pos = m.end() - 1
                close = matching_paren(text, open_pos)
                after = text[close + 1:].lstrip()
                if after.startswith("{") or after.startswith("[["):
                    found.append((m.group(1), open_pos + 1, close, m.group(0).lstrip().startswith("kernel")))
                    i = close
                    continue
                i = m.end()
                continue
        i += 1
    return found


def lint(source, path):
    """The findings in MSL text `source`, each `file:line: what`, in the text's order; its #line
    directives (a spliced file's) name each line's file, `path` the lines before the first."""
    origins = Origins(source, path)
    text = blank_comments(source, strings=True)   # (a #line directive's file name is no code)
    problems = []
    for pattern, why in FORBIDDEN:
        for m in pattern.finditer(text):
            problems.append((m.start(), why))
    for name, start, end, is_kernel in functions(text):
        for a, b in split_params(text[start:end]):
            param = text[start + a:start + b]
            declaration = re.sub(r"\[\[.*?\]\]", "", param, flags=re.S)
            at = start + a + len(param) - len(param.lstrip())
            if ("*" in declaration or "&" in declaration) and not ADDRESS_SPACE.search(declaration):
                problems.append((at, f"{name}: parameter '{' '.join(declaration.split())}' has no address space "
                                     "(device, constant, threadgroup or thread)"))
            if (is_kernel and re.search(r"\b(device|constant)\b", declaration) and VECTOR3.search(declaration)):
                problems.append((at, f"{name}: a 3-vector in a buffer ('{' '.join(declaration.split())}') takes "
                                     "16 bytes per element in MSL: use packed_ types or 4-vectors"))
    return ["%s:%d: %s" % (*origins(at), why) for at, why in sorted(problems)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", help=".metal files")
    args = parser.parse_args(argv)
    problems = []
    for path in args.sources:
        try:
            problems += lint(splice(path), path)
        except RewriteError as e:   # an include that is not there
            problems.append(str(e))
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
