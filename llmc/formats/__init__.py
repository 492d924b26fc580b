"""
Every on-disk format, in pure Python + NumPy, one module per ecosystem:

    llmc.formats.llmc         llm.c's: model checkpoint (v3 fp32, v5 bf16), debug state,
                              tokenizer, token shards, training state
    llmc.formats.llama2c      llama2.c's: model files (legacy v0 and v1, fp32), tokenizer.bin
    llmc.formats.huggingface  Hugging Face's: safetensors in and out, transformers' GPT-2 and
                              Llama-block (Llama, Mistral, Qwen2, Qwen3) model folders out
                              and back
    llmc.formats.gguf         llama.cpp's GGUF: a Llama model and its vocabulary, out and back
    llmc.formats.common       what they share: FormatError, atomic_write, the checked reads,
                              the views of a flat parameter vector, bfloat16

and here, which format a model file is in (model_format), and the names of llmc.formats.common
that the rest of llm.pyx takes from the package.  The formats sit below the model families: a
family reads and writes its files through them (train_gpt2.pyx: llm.c's checkpoint), and a
reader that makes a family's config takes the config's class from its caller
(read_checkpoint(path, GPT2Config)), so that no format imports a family, and the formats load
without a build.

Readers check what they read and raise FormatError("<path>: <problem>") for a file that is
not what it should be. Writers go through atomic_write, so a failed write never leaves a
half-written file behind.
"""
import os

import numpy as np

from llmc.formats.common import (FormatError, atomic_write, bfloat16_bits_to_float32,
                                 float32_to_bfloat16_bits, open_file, param_views)
from llmc.formats.llama2c import LLAMA2C_MAGIC, legacy_model_bytes
from llmc.formats.llmc import FILE_KINDS, MODEL_MAGIC, looks_like_text

__all__ = ["FormatError", "atomic_write", "bfloat16_bits_to_float32", "describe_model_file",
           "float32_to_bfloat16_bits", "model_format", "open_file", "param_views"]


# ----------------------------------------------------------------------------
# which format a model file is in

MODEL_FORMAT_NAMES = {"llmc": "an llm.c model", "llama2c": "a llama2.c model",
                      "gguf": "a GGUF model", "hf": "a Hugging Face model folder",
                      "safetensors": "a safetensors model"}
HF_FORMATS = ("hf", "safetensors")   # the formats whose config.json names the architecture


def model_format(path):
    """The format of the model at path: "hf" for a folder with config.json (a transformers
    model folder), else told by the file's first bytes: "llmc" (llm.c's checkpoint, magic
    20240326), "llama2c" (llama2.c's version 1, magic "ak42", or a version-0 file: no magic,
    seven sizes whose tensors fill the file exactly), "gguf" or "safetensors" (a header's
    length, then JSON); FormatError in one line for anything else, naming llm.c's other files
    where it is one of them."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return "hf"
        raise FormatError(path, "a folder without config.json: not a Hugging Face model folder")
    with open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(28)
    if raw[:4] == b"GGUF":
        return "gguf"
    if len(raw) > 9 and raw[8:10] == b'{"' and int.from_bytes(raw[:8], "little") < size:
        return "safetensors"
    first = int.from_bytes(raw[:4], "little", signed=True) if len(raw) >= 4 else None
    if first == MODEL_MAGIC:
        return "llmc"
    if first is not None and first & 0xFFFFFFFF == LLAMA2C_MAGIC:
        return "llama2c"
    if first in FILE_KINDS:
        raise FormatError(path, f"this is {FILE_KINDS[first]} of llm.c, not a model file")
    if len(raw) == 28 and legacy_model_bytes(np.frombuffer(raw, dtype="<i4")) == size:
        return "llama2c"
    what = ("empty file" if size == 0 else
            "it begins like a text file" if looks_like_text(raw) else f"{size} bytes")
    raise FormatError(path, f"not a model file ({what}): neither llm.c's (magic 20240326), "
                            f"llama2.c's (version 1's magic 'ak42', or version 0's sizes), GGUF "
                            f"nor safetensors")


def describe_model_file(path):
    """What model_format finds at path, in words with the format's version: "a llama2.c model
    (version 1)" (the version field after the magic; 0 for llama2.c's legacy file, which has
    none)."""
    found = model_format(path)
    if found in HF_FORMATS:
        from llmc.formats.huggingface import describe_hf
        return describe_hf(path)
    with open_file(path) as f:
        raw = f.read(8)
    legacy = found == "llama2c" and int.from_bytes(raw[:4], "little") != LLAMA2C_MAGIC
    version = 0 if legacy else int.from_bytes(raw[4:8], "little")
    return f"{MODEL_FORMAT_NAMES[found]} (version {version})"
