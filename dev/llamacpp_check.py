"""
Shows that llama.cpp runs what we trained: exports a Llama model file (llama2.c's format) and
its tokenizer.bin to GGUF (as dev/export.py --format gguf does), loads it in llama.cpp through
llama-cpp-python, compares llama.cpp's logits on a stretch of tokens with our model's, and lets
llama.cpp write a sample from a prompt.

    pip install llama-cpp-python         # builds llama.cpp from source (minutes, no GPU needed)
    python dev/llamacpp_check.py out/model.bin dev/data/tinyshakespeare/sp4096/tokenizer.bin

The logits agree to float32 rounding (llama.cpp with a float32 KV cache: about 6e-7 of the largest logit); the
sample is llama.cpp's own, greedy, decoded by llama.cpp's tokenizer from our vocabulary.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from export import gguf_vocabulary  # noqa: E402
from llmc.formats.gguf import write_gguf  # noqa: E402

TOLERANCE = 1e-4   # max |diff| / max |logit|, float32 kernels on both sides
GGML_TYPE_F32 = 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a llama2.c model file")
    p.add_argument("tokenizer", help="its vocabulary: a llama2.c tokenizer.bin, llm.c's "
                   "gpt2_tokenizer.bin, or gpt2 (tiktoken's GPT-2)")
    p.add_argument("--prompt", default="First Citizen:")
    p.add_argument("-t", type=int, default=32, help="tokens compared (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        from llama_cpp import Llama
    except ImportError:
        sys.exit("llamacpp_check.py: error: needs llama-cpp-python (pip install "
                 "llama-cpp-python: it builds llama.cpp from source)")
    from train_llama2 import Llama2

    model = Llama2.from_checkpoint(args.model)
    config = model.config
    with tempfile.TemporaryDirectory() as tmp:
        gguf_path = os.path.join(tmp, "model.gguf")
        write_gguf(gguf_path, config, model.params, gguf_vocabulary(args.tokenizer, config))
        # a float32 KV cache (llama.cpp's default is float16) so that both sides are float32
        llm = Llama(model_path=gguf_path, n_ctx=config.max_seq_len, logits_all=True,
                    verbose=False, n_threads=os.cpu_count(), type_k=GGML_TYPE_F32,
                    type_v=GGML_TYPE_F32)
        tokens = llm.tokenize(args.prompt.encode(), add_bos=True)
        while len(tokens) < args.t:   # llama.cpp's own greedy continuation
            llm.reset()
            llm.eval(tokens)
            tokens.append(int(np.argmax(llm.scores[len(tokens) - 1])))
        llm.reset()
        llm.eval(tokens)
        theirs = np.array(llm.scores[:len(tokens)], dtype=np.float32)

    model.forward(np.array([tokens], dtype=np.int32))
    ours = np.asarray(model.logits)[0, :, :config.vocab_size]
    error = float(np.abs(ours - theirs).max() / np.abs(ours).max())
    print(f"llama.cpp on {config.describe()}: {len(tokens)} tokens, logits max |diff| / max "
          f"|logit| = {error:.2e} (tolerance {TOLERANCE:g})")
    print("llama.cpp's greedy sample:", repr(llm.detokenize(tokens).decode("utf-8", "replace")))
    if not error <= TOLERANCE:
        sys.exit("llamacpp_check.py: error: llama.cpp's logits differ from ours")


if __name__ == "__main__":
    main()
