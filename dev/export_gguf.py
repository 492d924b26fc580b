"""
Exports a Llama-family model file (llama2.c's format, as train.py --model writes it) to GGUF,
llama.cpp's file, through llama.cpp's own Python writer (the gguf package), float32, with the
vocabulary the model was trained on: a llama2.c tokenizer.bin (SentencePiece:
dev/data/tinyshakespeare.py --sentencepiece N writes one beside its shards) or GPT-2's
byte-level BPE (the data scripts' default; `gpt2` for tiktoken's, found offline as train.py
finds it, or llm.c's gpt2_tokenizer.bin), its merges rebuilt from the token ranks.

    python dev/export_gguf.py MODEL.bin TOKENIZER.bin -o model.gguf
    python dev/export_gguf.py MODEL.bin gpt2 -o model.gguf
    llama-cli -m model.gguf -p "First Citizen:"           # llama.cpp, where it is built

--check reads the file back with gguf's reader and compares every tensor and size.
"""
import argparse
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from llmc.formats import FormatError  # noqa: E402
from llmc.formats.gguf import gguf_vocab, gpt2_gguf_vocab, read_gguf, write_gguf  # noqa: E402
from llmc.formats.llama2c import read_llama_model  # noqa: E402


def export(model_path, tokenizer_path, output):
    config, params = read_llama_model(model_path)
    if tokenizer_path == "gpt2":
        from llmc.tokenizer import Tokenizer, gpt2_encoding
        gpt2 = Tokenizer.from_encoding(gpt2_encoding())
        vocab = gpt2_gguf_vocab(gpt2.token_bytes, gpt2.eot_token, config.vocab_size)
    else:
        vocab = gguf_vocab(tokenizer_path, config.vocab_size)
    write_gguf(output, config, params, vocab,
               name=os.path.splitext(os.path.basename(model_path))[0])
    return config, params


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a llama2.c model file (version 0 or 1)")
    p.add_argument("tokenizer", help="its vocabulary: a llama2.c tokenizer.bin, llm.c's gpt2_tokenizer.bin, "
                   "or gpt2 (tiktoken's GPT-2)")
    p.add_argument("-o", "--output", help="the .gguf to write (default: MODEL.gguf)")
    p.add_argument("--check", action="store_true", help="read it back and compare")
    args = p.parse_args(argv)
    output = args.output or os.path.splitext(args.model)[0] + ".gguf"
    try:
        config, params = export(args.model, args.tokenizer, output)
        if args.check:
            config_back, params_back, _ = read_gguf(output)
            if config_back != config or not np.array_equal(params_back, params):
                sys.exit(f"export_gguf.py: error: {output} does not read back as written")
    except (FormatError, ValueError, RuntimeError) as e:
        sys.exit(f"export_gguf.py: error: {e}")
    except OSError as e:
        sys.exit(f"export_gguf.py: error: {e.filename + ': ' if e.filename else ''}"
                 f"{e.strerror or e}")
    print(f"wrote {output} (GGUF, llama, float32, {config.describe()})"
          + (", read back equal" if args.check else ""))


if __name__ == "__main__":
    main()
