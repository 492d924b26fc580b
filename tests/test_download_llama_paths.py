"""
dev/download_llama.py --from-safetensors takes what dev/download_gpt2.py's takes: a Hugging Face
model folder (single or sharded) or a .safetensors file (its config.json beside it or in its
metadata), each converted to the same llama2.c file; anything else is refused in one line that
says what was expected.
"""
import json
import os
import sys

import numpy as np
import pytest

from llmc.formats.huggingface import llama_from_hf
from llmc.formats.llama2c import read_llama_model
from tests import needs
from tests.hf_models import PATH_KINDS, checkpoint_path, make_hf_model
from tests.test_download_gpt2 import hf_gpt2_tensors, write_safetensors
from train_llama2 import LlamaConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev"))
import download_llama  # noqa: E402


@pytest.fixture(scope="module")
def tinyllama(tmp_path_factory):
    """(the folder, the transformers model) of a small TinyLlama (tests/hf_models.py): Llama 2's
    block, which llama2.c's file holds."""
    needs.package("torch")
    needs.package("transformers")
    folder = tmp_path_factory.mktemp("hf") / "tinyllama"
    return folder, make_hf_model("tinyllama", folder)


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_takes_a_model_folder_or_a_safetensors_file(tinyllama, tmp_path, kind):
    folder, hf_model = tinyllama
    path = checkpoint_path(kind, folder, hf_model, tmp_path)
    download_llama.main(["--from-safetensors", str(path), "-o", str(tmp_path / "out.bin")])
    config, params = read_llama_model(tmp_path / "out.bin", LlamaConfig)
    transformers_tensors = {name: t.numpy() for name, t in hf_model.state_dict().items()}
    hf_config = json.loads((folder / "config.json").read_text())
    expected_config, expected = llama_from_hf(transformers_tensors, hf_config, LlamaConfig)
    assert config == expected_config
    np.testing.assert_array_equal(params, expected)


def test_a_path_neither_folder_nor_safetensors_file_is_refused_in_one_line(tinyllama, tmp_path):
    def error_of(path):
        with pytest.raises(SystemExit) as e:
            download_llama.main(["--from-safetensors", str(path), "-o", str(tmp_path / "x.bin")])
        assert "\n" not in str(e.value) and str(e.value).startswith(
            f"download_llama.py: error: {path}: "), e.value
        return str(e.value)
    expected = "expected a Hugging Face model folder (config.json and model.safetensors, "
    makes_one = "python dev/download_hf.py REPO makes one) or a .safetensors file"
    for what, path in (("no such file or folder", tmp_path / "missing"),
                       ("a folder without config.json", tmp_path)):
        message = error_of(path)
        assert f"{path}: {what}: {expected}" in message and makes_one in message
    folder, _ = tinyllama
    download_llama.main(["--from-safetensors", str(folder), "-o", str(tmp_path / "llama2c.bin")])
    assert f"llama2c.bin: a llama2.c model: {expected}" in error_of(tmp_path / "llama2c.bin")
    # a Llama's file needs its config.json: a GPT-2's heads can be guessed, a Llama's cannot
    write_safetensors(tmp_path / "bare.safetensors", hf_gpt2_tensors())
    assert "a safetensors file without its config" in error_of(tmp_path / "bare.safetensors")
    # a GPT-2's folder names the script that converts it
    (tmp_path / "config.json").write_text(json.dumps(dict(architectures=["GPT2LMHeadModel"],
                                                          model_type="gpt2")))
    assert error_of(tmp_path).endswith(
        "GPT2LMHeadModel is not a Llama: dev/download_gpt2.py converts it")
    assert not (tmp_path / "x.bin").exists()
