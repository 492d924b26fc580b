"""
Hugging Face tokenizers made offline with the `tokenizers` package's trainers, for the tests:
the two kinds today's small models use, each saved as a model folder holds it
(tokenizer.json, tokenizer_config.json with the special tokens and a chat template).

    make_byte_level(folder, vocab_size)       byte-level BPE, no BOS, EOS <|endoftext|>, ChatML
                                              turns (<|im_start|>, <|im_end|>): Qwen's and
                                              SmolLM2's kind
    make_sentencepiece_style(folder, vocab_size)
                                              BPE over U+2581-spaced text with byte fallback
                                              (<0x00> to <0xFF>), BOS <s> before every text,
                                              EOS </s>, [INST] turns: Llama 2's and TinyLlama's

The chat templates are written here for the tests (the same constructs real ones use: set,
loops, slicing, filters, raise_exception, the special tokens as variables).
"""
import json
import random

CHATML = (   # indented blocks: lstrip_blocks and trim_blocks shape its text
    "{% for message in messages %}\n"
    "  {% if loop.first and message['role'] != 'system' %}\n"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "  {% endif %}\n"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "<|im_start|>assistant\n"
    "{% endif %}\n")

INST = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set system = none %}{%- set turns = messages %}{%- endif %}\n"
    "{%- for message in turns %}\n"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user, assistant, user, ...') }}{%- endif %}\n"
    "{%- if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + (('<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n') if loop.first and system else '')"
    " + message['content'] | trim + ' [/INST]' }}\n"
    "{%- else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{%- endif %}\n"
    "{%- endfor %}\n")

CORPUS_WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
                "jovial boxers; naïve café owners déjà vu — 東京 北京 こんにちは 안녕하세요 "
                "Привет мир 🙂 🚀 1234 56.78 ( ) [ ] { } <tag> don't we'll I'm").split()


def corpus(lines=400, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(CORPUS_WORDS) for _ in range(rng.randint(3, 16)))
            for _ in range(lines)]


def save(folder, backend, config):
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def make_byte_level(folder, vocab_size=400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    save(folder, backend, dict(tokenizer_class="PreTrainedTokenizerFast", bos_token=None,
                               eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                               chat_template=CHATML))
    return backend


def make_sentencepiece_style(folder, vocab_size=400):
    from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, processors,
                            trainers)
    # the merges are learnt on U+2581-spaced words; the vocabulary then starts as Llama 2's:
    # <unk>, <s>, </s>, the 256 byte tokens, then the learnt pieces
    learner = Tokenizer(models.BPE())
    learner.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                               normalizers.Replace(" ", "\u2581")])
    learner.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=vocab_size - 259))
    learnt = json.loads(learner.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in sorted(learnt["vocab"], key=learnt["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learnt["merges"]]
    backend = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True,
                                   fuse_unk=True))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<unk>", "<s>", "</s>")])
    backend.normalizer = learner.normalizer
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    save(folder, backend, dict(tokenizer_class="PreTrainedTokenizerFast", bos_token="<s>",
                               eos_token="</s>", unk_token="<unk>", chat_template=INST))
    return backend


def random_strings(count, specials, seed=0):
    """Strings of words, unicode from several scripts, runs of spaces, tabs and newlines, and
    the special tokens' text."""
    rng = random.Random(seed)
    pieces = CORPUS_WORDS + ["  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "\u00a0", "😀😀",
                             "ﬁ", "é", "e\u0301", "\u200b", "x" * 12] + list(specials)
    return [rng.choice(["", " "]) + "".join(rng.choice(pieces) + rng.choice(["", " ", "  "])
                                            for _ in range(rng.randint(0, 12)))
            for _ in range(count)]
