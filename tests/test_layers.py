"""
The house's rules, held against its imports (every import: at the top of a file and inside a
function alike, in Python and in Cython):

    layers point one way   kernels <- backends (accel/) <- the model core <- the formats <- the
                           model families <- the run (train.py, generate.py, llmc/'s pieces,
                           the parity and reference scripts) <- the tools (dev/): a module
                           imports from its own layer and the layers below, never above
    nothing reaches dev/   no module outside dev/ imports one of dev/ (the layers say so), nor
                           puts a folder on sys.path to import it by its bare name
    no entry point         no module imports train.py or generate.py: what another needs of
                           them lives in llmc/
    no circles             no modules that import each other, directly or round a loop
    one name, one layer    no two modules of one name in different layers
    by lookup              train.py reaches families and backends through their registries,
                           never by comparing their names

Each rule is also shown to catch a planted line, in a small tree written for it.  Imports by
name (importlib: the registries of families and backends) are lookups, not edges; an import of
a.b is an edge to a.b alone (Python runs a's __init__ first, which may gather its modules'
names without that being a circle).
"""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# bottom up: the layer of a file is the first whose prefixes one of its paths starts with; a
# file no prefix names belongs to the run
LAYERS = [
    ("kernels", ("kernels/",)),
    ("backends", ("accel/",)),
    ("model core", ("llmc/model.", "llmc/recompute.py", "llmc/rope_tables.py")),
    ("formats", ("llmc/formats/",)),
    ("families", ("train_gpt2.", "train_llama2.", "llmc/families.py")),
    ("the run", ()),
    ("tools", ("dev/",)),
]
RUN = [name for name, _ in LAYERS].index("the run")
ENTRY_POINTS = ("train", "generate")
# scripts run by path before anything is built, which put their own folders on sys.path
RUN_BY_PATH = ("setup.py", "accel/codegen.py", "accel/metal/lint.py")
SOURCES = (".py", ".pyx", ".pxd", ".pxi")
SKIPPED = ("tests", "build")   # the tests import anything; build/ holds what Cython generated


def source_files(root):
    """Every source file below root, relative to it, but the tests', the build's and hidden or
    virtual-environment folders'."""
    files = []
    for here, dirs, names in os.walk(root):
        top = here == root
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (top and d in SKIPPED)
                         and not os.path.exists(os.path.join(here, d, "pyvenv.cfg")))
        files += [os.path.relpath(os.path.join(here, n), root).replace(os.sep, "/")
                  for n in sorted(names) if n.endswith(SOURCES)]
    return files


def module_of(path):
    """The dotted module a file is (a .pyx and its .pxd are one; a .pxi is its own)."""
    name = path.rsplit(".", 1)[0].replace("/", ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def layer_of(path):
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(path.startswith(prefix) for prefix in prefixes):
            return index
    return RUN


def without_strings_and_comments(text):
    text = re.sub(r'(?s)""".*?"""' + r"|(?s:'''.*?''')", "", text)
    return re.sub(r"#[^\n]*", "", text)


CYTHON_FROM = re.compile(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+c?import[ \t]+(\([^)]*\)|[^\n]+)", re.M)
CYTHON_IMPORT = re.compile(r"^[ \t]*c?import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)", re.M)


def imports_of(root, path):
    """[(module, names)] that the file imports: `import a.b` is ("a.b", ()), `from a import
    b, c` ("a", ("b", "c")); a Python file's read by ast, a Cython file's by its lines."""
    text = open(os.path.join(root, path), encoding="utf-8").read()
    found = []
    if path.endswith(".py"):
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, ast.Import):
                found += [(alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.append((node.module, tuple(alias.name for alias in node.names)))
        return found
    text = without_strings_and_comments(text)
    for match in CYTHON_FROM.finditer(text):
        names = re.findall(r"[\w.]+", match.group(2).split(" as ")[0])
        found.append((match.group(1), tuple(names)))
    for match in CYTHON_IMPORT.finditer(text):
        found += [(name.strip(), ()) for name in match.group(1).split(",")]
    return found


def import_graph(root):
    """(files {module: [its files]}, edges {(from module, to module): the file that imports})
    between the modules of root's tree.  A name is resolved from root, else (a script's bare
    import of its neighbour) from the importing file's folder."""
    files = {}
    for path in source_files(root):
        files.setdefault(module_of(path), []).append(path)
    edges = {}
    for module, paths in files.items():
        for path in paths:
            folder = os.path.dirname(path).replace("/", ".")
            for name, names in imports_of(root, path):
                for base in (name, f"{folder}.{name}" if folder else None):
                    if base is None:
                        continue
                    targets = [f"{base}.{n}" for n in names if f"{base}.{n}" in files]
                    if base in files and len(targets) < len(names) or not names and base in files:
                        targets.append(base)
                    if targets:
                        for target in targets:
                            if target != module:
                                edges.setdefault((module, target), path)
                        break
    return files, edges


def upward_imports(root):
    """Each import into a higher layer: "FILE (LAYER) imports MODULE (LAYER)"."""
    files, edges = import_graph(root)
    found = []
    for (source, target), path in sorted(edges.items()):
        below, above = layer_of(path), layer_of(files[target][0])
        if above > below:
            found.append(f"{path} ({LAYERS[below][0]}) imports {target} ({LAYERS[above][0]})")
    return found


def sys_path_edits(root):
    """The files outside dev/ that put a folder on sys.path, but RUN_BY_PATH."""
    return [path for path in source_files(root) if layer_of(path) != len(LAYERS) - 1
            and path not in RUN_BY_PATH and path.endswith((".py", ".pyx"))
            and re.search(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=",
                          without_strings_and_comments(open(os.path.join(root, path)).read()))]


def entry_point_imports(root):
    files, edges = import_graph(root)
    return sorted(f"{path} imports {target}" for (_, target), path in edges.items()
                  if target in ENTRY_POINTS)


def circles(root):
    """The strongly connected groups of more than one module (Tarjan's), each sorted."""
    files, edges = import_graph(root)
    out = {m: [] for m in files}
    for source, target in edges:
        out[source].append(target)
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in out[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(files):
        if v not in index:
            visit(v)
    return sorted(groups)


def names_in_two_layers(root):
    """{name: sorted modules} of the module names (the last part) found in two layers."""
    files, _ = import_graph(root)
    by_name = {}
    for module, paths in files.items():
        if not paths[0].endswith(".pxi") and not paths[0].endswith("__init__.py"):
            by_name.setdefault(module.rsplit(".", 1)[-1], []).append((module, layer_of(paths[0])))
    return {name: sorted(m for m, _ in found) for name, found in by_name.items()
            if len({layer for _, layer in found}) > 1}


# ----------------------------------------------------------------------------
# the rules, on this tree

def test_the_tree_is_read_whole():
    files, edges = import_graph(ROOT)
    assert len(files) > 150 and len(edges) > 300
    # a Cython cimport and a Python import inside a function are both edges
    assert ("train_gpt2", "llmc.model") in edges
    assert ("llmc.families", "llmc.model") in edges


def test_layers_point_one_way():
    assert upward_imports(ROOT) == []


def test_nothing_outside_dev_puts_a_folder_on_sys_path():
    assert sys_path_edits(ROOT) == []


def test_no_module_imports_an_entry_point():
    assert entry_point_imports(ROOT) == []


def test_no_import_circles():
    assert circles(ROOT) == []


def test_no_two_modules_of_one_name_in_different_layers():
    assert names_in_two_layers(ROOT) == {}


NAME_COMPARISON = re.compile(r"""(?:family|backend)(?:\s*(?:==|!=)\s*|\.startswith\()["']""")


def test_train_py_compares_no_family_or_backend_name():
    text = open(os.path.join(ROOT, "train.py")).read()
    assert not [line for line in text.splitlines() if NAME_COMPARISON.search(line)]


# ----------------------------------------------------------------------------
# each rule catches a planted line

def plant(tmp_path, files):
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return tmp_path


def test_a_planted_upward_import_is_found(tmp_path):
    root = plant(tmp_path, {
        "llmc/__init__.py": "", "llmc/checkpoint.py": "", "llmc/model.pxd": "",
        "accel/ane/device.py": "def restart():\n    from llmc.checkpoint import x\n",
        "accel/ane/table.pyx": '"""from llmc import nothing"""\nfrom llmc.model cimport Model\n',
        "kernels/gelu.pyx": "from accel.ane import (\n    device)\n",
    })
    assert upward_imports(root) == [
        "accel/ane/device.py (backends) imports llmc.checkpoint (the run)",
        "accel/ane/table.pyx (backends) imports llmc.model (model core)",
        "kernels/gelu.pyx (kernels) imports accel.ane.device (backends)"]


def test_a_planted_reach_into_dev_is_found(tmp_path):
    root = plant(tmp_path, {
        "dev/data/tinyshakespeare.py": "", "llmc/default_data.py": "import dev.data.tinyshakespeare\n",
        "llmc/prepare.py": "import sys\nsys.path.insert(0, 'dev/data')\nimport tinyshakespeare\n",
        "setup.py": "import sys\nsys.path.insert(0, 'accel')\n",
    })
    assert upward_imports(root) == [
        "llmc/default_data.py (the run) imports dev.data.tinyshakespeare (tools)"]
    assert sys_path_edits(root) == ["llmc/prepare.py"]


def test_a_planted_import_of_train_py_is_found(tmp_path):
    root = plant(tmp_path, {"train.py": "", "generate.py": "",
                            "dev/dashboard.py": "def f():\n    import train\n"})
    assert entry_point_imports(root) == ["dev/dashboard.py imports train"]


def test_a_planted_circle_is_found(tmp_path):
    root = plant(tmp_path, {
        "accel/ane/private.py": "from accel.ane.runtime import RuntimeUnavailable\n",
        "accel/ane/runtime.py": "def load():\n    from accel.ane import private\n",
        "accel/ane/plan.py": "from accel.ane import runtime\n",
    })
    assert circles(root) == [["accel.ane.private", "accel.ane.runtime"]]


def test_a_planted_namesake_in_another_layer_is_found(tmp_path):
    root = plant(tmp_path, {"kernels/rope.pyx": "", "llmc/rope.py": "", "accel/hooks.py": "",
                            "accel/ane/hooks.py": ""})
    assert names_in_two_layers(root) == {"rope": ["kernels.rope", "llmc.rope"]}


@pytest.mark.parametrize("line", ['    if args.family == "llama":',
                                  "    if args.backend.startswith('profile:'):"])
def test_a_planted_name_comparison_is_found(line):
    assert NAME_COMPARISON.search(line)
