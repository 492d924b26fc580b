"""
Hugging Face's files: safetensors read with NumPy alone and written with the safetensors
package, and transformers' model folders of both families, out and back (dev/download_gpt2.py
and dev/download_llama.py read them, dev/export.py writes them).

    safetensors: an 8-byte little-endian header length N, N bytes of JSON (per tensor its
        dtype, shape and [begin, end) byte offsets into the data that follows; "__metadata__"
        is not a tensor), then the raw little-endian tensor data.
    GPT-2, as GPT2LMHeadModel: its Linear layers are Conv1D, whose weights are stored (in,
        out) where llm.c stores (out, in); wte holds the real vocabulary (llm.c pads its rows
        to a multiple of 128) and is the head too.  OpenAI's own files name the tensors
        without GPT2LMHeadModel's "transformer." before them.
    Llama, as LlamaForCausalLM, and the models built on its block (MistralForCausalLM,
        Qwen2ForCausalLM with a bias on q, k and v, Qwen3ForCausalLM with QK-norm and a head
        size of its own): each head's q and k rows (and their biases and norms) are permuted
        for its rotate-half RoPE (the first half of a head's channels paired with the second);
        llama2.c, Meta and llama.cpp pair adjacent channels.  config.json is read strictly: a
        key that would change the model and is not implemented here is refused by name.
    a model folder: config.json, generation_config.json, model.safetensors (or its shards and
        model.safetensors.index.json) and the tokenizer's files with the tokenizer_config.json
        that names their class: GPT-2's byte-level BPE as vocab.json and merges.txt (the merges
        rebuilt from the ranks, llmc/formats/gguf.py), or a SentencePiece vocabulary's
        tokenizer.model.
    a model file: one safetensors file whose metadata holds its config.json ("config"), as a
        run's checkpoints of a model llama2.c's files cannot hold are written (or a
        safetensors file with config.json beside it).
"""
import json
import os
import secrets
import shutil
from collections.abc import Mapping

import numpy as np

from llmc.formats.common import (ROTATED, FormatError, atomic_write, bfloat16_bits_to_float32,
                                 float32_to_bfloat16_bits, hf_adjacent_pair_rows,
                                 hf_rotate_half_rows, open_file, param_views, rotated_heads)
from llmc.formats.gguf import gpt2_spelled
from llmc.formats.llama2c import sentencepiece_processor

# ----------------------------------------------------------------------------
# safetensors

SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
                      "F64": np.dtype("<f8")}


class SafetensorsTensors(Mapping):
    """A safetensors file's tensors, name -> float32 array, each read from the file when it is
    asked for (and widened from bf16 or f16): loading a model holds one tensor of the file at a
    time beside the model, never a second full copy (nor the file's pages, as a map would);
    metadata: the file's own strings."""

    def __init__(self, path, where, metadata):
        self.path, self.where, self.metadata = path, where, metadata

    def __getitem__(self, name):
        offset, dtype, shape, name_of_dtype = self.where[name]
        with open(self.path, "rb") as f:
            f.seek(offset)
            raw = np.fromfile(f, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
        return bfloat16_bits_to_float32(raw) if name_of_dtype == "BF16" else \
            raw.astype(np.float32, copy=False)

    def __iter__(self):
        return iter(self.where)

    def __len__(self):
        return len(self.where)

    def dtypes(self):
        """The dtypes the file stores, by safetensors' names ("BF16")."""
        return sorted({where[3] for where in self.where.values()})


def read_safetensors(path):
    """name -> float32 array of a safetensors file (a SafetensorsTensors: each tensor read from
    the file when it is asked for), its header checked now."""
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
    data_size = size - 8 - header_len
    where = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise FormatError(path, f"tensor {name} has dtype {info.get('dtype')}, not a float")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end - begin != int(np.prod(shape)) * dtype.itemsize or end > data_size:
            raise FormatError(path, f"tensor {name} of shape {shape} does not fit its bytes "
                                    f"[{begin}, {end})")
        where[name] = (8 + header_len + begin, dtype, shape, info["dtype"])
    return SafetensorsTensors(path, where, header.get("__metadata__") or {})


def write_safetensors(path, tensors, dtype="float32", metadata=None):
    """Write name -> float32 array as a safetensors file of dtype "float32" or "bfloat16"
    (rounded to the nearest, ties to even), through the safetensors package, with metadata
    (str -> str) beside transformers' own; all or nothing (atomic_write)."""
    try:
        from safetensors import TensorSpec, serialize
    except ImportError:
        raise RuntimeError("writing safetensors needs the safetensors package, 0.8 or newer: "
                           "pip install 'safetensors>=0.8'") from None
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"write_safetensors: dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    stored = {name: np.ascontiguousarray(t, dtype="<f4") if dtype == "float32"
              else float32_to_bfloat16_bits(t).astype("<u2", copy=False)
              for name, t in tensors.items()}
    # the specs point into stored's arrays, which live until serialize has copied them
    specs = {name: TensorSpec(dtype=dtype, shape=list(a.shape), data_ptr=a.ctypes.data,
                              data_len=a.nbytes) for name, a in stored.items()}
    atomic_write(path, in_sorted_order(serialize(specs, metadata={"format": "pt",
                                                                  **(metadata or {})})))


def in_sorted_order(serialized):
    """A safetensors file's bytes with its metadata's keys sorted: the safetensors package
    writes them in the order of a hash map seeded anew in each process, so that the same model
    saved twice would be two files of other bytes (a resumed run's and an uninterrupted one's)."""
    length = int.from_bytes(serialized[:8], "little")
    header = json.loads(serialized[8:8 + length])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)   # the data 8-byte aligned, as the package pads it
    return [len(text).to_bytes(8, "little"), text, memoryview(serialized)[8 + length:]]


# ----------------------------------------------------------------------------
# Hugging Face's GPT-2 (GPT2LMHeadModel)

HF_GPT2_PREFIX = "transformer."   # GPT2LMHeadModel's, before every name below
HF_GPT2_NAMES = {  # ours -> (Hugging Face's, {l} the layer; transposed: a Conv1D weight)
    "wte": ("wte.weight", False), "wpe": ("wpe.weight", False),
    "ln1w": ("h.{l}.ln_1.weight", False), "ln1b": ("h.{l}.ln_1.bias", False),
    "qkvw": ("h.{l}.attn.c_attn.weight", True), "qkvb": ("h.{l}.attn.c_attn.bias", False),
    "attprojw": ("h.{l}.attn.c_proj.weight", True), "attprojb": ("h.{l}.attn.c_proj.bias", False),
    "ln2w": ("h.{l}.ln_2.weight", False), "ln2b": ("h.{l}.ln_2.bias", False),
    "fcw": ("h.{l}.mlp.c_fc.weight", True), "fcb": ("h.{l}.mlp.c_fc.bias", False),
    "fcprojw": ("h.{l}.mlp.c_proj.weight", True), "fcprojb": ("h.{l}.mlp.c_proj.bias", False),
    "lnfw": ("ln_f.weight", False), "lnfb": ("ln_f.bias", False),
}


def gpt2_from_hf(tensors, config_class, num_heads=None, source="safetensors"):
    """(config, params float32 in llm.c's layout, wte padded with zero rows) from Hugging
    Face GPT-2 tensors (name -> array, with or without "transformer."), the config a
    config_class (train_gpt2.GPT2Config); num_heads from its config.json's n_head, else
    channels / 64 as in every GPT-2."""
    tensors = {name.removeprefix(HF_GPT2_PREFIX): t for name, t in tensors.items()}

    def get(name):
        if name not in tensors:
            raise FormatError(source, f"no tensor {name}: not a GPT-2 checkpoint?")
        return tensors[name]
    V, C = get("wte.weight").shape
    maxT = get("wpe.weight").shape[0]
    L = 0
    while f"h.{L}.ln_1.weight" in tensors:
        L += 1
    if L == 0:
        raise FormatError(source, "no transformer blocks (h.0.*): not a GPT-2 checkpoint?")
    try:
        config = config_class(max_seq_len=maxT, vocab_size=V,
                              padded_vocab_size=config_class.padded_vocab_size_of(V),
                              num_layers=L, num_heads=num_heads or C // 64, channels=C)
    except ValueError as e:
        raise FormatError(source, str(e)) from None
    params = np.zeros(config.num_parameters(), dtype=np.float32)
    views = param_views(config, params)
    for name, (hf_name, transposed) in HF_GPT2_NAMES.items():
        per_layer = "{l}" in hf_name
        for l in range(L if per_layer else 1):
            tensor = get(hf_name.format(l=l))
            target = views[name][l] if per_layer else views[name]
            if name == "wte":
                target = target[:V]  # the padding rows V..Vp stay zero
            value = tensor.T if transposed else tensor
            if value.shape != target.shape:
                expected = target.shape[::-1] if transposed else target.shape
                raise FormatError(source, f"{hf_name.format(l=l)} has shape {tensor.shape}, "
                                          f"expected {expected}")
            target[...] = value
    return config, params


def gpt2_to_hf(config, params):
    """(tensors, config.json) of GPT2LMHeadModel for a GPT-2 (GPT2Config, params): llm.c's
    GELU is GPT-2's tanh approximation, "gelu_new"; no dropout, as llm.c trains."""
    views = param_views(config, np.asarray(params, dtype=np.float32))
    tensors = {}
    for name, (hf_name, transposed) in HF_GPT2_NAMES.items():
        per_layer = "{l}" in hf_name
        for l in range(config.num_layers if per_layer else 1):
            tensor = views[name][l] if per_layer else views[name]
            if name == "wte":
                tensor = tensor[:config.vocab_size]
            tensors[HF_GPT2_PREFIX + hf_name.format(l=l)] = tensor.T if transposed else tensor
    hf_config = dict(
        architectures=["GPT2LMHeadModel"], model_type="gpt2", vocab_size=config.vocab_size,
        n_positions=config.max_seq_len, n_embd=config.channels, n_layer=config.num_layers,
        n_head=config.num_heads, n_inner=4 * config.channels, activation_function="gelu_new",
        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        initializer_range=0.02, tie_word_embeddings=True)
    return tensors, hf_config


# ----------------------------------------------------------------------------
# Hugging Face's Llama-block models: the names of their tensors, their q/k rows, their configs

HF_LLAMA_NAMES = {  # ours -> Hugging Face's, {l} the layer
    "tok_embeddings": "model.embed_tokens.weight", "norm": "model.norm.weight",
    "output": "lm_head.weight", "attention_norm": "model.layers.{l}.input_layernorm.weight",
    "wq": "model.layers.{l}.self_attn.q_proj.weight", "wk": "model.layers.{l}.self_attn.k_proj.weight",
    "wv": "model.layers.{l}.self_attn.v_proj.weight", "wo": "model.layers.{l}.self_attn.o_proj.weight",
    "bq": "model.layers.{l}.self_attn.q_proj.bias", "bk": "model.layers.{l}.self_attn.k_proj.bias",
    "bv": "model.layers.{l}.self_attn.v_proj.bias",
    "q_norm": "model.layers.{l}.self_attn.q_norm.weight",
    "k_norm": "model.layers.{l}.self_attn.k_norm.weight",
    "ffn_norm": "model.layers.{l}.post_attention_layernorm.weight",
    "w1": "model.layers.{l}.mlp.gate_proj.weight", "w2": "model.layers.{l}.mlp.down_proj.weight",
    "w3": "model.layers.{l}.mlp.up_proj.weight",
}
# each architecture: its model_type and the switches it has (LlamaConfig's qkv_bias, qk_norm)
HF_LLAMA_ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", dict(qkv_bias=False, qk_norm=False)),
    "MistralForCausalLM": ("mistral", dict(qkv_bias=False, qk_norm=False)),
    "Qwen2ForCausalLM": ("qwen2", dict(qkv_bias=True, qk_norm=False)),
    "Qwen3ForCausalLM": ("qwen3", dict(qkv_bias=False, qk_norm=True)),
}
HF_MODEL_TYPES = {model_type: arch for arch, (model_type, _) in HF_LLAMA_ARCHITECTURES.items()}
HF_MODEL_TYPES["gpt2"] = "GPT2LMHeadModel"

# config.json's keys that do not change the model's arithmetic (metadata, generation and
# initialisation settings, transformers' own bookkeeping), read by no one here
HF_INERT_KEYS = frozenset((
    "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range",
    "output_hidden_states", "output_attentions", "return_dict", "chunk_size_feed_forward",
    "is_encoder_decoder", "id2label", "label2id", "problem_type", "tokenizer_class",
    "is_llama_config", "transformers.js_config", "max_window_layers", "tie_encoder_decoder"))
# keys implemented only at one value: key -> (the value, what another value would ask for)
HF_LLAMA_FIXED = {
    "hidden_act": ("silu", "another activation in the FFN"),
    "pretraining_tp": (1, "tensor-parallel slicing of the projections"),
    "mlp_bias": (False, "biases in the FFN"),
    "use_sliding_window": (False, "sliding-window attention"),
    "rope_interleaved": (False, "interleaved RoPE"),
    "use_mrope": (False, "multimodal RoPE"),
    "attention_dropout": (0.0, "dropout in attention"),
}
HF_LLAMA_SIZES = frozenset((
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "vocab_size", "intermediate_size", "max_position_embeddings", "rms_norm_eps", "head_dim",
    "tie_word_embeddings", "rope_theta", "rope_parameters", "rope_scaling", "attention_bias",
    "sliding_window", "layer_types"))
HF_ROPE_KEYS = {"default": {"rope_type", "type", "rope_theta"},
                "llama3": {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                           "high_freq_factor", "original_max_position_embeddings"}}


def hf_architecture(hf_config, source):
    """config.json's architecture (its architectures[0], else its model_type's)."""
    model_type = hf_config.get("model_type")
    architectures = hf_config.get("architectures") or [HF_MODEL_TYPES.get(model_type)]
    if len(architectures) != 1 or architectures[0] not in (*HF_LLAMA_ARCHITECTURES, "GPT2LMHeadModel"):
        what = (f"architecture {', '.join(map(str, architectures))} (model_type {model_type!r})"
                if hf_config.get("architectures") else f"model_type {model_type!r}")
        raise FormatError(source, f"config.json: {what} is not implemented (these are: "
                                  f"{', '.join(HF_LLAMA_ARCHITECTURES)}, GPT2LMHeadModel)")
    return architectures[0]


def hf_rope(hf_config, source):
    """(theta, scaling) of config.json: transformers 5 keeps both in rope_parameters, earlier
    versions rope_theta beside rope_scaling; a scaling not implemented is refused by name."""
    rope = dict(hf_config.get("rope_scaling") or {})
    rope.update(hf_config.get("rope_parameters") or {})
    theta = rope.get("rope_theta", hf_config.get("rope_theta", 10000.0))   # transformers' default
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in HF_ROPE_KEYS:
        raise FormatError(source, f"config.json: RoPE scaling {rope_type!r} is not implemented "
                                  f"(these are: {', '.join(HF_ROPE_KEYS)})")
    unknown = sorted(set(rope) - HF_ROPE_KEYS[rope_type])
    if unknown:
        raise FormatError(source, f"config.json: RoPE's {unknown[0]}={rope[unknown[0]]!r} is not "
                                  f"implemented for rope_type {rope_type!r}")
    if rope_type == "default":
        return float(theta), ()
    return float(theta), ("llama3", float(rope["factor"]), float(rope["low_freq_factor"]),
                          float(rope["high_freq_factor"]),
                          float(rope["original_max_position_embeddings"]))


def llama_config_from_hf(hf_config, config_class, source="config.json"):
    """The config_class (train_llama2.LlamaConfig) of a Llama-block config.json (a dict); a key
    that would change the model and is not implemented is refused by name, never ignored."""
    architecture = hf_architecture(hf_config, source)
    if architecture not in HF_LLAMA_ARCHITECTURES:
        raise FormatError(source, f"config.json: {architecture} is not a Llama-block model")
    model_type, switches = HF_LLAMA_ARCHITECTURES[architecture]
    for key, value in hf_config.items():
        if key in HF_LLAMA_FIXED and value != HF_LLAMA_FIXED[key][0]:
            raise FormatError(source, f"config.json: {key}={value!r} ({HF_LLAMA_FIXED[key][1]}) "
                                      f"is not implemented")
        if key not in HF_INERT_KEYS and key not in HF_LLAMA_FIXED and key not in HF_LLAMA_SIZES:
            raise FormatError(source, f"config.json: {key}={value!r} is not implemented "
                                      f"(for {architecture})")
    if hf_config.get("attention_bias", False):   # Llama's puts one on o_proj too; Qwen3's
        raise FormatError(source, "config.json: attention_bias=true is not implemented")
    if any(kind != "full_attention" for kind in hf_config.get("layer_types") or ()):
        raise FormatError(source, f"config.json: layer_types {sorted(set(hf_config['layer_types']))}: "
                                  f"only full_attention is implemented")
    window = hf_config.get("sliding_window")
    if model_type == "mistral" and window is not None and \
            window < hf_config.get("max_position_embeddings", 0):
        raise FormatError(source, f"config.json: sliding_window={window} (Mistral v0.1's "
                                  f"sliding-window attention) is not implemented")
    theta, scaling = hf_rope(hf_config, source)
    try:
        n_heads, dim = int(hf_config["num_attention_heads"]), int(hf_config["hidden_size"])
        head_dim = int(hf_config.get("head_dim") or dim // n_heads)
        return config_class(
            dim=dim, n_layers=int(hf_config["num_hidden_layers"]), n_heads=n_heads,
            n_kv_heads=int(hf_config.get("num_key_value_heads") or n_heads),
            vocab_size=int(hf_config["vocab_size"]), hidden_dim=int(hf_config["intermediate_size"]),
            max_seq_len=int(hf_config["max_position_embeddings"]),
            norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)), rope_theta=theta,
            shared_classifier=bool(hf_config.get("tie_word_embeddings", False)),
            head_dim=head_dim, rope_scaling=scaling,
            architecture="" if architecture == "LlamaForCausalLM" else architecture, **switches)
    except KeyError as e:
        raise FormatError(source, f"config.json has no {e.args[0]}: not a {architecture} config?") from None
    except ValueError as e:
        raise FormatError(source, f"config.json: {e}") from None


def llama_from_hf(tensors, hf_config, config_class, source="safetensors", into=None,
                  store=None):
    """(config, params) from Hugging Face tensors of a Llama-block model (name -> array, each
    read once into its place) and its config.json (a dict), the config a config_class
    (train_llama2.LlamaConfig); params is into (an array of the model's size, a model's own
    buffer: Model.fill_params) where given, each tensor written into its part of it by
    store(part, tensor) (default: assigned; a model without master weights rounds it into its
    bf16 or fp16 bits).  A tensor the model has no place for is refused by name."""
    config = llama_config_from_hf(hf_config, config_class, source)
    architecture = config.architecture or "LlamaForCausalLM"
    taken = set()

    def get(name):
        if name not in tensors:
            raise FormatError(source, f"no tensor {name}: not a {architecture} checkpoint, "
                                      f"or a shard is missing?")
        taken.add(name)
        return tensors[name]
    params = np.empty(config.num_parameters(), dtype=np.float32) if into is None else into
    if store is None:
        def store(part, tensor):
            part[...] = tensor
    for name, view in param_views(config, params).items():
        per_layer = "{l}" in HF_LLAMA_NAMES[name]
        for l in range(config.n_layers if per_layer else 1):
            hf_name = HF_LLAMA_NAMES[name].format(l=l)
            tensor, target = get(hf_name), (view[l] if per_layer else view)
            if tensor.shape != target.shape:
                raise FormatError(source, f"{hf_name} has shape {tensor.shape}, expected "
                                          f"{target.shape} for {config.describe()}")
            if name in ROTATED:
                tensor = hf_adjacent_pair_rows(tensor, rotated_heads(config, name))
            store(target, tensor)
    # a tied model's file may still hold the head; transformers ignores it, and so do we only
    # where it is the embedding
    if config.shared_classifier and HF_LLAMA_NAMES["output"] in tensors:
        embedding = param_views(config, params)["tok_embeddings"]
        head = np.empty_like(embedding)
        store(head, get(HF_LLAMA_NAMES["output"]))
        if not np.array_equal(head, embedding):
            raise FormatError(source, "tie_word_embeddings is true, yet lm_head.weight differs "
                                      "from the embedding")
    unread = sorted(name for name in tensors if name not in taken
                    and not name.endswith("rotary_emb.inv_freq"))   # a buffer, not a weight
    if unread:
        raise FormatError(source, f"tensor {unread[0]} ({len(unread)} unread in all) has no place "
                                  f"in {architecture}: not implemented")
    return config, params


def llama_to_hf(config, params, rotate_half_rows=True):
    """(tensors, config.json) of a Llama-block model (LlamaConfig, params) as its architecture
    (config.architecture; else Qwen3's with QK-norm, Qwen2's with the qkv bias, Llama's): q and
    k rows in the rotate-half order (rotate_half_rows=False only for the test that shows they
    must be), the head tied to the embedding or its own."""
    architecture = config.architecture or ("Qwen3ForCausalLM" if config.qk_norm else
                                           "Qwen2ForCausalLM" if config.qkv_bias else
                                           "LlamaForCausalLM")
    model_type, switches = HF_LLAMA_ARCHITECTURES[architecture]
    if switches != dict(qkv_bias=config.qkv_bias, qk_norm=config.qk_norm):
        raise ValueError(f"llama_to_hf: {architecture} has {switches}, the model qkv_bias="
                         f"{config.qkv_bias} qk_norm={config.qk_norm}")
    views = param_views(config, np.asarray(params, dtype=np.float32))
    tensors = {}
    for name, view in views.items():
        per_layer = "{l}" in HF_LLAMA_NAMES[name]
        for l in range(config.n_layers if per_layer else 1):
            tensor = view[l] if per_layer else view
            if name in ROTATED and rotate_half_rows:
                tensor = hf_rotate_half_rows(tensor, rotated_heads(config, name))
            tensors[HF_LLAMA_NAMES[name].format(l=l)] = tensor
    rope = dict(rope_type="default", rope_theta=config.rope_theta)
    if config.rope_scaling:
        rope.update(zip(("rope_type", "factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"), config.rope_scaling))
        rope["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
    hf_config = dict(
        architectures=[architecture], model_type=model_type, vocab_size=config.vocab_size,
        hidden_size=config.dim, intermediate_size=config.hidden_dim,
        num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads, head_dim=config.head_size,
        max_position_embeddings=config.max_seq_len, rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_theta, rope_parameters=rope, hidden_act="silu",
        initializer_range=0.02, tie_word_embeddings=config.shared_classifier)
    if model_type in ("llama", "qwen3"):
        hf_config.update(attention_bias=False)
    if model_type == "llama":
        hf_config.update(mlp_bias=False)
    if model_type in ("mistral", "qwen2", "qwen3"):
        hf_config.update(sliding_window=None)
    if model_type in ("qwen2", "qwen3"):
        hf_config.update(use_sliding_window=False)
    return tensors, hf_config


# ----------------------------------------------------------------------------
# the tokenizer's files

class HFVocab:
    """A tokenizer as a transformers model folder holds it: its files (name -> bytes), its
    number of tokens and the ids of its BOS and EOS."""

    def __init__(self, files, size, bos, eos):
        self.files, self.size, self.bos, self.eos = files, size, bos, eos


def _json(value):
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def gpt2_hf_vocab(token_bytes, eot_token, max_length):
    """GPT-2's byte-level BPE (each token's bytes in rank order, the end-of-text id, which is
    also BOS and EOS) as GPT2Tokenizer's vocab.json and merges.txt."""
    tokens, merges = gpt2_spelled(token_bytes, special=(eot_token,))
    eot = tokens[eot_token]
    config = dict(tokenizer_class="GPT2Tokenizer", bos_token=eot, eos_token=eot, unk_token=eot,
                  add_prefix_space=False, add_bos_token=False, model_max_length=max_length)
    files = {"vocab.json": _json({text: i for i, text in enumerate(tokens)}),
             "merges.txt": ("#version: 0.2\n" + "\n".join(merges) + "\n").encode("utf-8"),
             "tokenizer_config.json": _json(config)}
    return HFVocab(files, len(tokens), eot_token, eot_token)


def sentencepiece_hf_vocab(model_path, max_length):
    """A SentencePiece vocabulary (its tokenizer.model, as dev/data/tinyshakespeare.py
    --sentencepiece N writes it) with BOS before every text, as llama2.c's data scripts encode
    each document.  Its class is transformers 5's TokenizersBackend, which builds the
    tokenizer from the model's own settings: LlamaTokenizer would ignore SentencePiece's
    removal of extra spaces (remove_extra_whitespaces, on in the vocabularies trained here)."""
    with open_file(model_path) as f:
        model = f.read()
    try:
        sp = sentencepiece_processor(os.fspath(model_path))
    except (OSError, RuntimeError) as e:
        raise FormatError(model_path, f"not a SentencePiece model "
                                      f"({' '.join(str(e).split())})") from None
    config = dict(tokenizer_class="TokenizersBackend", bos_token=sp.id_to_piece(sp.bos_id()),
                  eos_token=sp.id_to_piece(sp.eos_id()), unk_token=sp.id_to_piece(sp.unk_id()),
                  add_bos_token=True, add_eos_token=False, model_max_length=max_length)
    files = {"tokenizer.model": model, "tokenizer_config.json": _json(config)}
    return HFVocab(files, sp.vocab_size(), sp.bos_id(), sp.eos_id())


# ----------------------------------------------------------------------------
# a transformers model folder

HF_WRITERS = {"gpt2": gpt2_to_hf, "llama": llama_to_hf}   # a family's name -> its writer


def write_hf_model(directory, tensors, hf_config, vocab, dtype="float32"):
    """A transformers model folder (from gpt2_to_hf or llama_to_hf, and an HFVocab) at
    directory, which must not exist or be empty: model.safetensors in dtype ("float32" or
    "bfloat16"), config.json, generation_config.json and the tokenizer's files.  They are
    written into a new folder beside it that then takes its place: all or nothing."""
    if vocab.size > hf_config["vocab_size"]:
        raise ValueError(f"the tokenizer has {vocab.size} tokens, more than the model's "
                         f"vocabulary of {hf_config['vocab_size']}")
    directory = os.path.abspath(directory)
    building = os.path.join(os.path.dirname(directory),
                            f".{os.path.basename(directory)}.{secrets.token_hex(4)}.tmp")
    os.mkdir(building)
    try:
        write_safetensors(os.path.join(building, "model.safetensors"), tensors, dtype)
        special = dict(bos_token_id=vocab.bos, eos_token_id=vocab.eos)
        files = {"config.json": _json(dict(hf_config, **special, dtype=dtype)),
                 "generation_config.json": _json(special), **vocab.files}
        for name, data in files.items():
            atomic_write(os.path.join(building, name), data)
        os.replace(building, directory)   # over an empty folder too
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise FormatError(path, f"no such file ({what})") from None
    except json.JSONDecodeError as e:
        raise FormatError(path, f"not JSON: {e}") from None


def is_hf_folder(path):
    """Whether path is a transformers model folder (it holds config.json)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def safetensors_files(directory):
    """The safetensors files of a model folder: its index's shards (each checked to be there),
    else every .safetensors file in it."""
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index_path):
        weight_map = read_json(index_path, "the shards' index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise FormatError(index_path, "no weight_map: not a safetensors index")
        files = sorted(set(weight_map.values()))
        missing = [name for name in files if not os.path.isfile(os.path.join(directory, name))]
        if missing:
            raise FormatError(directory, f"shard {missing[0]} of model.safetensors.index.json is "
                                         f"missing ({len(missing)} of {len(files)} missing)")
        return [os.path.join(directory, name) for name in files]
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if not files:
        raise FormatError(directory, "no .safetensors files")
    return [os.path.join(directory, name) for name in files]


def hf_config_of(path):
    """config.json (a dict) of a model folder, or of a safetensors model file (its metadata's
    "config", else the config.json beside it)."""
    if os.path.isdir(path):
        return read_json(os.path.join(path, "config.json"),
                         "a Hugging Face model folder has config.json")
    with open_file(path) as f:
        prefix = f.read(8)
        header = json.loads(f.read(int.from_bytes(prefix, "little")))
    config = (header.get("__metadata__") or {}).get("config")
    if config is not None:
        return json.loads(config)
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if not os.path.exists(beside):
        raise FormatError(path, "a safetensors file without its config (no config.json beside "
                                "it, none in its metadata): give the model's folder")
    return read_json(beside, "the model's config")


def read_hf_checkpoint(path):
    """(name -> float32 array of every tensor, each read when asked for; config.json) of a
    model folder (single or sharded) or a safetensors model file (hf_config_of)."""
    hf_config = hf_config_of(path)
    if not os.path.isdir(path):
        return read_safetensors(path), hf_config
    tensors = {}
    for file in safetensors_files(path):
        shard = read_safetensors(file)
        for name in shard:
            if name in tensors:
                raise FormatError(file, f"tensor {name} is in two shards")
        tensors.update({name: (shard, name) for name in shard})
    return ShardedTensors(tensors), hf_config


class ShardedTensors(Mapping):
    """name -> float32 array over the shards of a model folder, each read when asked for."""

    def __init__(self, where):
        self.where = where   # name -> (its shard's SafetensorsTensors, name)

    def __getitem__(self, name):
        shard, _ = self.where[name]
        return shard[name]

    def __iter__(self):
        return iter(self.where)

    def __len__(self):
        return len(self.where)

    def dtypes(self):
        return sorted({d for shard, _ in self.where.values() for d in shard.dtypes()})


def gpt2_config_checked(hf_config, source):
    """n_head of a GPT2LMHeadModel's config.json, its other keys checked as llm.c's GPT-2."""
    fixed = {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "layer_norm_epsilon": (1e-5,),
             "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,),
             "add_cross_attention": (False,), "tie_word_embeddings": (True,),
             "n_special": (0,)}   # OpenAI's gpt2-medium and -large configs: no extra tokens
    sizes = {"vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner",
             "reorder_and_upcast_attn",   # float32 attention here: upcast or not
             "resid_pdrop", "embd_pdrop", "attn_pdrop",   # dropout: training here has none
             "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
             "summary_first_dropout", "task_specific_params",   # GPT2DoubleHeadsModel's
             "predict_special_tokens"}   # with n_special 0, no special token to predict
    for key, value in hf_config.items():
        if key in fixed and value not in fixed[key]:
            raise FormatError(source, f"config.json: {key}={value!r} is not implemented "
                                      f"(GPT-2's is {fixed[key][0]!r})")
        if key not in fixed and key not in sizes and key not in HF_INERT_KEYS:
            raise FormatError(source, f"config.json: {key}={value!r} is not implemented (for GPT-2)")
    if hf_config.get("n_inner") not in (None, 4 * hf_config.get("n_embd", 0)):
        raise FormatError(source, f"config.json: n_inner={hf_config['n_inner']} is not 4 * n_embd")
    return hf_config.get("n_head")


HF_READERS = {"gpt2": lambda tensors, hf_config, config_class, source: gpt2_from_hf(
                   tensors, config_class, gpt2_config_checked(hf_config, source), source),
              "llama": llama_from_hf}


def hf_reader_of(hf_config, source):
    """The name of the reader (HF_READERS) of a config.json's architecture."""
    return "gpt2" if hf_architecture(hf_config, source) == "GPT2LMHeadModel" else "llama"


def describe_hf(path):
    """What a Hugging Face model is, in words: "a Hugging Face Qwen3ForCausalLM folder (bf16
    weights, 28 layers, 1024 channels, 151936 tokens)"."""
    tensors, hf_config = read_hf_checkpoint(path)
    dtypes = "/".join(d.lower() for d in tensors.dtypes())
    kind = "folder" if os.path.isdir(path) else "file"
    get = lambda *keys: next((hf_config[k] for k in keys if k in hf_config), "?")   # noqa: E731
    return (f"a Hugging Face {hf_architecture(hf_config, path)} {kind} ({dtypes} weights, "
            f"{get('num_hidden_layers', 'n_layer')} layers, {get('hidden_size', 'n_embd')} "
            f"channels, {get('vocab_size')} tokens)")


def read_hf_model(path, config_classes):
    """(config, float32 params) of a transformers model folder (or a safetensors model file)
    of a GPT-2 or a Llama-block model, told by its config.json's architecture; config_classes:
    {reader: the config class it is read into} ({"gpt2": train_gpt2.GPT2Config}), the readers
    (HF_READERS) the caller takes."""
    tensors, hf_config = read_hf_checkpoint(path)
    reader = hf_reader_of(hf_config, path)
    if reader not in config_classes:
        raise FormatError(path, f"{hf_architecture(hf_config, path)}: not "
                                f"{' or '.join(config_classes)}")
    return HF_READERS[reader](tensors, hf_config, config_classes[reader], path)


def write_hf_model_file(path, tensors, hf_config):
    """One safetensors file (float32) holding a model and, in its metadata, its config.json:
    what a run's checkpoint of a model that llama2.c's files cannot hold is written as."""
    write_safetensors(path, tensors, metadata={"config": json.dumps(hf_config)})
