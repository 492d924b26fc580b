"""
Generates text with a model of either family: continues a prompt token by token, printing the
text as it comes, as llama2.c's run.c does (and llm.c's samples).

    python generate.py out -p "First Citizen:" -n 200          # train.py -o out's newest checkpoint
    python generate.py model.bin -p "Once upon a time" -n 200 --temperature 0.8 --top-k 40 \\
        --top-p 0.9 --seed 42 --tokenizer tokenizer.bin
    python generate.py model.bin -p "Once upon a time" --temperature 0   # greedy

The model: any model file, told by its first bytes (llmc/families.py's family_of_file): llm.c's
checkpoint (GPT-2), llama2.c's version 0 or 1 or a GGUF (Llama); a Hugging Face model folder
(GPT-2, Llama, Mistral, Qwen2, Qwen3); or train.py's output dir, whose newest complete
checkpoint it loads (llmc/checkpoint.py).

The tokenizer: --tokenizer, a llama2.c tokenizer.bin (or llm.c's gpt2_tokenizer.bin), a Hugging
Face tokenizer.json (or its folder) or `gpt2` (GPT-2's, through tiktoken). Without it, a GGUF
file's own vocabulary (SentencePiece, or GPT-2's) or a model folder's own tokenizer.json, else
the one train.py used: the tokenizer beside the training data's shards (from the run.json
beside the checkpoint), else a tokenizer.bin or tokenizer.json beside the model file, else
GPT-2's; a line on stderr says which. A prompt starts with the token the documents start with
(GPT-2's <|endoftext|>, SentencePiece's BOS), and a tokenizer.bin encodes it as run.c's
encode() does (llmc/tokenizer.py), so it gets run.c's tokens; an empty prompt is that token
alone. A Hugging Face tokenizer encodes as transformers' AutoTokenizer, with a BOS only where
it puts one (Qwen's puts none: its prompt may not be empty). A --compact-vocab run's
vocab_map.bin beside the checkpoint is used.

The next token (llmc/sampler.py's Sampler): the argmax of the logits at --temperature 0, else a
draw from softmax(logits / temperature) cut to the --top-k most likely and to the nucleus
--top-p, with llm.c's xorshift RNG at --seed. Generation stops after -n tokens, or when the
model writes the token documents start with (run.c stops at BOS), or a Hugging Face model one of
its EOS tokens (generation_config.json's). The tokens per second,
counted from the second token as run.c counts them, go to stderr at the end.

The forward: the model has no KV cache, so each token is a forward over the sequence so far.
Every forward runs at one length, the prompt's and -n's, the positions not written yet padded
with token 0, so the activations are allocated once (Model reallocates them when the shape
changes). That is exact because the model is causal: position t-1's logits do not depend on
the tokens after it, not even in rounding (tests/test_generate.py: other padding gives the
same bits), so the logits that chose each token are, bit for bit, those of one forward over
the whole text.
"""
import math
import os
import sys
import time

import numpy as np

from llmc.checkpoint import model_tokenizer, newest_model_file
from llmc.cli import Parser
from llmc.dataloader import DataError
from llmc.families import FamilyError, family_of_file
from llmc.formats import FormatError
from llmc.sampler import SAMPLE_SEED, Sampler, continue_prompt
from llmc.tokenizer import Tokenizer, TokenizerError, gpt2_encoding, load_tokenizer
from llmc.vocab import MAP_NAME, VocabMap

DEFAULT_STEPS = 256   # run.c's


class GenerateError(Exception):
    """Bad input found after the arguments were parsed; one line, exit status 1."""


def note(message):
    print(f"generate.py: {message}", file=sys.stderr, flush=True)


def parse_args(argv):
    p = Parser(prog="generate.py", description="Continue a prompt with a model of either family "
               "(llm.c's, llama2.c's or GGUF model file, a Hugging Face model folder, or "
               "train.py's output dir).")
    p.add_argument("model", help="a model file, a Hugging Face model folder, or train.py's "
                                 "output dir (its newest checkpoint)")
    p.add_argument("-p", "--prompt", default="",
                   help="the text to continue (default: none, the start token alone)")
    p.add_argument("-n", dest="steps", metavar="INT", type=int, default=None,
                   help=f"tokens to generate (default: {DEFAULT_STEPS}, or fewer where the "
                        f"model's context ends)")
    p.add_argument("--temperature", metavar="FLOAT", type=float, default=1.0,
                   help="0: greedy (the argmax) (default: %(default)s)")
    p.add_argument("--top-k", metavar="INT", type=int, default=0,
                   help="draw from the k most likely tokens only (0: all) (default: "
                        "%(default)s)")
    p.add_argument("--top-p", metavar="FLOAT", type=float, default=0.9,
                   help="draw from the nucleus of this probability only (1: all) (default: "
                        "%(default)s)")
    p.add_argument("--seed", metavar="INT", type=int, default=SAMPLE_SEED,
                   help="seed of the xorshift RNG that draws the tokens (default: "
                        "%(default)s)")
    p.add_argument("--tokenizer", metavar="PATH", default=None,
                   help="a llama2.c tokenizer.bin, a Hugging Face tokenizer.json, or gpt2 "
                        "(GPT-2's) (default: a GGUF's or a model folder's own, else the "
                        "training data's, else one beside the model, else GPT-2's)")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        p.error(f"argument -n: must be at least 1, got {args.steps}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        p.error(f"argument --temperature: must be a number >= 0, got {args.temperature}")
    if args.top_k < 0:
        p.error(f"argument --top-k: must be >= 0, got {args.top_k}")
    if not 0 < args.top_p <= 1:
        p.error(f"argument --top-p: must be in (0, 1], got {args.top_p}")
    if not 1 <= args.seed < 2 ** 64:   # xorshift's state never leaves 0
        p.error(f"argument --seed: must be in [1, 2^64), got {args.seed}")
    return args


def open_tokenizer(name):
    """--tokenizer's: gpt2, or a tokenizer file (a GGUF model's vocabulary too)."""
    if name == "gpt2":
        return Tokenizer.from_encoding(gpt2_encoding())
    if not os.path.exists(name):
        raise GenerateError(f"--tokenizer {name}: no such file (nor gpt2)")
    return load_tokenizer(name)


def assumed_tokenizer(path):
    """The tokenizer of the model at path (llmc.checkpoint.model_tokenizer), said in a line."""
    name, why = model_tokenizer(path)
    note(f"tokenizer: {name} ({why}; --tokenizer overrides)")
    return open_tokenizer(name)


def main(argv=None):
    args = parse_args(argv)
    path = newest_model_file(args.model)
    family, _ = family_of_file(path)
    model = family.model_class.from_checkpoint(path)
    config = model.config
    tokenizer = (open_tokenizer(args.tokenizer) if args.tokenizer is not None
                 else assumed_tokenizer(path))
    prompt = tokenizer.encode_prompt(args.prompt)
    if not prompt:
        raise GenerateError(f"an empty prompt, and the tokenizer ({tokenizer.source}) starts a "
                            f"text with no token of its own: give -p TEXT")
    vocab_map_path = os.path.join(os.path.dirname(path), MAP_NAME)
    if os.path.exists(vocab_map_path):   # a --compact-vocab run: its ids are the map's
        vocab_map = VocabMap.load(vocab_map_path)
        prompt = [int(t) for t in vocab_map.compact(np.array(prompt), "the prompt")]
        tokenizer = vocab_map.tokenizer(tokenizer)
    if tokenizer.vocab_size < config.vocab_size and not tokenizer.padded_vocabulary:
        raise GenerateError(f"the tokenizer ({tokenizer.source}) has {tokenizer.vocab_size} "
                            f"tokens, fewer than the model's vocabulary of {config.vocab_size}: "
                            f"give the model's own (--tokenizer)")
    outside = [t for t in prompt if t >= config.vocab_size]
    if outside:
        raise GenerateError(f"the prompt's token {outside[0]} "
                            f"({tokenizer.decode([outside[0]])!r}) is outside the model's "
                            f"vocabulary of {config.vocab_size}: give the model's own "
                            f"tokenizer (--tokenizer)")
    room = config.max_seq_len - len(prompt) + 1   # the last token needs no position
    if room < 1:
        raise GenerateError(f"the prompt is {len(prompt)} tokens, more than the model's "
                            f"max_seq_len {config.max_seq_len}")
    steps = min(DEFAULT_STEPS, room) if args.steps is None else args.steps
    if steps > room:
        raise GenerateError(f"-n {steps}: the prompt (its first token included: "
                            f"{len(prompt)}) and {steps} more tokens need "
                            f"{len(prompt) + steps - 1} positions, the model has "
                            f"{config.max_seq_len}: at most -n {room}")

    sampler = Sampler(args.temperature, args.top_k, args.top_p, args.seed)
    started = prompt[0] == tokenizer.eot_token   # the start token, not printed
    piece = tokenizer.stream_decoder(after=prompt[0] if started else None)
    sys.stdout.write("".join(piece(t) for t in prompt[started:]))
    sys.stdout.flush()
    count, start = 0, None
    for token in continue_prompt(model, prompt, steps, sampler, tokenizer.stop_tokens):
        sys.stdout.write(piece(token))
        sys.stdout.flush()
        count += 1
        if start is None:   # the first token pays for the first allocations
            start = time.perf_counter()
    sys.stdout.write("\n")
    if count > 1:
        print(f"achieved tok/s: {(count - 1) / (time.perf_counter() - start):f}",
              file=sys.stderr)


def run(argv=None):
    """main() with bad input reported in one line (exit status 1), never a traceback."""
    try:
        main(argv)
    except (GenerateError, FormatError, FamilyError, TokenizerError, DataError) as e:
        sys.stderr.write(f"generate.py: error: {e}\n")
        sys.exit(1)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"generate.py: error: {where}{e.strerror or e}\n")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.stderr.write("\ngenerate.py: interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    run()
