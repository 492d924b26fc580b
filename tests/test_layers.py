"""The layers don't leak: nothing under accel/ imports a model family or a format module, and
train.py reaches families and backends by lookup, never by comparing their names."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# model families (train_gpt2.pyx, train_llama2.pyx, the registry) and format modules
FORBIDDEN = re.compile(r"^\s*(?:from|import|cimport)\s+(train_\w+|llmc\.formats\S*|llmc\.families)\b",
                       re.M)
# a family's or a backend's name compared with a literal
NAME_COMPARISON = re.compile(r"""(?:family|backend)(?:\s*(?:==|!=)\s*|\.startswith\()["']""")


def test_nothing_under_accel_imports_a_family_or_a_format():
    sources = [p for ext in ("py", "pyx", "pxd") for p in
               glob.glob(os.path.join(ROOT, "accel", "**", f"*.{ext}"), recursive=True)]
    assert len(sources) > 20
    offenders = {os.path.relpath(p, ROOT): FORBIDDEN.findall(open(p).read()) for p in sources}
    assert not {p: found for p, found in offenders.items() if found}


def test_train_py_compares_no_family_or_backend_name():
    text = open(os.path.join(ROOT, "train.py")).read()
    assert not [line for line in text.splitlines() if NAME_COMPARISON.search(line)]


def test_the_checks_see_what_they_look_for():
    """Planted: the lines these tests refuse are found."""
    assert FORBIDDEN.search("    from train_llama2 import Llama2\n")
    assert FORBIDDEN.search("from llmc.formats.llmc import read_checkpoint\n")
    assert NAME_COMPARISON.search('    if args.family == "llama":')
    assert NAME_COMPARISON.search("    if args.backend.startswith('profile:'):")
