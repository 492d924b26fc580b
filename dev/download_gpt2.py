"""
Downloads OpenAI's pretrained GPT-2 from Hugging Face and converts it to llm.c's model file,
with NumPy alone (no torch, no transformers, no safetensors package):

    python dev/download_gpt2.py                 # gpt2 (124M) -> gpt2_124M.bin
    python dev/download_gpt2.py --model gpt2-xl # 1558M -> gpt2_1558M.bin
    python dev/download_gpt2.py --from-safetensors model.safetensors -o out.bin

The .safetensors file is read and converted by llmc/formats/huggingface.py (read_safetensors,
gpt2_from_hf): GPT-2's Linear layers are Conv1D there, stored (in, out): llm.c stores (out, in),
so those weights are transposed. llm.c pads wte's vocabulary rows with zeros to a multiple of
128 (50257 -> 50304).
Also writes llm.c's gpt2_tokenizer.bin (the bytes of every token) when GPT-2's tokenizer is at
hand.
"""
import argparse
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from llmc.formats import FormatError  # noqa: E402
from llmc.formats.huggingface import gpt2_from_hf, read_safetensors  # noqa: E402
from llmc.formats.llmc import write_checkpoint, write_tokenizer  # noqa: E402
from train_gpt2 import GPT2Config  # noqa: E402

HF_URL = "https://huggingface.co/{model}/resolve/main/{file}"
MODELS = {"gpt2": "124M", "gpt2-medium": "350M", "gpt2-large": "774M", "gpt2-xl": "1558M"}


def convert_file(src, dst, num_heads=None, dtype="float32"):
    config, params = gpt2_from_hf(read_safetensors(src), GPT2Config, num_heads, source=src)
    write_checkpoint(dst, config, params, dtype=dtype)
    return config


def download(url, path):
    """url -> path, through a temporary file; raises OSError offline."""
    tmp = f"{path}.part"
    try:
        with urllib.request.urlopen(url, timeout=30) as response, open(tmp, "wb") as f:
            total = int(response.headers.get("Content-Length") or 0)
            done = 0
            while chunk := response.read(1 << 22):
                f.write(chunk)
                done += len(chunk)
                if total and sys.stderr.isatty():
                    print(f"\r{url.rsplit('/', 1)[-1]}: {done >> 20} / {total >> 20} MiB",
                          end="", file=sys.stderr, flush=True)
        if total and sys.stderr.isatty():
            print(file=sys.stderr)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_tokenizer_file(path):
    """llm.c's gpt2_tokenizer.bin from tiktoken's GPT-2 (for decoding without tiktoken)."""
    from llmc.tokenizer import gpt2_encoding
    enc = gpt2_encoding()
    tokens = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
    write_tokenizer(path, tokens, enc.eot_token)
    print(f"wrote {path}")


def main(argv=None):
    p = argparse.ArgumentParser(description="Hugging Face GPT-2 -> llm.c model file (NumPy only)")
    p.add_argument("--model", choices=sorted(MODELS), default="gpt2",
                   help="which GPT-2 to download (default: %(default)s)")
    p.add_argument("--from-safetensors", metavar="FILE",
                   help="convert this local file instead of downloading")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="the llm.c model file (default: gpt2_<size>.bin in the repository)")
    p.add_argument("--num-heads", type=int, help="attention heads (default: from config.json, "
                   "else channels / 64 as in every GPT-2)")
    p.add_argument("--bf16", action="store_true", help="write bfloat16 (llm.c version 5)")
    args = p.parse_args(argv)
    output = args.output or os.path.join(REPO_ROOT, f"gpt2_{MODELS[args.model]}.bin")
    dtype = "bfloat16" if args.bf16 else "float32"
    try:
        if args.from_safetensors:
            config = convert_file(args.from_safetensors, output, args.num_heads, dtype)
        else:
            with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output))) as tmp:
                src = os.path.join(tmp, "model.safetensors")
                repo = f"openai-community/{args.model}"
                url = HF_URL.format(model=repo, file="model.safetensors")
                print(f"downloading {url}")
                download(url, src)
                num_heads = args.num_heads
                if num_heads is None:
                    cfg = os.path.join(tmp, "config.json")
                    download(HF_URL.format(model=repo, file="config.json"), cfg)
                    with open(cfg) as f:
                        num_heads = json.load(f)["n_head"]
                config = convert_file(src, output, num_heads, dtype)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        sys.exit(f"download_gpt2.py: error: cannot download from Hugging Face "
                 f"({getattr(e, 'reason', e)}): this needs the internet")
    except FormatError as e:
        sys.exit(f"download_gpt2.py: error: {e}")
    except OSError as e:
        sys.exit(f"download_gpt2.py: error: {e.filename + ': ' if e.filename else ''}"
                 f"{e.strerror or e}")
    print(f"wrote {output} ({dtype}, {config.describe()}, {config.num_parameters():,} parameters)")
    tokenizer_path = os.path.join(os.path.dirname(os.path.abspath(output)), "gpt2_tokenizer.bin")
    if not args.from_safetensors and not os.path.exists(tokenizer_path):
        try:
            write_tokenizer_file(tokenizer_path)
        except (RuntimeError, OSError, ValueError) as e:  # optional: tiktoken decodes too
            print(f"download_gpt2.py: skipped {tokenizer_path}: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
