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
    Llama, as LlamaForCausalLM: each head's q and k rows are permuted for its rotate-half RoPE
        (the first half of a head's channels paired with the second); llama2.c, Meta and
        llama.cpp pair adjacent channels.
    a model folder: config.json, generation_config.json, model.safetensors and the tokenizer's
        files with the tokenizer_config.json that names their class: GPT-2's byte-level BPE as
        vocab.json and merges.txt (the merges rebuilt from the ranks, llmc/formats/gguf.py),
        or a SentencePiece vocabulary's tokenizer.model.
"""
import json
import os
import secrets
import shutil

import numpy as np

from llmc.formats.common import (FormatError, atomic_write, bfloat16_bits_to_float32,
                                 float32_to_bfloat16_bits, open_file, param_views)
from llmc.formats.gguf import gpt2_spelled
from llmc.formats.llama2c import sentencepiece_processor

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


def write_safetensors(path, tensors, dtype="float32"):
    """Write name -> float32 array as a safetensors file of dtype "float32" or "bfloat16"
    (rounded to the nearest, ties to even), through the safetensors package; all or nothing
    (atomic_write)."""
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
    atomic_write(path, serialize(specs, metadata={"format": "pt"}))


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


def llama_from_hf(tensors, hf_config, config_class, source="safetensors"):
    """(config, params) from Hugging Face LlamaForCausalLM tensors (name -> array) and its
    config.json (a dict), the config a config_class (train_llama2.LlamaConfig)."""
    def get(name):
        if name not in tensors:
            raise FormatError(source, f"no tensor {name}: not a Hugging Face Llama checkpoint?")
        return tensors[name]
    try:
        n_heads = int(hf_config["num_attention_heads"])
        config = config_class(
            dim=int(hf_config["hidden_size"]), n_layers=int(hf_config["num_hidden_layers"]),
            n_heads=n_heads, n_kv_heads=int(hf_config.get("num_key_value_heads", n_heads)),
            vocab_size=int(hf_config["vocab_size"]), hidden_dim=int(hf_config["intermediate_size"]),
            max_seq_len=int(hf_config["max_position_embeddings"]),
            norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
            # transformers 5 writes rope_parameters, earlier versions rope_theta
            rope_theta=float((hf_config.get("rope_parameters") or hf_config).get("rope_theta",
                                                                                 10000.0)),
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


def llama_to_hf(config, params, rotate_half_rows=True):
    """(tensors, config.json) of LlamaForCausalLM for a Llama (LlamaConfig, params): q and k
    rows in its rotate-half order (rotate_half_rows=False only for the test that shows they
    must be), the head tied to the embedding or its own."""
    views = param_views(config, np.asarray(params, dtype=np.float32))
    tensors = {}
    for name, view in views.items():
        per_layer = "{l}" in HF_LLAMA_NAMES[name]
        for l in range(config.n_layers if per_layer else 1):
            tensor = view[l] if per_layer else view
            if name in ("wq", "wk") and rotate_half_rows:
                tensor = hf_rotate_half_rows(tensor, config.n_heads if name == "wq"
                                             else config.n_kv_heads)
            tensors[HF_LLAMA_NAMES[name].format(l=l)] = tensor
    hf_config = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=config.vocab_size,
        hidden_size=config.dim, intermediate_size=config.hidden_dim,
        num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads, head_dim=config.head_size,
        max_position_embeddings=config.max_seq_len, rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_theta,
        rope_parameters=dict(rope_type="default", rope_theta=config.rope_theta),
        hidden_act="silu", attention_bias=False, mlp_bias=False, initializer_range=0.02,
        tie_word_embeddings=config.shared_classifier)
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


def read_hf_checkpoint(directory):
    """name -> float32 array of every safetensors file in directory, and its config.json."""
    config_path = os.path.join(directory, "config.json")
    try:
        with open(config_path) as f:
            hf_config = json.load(f)
    except FileNotFoundError:
        raise FormatError(config_path, "no such file (a Hugging Face checkpoint "
                                       "directory has config.json)") from None
    except json.JSONDecodeError as e:
        raise FormatError(config_path, f"not JSON: {e}") from None
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors")) \
        if os.path.isdir(directory) else []
    if not files:
        raise FormatError(directory, "no .safetensors files")
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(directory, name)))
    return tensors, hf_config


HF_READERS = {"gpt2": lambda tensors, hf_config, config_class, source: gpt2_from_hf(
                   tensors, config_class, hf_config.get("n_head"), source),
              "llama": llama_from_hf}


def read_hf_model(directory, config_classes):
    """(config, float32 params) of a transformers model folder of a GPT-2 or a Llama, told by
    its config.json's model_type; config_classes: {model_type: the config class it is read
    into} ({"gpt2": train_gpt2.GPT2Config}), the model types the caller takes."""
    tensors, hf_config = read_hf_checkpoint(directory)
    model_type = hf_config.get("model_type")
    if model_type not in config_classes or model_type not in HF_READERS:
        taken = " or ".join(t for t in config_classes if t in HF_READERS)
        raise FormatError(directory, f"model_type {model_type!r}: not {taken}")
    return HF_READERS[model_type](tensors, hf_config, config_classes[model_type], directory)
