"""
dev/bench_hellaswag.py: what does HellaSwag during training (train.py -h 1) cost, scored over
the KV cache against scored in batches of whole rows?

llmc/evalloader.py scores each completion one of two ways: over the KV cache (each context
once, the head only where a completion's tokens are predicted, examples packed into long rows:
what a backend with a cache runs) or in batches of B whole rows (the other backends; what every
backend ran before the cache). This times both on the same model and examples in one process,
alternating, and says whether they agree: the right answers, and each completion's loss.

HellaSwag's file needs the internet (dev/data/hellaswag.py), so without --file the examples are
a stand-in of its size: tinyshakespeare's val tokens, contexts of 20-80 tokens and four
completions of 15-45 (about 170 tokens an example, as HellaSwag's val set in GPT-2's tokens).

    python dev/bench_hellaswag.py                          (a random GPT-2 d12, 100 examples, B=4)
    python dev/bench_hellaswag.py --family llama --model stories15M --packed-rows 512,1024,2048

Prints each way's seconds an eval (the best of --rounds), the ratio, the examples right each
way and the largest difference of a completion's loss.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llmc import evalloader  # noqa: E402
from llmc.default_data import DATA_DIR  # noqa: E402
from llmc.families import get_family  # noqa: E402
from llmc.formats.llmc import EvalExample, read_evalfile, read_shard  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="gpt2", choices=("gpt2", "llama"))
    p.add_argument("--model", default="d12", help="a preset of the family, at random init")
    p.add_argument("--file", help="an eval file in llm.c's format (default: the stand-in)")
    p.add_argument("--examples", type=int, default=100, help="train.py's -hm (default 100)")
    p.add_argument("-b", dest="B", type=int, default=4, help="the batched way's rows a forward "
                   "(train.py's -b: the training batch)")
    p.add_argument("--packed-rows", default=str(evalloader.PACKED_ROWS),
                   help="the cached way's tokens a forward, comma-separated to compare several")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, help="OpenMP threads (default: OpenMP's)")
    return p.parse_args(argv)


def stand_in(count, vocab_size, seed=0):
    """count examples of HellaSwag's size cut from tinyshakespeare's val tokens (random token
    ids where the shard is absent)."""
    rng = np.random.default_rng(seed)
    path = os.path.join(DATA_DIR, "tinyshakespeare", "tiny_shakespeare_val.bin")
    text = (read_shard(path).astype(np.int32) if os.path.exists(path)
            else rng.integers(0, vocab_size, 100_000).astype(np.int32))

    def cut(low, high):
        length = int(rng.integers(low, high + 1))
        start = int(rng.integers(0, len(text) - length))
        return text[start:start + length] % vocab_size
    return [EvalExample(context=cut(20, 80), completions=[cut(15, 45) for _ in range(4)],
                        label=int(rng.integers(0, 4))) for _ in range(count)]


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        from threadpoolctl import threadpool_limits
        threadpool_limits(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    family = get_family(args.family)
    config = family.config_class.from_name(args.model)
    model = family.model_class.random(config, seed=0)
    examples = (read_evalfile(args.file, config.vocab_size)[:args.examples] if args.file
                else stand_in(args.examples, config.vocab_size))
    rows = evalloader.scored_rows(model, examples)
    tokens = sum(len(e.context) + sum(map(len, e.completions)) for e in examples)
    print(f"{args.family} {args.model} at random init, {len(examples)} examples "
          f"({tokens / len(examples):.1f} tokens an example), {os.cpu_count()} CPUs")
    if not model.has_kv_cache:
        sys.exit(f"backend {model.backend.name} has no KV cache: nothing to compare")

    ways = {"batched": lambda: evalloader.batched_losses(model, rows, args.B)}
    for packed in map(int, args.packed_rows.split(",")):
        def run(packed=packed):
            evalloader.PACKED_ROWS = packed
            return evalloader.packed_losses(model, rows)
        ways[f"cached, {packed} rows"] = run
    times = {name: [] for name in ways}
    losses = {}
    for _ in range(args.rounds):
        for name, way in ways.items():
            start = time.perf_counter()
            losses[name] = way().reshape(len(examples), -1)
            times[name].append(time.perf_counter() - start)
    base = min(times["batched"])
    right = {name: evalloader.count_correct(value, examples) for name, value in losses.items()}
    print(f"{'way':<24} {'s an eval':>10} {'vs batched':>11} {'right':>6} {'max |dloss|':>12}")
    for name in ways:
        best = min(times[name])
        diff = np.abs(losses[name] - losses["batched"]).max()
        print(f"{name:<24} {best:>10.2f} {best / base:>10.3f}x {right[name]:>6} {diff:>12.2e}")


if __name__ == "__main__":
    main()
