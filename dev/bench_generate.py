"""
Generation's speed beside llama2.c's run.c, side by side in one run on the same threads: the
prompt's forward (prefill) and the tokens after it (decode), with llm.pyx's KV cache
(llmc/model.pyx's forward_cached) and without it, on a random model of each preset's shape
written as llama2.c's version-0 file, the one file both read. run.c is built from a llama2.c
checkout as its Makefile's `runomp` builds it (-Ofast -fopenmp -march=native: its users'
fastest, and its own fast-math; llm.pyx is built without it), into a temp dir, and run
greedily on the same file with llama2.c's own tokenizer.bin. Where llama-cpp-python is installed
(pip builds llama.cpp from source), llama.cpp runs the same model as a GGUF (dev/export.py) at
F32 and at BF16 (beside our fp32 and bf16 rows) through its Python binding, greedy, and a prompt
of 512 tokens is timed on both (the models whose context holds it).

    git clone https://github.com/karpathy/llama2.c /tmp/llama2c
    python dev/bench_generate.py /tmp/llama2c                       # stories15M, stories110M
    python dev/bench_generate.py /tmp/llama2c --models stories110M --tokens 200 --threads 2
    python dev/bench_generate.py /tmp/llama2c --models llama-1b --tokens 100 --rounds 1

Every row is timed --rounds times (3), the rows taking turns, and the table gives each row's
median and range: on a shared machine one sample moved by 10-20% from run to run, more than
the differences in question. A last line per model divides our decode by llama.cpp's.

Decode counts as run.c counts its "achieved tok/s": from the second generated token to the
last. A random model's text is noise, and either program may stop early at the BOS token
(run.c always does; ours too, here): our rows say how many tokens they timed (run.c prints no
count). The position rows time decode after a prompt of that many tokens (the cache then
holds them): a token's cost grows with the attention's reads of the cache only.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from llmc.families import get_family  # noqa: E402
from llmc.formats.llama2c import write_llama_model  # noqa: E402
from llmc.sampler import Sampler, continue_prompt  # noqa: E402

PROMPT = [1, 9038, 2501, 263, 931]   # BOS "Once upon a time" in Llama 2's vocabulary
RUN_C = "run.c (runomp)"   # the peer: every decode row's ratio is against it
GGUF_TYPES = {"fp32": ("float32", "F32"), "bf16": ("bfloat16", "BF16")}   # export.py's, llama.cpp's


def build_run_c(checkout, work):
    """llama2.c's run.c as its Makefile's runomp target builds it, into work/run."""
    source = os.path.join(checkout, "run.c")
    if not os.path.isfile(source) or not os.path.isfile(os.path.join(checkout, "tokenizer.bin")):
        sys.exit(f"bench_generate.py: {checkout}: no run.c and tokenizer.bin (give a llama2.c "
                 f"checkout)")
    compiler = shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    if compiler is None:
        sys.exit("bench_generate.py: no C compiler (gcc, cc or clang) to build run.c")
    binary = os.path.join(work, "run")
    subprocess.run([compiler, "-Ofast", "-fopenmp", "-march=native", source, "-lm", "-o",
                    binary], check=True)
    return binary


def run_c_speed(binary, checkout, model_path, tokens, threads):
    """run.c's achieved tok/s of greedy generation after "Once upon a time" (it prints text,
    not a count: it stops at -n or at BOS)."""
    done = subprocess.run([binary, model_path, "-t", "0", "-n", str(len(PROMPT) - 1 + tokens),
                           "-i", "Once upon a time", "-z", os.path.join(checkout, "tokenizer.bin")],
                          capture_output=True, text=True, check=True,
                          env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    speed = re.search(r"achieved tok/s: ([0-9.]+)", done.stderr)
    return float(speed.group(1)) if speed else float("nan")


def our_speed(model, prompt, tokens, cache):
    """(tokens generated, prefill tok/s, decode tok/s) of greedy generation, timed as
    generate.py times it."""
    started, first, count = time.perf_counter(), None, 0
    for _ in continue_prompt(model, prompt, tokens, Sampler(0), {1}, cache=cache):
        count += 1
        if first is None:
            first = time.perf_counter()
    done = time.perf_counter()
    decode = (count - 1) / (done - first) if count > 1 else float("nan")
    return count, len(prompt) / (first - started), decode


def decode_at(model, position, tokens):
    """Decode tok/s of tokens one at a time after a prompt of position tokens in the cache."""
    prompt = list(np.random.default_rng(0).integers(3, model.config.vocab_size, position))
    model.start_cache(position + tokens)
    model.forward_cached(prompt)
    started = time.perf_counter()
    for t in range(tokens):
        model.forward_cached([int(prompt[t % position])])
    return tokens / (time.perf_counter() - started)


def llama_cpp_model(model_path, checkout, work, threads, dtype):
    """llama.cpp (llama-cpp-python's Llama, built from source) on the model as a GGUF of dtype,
    float32 (F32) or bfloat16 (BF16) (dev/export.py, llama2.c's tokenizer.bin as its
    vocabulary); None where llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    gguf = os.path.join(work, f"{os.path.basename(model_path)}.{dtype}.gguf")
    subprocess.run([sys.executable, os.path.join(ROOT, "dev", "export.py"), model_path,
                    "--format", "gguf", "-o", gguf, "--dtype", dtype, "--tokenizer",
                    os.path.join(checkout, "tokenizer.bin")], check=True, capture_output=True)
    return llama_cpp.Llama(gguf, n_threads=threads, n_threads_batch=threads, n_batch=512,
                           n_ctx=0, verbose=False)   # n_ctx 0: the model's context


def llama_cpp_speed(llm, tokens):
    """(tokens generated, prefill tok/s, decode tok/s) of llama.cpp's greedy generation, its
    cache emptied first (generate() would otherwise reuse the last run's prompt)."""
    llm.reset()
    started, first, count = time.perf_counter(), None, 0
    for token in llm.generate(PROMPT, top_k=1, temp=0.0, repeat_penalty=1.0):
        if first is None:
            first = time.perf_counter()
        if token == 1 or count == tokens:
            break
        count += 1
    done = time.perf_counter()
    return count, len(PROMPT) / (first - started), (count - 1) / (done - first)


def llama_cpp_prefill(llm, prompt):
    """tok/s of the prompt into llama.cpp's emptied cache."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    return len(prompt) / (time.perf_counter() - start)


def our_prefill(model, prompt):
    """tok/s of the prompt into an emptied cache."""
    model.start_cache(len(prompt))
    start = time.perf_counter()
    model.forward_cached(prompt)
    return len(prompt) / (time.perf_counter() - start)


def programs_of(name, config, path, models, args, binary, work):
    """[(label, run, what its ratio is against)] for one model: run() gives (tokens,
    prefill tok/s, decode tok/s), either speed None where not timed."""
    first = args.precisions[0]
    rows = [(RUN_C, lambda: (None, None, run_c_speed(binary, args.llama2c, path, args.tokens,
                                                     args.threads)), None)]
    for precision in args.precisions:
        rows.append((f"llm.pyx {precision}, KV cache",
                     lambda p=precision: our_speed(models[p], PROMPT, args.tokens, True), RUN_C))
    rows.append((f"llm.pyx {first}, no cache",   # O(n^2) without: 40 tokens at most
                 lambda: our_speed(models[first], PROMPT, min(args.tokens, 40), False), RUN_C))
    long = 512 if config.max_seq_len >= 512 else None
    for precision in args.precisions:   # llama.cpp on the same weights as a GGUF
        dtype, gguf_type = GGUF_TYPES[precision]
        llm = llama_cpp_model(path, args.llama2c, work, args.threads, dtype)
        if llm is None:
            print(f"{name:12s} llama.cpp: not run (pip install llama-cpp-python builds it)")
            break
        rows.append((f"llama.cpp {gguf_type} GGUF",
                     lambda llm=llm: llama_cpp_speed(llm, args.tokens), RUN_C))
        if long is not None and precision == first:   # one long prompt, for both programs
            prompt = [int(t) for t in np.random.default_rng(0).integers(3, config.vocab_size, long)]
            rows.append((f"prefill of {long}: llama.cpp",
                         lambda llm=llm: (long, llama_cpp_prefill(llm, prompt), None), None))
            rows.append((f"prefill of {long}: llm.pyx",
                         lambda: (long, our_prefill(models[first], prompt), None),
                         f"prefill of {long}: llama.cpp"))
    near, far = 10, min(1000, config.max_seq_len - 40)
    rows.append((f"KV cache at position {near}",
                 lambda: (32, None, decode_at(models[first], near, 32)), None))
    rows.append((f"KV cache at position {far}",
                 lambda: (32, None, decode_at(models[first], far, 32)),
                 f"KV cache at position {near}"))
    return rows


def median(runs, i):
    """The median of field i of a row's runs, None where it times no such speed."""
    return None if runs[0][i] is None else float(np.median([r[i] for r in runs]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("llama2c", help="a llama2.c checkout (run.c, tokenizer.bin)")
    p.add_argument("--models", nargs="+", default=["stories15M", "stories110M"])
    p.add_argument("--tokens", type=int, default=200, help="tokens to generate")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                   help="llm.pyx's rows with the cache at each (generate.py --precision); "
                        "without it and the long prompts at the first only")
    p.add_argument("--rounds", type=int, default=3, help="every row timed this many times, "
                   "the rows taking turns; the table gives each row's median")
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)   # before the kernels' OpenMP starts
    family = get_family("llama")
    with tempfile.TemporaryDirectory() as work:
        binary = build_run_c(args.llama2c, work)
        print(f"{args.threads} threads; greedy, {args.tokens} tokens after a {len(PROMPT)}-token "
              f"prompt; decode counted from the second token, as run.c counts it; each row the "
              f"median of {args.rounds} rounds (its range in brackets), the rows taking turns")
        print(f"{'model':12s} {'program':28s} {'tokens':>6s} {'prefill tok/s':>14s} "
              f"{'decode tok/s':>13s} {'ratio':>7s}  {'range':s}")
        for name in args.models:
            config = family.config_class.from_name(name)
            path = os.path.join(work, f"{name}.bin")
            write_llama_model(path, config, family.model_class.random(config, seed=1).params,
                              version=0)
            models = {precision: family.model_class.from_checkpoint(
                path, precision=precision, trainable=False) for precision in args.precisions}
            rows = programs_of(name, config, path, models, args, binary, work)
            runs = {label: [] for label, _, _ in rows}
            for _ in range(args.rounds):
                for label, run, _ in rows:
                    runs[label].append(run())
            speed = {}   # label: its median speed, decode's where it times decode
            for label, _, against in rows:
                count, prefill, decode = runs[label][-1][0], median(runs[label], 1), \
                    median(runs[label], 2)
                which = 2 if decode is not None else 1
                speed[label] = decode if decode is not None else prefill
                ratio = 1.0 if label == RUN_C else \
                    speed[label] / speed[against] if against else None
                print(f"{name:12s} {label:28s} {'-' if count is None else count:>6} "
                      f"{'' if prefill is None else f'{prefill:.1f}':>14s} "
                      f"{'' if decode is None else f'{decode:.1f}':>13s} "
                      f"{'' if ratio is None else f'{ratio:.2f}x':>7s}  "
                      f"[{min(r[which] for r in runs[label]):.1f}-"
                      f"{max(r[which] for r in runs[label]):.1f}]"
                      f"{'' if against in (None, RUN_C) else f'  (ratio: of {against})'}")
            for precision in args.precisions:   # the other peer: ours over llama.cpp's
                ours, theirs = f"llm.pyx {precision}, KV cache", \
                    f"llama.cpp {GGUF_TYPES[precision][1]} GGUF"
                if theirs in speed:
                    print(f"{name:12s} decode, {ours} / {theirs}: "
                          f"{speed[ours] / speed[theirs]:.2f}x")


if __name__ == "__main__":
    main()
