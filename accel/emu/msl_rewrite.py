"""
accel/emu/msl_rewrite.py — turns a Metal Shading Language file into C++ for the CPU emulator,
line for line, so that g++ (and every report of the emulator) names the .metal files' lines.

    python accel/emu/msl_rewrite.py accel/metal/gpt2.metal -o build/gpt2.metal.cpp

First the file's quoted includes (`#include "llama.metal"`, found beside the including file)
are spliced in, with #line directives that name the file and line each line was written at
(`splice`; the Metal backend hands this same text to Metal, whose newLibraryWithSource resolves
no include, and accel/metal/lint.py reads it too); <...> includes are left to the compiler.
Then what it rewrites, line for line (everything else is left to msl_emu.h, which
<metal_stdlib> resolves to under `-I accel/emu/include`):
  - address spaces: `device` and `thread` go, `constant` becomes `const`, a `threadgroup`
    variable in a kernel becomes `static thread_local` (one instance per running threadgroup,
    which the emulator core poisons with NaN at each threadgroup start), `threadgroup` on a
    pointer or reference (a parameter, or a local `threadgroup float* p = ...;`) goes;
  - `kernel void f(...)`: `kernel` becomes `static`, the parameters' attributes go, and after the
    file's last line a launcher binds each parameter from its attribute ([[buffer(n)]],
    [[threadgroup(n)]], [[thread_position_in_grid]], ...) and registers the kernel by name;
  - any other `[[...]]` attribute goes.
Comments are blanked (newlines kept). The .metal files themselves are never edited.
"""
import argparse
import bisect
import os
import re
import sys

ADDRESS_SPACES = re.compile(r"\b(device|constant|thread|threadgroup)\b")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]*)".*$', re.M)
LINE_DIRECTIVE = re.compile(r'^#line (\d+) "((?:[^"\\\n]|\\.)*)"$', re.M)
KERNEL = re.compile(r"\b(kernel)\s+void\s+(\w+)\s*\(")
ATTRIBUTE = re.compile(r"\[\[(.*?)\]\]", re.S)
POSITION_ATTRIBUTES = {
    "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
    "threads_per_threadgroup", "threads_per_grid", "threadgroups_per_grid",
    "thread_index_in_threadgroup", "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup",
    "threads_per_simdgroup", "simdgroups_per_threadgroup",
}


class RewriteError(Exception):
    pass


def blank(text):
    """Spaces for every character of text but its newlines."""
    return re.sub(r"[^\n]", " ", text)


def blank_comments(source, strings=False):
    """source with its comments blanked (and its string literals, #include's and #line's file
    names, where strings is true), every position and newline kept."""
    out, i, n = [], 0, len(source)
    while i < n:
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif source[i] == '"':   # a string (a file's name): kept as it is, unless strings
            j = i + 1
            while j < n and source[j] != '"':
                j += 2 if source[j] == "\\" else 1
            out.append(blank(source[i:j + 1]) if strings else source[i:j + 1])
            i = j + 1
            continue
        else:
            out.append(source[i])
            i += 1
            continue
        out.append(blank(source[i:j]))
        i = j
    return "".join(out)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def c_string(text):
    """text as a C string literal."""
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


def line_directive(line, path):
    """A #line directive: the next line is `line` of `path`."""
    return f"#line {line} {c_string(path)}\n"


def splice(path, name=None, including=()):
    """The MSL file `path` as one text: each quoted #include replaced by the included file's text
    (spliced the same way), and #line directives naming the file and line each line was written
    at, first and after each include, so that a compiler given the text and the emulator's
    reports name the right file. `name`: how they name path (default: as given); an included
    file is named by its includer's folder and its own name, as a C preprocessor names it.
    `including`: the real paths of the files whose includes lead here (an include cycle is an
    error, not a recursion without end)."""
    name = name or path
    if os.path.realpath(path) in including:
        raise RewriteError(f"{name}: included again from within itself (an include cycle)")
    try:
        with open(path) as f:
            source = f.read()
    except OSError as e:
        raise RewriteError(f"cannot read {name}: {e.strerror}")
    code = blank_comments(source)
    out, pos = [line_directive(1, name)], 0
    for m in INCLUDE.finditer(code):
        included = os.path.join(os.path.dirname(path), m.group(1))
        if not os.path.isfile(included):
            raise RewriteError(f'{name}:{line_of(code, m.start())}: #include "{m.group(1)}": no such file '
                               f"beside {name}")
        text = splice(included, os.path.join(os.path.dirname(name), m.group(1)),
                      including + (os.path.realpath(path),))
        out += [source[pos:m.start()], text, "" if text.endswith("\n") else "\n",
                line_directive(line_of(code, m.start()) + 1, name)]
        pos = min(m.end() + 1, len(source))   # past the include's line
    out.append(source[pos:])
    return "".join(out)


class Origins:
    """Where each position of a text was written, (file, line), by its #line directives as a
    compiler reads them; before the first, `path` and the line counted from the text's start."""

    def __init__(self, text, path):
        self.text = text
        self.marks = [(0, path, 1)] + [(m.end() + 1, re.sub(r"\\(.)", r"\1", m.group(2)), int(m.group(1)))
                                       for m in LINE_DIRECTIVE.finditer(text)]
        self.starts = [start for start, _, _ in self.marks]

    def __call__(self, pos):
        start, path, line = self.marks[bisect.bisect_right(self.starts, pos) - 1]
        return path, line + self.text.count("\n", start, pos)


def matching_paren(text, open_pos):
    depth = 0
    for i in range(open_pos, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise RewriteError(f"line {line_of(text, open_pos)}: unbalanced parentheses")


def split_params(text):
    """(start, end) spans of the top-level comma-separated parameters of text."""
    spans, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        elif ch == "," and depth == 0:
            spans.append((start, i))
            start = i + 1
    if text[start:].strip():
        spans.append((start, len(text)))
    return spans


def address_space(token, text, pos):
    """What an address-space keyword at pos becomes."""
    if token == "constant":
        return "const"
    if token == "threadgroup":
        before = text[:pos].rstrip()
        declarator = re.match(r"[^;=\[(]*", text[pos + len(token):]).group(0)
        if (not before or before[-1] in ";{}") and not re.search(r"[*&]", declarator):
            return "static thread_local"   # a threadgroup variable declared in a kernel
    return ""   # a pointer or reference to threadgroup memory, a parameter: an ordinary one


def rewrite_type(type_text):
    return ADDRESS_SPACES.sub(lambda m: address_space(m.group(1), "x", 1), type_text).strip()


def kernel_launcher(name, params, origin):
    """The launcher and registration of kernel `name`: its parameters (type, name, attribute,
    (file, line)) bound from their attributes, registered with origin, its (file, line)."""
    args = []
    for type_text, param_name, attribute, (file, line) in params:
        where = f"{file}:{line}: kernel '{name}', parameter '{param_name}'"
        if attribute is None:
            raise RewriteError(f"{where}: a kernel parameter needs an attribute ([[buffer(n)]], ...)")
        ctype = rewrite_type(type_text)
        m = re.fullmatch(r"\s*(buffer|threadgroup)\s*\(\s*(\d+)\s*\)\s*", attribute)
        if m:
            binder = "buffer_arg" if m.group(1) == "buffer" else "threadgroup_arg"
            args.append(f"::emu_msl::{binder}<{ctype}>({m.group(2)})")
        elif attribute.strip() in POSITION_ATTRIBUTES:
            args.append(f"::emu_msl::position<{ctype}>(EMU_MSL_ATTR_{attribute.strip()})")
        else:
            raise RewriteError(f"{where}: attribute [[{attribute.strip()}]] is not emulated")
    return (f"static void emu_msl_launch_{name}() {{ {name}({', '.join(args)}); }}\n"
            f"static ::emu_msl::Registration emu_msl_registration_{name}(\"{name}\", "
            f"emu_msl_launch_{name}, {c_string(origin[0])}, {origin[1]});\n")


def rewrite(source, path):
    """The C++ of MSL text `source` (spliced: its #line directives name where each line was
    written; `path` names the lines before the first), line for line."""
    origins = Origins(source, path)
    text = blank_comments(source)             # what is written out: the #line directives kept
    code = blank_comments(source, strings=True)   # what is read: their file names blanked too
    edits = []        # (start, end, replacement), non-overlapping
    launchers = []
    for m in KERNEL.finditer(code):
        name = m.group(2)
        edits.append((m.start(1), m.end(1), "static"))
        open_pos = m.end() - 1
        close = matching_paren(code, open_pos)
        params = []
        inner = code[open_pos + 1:close]
        for start, end in split_params(inner):
            param = inner[start:end]
            attrs = list(ATTRIBUTE.finditer(param))
            declaration = ATTRIBUTE.sub(lambda a: blank(a.group(0)), param)
            ident = re.search(r"(\w+)\s*$", declaration)
            if not ident:
                file, line = origins(open_pos + 1 + start)
                raise RewriteError(f"{file}:{line}: cannot read a parameter of kernel '{name}'")
            params.append((declaration[:ident.start()], ident.group(1),
                           attrs[0].group(1) if attrs else None,
                           origins(open_pos + 1 + start + len(param) - len(param.lstrip()))))
        launchers.append(kernel_launcher(name, params, origins(m.start())))
    for m in ATTRIBUTE.finditer(code):
        edits.append((m.start(), m.end(), blank(m.group(0))))
    for m in ADDRESS_SPACES.finditer(code):
        edits.append((m.start(), m.end(), address_space(m.group(1), code, m.start())))
    edits.sort()
    out, pos = [], 0
    for start, end, replacement in edits:
        if start < pos:   # inside an attribute already blanked
            continue
        out.append(text[pos:start])
        out.append(replacement)
        pos = end
    out.append(text[pos:])
    body = "".join(out)
    if not launchers:
        raise RewriteError(f"{path}: no kernel functions")
    return body + ("" if body.endswith("\n") else "\n") + "".join(launchers)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a .metal file")
    parser.add_argument("-o", "--output", required=True, help="the C++ file to write")
    parser.add_argument("--name", help="the path reports name (default: source as given)")
    args = parser.parse_args(argv)
    name = args.name or args.source
    try:
        cpp = rewrite(splice(args.source, name), name)
    except RewriteError as e:
        sys.exit(f"msl_rewrite: {e}")
    with open(args.output, "w") as f:
        f.write(cpp)


if __name__ == "__main__":
    main()
