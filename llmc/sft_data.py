"""
The data of supervised fine-tuning: a JSONL file of examples, tokenized with the model's own
tokenizer (llmc.tokenizer.Tokenizer) and served as llm.c's (B, T) int32 inputs and targets, the
targets -1 where nothing is to be learnt. The file's forms are MLX-LM's (mlx_lm.lora), one per
file, set by the keys of its first line:

    text          {"text": "..."}: the text as the tokenizer encodes it (its BOS where it puts
                  one), then its EOS (generation's first stop token) unless it ends with it
    chat          {"messages": [{"role": ..., "content": ...}, ...]}: rendered by the
                  tokenizer's chat template, encoded as transformers' apply_chat_template
                  (tokenize=True) encodes it; roles system, user, assistant, tool
    completions   {"prompt": ..., "completion": ...}: a user turn and an assistant turn through
                  the chat template; with a tokenizer that has none, the text prompt +
                  completion encoded as the text form (EOS after it)
    tools         {"messages": [...], "tools": [...]}: chat, with the tools given to the
                  template as `tools` (an assistant message may hold tool_calls and no content)

Empty lines are skipped. A line that is not what its file's form says raises SFTDataError,
"FILE:LINE: what is wrong", on one line.

mask_prompt scores only what the model is to write: the completion, or each assistant turn (its
content and what the template writes after it up to and including its end-of-turn token, the
first of the tokenizer's stop tokens found there: <|im_end|>, </s>, <|eot_id|>); every other
target is -1. The spans are found by rendering prefixes of the conversation: turn i starts where
messages[:i] rendered with the generation prompt ends, and ends where messages[:i+1] rendered
ends (then back to its last stop token), each counted in tokens as the common prefix with the
whole conversation's, so a token that BPE merges across the boundary counts as the assistant's.
This works with any template; transformers' {% generation %} markers would need the rendered
text's character offsets (ChatTemplate renders a marked block as its body) and few shipped
templates (Qwen2.5's, Llama 3's, SmolLM2's) carry them. A template that renders an earlier turn
differently once later turns follow (Qwen3 drops its reasoning) has no such prefix: that line is
refused, not scored wrongly. The text form has no prompt: mask_prompt on it is an error.

An example is its tokens, llm.c's way: n tokens give inputs tokens[:-1] and targets tokens[1:].
One longer than T + 1 tokens is cut to its first T + 1 and counted (summary()), never dropped.

Batches put one example in each row, padded to T (inputs the EOS, targets -1), not several
packed back to back as llm.c's pretraining does: attention there runs across the examples of a
row, so each would be learnt in the context of unrelated ones, and a check against transformers
or PEFT, which fine-tune one example per row, could not agree. As MLX-LM, the examples are sorted
by length and cut into batches of B, so a batch's rows are alike in length; training visits the
batches in an order shuffled each epoch (llm.c's Mersenne Twister and Fisher-Yates,
llmc/dataloader.py), and can report and restore its position. The last batch's missing rows
are padding (all targets -1): every example is served each epoch.

    data = SFTDataset(path, tokenizer, T, mask_prompt=True)
    print(data.describe())                                  # counts, on one line
    batches = data.batches(B, seed=0)                      # next(batches) -> (inputs, targets)
    state = batches.state_dict()                            # {"epoch", "index"}
    batches.load_state_dict(state)                          # continues bit for bit
    for inputs, targets in data.eval_batches(B): ...        # each example once, in file order
"""
import json
import os

import numpy as np

from llmc.dataloader import MT19937, random_permutation
from llmc.formats import FormatError

ROLES = ("system", "user", "assistant", "tool")
# each form's keys, tested in this order (a chat line with "tools" is the tools form)
FORM_KEYS = (("tools", ("messages", "tools")), ("chat", ("messages",)),
             ("completions", ("prompt", "completion")), ("text", ("text",)))
KEYS = dict(FORM_KEYS)
TEMPLATED = ("chat", "tools")   # the forms that need a chat template


class SFTDataError(ValueError):
    """Fine-tuning data that cannot be used; str(e) is one line, "FILE:LINE: problem"."""


def form_of(record):
    return next((form for form, keys in FORM_KEYS if all(k in record for k in keys)), None)


def type_name(value):
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def common_prefix(a, b):
    """How many leading ids a and b share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


class SFTDataset:
    """The examples of one JSONL file (see the module docstring): examples[i] is its (inputs,
    targets), int32 arrays of up to T entries, in file order."""

    def __init__(self, path, tokenizer, seq_len, mask_prompt=False):
        self.path, self.tokenizer, self.seq_len = os.fspath(path), tokenizer, seq_len
        self.mask_prompt = mask_prompt
        self.eos = tokenizer.stop_tokens[0]
        self.pad = self.eos   # behind every real token, its target -1: any id would do
        self.form, self.first_line = None, None   # the file's form, set by its first line
        self.examples, self.truncated, self.cut_tokens = [], 0, 0
        for number, record in self._records():
            tokens, scored = self._tokenize(number, record)
            if len(tokens) < 2:
                raise SFTDataError(f"{self.path}:{number}: {len(tokens)} token(s), nothing "
                                   f"to learn")
            if len(tokens) > seq_len + 1:   # the head is kept: a prompt and its answer's start
                self.truncated += 1
                self.cut_tokens += len(tokens) - seq_len - 1
                tokens, scored = tokens[:seq_len + 1], scored[:seq_len + 1]
            tokens = np.asarray(tokens, dtype=np.int32)
            self.examples.append((tokens[:-1], np.where(scored[1:], tokens[1:], -1)
                                  .astype(np.int32)))
        if not self.examples:
            raise SFTDataError(f"{self.path}: no examples")

    def _records(self):
        """(line number, record) of each non-empty line, checked against the file's form."""
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise SFTDataError(f"{self.path}: {e.strerror}") from None
        with f:
            for number, raw in enumerate(f, 1):
                where = f"{self.path}:{number}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise SFTDataError(f"{where}: not UTF-8 (byte {e.start + 1})") from None
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SFTDataError(f"{where}: not JSON ({e.msg}, column {e.colno})") from None
                if not isinstance(record, dict):
                    raise SFTDataError(f"{where}: {type_name(record)}, not a JSON object")
                self._check(where, number, record)
                yield number, record

    def _check(self, where, number, record):
        """On the first line, the file's form; on every line, its keys and their types
        against that form."""
        form = form_of(record)
        if self.form is None:
            if form is None:
                raise SFTDataError(f"{where}: keys {sorted(record)} are none of the forms: "
                                   f'"text"; "messages"; "prompt" and "completion"; '
                                   f'"messages" and "tools"')
            self._start(form, number)
        elif form != self.form:
            missing = " and ".join(f'"{k}"' for k in KEYS[self.form] if k not in record)
            what = f"a {form} line" if form else f"no {missing}"
            raise SFTDataError(f"{where}: {what} in a {self.form} file (its line "
                               f"{self.first_line}'s form)")
        for key in ("text", "prompt", "completion"):
            if key in KEYS[form] and not isinstance(record[key], str):
                raise SFTDataError(f'{where}: "{key}" is {type_name(record[key])}, not a string')
        if form in TEMPLATED:
            self._check_messages(where, record["messages"])
        if form == "tools" and not (isinstance(record["tools"], list) and
                                    all(isinstance(t, dict) for t in record["tools"])):
            raise SFTDataError(f'{where}: "tools" is not a list of objects')

    def _start(self, form, number):
        """The file's form is known: refuse what this tokenizer or mask_prompt cannot do."""
        self.form, self.first_line = form, number
        source = self.tokenizer.source
        if form in TEMPLATED and (self.tokenizer.chat_template is None or
                                  self.tokenizer.text_encoder is None):
            raise SFTDataError(f"{self.path}: {form} examples are rendered by the tokenizer's "
                               f"chat template, and the tokenizer ({source}) has none: give "
                               f'one that has, or write the examples as {{"text": ...}}')
        if self.tokenizer.encoder is None:
            raise SFTDataError(f"{self.path}: the tokenizer ({source}) only decodes, it cannot "
                               f"encode the examples")
        if form == "text" and self.mask_prompt:
            raise SFTDataError(f'{self.path}: mask_prompt: the text form ({{"text": ...}}) has '
                               f"no prompt to mask")

    @staticmethod
    def _check_messages(where, messages):
        if not isinstance(messages, list) or not messages:
            raise SFTDataError(f'{where}: "messages" is not a non-empty list')
        for k, message in enumerate(messages):
            if not isinstance(message, dict):
                raise SFTDataError(f"{where}: message {k} is {type_name(message)}, not an object")
            role, content = message.get("role"), message.get("content")
            if role not in ROLES:
                raise SFTDataError(f"{where}: message {k}: role {role!r} is not one of "
                                   f"{', '.join(ROLES)}")
            # an assistant's call of a tool may come without text (MLX-LM's tools form)
            calls = role == "assistant" and isinstance(message.get("tool_calls"), list)
            if not isinstance(content, str) and not (calls and content is None):
                raise SFTDataError(f'{where}: message {k} ({role}): "content" is '
                                   f"{type_name(content) if 'content' in message else 'missing'}"
                                   f", not a string")

    def _tokenize(self, number, record):
        """(the example's token ids, a boolean array: which of them are scored)."""
        if self.form == "text":
            tokens = self._text_ids(record["text"])
            return tokens, np.ones(len(tokens), dtype=bool)
        if self.form == "completions" and self.tokenizer.chat_template is None:
            tokens = self._text_ids(record["prompt"] + record["completion"])
            prompt = self.tokenizer.encode_prompt(record["prompt"])
            return tokens, np.arange(len(tokens)) >= common_prefix(prompt, tokens)
        if self.form == "completions":
            messages = [{"role": "user", "content": record["prompt"]},
                        {"role": "assistant", "content": record["completion"]}]
        else:
            messages = record["messages"]
        return self._chat(number, messages, record.get("tools"))

    def _text_ids(self, text):
        tokens = list(self.tokenizer.encode_prompt(text))
        return tokens if tokens[-1:] == [self.eos] else tokens + [self.eos]

    def _chat(self, number, messages, tools):
        where = f"{self.path}:{number}"

        def render(turns, add_generation_prompt=False):
            try:
                return self.tokenizer.chat_template.render(
                    turns, add_generation_prompt=add_generation_prompt, tools=tools)
            except FormatError as e:
                raise SFTDataError(f"{where}: {e.problem}") from None
        text = render(messages)
        tokens = self.tokenizer.text_encoder(text)
        if not self.mask_prompt:
            return tokens, np.ones(len(tokens), dtype=bool)
        scored = np.zeros(len(tokens), dtype=bool)
        turns = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
        if not turns:
            raise SFTDataError(f"{where}: mask_prompt: no assistant turn, nothing to learn")
        for i in turns:
            before, through = render(messages[:i], add_generation_prompt=True), \
                render(messages[:i + 1])
            if not (text.startswith(through) and through.startswith(before)):
                raise SFTDataError(f"{where}: mask_prompt: the chat template renders message "
                                   f"{i} (assistant) otherwise once later turns follow, so its "
                                   f"span cannot be found: give each assistant turn an "
                                   f"example of its own")
            start = common_prefix(self.tokenizer.text_encoder(before), tokens)
            end = common_prefix(self.tokenizer.text_encoder(through), tokens)
            # the turn ends at its end-of-turn token; what follows it ("\n") is the next turn's
            stops = [t for t in range(start, end) if tokens[t] in self.tokenizer.stop_tokens]
            scored[start:stops[-1] + 1 if stops else end] = True
        return tokens, scored

    def summary(self):
        """The counts a run prints: examples, tokens (after cutting), truncated (examples cut to
        T + 1 tokens), cut_tokens (what that cut off), targets, masked (targets -1),
        masked_share, unscored (examples with no target left: their prompt filled T)."""
        targets = sum(len(t) for _, t in self.examples)
        masked = sum(int(np.count_nonzero(t < 0)) for _, t in self.examples)
        return dict(examples=len(self.examples), tokens=targets + len(self.examples),
                    truncated=self.truncated, cut_tokens=self.cut_tokens, targets=targets,
                    masked=masked, masked_share=masked / targets,
                    unscored=sum(1 for _, t in self.examples if not np.any(t >= 0)))

    def describe(self):
        s = self.summary()
        line = (f"{self.path}: {s['examples']:,} {self.form} examples, {s['tokens']:,} tokens, "
                f"{s['truncated']:,} cut to {self.seq_len + 1} tokens ({s['cut_tokens']:,} "
                f"tokens lost), {100 * s['masked_share']:.1f}% of targets masked")
        return line + (f", {s['unscored']:,} with none left" if s["unscored"] else "")

    def batch(self, indices, batch_size):
        """(inputs, targets), (batch_size, T) int32: the examples at indices, a row each,
        padded (inputs the pad id, targets -1), and rows of padding after them."""
        inputs = np.full((batch_size, self.seq_len), self.pad, dtype=np.int32)
        targets = np.full((batch_size, self.seq_len), -1, dtype=np.int32)
        for row, i in enumerate(indices):
            x, y = self.examples[i]
            inputs[row, :len(x)], targets[row, :len(y)] = x, y
        return inputs, targets

    def batches(self, batch_size, seed=0):
        """The training batches, epoch after epoch (TrainBatches)."""
        return TrainBatches(self, batch_size, seed)

    def eval_batches(self, batch_size):
        """Every example once, in file order, batch_size to a batch (the last one's missing
        rows padding)."""
        for start in range(0, len(self.examples), batch_size):
            yield self.batch(range(start, min(start + batch_size, len(self.examples))), batch_size)


class TrainBatches:
    """An iterator of training batches, without end: the length-sorted groups of batch_size
    examples, in an order shuffled at the start of each epoch by a Mersenne Twister seeded
    with seed (each epoch's order is the one before shuffled again, as llm.c's shard order).
    state_dict() is where it is ({"epoch", "index": the next batch's place in the epoch}),
    load_state_dict() goes back there: the batches after it are those an uninterrupted
    iterator gives."""

    def __init__(self, dataset, batch_size, seed=0):
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size}: must be at least 1")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        lengths = [len(x) for x, _ in dataset.examples]
        by_length = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        self.groups = [by_length[i:i + batch_size] for i in range(0, len(by_length), batch_size)]
        self.load_state_dict({"epoch": 0, "index": 0})

    def load_state_dict(self, state):
        epoch, index = state["epoch"], state["index"]
        if not (isinstance(epoch, int) and isinstance(index, int) and epoch >= 0 and
                0 <= index < len(self.groups)):
            raise ValueError(f"batch position {state}: not one of these {len(self.groups)} "
                             f"batches an epoch")
        self.rng, self.order = MT19937(self.seed), list(range(len(self.groups)))
        for _ in range(epoch + 1):   # the orders of the epochs before, to this one's
            random_permutation(self.order, self.rng)
        self.epoch, self.index = epoch, index

    def state_dict(self):
        return {"epoch": self.epoch, "index": self.index}

    def __iter__(self):
        return self

    def __next__(self):
        group = self.groups[self.order[self.index]]
        self.index += 1
        if self.index == len(self.groups):   # the epoch is done: the next one's order
            random_permutation(self.order, self.rng)
            self.epoch, self.index = self.epoch + 1, 0
        return self.dataset.batch(group, self.batch_size)
