"""
Checks generate.py against llama2.c's run.c, token for token: builds run.c from a llama2.c
checkout (llm.pyx vendors none of its code) into a temp dir, writes a trained Llama as
llama2.c's version-0 file (the one run.c reads), and runs run.c and generate.py greedily from
the same checkpoint and prompt. The prompt's token ids are compared first, with run.c's
encode() itself (a harness of ours includes run.c, built with -DTESTING, which leaves out its
main).

    git clone https://github.com/karpathy/llama2.c /tmp/llama2c
    python dev/llama2c_check.py /tmp/llama2c            # trains a tiny Llama first (~1 min)
    python dev/llama2c_check.py /tmp/llama2c --model out/model_00000060.bin \\
        --tokenizer dev/data/tinyshakespeare/sp512/tokenizer.bin

Without --model it trains one the way the README does: dev/data/tinyshakespeare.py
--sentencepiece 512 (shards and llama2.c's tokenizer.bin), then train.py --family llama -e d4
(grouped-query attention, 4 heads on 2) for --steps steps.

run.c prints text, not token ids, so the comparison is piece by piece: each of our tokens
becomes the bytes run.c prints for it (its decode(): the space after BOS dropped, "<0xHH>" the
byte HH; its safe_printf(): a lone byte that is neither printable nor a space dropped), and
run.c's output must be those pieces one after the other. Two tokens with the same piece would
pass for each other; the first piece that differs is named, with our margin between the two
most likely tokens there. generate.py runs twice: its function, for the tokens, and its
command, whose output must be their text.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from llmc.formats.llama2c import read_llama2c_tokenizer  # noqa: E402
from llmc.sampler import Sampler, continue_prompt  # noqa: E402
from llmc.tokenizer import SP_BOS, load_tokenizer  # noqa: E402

VOCAB_SIZE = 512
C_PRINTABLE = set(range(0x20, 0x7F)) | set(b" \t\n\v\f\r")   # isprint || isspace, "C" locale


class CheckError(Exception):
    """A step that could not run; one line."""


def run(cmd, what, **options):
    """cmd's completed process; CheckError with its last line of stderr when it fails."""
    done = subprocess.run(cmd, capture_output=True, **options)
    if done.returncode != 0:
        err = done.stderr if isinstance(done.stderr, str) else done.stderr.decode(errors="replace")
        last = (err.strip().splitlines() or ["no message"])[-1]
        raise CheckError(f"{what} failed (exit status {done.returncode}): {last}")
    return done


def build_run_c(checkout, work):
    """run.c compiled as llama2.c's README compiles it, into work/run."""
    source = os.path.join(checkout, "run.c")
    if not os.path.isfile(source):
        raise CheckError(f"{checkout}: no run.c (give a llama2.c checkout)")
    binary = os.path.join(work, "run")
    run([c_compiler(), "-O3", "-o", binary, source, "-lm"], f"building {source}")
    return binary


def c_compiler():
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise CheckError("no C compiler (cc, gcc or clang) to build run.c")
    return compiler


ENCODE_HARNESS = r"""
#define TESTING
#include "run.c"
int main(int argc, char** argv) {   /* tokenizer.bin, vocab_size, text: encode's ids */
    Tokenizer tokenizer;
    build_tokenizer(&tokenizer, argv[1], atoi(argv[2]));
    int* tokens = malloc((strlen(argv[3]) + 3) * sizeof(int)), n = 0;
    encode(&tokenizer, argv[3], 1, 0, tokens, &n);
    for (int i = 0; i < n; i++) printf("%d\n", tokens[i]);
    return 0;
}
"""


def run_c_encode(checkout, work, tokenizer_path, vocab_size, text):
    """The token ids run.c's encode(bos=1, eos=0) gives text, through ENCODE_HARNESS."""
    source, binary = os.path.join(work, "encode.c"), os.path.join(work, "encode")
    with open(source, "w") as f:
        f.write(ENCODE_HARNESS)
    run([c_compiler(), "-O2", "-I", checkout, "-o", binary, source, "-lm"],
        "building run.c's encode()")
    done = run([binary, tokenizer_path, str(vocab_size), text], "run.c's encode()")
    return [int(line) for line in done.stdout.split()]


def train_tiny_llama(work, steps, input_text):
    """(model file, tokenizer.bin) of a d4 Llama trained steps steps on tinyshakespeare with
    a SentencePiece vocabulary of VOCAB_SIZE."""
    data = os.path.join(work, "data")
    script = os.path.join(REPO_ROOT, "dev", "data", "tinyshakespeare.py")
    text = ["--input-text", input_text] if input_text else []
    print(f"training a tiny Llama: SentencePiece {VOCAB_SIZE} on tinyshakespeare, d4, "
          f"{steps} steps")
    run([sys.executable, script, *text, "--output-dir", data, "--sentencepiece",
         str(VOCAB_SIZE)], "dev/data/tinyshakespeare.py")
    shards = os.path.join(data, f"sp{VOCAB_SIZE}")
    out = os.path.join(work, "out")
    run([sys.executable, os.path.join(REPO_ROOT, "train.py"), "--family", "llama", "-e", "d4",
         "-i", os.path.join(shards, "tiny_shakespeare_train.bin"),
         "-j", os.path.join(shards, "tiny_shakespeare_val.bin"), "-b", "8", "-t", "64",
         "-l", "1e-3", "-u", "5", "-x", str(steps), "-n", str(steps), "-o", out, "-s", "0",
         "-v", str(steps), "-m", "4"], "train.py")
    return os.path.join(out, f"model_{steps:08d}.bin"), os.path.join(shards, "tokenizer.bin")


def run_c_piece(pieces, previous, token):
    """The bytes run.c prints for token after previous (decode, then safe_printf)."""
    piece = pieces[token]
    if previous == SP_BOS and piece[:1] == b" ":
        piece = piece[1:]
    byte = re.match(rb"<0x\s*([0-9A-Fa-f]{1,2})", piece)   # sscanf(piece, "<0x%02hhX>")
    if byte:
        piece = bytes([int(byte.group(1), 16)])
    if len(piece) == 1 and piece[0] not in C_PRINTABLE:
        return b""
    return piece


def compare(tokens, pieces, printed, margins):
    """None when run.c printed exactly the pieces of tokens (the first is BOS) and a newline,
    else where and how they differ."""
    at = 0
    for i in range(1, len(tokens)):
        piece = run_c_piece(pieces, tokens[i - 1], tokens[i])
        if printed[at:at + len(piece)] != piece:
            margin = (f"; our top two logits there differ by {margins[i]:.3g}"
                      if i in margins else " (a prompt token)")
            return (f"token {i} ({tokens[i]}, {piece!r}): run.c printed "
                    f"{printed[at:at + len(piece) + 8]!r} after {printed[max(at - 40, 0):at]!r}"
                    f"{margin}")
        at += len(piece)
    if printed[at:] != b"\n":
        return f"run.c printed more after our {len(tokens) - 1} pieces: {printed[at:at + 60]!r}"
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkout", help="a llama2.c checkout (its run.c)")
    p.add_argument("--model", help="a Llama model file (default: train a tiny one)")
    p.add_argument("--tokenizer", help="the model's llama2.c tokenizer.bin (with --model)")
    p.add_argument("--prompt", default="First Citizen:", help="the prompt (default: %(default)s)")
    p.add_argument("-n", dest="tokens", type=int, default=64,
                   help="tokens to generate (default: %(default)s)")
    p.add_argument("--steps", type=int, default=60,
                   help="training steps of the tiny Llama (default: %(default)s)")
    p.add_argument("--input-text", metavar="FILE",
                   help="a local copy of tinyshakespeare's input.txt for the tiny Llama")
    args = p.parse_args(argv)
    if (args.model is None) != (args.tokenizer is None):
        p.error("--model and --tokenizer go together")
    try:
        with tempfile.TemporaryDirectory(prefix="llama2c-check-") as work:
            check(args, work)
    except CheckError as e:
        sys.exit(f"llama2c_check.py: error: {e}")


def check(args, work):
    from train_llama2 import Llama2
    binary = build_run_c(args.checkout, work)
    model_path, tokenizer_path = args.model, args.tokenizer
    if model_path is None:
        model_path, tokenizer_path = train_tiny_llama(work, args.steps, args.input_text)
    model = Llama2.from_checkpoint(model_path)
    legacy = os.path.join(work, "model_v0.bin")   # as a user makes it: dev/export.py's default
    run([sys.executable, os.path.join(REPO_ROOT, "dev", "export.py"), model_path, "--format",
         "llama2c", "-o", legacy], "dev/export.py")
    tok = load_tokenizer(tokenizer_path)
    pieces, _ = read_llama2c_tokenizer(tokenizer_path)

    # ours: the tokens, and the logit margins that chose them
    prompt = tok.encode_prompt(args.prompt)
    theirs = run_c_encode(args.checkout, work, tokenizer_path, len(pieces), args.prompt)
    if theirs != prompt:
        raise CheckError(f"the prompt's tokens differ: run.c's encode() gives {theirs}, ours "
                         f"{prompt}")
    margins = {}

    def greedy(logits):
        top = np.sort(logits)[-2:]
        margins[len(prompt) + len(margins)] = float(top[1] - top[0])
        return Sampler(0.0)(logits)
    tokens = prompt + list(continue_prompt(model, prompt, args.tokens, greedy, tok.stop_tokens))
    command = [sys.executable, os.path.join(REPO_ROOT, "generate.py"), model_path, "-p",
               args.prompt, "-n", str(args.tokens), "--temperature", "0", "--tokenizer",
               tokenizer_path]
    ours = run(command, "generate.py", text=True).stdout
    piece = tok.stream_decoder(after=tokens[0])
    if ours != "".join(piece(t) for t in tokens[1:]) + "\n":
        raise CheckError("generate.py's command printed other text than its function's tokens")

    # run.c: -n counts the positions it runs, the prompt's included; it stops at BOS as we do
    steps = len(prompt) - 1 + args.tokens
    printed = run([binary, legacy, "-z", tokenizer_path, "-t", "0", "-n", str(steps), "-i",
                   args.prompt], "run.c").stdout
    print(f"model: {model_path} ({model.config.describe()}), as llama2.c's version 0")
    print(f"prompt {args.prompt!r}: {len(prompt)} tokens, BOS included, the ids of run.c's "
          f"encode()")
    print(f"run.c {' '.join(['-t', '0', '-n', str(steps), '-i', repr(args.prompt)])} and "
          f"generate.py -n {args.tokens} --temperature 0: {len(prompt) - 1} prompt and "
          f"{len(tokens) - len(prompt)} generated tokens compared piece by piece")
    problem = compare(tokens, pieces, printed, margins)
    print("run.c printed:", repr(printed.decode("utf-8", errors="replace")))
    if problem:
        raise CheckError(f"run.c and generate.py differ at {problem}")
    print(f"match: run.c printed the pieces of generate.py's {len(tokens) - 1} tokens, "
          f"in order; smallest margin between our two most likely tokens "
          f"{min(margins.values()):.3g}")


if __name__ == "__main__":
    main()
