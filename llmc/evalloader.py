"""
Multiple-choice evals during training (train.py -h 1: HellaSwag), as llm.c's llmc/evalloader.h
scores them: each example of an eval file (llmc.formats.llmc.read_evalfile) is a context and 4
completions; each completion's loss is the mean of the model's per-position losses where it
predicts the completion's tokens after the context, and the completion of the lowest loss is the
model's answer (llm.c's acc_norm: the mean, not the sum, so a long completion is not penalised).

Each completion is a row, context + completion, scored where it predicts the completion's
tokens. A row is never cut, so the score is HellaSwag's as llm.c's dev/data/hellaswag.py
computes it; only a row longer than the model's context (max_seq_len + 1 tokens) loses its
oldest tokens. Two ways to run the rows, the same losses within float32 rounding:

- over the KV cache (a backend with accel/spec.py's "cache" group): examples packed end to end
  into one long row of about PACKED_ROWS tokens (Model.forward_segments), each context run
  once, then each completion after it from the cache, and the head (the vocabulary-wide GEMM
  and its softmax) only where a completion's token is predicted: about 170 positions an
  example through the layers and 120 through the head, where a batch of whole rows runs 320
  through both (0.45x the time on a 2-core Zen 3, dev/BENCHMARKS.md section 25: the FLOPs'
  share, the longer GEMMs no faster per FLOP there).
- else in batches: the rows sorted by length and run B at a time through model.forward, each
  batch at its longest row's length rounded up to a multiple of RUN_MULTIPLE tokens (little
  padding, few shapes: a new shape only re-points the model's activations, which grow to the
  largest); the last batch filled with rows of token 0, whose losses are not read.

With many processes (llmc/distributed.py) each takes its share of the examples, as llm.c's
evalloader does (ceil(N / processes) each, in order), and the numbers right are summed.
"""
import os

import numpy as np

from llmc.default_data import DATA_DIR

__all__ = ["HELLASWAG", "batched_losses", "completion_losses", "count_correct", "evaluate",
           "packed_losses", "packed_scores", "process_share", "scored_row", "scored_rows"]

# llm.c's fixed path, relative to where train.py runs (for short messages); dev/data/hellaswag.py
# writes it
HELLASWAG = os.path.relpath(os.path.join(DATA_DIR, "hellaswag", "hellaswag_val.bin"))
RUN_MULTIPLE = 16   # batched: the lengths the rows run at, multiples of this many tokens
PACKED_ROWS = 1024   # over the cache: the tokens packed into a forward (at least one example's)


def scored_row(context, completion, max_len):
    """A completion's row as (tokens, start): context + completion cut from the left to a
    model's context (max_len positions: max_len + 1 tokens), and the position whose target is
    the completion's first token (0 where the cut reached the completion)."""
    tokens = np.concatenate([context, completion]).astype(np.int32)
    drop = max(len(tokens) - 1 - max_len, 0)
    return tokens[drop:], max(len(context) - 1 - drop, 0)


def scored_rows(model, examples):
    """Each completion's row (scored_row), example by example."""
    return [scored_row(example.context, completion, model.config.max_seq_len)
            for example in examples for completion in example.completions]


def completion_losses(model, examples, B):
    """(len(examples), completions) float64: the mean loss of each completion's tokens after
    its context, over the KV cache where the backend has one, else in batches of B rows."""
    rows = scored_rows(model, examples)
    losses = packed_losses(model, rows) if model.has_kv_cache else batched_losses(model, rows, B)
    return losses.reshape(len(examples), -1)


def packed_losses(model, rows):
    """(rows,) float64: rows scored over the KV cache (packed_scores), each the mean loss."""
    return np.array([losses.mean(dtype=np.float64) for losses, _ in packed_scores(model, rows)])


def packed_scores(model, rows, greedy=False):
    """Each row's (losses, all_greedy) over the KV cache, PACKED_ROWS tokens a forward: the
    float32 losses of its scored positions, and where greedy is asked whether each of its
    targets is its position's most likely token (lm-eval's is_greedy), else None. In a
    forward's one row the shared beginnings (a row's tokens before its start) come first, then
    every row's scored part: the token at its start and the completion but its last token,
    whose next tokens are its targets; the head runs on those alone. Segments run the
    beginnings at position 0, each scored part after its beginning's cache."""
    scores = [None] * len(rows)
    for forward in packed_forwards(rows):
        beginnings = [rows[i][0][:rows[i][1]] for i, new in forward if new]
        parts = [rows[i][0][rows[i][1]:] for i, _ in forward]   # inputs part[:-1], targets part[1:]
        head_from = sum(map(len, beginnings))
        segments, begun, placed = [], 0, head_from   # (rows from, length, position), in run order
        for (i, new), part in zip(forward, parts):
            start = rows[i][1]
            if new:
                segments.append((begun, start, 0))
                begun += start
            segments.append((placed, len(part) - 1, start))
            placed += len(part) - 1
        targets = np.concatenate([part[1:] for part in parts])
        per_position = model.forward_segments(
            np.concatenate(beginnings + [part[:-1] for part in parts]), segments, head_from,
            targets)
        if greedy:
            logits = model.activation("logits")[0, :len(targets), :model.config.vocab_size]
            is_greedy = logits.argmax(axis=-1) == targets
        ends = np.cumsum([len(part) - 1 for part in parts])
        for (i, _), end, part in zip(forward, ends, parts):
            scored = slice(end - (len(part) - 1), end)
            scores[i] = (per_position[scored], bool(is_greedy[scored].all()) if greedy else None)
    return scores


def packed_forwards(rows):
    """The rows in forwards of about PACKED_ROWS tokens (at least one row each), in order: each
    forward a list of (row, new), new where the row's beginning is not the one the row before
    it in the forward left in the cache (so it runs, at position 0)."""
    forward, size, shared = [], 0, None
    for i, (tokens, start) in enumerate(rows):
        if forward and size + len(tokens) > PACKED_ROWS:
            yield forward
            forward, size, shared = [], 0, None
        beginning = tokens[:start]
        new = start > 0 and (shared is None or not np.array_equal(shared, beginning))
        shared = beginning
        forward.append((i, new))
        size += (start if new else 0) + len(tokens) - 1 - start
    if forward:
        yield forward


def batched_losses(model, rows, B):
    """(rows,) float64: rows scored in batches of B (see above)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    losses = np.empty(len(rows))
    max_len = model.config.max_seq_len
    for first in range(0, len(order), B):
        batch = order[first:first + B]
        longest = len(rows[batch[-1]][0]) - 1
        length = min(-(-longest // RUN_MULTIPLE) * RUN_MULTIPLE, max_len)
        inputs = np.zeros((B, length), dtype=np.int32)
        targets = np.zeros((B, length), dtype=np.int32)
        for r, i in enumerate(batch):
            tokens = rows[i][0]
            inputs[r, :len(tokens) - 1] = tokens[:-1]
            targets[r, :len(tokens) - 1] = tokens[1:]
        model.forward(inputs, targets)
        per_position = model.activation("losses")
        for r, i in enumerate(batch):
            tokens, start = rows[i]
            losses[i] = per_position[r, start:len(tokens) - 1].mean(dtype=np.float64)
    return losses


def count_correct(losses, examples):
    """How many examples' right completion has the lowest loss (the first of equal ones)."""
    labels = np.array([example.label for example in examples])
    return int(np.sum(np.argmin(losses, axis=1) == labels))


def process_share(num_examples, process_rank, num_processes):
    """The examples process_rank scores: llm.c's contiguous ceil(N / processes) each."""
    per_process = -(-num_examples // num_processes)
    start = min(process_rank * per_process, num_examples)
    return slice(start, min(start + per_process, num_examples))


def evaluate(model, examples, B, dist):
    """How many of examples the model gets right, its share on each process, summed."""
    share = examples[process_share(len(examples), dist.process_rank, dist.num_processes)]
    correct = count_correct(completion_losses(model, share, B), share) if share else 0
    return int(round(dist.sum(correct)))
