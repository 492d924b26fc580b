"""
Copies of accel/metal's kernel sources with faults planted in them, for the Metal tests
(test_metal_emu.py, test_metal_half.py): gpt2.metal and the files it #includes (llama.metal,
flash.metal) copied into one folder, so that the copy of gpt2.metal, which the tests build with
`make metal-emu METAL_SOURCE=...`, finds its includes beside it as the original does.

    source, [(file, line)] = patched(tmp_path / "no-barrier", [(old, new)])

Each `old` must occur exactly once among the files; it is replaced in whichever holds it (a
Llama or classifier kernel's fault lands in llama.metal, a flash kernel's in flash.metal).
"""
from pathlib import Path

KERNELS = Path(__file__).resolve().parent.parent / "accel" / "metal"
SOURCE = KERNELS / "gpt2.metal"


def patched(folder, replacements):
    """accel/metal's .metal files copied into `folder` (made here) with each (old, new) of
    `replacements` replaced: (the copy of gpt2.metal, [(the copy old was in, old's 1-based
    line there)] in the order of replacements)."""
    texts = {path.name: path.read_text() for path in sorted(KERNELS.glob("*.metal"))}
    assert SOURCE.name in texts and len(texts) > 1, texts.keys()
    where = []
    for old, new in replacements:
        holders = [name for name, text in texts.items() if old in text]
        assert len(holders) == 1 and texts[holders[0]].count(old) == 1, (old, holders)
        text = texts[holders[0]]
        where.append((folder / holders[0], text[:text.index(old)].count("\n") + 1))
        texts[holders[0]] = text.replace(old, new)
    folder.mkdir()
    for name, text in texts.items():
        (folder / name).write_text(text)
    return folder / SOURCE.name, where
