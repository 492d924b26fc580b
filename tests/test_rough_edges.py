"""
The rough edges of issue 26, each as a user meets it: parity under a lower-precision backend
uses that backend's tolerances and says so; a backend that cannot run exits 1 from train.py
and test_gpt2.py alike, an unknown one hints at hip for NVIDIA; the config table, --help,
the scripts' help, the dry run and loss.png say what is so; a failed TinyStories download
leaves no empty folder.
"""
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import needs
import test_gpt2
from llmc.formats.llmc import write_shard
from llmc.logger import plot_losses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *map(str, args)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_parity_uses_a_lower_precision_backends_own_tolerances():
    fp32 = types.SimpleNamespace(name="cpu", tolerances={})
    assert test_gpt2.parity_tolerances(fp32) == (
        (1e-4, 1e-3, 1e-3), "tolerances fp32: logits 0.0001, gradients 0.001, step losses 0.001")
    fp16 = types.SimpleNamespace(name="half", tolerances={"matmul_forward": 4e-3, "x": 8e-3})
    (tolerances, line) = test_gpt2.parity_tolerances(fp16)
    assert tolerances == (8e-3, 8e-3, 8e-3)
    assert line.startswith("tolerances half's, lower precision (its loosest entry 0.008)")


@pytest.mark.parametrize("script", ["test_gpt2.py", "test_llama2.py"])
def test_parity_on_ane_emu_passes_at_fp16_tolerances(script):
    needs.emulator("ane-emu")
    done = run(script, "--backend", "ane-emu")
    assert re.search(r"^tolerances ane-emu's, lower precision \(its loosest entry 0\.008\)",
                     done.stdout, re.M), done.stdout
    assert done.stdout.rstrip().endswith("overall okay: 1") and done.returncode == 0


@pytest.mark.parametrize("backend, message", [
    ("cuda", "unknown backend 'cuda' (available here: "),
    ("metal", "backend 'metal' is unavailable: "),
])
def test_a_backend_that_cannot_run_exits_1_everywhere(backend, message):
    if backend == "metal" and sys.platform == "darwin":
        pytest.skip("Metal runs here")
    for script, args in (("train.py", ["-e", "d1", "-x", 1]), ("test_gpt2.py", [])):
        done = run(script, *args, "--backend", backend)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert lines[0].startswith(f"{script}: error: {message}")
        if backend == "cuda":
            assert "NVIDIA GPUs run through hip" in lines[0]


def test_config_table_says_constant_without_decay(tmp_path):
    write_shard(tmp_path / "train_000.bin", np.arange(3000) % 50257)
    common = ["-e", "d1", "-b", 1, "-t", 8, "-x", 1, "-m", 0, "-s", 0,
              "-i", tmp_path / "train_000.bin", "-j", tmp_path / "train_000.bin"]
    for q, schedule in ((1.0, "constant"), (0.1, "cosine")):
        done = run("train.py", *common, "-q", q)
        assert done.returncode == 0, done.stderr
        assert re.search(rf"^\| LR schedule +\| {schedule} +\|$", done.stdout, re.M), q


def test_help_texts():
    assert "on the CPU (" not in run("train.py", "--help").stdout
    for script in ("dev/export.py", "dev/download_llama.py", "dev/data/text_to_shards.py",
                   "dev/data/tinyshakespeare.py", "test_gpt2.py", "test_llama2.py"):
        text = run(script, "--help").stdout
        description = text.split("\n\n")[1]   # after the usage
        assert not description.rstrip().endswith(":"), (script, description)


def test_dry_run_counts_one_layer_in_the_singular():
    done = run("train.py", "-e", "d1", "--dry-run")
    assert "(1 layer's internals, 1 layer output kept of 1)" in done.stdout, done.stdout


def test_a_failed_tinystories_download_leaves_no_empty_folder(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "dev", "data"))
    import tinystories

    def offline(*args, **kwargs):
        raise OSError("no network")
    folder = tmp_path / "tinystories"
    monkeypatch.setattr(tinystories, "DATA_CACHE_DIR", str(folder))
    monkeypatch.setattr(tinystories, "download_file", offline)
    with pytest.raises(SystemExit, match="cannot download TinyStories"):
        tinystories.main([])
    assert not folder.exists()
    with pytest.raises(SystemExit) as done:   # --help says what it does and downloads nothing
        tinystories.main(["--help"])
    assert done.value.code == 0 and not folder.exists()


def test_loss_plot_counts_steps_as_the_console_and_names_the_run(tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    (tmp_path / "main.log").write_text(
        "s:0 tel:5.0000\n" + "".join(f"s:{s} trl:{4 - s / 4:.4f} lr:0.000100 norm:1.00\n"
                                     for s in range(3)) + "s:3 tel:3.0000\n")
    plot_losses(str(tmp_path), "GPT-2 d2 on data/train_*.bin")
    ax = figures[0].axes[0]
    assert ax.get_title() == "GPT-2 d2 on data/train_*.bin"
    train_line, val_line = ax.get_lines()
    assert list(train_line.get_xdata()) == [1, 2, 3]   # step 1 is the first update, as printed
    assert list(val_line.get_xdata()) == [0, 3]
    low, high = ax.get_xlim()
    assert all(t == int(t) for t in ax.get_xticks() if low <= t <= high)


# --- issue 37's items ------------------------------------------------------------------------

def test_a_near_miss_of_a_preset_is_suggested():
    line = run("train.py", "-e", "stories15m", "-x", "1").stderr.strip()
    assert line.endswith("-e stories15m: no such model file (nor dN, a random GPT-2 of depth N); "
                         "did you mean stories15M?")
    line = run("train.py", "-e", "qwen3-0.6b", "--family", "llama", "-x", "1").stderr.strip()
    assert line.endswith("did you mean Qwen3-0.6B?")
    line = run("train.py", "-e", "nothing-like-it", "--family", "llama", "-x", "1").stderr.strip()
    assert "; the presets: stories15M, stories42M" in line and line.count("\n") == 0


def test_a_text_file_as_data_names_the_script_that_makes_shards_of_it(tmp_path):
    (tmp_path / "my.txt").write_text("Some text a user meant to train on.\n" * 50)
    run_ = run("train.py", "-e", "d2", "-i", tmp_path / "my.txt", "-j", tmp_path / "my.txt",
               "-x", "1")
    assert run_.returncode == 1 and run_.stderr.count("\n") == 1
    assert run_.stderr.endswith(f"(it begins like a text file: make token shards of it with "
                                f"python dev/data/text_to_shards.py {tmp_path / 'my.txt'})\n")
