"""
accel/emu/msl_rewrite.py — turns a Metal Shading Language file into C++ for the CPU emulator,
line for line, so that g++ (and every report of the emulator) names the .metal file's lines.

    python accel/emu/msl_rewrite.py accel/metal/gpt2.metal -o build/gpt2.metal.cpp

What it rewrites (everything else is left to msl_emu.h, which <metal_stdlib> resolves to under
`-I accel/emu/include`):
  - address spaces: `device` and `thread` go, `constant` becomes `const`, a `threadgroup`
    variable in a kernel becomes `static thread_local` (one instance per running threadgroup,
    which the emulator core poisons with NaN at each threadgroup start), `threadgroup` on a
    pointer or reference (a parameter, or a local `threadgroup float* p = ...;`) goes;
  - `kernel void f(...)`: `kernel` becomes `static`, the parameters' attributes go, and after the
    file's last line a launcher binds each parameter from its attribute ([[buffer(n)]],
    [[threadgroup(n)]], [[thread_position_in_grid]], ...) and registers the kernel by name;
  - any other `[[...]]` attribute goes.
Comments are blanked (newlines kept). The .metal file itself is never edited.
"""
import argparse
import re
import sys

ADDRESS_SPACES = re.compile(r"\b(device|constant|thread|threadgroup)\b")
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


def blank_comments(source):
    out, i, n = [], 0, len(source)
    while i < n:
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif source[i] == '"':   # a string (an #include's name): kept as it is
            j = i + 1
            while j < n and source[j] != '"':
                j += 2 if source[j] == "\\" else 1
            out.append(source[i:j + 1])
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


def kernel_launcher(name, params, path, line):
    args = []
    for type_text, param_name, attribute, param_line in params:
        where = f"{path}:{param_line}: kernel '{name}', parameter '{param_name}'"
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
            f"emu_msl_launch_{name}, \"{path}\", {line});\n")


def rewrite(source, path):
    text = blank_comments(source)
    edits = []        # (start, end, replacement), non-overlapping
    launchers = []
    for m in KERNEL.finditer(text):
        name = m.group(2)
        edits.append((m.start(1), m.end(1), "static"))
        open_pos = m.end() - 1
        close = matching_paren(text, open_pos)
        params = []
        inner = text[open_pos + 1:close]
        for start, end in split_params(inner):
            param = inner[start:end]
            attrs = list(ATTRIBUTE.finditer(param))
            declaration = ATTRIBUTE.sub(lambda a: blank(a.group(0)), param)
            ident = re.search(r"(\w+)\s*$", declaration)
            if not ident:
                raise RewriteError(f"{path}:{line_of(text, open_pos + 1 + start)}: cannot read a parameter "
                                   f"of kernel '{name}'")
            params.append((declaration[:ident.start()], ident.group(1),
                           attrs[0].group(1) if attrs else None,
                           line_of(text, open_pos + 1 + start + len(param) - len(param.lstrip()))))
        launchers.append(kernel_launcher(name, params, path, line_of(text, m.start())))
    for m in ATTRIBUTE.finditer(text):
        edits.append((m.start(), m.end(), blank(m.group(0))))
    for m in ADDRESS_SPACES.finditer(text):
        edits.append((m.start(), m.end(), address_space(m.group(1), text, m.start())))
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
    return f'#line 1 "{path}"\n' + body + ("" if body.endswith("\n") else "\n") + "".join(launchers)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a .metal file")
    parser.add_argument("-o", "--output", required=True, help="the C++ file to write")
    parser.add_argument("--name", help="the path reports name (default: source as given)")
    args = parser.parse_args(argv)
    with open(args.source) as f:
        source = f.read()
    try:
        cpp = rewrite(source, args.name or args.source)
    except RewriteError as e:
        sys.exit(f"msl_rewrite: {e}")
    with open(args.output, "w") as f:
        f.write(cpp)


if __name__ == "__main__":
    main()
