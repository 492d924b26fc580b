"""
Every on-disk format, in pure Python + NumPy, one module per ecosystem:

    llmc.formats.llmc         llm.c's: model checkpoint (v3 fp32, v5 bf16), debug state,
                              tokenizer, token shards, training state
    llmc.formats.llama2c      llama2.c's: model files (legacy v0 and v1, fp32), tokenizer.bin
    llmc.formats.huggingface  Hugging Face's: safetensors in and out, transformers' GPT-2 and
                              Llama model folders out and back
    llmc.formats.gguf         llama.cpp's GGUF: a Llama model and its vocabulary, out and back

and here, what they share: the checked low-level reads, the views of a flat parameter vector,
bfloat16, and (from llmc/files.py, which the ANE's state file uses too) FormatError and
atomic_write.  The model configs a reader returns are the
families' (train_gpt2.GPT2Config, train_llama2.LlamaConfig), imported by the readers when
called: the families import the formats, and the formats load without a build.

Readers check what they read and raise FormatError("<path>: <problem>") for a file that is
not what it should be. Writers go through atomic_write, so a failed write never leaves a
half-written file behind.
"""

import numpy as np

from llmc.files import FormatError, atomic_write

__all__ = ["FormatError", "atomic_write", "bfloat16_bits_to_float32", "describe_model_file",
           "float32_to_bfloat16_bits", "model_format", "param_views"]


def param_views(config, flat):
    """dict name -> shaped view into the 1-D parameter (or gradient) vector `flat`, cut by
    config.param_shapes() (any family's config)."""
    if flat.ndim != 1 or flat.size != config.num_parameters():
        raise ValueError(f"param_views: expected a 1-D vector of {config.num_parameters()} "
                         f"values for {config.describe()}, got shape {flat.shape}")
    views, offset = {}, 0
    for name, shape in config.param_shapes():
        size = int(np.prod(shape))
        views[name] = flat[offset:offset + size].reshape(shape)
        offset += size
    return views


# ----------------------------------------------------------------------------
# bfloat16: the top 16 bits of a float32 (llm.c's v5 checkpoints, Hugging Face's BF16 tensors)

def float32_to_bfloat16_bits(values):
    """bf16 bit patterns (uint16) of float32 values, rounded to nearest even like torch."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    # adding 0x7FFF plus the lowest kept bit rounds half-way cases to the even neighbour;
    # it can only wrap around for negative NaNs, which are replaced below
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def bfloat16_bits_to_float32(bits):
    """float32 values of bf16 bit patterns (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ----------------------------------------------------------------------------
# reading: opening, sizes, arrays, each failure a FormatError

def open_file(path):
    """path opened for reading in binary; FormatError when it cannot be."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FormatError(path, "no such file") from None
    except IsADirectoryError:
        raise FormatError(path, "is a directory, not a file") from None
    except OSError as e:
        raise FormatError(path, f"cannot open: {e.strerror}") from None


def check_size(path, actual, expected, contents, hint=""):
    """FormatError unless the file's `actual` size is the `expected` one of its `contents`."""
    if actual != expected:
        problem = "truncated" if actual < expected else "too long"
        raise FormatError(path, f"{problem}: expected {expected} bytes ({contents}), "
                                f"found {actual}{hint}")


def read_array(f, path, dtype, count):
    """The next `count` values of `dtype` in the open file f."""
    data = np.fromfile(f, dtype=dtype, count=count)
    if data.size != count:  # the file shrank after its size was checked
        raise FormatError(path, f"truncated: could read only {data.size} of {count} values")
    return data


# ----------------------------------------------------------------------------
# which format a model file is in

MODEL_FORMAT_NAMES = {"llmc": "an llm.c model", "llama2c": "a llama2.c model",
                      "gguf": "a GGUF model"}


def model_format(path):
    """The format of the model file at path, told by its first bytes: "llmc" (llm.c's
    checkpoint, magic 20240326), "llama2c" (llama2.c's version 1, magic "ak42", or a version-0
    file: no magic, seven sizes whose tensors fill the file exactly) or "gguf"; FormatError in
    one line for anything else, naming llm.c's other files where it is one of them."""
    from llmc.formats.llama2c import LLAMA2C_MAGIC, legacy_model_bytes
    from llmc.formats.llmc import FILE_KINDS, MODEL_MAGIC, _looks_like_text
    import os
    with open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(28)
    if raw[:4] == b"GGUF":
        return "gguf"
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
            "it begins like a text file" if _looks_like_text(raw) else f"{size} bytes")
    raise FormatError(path, f"not a model file ({what}): neither llm.c's (magic 20240326), "
                            f"llama2.c's (version 1's magic 'ak42', or version 0's sizes) nor GGUF")


def describe_model_file(path):
    """What model_format finds at path, in words with the format's version: "a llama2.c model
    (version 1)" (the version field after the magic; 0 for llama2.c's legacy file, which has
    none)."""
    from llmc.formats.llama2c import LLAMA2C_MAGIC
    found = model_format(path)
    with open_file(path) as f:
        raw = f.read(8)
    legacy = found == "llama2c" and int.from_bytes(raw[:4], "little") != LLAMA2C_MAGIC
    version = 0 if legacy else int.from_bytes(raw[4:8], "little")
    return f"{MODEL_FORMAT_NAMES[found]} (version {version})"
