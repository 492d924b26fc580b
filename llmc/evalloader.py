"""
Multiple-choice evals during training (train.py -h 1: HellaSwag), as llm.c's llmc/evalloader.h
scores them: each example of an eval file (llmc.formats.llmc.read_evalfile) is a context and 4
completions; each completion's loss is the mean of the model's per-position losses where it
predicts the completion's tokens after the context, and the completion of the lowest loss is the
model's answer (llm.c's acc_norm: the mean, not the sum, so a long completion is not penalised).

The batches: every completion is a row, context + completion, run through model.forward with the
row's next tokens as targets (the losses are the model's "losses" activation). The rows are
sorted by length and run B at a time, each batch at its longest row's length rounded up to a
multiple of RUN_MULTIPLE tokens: little padding (HellaSwag's rows are some 80 tokens, which at
the next multiple of a training T of 64 would run at 128), and few shapes (a new shape only
re-points the model's activations, which grow to the largest). A row is never cut, so the score
is HellaSwag's as llm.c's dev/data/hellaswag.py computes it; only a row longer than the model's
context (max_seq_len + 1 tokens) loses its oldest tokens. The last batch is filled with rows of
token 0, whose losses are not read.

With many processes (llmc/distributed.py) each takes its share of the examples, as llm.c's
evalloader does (ceil(N / processes) each, in order), and the numbers right are summed.
"""
import os

import numpy as np

from llmc.default_data import DATA_DIR

__all__ = ["HELLASWAG", "completion_losses", "count_correct", "evaluate", "process_share"]

# llm.c's fixed path, relative to where train.py runs (for short messages); dev/data/hellaswag.py
# writes it
HELLASWAG = os.path.relpath(os.path.join(DATA_DIR, "hellaswag", "hellaswag_val.bin"))
RUN_MULTIPLE = 16   # the lengths the rows run at: multiples of this many tokens


def completion_losses(model, examples, B):
    """(len(examples), completions) float64: the mean loss of each completion's tokens after
    its context, the model run on batches of B rows (see above)."""
    rows = []   # (tokens, the position whose target is the completion's first token)
    max_len = model.config.max_seq_len
    for example in examples:
        for completion in example.completions:
            tokens = np.concatenate([example.context, completion])
            drop = max(len(tokens) - 1 - max_len, 0)   # beyond the model's context: the oldest go
            rows.append((tokens[drop:], max(len(example.context) - 1 - drop, 0)))
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    losses = np.empty(len(rows))
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
    return losses.reshape(len(examples), -1)


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
