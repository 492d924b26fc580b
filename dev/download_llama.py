"""
Gets a pretrained Llama-family model as llama2.c's model file, with NumPy alone (no torch, no
transformers, no safetensors package).

    python dev/download_llama.py stories15M          # llama2.c's TinyStories model + tokenizer
    python dev/download_llama.py --from-safetensors PATH -o tinyllama.bin
                                    # a Hugging Face LlamaForCausalLM: PATH is its model folder
                                    # (config.json and model.safetensors, or its shards and
                                    # their index) or a .safetensors file (its config.json
                                    # beside it or in its metadata)

stories15M/42M/110M come from Hugging Face's karpathy/tinyllamas in llama2.c's legacy format,
which llmc/formats/llama2c.py reads as it is; this writes them as version 1 next to llama2.c's
tokenizer.bin (Llama-2's 32000-token SentencePiece vocabulary, from the llama2.c repository).
A Hugging Face checkpoint's q and k rows are put back into the adjacent-pair order our RoPE uses
(llmc.formats.huggingface.llama_from_hf); bf16 and f16 tensors are widened to float32.  Only
Llama 2's block fits llama2.c's file: a model with more (Qwen's biases or QK-norm, Llama 3's
RoPE scaling, another eps or theta) is refused in one line; train.py -e, generate.py and
dev/export.py take its folder itself.
"""
import argparse
import os
import sys
import tempfile
import urllib.error

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from download_gpt2 import check_hf_path, download  # noqa: E402
from llmc.formats import FormatError  # noqa: E402
from llmc.formats.huggingface import hf_reader_of, llama_from_hf, read_hf_checkpoint  # noqa: E402
from llmc.formats.llama2c import read_llama2c_tokenizer, read_llama_model, write_llama_model  # noqa: E402
from train_llama2 import LlamaConfig  # noqa: E402

TINYLLAMAS_URL = "https://huggingface.co/karpathy/tinyllamas/resolve/main/{name}.bin"
LLAMA2C_TOKENIZER_URL = "https://raw.githubusercontent.com/karpathy/llama2.c/master/tokenizer.bin"
TINYLLAMAS = ("stories15M", "stories42M", "stories110M")


def convert_hf(path, output):
    """The Hugging Face Llama-block model at path, a model folder or a .safetensors file
    (check_hf_path), as llama2.c's model file at output."""
    check_hf_path(path)
    tensors, hf_config = read_hf_checkpoint(path)
    if hf_reader_of(hf_config, path) != "llama":
        raise FormatError(path, "GPT2LMHeadModel is not a Llama: dev/download_gpt2.py converts it")
    config, params = llama_from_hf(tensors, hf_config, LlamaConfig, source=path)
    write_llama_model(output, config, params)
    return config


def download_tinyllama(name, output):
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output))) as tmp:
        src = os.path.join(tmp, f"{name}.bin")
        url = TINYLLAMAS_URL.format(name=name)
        print(f"downloading {url}")
        download(url, src)
        config, params = read_llama_model(src, LlamaConfig)
    write_llama_model(output, config, params)
    tokenizer = os.path.join(os.path.dirname(os.path.abspath(output)), "tokenizer.bin")
    if not os.path.exists(tokenizer):
        print(f"downloading {LLAMA2C_TOKENIZER_URL}")
        download(LLAMA2C_TOKENIZER_URL, tokenizer)
        read_llama2c_tokenizer(tokenizer)  # it is what it should be
    return config


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", choices=TINYLLAMAS, help="one of llama2.c's models")
    p.add_argument("--from-safetensors", metavar="PATH",
                   help="convert the Hugging Face Llama at PATH instead: its model folder or a "
                        ".safetensors file")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="the model file to write (default: MODEL.bin here)")
    args = p.parse_args(argv)
    if bool(args.model) == bool(args.from_safetensors):
        p.error("give a model name or --from-safetensors PATH (one of them)")
    output = args.output or os.path.join(REPO_ROOT, f"{args.model or 'llama'}.bin")
    try:
        if args.from_safetensors:
            config = convert_hf(args.from_safetensors, output)
        else:
            config = download_tinyllama(args.model, output)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        sys.exit(f"download_llama.py: error: cannot download ({getattr(e, 'reason', e)}): "
                 f"this needs the internet")
    except (FormatError, ValueError) as e:
        sys.exit(f"download_llama.py: error: {e}")
    except OSError as e:
        sys.exit(f"download_llama.py: error: {e.filename + ': ' if e.filename else ''}"
                 f"{e.strerror or e}")
    print(f"wrote {output} (llama2.c version 1, {config.describe()}, "
          f"{config.num_parameters():,} parameters)")


if __name__ == "__main__":
    main()
