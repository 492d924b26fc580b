"""
Gets a pretrained GPT-2 as llm.c's model file, with NumPy alone (no torch, no transformers, no
safetensors package).

    python dev/download_gpt2.py                 # OpenAI's gpt2 (124M) -> gpt2_124M.bin
    python dev/download_gpt2.py --model gpt2-xl # 1558M -> gpt2_1558M.bin
    python dev/download_gpt2.py --from-safetensors PATH -o out.bin
                                    # a Hugging Face GPT2LMHeadModel: PATH is its model folder
                                    # (config.json and model.safetensors, or its shards and
                                    # their index) or a .safetensors file (its config.json
                                    # beside it or in its metadata, where it has one)

The weights are read and converted by llmc/formats/huggingface.py (read_hf_checkpoint,
gpt2_from_hf): GPT-2's Linear layers are Conv1D there, stored (in, out): llm.c stores (out, in),
so those weights are transposed. llm.c pads wte's vocabulary rows with zeros to a multiple of
128 (50257 -> 50304).  The heads are config.json's n_head; a .safetensors file without its
config.json has channels / 64 of them, as every GPT-2 (--num-heads says otherwise).
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
from llmc.formats import HF_FORMATS, MODEL_FORMAT_NAMES, FormatError, model_format  # noqa: E402
from llmc.formats.huggingface import (  # noqa: E402
    gpt2_config_checked, gpt2_from_hf, hf_architecture, hf_reader_of, is_hf_folder,
    read_hf_checkpoint, read_safetensors)
from llmc.formats.llmc import write_checkpoint, write_tokenizer  # noqa: E402
from train_gpt2 import GPT2Config  # noqa: E402

HF_URL = "https://huggingface.co/{model}/resolve/main/{file}"
MODELS = {"gpt2": "124M", "gpt2-medium": "350M", "gpt2-large": "774M", "gpt2-xl": "1558M"}
# what --from-safetensors takes, here and in dev/download_llama.py
HF_PATH = ("a Hugging Face model folder (config.json and model.safetensors, or its shards and "
           "model.safetensors.index.json: python dev/download_hf.py REPO makes one) or a "
           ".safetensors file")


def check_hf_path(path):
    """FormatError in one line, saying what is there and what was expected, unless path is a
    Hugging Face model folder or a safetensors file (its header read: read_safetensors)."""
    if not os.path.exists(path):
        what = "no such file or folder"
    elif os.path.isdir(path):
        if is_hf_folder(path):
            return
        what = "a folder without config.json"
    else:
        try:
            found = model_format(path)
        except FormatError as e:   # no model file at all, or another file of llm.c's
            raise FormatError(path, f"{e.problem}; expected {HF_PATH}") from None
        if found in HF_FORMATS:
            read_safetensors(path)
            return
        what = MODEL_FORMAT_NAMES[found]
    raise FormatError(path, f"{what}: expected {HF_PATH}")


def has_hf_config(path):
    """Whether hf_config_of finds config.json for the model at path: a folder's own, or a
    safetensors file's in its metadata or beside it."""
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    return os.path.isdir(path) or "config" in read_safetensors(path).metadata or \
        os.path.isfile(beside)


def read_gpt2(path, num_heads=None):
    """(GPT2Config, float32 params) of the Hugging Face GPT-2 at path, a model folder or a
    .safetensors file (check_hf_path); its heads num_heads, else config.json's n_head (its
    other keys checked as llm.c's GPT-2: gpt2_config_checked), else, for a file without
    config.json, channels / 64."""
    check_hf_path(path)
    if not has_hf_config(path):
        return gpt2_from_hf(read_safetensors(path), GPT2Config, num_heads, source=path)
    tensors, hf_config = read_hf_checkpoint(path)
    if hf_reader_of(hf_config, path) != "gpt2":
        raise FormatError(path, f"{hf_architecture(hf_config, path)} is not a GPT-2: "
                                f"dev/download_llama.py converts it")
    n_head = gpt2_config_checked(hf_config, path)
    return gpt2_from_hf(tensors, GPT2Config, num_heads or n_head, source=path)


def download_gpt2(model, directory, num_heads=None):
    """(GPT2Config, float32 params) of OpenAI's GPT-2 `model` from Hugging Face, downloaded
    into a temporary folder in directory; its heads num_heads, else its config.json's n_head.
    That config.json is read for n_head alone: OpenAI's carry keys of transformers' first
    GPT-2 classes (gpt2-medium's n_special) that gpt2_config_checked refuses."""
    repo = f"openai-community/{model}"
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        src = os.path.join(tmp, "model.safetensors")
        url = HF_URL.format(model=repo, file="model.safetensors")
        print(f"downloading {url}")
        download(url, src)
        if num_heads is None:
            config_json = os.path.join(tmp, "config.json")
            download(HF_URL.format(model=repo, file="config.json"), config_json)
            with open(config_json) as f:
                num_heads = json.load(f)["n_head"]
        return gpt2_from_hf(read_safetensors(src), GPT2Config, num_heads, source=url)


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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="gpt2",
                   help="which GPT-2 to download (default: %(default)s)")
    p.add_argument("--from-safetensors", metavar="PATH",
                   help="convert the Hugging Face GPT-2 at PATH instead: its model folder or a "
                        ".safetensors file")
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
            config, params = read_gpt2(args.from_safetensors, args.num_heads)
        else:
            config, params = download_gpt2(args.model, os.path.dirname(os.path.abspath(output)),
                                           args.num_heads)
        write_checkpoint(output, config, params, dtype=dtype)
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
