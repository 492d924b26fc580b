"""
Hugging Face tokenizers (llmc/formats/hf_tokenizer.py, Tokenizer.from_hf): on 1,000 random
strings (unicode, whitespace runs, the special tokens' text) the ids equal transformers'
AutoTokenizer's and the text decodes as its decode(skip_special_tokens=True), printed piece by
piece too; the chat template renders as apply_chat_template, for a byte-level BPE (ChatML) and
a SentencePiece-style vocabulary (BOS, byte fallback, [INST] turns), both made offline.
"""
import json

import pytest

from llmc.formats import FormatError
from llmc.tokenizer import Tokenizer, load_tokenizer
from tests import needs
from tests.hf_tokenizers import make_byte_level, make_sentencepiece_style, random_strings

needs.package("tokenizers")
transformers = needs.package("transformers")

KINDS = {"byte-level": (make_byte_level, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
         "sentencepiece-style": (make_sentencepiece_style, ["<s>", "</s>", "<unk>"])}
CONVERSATIONS = {
    "system and user": ([{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hi there, what is 2+2?"}], False),
    "multi-turn": ([{"role": "user", "content": "a question"},
                    {"role": "assistant", "content": " an answer "},
                    {"role": "user", "content": "another, naïve 東京"}], False),
    "generation prompt": ([{"role": "user", "content": "Hi"}], True),
}


@pytest.fixture(scope="module", params=KINDS)
def pair(request, tmp_path_factory):
    """(ours, transformers', the special tokens) of one kind of tokenizer."""
    make, specials = KINDS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    make(folder)
    return Tokenizer.from_hf(folder), transformers.AutoTokenizer.from_pretrained(folder), specials


def test_ids_and_text_equal_transformers_on_random_strings(pair):
    ours, theirs, specials = pair
    for text in random_strings(1000, specials):
        ids = ours.encode_prompt(text)
        assert ids == theirs(text).input_ids, text
        decoded = theirs.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids) == decoded, text
        start = ids[:1] if ids[:1] == [ours.eot_token] else []
        piece = ours.stream_decoder(after=start[0] if start else None)
        assert "".join(piece(t) for t in ids[len(start):]) == \
            "".join(c for c in decoded if c.isprintable() or c in "\n\t"), text


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_the_chat_template_renders_as_apply_chat_template(pair, conversation):
    ours, theirs, _ = pair
    messages, add_generation_prompt = CONVERSATIONS[conversation]
    text = ours.chat_template.render(messages, add_generation_prompt=add_generation_prompt)
    assert text == theirs.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=add_generation_prompt)
    ids = theirs.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert ours.text_encoder(text) == list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_start_and_stop_tokens(pair):
    """BOS starts a sample where the tokenizer puts one; else its EOS, which ends documents."""
    ours, theirs, _ = pair
    if theirs.bos_token is None:
        assert ours.eot_token == theirs.eos_token_id and ours.encode_prompt("") == []
    else:
        assert ours.eot_token == theirs.bos_token_id == ours.encode_prompt("")[0]
    assert ours.stop_tokens == (theirs.eos_token_id,)


def test_found_by_path_and_refused_in_one_line(tmp_path):
    make_byte_level(tmp_path / "t")
    assert load_tokenizer(str(tmp_path / "t")).source == str(tmp_path / "t")
    assert load_tokenizer(str(tmp_path / "t" / "tokenizer.json")).vocab_size == 400
    (tmp_path / "t" / "tokenizer.json").write_text("{}")
    with pytest.raises(FormatError, match="tokenizer.json: not a tokenizers file"):
        Tokenizer.from_hf(tmp_path / "t")
    make_byte_level(tmp_path / "u")
    config = json.loads((tmp_path / "u" / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }"
    (tmp_path / "u" / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError, match="the chat template does not parse"):
        Tokenizer.from_hf(tmp_path / "u")


def test_a_template_that_refuses_says_so(tmp_path):
    make_sentencepiece_style(tmp_path)
    ours = Tokenizer.from_hf(tmp_path)
    with pytest.raises(FormatError, match="refused the conversation: roles must alternate"):
        ours.chat_template.render([{"role": "assistant", "content": "first"}])
