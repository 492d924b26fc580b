"""
Tokenizes any text files with GPT-2's BPE, or a Hugging Face model's own tokenizer, into llm.c
token shards for train.py.

    python dev/data/text_to_shards.py book1.txt book2.txt --name books
    python train.py -i "dev/data/books/books_train_*.bin" -j "dev/data/books/books_val_*.bin"
    python dev/data/text_to_shards.py book1.txt --tokenizer SmolLM2-135M   # a model folder

Each FILE is a document (or, with --paragraphs, each block of text between blank lines).
With GPT-2's BPE every document is <|endoftext|> followed by its tokens, as llm.c's data
scripts write them; text that looks like "<|endoftext|>" in a file is ordinary text, not the
special token.  With --tokenizer (a Hugging Face tokenizer.json or the folder holding it) every
document is its tokens as transformers' AutoTokenizer encodes it (BOS first where the
tokenizer puts one) and then EOS, and the tokenizer's files go beside the shards, where
train.py and generate.py find them; a vocabulary past 65,536 tokens writes uint32 shards
(llm.c's Llama 3 layout), else uint16.  The first --val-fraction of the tokens is the val
split (NAME_val_000000.bin), the rest the train split, in shards of at most --shard-size
tokens (NAME_train_000001.bin, ...), like llm.c's fineweb.py. Works offline: see
llmc/tokenizer.py for where GPT-2's BPE comes from.
"""
import argparse
import os
import re
import shutil
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)
from llmc.data_prep import DataPrepError, TokenizerError, gpt2_encoding, write_datafile  # noqa: E402
from llmc.formats import FormatError  # noqa: E402
from llmc.formats.hf_tokenizer import HF_TOKENIZER_FILES, is_hf_tokenizer  # noqa: E402
from llmc.formats.llmc import shard_dtype  # noqa: E402
from llmc.tokenizer import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def documents(paths, paragraphs, encoding):
    for path in paths:
        try:
            with open(path, encoding=encoding) as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise DataPrepError(f"{path}: not {encoding} text ({e.reason} at byte {e.start}); "
                                f"pass --encoding") from None
        except OSError as e:
            raise DataPrepError(f"{path}: {e.strerror}") from None
        if paragraphs:
            yield from (block for block in re.split(r"\n\s*\n", text) if block.strip())
        else:
            yield text


def tokenize(paths, paragraphs=False, encoding="utf-8", tokenizer=None):
    """All tokens: <|endoftext|> + document (uint16) for every document in order, or with a
    Hugging Face tokenizer (llmc.tokenizer.Tokenizer) its encoding of each document + EOS (in
    its vocabulary's dtype)."""
    if tokenizer is not None:
        dtype = shard_dtype(tokenizer.vocab_size)
        parts = [np.array(tokenizer.encode_prompt(doc) + [tokenizer.stop_tokens[0]], dtype=dtype)
                 for doc in documents(paths, paragraphs, encoding)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    enc = gpt2_encoding()
    parts, batch = [], []

    def flush():
        for tokens in enc.encode_ordinary_batch(batch):
            parts.append(np.array([enc.eot_token] + tokens, dtype=np.uint16))
        batch.clear()
    for doc in documents(paths, paragraphs, encoding):
        batch.append(doc)
        if len(batch) >= 1024:
            flush()
    flush()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def write_shards(tokens, output_dir, name, val_fraction, shard_size):
    """The val shard and the train shards; their paths."""
    num_val = int(round(len(tokens) * val_fraction))
    if num_val < 2 or len(tokens) - num_val < 2:
        raise DataPrepError(f"{len(tokens)} tokens are too few to split into val "
                            f"({val_fraction:.0%}) and train")
    os.makedirs(output_dir, exist_ok=True)
    paths = [os.path.join(output_dir, f"{name}_val_000000.bin")]
    write_datafile(paths[0], tokens[:num_val], tokens.dtype)
    train = tokens[num_val:]
    for i, start in enumerate(range(0, len(train), shard_size)):
        paths.append(os.path.join(output_dir, f"{name}_train_{i + 1:06d}.bin"))
        write_datafile(paths[-1], train[start:start + shard_size], tokens.dtype)
    return paths


def copy_tokenizer(source, output_dir):
    """The Hugging Face tokenizer's files beside the shards (where llmc.tokenizer's
    tokenizer_beside_shards finds them)."""
    folder = source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))
    for name in HF_TOKENIZER_FILES:
        if os.path.exists(os.path.join(folder, name)):
            shutil.copyfile(os.path.join(folder, name), os.path.join(output_dir, name))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE", help="text files to tokenize")
    p.add_argument("--name", help="name of the shards (default: the first file's name)")
    p.add_argument("-o", "--output-dir", metavar="DIR",
                   help="where the shards go (default: dev/data/NAME)")
    p.add_argument("--paragraphs", action="store_true",
                   help="every block between blank lines is a document (default: every file)")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="share of the tokens, from the start, for val (default: %(default)s)")
    p.add_argument("--shard-size", type=int, default=10**8,
                   help="most tokens in one train shard (default: %(default)s)")
    p.add_argument("--encoding", default="utf-8", help="of the files (default: %(default)s)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="a Hugging Face tokenizer.json, or the model folder holding it "
                        "(default: GPT-2's BPE)")
    args = p.parse_args(argv)
    if args.tokenizer is not None and not is_hf_tokenizer(args.tokenizer):
        p.error(f"--tokenizer {args.tokenizer}: not a Hugging Face tokenizer.json nor a folder "
                f"holding one")
    if not 0 < args.val_fraction < 1:
        p.error(f"--val-fraction must be between 0 and 1, got {args.val_fraction}")
    if args.shard_size < 2:
        p.error(f"--shard-size must be at least 2, got {args.shard_size}")
    name = args.name or os.path.splitext(os.path.basename(args.files[0]))[0]
    output_dir = args.output_dir or os.path.join(HERE, name)
    try:
        tokenizer = None if args.tokenizer is None else Tokenizer.from_hf(args.tokenizer)
        tokens = tokenize(args.files, args.paragraphs, args.encoding, tokenizer)
        paths = write_shards(tokens, output_dir, name, args.val_fraction, args.shard_size)
        if tokenizer is not None:
            copy_tokenizer(args.tokenizer, output_dir)
    except (DataPrepError, TokenizerError, FormatError, OSError) as e:
        sys.exit(f"text_to_shards.py: error: {e}")
    directory = os.path.dirname(os.path.abspath(paths[0]))
    if not os.path.relpath(directory).startswith(".."):
        directory = os.path.relpath(directory)
    print(f"train with: python train.py -i '{os.path.join(directory, name)}_train_*.bin' "
          f"-j '{os.path.join(directory, name)}_val_*.bin'")


if __name__ == "__main__":
    main()
