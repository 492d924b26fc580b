"""
Downloads and tokenizes TinyStories (short stories by GPT-3.5/4, from Hugging Face) for GPT-2,
as llm.c's dev/data/tinystories.py does, into dev/data/tinystories/:

    writing 19,043,638 tokens to .../TinyStories_val.bin
    writing 925,653,391 tokens to .../TinyStories_train.bin

The download is ~1.5 GB and needs the internet (there is no offline stand-in). The archive
holds 50 JSON files of stories: the first is the val split, the rest train. Every story is a
document: <|endoftext|> then its tokens. The stories of each file are shuffled with
random.Random(1337 + file index), and the files are tokenized in parallel but written in order,
so the output is the same on every machine.

    python dev/data/tinystories.py
    python train.py -i dev/data/tinystories/TinyStories_train.bin \\
                    -j dev/data/tinystories/TinyStories_val.bin
"""
import argparse
import glob
import json
import os
import random
import sys
import tarfile
from multiprocessing import Pool

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)
from llmc.data_prep import (DataPrepError, download_file, failing_in_one_line, gpt2_encoding,  # noqa: E402
                            write_datafile)

DATA_CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tinystories")
DATA_URL = ("https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
            "TinyStories_all_data.tar.gz")


def download():
    """The story files (JSON), downloading and unpacking the archive if needed."""
    os.makedirs(DATA_CACHE_DIR, exist_ok=True)
    archive = os.path.join(DATA_CACHE_DIR, "TinyStories_all_data.tar.gz")
    if not os.path.exists(archive):
        print(f"Downloading {DATA_URL} to {archive}...")
        try:
            download_file(DATA_URL, archive, timeout=60)
        except OSError as e:
            raise DataPrepError(f"cannot download TinyStories ({getattr(e, 'reason', e)}): "
                                f"it needs the internet; offline, use tinyshakespeare.py "
                                f"or text_to_shards.py on text you have") from None
    else:
        print(f"{archive} already exists, skipping download...")
    data_dir = os.path.join(DATA_CACHE_DIR, "TinyStories_all_data")
    if not os.path.exists(data_dir):
        print(f"Unpacking {archive}...")
        with tarfile.open(archive) as t:
            # the "data" filter refuses paths that leave the directory (Python >= 3.11.4)
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            t.extractall(data_dir + ".part", **safe)
        os.replace(data_dir + ".part", data_dir)
    files = sorted(glob.glob(os.path.join(data_dir, "*.json")))
    print(f"Number of shards: {len(files)}")
    if len(files) < 2:
        raise DataPrepError(f"{data_dir}: expected the 50 story files, found {len(files)}")
    return files


def tokenize_file(job):
    """All tokens of one story file (uint16): <|endoftext|> + story, for each shuffled story."""
    index, path = job
    enc = gpt2_encoding()
    with open(path, encoding="utf-8") as f:
        stories = json.load(f)
    random.Random(1337 + index).shuffle(stories)
    texts = [story["story"].strip() for story in stories]
    return np.concatenate([np.array([enc.eot_token] + tokens, dtype=np.uint16)
                           for tokens in enc.encode_ordinary_batch(texts)])


def tokenize(files):
    gpt2_encoding()  # any fallback happens once, here, not in every worker
    for split, split_files in (("val", files[:1]), ("train", files[1:])):
        print(f"Tokenizing {split} split...")
        with Pool() as pool:
            parts = pool.map(tokenize_file, list(enumerate(split_files)))
        tokens = np.concatenate(parts)
        write_datafile(os.path.join(DATA_CACHE_DIR, f"TinyStories_{split}.bin"), tokens)


def main(argv=None):
    argparse.ArgumentParser(
        description="Download TinyStories (~1.5 GB, online only) and tokenize it with GPT-2's "
                    "BPE into llm.c shards in dev/data/tinystories/.").parse_args(argv)
    with failing_in_one_line("tinystories.py", DATA_CACHE_DIR):
        tokenize(download())


if __name__ == "__main__":
    main()
