"""
Generates text with a model of either family: continues a prompt token by token, printing the
text as it comes, as llama2.c's run.c does (and llm.c's samples).

    python generate.py out -p "First Citizen:" -n 200          # train.py -o out's newest checkpoint
    python generate.py model.bin -p "Once upon a time" -n 200 --temperature 0.8 --top-k 40 \\
        --top-p 0.9 --seed 42 --tokenizer tokenizer.bin
    python generate.py model.bin -p "Once upon a time" --temperature 0   # greedy
    python generate.py model.bin --prompts prompts.txt -n 64 --ids      # a prompt a line
    python generate.py models/SmolLM2-135M-Instruct --chat             # a conversation
    python generate.py models/SmolLM2-135M-Instruct --adapter run/adapter --chat  # fine-tuned

The model: any model file, told by its first bytes (llmc/families.py's family_of_file): llm.c's
checkpoint (GPT-2), llama2.c's version 0 or 1 or a GGUF (Llama); a Hugging Face model folder
(GPT-2, Llama, Mistral, Qwen2, Qwen3); or train.py's output dir, whose newest complete
checkpoint it loads (llmc/checkpoint.py); with --adapter a LoRA adapter on it (PEFT's layout:
finetune.py's, llmc/adapter.py).

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
its EOS tokens (generation_config.json's); stderr says which at the end, then the prompt's
speed (prefill: its one forward, with the first token's sampling) and the generated tokens'
("achieved tok/s", counted from the second token as run.c counts them).

The forward: a KV cache (llmc/model.pyx's forward_cached) where the backend has one: the
prompt is one forward that keeps each layer's keys and values, and each new token a forward of
one position attending over them, so a token costs the same at position 10 and 1000 but for
the attention's reads of the cache. Without it (a backend without the cache group) each token
is a forward over the sequence so far, at one length, the prompt's and -n's, the positions not
written yet padded with token 0. Both give the same tokens (tests/test_kv_cache.py): their
logits differ by float32 rounding only.
"""
import math
import os
import sys
import time

import numpy as np

from llmc.adapter import read_adapter
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
    p.add_argument("--prompts", metavar="FILE", default=None,
                   help="a text file of prompts, one a line (\\n in a line: a newline), each "
                        "generated in turn as -p would be, a blank line between the texts")
    p.add_argument("--chat", action="store_true",
                   help="a conversation: each line read from stdin is your turn, the reply the "
                        "model's, through its chat template (a Hugging Face tokenizer's), the "
                        "KV cache kept across turns; -p is the system message, -n a reply's "
                        "most tokens; an empty line or end of input ends it")
    p.add_argument("--ids", action="store_true",
                   help="print the token ids (the prompt's, then each generated one) on "
                        "stderr at the end")
    p.add_argument("--adapter", metavar="DIR", default=None,
                   help="a LoRA adapter (PEFT's layout: finetune.py's DIR/adapter) on the model")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="the weights, activations and KV cache in float32, or in bf16 (half "
                        "the bytes a token reads; sums in float32) (default: %(default)s)")
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
    if args.prompts is not None and (args.prompt or args.chat):
        p.error("argument --prompts: the prompts are the file's lines: drop -p and --chat")
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
    model = family.model_class.from_checkpoint(path, precision=args.precision, trainable=False)
    if args.adapter is not None:
        lora = read_adapter(args.adapter, model)
        note(f"adapter: {args.adapter} (LoRA r={lora.rank} on {len(lora.targets)} projections "
             f"of {len(lora.layers)} layers)")
    config = model.config
    tokenizer = (open_tokenizer(args.tokenizer) if args.tokenizer is not None
                 else assumed_tokenizer(path))
    vocab_map_path = os.path.join(os.path.dirname(path), MAP_NAME)
    vocab_map = VocabMap.load(vocab_map_path) if os.path.exists(vocab_map_path) else None
    encoder = tokenizer   # a prompt's ids: the tokenizer's, then (compacted) the map's
    if vocab_map is not None:   # a --compact-vocab run: its ids are the map's
        tokenizer = vocab_map.tokenizer(tokenizer)
    if tokenizer.vocab_size < config.vocab_size and not tokenizer.padded_vocabulary:
        raise GenerateError(f"the tokenizer ({tokenizer.source}) has {tokenizer.vocab_size} "
                            f"tokens, fewer than the model's vocabulary of {config.vocab_size}: "
                            f"give the model's own (--tokenizer)")
    if args.chat:
        return chat(model, tokenizer, args)
    prompts = [args.prompt] if args.prompts is None else read_prompts(args.prompts)
    for i, text in enumerate(prompts):
        if i > 0:
            sys.stdout.write("\n")   # a blank line between two texts
        prompt = encoder.encode_prompt(text)
        if vocab_map is not None:
            prompt = [int(t) for t in vocab_map.compact(np.array(prompt), "the prompt")]
        generate_text(model, tokenizer, prompt, args)


def read_prompts(path):
    """--prompts: the lines of a text file, each a prompt (a line's \\n: a newline in it)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n").replace("\\n", "\n") for line in f]
    except UnicodeDecodeError as e:
        raise GenerateError(f"--prompts {path}: not UTF-8 text ({e.reason} at byte "
                            f"{e.start})") from None
    if not lines:
        raise GenerateError(f"--prompts {path}: an empty file, no prompt in it")
    return lines


def generate_text(model, tokenizer, prompt, args):
    """The prompt (token ids) and what the model writes after it, on stdout as it comes; why it
    stopped and the speeds on stderr."""
    config = model.config
    if not prompt:
        raise GenerateError(f"an empty prompt, and the tokenizer ({tokenizer.source}) starts a "
                            f"text with no token of its own: give -p TEXT")
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
    count, started, generated = 0, time.perf_counter(), []
    prefilled = None   # when the first token came: the prompt's forward (and one sample) done
    stopped = (f"-n {steps}" if args.steps is not None else
               f"the default -n {steps}" if steps == DEFAULT_STEPS else
               f"the model's context ({config.max_seq_len} positions)")
    # the stop tokens are looked at here, not in continue_prompt, to say which one ended it
    for token in continue_prompt(model, prompt, steps, sampler, ()):
        if prefilled is None:
            prefilled = time.perf_counter()
        if token in tokenizer.stop_tokens:
            stopped = f"the end token {tokenizer.decode([token])!r} (id {token})"
            break
        sys.stdout.write(piece(token))
        sys.stdout.flush()
        generated.append(token)
        count += 1
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.ids:
        print(f"token ids: prompt {prompt}, generated {generated}", file=sys.stderr)
    done = time.perf_counter()
    how = "KV cache" if model.has_kv_cache else f"no KV cache on backend {model.backend.name}"
    print(f"stopped at {stopped}: {count} tokens", file=sys.stderr)
    if prefilled is not None:
        print(f"prefill: {len(prompt)} tokens at {len(prompt) / (prefilled - started):.1f} "
              f"tok/s ({how})", file=sys.stderr)
    if count > 1:   # run.c's line: from the second token on
        print(f"achieved tok/s: {(count - 1) / (done - prefilled):f}", file=sys.stderr)


def chat(model, tokenizer, args):
    """--chat: the conversation so far rendered by the chat template after each of your turns,
    and the model's reply generated after it. The cache keeps the text it has seen: a turn
    feeds only the rendered conversation's tokens after those the cache already holds (the
    template renders the turns before alike; where the text differs, a reply re-encoded, the
    cache goes back to where it agrees). Ctrl-C during a reply ends that reply, at your turn
    the conversation."""
    template = tokenizer.chat_template
    if template is None or tokenizer.text_encoder is None:
        raise GenerateError(f"--chat: the tokenizer ({tokenizer.source}) has no chat template "
                            f"(a Hugging Face tokenizer_config.json's chat_template): give a "
                            f"model folder, or --tokenizer, that has one")
    if not model.has_kv_cache:
        raise GenerateError(f"--chat needs a KV cache, which backend {model.backend.name} has "
                            f"not (accel/spec.py's cache group)")
    capacity = model.config.max_seq_len
    model.start_cache(capacity)
    sampler = Sampler(args.temperature, args.top_k, args.top_p, args.seed)
    messages = [{"role": "system", "content": args.prompt}] if args.prompt else []
    cached = []   # the token ids whose keys and values the cache holds
    interactive = sys.stdin.isatty()
    while True:
        try:
            turn = input("> " if interactive else "")
        except EOFError:
            break
        if not turn.strip():
            break
        messages.append({"role": "user", "content": turn})
        text = tokenizer.text_encoder(template.render(messages, add_generation_prompt=True))
        if len(text) >= capacity:
            raise GenerateError(f"--chat: the conversation is {len(text)} tokens, the model's "
                                f"context {capacity}: start a new one")
        agree = next((i for i, (a, b) in enumerate(zip(cached, text)) if a != b),
                     min(len(cached), len(text)))
        agree = min(agree, len(text) - 1)   # the last token's logits are the reply's first
        model.rewind_cache(agree)
        started = time.perf_counter()
        logits = model.forward_cached(text[agree:])
        prompted = time.perf_counter()
        reply, piece = [], tokenizer.stream_decoder()
        limit = capacity - len(text) if args.steps is None else args.steps
        try:
            while len(reply) < limit:
                token = sampler(logits)
                if token in tokenizer.stop_tokens:
                    break
                reply.append(token)
                sys.stdout.write(piece(token))
                sys.stdout.flush()
                if len(text) + len(reply) < capacity:
                    logits = model.forward_cached([token])
        except KeyboardInterrupt:
            sys.stdout.write(" [reply interrupted]")
        sys.stdout.write("\n")
        sys.stdout.flush()
        cached = (text + reply)[:model.kv_positions]
        done = time.perf_counter()
        messages.append({"role": "assistant", "content": tokenizer.decode(reply)})
        new = len(text) - agree
        note(f"{new} new prompt tokens at {new / (prompted - started):.1f} tok/s, a reply of "
             f"{len(reply)} at {len(reply) / max(done - prompted, 1e-9):.1f} tok/s; "
             f"{model.kv_positions} of {capacity} positions cached")


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
