"""
The data of supervised fine-tuning (llmc/sft_data.py), on tokenizers made offline: the ids of
chat, tools and completions examples equal transformers' apply_chat_template's, and under
mask_prompt the scored targets are its assistant_masks (a template with {% generation %}
markers) or its prefix renderings (one without); the text form; truncation counted; the
masked share; malformed lines refused as FILE:LINE; the batches, their order over epochs, a
bit-identical resume, and validation's one pass in order.
"""
import json

import numpy as np
import pytest

import needs
from llmc.sft_data import SFTDataError, SFTDataset
from llmc.tokenizer import Tokenizer
from tests.hf_tokenizers import make_byte_level, make_sentencepiece_style

needs.package("tokenizers")
needs.package("jinja2")

# ChatML with tools (Qwen2.5's way: JSON schemas in the system turn, calls in <tool_call>) and
# transformers' {% generation %} markers around what the assistant writes
CHATML_TOOLS = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' + (messages[0]['content'] if messages[0]['role'] == 'system'"
    " else 'You are a helpful assistant.') + '\\n\\n# Tools\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson + '\\n' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages if message['role'] != 'system' %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}"
    "{{- message['content'] or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    "{{- '<tool_call>' + call.function | tojson + '</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

CHATS = [
    [{"role": "user", "content": "Hi there, what is 2+2?"},
     {"role": "assistant", "content": "It is 4."}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "a question"},
     {"role": "assistant", "content": " an answer "},
     {"role": "user", "content": "another, naïve 東京"},
     {"role": "assistant", "content": "déjà vu 🙂"}],
    # a reply that starts with a newline: BPE merges it with the one ending the prompt
    [{"role": "user", "content": "list two"},
     {"role": "assistant", "content": "\n\n- one\n- two"},
     {"role": "user", "content": "thanks"}],
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
TOOL_CHATS = [
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "tool_calls": [{"type": "function", "function": {
         "name": "get_weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "content": "{\"sky\": \"clear\"}"},
     {"role": "assistant", "content": "Clear skies in Paris."}],
    [{"role": "system", "content": "Use the tools."},
     {"role": "user", "content": "and Tokyo?"},
     {"role": "assistant", "content": "Let me look.", "tool_calls": [{"type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "東京"}}}]}],
]
COMPLETIONS = [{"prompt": "Q: what is the capital of France?\nA:", "completion": " Paris."},
               {"prompt": "Translate: the quick brown fox", "completion": " le renard"}]


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    """A byte-level BPE folder with CHATML_TOOLS; generation stops at <|im_end|> or EOS."""
    folder = tmp_path_factory.mktemp("chatml")
    make_byte_level(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config,
                                                              "chat_template": CHATML_TOOLS}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    ours = Tokenizer.from_hf(folder)
    assert ours.stop_tokens == (2, 0) and ours.decode([ours.eot_token]) == ""
    return folder, ours


@pytest.fixture(scope="module")
def inst(tmp_path_factory):
    """A SentencePiece-style folder: BOS before a text, [INST] turns, no generation markers."""
    folder = tmp_path_factory.mktemp("inst")
    make_sentencepiece_style(folder)
    return folder, Tokenizer.from_hf(folder)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A byte-level BPE folder without a chat template."""
    folder = tmp_path_factory.mktemp("plain")
    make_byte_level(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder, Tokenizer.from_hf(folder)


def transformers_of(folder):
    return needs.package("transformers").AutoTokenizer.from_pretrained(folder)


def write(path, lines):
    """A JSONL file of the lines: dicts as JSON, strings as they are."""
    path.write_text("".join((json.dumps(line) if isinstance(line, dict) else line) + "\n"
                            for line in lines), encoding="utf-8")
    return path


def expected(ids, scored):
    """llm.c's (inputs, targets) of a token list, the targets -1 where a token is not scored."""
    ids = np.asarray(ids)
    return ids[:-1], np.where(np.asarray(scored, dtype=bool)[1:], ids[1:], -1)


def assert_example(example, ids, scored):
    inputs, targets = expected(ids, scored)
    assert example[0].dtype == example[1].dtype == np.int32
    assert example[0].tolist() == inputs.tolist()
    assert example[1].tolist() == targets.tolist()


@pytest.mark.parametrize("form", ["chat", "tools"])
def test_chat_ids_and_assistant_masks_equal_transformers(chatml, tmp_path, form):
    folder, ours = chatml
    theirs = transformers_of(folder)
    tools = TOOLS if form == "tools" else None
    chats = TOOL_CHATS if form == "tools" else CHATS
    path = write(tmp_path / "d.jsonl", [{"messages": m, **({"tools": tools} if tools else {})}
                                        for m in chats])
    masked, whole = (SFTDataset(path, ours, 512, mask_prompt=m) for m in (True, False))
    assert masked.form == whole.form == form
    for messages, with_mask, without in zip(chats, masked.examples, whole.examples):
        out = theirs.apply_chat_template(messages, tools=tools, return_dict=True,
                                         return_assistant_tokens_mask=True)
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        assert 0 < sum(mask) < len(ids)
        assert_example(without, ids, [True] * len(ids))
        assert_example(with_mask, ids, mask)


def test_completions_through_the_template_and_without_one(chatml, plain, tmp_path):
    path = write(tmp_path / "c.jsonl", COMPLETIONS)
    folder, ours = chatml
    theirs = transformers_of(folder)
    data = SFTDataset(path, ours, 512, mask_prompt=True)
    assert data.form == "completions"
    for record, example in zip(COMPLETIONS, data.examples):
        messages = [{"role": "user", "content": record["prompt"]},
                    {"role": "assistant", "content": record["completion"]}]
        out = theirs.apply_chat_template(messages, return_dict=True,
                                         return_assistant_tokens_mask=True)
        assert_example(example, list(out["input_ids"]), list(out["assistant_masks"]))
    # no template: the text prompt + completion, then EOS; the completion's tokens scored
    folder, ours = plain
    theirs = transformers_of(folder)
    data = SFTDataset(path, ours, 512, mask_prompt=True)
    for record, example in zip(COMPLETIONS, data.examples):
        ids = theirs(record["prompt"] + record["completion"]).input_ids + [theirs.eos_token_id]
        prompt = theirs(record["prompt"]).input_ids
        assert ids[:len(prompt)] == prompt   # the strings are chosen so: no merge across
        assert_example(example, ids, [i >= len(prompt) for i in range(len(ids))])


def test_a_token_merged_across_the_prompts_end_is_the_assistants(inst, tmp_path):
    """A generation prompt that ends in a space ("Assistant: "), a vocabulary without a
    pre-tokenizer: BPE merges that space with the reply's first letters ("\u2581j"), and that
    token is scored, as transformers' assistant_masks has it (MLX-LM's offset, the prompt's
    token count, would mask it)."""
    folder = tmp_path / "merging"
    make_sentencepiece_style(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}{% if m.role == 'user' %}User: {{ m.content }}\n"
        "{% else %}Assistant: {% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}"
        "\n{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant: {% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    theirs = transformers_of(folder)
    chats = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "jumps high"}],
             [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the fox"},
              {"role": "user", "content": "and?"}, {"role": "assistant", "content": "jumps"}]]
    data = SFTDataset(write(tmp_path / "m.jsonl", [{"messages": m} for m in chats]),
                      Tokenizer.from_hf(folder), 512, mask_prompt=True)
    for messages, example in zip(chats, data.examples):
        out = theirs.apply_chat_template(messages, return_dict=True,
                                         return_assistant_tokens_mask=True)
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        prompt = theirs.apply_chat_template(messages[:-1], add_generation_prompt=True,
                                            return_dict=True)["input_ids"]
        assert ids[:len(prompt)] != prompt and mask[len(prompt) - 1]   # the merge is there
        assert_example(example, ids, mask)


def test_a_template_without_generation_markers(inst, tmp_path):
    """[INST] turns: each assistant turn scored from the end of the prompt before it (rendered
    with the generation prompt, as MLX-LM's offset) to its </s>."""
    folder, ours = inst
    theirs = transformers_of(folder)
    chats = [[{"role": "user", "content": "a question"},
              {"role": "assistant", "content": "an answer"}],
             [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": "first"}, {"role": "assistant", "content": "one"},
              {"role": "user", "content": "second"}, {"role": "assistant", "content": "two"}]]
    data = SFTDataset(write(tmp_path / "i.jsonl", [{"messages": m} for m in chats]), ours, 512,
                      mask_prompt=True)

    def length(turns, add_generation_prompt=False):
        return len(theirs.apply_chat_template(turns, tokenize=True, return_dict=True,
                                              add_generation_prompt=add_generation_prompt)
                   ["input_ids"])
    for messages, example in zip(chats, data.examples):
        ids = list(theirs.apply_chat_template(messages, return_dict=True)["input_ids"])
        scored = np.zeros(len(ids), dtype=bool)
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                scored[length(messages[:i], True):length(messages[:i + 1])] = True
        assert ids[-1] == theirs.eos_token_id and scored[-1]
        assert_example(example, ids, scored)


def test_the_text_form(inst, tmp_path):
    folder, ours = inst
    theirs = transformers_of(folder)
    texts = ["the quick brown fox", "naïve café 🙂 </s>", "jumps over a lazy dog"]
    path = write(tmp_path / "t.jsonl", [{"text": t} for t in texts])
    data = SFTDataset(path, ours, 512)
    assert data.form == "text" and data.summary()["masked"] == 0
    for text, example in zip(texts, data.examples):
        ids = theirs(text).input_ids   # BOS first; EOS after, unless it ends the text already
        ids = ids if ids[-1] == theirs.eos_token_id else ids + [theirs.eos_token_id]
        assert ids[0] == theirs.bos_token_id
        assert_example(example, ids, [True] * len(ids))
    with pytest.raises(SFTDataError, match=r"t\.jsonl: mask_prompt: the text form .* no prompt"):
        SFTDataset(path, ours, 512, mask_prompt=True)


def test_truncation_is_counted_and_the_masked_share_is_right(chatml, tmp_path):
    folder, ours = chatml
    theirs = transformers_of(folder)
    T = 40   # cuts two examples inside an assistant turn, one before any
    path = write(tmp_path / "d.jsonl", [{"messages": m} for m in CHATS])
    data = SFTDataset(path, ours, T, mask_prompt=True)
    full = [theirs.apply_chat_template(m, return_dict=True, return_assistant_tokens_mask=True)
            for m in CHATS]
    ids = [list(out["input_ids"])[:T + 1] for out in full]
    masks = [list(out["assistant_masks"])[:T + 1] for out in full]
    for example, i, mask in zip(data.examples, ids, masks):
        assert_example(example, i, mask)
    lengths = [len(out["input_ids"]) for out in full]
    masked = sum(len(m) - 1 - sum(m[1:]) for m in masks)
    targets = sum(len(i) - 1 for i in ids)
    assert all(n > T + 1 for n in lengths[1:]), "the test wants examples longer than T + 1"
    assert data.summary() == dict(
        examples=3, tokens=sum(map(len, ids)), truncated=sum(n > T + 1 for n in lengths),
        cut_tokens=sum(max(0, n - T - 1) for n in lengths), targets=targets, masked=masked,
        masked_share=masked / targets, unscored=sum(not any(m[1:]) for m in masks))
    assert data.summary()["unscored"] >= 1   # a prompt longer than T: counted, not dropped
    assert f"{data.summary()['truncated']} cut to {T + 1} tokens" in data.describe()
    assert "\n" not in data.describe()
    whole = SFTDataset(path, ours, 1024)
    assert whole.summary()["truncated"] == 0 and whole.summary()["masked_share"] == 0
    assert whole.summary()["tokens"] == sum(lengths)
    # at the edge: T + 1 tokens fit, T + 2 are cut by one
    edge = SFTDataset(path, ours, lengths[0] - 1)
    assert [len(x) for x, _ in edge.examples][0] == lengths[0] - 1
    assert edge.summary()["truncated"] == 2 and edge.summary()["cut_tokens"] == \
        sum(n - lengths[0] for n in lengths[1:])
    edge = SFTDataset(path, ours, lengths[0] - 2)
    assert edge.summary()["truncated"] == 3 and edge.summary()["cut_tokens"] == \
        sum(n - lengths[0] + 1 for n in lengths)


GOOD_CHAT = json.dumps({"messages": CHATS[0]})
# (the lines of a file, the error of its line 3, or of the line named first)
MALFORMED = {
    "not JSON": ([GOOD_CHAT, "", "{'messages': []}"], r"3: not JSON \(Expecting property"),
    "not an object": ([GOOD_CHAT, "", "[1, 2]"], "3: a list, not a JSON object"),
    "messages not a list": ([GOOD_CHAT, "", '{"messages": "hi"}'],
                            '3: "messages" is not a non-empty list'),
    "no messages": ([GOOD_CHAT, "", '{"messages": []}'], '3: "messages" is not a non-empty'),
    "a message not an object": ([GOOD_CHAT, "", '{"messages": ["hi"]}'],
                                "3: message 0 is a string, not an object"),
    "unknown role": ([GOOD_CHAT, "", '{"messages": [{"role": "bot", "content": "x"}]}'],
                     "3: message 0: role 'bot' is not one of system, user, assistant, tool"),
    "content a number": ([GOOD_CHAT, "", '{"messages": [{"role": "user", "content": 3}]}'],
                         '3: message 0 \\(user\\): "content" is a number, not a string'),
    "content missing": ([GOOD_CHAT, "", '{"messages": [{"role": "user"}]}'],
                        '3: message 0 \\(user\\): "content" is missing'),
    "another form": ([GOOD_CHAT, "", '{"prompt": "a", "completion": "b"}'],
                     "3: a completions line in a chat file \\(its line 1's form\\)"),
    "tools in a chat file": ([GOOD_CHAT, "", json.dumps({"messages": CHATS[0], "tools": []})],
                             "3: a tools line in a chat file"),
    "a key missing": ([json.dumps(COMPLETIONS[0]), "", '{"prompt": "a"}'],
                      '3: no "completion" in a completions file'),
    "prompt not a string": ([json.dumps(COMPLETIONS[0]), "", '{"prompt": 1, "completion": "b"}'],
                            '3: "prompt" is a number, not a string'),
    "tools not objects": ([json.dumps({"messages": CHATS[0], "tools": TOOLS}), "",
                           json.dumps({"messages": CHATS[0], "tools": ["f"]})],
                          '3: "tools" is not a list of objects'),
    "no form": (['{"input": "a", "output": "b"}'],
                "1: keys \\['input', 'output'\\] are none of the forms"),
    "not UTF-8": ([GOOD_CHAT, "", '{"text": "caf\udce9"}'], "3: not UTF-8"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_line_is_named_by_file_and_line(chatml, tmp_path, case):
    lines, message = MALFORMED[case]
    path = tmp_path / "bad.jsonl"
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape"))
    with pytest.raises(SFTDataError) as raised:
        SFTDataset(path, chatml[1], 64)
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith(f"{path}:"), str(raised.value)
    assert raised.match(f"^{path}:{message}")


def test_what_cannot_be_learnt_is_refused_in_one_line(chatml, inst, plain, tmp_path):
    user_only = write(tmp_path / "u.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    SFTDataset(user_only, chatml[1], 64)   # scored whole without mask_prompt
    with pytest.raises(SFTDataError, match=r"u\.jsonl:1: mask_prompt: no assistant turn"):
        SFTDataset(user_only, chatml[1], 64, mask_prompt=True)
    chat = write(tmp_path / "c.jsonl", [{"messages": CHATS[0]}])
    with pytest.raises(SFTDataError, match=f"c.jsonl: chat examples are rendered by the "
                       f"tokenizer's chat template, and the tokenizer \\({plain[0]}\\) has none"
                       f'.*write the examples as {{"text": ...}}'):
        SFTDataset(chat, plain[1], 64)
    refused = write(tmp_path / "r.jsonl", [{"messages": CHATS[0]},
                                           {"messages": [{"role": "assistant", "content": "a"}]}])
    with pytest.raises(SFTDataError, match=r"r\.jsonl:2: the chat template refused the "
                                           r"conversation: roles must alternate"):
        SFTDataset(refused, inst[1], 64)
    with pytest.raises(SFTDataError, match=r"e\.jsonl: no examples"):
        SFTDataset(write(tmp_path / "e.jsonl", ["", "  "]), chatml[1], 64)
    with pytest.raises(SFTDataError, match=r"s\.jsonl:1: 1 token\(s\), nothing to learn"):
        SFTDataset(write(tmp_path / "s.jsonl", [{"text": ""}]), plain[1], 64)
    with pytest.raises(SFTDataError, match=r"missing\.jsonl: No such file"):
        SFTDataset(tmp_path / "missing.jsonl", chatml[1], 64)


def test_a_template_that_renders_earlier_turns_otherwise_is_refused(chatml, tmp_path):
    """Qwen3's kind: the last assistant turn rendered with an empty reasoning block, earlier
    ones without, so messages[:i+1] is no prefix of the whole; mask_prompt cannot place it."""
    folder, _ = chatml
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{%- if m.role == 'assistant' and loop.last %}<think></think>{% endif %}"
        "{{ m.content }}<|im_end|>\n{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
    other = tmp_path / "qwen3-like"
    other.mkdir()
    for name in ("tokenizer.json", "generation_config.json"):
        (other / name).write_bytes((folder / name).read_bytes())
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    path = write(tmp_path / "q.jsonl", [{"messages": CHATS[0]}, {"messages": CHATS[1]}])
    with pytest.raises(SFTDataError, match=r"q\.jsonl:2: mask_prompt: the chat template renders "
                                           r"message 2 \(assistant\) otherwise"):
        SFTDataset(path, Tokenizer.from_hf(other), 256, mask_prompt=True)


@pytest.fixture
def dataset(chatml, tmp_path):
    """11 completions examples of different lengths, the prompts masked."""
    records = [{"prompt": f"{i}: " + "word " * (i % 5), "completion": " answer" * (1 + i)}
               for i in range(11)]
    return SFTDataset(write(tmp_path / "b.jsonl", records), chatml[1], 48, mask_prompt=True)


def rows_of(dataset, batch):
    """The example each row of a batch holds (None: a row of padding), checking the row."""
    inputs, targets = batch
    found = []
    for x, y in zip(inputs, targets):
        match = [i for i, (ex, ey) in enumerate(dataset.examples)
                 if np.array_equal(x[:len(ex)], ex) and np.array_equal(y[:len(ey)], ey)
                 and np.all(x[len(ex):] == dataset.pad) and np.all(y[len(ey):] == -1)]
        if not match:
            assert np.all(x == dataset.pad) and np.all(y == -1)
        found.append(match[0] if match else None)
    return found


def test_training_batches_over_epochs(dataset):
    B, T = 4, 48
    batches = dataset.batches(B, seed=7)
    lengths = [len(x) for x, _ in dataset.examples]
    epochs = []
    for epoch in range(3):
        seen = []
        for k in range(3):   # 11 examples, 4 a batch: 3 batches, the last with a padding row
            assert batches.state_dict() == {"epoch": epoch, "index": k}
            inputs, targets = batch = next(batches)
            assert inputs.shape == targets.shape == (B, T)
            assert inputs.dtype == targets.dtype == np.int32
            seen.append(rows_of(dataset, batch))
        examples = [i for rows in seen for i in rows if i is not None]
        assert sorted(examples) == list(range(11)) and sum(r.count(None) for r in seen) == 1
        # each batch holds examples neighbouring in length
        by_length = sorted(range(11), key=lambda i: (lengths[i], i))
        assert set(map(tuple, seen)) == {tuple(by_length[i:i + B]) + (None,) *
                                         (B - len(by_length[i:i + B])) for i in range(0, 11, B)}
        epochs.append(seen)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]   # the order moves each epoch
    again = dataset.batches(B, seed=7)
    assert [rows_of(dataset, next(again)) for _ in range(9)] == [r for e in epochs for r in e]
    other = dataset.batches(B, seed=8)
    assert [rows_of(dataset, next(other)) for _ in range(9)] != [r for e in epochs for r in e]


def test_a_resumed_iterator_continues_bit_for_bit(dataset):
    reference = dataset.batches(3, seed=1)
    stream = [next(reference) for _ in range(14)]   # 4 batches an epoch: past three epochs
    for k in (0, 3, 4, 5, 9, 12):
        run = dataset.batches(3, seed=1)
        for _ in range(k):
            next(run)
        state = json.loads(json.dumps(run.state_dict()))   # as a checkpoint keeps it
        resumed = dataset.batches(3, seed=1)
        resumed.load_state_dict(state)
        for want in stream[k:]:
            got = next(resumed)
            assert all(g.dtype == w.dtype and g.tobytes() == w.tobytes()
                       for g, w in zip(got, want))
    with pytest.raises(ValueError, match="batch position .* not one of these 4 batches"):
        dataset.batches(3).load_state_dict({"epoch": 0, "index": 4})


def test_validation_batches_go_over_every_example_once_in_order(dataset):
    batches = list(dataset.eval_batches(4))
    assert len(batches) == 3
    rows = [i for batch in batches for i in rows_of(dataset, batch)]
    assert rows == list(range(11)) + [None]
