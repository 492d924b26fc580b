"""
llm.c's file formats, in pure Python + NumPy: model checkpoints, debug states, tokenizers,
token shards and training states, read and written byte-for-byte as llm.c reads and writes them.

Every file starts with a header of 256 little-endian int32 (1024 bytes); the data follows.

    model checkpoint  magic 20240326, version 3 (fp32) or 5 (bf16)
        header [2] max_seq_len [3] vocab_size V [4] num_layers L [5] num_heads NH
               [6] channels C [7] padded_vocab_size Vp
        data   the 16 parameter tensors in llm.c's order (see GPT2Config.param_shapes), wte
               padded with zero rows from V to Vp, all in fp32 or all in bf16
    debug state       magic 20240327, version 2
        header [2] B [3] T
        data   x (B,T) int32, y (B,T) int32, logits (B,T,V) fp32 over the real vocab,
               loss (one fp32), the gradients of all parameters in fp32 (checkpoint layout)
    tokenizer         magic 20240328, version 1 (no eot) or 2
        header [2] number of tokens [3] eot token (version 2)
        data   per token: its length as one uint8, then that many bytes
    token shard       magic 20240520, version 1
        header [2] number of tokens
        data   the tokens as uint16
    training state    magic 20240527, version 1 (train_gpt2.cu's state_%08d_%05d.bin)
        header [2] processes [3] rank [4] master weights [5] shuffled data [10] step
               [30:32] shard index, [32:34] sample index of the data loader (each a uint64)
        data   AdamW's m and v (fp32, one per parameter), then the data loader: the number of
               shards (uint64) and their order (int32), the number of samples of the current
               shard (uint64) and their order (int32), and its RNG (llm.c's mt19937_state)

Readers check what they read and raise FormatError("<path>: <problem>") for a file that is
not what it should be. Writers go through atomic_write, so a failed write never leaves a
half-written file behind.
"""
import json
import os
import secrets
from dataclasses import dataclass, fields, replace

import numpy as np

from llmc.rope import rope_tables

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4

MODEL_MAGIC = 20240326
DEBUG_STATE_MAGIC = 20240327
TOKENIZER_MAGIC = 20240328
SHARD_MAGIC = 20240520
STATE_MAGIC = 20240527

MODEL_VERSIONS = {3: "float32", 5: "bfloat16"}
DEBUG_STATE_VERSION = 2
TOKENIZER_VERSION = 2
SHARD_VERSION = 1
STATE_VERSION = 1

# the magic numbers of llm.c's files, to say what a file passed in the wrong place is
FILE_KINDS = {
    MODEL_MAGIC: "a model checkpoint",
    DEBUG_STATE_MAGIC: "a debug state",
    TOKENIZER_MAGIC: "a tokenizer",
    SHARD_MAGIC: "a GPT-2 token shard",
    20240522: "an eval file (HellaSwag/MMLU)",
    STATE_MAGIC: "a training state",
    20240801: "a LLaMA-3 token shard",
}

# channels and heads of llm.c's named depths; any other depth N gets C=64N, NH=N
LLMC_DEPTHS = {6: (384, 6), 12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}
VOCAB_PAD_MULTIPLE = 128
GPT2_EOT_TOKEN = 50256  # what llm.c assumes for a version-1 tokenizer of the 50257 GPT-2 tokens


class FormatError(ValueError):
    """A file that is not what it should be. str(e) is "<path>: <problem>", on one line."""

    def __init__(self, path, problem=None):
        if problem is None:  # given a whole message
            message, self.path, self.problem = str(path), None, str(path)
        else:
            self.path, self.problem = os.fspath(path), str(problem)
            message = f"{self.path}: {self.problem}"
        super().__init__(" ".join(message.split("\n")))


# ----------------------------------------------------------------------------
# the model's configuration and parameter layout

def padded_vocab_size(vocab_size, multiple=VOCAB_PAD_MULTIPLE):
    """The vocab rounded up to a multiple of 128, as llm.c pads wte (50257 -> 50304)."""
    return (vocab_size + multiple - 1) // multiple * multiple


def _config_problem(max_seq_len, vocab_size, padded_vocab_size, num_layers, num_heads, channels):
    """What is wrong with these sizes, or None when they make a model."""
    sizes = dict(max_seq_len=max_seq_len, vocab_size=vocab_size,
                 padded_vocab_size=padded_vocab_size, num_layers=num_layers,
                 num_heads=num_heads, channels=channels)
    bad = [f"{name}={value}" for name, value in sizes.items() if value <= 0]
    if bad:
        return f"sizes must be positive: {', '.join(bad)}"
    if channels % num_heads != 0:
        return f"channels={channels} is not divisible by num_heads={num_heads}"
    if padded_vocab_size < vocab_size:
        return f"padded_vocab_size={padded_vocab_size} is smaller than vocab_size={vocab_size}"
    return None


@dataclass(frozen=True)
class GPT2Config:
    max_seq_len: int        # maxT, the longest sequence the position embedding covers
    vocab_size: int         # V, the real vocab
    padded_vocab_size: int  # Vp >= V, the rows of wte (padded for efficiency)
    num_layers: int         # L
    num_heads: int          # NH
    channels: int           # C

    def __post_init__(self):
        # plain Python ints: sizes read from a header arrive as int32, whose products overflow
        for field in fields(self):
            object.__setattr__(self, field.name, int(getattr(self, field.name)))
        problem = _config_problem(*(getattr(self, field.name) for field in fields(self)))
        if problem:
            raise ValueError(f"GPT2Config: {problem}")

    @classmethod
    def from_depth(cls, depth, max_seq_len=1024, vocab_size=50257):
        """llm.c's dN model: d6, d12 (GPT-2 124M), d24, d36, d48 sizes; else C=64N, NH=N."""
        if depth <= 0:
            raise ValueError(f"GPT2Config.from_depth: depth must be positive, got {depth}")
        channels, num_heads = LLMC_DEPTHS.get(depth, (64 * depth, depth))
        return cls(max_seq_len=max_seq_len, vocab_size=vocab_size,
                   padded_vocab_size=padded_vocab_size(vocab_size), num_layers=depth,
                   num_heads=num_heads, channels=channels)

    def param_shapes(self):
        """The 16 parameter tensors as (name, shape), in llm.c's order and layout."""
        Vp, maxT, L, C = self.padded_vocab_size, self.max_seq_len, self.num_layers, self.channels
        return [
            ("wte", (Vp, C)),
            ("wpe", (maxT, C)),
            ("ln1w", (L, C)),
            ("ln1b", (L, C)),
            ("qkvw", (L, 3 * C, C)),
            ("qkvb", (L, 3 * C)),
            ("attprojw", (L, C, C)),
            ("attprojb", (L, C)),
            ("ln2w", (L, C)),
            ("ln2b", (L, C)),
            ("fcw", (L, 4 * C, C)),
            ("fcb", (L, 4 * C)),
            ("fcprojw", (L, C, 4 * C)),
            ("fcprojb", (L, C)),
            ("lnfw", (C,)),
            ("lnfb", (C,)),
        ]

    def num_parameters(self):
        return sum(int(np.prod(shape)) for _, shape in self.param_shapes())

    def describe(self):
        return (f"maxT={self.max_seq_len} V={self.vocab_size} Vp={self.padded_vocab_size} "
                f"L={self.num_layers} NH={self.num_heads} C={self.channels}")


def param_views(config, flat):
    """dict name -> shaped view into the 1-D parameter (or gradient) vector `flat`."""
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
# bfloat16: the top 16 bits of a float32

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
# reading: headers and sizes

def _open(path):
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FormatError(path, "no such file") from None
    except IsADirectoryError:
        raise FormatError(path, "is a directory, not a file") from None
    except OSError as e:
        raise FormatError(path, f"cannot open: {e.strerror}") from None


def _read_header(f, path, magic, kind):
    """The 256 header ints of the open file f (as Python ints), and the file's size."""
    size = os.fstat(f.fileno()).st_size
    raw = f.read(HEADER_BYTES)
    if len(raw) >= 4:
        found = int.from_bytes(raw[:4], "little", signed=True)
        if found != magic:
            if found in FILE_KINDS:
                raise FormatError(path, f"this is {FILE_KINDS[found]}, not {kind} "
                                        f"(magic number {found}, expected {magic})")
            looks = " (it begins like a text file)" if _looks_like_text(raw[:64]) else ""
            raise FormatError(path, f"not {kind}: bad magic number {found} "
                                    f"(expected {magic}){looks}")
    if len(raw) < HEADER_BYTES:
        what = "empty file" if size == 0 else f"{size} bytes"
        raise FormatError(path, f"truncated: {what}, shorter than the {HEADER_BYTES}-byte "
                                f"header of {kind}")
    return [int(v) for v in np.frombuffer(raw, dtype="<i4")], size


def _looks_like_text(raw):
    return all(32 <= byte < 127 or byte in b"\t\n\r" for byte in raw)


def _check_size(path, actual, expected, contents, hint=""):
    if actual != expected:
        problem = "truncated" if actual < expected else "too long"
        raise FormatError(path, f"{problem}: expected {expected} bytes ({contents}), "
                                f"found {actual}{hint}")


def _read_array(f, path, dtype, count):
    data = np.fromfile(f, dtype=dtype, count=count)
    if data.size != count:  # the file shrank after its size was checked
        raise FormatError(path, f"truncated: could read only {data.size} of {count} values")
    return data


# ----------------------------------------------------------------------------
# writing: headers and atomic files

def _header(magic, version, *values):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1] = magic, version
    header[2:2 + len(values)] = values
    return header.tobytes()


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


def _as_params(config, params, who):
    params = np.asarray(params)
    if params.shape != (config.num_parameters(),):
        raise ValueError(f"{who}: expected {config.num_parameters()} parameters for "
                         f"{config.describe()}, got an array of shape {params.shape}")
    return np.ascontiguousarray(params, dtype="<f4")


# ----------------------------------------------------------------------------
# model checkpoint

def read_checkpoint(path):
    """(GPT2Config, params: float32 1-D) from an llm.c model checkpoint (fp32 or bf16)."""
    with _open(path) as f:
        header, size = _read_header(f, path, MODEL_MAGIC, "a model checkpoint")
        version = header[1]
        if version not in MODEL_VERSIONS:
            hint = " (an llm.c checkpoint from before the padded vocab: re-export it)" \
                if version in (1, 2) else ""
            raise FormatError(path, f"unsupported checkpoint version {version}{hint}; "
                                    f"supported: 3 (fp32), 5 (bf16)")
        maxT, V, L, NH, C, Vp = header[2:8]
        problem = _config_problem(maxT, V, Vp, L, NH, C)
        if problem:
            raise FormatError(path, f"bad header: {problem}")
        config = GPT2Config(max_seq_len=maxT, vocab_size=V, padded_vocab_size=Vp,
                            num_layers=L, num_heads=NH, channels=C)
        dtype = MODEL_VERSIONS[version]
        count = config.num_parameters()
        itemsize = 4 if dtype == "float32" else 2
        _check_size(path, size, HEADER_BYTES + count * itemsize,
                    f"header + {count} {dtype} parameters for {config.describe()}")
        data = _read_array(f, path, "<f4" if dtype == "float32" else "<u2", count)
    if dtype == "float32":
        return config, data.astype(np.float32, copy=False)
    return config, bfloat16_bits_to_float32(data)


def write_checkpoint(path, config, params, dtype="float32"):
    """Write params (1-D, config's layout) as an llm.c checkpoint: "float32" is version 3,
    "bfloat16" version 5 (each value rounded to the nearest bf16, ties to even)."""
    versions = {name: version for version, name in MODEL_VERSIONS.items()}
    if dtype not in versions:
        raise ValueError(f"write_checkpoint: dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    params = _as_params(config, params, "write_checkpoint")
    header = _header(MODEL_MAGIC, versions[dtype], config.max_seq_len, config.vocab_size,
                     config.num_layers, config.num_heads, config.channels,
                     config.padded_vocab_size)

    def chunks():
        yield header
        if dtype == "float32":
            yield params
        else:  # one tensor at a time, to keep the rounding's temporaries small
            for tensor in param_views(config, params).values():
                yield float32_to_bfloat16_bits(tensor).astype("<u2", copy=False)

    atomic_write(path, chunks())


# ----------------------------------------------------------------------------
# debug state: one batch, its logits and loss, and the gradients, from a reference run

@dataclass
class DebugState:
    x: np.ndarray       # (B, T) int32, the input tokens
    y: np.ndarray       # (B, T) int32, the target tokens
    logits: np.ndarray  # (B, T, V) float32, over the real vocab
    loss: float         # the mean cross-entropy loss over the B*T positions
    grads: np.ndarray   # (num_parameters,) float32, the checkpoint's layout (wte padded to Vp)


def _check_token_ids(path, name, tokens, vocab_size):
    bad = np.flatnonzero((tokens < 0) | (tokens >= vocab_size))
    if bad.size:
        b, t = np.unravel_index(bad[0], tokens.shape)
        raise FormatError(path, f"{name}[{b}, {t}] = {tokens[b, t]} is not a token id in "
                                f"[0, V={vocab_size}) ({bad.size} such in {name})")


def read_debug_state(path, config):
    """The DebugState in path, for the model config (whose sizes the file does not repeat)."""
    with _open(path) as f:
        header, size = _read_header(f, path, DEBUG_STATE_MAGIC, "a debug state")
        version = header[1]
        if version != DEBUG_STATE_VERSION:
            hint = " (an llm.c debug state from before the padded vocab: re-export it)" \
                if version == 1 else ""
            raise FormatError(path, f"unsupported debug state version {version}{hint}; "
                                    f"supported: {DEBUG_STATE_VERSION}")
        B, T = header[2], header[3]
        if B <= 0 or T <= 0:
            raise FormatError(path, f"bad header: B={B} and T={T} must be positive")
        if T > config.max_seq_len:
            raise FormatError(path, f"T={T} exceeds the model's max_seq_len="
                                    f"{config.max_seq_len}")
        V, count = config.vocab_size, config.num_parameters()
        _check_size(path, size, HEADER_BYTES + 4 * (2 * B * T + B * T * V + 1 + count),
                    f"header + x, y, logits, loss and {count} gradients for B={B} T={T} "
                    f"and {config.describe()}", "; is it the debug state of that model?")
        x = _read_array(f, path, "<i4", B * T).reshape(B, T)
        y = _read_array(f, path, "<i4", B * T).reshape(B, T)
        logits = _read_array(f, path, "<f4", B * T * V).reshape(B, T, V)
        loss = float(_read_array(f, path, "<f4", 1)[0])
        grads = _read_array(f, path, "<f4", count)
    _check_token_ids(path, "x", x, V)
    _check_token_ids(path, "y", y, V)
    return DebugState(x=x.astype(np.int32, copy=False), y=y.astype(np.int32, copy=False),
                      logits=logits.astype(np.float32, copy=False), loss=loss,
                      grads=grads.astype(np.float32, copy=False))


def write_debug_state(path, x, y, logits, loss, grads):
    """Write a debug state: x, y (B,T) token ids, logits (B,T,V), the mean loss, and the
    gradients as a 1-D vector in the checkpoint's layout."""
    x, y, logits, grads = np.asarray(x), np.asarray(y), np.asarray(logits), np.asarray(grads)
    if x.ndim != 2 or y.shape != x.shape:
        raise ValueError(f"write_debug_state: x and y must both be (B, T), got {x.shape} "
                         f"and {y.shape}")
    B, T = x.shape
    if logits.ndim != 3 or logits.shape[:2] != (B, T):
        raise ValueError(f"write_debug_state: logits must be (B={B}, T={T}, V), "
                         f"got {logits.shape}")
    if grads.ndim != 1:
        raise ValueError(f"write_debug_state: grads must be 1-D, got {grads.shape}")
    V = logits.shape[2]
    for name, tokens in (("x", x), ("y", y)):
        if tokens.size and (tokens.min() < 0 or tokens.max() >= V):
            raise ValueError(f"write_debug_state: {name} holds token ids outside [0, V={V})")
    atomic_write(path, [
        _header(DEBUG_STATE_MAGIC, DEBUG_STATE_VERSION, B, T),
        np.ascontiguousarray(x, dtype="<i4"),
        np.ascontiguousarray(y, dtype="<i4"),
        np.ascontiguousarray(logits, dtype="<f4"),
        np.array([loss], dtype="<f4"),
        np.ascontiguousarray(grads, dtype="<f4"),
    ])


# ----------------------------------------------------------------------------
# tokenizer: the bytes of each token, for decoding

def read_tokenizer(path):
    """(tokens: list of bytes, eot_token). A version-1 file stores no eot: like llm.c this
    assumes GPT-2's 50256 when it holds 50257 tokens, and gives None otherwise."""
    with _open(path) as f:
        header, size = _read_header(f, path, TOKENIZER_MAGIC, "a tokenizer")
        data = f.read()
    version, n = header[1], header[2]
    if version not in (1, 2):
        raise FormatError(path, f"unsupported tokenizer version {version}; supported: 1, 2")
    if n <= 0:
        raise FormatError(path, f"bad header: vocab size {n} must be positive")
    if version == 1:
        eot_token = GPT2_EOT_TOKEN if n == GPT2_EOT_TOKEN + 1 else None
    else:
        eot_token = header[3]
        if not 0 <= eot_token < n:
            raise FormatError(path, f"bad header: eot token {eot_token} is not in [0, {n})")
    tokens, pos = [], 0
    for i in range(n):
        if pos >= len(data):
            raise FormatError(path, f"truncated: the header declares {n} tokens, the file "
                                    f"({size} bytes) ends after {i}")
        length = data[pos]
        if length == 0:
            raise FormatError(path, f"token {i} has length 0 (every token is at least 1 byte)")
        if pos + 1 + length > len(data):
            raise FormatError(path, f"truncated: token {i} of {n} needs "
                                    f"{HEADER_BYTES + pos + 1 + length} bytes, found {size}")
        tokens.append(data[pos + 1:pos + 1 + length])
        pos += 1 + length
    if pos != len(data):
        raise FormatError(path, f"too long: the {n} tokens the header declares end at byte "
                                f"{HEADER_BYTES + pos}, the file has {size} bytes")
    return tokens, eot_token


def write_tokenizer(path, tokens, eot_token):
    """Write a version-2 tokenizer: the bytes of each token (1 to 255 of them) and the eot id."""
    n = len(tokens)
    if n == 0:
        raise ValueError("write_tokenizer: no tokens")
    if not 0 <= eot_token < n:
        raise ValueError(f"write_tokenizer: eot token {eot_token} is not in [0, {n})")
    body = bytearray()
    for i, token in enumerate(tokens):
        if not isinstance(token, (bytes, bytearray, memoryview)):
            raise ValueError(f"write_tokenizer: token {i} is {type(token).__name__}, not bytes")
        if not 1 <= len(token) <= 255:
            raise ValueError(f"write_tokenizer: token {i} has {len(token)} bytes, "
                             f"outside the 1..255 a uint8 length allows")
        body.append(len(token))
        body += token
    atomic_write(path, [_header(TOKENIZER_MAGIC, TOKENIZER_VERSION, n, eot_token), body])


# ----------------------------------------------------------------------------
# token shard: a stretch of tokenized text for the dataloader

def read_shard(path, mmap=False):
    """The tokens (uint16 1-D) of a GPT-2 token shard; mmap=True maps the file read-only
    instead of reading it into memory."""
    with _open(path) as f:
        header, size = _read_header(f, path, SHARD_MAGIC, "a GPT-2 token shard")
        version, count = header[1], header[2]
        if version != SHARD_VERSION:
            raise FormatError(path, f"unsupported token shard version {version}; "
                                    f"supported: {SHARD_VERSION}")
        if count < 0:
            raise FormatError(path, f"bad header: token count {count} is negative")
        _check_size(path, size, HEADER_BYTES + 2 * count, f"header + {count} uint16 tokens")
        if mmap and count > 0:
            return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(count,))
        return _read_array(f, path, "<u2", count).astype(np.uint16, copy=False)


def write_shard(path, tokens):
    """Write token ids (each in [0, 2**16)) as a GPT-2 token shard."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"write_shard: tokens must be 1-D, got shape {tokens.shape}")
    if tokens.size:
        if tokens.dtype.kind not in "iub":
            raise ValueError(f"write_shard: tokens must be integers, got {tokens.dtype}")
        if tokens.min() < 0 or tokens.max() >= 2**16:
            raise ValueError(f"write_shard: token ids must be in [0, 65536), got "
                             f"[{tokens.min()}, {tokens.max()}]")
    if tokens.size >= 2**31:
        raise ValueError(f"write_shard: {tokens.size} tokens do not fit an int32 count")
    atomic_write(path, [_header(SHARD_MAGIC, SHARD_VERSION, tokens.size),
                        np.ascontiguousarray(tokens, dtype="<u2")])


# ----------------------------------------------------------------------------
# training state: AdamW's moments and the data loader's position, to resume a run

# llm.c's mt19937_state struct (llmc/rand.h), the shuffling RNG of the data loader
MT_STATE_DTYPE = np.dtype([("seed", "<u8"), ("left", "<i4"), ("next", "<u4"),
                           ("state", "<u4", 624), ("matrix_a", "<u4", 2)])
MT_STATE_WORDS = 624


def write_state(path, step, m, v, loader_state, num_processes=1, process_rank=0):
    """Write llm.c's training state (train_gpt2.cu save_state) of process process_rank of a
    run of num_processes, no master weights, on shuffled data: the step, AdamW's m and v (1-D,
    one value per parameter of this process's optimizer shard: all of them but under ZeRO-1)
    and loader_state, the state() of a shuffling DataLoader."""
    m, v = np.asarray(m), np.asarray(v)
    if m.ndim != 1 or v.shape != m.shape:
        raise ValueError(f"write_state: m and v must be 1-D and of one size, got {m.shape} "
                         f"and {v.shape}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0:6] = [STATE_MAGIC, STATE_VERSION, num_processes, process_rank, 0, 1]  # shuffled
    header[10] = step
    header[30:34].view("<u8")[:] = [loader_state["shard_idx"], loader_state["sample_idx"]]
    pos = int(loader_state["rng_pos"])
    rng = np.zeros((), dtype=MT_STATE_DTYPE)
    # NumPy's pos counts the words used since the last twist; llm.c's left_ counts down to it
    rng["left"], rng["next"] = MT_STATE_WORDS + 1 - pos, pos
    rng["state"] = loader_state["rng_key"]
    rng["matrix_a"] = [0, 0x9908B0DF]
    shards, samples = loader_state["shard_indices"], loader_state["intra_shard_indices"]
    atomic_write(path, [
        header, np.ascontiguousarray(m, dtype="<f4"), np.ascontiguousarray(v, dtype="<f4"),
        np.array([len(shards)], "<u8"), np.asarray(shards).astype("<i4"),
        np.array([len(samples)], "<u8"), np.asarray(samples).astype("<i4"),
        rng.tobytes(),
    ])


def read_state_processes(path):
    """(num_processes, process_rank) of the run that wrote the training state at path."""
    with _open(path) as f:
        header = _read_array(f, path, "<i4", HEADER_INTS)
    if header[0] != STATE_MAGIC:
        raise FormatError(path, f"not a training state (magic {header[0]})")
    return int(header[2]), int(header[3])


def read_state(path, num_parameters, num_processes=1, process_rank=0):
    """(step, m, v, loader_state) from the training state at path, for process process_rank of
    a run of num_processes with num_parameters in its optimizer shard (all the model's unless
    ZeRO-1); loader_state is what DataLoader.load_state takes."""
    n = num_parameters
    what = "a model" if num_processes == 1 else "an optimizer shard"
    mismatch = FormatError(path, f"does not fit {what} of {n} parameters (written for a model "
                                 f"of another size{', or -z' if num_processes > 1 else ''}, "
                                 f"or cut short)")
    with _open(path) as f:
        if os.fstat(f.fileno()).st_size < HEADER_BYTES + 8 * n:
            raise mismatch
        header = _read_array(f, path, "<i4", HEADER_INTS)
        if header[0] != STATE_MAGIC or header[1] != STATE_VERSION:
            raise FormatError(path, f"not a training state (magic {header[0]}, "
                                    f"version {header[1]})")
        if tuple(header[2:4]) != (num_processes, process_rank):
            raise FormatError(path, f"written by process {header[3]} of a run of {header[2]}, "
                                    f"read by process {process_rank} of {num_processes}: resume "
                                    f"with as many processes as the run had")
        if tuple(header[4:6]) != (0, 1):
            raise FormatError(path, f"written by a run this trainer cannot continue (master "
                                    f"weights {header[4]}, shuffled data {header[5]})")
        m = _read_array(f, path, "<f4", n).astype(np.float32, copy=False)
        v = _read_array(f, path, "<f4", n).astype(np.float32, copy=False)
        tail = f.read()
    try:  # after m and v: the shard order, the sample order, the RNG
        num_shards = int(np.frombuffer(tail, "<u8", 1, 0)[0])
        shard_indices = np.frombuffer(tail, "<i4", num_shards, 8)
        offset = 8 + 4 * num_shards
        num_samples = int(np.frombuffer(tail, "<u8", 1, offset)[0])
        intra_shard_indices = np.frombuffer(tail, "<i4", num_samples, offset + 8)
        offset += 8 + 4 * num_samples
        rng = np.frombuffer(tail, MT_STATE_DTYPE, 1, offset)[0]
    except ValueError:
        raise mismatch from None
    if offset + MT_STATE_DTYPE.itemsize != len(tail):
        raise mismatch
    shard_idx, sample_idx = (int(x) for x in header[30:34].view("<u8"))
    left = int(rng["left"])
    loader_state = {
        "num_shards": num_shards, "shard_idx": shard_idx, "sample_idx": sample_idx,
        "shard_num_samples": num_samples, "shard_indices": shard_indices,
        "intra_shard_indices": intra_shard_indices, "rng_key": rng["state"],
        "rng_pos": MT_STATE_WORDS if left <= 1 else MT_STATE_WORDS + 1 - left,
    }
    return int(header[10]), m, v, loader_state


# ----------------------------------------------------------------------------
# The Llama family: its config and presets (Llama-2's block as llama2.c and Meta define it)

MULTIPLE_OF = 32             # llama2.c's rounding of the FFN's hidden size


def llama2c_hidden_dim(dim, multiple_of=MULTIPLE_OF):
    """llama2.c's (and Meta's) FFN size: 2/3 of 4*dim, rounded up to a multiple of multiple_of."""
    hidden_dim = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class LlamaConfig:
    dim: int                 # C, the residual stream's channels
    n_layers: int            # L
    n_heads: int             # NH query heads, of head size hs = dim / NH
    n_kv_heads: int          # NKV key/value heads; divides NH (NKV = NH: no grouping)
    vocab_size: int          # V
    hidden_dim: int          # H, the FFN's inner size
    max_seq_len: int         # maxT, the longest sequence (RoPE has no table to outgrow)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    shared_classifier: bool = True   # the output head is the token embedding (llama2.c's stories)

    def __post_init__(self):
        for field in fields(self):  # plain Python numbers: header values arrive as numpy ints
            kind = {"norm_eps": float, "rope_theta": float, "shared_classifier": bool}.get(field.name, int)
            object.__setattr__(self, field.name, kind(getattr(self, field.name)))
        problem = self.problem()
        if problem:
            raise ValueError(f"LlamaConfig: {problem}")

    def problem(self):
        """What is wrong with these sizes, or None."""
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim",
                     "max_seq_len"):
            if getattr(self, name) <= 0:
                return f"{name} must be positive, got {getattr(self, name)}"
        if self.dim % self.n_heads != 0:
            return f"dim={self.dim} is not a multiple of n_heads={self.n_heads}"
        if (self.dim // self.n_heads) % 2 != 0:
            return f"head size dim/n_heads={self.dim // self.n_heads} is odd; RoPE rotates pairs"
        if self.n_heads % self.n_kv_heads != 0:
            return f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}"
        if not (self.norm_eps > 0 and self.rope_theta > 0):
            return f"norm_eps={self.norm_eps} and rope_theta={self.rope_theta} must be positive"
        return None

    @property
    def head_size(self):
        return self.dim // self.n_heads

    @classmethod
    def from_name(cls, name, **overrides):
        """A preset by name (PRESETS), or dN: a tiny test model of depth N (from_depth)."""
        if name in PRESETS:
            return replace(PRESETS[name], **overrides)
        if name[:1] == "d" and name[1:].isdigit() and int(name[1:]) > 0:
            return replace(cls.from_depth(int(name[1:])), **overrides)
        raise ValueError(f"LlamaConfig.from_name: {name!r} is neither dN (N >= 1) nor one of "
                         f"{', '.join(PRESETS)}")

    @classmethod
    def from_depth(cls, depth, vocab_size=32000, max_seq_len=1024):
        """dN: N layers of dim 64N with N heads of size 64; N/2 kv heads for even N >= 2, one
        kv head for odd N >= 3 (grouped-query attention from d2 on); llama2.c's hidden_dim."""
        if depth <= 0:
            raise ValueError(f"LlamaConfig.from_depth: depth must be positive, got {depth}")
        n_kv_heads = depth // 2 if depth % 2 == 0 else 1
        return cls(dim=64 * depth, n_layers=depth, n_heads=depth, n_kv_heads=n_kv_heads,
                   vocab_size=vocab_size, hidden_dim=llama2c_hidden_dim(64 * depth),
                   max_seq_len=max_seq_len)

    def param_shapes(self):
        """The parameter tensors as (name, shape) in the flat buffer's order: llama2.c's
        checkpoint order, Meta's names, per-layer tensors stacked along a leading L axis, each
        matrix as nn.Linear keeps it (out_features, in_features)."""
        C, L, V, H = self.dim, self.n_layers, self.vocab_size, self.hidden_dim
        q_dim, kv_dim = self.n_heads * self.head_size, self.n_kv_heads * self.head_size
        shapes = [
            ("tok_embeddings", (V, C)),
            ("attention_norm", (L, C)),
            ("wq", (L, q_dim, C)),
            ("wk", (L, kv_dim, C)),
            ("wv", (L, kv_dim, C)),
            ("wo", (L, C, q_dim)),
            ("ffn_norm", (L, C)),
            ("w1", (L, H, C)),
            ("w2", (L, C, H)),
            ("w3", (L, H, C)),
            ("norm", (C,)),
        ]
        if not self.shared_classifier:
            shapes.append(("output", (V, C)))
        return shapes

    def num_parameters(self):
        return sum(int(np.prod(shape)) for _, shape in self.param_shapes())

    def describe(self):
        return (f"dim={self.dim} L={self.n_layers} NH={self.n_heads} NKV={self.n_kv_heads} "
                f"V={self.vocab_size} H={self.hidden_dim} maxT={self.max_seq_len} "
                f"{'shared' if self.shared_classifier else 'separate'} classifier")


# Published sizes: llama2.c's TinyStories models, TinyLlama-1.1B, Llama-2-7B
PRESETS = {
    "stories15M": LlamaConfig(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=32000,
                              hidden_dim=llama2c_hidden_dim(288), max_seq_len=256),
    "stories42M": LlamaConfig(dim=512, n_layers=8, n_heads=8, n_kv_heads=8, vocab_size=32000,
                              hidden_dim=llama2c_hidden_dim(512), max_seq_len=1024),
    "stories110M": LlamaConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, vocab_size=32000,
                               hidden_dim=llama2c_hidden_dim(768), max_seq_len=1024),
    "llama-1b": LlamaConfig(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, vocab_size=32000,
                            hidden_dim=5632, max_seq_len=2048, shared_classifier=False),
    "llama-7b": LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, vocab_size=32000,
                            hidden_dim=11008, max_seq_len=4096, shared_classifier=False),
}


# ----------------------------------------------------------------------------
# llama2.c's model files (fp32), as its export.py writes them and run.c reads them
#
#   version 0, "legacy" (run.c's): 7 int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads,
#       vocab_size (negated when the classifier is not the embedding), max_seq_len; then fp32
#       tok_embeddings, attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3, norm (our flat
#       order), RoPE's cos then sin table (max_seq_len, head_size/2) each (llmc/rope.py's;
#       run.c never reads them), and output when the classifier is separate.
#   version 1: 256 bytes of header: uint32 magic 0x616b3432 ("ak42"), int32 version 1, the 7
#       int32 above (vocab_size positive), uint8 shared_classifier, zeros; then fp32
#       attention_norm, ffn_norm, norm, tok_embeddings, wq, wk, wv, wo, w1, w2, w3, [output].
# Neither stores norm_eps nor rope_theta: llama2.c's are 1e-5 and 10000, and only models with
# those are written (GGUF, below, stores both).

LLAMA2C_MAGIC = 0x616B3432
LLAMA2C_V1_HEADER_BYTES = 256
LLAMA2C_LEGACY_HEADER_BYTES = 7 * 4
LLAMA2C_VERSIONS = (0, 1)
LLAMA2C_NORM_EPS, LLAMA2C_ROPE_THETA = 1e-5, 10000.0
# version 1's tensor order, by our names
LLAMA2C_V1_ORDER = ("attention_norm", "ffn_norm", "norm", "tok_embeddings", "wq", "wk", "wv",
                    "wo", "w1", "w2", "w3", "output")


def _llama2c_sizes(config):
    return [config.dim, config.hidden_dim, config.n_layers, config.n_heads, config.n_kv_heads,
            config.vocab_size, config.max_seq_len]


def write_llama_model(path, config, params, version=1):
    """Write a llama2.c model file: version 1 (default; header + fp32) or 0 (run.c's legacy)."""
    if version not in LLAMA2C_VERSIONS:
        raise ValueError(f"write_llama_model: version {version} is not one of {LLAMA2C_VERSIONS} "
                         f"(llama2.c's fp32 formats)")
    if (config.norm_eps, config.rope_theta) != (LLAMA2C_NORM_EPS, LLAMA2C_ROPE_THETA):
        raise ValueError(f"write_llama_model: llama2.c's files cannot hold norm_eps="
                         f"{config.norm_eps} rope_theta={config.rope_theta} (only "
                         f"{LLAMA2C_NORM_EPS} and {LLAMA2C_ROPE_THETA}); export to GGUF instead")
    params = np.asarray(params)
    if params.shape != (config.num_parameters(),):
        raise ValueError(f"write_llama_model: expected {config.num_parameters()} parameters for "
                         f"{config.describe()}, got an array of shape {params.shape}")
    views = param_views(config, np.ascontiguousarray(params, dtype="<f4"))
    sizes = _llama2c_sizes(config)
    if version == 0:
        if not config.shared_classifier:
            sizes[5] = -sizes[5]
        cos, sin = rope_tables(config.max_seq_len, config.head_size, config.rope_theta)
        chunks = [np.array(sizes, dtype="<i4").tobytes()]
        chunks += [views[name] for name in views if name != "output"]
        chunks += [cos.astype("<f4"), sin.astype("<f4")]
        chunks += [views["output"]] if "output" in views else []
    else:
        header = bytearray(LLAMA2C_V1_HEADER_BYTES)
        header[0:4] = np.array([LLAMA2C_MAGIC], dtype="<u4").tobytes()
        header[4:36] = np.array([1, *sizes], dtype="<i4").tobytes()
        header[36] = int(config.shared_classifier)
        chunks = [bytes(header)] + [views[name] for name in LLAMA2C_V1_ORDER if name in views]
    atomic_write(path, chunks)


def read_llama_model(path):
    """(LlamaConfig, params float32 1-D in LlamaConfig.param_shapes() order) from a llama2.c
    model file of either version; raises FormatError naming what is wrong."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(LLAMA2C_V1_HEADER_BYTES)
        if len(raw) < LLAMA2C_LEGACY_HEADER_BYTES:
            raise FormatError(path, f"truncated: {size} bytes, shorter than any llama2.c model "
                                    f"header")
        first = int.from_bytes(raw[:4], "little")
        if first == LLAMA2C_MAGIC:
            if len(raw) < LLAMA2C_V1_HEADER_BYTES:
                raise FormatError(path, f"truncated: {size} bytes, shorter than the "
                                        f"{LLAMA2C_V1_HEADER_BYTES}-byte header of version 1")
            version = int.from_bytes(raw[4:8], "little", signed=True)
            if version != 1:
                what = " (int8 Q8_0, not fp32)" if version == 2 else ""
                raise FormatError(path, f"llama2.c model version {version}{what} is not "
                                        f"supported; supported: 0, 1")
            sizes = [int(v) for v in np.frombuffer(raw[8:36], dtype="<i4")]
            shared, header_bytes = bool(raw[36]), LLAMA2C_V1_HEADER_BYTES
        else:
            if int.from_bytes(raw[:4], "little", signed=True) in FILE_KINDS:
                kind = FILE_KINDS[int.from_bytes(raw[:4], "little", signed=True)]
                raise FormatError(path, f"this is {kind} of llm.c, not a llama2.c model")
            version, header_bytes = 0, LLAMA2C_LEGACY_HEADER_BYTES
            sizes = [int(v) for v in np.frombuffer(raw[:28], dtype="<i4")]
            shared = sizes[5] > 0
            sizes[5] = abs(sizes[5])
        try:
            dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len = sizes
            config = LlamaConfig(dim=dim, n_layers=n_layers, n_heads=n_heads,
                                 n_kv_heads=n_kv_heads, vocab_size=vocab_size,
                                 hidden_dim=hidden_dim, max_seq_len=max_seq_len,
                                 shared_classifier=shared)
        except ValueError as e:
            kind = "version 1" if version == 1 else "legacy (version 0)"
            raise FormatError(path, f"not a llama2.c model: its {kind} header {sizes} is bad "
                                    f"({e})") from None
        count = config.num_parameters()
        rope_floats = 2 * config.max_seq_len * (config.head_size // 2) if version == 0 else 0
        _check_size(path, size, header_bytes + 4 * (count + rope_floats),
                    f"a version {version} header, {count} float32 parameters"
                    + (" and RoPE's tables" if rope_floats else "") + f" for {config.describe()}")
        f.seek(header_bytes)
        data = _read_array(f, path, "<f4", count + rope_floats)
    params = np.empty(count, dtype=np.float32)
    views = param_views(config, params)
    if version == 0:
        layer_floats = count - (0 if shared else views["output"].size)
        params[:layer_floats] = data[:layer_floats]
        if not shared:
            params[layer_floats:] = data[layer_floats + rope_floats:]
    else:
        offset = 0
        for name in LLAMA2C_V1_ORDER:
            if name in views:
                views[name].reshape(-1)[...] = data[offset:offset + views[name].size]
                offset += views[name].size
    return config, params


# ----------------------------------------------------------------------------
# llama2.c's tokenizer.bin: uint32 max_token_length, then per token float32 score, uint32
# length, that many bytes (SentencePiece's pieces with U+2581 turned into a space, BOS as
# "\n<s>\n" and EOS as "\n</s>\n", byte-fallback tokens spelled "<0x0A>").  The file does not
# store the number of tokens: it ends after the last.

def write_llama2c_tokenizer(path, pieces, scores):
    """pieces: the bytes of each token; scores: one float per token."""
    if len(pieces) == 0 or len(pieces) != len(scores):
        raise ValueError(f"write_llama2c_tokenizer: {len(pieces)} pieces and {len(scores)} scores")
    body = bytearray(np.array([max(len(p) for p in pieces)], dtype="<u4").tobytes())
    for piece, score in zip(pieces, scores):
        body += np.array([score], dtype="<f4").tobytes() + np.array([len(piece)], "<u4").tobytes()
        body += piece
    atomic_write(path, bytes(body))


def read_llama2c_tokenizer(path):
    """(pieces: list of bytes, scores: float32 array) of a llama2.c tokenizer.bin."""
    with _open(path) as f:
        data = f.read()
    if len(data) < 4:
        raise FormatError(path, f"truncated: {len(data)} bytes, not a llama2.c tokenizer")
    max_len = int.from_bytes(data[:4], "little")
    if int.from_bytes(data[:4], "little", signed=True) in FILE_KINDS:
        raise FormatError(path, "this is an llm.c file, not a llama2.c tokenizer.bin")
    pieces, scores, pos = [], [], 4
    while pos < len(data):
        if pos + 8 > len(data):
            raise FormatError(path, f"truncated: token {len(pieces)} has no room for its score "
                                    f"and length at byte {pos}")
        score = float(np.frombuffer(data, "<f4", 1, pos)[0])
        length = int.from_bytes(data[pos + 4:pos + 8], "little")
        if length > max_len or pos + 8 + length > len(data):
            raise FormatError(path, f"not a llama2.c tokenizer: token {len(pieces)} claims "
                                    f"{length} bytes (max_token_length {max_len}, "
                                    f"{len(data) - pos - 8} left)")
        pieces.append(data[pos + 8:pos + 8 + length])
        scores.append(score)
        pos += 8 + length
    if not pieces:
        raise FormatError(path, "no tokens")
    return pieces, np.array(scores, dtype=np.float32)


# ----------------------------------------------------------------------------
# Hugging Face safetensors (read with NumPy alone): an 8-byte little-endian header length N,
# N bytes of JSON (per tensor its dtype, shape and [begin, end) byte offsets into the data
# that follows; "__metadata__" is not a tensor), then the raw little-endian tensor data.

SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
                      "F64": np.dtype("<f8")}


def read_safetensors(path):
    """dict name -> float32 array (read-only views where the file already is float32)."""
    with _open(path) as f:
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
# Hugging Face's Llama checkpoints: the names of its tensors, and its q/k rows.  Hugging Face
# stores each head's q and k rows permuted for its rotate-half RoPE (the first half of a head's
# channels paired with the second); llama2.c, Meta and llama.cpp pair adjacent channels.

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


# ----------------------------------------------------------------------------
# GGUF, llama.cpp's file, through its own Python package (gguf): a Llama model in float32 with
# its vocabulary (SentencePiece or GPT-2's BPE), so llama.cpp runs what we trained.  llama.cpp's "llama"
# architecture rotates adjacent channel pairs, as we do: q and k go in unpermuted.

GGUF_LLAMA_TENSORS = {  # ours -> llama.cpp's, {l} the layer
    "tok_embeddings": "token_embd.weight", "norm": "output_norm.weight", "output": "output.weight",
    "attention_norm": "blk.{l}.attn_norm.weight", "wq": "blk.{l}.attn_q.weight",
    "wk": "blk.{l}.attn_k.weight", "wv": "blk.{l}.attn_v.weight", "wo": "blk.{l}.attn_output.weight",
    "ffn_norm": "blk.{l}.ffn_norm.weight", "w1": "blk.{l}.ffn_gate.weight",
    "w2": "blk.{l}.ffn_down.weight", "w3": "blk.{l}.ffn_up.weight",
}


class GGUFVocab:
    """A vocabulary as GGUF's tokenizer.ggml.* keys hold it: llama.cpp's tokenizer `model`
    ("llama": SentencePiece, "gpt2": byte-level BPE), each token's text and gguf TokenType, the
    SentencePiece scores or the BPE merges, and the special ids."""

    def __init__(self, model, tokens, types, scores=None, merges=None, pre=None,
                 bos=None, eos=None, unk=None, add_bos=False):
        self.model, self.tokens, self.types, self.scores = model, tokens, types, scores
        self.merges, self.pre, self.bos, self.eos, self.unk = merges, pre, bos, eos, unk
        self.add_bos = add_bos

    def add_to(self, writer):
        writer.add_tokenizer_model(self.model)
        if self.pre is not None:
            writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.types)
        if self.scores is not None:
            writer.add_token_scores(self.scores)
        if self.merges is not None:
            writer.add_token_merges(self.merges)
        for add, token_id in ((writer.add_unk_token_id, self.unk), (writer.add_bos_token_id, self.bos),
                              (writer.add_eos_token_id, self.eos)):
            if token_id is not None:
                add(token_id)
        writer.add_add_bos_token(self.add_bos)


def sentencepiece_gguf_vocab(pieces, scores):
    """The GGUF vocabulary of a llama2.c tokenizer.bin's pieces and scores: spaces back to
    U+2581 as SentencePiece spells them, BOS/EOS as <s> and </s>."""
    import gguf
    tokens, types = [], []
    for i, piece in enumerate(pieces):
        text = {b"\n<s>\n": "<s>", b"\n</s>\n": "</s>"}.get(piece) or \
            piece.decode("utf-8", errors="replace").replace(" ", "\u2581")
        tokens.append(text)
        if i == 0:
            types.append(gguf.TokenType.UNKNOWN)
        elif i in (1, 2):
            types.append(gguf.TokenType.CONTROL)
        elif len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    return GGUFVocab("llama", tokens, types, scores=[float(s) for s in scores],
                     unk=0, bos=1, eos=2, add_bos=True)


def gpt2_byte_text():
    """byte -> the printable character GPT-2's vocabulary files spell it with: printable
    Latin-1 bytes stand for themselves, the other 68 for U+0100 onwards in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    text, unprintable = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in text:
            text[b] = chr(0x100 + unprintable)
            unprintable += 1
    return text


def bpe_merges(token_bytes, special=()):
    """The merges of a byte-level BPE vocabulary listed in rank order (as tiktoken's and
    llm.c's GPT-2 files are): token r's pair is what BPE with the merges below r leaves of its
    bytes; one pair per multi-byte token, in the order of the tokens they make."""
    rank = {t: i for i, t in enumerate(token_bytes) if i not in special}
    merges = []
    for r, token in enumerate(token_bytes):
        if r in special or len(token) < 2:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            ranks = [rank.get(parts[j] + parts[j + 1], r) for j in range(len(parts) - 1)]
            best = min(range(len(ranks)), key=ranks.__getitem__)
            if ranks[best] >= r:
                raise ValueError(f"token {r} ({token!r}) is not made by merging earlier tokens: "
                                 f"not a BPE vocabulary in rank order")
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        if rank.get(parts[0], r) >= r or rank.get(parts[1], r) >= r:
            raise ValueError(f"token {r} ({token!r}) is not made by merging earlier tokens: "
                             f"not a BPE vocabulary in rank order")
        merges.append((parts[0], parts[1]))
    return merges


def gpt2_gguf_vocab(token_bytes, eot_token, vocab_size):
    """The GGUF vocabulary ("gpt2" byte-level BPE, GPT-2's pre-tokenizer) of llm.c's
    tokenizer file (each token's bytes in rank order, the end-of-text id), padded to the
    model's vocab_size with unused tokens as llm.c pads GPT-2's 50257 to 50304."""
    import gguf
    if vocab_size < len(token_bytes):
        raise ValueError(f"the tokenizer has {len(token_bytes)} tokens, more than the model's "
                         f"vocabulary {vocab_size}")
    special = () if eot_token is None else (eot_token,)
    byte_text = gpt2_byte_text()
    spell = lambda b: "".join(byte_text[x] for x in b)  # noqa: E731
    tokens = [t.decode("utf-8") if i in special else spell(t) for i, t in enumerate(token_bytes)]
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
             for i in range(len(token_bytes))]
    for i in range(len(token_bytes), vocab_size):
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
    merges = [f"{spell(a)} {spell(b)}" for a, b in bpe_merges(token_bytes, special)]
    return GGUFVocab("gpt2", tokens, types, merges=merges, pre="gpt-2", bos=eot_token,
                     eos=eot_token)


def gguf_vocab(tokenizer_path, vocab_size):
    """The GGUF vocabulary of a tokenizer file: llm.c's (GPT-2 BPE) or llama2.c's
    tokenizer.bin (SentencePiece), told apart by llm.c's magic number."""
    with _open(tokenizer_path) as f:
        head = f.read(4)
    if int.from_bytes(head, "little", signed=True) == TOKENIZER_MAGIC:
        token_bytes, eot_token = read_tokenizer(tokenizer_path)
        return gpt2_gguf_vocab(token_bytes, eot_token, vocab_size)
    pieces, scores = read_llama2c_tokenizer(tokenizer_path)
    return sentencepiece_gguf_vocab(pieces, scores)


def write_gguf(path, config, params, vocab, name="llm.pyx llama"):
    """A GGUF file (float32) of this Llama model with its vocabulary (a GGUFVocab, see
    gguf_vocab), as llama.cpp's "llama" architecture reads it."""
    try:
        import gguf
    except ImportError:
        raise RuntimeError("GGUF export needs the gguf package (llama.cpp's writer): "
                           "pip install gguf") from None
    if len(vocab.tokens) != config.vocab_size:
        raise ValueError(f"write_gguf: the tokenizer has {len(vocab.tokens)} tokens, the model's "
                         f"vocabulary {config.vocab_size}")
    views = param_views(config, np.ascontiguousarray(params, dtype=np.float32))
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    writer = gguf.GGUFWriter(tmp, "llama")
    try:
        writer.add_name(name)
        writer.add_context_length(config.max_seq_len)
        writer.add_embedding_length(config.dim)
        writer.add_block_count(config.n_layers)
        writer.add_feed_forward_length(config.hidden_dim)
        writer.add_rope_dimension_count(config.head_size)
        writer.add_head_count(config.n_heads)
        writer.add_head_count_kv(config.n_kv_heads)
        writer.add_layer_norm_rms_eps(config.norm_eps)
        writer.add_rope_freq_base(config.rope_theta)
        writer.add_vocab_size(config.vocab_size)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        vocab.add_to(writer)
        for ours, theirs in GGUF_LLAMA_TENSORS.items():
            if ours not in views:
                continue
            per_layer = "{l}" in theirs
            for l in range(config.n_layers if per_layer else 1):
                tensor = views[ours][l] if per_layer else views[ours]
                writer.add_tensor(theirs.format(l=l), np.ascontiguousarray(tensor))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_gguf(path):
    """(LlamaConfig, params, tokens) of a float32 llama GGUF file, through gguf's reader."""
    import gguf
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise FormatError(path, f"not a GGUF file: {' '.join(str(e).split())}") from None

    def field(key):
        f = reader.get_field(key)
        if f is None:
            raise FormatError(path, f"no {key}: not a llama GGUF?")
        return f.contents()
    if field("general.architecture") != "llama":
        raise FormatError(path, f"architecture {field('general.architecture')!r}, not llama")
    tensors = {t.name: t for t in reader.tensors}
    config = LlamaConfig(
        dim=field("llama.embedding_length"), n_layers=field("llama.block_count"),
        n_heads=field("llama.attention.head_count"), n_kv_heads=field("llama.attention.head_count_kv"),
        vocab_size=len(field("tokenizer.ggml.tokens")), hidden_dim=field("llama.feed_forward_length"),
        max_seq_len=field("llama.context_length"),
        # float32 there: the shortest decimal that rounds to it gives back what was written
        norm_eps=float(str(np.float32(field("llama.attention.layer_norm_rms_epsilon")))),
        rope_theta=float(str(np.float32(field("llama.rope.freq_base")))), shared_classifier="output.weight" not in tensors)
    params = np.empty(config.num_parameters(), dtype=np.float32)
    for ours, view in param_views(config, params).items():
        theirs = GGUF_LLAMA_TENSORS[ours]
        per_layer = "{l}" in theirs
        for l in range(config.n_layers if per_layer else 1):
            tensor = tensors[theirs.format(l=l)]
            if tensor.tensor_type != gguf.GGMLQuantizationType.F32:
                raise FormatError(path, f"{tensor.name} is {tensor.tensor_type.name}, not F32")
            (view[l] if per_layer else view)[...] = np.asarray(tensor.data).reshape(
                view.shape[1:] if per_layer else view.shape)
    return config, params, field("tokenizer.ggml.tokens")
