"""
Hugging Face tokenizers: a model folder's tokenizer.json, through the `tokenizers` package, with
the special tokens its tokenizer_config.json names and its chat template rendered as
transformers' apply_chat_template renders it (jinja2, sandboxed, with its settings and helpers).

    read_hf_tokenizer(path)   an HFTokenizer of a folder holding tokenizer.json (or of that
                              file), what llmc.tokenizer.Tokenizer.from_hf is made of: encodes as
                              transformers' AutoTokenizer does (special tokens in the text are
                              special; BOS where the tokenizer adds it)
    ChatTemplate(source, special_tokens)
                              .render(messages, add_generation_prompt=False): the template's text
    hf_gguf_vocab(path, vocab_size)
                              a tokenizer.json as GGUF's vocabulary, for dev/export.py --format
                              gguf: a byte-level BPE one as llama.cpp's "gpt2" model (GPT-2's,
                              SmolLM2's, Llama 3's or Qwen's pre-tokenizer), a SentencePiece-
                              style one (Llama 2's, TinyLlama's, Mistral's) as its "llama" model

A token's bytes are read off the vocabulary: byte-level BPE (GPT-2's, Llama 3's, Qwen's,
SmolLM2's) spells each byte as one printable character; SentencePiece-style vocabularies
(Llama 2's, TinyLlama's) write a space as U+2581 and an unknown byte as <0xXX>.  Special tokens
decode to nothing, as transformers' decode(skip_special_tokens=True).

The start token (the Tokenizer's eot_token: what a sample starts with and documents are cut
by) is the BOS the tokenizer puts before a text, and where it puts none (Qwen's, SmolLM2's)
its EOS, which then ends each document; generation stops at any of the EOS ids its
generation_config.json (or tokenizer_config.json) gives.
"""
import json
import os
from dataclasses import dataclass
from datetime import datetime

from llmc.formats.common import FormatError
from llmc.formats.gguf import GGUFVocab, gpt2_byte_text

__all__ = ["ChatTemplate", "HFTokenizer", "HF_TOKENIZER_FILES", "hf_gguf_vocab",
           "is_hf_tokenizer", "read_hf_tokenizer"]

SPACE = "\u2581"   # SentencePiece's visible space
# a tokenizer's files in a model folder, as read here (generation_config.json: its EOS ids)
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                      "generation_config.json")


def is_hf_tokenizer(path):
    """Whether path is a tokenizer.json or a folder holding one."""
    return os.path.isfile(os.path.join(path, "tokenizer.json")) if os.path.isdir(path) \
        else os.path.basename(path) == "tokenizer.json"


def decoder_kinds(decoder):
    """The kinds of a tokenizer.json decoder (a Sequence's parts)."""
    if decoder is None:
        return set()
    if decoder.get("type") == "Sequence":
        return set().union(*(decoder_kinds(d) for d in decoder["decoders"]))
    return {decoder.get("type")}


def token_bytes_of(vocabulary, decoder, added, special_ids):
    """Each token's bytes (a list by id): see the module docstring; added: the ids of the
    tokens added to the vocabulary, special_ids those of them that are special."""
    kinds = decoder_kinds(decoder)
    by_char = {c: b for b, c in gpt2_byte_text().items()}
    token_bytes = [b""] * (max(vocabulary.values()) + 1)
    for text, i in vocabulary.items():
        if i in special_ids:
            continue
        if i in added:   # its text as written, in no alphabet of the vocabulary's
            token_bytes[i] = text.encode("utf-8")
        elif "ByteLevel" in kinds:
            token_bytes[i] = bytes(by_char[c] for c in text) if all(c in by_char for c in text) \
                else text.encode("utf-8")
        elif "ByteFallback" in kinds and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            token_bytes[i] = bytes([int(text[3:5], 16)])
        else:
            token_bytes[i] = text.replace(SPACE, " ").encode("utf-8")
    return token_bytes


def special_token_text(value):
    """A tokenizer_config.json special token: a string, or an AddedToken's dict."""
    return value.get("content") if isinstance(value, dict) else value


def read_json_if_there(path):
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(path, f"not JSON ({e})") from None


def chat_template_source(folder, tokenizer_config):
    """The folder's chat template: chat_template.jinja, else tokenizer_config.json's (the
    "default" one of a list of named templates); None without one."""
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    source = tokenizer_config.get("chat_template")
    if isinstance(source, list):
        source = {t["name"]: t["template"] for t in source}.get("default")
    return source


@dataclass
class HFTokenizer:
    """What a Hugging Face tokenizer is, as llmc.tokenizer.Tokenizer takes it."""
    token_bytes: list        # each token's bytes, by id
    start_token: int         # BOS where the tokenizer puts one before a text, else its EOS
    bos_token: object        # the BOS id tokenizer_config.json names, or None
    adds_bos: bool           # whether it puts BOS before a text
    adds_eos: bool           # whether it puts EOS after a text
    stop_tokens: tuple       # the EOS ids generation stops at
    strip_text_start: bool   # the decoder strips the space a text starts with (Strip)
    encode: object           # text -> ids, as AutoTokenizer's (BOS included where it adds one)
    encode_text: object      # text -> ids, no special tokens added (a rendered chat's)
    chat_template: object    # a ChatTemplate, or None


def read_hf_tokenizer(path):
    """The HFTokenizer of a folder holding tokenizer.json, or of that file (see the module
    docstring); FormatError in one line for what is not one."""
    try:
        import tokenizers
    except ImportError:
        raise FormatError(path, "a Hugging Face tokenizer needs the tokenizers package: "
                                "pip install tokenizers") from None
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    file = os.path.join(folder, "tokenizer.json")
    try:
        backend = tokenizers.Tokenizer.from_file(file)
    except Exception as e:   # the Rust library's own error: one line of it
        raise FormatError(file, f"not a tokenizers file ({str(e).splitlines()[0]})") from None
    config = read_json_if_there(os.path.join(folder, "tokenizer_config.json"))
    generation = read_json_if_there(os.path.join(folder, "generation_config.json"))
    specials = {key: special_token_text(config.get(key))
                for key in ("bos_token", "eos_token", "unk_token", "pad_token")
                if special_token_text(config.get(key)) is not None}
    ids = {key: backend.token_to_id(text) for key, text in specials.items()}
    added = backend.get_added_tokens_decoder()
    special_ids = {i for i, token in added.items() if token.special}
    decoder = json.loads(backend.to_str()).get("decoder")
    # transformers adds BOS/EOS as tokenizer_config.json says where it says so, over the file's
    # post-processor; without the keys, the post-processor's own tokens stand
    add_bos, add_eos = config.get("add_bos_token"), config.get("add_eos_token")
    own = backend.encode("").ids
    adds_bos = add_bos if add_bos is not None else (bool(own) and own[0] == ids.get("bos_token"))
    adds_eos = add_eos if add_eos is not None else (bool(own) and own[-1] == ids.get("eos_token")
                                                    and ids.get("eos_token") != ids.get("bos_token"))

    def encode(text):
        tokens = backend.encode(text, add_special_tokens=add_bos is None and add_eos is None).ids
        if add_bos is not None or add_eos is not None:
            tokens = [ids["bos_token"]] * bool(adds_bos) + tokens + [ids["eos_token"]] * bool(adds_eos)
        return tokens
    eos = generation.get("eos_token_id", ids.get("eos_token"))
    stop_tokens = tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    start = ids.get("bos_token") if adds_bos else (stop_tokens or (None,))[0]
    if start is None:
        raise FormatError(folder, "the tokenizer names no BOS nor EOS token")
    token_bytes = token_bytes_of(backend.get_vocab(with_added_tokens=True), decoder, set(added),
                                 special_ids)
    source = chat_template_source(folder, config)
    return HFTokenizer(token_bytes, start, ids.get("bos_token"), bool(adds_bos), bool(adds_eos),
                       stop_tokens or (start,), "Strip" in decoder_kinds(decoder), encode,
                       lambda text: backend.encode(text, add_special_tokens=False).ids,
                       None if source is None else ChatTemplate(source, specials, folder))


# the byte-level pre-tokenizers of tokenizer.json that llama.cpp implements, by the name GGUF's
# tokenizer.ggml.pre gives them (llama.cpp's llama-vocab.cpp: each one's regular expressions),
# with the BPE's ignore_merges that name implies; each said as pre_tokenizer_shape says it
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| "
                r"?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| "
               r"?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")   # digits one by one
GGUF_PRE_TOKENIZERS = {
    "gpt-2": ((("ByteLevel", False, True),), False),    # GPT-2's regex in ByteLevel
    "smollm": ((("Digits", True), ("ByteLevel", False, True)), False),   # digits one by one
    "llama-bpe": ((("Split", LLAMA3_SPLIT, "Isolated", False), ("ByteLevel", False, False)),
                  True),   # Llama 3's
    "qwen2": ((("Split", QWEN2_SPLIT, "Isolated", False), ("ByteLevel", False, False)),
              False),   # Qwen2's, Qwen2.5's and Qwen3's
}
# the normalizers GGUF export takes: none, or Qwen's NFC, which llama.cpp does not apply (to
# its own converter's files neither): a text not in NFC (e + U+0301) splits otherwise there
GGUF_NORMALIZERS = (None, {"type": "NFC"})


def pre_tokenizer_shape(pre_tokenizer):
    """A tokenizer.json pre_tokenizer as a tuple of its steps, each what decides its split
    (ByteLevel: add_prefix_space, use_regex; Digits: individual_digits; Split: the regular
    expression, behavior, invert; another: all of its keys)."""
    if pre_tokenizer is None:
        return ()
    if pre_tokenizer.get("type") == "Sequence":
        return sum((pre_tokenizer_shape(p) for p in pre_tokenizer["pretokenizers"]), ())
    kind = pre_tokenizer.get("type")
    keys = {"ByteLevel": ("add_prefix_space", "use_regex"), "Digits": ("individual_digits",),
            "Split": ("pattern", "behavior", "invert")}.get(kind)
    if keys is None:
        return ((kind, json.dumps(pre_tokenizer, sort_keys=True)),)
    values = [pre_tokenizer.get(key) for key in keys]
    if kind == "Split":   # {"Regex": ...} or {"String": ...}: the regular expression's text
        values[0] = values[0].get("Regex", values[0])
    return ((kind, *values),)


# how a SentencePiece-style tokenizer.json marks a text's first word with U+2581, as llama.cpp's
# "llama" tokenizer does with its add_space_prefix: Llama 2's, TinyLlama's and Mistral v0.1's
# normalizer, or the Metaspace pre-tokenizer of newer conversions (each space a U+2581 too)
SENTENCEPIECE_PREFIX_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": SPACE}, {"type": "Replace", "pattern": {"String": " "},
                                            "content": SPACE}]}
SENTENCEPIECE_METASPACE = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first",
                           "split": False}


def hf_gguf_vocab(path, vocab_size):
    """The GGUF vocabulary (llmc.formats.gguf.GGUFVocab) of a tokenizer.json (a folder holding
    it, or the file), padded to the model's vocab_size with UNUSED tokens; BOS (else EOS) and
    EOS, and whether a text gets them, as transformers encodes:
      byte-level BPE (GPT-2's, Llama 3's, SmolLM2's, Qwen's): llama.cpp's "gpt2" model, its
        pre-tokenizer by the name llama.cpp gives it (GGUF_PRE_TOKENIZERS), each token's text
        as the file spells it, the merges, the added tokens CONTROL where special and
        USER_DEFINED where not;
      SentencePiece-style BPE (Llama 2's, TinyLlama's, Mistral's: U+2581 for a space, byte
        fallback): llama.cpp's "llama" model, which merges the pair whose token scores highest,
        so each token scores minus the rank of the first merge that makes it (BPE's order); the
        <0xXX> tokens BYTE, the unknown token UNKNOWN.
    FormatError in one line for another kind of tokenizer."""
    hf = read_hf_tokenizer(path)   # the file read and checked, the special tokens found
    import gguf
    import tokenizers
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    file = os.path.join(folder, "tokenizer.json")
    backend = tokenizers.Tokenizer.from_file(file)
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    sentencepiece = model.get("byte_fallback") and "ByteFallback" in decoder_kinds(spec.get("decoder"))
    byte_level = not model.get("byte_fallback") and "ByteLevel" in decoder_kinds(spec.get("decoder")) \
        and spec.get("normalizer") in GGUF_NORMALIZERS
    if model.get("type") != "BPE" or not (sentencepiece or byte_level):
        raise FormatError(file, "GGUF export takes a byte-level BPE tokenizer.json (GPT-2's, "
                                "Llama 3's, SmolLM2's, Qwen's kind) or a SentencePiece-style BPE "
                                "one (Llama 2's, TinyLlama's, Mistral's), and this one is neither")
    vocabulary = backend.get_vocab(with_added_tokens=True)
    if max(vocabulary.values()) >= vocab_size:
        raise FormatError(file, f"the tokenizer has ids up to {max(vocabulary.values())}, more "
                                f"than the model's vocabulary {vocab_size}")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, i in vocabulary.items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for i, added in backend.get_added_tokens_decoder().items():
        types[i] = gguf.TokenType.CONTROL if added.special else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    specials = dict(bos=hf.start_token if hf.bos_token is None else hf.bos_token,
                    eos=hf.stop_tokens[0], add_bos=hf.adds_bos, add_eos=hf.adds_eos)
    if sentencepiece:
        return sentencepiece_style_gguf_vocab(file, spec, tokens, types, merges, vocabulary,
                                              specials)
    shape = (pre_tokenizer_shape(spec.get("pre_tokenizer")), bool(model.get("ignore_merges")))
    pre = next((name for name, known in GGUF_PRE_TOKENIZERS.items() if known == shape), None)
    if pre is None:
        raise FormatError(file, f"its pre-tokenizer {shape[0]} (ignore_merges {shape[1]}) is "
                                f"none of those GGUF export names for llama.cpp: "
                                f"{', '.join(GGUF_PRE_TOKENIZERS)}")
    return GGUFVocab("gpt2", tokens, types, merges=merges, pre=pre, **specials)


def sentencepiece_style_gguf_vocab(file, spec, tokens, types, merges, vocabulary, specials):
    """hf_gguf_vocab's SentencePiece-style case: tokens and types as the tokenizer.json has
    them, made "llama"'s (scores from the merges' ranks, BYTE and UNKNOWN tokens)."""
    import gguf
    normalizer, pre_tokenizer = spec.get("normalizer"), spec.get("pre_tokenizer")
    metaspace = pre_tokenizer and {key: pre_tokenizer.get(key) for key in SENTENCEPIECE_METASPACE}
    if not ((normalizer == SENTENCEPIECE_PREFIX_NORMALIZER and pre_tokenizer is None) or
            (normalizer is None and metaspace == SENTENCEPIECE_METASPACE)):
        raise FormatError(file, "a SentencePiece-style tokenizer.json goes to GGUF with U+2581 "
                                "before the text and for each space (Llama 2's normalizer, or "
                                "Metaspace with prepend_scheme first), and this one splits "
                                f"otherwise: normalizer {json.dumps(normalizer)}, "
                                f"pre-tokenizer {json.dumps(pre_tokenizer)}")
    # a token no merge makes (a character, a byte, a special token) is never a pair's result
    # in llama.cpp either: it scores below every merge
    scores = [-float(len(merges) + 1)] * len(tokens)
    for rank in reversed(range(len(merges))):
        made = vocabulary.get(merges[rank].replace(" ", ""))
        if made is not None:
            scores[made] = -float(rank)
    for i, text in enumerate(tokens):
        if types[i] == gguf.TokenType.NORMAL and len(text) == 6 and text.startswith("<0x") \
                and text.endswith(">"):
            types[i] = gguf.TokenType.BYTE
    unk = vocabulary.get(spec["model"].get("unk_token"))
    if unk is not None:
        types[unk] = gguf.TokenType.UNKNOWN
    return GGUFVocab("llama", tokens, types, scores=scores, unk=unk, **specials)


class ChatTemplate:
    """A chat template, rendered as transformers renders it: jinja2's sandbox with
    trim_blocks, lstrip_blocks and loop controls; tojson without HTML escaping;
    raise_exception, strftime_now; {% generation %} blocks rendered as their body; the
    tokenizer's special tokens (bos_token, ...) as variables."""

    def __init__(self, source, special_tokens, where="the chat template"):
        try:
            import jinja2
            import jinja2.ext
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise FormatError(where, "a chat template needs the jinja2 package: pip install jinja2") from None
        self.where = where

        class Generation(jinja2.ext.Extension):   # transformers marks the assistant's turns so
            tags = {"generation"}                 # (for its masks); the text is the body's

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

            def _body(self, caller):
                return caller()

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
        environment.filters["tojson"] = tojson
        environment.globals["raise_exception"] = raise_exception
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.template = environment.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise FormatError(where, f"the chat template does not parse: {e.message} (line {e.lineno})") from None
        self.special_tokens = dict(special_tokens)
        self.errors = jinja2.exceptions.TemplateError

    def render(self, messages, add_generation_prompt=False, **variables):
        """The conversation (a list of {"role", "content"}) as the model reads it."""
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        **self.special_tokens, **variables)
        except self.errors as e:
            raise FormatError(self.where, f"the chat template refused the conversation: {e}") from None
