"""
Downloads OpenAI's pretrained GPT-2 from Hugging Face and converts it to llm.c's model file,
with NumPy alone (no torch, no transformers, no safetensors package):

    python dev/download_gpt2.py                 # gpt2 (124M) -> gpt2_124M.bin
    python dev/download_gpt2.py --model gpt2-xl # 1558M -> gpt2_1558M.bin
    python dev/download_gpt2.py --from-safetensors model.safetensors -o out.bin

The .safetensors file is read by llmc.formats.huggingface.read_safetensors. GPT-2's Linear
layers are Conv1D there, stored (in, out): llm.c stores (out, in), so those weights are
transposed. llm.c pads wte's vocabulary rows with zeros to a multiple of 128 (50257 -> 50304).
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

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from llmc.formats import FormatError, huggingface, param_views  # noqa: E402
from llmc.formats.llmc import write_checkpoint, write_tokenizer  # noqa: E402
from train_gpt2 import GPT2Config, padded_vocab_size  # noqa: E402

HF_URL = "https://huggingface.co/{model}/resolve/main/{file}"
MODELS = {"gpt2": "124M", "gpt2-medium": "350M", "gpt2-large": "774M", "gpt2-xl": "1558M"}
# llm.c's tensor -> (Hugging Face name, with {l} for the layer, transposed?)
HF_NAMES = {
    "wte": ("wte.weight", False), "wpe": ("wpe.weight", False),
    "ln1w": ("h.{l}.ln_1.weight", False), "ln1b": ("h.{l}.ln_1.bias", False),
    "qkvw": ("h.{l}.attn.c_attn.weight", True), "qkvb": ("h.{l}.attn.c_attn.bias", False),
    "attprojw": ("h.{l}.attn.c_proj.weight", True), "attprojb": ("h.{l}.attn.c_proj.bias", False),
    "ln2w": ("h.{l}.ln_2.weight", False), "ln2b": ("h.{l}.ln_2.bias", False),
    "fcw": ("h.{l}.mlp.c_fc.weight", True), "fcb": ("h.{l}.mlp.c_fc.bias", False),
    "fcprojw": ("h.{l}.mlp.c_proj.weight", True), "fcprojb": ("h.{l}.mlp.c_proj.bias", False),
    "lnfw": ("ln_f.weight", False), "lnfb": ("ln_f.bias", False),
}


class ConvertError(ValueError):
    """A safetensors file that is not a GPT-2; one line naming the file."""


def read_safetensors(path):
    """huggingface.read_safetensors, without the "transformer." prefix GPT2LMHeadModel's files
    may put on the names."""
    tensors = huggingface.read_safetensors(path)
    return {name.removeprefix("transformer."): t for name, t in tensors.items()}


def convert(tensors, num_heads=None, source="safetensors"):
    """(GPT2Config, params 1-D float32 in llm.c's layout) from Hugging Face's GPT-2 tensors."""
    def get(name):
        if name not in tensors:
            raise ConvertError(f"{source}: no tensor {name}: not a GPT-2 checkpoint?")
        return tensors[name]
    V, C = get("wte.weight").shape
    maxT = get("wpe.weight").shape[0]
    L = 0
    while f"h.{L}.ln_1.weight" in tensors:
        L += 1
    if L == 0:
        raise ConvertError(f"{source}: no transformer blocks (h.0.*): not a GPT-2 checkpoint?")
    NH = num_heads or C // 64  # every GPT-2 has heads of 64 channels
    try:
        config = GPT2Config(max_seq_len=maxT, vocab_size=V, padded_vocab_size=padded_vocab_size(V),
                            num_layers=L, num_heads=NH, channels=C)
    except ValueError as e:
        raise ConvertError(f"{source}: {e}") from None
    params = np.zeros(config.num_parameters(), dtype=np.float32)
    views = param_views(config, params)
    for name, _ in config.param_shapes():
        hf_name, transposed = HF_NAMES[name]
        per_layer = "{l}" in hf_name
        for l in range(L if per_layer else 1):
            tensor = get(hf_name.format(l=l))
            target = views[name][l] if per_layer else views[name]
            if name == "wte":
                target = target[:V]  # the padding rows V..Vp stay zero
            value = tensor.T if transposed else tensor
            if value.shape != target.shape:
                expected = target.shape[::-1] if transposed else target.shape
                raise ConvertError(f"{source}: {hf_name.format(l=l)} has shape {tensor.shape}, "
                                   f"expected {expected}")
            target[...] = value
    return config, params


def convert_file(src, dst, num_heads=None, dtype="float32"):
    config, params = convert(read_safetensors(src), num_heads, source=src)
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
    except (ConvertError, FormatError) as e:
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
