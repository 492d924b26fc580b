"""
Downloads HellaSwag's validation set (10,042 examples: a context and 4 endings, one right) and
writes it as llm.c's eval file for train.py -h 1, as llm.c's dev/data/hellaswag.py does.

    writing 10,042 examples to .../dev/data/hellaswag/hellaswag_val.bin

The examples come from HellaSwag's repository (the jsonl llm.c downloads, kept beside the .bin);
there is no offline stand-in: without the internet this says so and writes nothing. Each is
tokenized as llm.c does: the context, and each ending after a space, with GPT-2's BPE
(llmc.tokenizer.gpt2_encoding). The eval file's format: llmc/formats/llmc.py (write_evalfile).

For a model trained on a SentencePiece vocabulary (dev/data/tinyshakespeare.py --sentencepiece
N), --tokenizer DIR/tokenizer.bin tokenizes with the tokenizer.model written beside it, each
context after a BOS as the data scripts start every document, and writes DIR/hellaswag_val.bin.

    python dev/data/hellaswag.py
    python train.py -h 1                     # HellaSwag at every val loss (-hm: how many)
    python dev/data/hellaswag.py --tokenizer dev/data/tinyshakespeare/sp4096/tokenizer.bin
"""
import argparse
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)
from llmc.data_prep import (DataPrepError, download_file, failing_in_one_line, gpt2_encoding,  # noqa: E402
                            sentencepiece_processor)
from llmc.formats.llmc import EvalExample, write_evalfile  # noqa: E402

DATA_CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hellaswag")
DATA_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
NAME = "hellaswag_val"


def download():
    """The path of the jsonl of the val examples, downloaded if it is not there yet."""
    path = os.path.join(DATA_CACHE_DIR, f"{NAME}.jsonl")
    if os.path.exists(path):
        print(f"{path} already exists, skipping download...")
        return path
    os.makedirs(DATA_CACHE_DIR, exist_ok=True)
    print(f"Downloading {DATA_URL} to {path}...")
    try:
        download_file(DATA_URL, path)
    except OSError as e:
        raise DataPrepError(f"cannot download HellaSwag ({getattr(e, 'reason', None) or e}): it "
                            f"needs the internet; nothing was written") from None
    return path


def read_examples(path):
    """[(context, endings, label)] of HellaSwag's jsonl."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
                context, endings, label = record["ctx"], record["endings"], int(record["label"])
            except (ValueError, KeyError, TypeError) as e:
                raise DataPrepError(f"{path} line {number}: not a HellaSwag example ({e}): "
                                    f"delete the file to download it again") from None
            examples.append((context, endings, label))
    if not examples:
        raise DataPrepError(f"{path}: no examples: delete it to download it again")
    return examples


def encoders(tokenizer):
    """(encode a context, encode an ending) as token ids: GPT-2's BPE, each ending after a
    space as llm.c's; or the SentencePiece model beside a tokenizer.bin, each context after a
    BOS, as the data scripts start every document (SentencePiece marks a word's space itself)."""
    if tokenizer is None:
        encoding = gpt2_encoding()
        return encoding.encode_ordinary, lambda ending: encoding.encode_ordinary(" " + ending)
    model = os.path.splitext(tokenizer)[0] + ".model"
    if not os.path.exists(model):
        raise DataPrepError(f"{tokenizer}: no {os.path.basename(model)} beside it (the "
                            f"SentencePiece model the data scripts write with tokenizer.bin)")
    sp = sentencepiece_processor(model)
    return (lambda context: [sp.bos_id()] + sp.encode(context)), sp.encode


def tokenize(examples, tokenizer=None):
    """The EvalExamples of (context, endings, label) examples."""
    encode_context, encode_ending = encoders(tokenizer)
    return [EvalExample(context=encode_context(context),
                        completions=[encode_ending(ending) for ending in endings], label=label)
            for context, endings, label in examples]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", metavar="FILE",
                        help="a SentencePiece data set's tokenizer.bin: tokenize with the "
                             "tokenizer.model beside it, into hellaswag_val.bin beside it "
                             "(default: GPT-2's BPE, into dev/data/hellaswag/)")
    parser.add_argument("--output", metavar="FILE", help="write the eval file here instead")
    args = parser.parse_args(argv)
    directory = DATA_CACHE_DIR if args.tokenizer is None else os.path.dirname(args.tokenizer)
    output = args.output or os.path.join(directory, f"{NAME}.bin")
    with failing_in_one_line("hellaswag.py", DATA_CACHE_DIR):
        examples = tokenize(read_examples(download()), args.tokenizer)
        print(f"writing {len(examples):,} examples to {output}")
        write_evalfile(output, examples)


if __name__ == "__main__":
    main()
