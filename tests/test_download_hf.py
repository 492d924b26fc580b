"""
dev/download_hf.py: offline it says so in one line; with huggingface.co reachable (never on the
machines these tests were written on: they skip, saying so) the README's commands fetch
SmolLM2-135M and generate from it.
"""
import os
import subprocess
import sys

from tests import needs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "dev", "download_hf.py")


def test_offline_is_one_line(tmp_path):
    needs.package("huggingface_hub")
    run = subprocess.run([sys.executable, SCRIPT, "HuggingFaceTB/SmolLM2-135M", "-o",
                          str(tmp_path / "m")], capture_output=True, text=True,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert run.returncode == 1 and run.stderr.count("\n") == 1
    assert "(HF_HUB_OFFLINE is set): this needs the internet" in run.stderr


def test_a_bad_repo_name_is_refused(tmp_path):
    run = subprocess.run([sys.executable, SCRIPT, "SmolLM2-135M"], capture_output=True, text=True)
    assert run.returncode == 2 and "is not owner/name" in run.stderr


def test_smollm2_downloads_and_generates(tmp_path):
    needs.package("huggingface_hub")
    needs.hub()
    folder = tmp_path / "SmolLM2-135M"
    run = subprocess.run([sys.executable, SCRIPT, "HuggingFaceTB/SmolLM2-135M", "-o", str(folder)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "LlamaForCausalLM" in run.stdout
    gen = subprocess.run([sys.executable, os.path.join(REPO, "generate.py"), str(folder), "-p",
                          "Once upon a time", "-n", "16", "--temperature", "0"],
                         capture_output=True, text=True)
    assert gen.returncode == 0 and gen.stdout.startswith("Once upon a time"), gen.stderr
