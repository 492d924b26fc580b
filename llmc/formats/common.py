"""
What every file format (llmc/formats/) shares: files written whole or not at all, the error of
one that is not what it should be, the checked low-level reads, the views of a flat parameter
vector, bfloat16, and RoPE's two orders of a Llama-family model's q and k rows.

    atomic_write(path, chunks)     the bytes-like chunks to path, all or nothing
    FormatError(path, problem)     str(e) is "<path>: <problem>", on one line
"""
import os
import secrets

import numpy as np

__all__ = ["FormatError", "ROTATED", "atomic_write", "bfloat16_bits_to_float32", "check_size",
           "float32_to_bfloat16_bits", "hf_adjacent_pair_rows", "hf_rotate_half_rows",
           "open_file", "param_views", "read_array", "rotated_heads"]


class FormatError(ValueError):
    """A file that is not what it should be. str(e) is "<path>: <problem>", on one line."""

    def __init__(self, path, problem=None):
        if problem is None:  # given a whole message
            message, self.path, self.problem = str(path), None, str(path)
        else:
            self.path, self.problem = os.fspath(path), str(problem)
            message = f"{self.path}: {self.problem}"
        super().__init__(" ".join(message.split("\n")))


def atomic_write(path, chunks):
    """Write the bytes-like `chunks` to path, all or nothing: they go to a temporary file in
    the same directory, which is synced and then renamed over path. On any error (a full
    disk, a failing chunk generator) the temporary file is removed, an existing file at path
    is left as it was, and the error is raised."""
    path = os.fspath(path)
    if isinstance(chunks, (bytes, bytearray, memoryview)):
        chunks = [chunks]
    directory = os.path.dirname(os.path.abspath(path))
    tmp_path = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}."
                                       f"{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp_path, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        try:
            os.unlink(tmp_path)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)


def _fsync_directory(directory):
    """Make the rename durable; best effort (some systems cannot open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
# RoPE's two orders of q and k rows: we (llama2.c, Meta, llama.cpp's "llama") rotate each
# head's adjacent channel pairs, Hugging Face (and llama.cpp's NEOX-rotating "qwen2" and
# "qwen3") the first half of a head's channels with the second

ROTATED = {"wq": "n_heads", "bq": "n_heads", "wk": "n_kv_heads", "bk": "n_kv_heads",
           "q_norm": None, "k_norm": None}   # a Llama-family tensor whose rows RoPE pairs:
#                                              per head of these many (None: one head's)


def rotated_heads(config, name):
    """The heads of a ROTATED tensor's rows (a q/k norm is one head's)."""
    return getattr(config, ROTATED[name]) if ROTATED[name] else 1


def hf_rotate_half_rows(w, n_heads):
    """Adjacent-pair q/k rows (ours) -> the rotate-half order; a 1-D w (a bias, a head's norm)
    as one column."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def hf_adjacent_pair_rows(w, n_heads):
    """Rotate-half q/k rows -> adjacent pairs (ours); undoes hf_rotate_half_rows."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


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
