"""
Downloads and tokenizes TinyShakespeare for GPT-2 (or a SentencePiece vocabulary trained on it,
for the Llama family), as llm.c's dev/data/tinyshakespeare.py does, into
dev/data/tinyshakespeare/: the command line of llmc/default_data.py, which train.py runs on
first use too (see there).

    python dev/data/tinyshakespeare.py [--input-text FILE] [--output-dir DIR]
    python dev/data/tinyshakespeare.py --sentencepiece 4096
"""
import argparse
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)
from llmc.data_prep import DataPrepError, TokenizerError  # noqa: E402
from llmc.default_data import DATA_CACHE_DIR, prepare  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input-text", metavar="FILE",
                        help="tokenize this file (a copy of TinyShakespeare), no download")
    parser.add_argument("--output-dir", metavar="DIR", default=DATA_CACHE_DIR,
                        help="where the .bin shards go (default: %(default)s)")
    parser.add_argument("--sentencepiece", metavar="N", type=int,
                        help="train a SentencePiece vocabulary of N tokens (for the Llama "
                             "family) instead of using GPT-2's BPE")
    args = parser.parse_args(argv)
    try:
        prepare(args.input_text, args.output_dir, args.sentencepiece)
    except (DataPrepError, TokenizerError, OSError, ValueError) as e:
        sys.exit(f"tinyshakespeare.py: error: {e}")


if __name__ == "__main__":
    main()
