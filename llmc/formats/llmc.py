"""
llm.c's file formats: model checkpoints, debug states, tokenizers, token shards and training
states, read and written byte-for-byte as llm.c reads and writes them.

Every file starts with a header of 256 little-endian int32 (1024 bytes); the data follows.

    model checkpoint  magic 20240326, version 3 (fp32) or 5 (bf16)
        header [2] max_seq_len [3] vocab_size V [4] num_layers L [5] num_heads NH
               [6] channels C [7] padded_vocab_size Vp
        data   the 16 parameter tensors in llm.c's order (train_gpt2.param_shapes), wte
               padded with zero rows from V to Vp, all in fp32 or all in bf16
    debug state       magic 20240327, version 2
        header [2] B [3] T
        data   x (B,T) int32, y (B,T) int32, logits (B,T,V) fp32 over the real vocab,
               loss (one fp32), the gradients of all parameters in fp32 (checkpoint layout)
    tokenizer         magic 20240328, version 1 (no eot) or 2
        header [2] number of tokens [3] eot token (version 2)
        data   per token: its length as one uint8, then that many bytes
    token shard       magic 20240520, version 1 (GPT-2's: uint16 tokens), or magic 20240801,
                      version 7 (llm.c's Llama 3 layout: uint32, for vocabularies past 65,536)
        header [2] number of tokens
        data   the tokens as uint16 (uint32)
    eval file         magic 20240522, version 1 (llm.c's HellaSwag and MMLU: multiple choice)
        header [2] number of examples [3] the longest example's bytes
        data   per example, uint16: 65535 (its start), its bytes (these fields included), its
               index, the label (the right completion), the number of completions (4), the
               context's length and tokens, then each completion's length and tokens
    training state    magic 20240527, version 1 (train_gpt2.cu's state_%08d_%05d.bin)
        header [2] processes [3] rank [4] master weights (1: a bf16 run's) [5] shuffled data
               [10] step [11] llm.pyx's: the AdamW t of the last update, the seed of the
               stochastic rounding of the bf16 parameters (0: none yet, or llm.c's file)
               [30:32] shard index, [32:34] sample index of the data loader (each a uint64)
        data   AdamW's m and v (fp32, one per parameter of the process's optimizer shard), with
               master weights the fp32 master weights of that shard, then the data loader: the
               number of shards (uint64) and their order (int32), the number of samples of the
               current shard (uint64) and their order (int32), and its RNG (llm.c's
               mt19937_state)

The debug state and the training state serve the Llama family too (its parameters in its
own layout); the checkpoint is GPT-2's: its reader makes the config of the class its caller
gives (train_gpt2.GPT2Config).
"""
import os
from dataclasses import dataclass

import numpy as np

from llmc.formats.common import (FormatError, atomic_write, bfloat16_bits_to_float32, check_size,
                                 float32_to_bfloat16_bits, open_file, param_views, read_array)

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4

MODEL_MAGIC = 20240326
DEBUG_STATE_MAGIC = 20240327
TOKENIZER_MAGIC = 20240328
SHARD_MAGIC = 20240520
WIDE_SHARD_MAGIC = 20240801
EVAL_MAGIC = 20240522
STATE_MAGIC = 20240527

MODEL_VERSIONS = {3: "float32", 5: "bfloat16"}
DEBUG_STATE_VERSION = 2
TOKENIZER_VERSION = 2
SHARD_VERSION = 1
WIDE_SHARD_VERSION = 7
EVAL_VERSION = 1
STATE_VERSION = 1

# the magic numbers of llm.c's files, to say what a file passed in the wrong place is
FILE_KINDS = {
    MODEL_MAGIC: "a model checkpoint",
    DEBUG_STATE_MAGIC: "a debug state",
    TOKENIZER_MAGIC: "a tokenizer",
    SHARD_MAGIC: "a GPT-2 token shard",
    WIDE_SHARD_MAGIC: "a uint32 token shard (llm.c's Llama 3 layout)",
    EVAL_MAGIC: "an eval file (HellaSwag/MMLU)",
    STATE_MAGIC: "a training state",
}

GPT2_EOT_TOKEN = 50256  # what llm.c assumes for a version-1 tokenizer of the 50257 GPT-2 tokens


# ----------------------------------------------------------------------------
# the 256-int header

def _read_header(f, path, magic, kind, text_fix=""):
    """The 256 header ints of the open file f (as Python ints), and the file's size; text_fix:
    what to do with a text file given in its place (said after "it begins like a text file")."""
    size = os.fstat(f.fileno()).st_size
    raw = f.read(HEADER_BYTES)
    if len(raw) >= 4:
        found = int.from_bytes(raw[:4], "little", signed=True)
        if found != magic:
            if found in FILE_KINDS:
                raise FormatError(path, f"this is {FILE_KINDS[found]}, not {kind} "
                                        f"(magic number {found}, expected {magic})")
            looks = f" (it begins like a text file{text_fix})" if looks_like_text(raw[:64]) else ""
            raise FormatError(path, f"not {kind}: bad magic number {found} "
                                    f"(expected {magic}){looks}")
    if len(raw) < HEADER_BYTES:
        what = "empty file" if size == 0 else f"{size} bytes"
        raise FormatError(path, f"truncated: {what}, shorter than the {HEADER_BYTES}-byte "
                                f"header of {kind}")
    return [int(v) for v in np.frombuffer(raw, dtype="<i4")], size


def looks_like_text(raw):
    return all(32 <= byte < 127 or byte in b"\t\n\r" for byte in raw)


def _header(magic, version, *values):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1] = magic, version
    header[2:2 + len(values)] = values
    return header.tobytes()


def _as_params(config, params, who):
    params = np.asarray(params)
    if params.shape != (config.num_parameters(),):
        raise ValueError(f"{who}: expected {config.num_parameters()} parameters for "
                         f"{config.describe()}, got an array of shape {params.shape}")
    return np.ascontiguousarray(params, dtype="<f4")


# ----------------------------------------------------------------------------
# model checkpoint

def read_checkpoint(path, config_class):
    """(config, params: float32 1-D) from an llm.c model checkpoint (fp32 or bf16); the config
    is a config_class (train_gpt2.GPT2Config), checked by its size_problem first."""
    with open_file(path) as f:
        header, size = _read_header(f, path, MODEL_MAGIC, "a model checkpoint")
        version = header[1]
        if version not in MODEL_VERSIONS:
            hint = " (an llm.c checkpoint from before the padded vocab: re-export it)" \
                if version in (1, 2) else ""
            raise FormatError(path, f"unsupported checkpoint version {version}{hint}; "
                                    f"supported: 3 (fp32), 5 (bf16)")
        maxT, V, L, NH, C, Vp = header[2:8]
        problem = config_class.size_problem(maxT, V, Vp, L, NH, C)
        if problem:
            raise FormatError(path, f"bad header: {problem}")
        config = config_class(max_seq_len=maxT, vocab_size=V, padded_vocab_size=Vp,
                              num_layers=L, num_heads=NH, channels=C)
        dtype = MODEL_VERSIONS[version]
        count = config.num_parameters()
        itemsize = 4 if dtype == "float32" else 2
        check_size(path, size, HEADER_BYTES + count * itemsize,
                   f"header + {count} {dtype} parameters for {config.describe()}")
        data = read_array(f, path, "<f4" if dtype == "float32" else "<u2", count)
    if dtype == "float32":
        return config, data.astype(np.float32, copy=False)
    return config, bfloat16_bits_to_float32(data)


def checkpoint_dtype(path):
    """The dtype an llm.c model checkpoint stores its parameters in: "float32" (version 3) or
    "bfloat16" (version 5); read_checkpoint widens both to float32."""
    with open_file(path) as f:
        header, _ = _read_header(f, path, MODEL_MAGIC, "a model checkpoint")
    if header[1] not in MODEL_VERSIONS:
        raise FormatError(path, f"unsupported checkpoint version {header[1]}; supported: 3 "
                                f"(fp32), 5 (bf16)")
    return MODEL_VERSIONS[header[1]]


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
    with open_file(path) as f:
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
        check_size(path, size, HEADER_BYTES + 4 * (2 * B * T + B * T * V + 1 + count),
                   f"header + x, y, logits, loss and {count} gradients for B={B} T={T} "
                   f"and {config.describe()}", "; is it the debug state of that model?")
        x = read_array(f, path, "<i4", B * T).reshape(B, T)
        y = read_array(f, path, "<i4", B * T).reshape(B, T)
        logits = read_array(f, path, "<f4", B * T * V).reshape(B, T, V)
        loss = float(read_array(f, path, "<f4", 1)[0])
        grads = read_array(f, path, "<f4", count)
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
    with open_file(path) as f:
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

# the two layouts of a token shard: its dtype -> (magic, version, what it is called)
SHARD_LAYOUTS = {np.dtype("<u2"): (SHARD_MAGIC, SHARD_VERSION, "a GPT-2 token shard"),
                 np.dtype("<u4"): (WIDE_SHARD_MAGIC, WIDE_SHARD_VERSION, "a uint32 token shard")}


def shard_dtype(vocab_size):
    """The token dtype of a vocabulary's shards: uint16 up to 65,536 tokens, else uint32."""
    return np.dtype("<u2") if vocab_size <= 2 ** 16 else np.dtype("<u4")


def read_shard(path, mmap=False, dtype=None):
    """The tokens (1-D, uint16 or uint32 by the shard's layout) of a token shard; dtype: the
    layout the caller takes (None: either), the other refused by name; mmap=True maps the file
    read-only instead of reading it into memory."""
    with open_file(path) as f:
        raw = f.read(4)
        f.seek(0)
        found = int.from_bytes(raw, "little", signed=True) if len(raw) == 4 else None
        layouts = {magic: d for d, (magic, _, _) in SHARD_LAYOUTS.items()}
        own = layouts.get(found, np.dtype("<u2"))
        expected = own if dtype is None else np.dtype(dtype)
        magic, version, kind = SHARD_LAYOUTS[expected]
        header, size = _read_header(f, path, magic, kind, text_fix=(
            f": make token shards of it with python dev/data/text_to_shards.py {path}"))
        count = header[2]
        if header[1] != version:
            raise FormatError(path, f"unsupported token shard version {header[1]} for magic "
                                    f"{magic}; supported: {version}")
        if count < 0:
            raise FormatError(path, f"bad header: token count {count} is negative")
        width = expected.itemsize
        check_size(path, size, HEADER_BYTES + width * count,
                   f"header + {count} uint{8 * width} tokens")
        if mmap and count > 0:
            return np.memmap(path, dtype=expected, mode="r", offset=HEADER_BYTES, shape=(count,))
        return read_array(f, path, expected, count).astype(expected.newbyteorder("="), copy=False)


def write_shard(path, tokens, dtype="<u2"):
    """Write token ids (each below 2**16 for uint16, 2**32 for uint32: shard_dtype) as a token
    shard of that layout."""
    dtype = np.dtype(dtype)
    magic, version, _ = SHARD_LAYOUTS[dtype]
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"write_shard: tokens must be 1-D, got shape {tokens.shape}")
    if tokens.size:
        if tokens.dtype.kind not in "iub":
            raise ValueError(f"write_shard: tokens must be integers, got {tokens.dtype}")
        top = 2 ** (8 * dtype.itemsize)
        if tokens.min() < 0 or tokens.max() >= top:
            raise ValueError(f"write_shard: token ids must be in [0, {top}) in uint{8 * dtype.itemsize} "
                             f"shards, got [{tokens.min()}, {tokens.max()}]")
    if tokens.size >= 2**31:
        raise ValueError(f"write_shard: {tokens.size} tokens do not fit an int32 count")
    atomic_write(path, [_header(magic, version, tokens.size),
                        np.ascontiguousarray(tokens, dtype=dtype)])


# ----------------------------------------------------------------------------
# eval file: multiple-choice examples (HellaSwag), scored by the loss of each completion

EVAL_START = 2 ** 16 - 1       # the uint16 that starts every example (so no token can be it)
EVAL_COMPLETIONS = 4           # llm.c's evalloader takes 4 completions an example, no other
EVAL_FIELDS = 6                # start, bytes, index, label, completions, context length


@dataclass
class EvalExample:
    context: np.ndarray        # the context's token ids (int32, at least one)
    completions: list          # each completion's token ids (int32 arrays, at least one each)
    label: int                 # the index of the right completion


def write_evalfile(path, examples):
    """Write EvalExamples as llm.c's eval file (its dev/data/data_common.py write_evalfile):
    every example with 4 completions, token ids below 65535."""
    if not examples:
        raise ValueError("write_evalfile: no examples")
    if len(examples) >= 2 ** 16:
        raise ValueError(f"write_evalfile: {len(examples)} examples, the uint16 index allows "
                         f"{2 ** 16 - 1}")
    streams = []
    for i, example in enumerate(examples):
        parts = [example.context, *example.completions]
        if len(example.completions) != EVAL_COMPLETIONS:
            raise ValueError(f"write_evalfile: example {i} has {len(example.completions)} "
                             f"completions, llm.c's eval files have {EVAL_COMPLETIONS}")
        if not 0 <= example.label < EVAL_COMPLETIONS:
            raise ValueError(f"write_evalfile: example {i}: label {example.label} is not a "
                             f"completion's index")
        stream = [EVAL_START, 0, i, example.label, EVAL_COMPLETIONS]
        for tokens in parts:
            tokens = np.asarray(tokens, dtype=np.int64)
            if tokens.ndim != 1 or tokens.size == 0:
                raise ValueError(f"write_evalfile: example {i}: a context or completion is "
                                 f"not a non-empty list of token ids")
            if tokens.min() < 0 or tokens.max() >= EVAL_START:
                raise ValueError(f"write_evalfile: example {i}: token ids must be in "
                                 f"[0, {EVAL_START})")
            stream += [tokens.size, *tokens.tolist()]
        stream[1] = 2 * len(stream)
        if stream[1] >= 2 ** 16:
            raise ValueError(f"write_evalfile: example {i} takes {stream[1]} bytes, more than "
                             f"its uint16 size allows")
        streams.append(np.array(stream, dtype="<u2"))
    longest = max(int(stream[1]) for stream in streams)
    atomic_write(path, [_header(EVAL_MAGIC, EVAL_VERSION, len(examples), longest), *streams])


def read_evalfile(path, vocab_size=None):
    """The EvalExamples of llm.c's eval file, checked as its evalloader reads them: every
    example where its start says, with its index, 4 completions, a label among them and
    lengths that fill its bytes; with vocab_size, every token id below it."""
    with open_file(path) as f:
        header, size = _read_header(f, path, EVAL_MAGIC, "an eval file")
        version, count, longest = header[1:4]
        if version != EVAL_VERSION:
            raise FormatError(path, f"unsupported eval file version {version}; supported: "
                                    f"{EVAL_VERSION}")
        if count <= 0:
            raise FormatError(path, f"bad header: {count} examples")
        if (size - HEADER_BYTES) % 2:
            raise FormatError(path, f"{size} bytes: the examples are not whole uint16s")
        stream = read_array(f, path, "<u2", (size - HEADER_BYTES) // 2).astype(np.int64)
    examples, pos, found_longest = [], 0, 0
    for i in range(count):
        where = f"example {i} (at byte {HEADER_BYTES + 2 * pos})"
        if pos + EVAL_FIELDS > len(stream):
            raise FormatError(path, f"truncated: the header declares {count} examples, the "
                                    f"file ends in or before {where}")
        start, nbytes, index, label, num_completions, _ = stream[pos:pos + EVAL_FIELDS]
        if start != EVAL_START:
            raise FormatError(path, f"{where}: starts with {start}, not {EVAL_START}")
        if index != i:
            raise FormatError(path, f"{where}: has index {index}")
        if num_completions != EVAL_COMPLETIONS:
            raise FormatError(path, f"{where}: has {num_completions} completions, not "
                                    f"{EVAL_COMPLETIONS}")
        if not 0 <= label < num_completions:
            raise FormatError(path, f"{where}: label {label} is not a completion's index")
        end = pos + nbytes // 2
        if nbytes % 2 or end > len(stream):
            raise FormatError(path, f"truncated: {where} has {nbytes} bytes, the file "
                                    f"ends before")
        parts, at = [], pos + EVAL_FIELDS - 1
        for _ in range(1 + num_completions):   # the context, then each completion
            length = stream[at] if at < end else 0
            if length == 0 or at + 1 + length > end:
                raise FormatError(path, f"{where}: its lengths do not fill its {nbytes} bytes")
            parts.append(stream[at + 1:at + 1 + length].astype(np.int32))
            at += 1 + length
        if at != end:
            raise FormatError(path, f"{where}: its lengths do not fill its {nbytes} bytes")
        top = max(int(part.max()) for part in parts)
        if vocab_size is not None and top >= vocab_size:
            raise FormatError(path, f"{where}: token id {top} is outside the model's "
                                    f"vocabulary of {vocab_size} (an eval file of another "
                                    f"tokenizer?)")
        examples.append(EvalExample(context=parts[0], completions=parts[1:], label=int(label)))
        found_longest = max(found_longest, int(nbytes))
        pos = end
    if pos != len(stream):
        raise FormatError(path, f"too long: {2 * (len(stream) - pos)} bytes after the "
                                f"{count} examples the header declares")
    if longest != found_longest:
        raise FormatError(path, f"bad header: the longest example has {longest} bytes, the "
                                f"file's has {found_longest}")
    return examples


# ----------------------------------------------------------------------------
# training state: AdamW's moments and the data loader's position, to resume a run

# llm.c's mt19937_state struct (llmc/rand.h), the shuffling RNG of the data loader
MT_STATE_DTYPE = np.dtype([("seed", "<u8"), ("left", "<i4"), ("next", "<u4"),
                           ("state", "<u4", 624), ("matrix_a", "<u4", 2)])
MT_STATE_WORDS = 624


def write_state(path, step, m, v, loader_state, num_processes=1, process_rank=0, master=None,
                last_update=0, loss_scale=None, loss_scale_steps=0):
    """Write llm.c's training state (train_gpt2.cu save_state) of process process_rank of a
    run of num_processes, on shuffled data: the step, AdamW's m and v (1-D, one value per
    parameter of this process's optimizer shard: all of them but under ZeRO-1) and
    loader_state, the state() of a shuffling DataLoader; a bf16 run also gives master, the
    float32 master weights of the same shard (llm.c's use_master_weights), and last_update,
    the AdamW t of its last update (the seed its bf16 parameters were rounded with); an fp16
    run its loss scale (a power of two: header int 12 is 1 + its log2, 0 without one, as llm.c
    leaves it) and the finite steps since it changed (header int 13)."""
    m, v = np.asarray(m), np.asarray(v)
    if m.ndim != 1 or v.shape != m.shape:
        raise ValueError(f"write_state: m and v must be 1-D and of one size, got {m.shape} "
                         f"and {v.shape}")
    if master is not None and np.shape(master) != m.shape:
        raise ValueError(f"write_state: the master weights must be laid out as m, {m.shape}, "
                         f"got {np.shape(master)}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0:6] = [STATE_MAGIC, STATE_VERSION, num_processes, process_rank,
                   int(master is not None), 1]  # shuffled
    header[10], header[11] = step, last_update
    if loss_scale is not None:
        header[12], header[13] = 1 + int(np.log2(loss_scale)), loss_scale_steps
    header[30:34].view("<u8")[:] = [loader_state["shard_idx"], loader_state["sample_idx"]]
    pos = int(loader_state["rng_pos"])
    rng = np.zeros((), dtype=MT_STATE_DTYPE)
    # NumPy's pos counts the words used since the last twist; llm.c's left_ counts down to it
    rng["left"], rng["next"] = MT_STATE_WORDS + 1 - pos, pos
    rng["state"] = loader_state["rng_key"]
    rng["matrix_a"] = [0, 0x9908B0DF]
    shards, samples = loader_state["shard_indices"], loader_state["intra_shard_indices"]
    master = [] if master is None else [np.ascontiguousarray(master, dtype="<f4")]
    atomic_write(path, [
        header, np.ascontiguousarray(m, dtype="<f4"), np.ascontiguousarray(v, dtype="<f4"),
        *master,
        np.array([len(shards)], "<u8"), np.asarray(shards).astype("<i4"),
        np.array([len(samples)], "<u8"), np.asarray(samples).astype("<i4"),
        rng.tobytes(),
    ])


def read_state_processes(path):
    """(num_processes, process_rank) of the run that wrote the training state at path."""
    with open_file(path) as f:
        header = read_array(f, path, "<i4", HEADER_INTS)
    if header[0] != STATE_MAGIC:
        raise FormatError(path, f"not a training state (magic {header[0]})")
    return int(header[2]), int(header[3])


@dataclass
class TrainingState:
    step: int                  # the steps done
    m: np.ndarray              # AdamW's moments of the process's optimizer shard (float32)
    v: np.ndarray
    master: np.ndarray         # the float32 master weights of that shard (a bf16 run's), or None
    last_update: int           # the AdamW t of the last update (0: none, or not recorded)
    loss_scale: float          # an fp16 run's loss scale, None for a run without one
    loss_scale_steps: int      # fp16: the finite steps since the loss scale changed
    loader_state: dict         # what DataLoader.load_state takes


def read_training_state(path, num_parameters, num_processes=1, process_rank=0):
    """The TrainingState at path, for process process_rank of a run of num_processes with
    num_parameters in its optimizer shard (all the model's unless ZeRO-1)."""
    n = num_parameters
    what = "a model" if num_processes == 1 else "an optimizer shard"
    mismatch = FormatError(path, f"does not fit {what} of {n} parameters (written for a model "
                                 f"of another size{', or -z' if num_processes > 1 else ''}, "
                                 f"or cut short)")
    with open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_BYTES + 8 * n:
            raise mismatch
        header = read_array(f, path, "<i4", HEADER_INTS)
        if header[0] != STATE_MAGIC or header[1] != STATE_VERSION:
            raise FormatError(path, f"not a training state (magic {header[0]}, "
                                    f"version {header[1]})")
        if tuple(header[2:4]) != (num_processes, process_rank):
            raise FormatError(path, f"written by process {header[3]} of a run of {header[2]}, "
                                    f"read by process {process_rank} of {num_processes}: resume "
                                    f"with as many processes as the run had")
        if header[4] not in (0, 1) or header[5] != 1:
            raise FormatError(path, f"written by a run this trainer cannot continue (master "
                                    f"weights {header[4]}, shuffled data {header[5]})")
        has_master = header[4] == 1
        if has_master and size < HEADER_BYTES + 12 * n:
            raise mismatch
        m = read_array(f, path, "<f4", n).astype(np.float32, copy=False)
        v = read_array(f, path, "<f4", n).astype(np.float32, copy=False)
        master = read_array(f, path, "<f4", n).astype(np.float32, copy=False) if has_master \
            else None
        tail = f.read()
    try:  # after m and v (and the master weights): the shard order, the sample order, the RNG
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
    return TrainingState(step=int(header[10]), m=m, v=v, master=master,
                         last_update=int(header[11]),
                         loss_scale=2.0 ** (header[12] - 1) if header[12] > 0 else None,
                         loss_scale_steps=int(header[13]), loader_state=loader_state)


def read_state(path, num_parameters, num_processes=1, process_rank=0):
    """(step, m, v, loader_state) from the training state at path (read_training_state; its
    master weights, if any, left out)."""
    state = read_training_state(path, num_parameters, num_processes, process_rank)
    return state.step, state.m, state.v, state.loader_state
