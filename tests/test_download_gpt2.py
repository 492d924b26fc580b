"""
dev/download_gpt2.py's converter (llmc/formats/huggingface.py's gpt2_from_hf), offline: a small
GPT-2 written here as Hugging Face lays it out in model.safetensors (Conv1D weights stored (in,
out), an attention-mask buffer, metadata) must come out as llm.c's model file with every tensor
in place.  --from-safetensors takes what dev/download_llama.py's takes: a model folder (single
or sharded) or a .safetensors file, its heads from config.json; anything else is refused in one
line that says what was expected.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from llmc.formats import bfloat16_bits_to_float32, float32_to_bfloat16_bits, param_views
from llmc.formats.huggingface import gpt2_from_hf, read_safetensors
from llmc.formats.llmc import read_checkpoint
from tests import needs
from tests.hf_models import PATH_KINDS, checkpoint_path, make_hf_model
from train_gpt2 import GPT2Config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "dev"))
import download_gpt2  # noqa: E402

V, maxT, L, C = 100, 16, 2, 128  # heads: C / 64 = 2


def hf_gpt2_tensors(seed=0):
    rng = np.random.default_rng(seed)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    t = {"wte.weight": r(V, C), "wpe.weight": r(maxT, C), "ln_f.weight": r(C), "ln_f.bias": r(C)}
    for l in range(L):
        t.update({
            f"h.{l}.ln_1.weight": r(C), f"h.{l}.ln_1.bias": r(C),
            f"h.{l}.attn.c_attn.weight": r(C, 3 * C), f"h.{l}.attn.c_attn.bias": r(3 * C),
            f"h.{l}.attn.c_proj.weight": r(C, C), f"h.{l}.attn.c_proj.bias": r(C),
            f"h.{l}.ln_2.weight": r(C), f"h.{l}.ln_2.bias": r(C),
            f"h.{l}.mlp.c_fc.weight": r(C, 4 * C), f"h.{l}.mlp.c_fc.bias": r(4 * C),
            f"h.{l}.mlp.c_proj.weight": r(4 * C, C), f"h.{l}.mlp.c_proj.bias": r(C),
            f"h.{l}.attn.bias": np.tril(np.ones((1, 1, maxT, maxT), np.float32)),  # a buffer
        })
    return t


def write_safetensors(path, tensors, dtype="F32", prefix=""):
    """The safetensors layout: u64 header length, JSON header, raw little-endian data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, array in tensors.items():
        if dtype == "F32":
            raw = array.astype("<f4").tobytes()
        elif dtype == "F16":
            raw = array.astype("<f2").tobytes()
        else:  # BF16
            raw = float32_to_bfloat16_bits(array).astype("<u2").tobytes()
        header[prefix + name] = {"dtype": dtype, "shape": list(array.shape),
                                 "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def as_f16(a):
    return a.astype(np.float16).astype(np.float32)


def as_bf16(a):
    return bfloat16_bits_to_float32(float32_to_bfloat16_bits(a))


def check_layout(config, params, hf, rounded=lambda a: a):
    """params hold exactly hf's tensors (as stored: rounded), in llm.c's layout."""
    assert (config.max_seq_len, config.vocab_size, config.padded_vocab_size,
            config.num_layers, config.num_heads, config.channels) == (maxT, V, 128, L, 2, C)
    p = param_views(config, params)

    def same(a, b):
        np.testing.assert_array_equal(a, rounded(b))
    same(p["wte"][:V], hf["wte.weight"])
    assert not p["wte"][V:].any()  # padded rows
    same(p["wpe"], hf["wpe.weight"])
    for l in range(L):
        same(p["ln1w"][l], hf[f"h.{l}.ln_1.weight"])
        same(p["ln1b"][l], hf[f"h.{l}.ln_1.bias"])
        same(p["qkvw"][l], hf[f"h.{l}.attn.c_attn.weight"].T)  # Conv1D (in, out) -> (out, in)
        same(p["qkvb"][l], hf[f"h.{l}.attn.c_attn.bias"])
        same(p["attprojw"][l], hf[f"h.{l}.attn.c_proj.weight"].T)
        same(p["attprojb"][l], hf[f"h.{l}.attn.c_proj.bias"])
        same(p["ln2w"][l], hf[f"h.{l}.ln_2.weight"])
        same(p["ln2b"][l], hf[f"h.{l}.ln_2.bias"])
        same(p["fcw"][l], hf[f"h.{l}.mlp.c_fc.weight"].T)
        same(p["fcb"][l], hf[f"h.{l}.mlp.c_fc.bias"])
        same(p["fcprojw"][l], hf[f"h.{l}.mlp.c_proj.weight"].T)
        same(p["fcprojb"][l], hf[f"h.{l}.mlp.c_proj.bias"])
    same(p["lnfw"], hf["ln_f.weight"])
    same(p["lnfb"], hf["ln_f.bias"])


def test_convert_to_llmc_checkpoint(tmp_path):
    hf = hf_gpt2_tensors()
    write_safetensors(tmp_path / "model.safetensors", hf)
    download_gpt2.main(["--from-safetensors", str(tmp_path / "model.safetensors"),
                        "-o", str(tmp_path / "out.bin")])
    config, params = read_checkpoint(tmp_path / "out.bin", GPT2Config)
    check_layout(config, params, hf)


@pytest.mark.parametrize("dtype, rounded", [("F16", as_f16), ("BF16", as_bf16)])
def test_half_precision_and_prefixed_names(tmp_path, dtype, rounded):
    hf = hf_gpt2_tensors(1)
    write_safetensors(tmp_path / "m.safetensors", hf, dtype=dtype, prefix="transformer.")
    config, params = gpt2_from_hf(read_safetensors(tmp_path / "m.safetensors"), GPT2Config)
    check_layout(config, params, hf, rounded)


def test_cli_writes_bf16(tmp_path):
    hf = hf_gpt2_tensors(2)
    write_safetensors(tmp_path / "model.safetensors", hf)
    out = tmp_path / "gpt2_bf16.bin"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "download_gpt2.py"),
                          "--from-safetensors", str(tmp_path / "model.safetensors"),
                          "-o", str(out), "--bf16"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    config, params = read_checkpoint(out, GPT2Config)
    check_layout(config, params, hf, as_bf16)  # written as bf16


def test_bad_inputs_one_line_errors(tmp_path):
    script = os.path.join(ROOT, "dev", "download_gpt2.py")

    def error_of(path):
        run = subprocess.run([sys.executable, script, "--from-safetensors", str(path),
                              "-o", str(tmp_path / "x.bin")], capture_output=True, text=True)
        assert run.returncode == 1
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("download_gpt2.py: error: "), run.stderr
        return lines[0]
    assert "no such file" in error_of(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{\"abc")
    assert "not JSON" in error_of(tmp_path / "junk.safetensors")
    hf = hf_gpt2_tensors()
    del hf["h.1.mlp.c_fc.weight"]
    write_safetensors(tmp_path / "partial.safetensors", hf)
    assert "no tensor h.1.mlp.c_fc.weight" in error_of(tmp_path / "partial.safetensors")
    hf = hf_gpt2_tensors()
    hf["h.0.attn.c_proj.weight"] = hf["h.0.attn.c_proj.weight"][:, :5]
    write_safetensors(tmp_path / "shape.safetensors", hf)
    assert "h.0.attn.c_proj.weight has shape" in error_of(tmp_path / "shape.safetensors")
    assert not (tmp_path / "x.bin").exists()


def test_offline_download_is_one_line(tmp_path, monkeypatch):
    # nothing listens on port 9 of this machine: the download fails at once, as offline
    monkeypatch.setattr(download_gpt2, "HF_URL", "http://127.0.0.1:9/{model}/{file}")
    with pytest.raises(SystemExit) as e:
        download_gpt2.main(["-o", str(tmp_path / "gpt2.bin")])
    assert str(e.value).startswith("download_gpt2.py: error: cannot download from Hugging Face")
    assert "\n" not in str(e.value)
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    """(the folder, the transformers model) of a GPT2LMHeadModel of 4 heads on 64 channels
    (tests/hf_models.py): channels / 64 would give 1 head."""
    needs.package("torch")
    needs.package("transformers")
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    return folder, make_hf_model("gpt2", folder)


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_takes_a_model_folder_or_a_safetensors_file(hf_gpt2, tmp_path, kind):
    folder, hf_model = hf_gpt2
    path = checkpoint_path(kind, folder, hf_model, tmp_path)
    download_gpt2.main(["--from-safetensors", str(path), "-o", str(tmp_path / "out.bin")])
    config, params = read_checkpoint(tmp_path / "out.bin", GPT2Config)
    transformers_tensors = {name: t.numpy() for name, t in hf_model.state_dict().items()}
    _, expected = gpt2_from_hf(transformers_tensors, GPT2Config, num_heads=4)
    assert config.num_heads == 4   # config.json's n_head
    np.testing.assert_array_equal(params, expected)


def test_a_path_neither_folder_nor_safetensors_file_is_refused_in_one_line(tmp_path):
    def error_of(path):
        with pytest.raises(SystemExit) as e:
            download_gpt2.main(["--from-safetensors", str(path), "-o", str(tmp_path / "x.bin")])
        assert "\n" not in str(e.value) and str(e.value).startswith(
            f"download_gpt2.py: error: {path}: "), e.value
        return str(e.value)
    expected = "expected a Hugging Face model folder (config.json and model.safetensors, "
    makes_one = "python dev/download_hf.py REPO makes one) or a .safetensors file"
    for what, path in (("no such file or folder", tmp_path / "missing"),
                       ("a folder without config.json", tmp_path)):
        message = error_of(path)
        assert f"{path}: {what}: {expected}" in message and makes_one in message
    write_safetensors(tmp_path / "model.safetensors", hf_gpt2_tensors())
    download_gpt2.main(["--from-safetensors", str(tmp_path / "model.safetensors"),
                        "-o", str(tmp_path / "llmc.bin")])
    assert f"llmc.bin: an llm.c model: {expected}" in error_of(tmp_path / "llmc.bin")
    # a Llama's folder names the script that converts it, not a GPT-2 key it lacks
    (tmp_path / "config.json").write_text(json.dumps(dict(architectures=["LlamaForCausalLM"],
                                                          model_type="llama")))
    assert error_of(tmp_path).endswith(
        "LlamaForCausalLM is not a GPT-2: dev/download_llama.py converts it")
    assert not (tmp_path / "x.bin").exists()


def test_openai_configs_keys_are_read():
    """gpt2-medium's and -large's config.json carry n_special 0 and predict_special_tokens:
    read; a config with special tokens of its own is refused, naming the key."""
    from llmc.formats import FormatError
    from llmc.formats.huggingface import gpt2_config_checked
    config = dict(n_embd=1024, n_head=16, n_layer=24, n_special=0, predict_special_tokens=True)
    assert gpt2_config_checked(config, "config.json") == 16
    with pytest.raises(FormatError, match=r"n_special=2 is not implemented \(GPT-2's is 0\)"):
        gpt2_config_checked(dict(config, n_special=2), "config.json")
