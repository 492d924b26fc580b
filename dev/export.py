"""
Writes a model of either family in any format we support, one command for all of them.

    python dev/export.py MODEL --format llmc    -o OUT.bin  [--dtype bfloat16]      # GPT-2
    python dev/export.py MODEL --format llama2c -o OUT.bin  [--version 1]           # Llama
    python dev/export.py MODEL --format gguf    -o OUT.gguf --tokenizer TOKENIZER   # Llama
    python dev/export.py MODEL --format hf      -o DIR      [--tokenizer TOKENIZER] [--dtype D]
    python dev/export.py ADAPTER --format gguf  -o ADAPTER.gguf [--base MODEL]    # LoRA, Llama

MODEL is a model file in any format a family reads (llmc/families.py's family_of_file tells
them apart: llm.c's checkpoint, fp32 version 3 or bf16 version 5, for GPT-2; llama2.c's
version 0 or 1, or GGUF, for a Llama), or a training run's output dir (train.py -o DIR), of
which the newest complete checkpoint is taken.  A family goes to the formats it reads, and to
Hugging Face's:

    llmc     llm.c's model file, --dtype float32 (version 3) or bfloat16 (version 5).  GPT-2.
    llama2c  llama2.c's model file, version 0 (what llama2.c's own export writes and run.c
             reads) unless --version 1.  Llama.
    gguf     llama.cpp's file, --dtype float32, or bfloat16 (its BF16: the matrices in bf16,
             the vectors float32), with the vocabulary (llmc/formats/gguf.py).  Llama,
             as llama.cpp's "llama" (Llama 2's block with GQA, eps, theta, a head size of its
             own, Llama 3's RoPE scaling as rope_freqs), "qwen2" (a bias on q, k and v) or
             "qwen3" (QK-norm) architecture; --check refuses Llama 3's scaling in one line
             (rope_freqs holds no parameters to read back).
    hf       a Hugging Face transformers folder (llmc/formats/huggingface.py): its
             AutoModelForCausalLM loads it as GPT2LMHeadModel or LlamaForCausalLM, and
             AutoTokenizer its tokenizer; model.safetensors in --dtype.

--dtype defaults to MODEL's: bfloat16 for llm.c's version 5, else float32.  TOKENIZER is the
vocabulary the model was trained on, which gguf and hf write with it: gpt2 (tiktoken's GPT-2,
found offline as train.py finds it; the default for a model of its 50257 tokens), llm.c's
gpt2_tokenizer.bin, or a SentencePiece vocabulary, its tokenizer.model or llama2.c's
tokenizer.bin, which dev/data/tinyshakespeare.py --sentencepiece N writes side by side (GGUF
takes the .bin, Hugging Face the .model, each found beside the other), or a Hugging Face
model's tokenizer.json (its folder's own, the default for a folder; GGUF takes a byte-level BPE
one with GPT-2's, SmolLM2's, Llama 3's or Qwen's pre-tokenizer).  --check reads the output back
and compares every size and tensor with MODEL's.  --merge ADAPTER adds a LoRA adapter (PEFT's
layout, finetune.py's DIR/adapter: llmc/adapter.py) into MODEL's weights first,
W += (alpha / r) B A, so that every format gets the fine-tuned model.

An ADAPTER folder (PEFT's layout) in MODEL's place goes to GGUF as llama.cpp's LoRA adapter
(llama-cli -m BASE.gguf --lora ADAPTER.gguf; llmc/formats/gguf.py's write_gguf_lora), for the
GGUF of its base model that --format gguf writes.  The base, whose sizes the adapter is checked
against, is adapter_config.json's base_model_name_or_path (finetune.py writes the model's path
there), or --base MODEL.
"""
import argparse
import dataclasses
import json
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from llmc.checkpoint import model_tokenizer, newest_model_file  # noqa: E402
from llmc.cli import Parser  # noqa: E402
from llmc.families import FamilyError, family_of_file  # noqa: E402
from llmc.formats import (FormatError, bfloat16_bits_to_float32,  # noqa: E402
                          float32_to_bfloat16_bits, open_file, param_views)
from llmc.formats.gguf import (GGUF_ARCHITECTURES, gguf_architecture, gguf_vocab,  # noqa: E402
                               gguf_as_stored, gpt2_gguf_vocab, write_gguf, write_gguf_lora)
from llmc.formats.hf_tokenizer import (HF_TOKENIZER_FILES, hf_gguf_vocab,  # noqa: E402
                                       is_hf_tokenizer)
from llmc.formats.huggingface import (HF_WRITERS, HFVocab, gpt2_hf_vocab,  # noqa: E402
                                      read_hf_model, sentencepiece_hf_vocab, write_hf_model)
from llmc.formats.llama2c import write_llama_model  # noqa: E402
from llmc.formats.llmc import TOKENIZER_MAGIC, checkpoint_dtype, write_checkpoint  # noqa: E402
from llmc.adapter import ADAPTER_CONFIG, merge, read_adapter_file  # noqa: E402
from llmc.tokenizer import GPT2_VOCAB_SIZE, Tokenizer, gpt2_encoding  # noqa: E402
from llmc.vocab import MAP_NAME  # noqa: E402

FORMATS = ("llmc", "llama2c", "gguf", "hf")
WITH_BFLOAT16 = ("llmc", "gguf", "hf")   # llama2c is float32 only
WITH_VOCABULARY = ("gguf", "hf")


class ExportError(Exception):
    """Bad input found after the arguments were parsed; one line, exit status 1."""


# ----------------------------------------------------------------------------
# what goes in: the model file and its vocabulary

def sentencepiece_file(path, extension, what):
    """The file of a SentencePiece vocabulary with this extension, beside path (tokenizer.model
    and tokenizer.bin, as the data scripts write them)."""
    beside = os.path.splitext(path)[0] + extension
    if not os.path.exists(beside):
        raise ExportError(f"--tokenizer {path}: {what}, and there is no {beside} beside it")
    return beside


def is_gpt2_bpe(tokenizer):
    """Whether --tokenizer names GPT-2's BPE: gpt2, or llm.c's tokenizer file."""
    if tokenizer == "gpt2":
        return True
    with open_file(tokenizer) as f:
        return int.from_bytes(f.read(4), "little", signed=True) == TOKENIZER_MAGIC


def gpt2_tokenizer(tokenizer):
    return Tokenizer.from_encoding(gpt2_encoding()) if tokenizer == "gpt2" \
        else Tokenizer.from_file(tokenizer)


def gguf_vocabulary(tokenizer, config):
    if is_hf_tokenizer(tokenizer):
        return hf_gguf_vocab(tokenizer, config.vocab_size)
    if tokenizer == "gpt2":
        gpt2 = gpt2_tokenizer(tokenizer)
        return gpt2_gguf_vocab(gpt2.token_bytes, gpt2.eot_token, config.vocab_size)
    if tokenizer.endswith(".model"):
        tokenizer = sentencepiece_file(tokenizer, ".bin", "GGUF takes llama2.c's tokenizer.bin")
    return gguf_vocab(tokenizer, config.vocab_size)   # llm.c's file or llama2.c's, by its magic


def hf_vocabulary(tokenizer, config):
    if is_hf_tokenizer(tokenizer):   # a Hugging Face model's own: its files as they are
        folder = tokenizer if os.path.isdir(tokenizer) else os.path.dirname(os.path.abspath(tokenizer))
        own = Tokenizer.from_hf(folder)
        files = {}
        for name in HF_TOKENIZER_FILES:
            if os.path.exists(os.path.join(folder, name)):
                with open_file(os.path.join(folder, name)) as f:
                    files[name] = f.read()
        return HFVocab(files, own.vocab_size, own.eot_token, own.stop_tokens[0])
    if not tokenizer.endswith(".model"):
        if is_gpt2_bpe(tokenizer):
            gpt2 = gpt2_tokenizer(tokenizer)
            return gpt2_hf_vocab(gpt2.token_bytes, gpt2.eot_token, config.max_seq_len)
        tokenizer = sentencepiece_file(tokenizer, ".model", "Hugging Face's tokenizer is built "
                                       "from SentencePiece's tokenizer.model")
    return sentencepiece_hf_vocab(tokenizer, config.max_seq_len)


# ----------------------------------------------------------------------------
# what comes out

def check_output_free(output, folder):
    """The output must not hold anything: no file there, or an empty folder for hf."""
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise ExportError(f"-o {output}: there is no folder {parent} to write it in")
    if not os.path.exists(output):
        return
    if folder and os.path.isdir(output):
        if os.listdir(output):
            raise ExportError(f"-o {output}: the folder is not empty (nothing is overwritten)")
    elif os.path.isdir(output):
        raise ExportError(f"-o {output}: is a folder; the format is one file")
    elif folder or os.path.getsize(output) > 0:
        raise ExportError(f"-o {output}: {'is a file' if folder else 'exists'} "
                          f"(nothing is overwritten)")


def export(family, config, params, args, dtype, name):
    """Write the model (config, float32 params) to args.output in args.format."""
    if args.format == "llmc":
        write_checkpoint(args.output, config, params, dtype=dtype)
    elif args.format == "llama2c":
        write_llama_model(args.output, config, params, version=args.version)
    elif args.format == "gguf":
        write_gguf(args.output, config, params, gguf_vocabulary(args.tokenizer, config), name=name,
                   dtype=dtype)
    else:
        tensors, hf_config = HF_WRITERS[family.name](config, params)
        write_hf_model(args.output, tensors, hf_config, hf_vocabulary(args.tokenizer, config),
                       dtype=dtype)


def tensors_without_padding(config, params):
    """name -> tensor, a GPT-2's wte without the padding rows only llm.c's files hold, and the
    config's sizes but the padding: what every format keeps of a model."""
    views = param_views(config, params)
    if "wte" in views:
        views["wte"] = views["wte"][:config.vocab_size]
    sizes = {k: v for k, v in dataclasses.asdict(config).items() if k != "padded_vocab_size"}
    return sizes, views


def reads_back_equal(family, args, config, params, dtype):
    """Whether the output read back is the model written (its values rounded to dtype); from
    GGUF, with the class its architecture reads back as (Mistral's block is "llama": Llama's)."""
    back = read_hf_model(args.output, {family.name: family.config_class}) if args.format == "hf" else family.read_model(args.output)
    if args.format == "gguf":   # its BF16 rounds the matrices only
        params = gguf_as_stored(config, params, dtype)
    elif dtype == "bfloat16":
        params = bfloat16_bits_to_float32(float32_to_bfloat16_bits(params))
    sizes, tensors = tensors_without_padding(config, params)
    sizes_back, tensors_back = tensors_without_padding(*back)
    if args.format == "gguf":   # GGUF keeps llama.cpp's architecture, not the Hugging Face class
        sizes["architecture"] = GGUF_ARCHITECTURES[gguf_architecture(config)][0]
    return sizes == sizes_back and tensors.keys() == tensors_back.keys() and all(
        np.array_equal(tensors[k], tensors_back[k]) for k in tensors)


# ----------------------------------------------------------------------------
# a LoRA adapter in MODEL's place

def is_adapter(path):
    """Whether path is a LoRA adapter folder (PEFT's layout: adapter_config.json)."""
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def adapter_base(adapter):
    """The base model of an adapter folder that its adapter_config.json names
    (base_model_name_or_path), where that is a path here."""
    config_path = os.path.join(adapter, ADAPTER_CONFIG)
    try:
        with open(config_path) as f:
            settings = json.load(f)
    except ValueError as e:
        raise ExportError(f"{config_path}: not JSON ({e})") from None
    base = settings.get("base_model_name_or_path") if isinstance(settings, dict) else None
    if not base or not os.path.exists(base):
        raise ExportError(f"{adapter}: its base model {base!r} (adapter_config.json's "
                          f"base_model_name_or_path) is not a path here: name it with --base")
    return base


def export_adapter(p, args):
    """The adapter folder args.model as llama.cpp's GGUF LoRA adapter at args.output, checked
    against its base model; the line that says what was written."""
    for flag, given in (("--tokenizer", args.tokenizer), ("--merge", args.merge),
                        ("--dtype", args.dtype), ("--check", args.check or None)):
        if given is not None:
            p.error(f"argument {flag}: not for a LoRA adapter, which goes to GGUF as it is")
    if args.format != "gguf":
        p.error(f"argument --format: a LoRA adapter goes to gguf (llama.cpp's --lora), not "
                f"{args.format}; --merge ADAPTER adds it into a model for every format")
    base = newest_model_file(args.base or adapter_base(args.model))
    family, _ = family_of_file(base)
    check_output_free(args.output, folder=False)
    config, _ = family.read_model(base)
    lora, stacks = read_adapter_file(args.model, config, family.model_class.LORA_TARGETS,
                                     family.model_class.num_layers_of(config))
    write_gguf_lora(args.output, lora, stacks, config,
                    name=os.path.basename(os.path.abspath(args.model)))
    return (f"wrote {args.output} (GGUF LoRA adapter, r={lora.rank} alpha={lora.alpha:g} on "
            f"{len(lora.targets)} projections of {len(lora.layers)} layers) from {args.model}, "
            f"for {base} ({family.title} {config.describe()})")


# ----------------------------------------------------------------------------

def parse_args(argv):
    p = Parser(prog="export.py", description=__doc__.split("\n\n")[0].strip(),
               formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("model", help="a model file of either family, or a train.py output dir; or "
                   "a LoRA adapter folder, for gguf")
    p.add_argument("--format", required=True, choices=FORMATS, help="the format to write")
    p.add_argument("-o", "--output", required=True,
                   help="the file to write (a folder for hf); must not exist, or be empty")
    p.add_argument("--tokenizer", help="the model's vocabulary, for gguf and hf: gpt2, llm.c's "
                   "gpt2_tokenizer.bin, a SentencePiece tokenizer.model or llama2.c "
                   "tokenizer.bin, or a Hugging Face tokenizer.json (default: a Hugging Face "
                   "folder's own; gpt2 for a model of GPT-2's 50257 tokens)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"),
                   help="llmc, gguf and hf: the parameters' dtype (default: MODEL's)")
    p.add_argument("--version", type=int, choices=(0, 1),
                   help="llama2c: the file's version (default: 0, run.c's)")
    p.add_argument("--merge", metavar="ADAPTER", default=None,
                   help="a LoRA adapter (PEFT's layout) added into the weights first")
    p.add_argument("--check", action="store_true", help="read the output back and compare")
    p.add_argument("--base", metavar="MODEL", default=None,
                   help="an adapter's base model (default: its adapter_config.json's "
                   "base_model_name_or_path)")
    args = p.parse_args(argv)
    if args.version is not None and args.format != "llama2c":
        p.error(f"argument --version: only llama2c has versions, not --format {args.format}")
    if args.dtype == "bfloat16" and args.format not in WITH_BFLOAT16:
        p.error(f"argument --dtype: --format {args.format} is float32 only")
    if args.tokenizer is not None and args.format not in WITH_VOCABULARY:
        p.error(f"argument --tokenizer: --format {args.format} holds no vocabulary")
    if args.base is not None and not is_adapter(args.model):
        p.error(f"argument --base: {args.model} is not a LoRA adapter folder (no {ADAPTER_CONFIG})")
    if args.format == "llama2c" and args.version is None:
        args.version = 0
    return p, args


def main(argv=None):
    p, args = parse_args(argv)
    try:
        if is_adapter(args.model):
            print(export_adapter(p, args))
            return
        path = newest_model_file(args.model)
        family, source_format = family_of_file(path)
        # a family goes to the formats it reads (but a lone safetensors file, a checkpoint's
        # own), and to Hugging Face's where it has a writer
        targets = tuple(dict.fromkeys(f for f in family.formats + ("hf",) * (family.name in HF_WRITERS)
                                      if f in FORMATS))
        if args.format not in targets:
            p.error(f"argument --format: a {family.title} model goes to "
                    f"{', '.join(targets[:-1])} or {targets[-1]}, not {args.format}")
        check_output_free(args.output, folder=args.format == "hf")
        config, params = family.read_model(path)
        if args.merge is not None:
            params = merge(args.merge, config, params, family.model_class.LORA_TARGETS,
                           family.model_class.num_layers_of(config))
        if args.format in WITH_VOCABULARY:
            if args.tokenizer is None:   # the model's own, found as generate.py finds it
                args.tokenizer, why = model_tokenizer(path)
                if args.tokenizer == "gpt2" and config.vocab_size != GPT2_VOCAB_SIZE:
                    p.error(f"argument --tokenizer: --format {args.format} writes the vocabulary "
                            f"the model was trained on, and its {config.vocab_size} tokens are "
                            f"not GPT-2's: name it (its SentencePiece tokenizer.model or "
                            f"tokenizer.bin, or a Hugging Face tokenizer.json)")
                print(f"export.py: tokenizer: {args.tokenizer} ({why}; --tokenizer overrides)",
                      file=sys.stderr)
            if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(path)), MAP_NAME)):
                raise ExportError(f"{path}: trained with --compact-vocab ({MAP_NAME} beside it): "
                                  f"its token ids are not the tokenizer's")
        dtype = args.dtype or (checkpoint_dtype(path) if source_format == "llmc" else "float32")
        if args.format not in WITH_BFLOAT16:
            dtype = "float32"
        export(family, config, params, args, dtype,
               name=os.path.splitext(os.path.basename(path))[0])
        if args.check and not reads_back_equal(family, args, config, params, dtype):
            raise ExportError(f"{args.output} does not read back as written")
    except (ExportError, FamilyError, FormatError, ValueError, RuntimeError) as e:
        sys.exit(f"export.py: error: {e}")
    except OSError as e:
        sys.exit(f"export.py: error: {e.filename + ': ' if e.filename else ''}{e.strerror or e}")
    what = {"llmc": f"llm.c, {dtype}", "llama2c": f"llama2.c version {args.version}",
            "gguf": f"GGUF, {dtype}", "hf": f"Hugging Face transformers, {dtype}"}[args.format]
    print(f"wrote {args.output} ({what}, {family.title} {config.describe()}) from {path}"
          + (", read back equal" if args.check else ""))


if __name__ == "__main__":
    main()
