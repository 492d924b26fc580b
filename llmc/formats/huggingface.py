"""
Hugging Face's files, read with NumPy alone: safetensors, and its Llama checkpoints' names
and q/k rows, mapped onto ours (dev/download_llama.py uses both).

    safetensors: an 8-byte little-endian header length N, N bytes of JSON (per tensor its
        dtype, shape and [begin, end) byte offsets into the data that follows; "__metadata__"
        is not a tensor), then the raw little-endian tensor data.

Hugging Face stores each head's q and k rows permuted for its rotate-half RoPE (the first
half of a head's channels paired with the second); llama2.c, Meta and llama.cpp pair adjacent
channels.
"""
import json
import os

import numpy as np

from llmc.formats import FormatError, bfloat16_bits_to_float32, open_file, param_views

# ----------------------------------------------------------------------------
# safetensors

SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
                      "F64": np.dtype("<f8")}


def read_safetensors(path):
    """dict name -> float32 array (read-only views where the file already is float32)."""
    with open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) < 8:
            raise FormatError(path, "too short for a safetensors file")
        header_len = int.from_bytes(prefix, "little")
        if header_len > size - 8:
            raise FormatError(path, f"header length {header_len} runs past the end of the file "
                                    f"({size} bytes): not a safetensors file?")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise FormatError(path, "the header is not JSON: not a safetensors file?") from None
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len) \
        if size > 8 + header_len else np.zeros(0, np.uint8)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise FormatError(path, f"tensor {name} has dtype {info.get('dtype')}, not a float")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end - begin != int(np.prod(shape)) * dtype.itemsize or end > data.size:
            raise FormatError(path, f"tensor {name} of shape {shape} does not fit its bytes "
                                    f"[{begin}, {end})")
        raw = data[begin:end].view(dtype).reshape(shape)
        if info["dtype"] == "BF16":
            tensors[name] = bfloat16_bits_to_float32(raw)
        else:
            tensors[name] = raw.astype(np.float32, copy=False)
    return tensors


# ----------------------------------------------------------------------------
# Hugging Face's Llama checkpoints: the names of its tensors, and its q/k rows

HF_LLAMA_NAMES = {  # ours -> Hugging Face's, {l} the layer
    "tok_embeddings": "model.embed_tokens.weight", "norm": "model.norm.weight",
    "output": "lm_head.weight", "attention_norm": "model.layers.{l}.input_layernorm.weight",
    "wq": "model.layers.{l}.self_attn.q_proj.weight", "wk": "model.layers.{l}.self_attn.k_proj.weight",
    "wv": "model.layers.{l}.self_attn.v_proj.weight", "wo": "model.layers.{l}.self_attn.o_proj.weight",
    "ffn_norm": "model.layers.{l}.post_attention_layernorm.weight",
    "w1": "model.layers.{l}.mlp.gate_proj.weight", "w2": "model.layers.{l}.mlp.down_proj.weight",
    "w3": "model.layers.{l}.mlp.up_proj.weight",
}


def hf_rotate_half_rows(w, n_heads):
    """Adjacent-pair q/k rows (ours) -> Hugging Face's rotate-half order."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def hf_adjacent_pair_rows(w, n_heads):
    """Hugging Face's rotate-half q/k rows -> adjacent pairs (ours); undoes hf_rotate_half_rows."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def llama_from_hf(tensors, hf_config, source="safetensors"):
    """(LlamaConfig, params) from Hugging Face LlamaForCausalLM tensors (name -> array) and its
    config.json (a dict)."""
    from train_llama2 import LlamaConfig   # when called: the formats load without a build
    def get(name):
        if name not in tensors:
            raise FormatError(source, f"no tensor {name}: not a Hugging Face Llama checkpoint?")
        return tensors[name]
    try:
        n_heads = int(hf_config["num_attention_heads"])
        config = LlamaConfig(
            dim=int(hf_config["hidden_size"]), n_layers=int(hf_config["num_hidden_layers"]),
            n_heads=n_heads, n_kv_heads=int(hf_config.get("num_key_value_heads", n_heads)),
            vocab_size=int(hf_config["vocab_size"]), hidden_dim=int(hf_config["intermediate_size"]),
            max_seq_len=int(hf_config["max_position_embeddings"]),
            norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(hf_config.get("rope_theta", 10000.0)),
            shared_classifier=bool(hf_config.get("tie_word_embeddings", False)))
    except KeyError as e:
        raise FormatError(source, f"config.json has no {e.args[0]}: not a Llama config?") from None
    except ValueError as e:
        raise FormatError(source, f"config.json: {e}") from None
    params = np.empty(config.num_parameters(), dtype=np.float32)
    for name, view in param_views(config, params).items():
        per_layer = "{l}" in HF_LLAMA_NAMES[name]
        for l in range(config.n_layers if per_layer else 1):
            hf_name = HF_LLAMA_NAMES[name].format(l=l)
            tensor, target = get(hf_name), (view[l] if per_layer else view)
            if tensor.shape != target.shape:
                raise FormatError(source, f"{hf_name} has shape {tensor.shape}, expected "
                                          f"{target.shape} for {config.describe()}")
            if name in ("wq", "wk"):
                tensor = hf_adjacent_pair_rows(tensor, n_heads if name == "wq" else config.n_kv_heads)
            target[...] = tensor
    return config, params
