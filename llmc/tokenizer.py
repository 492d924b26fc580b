"""
The tokenizers of llm.pyx, offline: GPT-2's byte-level BPE, and SentencePiece vocabularies
trained here for the Llama family (llama2.c's way).

gpt2_encoding() returns tiktoken's Encoding for GPT-2 (byte-level BPE, 50257 tokens, EOT 50256).
tiktoken downloads the BPE ranks on first use; where that cannot happen, the very same ranks
are taken from elsewhere, each fallback announced in one line on stderr:
  1. our cache of the ranks, $LLMPYX_CACHE_DIR or ~/.cache/llm.pyx/gpt2.tiktoken (silent)
  2. tiktoken's own download (with a short network timeout, so offline fails fast)
  3. the copy shipped inside a Whisper package on PyPI: `pip download --no-deps` of the
     mlx-whisper wheel or else the openai-whisper sdist (nothing is installed); the file is
     checked against its known sha256 and cached for next time (1).

Llama-2's own SentencePiece vocabulary cannot be downloaded here, so, as llama2.c offers,
train_sentencepiece() trains one of a chosen size on the training text (BPE with byte
fallback: every byte can be encoded) and export_llama2c_tokenizer() writes it as llama2.c's
tokenizer.bin (llmc.formats.llama2c.write_llama2c_tokenizer).

Tokenizer decodes token ids to text, from llm.c's gpt2_tokenizer.bin (the bytes of every
token, see llmc.formats.llmc.read_tokenizer), from llama2.c's tokenizer.bin, or from a tiktoken
Encoding, and encodes a prompt: GPT-2's through tiktoken, llama2.c's tokenizer.bin as run.c's
encode() does it (llama2c_encoder), so that a prompt gets the tokens run.c gives it.
"""
import base64
import codecs
import glob
import hashlib
import os
import re
import socket
import subprocess
import sys
import tarfile
import tempfile
import zipfile

import numpy as np

from llmc.formats import FormatError, atomic_write
from llmc.formats.hf_tokenizer import is_hf_tokenizer, read_hf_tokenizer
from llmc.formats.llama2c import (read_llama2c_tokenizer, sentencepiece_processor,
                                  write_llama2c_tokenizer)
from llmc.formats.llmc import TOKENIZER_MAGIC, read_tokenizer

GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_VOCAB_SIZE = 50257
EOT = "<|endoftext|>"
EOT_TOKEN = 50256
# GPT-2's pre-tokenizer split; tiktoken's own spelling is preferred when it has one
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# PyPI packages that ship GPT-2's ranks as whisper/assets/gpt2.tiktoken: (name, pip options)
PYPI_SOURCES = [
    ("mlx-whisper", ["--only-binary", ":all:"]),     # a zip; pip only downloads it
    ("openai-whisper", ["--no-binary", ":all:"]),    # an sdist; pip reads its metadata first
]
ONLINE_TIMEOUT_S = 10
# llm.c's GPT-2 tokenizer file, in the repository (dev/download_gpt2.py writes it): the data's
# tokenizer when its shards have none beside them
DEFAULT_TOKENIZER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "gpt2_tokenizer.bin")


class TokenizerError(RuntimeError):
    """No way to get GPT-2's BPE; the message (one line) says what to do."""


def note(message):
    print(f"tokenizer: {message}", file=sys.stderr, flush=True)


def cache_dir():
    if os.environ.get("LLMPYX_CACHE_DIR"):
        return os.environ["LLMPYX_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "llm.pyx")


# ----------------------------------------------------------------------------
# the encoding

def encoding_from_ranks(data, source):
    """tiktoken's GPT-2 Encoding built from the bytes of a .tiktoken ranks file (each line
    "<base64 token> <rank>"), after checking they are GPT-2's: raises ValueError otherwise."""
    import tiktoken
    digest = hashlib.sha256(data).hexdigest()
    if digest != GPT2_RANKS_SHA256:
        raise ValueError(f"{source}: not GPT-2's BPE ranks (sha256 {digest}, "
                         f"expected {GPT2_RANKS_SHA256})")
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    try:
        from tiktoken_ext.openai_public import r50k_pat_str as pat_str
    except ImportError:
        pat_str = GPT2_PAT_STR
    return tiktoken.Encoding(name="gpt2", pat_str=pat_str, mergeable_ranks=ranks,
                             special_tokens={EOT: EOT_TOKEN}, explicit_n_vocab=GPT2_VOCAB_SIZE)


def tiktoken_online():
    """tiktoken.get_encoding("gpt2"), with every socket operation bounded by a timeout."""
    import tiktoken
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(ONLINE_TIMEOUT_S)  # requests/urllib3 fall back to this
    try:
        return tiktoken.get_encoding("gpt2")
    finally:
        socket.setdefaulttimeout(previous)


def extract_ranks(archive):
    """The bytes of .../assets/gpt2.tiktoken inside a wheel (zip) or an sdist (tar.gz)."""
    if archive.endswith(".whl") or archive.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                if name.endswith("/assets/gpt2.tiktoken"):
                    return z.read(name)
    else:
        with tarfile.open(archive) as t:
            for member in t.getmembers():
                if member.isfile() and member.name.endswith("/assets/gpt2.tiktoken"):
                    return t.extractfile(member).read()
    raise ValueError(f"{os.path.basename(archive)}: holds no assets/gpt2.tiktoken")


def ranks_from_pypi():
    """(ranks bytes, where from): pip-download a Whisper package and take its gpt2.tiktoken."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="llmpyx-bpe-") as tmp:
        for package, options in PYPI_SOURCES:
            dest = os.path.join(tmp, package)
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                   "--retries", "1", "--timeout", "30", "--dest", dest, *options, package]
            try:
                run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as e:
                problems.append(f"{package}: {type(e).__name__}")
                continue
            archives = glob.glob(os.path.join(dest, "*"))
            if run.returncode != 0 or not archives:
                last = (run.stderr.strip().splitlines() or ["pip download failed"])[-1]
                problems.append(f"{package}: {last.strip()}")
                continue
            try:
                data = extract_ranks(archives[0])
                encoding_from_ranks(data, os.path.basename(archives[0]))  # checks the sha256
            except (ValueError, OSError, tarfile.TarError, zipfile.BadZipFile) as e:
                problems.append(str(e))
                continue
            return data, f"{os.path.basename(archives[0])} from PyPI"
    raise TokenizerError("cannot get GPT-2's BPE ranks: tiktoken's download failed and so did "
                         "the PyPI fallback (" + "; ".join(problems) + "). Connect to the "
                         "internet once, or put gpt2.tiktoken (sha256 "
                         f"{GPT2_RANKS_SHA256[:12]}...) at {cached_ranks_path()}")


def cached_ranks_path():
    return os.path.join(cache_dir(), "gpt2.tiktoken")


_encoding = None


def gpt2_encoding():
    """tiktoken's GPT-2 Encoding, from the cache, tiktoken's download or PyPI (see the top)."""
    global _encoding
    if _encoding is not None:
        return _encoding
    cached = cached_ranks_path()
    if os.path.exists(cached):
        try:
            with open(cached, "rb") as f:
                _encoding = encoding_from_ranks(f.read(), cached)
            return _encoding
        except (OSError, ValueError) as e:
            note(f"ignoring the cached ranks: {e}")
    try:
        _encoding = tiktoken_online()
        return _encoding
    except Exception as e:  # tiktoken raises whatever requests or its cache raise
        note(f"tiktoken could not download GPT-2's BPE ({type(e).__name__}, offline?); "
             f"taking the copy inside a Whisper package from PyPI")
    data, source = ranks_from_pypi()
    _encoding = encoding_from_ranks(data, source)
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        atomic_write(cached, data)
        note(f"GPT-2's BPE ranks from {source} (sha256 verified), cached at {cached}")
    except OSError as e:
        note(f"GPT-2's BPE ranks from {source} (sha256 verified); cannot cache them: {e}")
    return _encoding


# ----------------------------------------------------------------------------
# decoding, and encoding a prompt

class Tokenizer:
    """Token ids -> text, and a prompt -> token ids (encode_prompt). token_bytes[i] is the bytes
    of token i (GPT-2 is byte-level: one character may span several tokens, so text is decoded
    from the joined bytes).  eot_token separates documents and starts a sample (GPT-2's
    <|endoftext|>, SentencePiece's BOS)."""

    def __init__(self, token_bytes, eot_token, source, space_after_eot=True, encoder=None,
                 stop_tokens=None, chat_template=None, text_encoder=None, strip_text_start=False,
                 padded_vocabulary=False):
        self.token_bytes = token_bytes
        self.eot_token = eot_token
        self.source = source
        # SentencePiece puts a space before a document's first word; run.c drops it after
        # every start token, a Hugging Face tokenizer's decoder (strip_text_start) once, at the
        # start of the text it decodes
        self.space_after_eot = space_after_eot
        self.strip_text_start = strip_text_start
        # the model's vocabulary may run past the tokenizer's tokens (Qwen2.5's 151,936 rows for
        # 151,665 tokens): the rows past them decode to nothing
        self.padded_vocabulary = padded_vocabulary
        self.encoder = encoder   # text -> a prompt's ids (encode_prompt); None: decodes only
        # where generation stops (a Hugging Face model may have several EOS; else the start)
        self.stop_tokens = tuple(stop_tokens) if stop_tokens is not None else (eot_token,)
        self.chat_template = chat_template   # llmc.hf_tokenizer.ChatTemplate, or None
        # text -> its ids alone, no start token (a rendered chat's; None: encode_prompt's own)
        self.text_encoder = text_encoder

    @classmethod
    def from_file(cls, path):
        """llm.c's tokenizer file (gpt2_tokenizer.bin); raises llmc.formats.FormatError.  It
        holds no merges: GPT-2's (its 50257 tokens) encodes through tiktoken."""
        tokens, eot_token = read_tokenizer(path)
        encoder = ((lambda text: [eot_token, *gpt2_encoding().encode_ordinary(text)])
                   if len(tokens) == GPT2_VOCAB_SIZE else None)
        return cls(tokens, eot_token, path, encoder=encoder)

    @classmethod
    def from_llama2c(cls, path):
        """llama2.c's tokenizer.bin (from_pieces)."""
        return cls.from_pieces(*read_llama2c_tokenizer(path), path)

    @classmethod
    def from_pieces(cls, pieces, scores, source):
        """llama2.c's pieces and scores: byte-fallback pieces "<0x0A>" are their byte, BOS
        (id 1) and EOS (id 2) decode to nothing, as SentencePiece decodes them."""
        token_bytes = [LLAMA2C_BYTE_PIECE.fullmatch(p) and bytes([int(p[3:5], 16)]) or p
                       for p in pieces]
        for special in (SP_BOS, SP_EOS):
            if special < len(token_bytes):
                token_bytes[special] = b""
        return cls(token_bytes, SP_BOS, source, space_after_eot=False,
                   encoder=llama2c_encoder(pieces, scores))

    @classmethod
    def from_hf(cls, path):
        """A Hugging Face tokenizer.json (or a folder holding it) with its tokenizer_config.json
        (llmc.formats.hf_tokenizer): as transformers' AutoTokenizer encodes."""
        hf = read_hf_tokenizer(path)
        return cls(hf.token_bytes, hf.start_token, os.fspath(path), strip_text_start=hf.strip_text_start,
                   padded_vocabulary=True, encoder=hf.encode, stop_tokens=hf.stop_tokens, chat_template=hf.chat_template,
                   text_encoder=hf.encode_text)

    @classmethod
    def from_encoding(cls, encoding):
        tokens = [encoding.decode_single_token_bytes(i) for i in range(encoding.n_vocab)]
        return cls(tokens, encoding.eot_token, f"tiktoken {encoding.name}",
                   encoder=lambda text: [encoding.eot_token, *encoding.encode_ordinary(text)])

    @property
    def vocab_size(self):
        return len(self.token_bytes)

    def encode_prompt(self, text):
        """The token ids of a prompt: eot_token (GPT-2's <|endoftext|>, SentencePiece's BOS),
        then the text's (special tokens' names are text); TokenizerError when this tokenizer
        cannot encode."""
        if self.encoder is None:
            raise TokenizerError(f"{self.source}: this tokenizer only decodes, it cannot "
                                 f"encode a prompt")
        return self.encoder(text)

    def _bytes(self, token_id, previous):
        raw = self.token_bytes[token_id] if token_id < len(self.token_bytes) else b""
        if previous == self.eot_token and not self.space_after_eot and raw[:1] == b" ":
            return raw[1:]
        return raw

    def decode(self, ids):
        ids = list(ids)
        text = b"".join(self._bytes(i, prev) for prev, i in zip([None] + ids, ids))
        if self.strip_text_start and text[:1] == b" ":
            text = text[1:]
        return text.decode("utf-8", errors="replace")

    def stream_decoder(self, after=None):
        """A function token id -> the text it completes, for printing tokens as they come:
        bytes of a character split across tokens are held until it is whole, and control
        characters other than newline and tab are dropped (llm.c's safe_printf).  `after` is
        the token already there (a sample's start token, not printed), so that the first
        word after SentencePiece's BOS loses its space as in decode."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        previous = [after]
        at_start = [self.strip_text_start]   # no byte written yet, the first space to strip

        def piece(token_id):
            raw = self._bytes(token_id, previous[0])
            if at_start[0] and raw:
                raw, at_start[0] = raw[1:] if raw[:1] == b" " else raw, False
            text = decoder.decode(raw)
            previous[0] = token_id
            return "".join(c for c in text if c.isprintable() or c in "\n\t")
        return piece


TOKENIZERS_BESIDE_DATA = ("tokenizer.bin", "tokenizer.json")


def tokenizer_beside_shards(pattern):
    """The tokenizer beside the first of the token shards pattern matches, or None: the data
    scripts write llama2.c's tokenizer.bin there with a SentencePiece vocabulary, and a Hugging
    Face model's tokenizer.json (with its tokenizer_config.json) with its tokens."""
    shards = sorted(glob.glob(pattern))
    for name in TOKENIZERS_BESIDE_DATA if shards else ():
        beside = os.path.join(os.path.dirname(shards[0]), name)
        if os.path.exists(beside):
            return beside
    return None


def data_tokenizer(train_pattern):
    """The path of the tokenizer of the token shards train_pattern matches: a tokenizer.bin
    beside them (the data scripts write llama2.c's with a SentencePiece vocabulary there), else
    llm.c's GPT-2 one (DEFAULT_TOKENIZER)."""
    return tokenizer_beside_shards(train_pattern) or DEFAULT_TOKENIZER


def load_sample_tokenizer(train_pattern, vocab_map=None):
    """The tokenizer of a run's samples: its data's (data_tokenizer), else tiktoken's GPT-2;
    None (the samples print as token ids) when none can be had, said in one line. With
    --compact-vocab's map (llmc/vocab.py), one of the compact ids that decodes through the map
    (printing the original ids when there is no tokenizer)."""
    from llmc.logger import note   # train.py's one-line notes
    try:
        tokenizer = load_tokenizer(data_tokenizer(train_pattern))
    except (TokenizerError, FormatError) as e:
        note(f"no tokenizer, printing token ids ({e})")
        tokenizer = None
    return tokenizer if vocab_map is None else vocab_map.tokenizer(tokenizer)


def load_tokenizer(path="gpt2_tokenizer.bin"):
    """The Tokenizer of the file at path if there is one (llm.c's tokenizer, llama2.c's
    tokenizer.bin, a GGUF model's own vocabulary, or a Hugging Face tokenizer.json or a folder
    holding one), else of tiktoken's GPT-2."""
    if not os.path.exists(path):
        return Tokenizer.from_encoding(gpt2_encoding())
    if is_hf_tokenizer(path):
        return Tokenizer.from_hf(path)
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"GGUF":
        return gguf_tokenizer(path)
    if int.from_bytes(head, "little") == TOKENIZER_MAGIC:
        return Tokenizer.from_file(path)
    return Tokenizer.from_llama2c(path)


def gguf_tokenizer(path):
    """The Tokenizer of a GGUF file's vocabulary: a SentencePiece one (llama.cpp's "llama"
    model) as llama2.c's pieces and scores, or GPT-2's byte-level BPE through tiktoken, when its
    tokens are GPT-2's; TokenizerError for another."""
    from llmc.formats.gguf import gpt2_token_texts, llama2c_pieces, read_gguf_vocab
    model, tokens, scores = read_gguf_vocab(path)
    if model == "llama" and scores is not None:
        return Tokenizer.from_pieces(llama2c_pieces(tokens), scores, path)
    if model == "gpt2":   # GPT-2's tokens as GGUF spells them, then llm.c's padding if any
        gpt2 = Tokenizer.from_encoding(gpt2_encoding())
        spelled = gpt2_token_texts(gpt2.token_bytes, special=(gpt2.eot_token,))
        if list(tokens[:len(spelled)]) == spelled:
            return gpt2
    raise TokenizerError(f"{path}: its vocabulary ({model}, {len(tokens)} tokens) is neither a "
                         f"SentencePiece one nor GPT-2's: give the tokenizer (--tokenizer)")


# ----------------------------------------------------------------------------
# SentencePiece vocabularies, as llama2.c trains and exports them

SP_UNK, SP_BOS, SP_EOS = 0, 1, 2          # SentencePiece's default ids, which run.c assumes
SP_WHITESPACE = "\u2581"                  # SentencePiece's "▁" marks a space
LLAMA2C_BYTE_PIECE = re.compile(rb"<0x[0-9A-F]{2}>")


def utf8_groups(data):
    """The bytes cut as run.c's encode cuts them: a byte and the continuation bytes (10xxxxxx)
    after it, at most 4 in all (a UTF-8 code point, when the bytes are UTF-8)."""
    start = 0
    while start < len(data):
        end = start + 1
        while end < len(data) and data[end] & 0xC0 == 0x80 and end - start < 4:
            end += 1
        yield data[start:end]
        start = end


def llama2c_encoder(pieces, scores):
    """A function text -> token ids as llama2.c's run.c encodes a prompt with a tokenizer.bin
    of these pieces and scores (encode(bos=1, eos=0)): BOS, a dummy-prefix space (for
    non-empty text), each code point's piece or else its bytes' pieces (byte fallback: byte b
    is token b + 3), then, while any adjacent pair's concatenation is a piece, the pair whose
    piece scores highest (the leftmost of equals) merges into it."""
    lookup = {}
    for i in reversed(range(len(pieces))):   # a duplicated piece: its lowest id
        lookup[pieces[i]] = i
    scores = [float(s) for s in scores]      # float32 values, exact as floats
    byte_fallback = (len(pieces) >= 3 + 256 and
                     all(pieces[3 + b] == b"<0x%02X>" % b for b in range(256)))
    no_merge = float(np.float32(-1e10))      # run.c's starting best score: merges score above

    def encode(text):
        data = text.encode("utf-8", "surrogateescape")   # the bytes of argv, as run.c sees them
        tokens = [SP_BOS]
        if data:
            if b" " not in lookup:
                raise TokenizerError("the tokenizer has no ' ' piece for SentencePiece's "
                                     "dummy prefix")
            tokens.append(lookup[b" "])
        for group in utf8_groups(data):
            if group in lookup:
                tokens.append(lookup[group])
            elif byte_fallback:
                tokens.extend(b + 3 for b in group)
            else:
                raise TokenizerError(f"the tokenizer has no piece for {group!r} and no "
                                     f"byte-fallback pieces <0x00>..<0xFF> at ids 3..258")
        while True:
            best_score, best_at, best_id = no_merge, -1, -1
            for i in range(len(tokens) - 1):
                merged = lookup.get(pieces[tokens[i]] + pieces[tokens[i + 1]])
                if merged is not None and scores[merged] > best_score:
                    best_score, best_at, best_id = scores[merged], i, merged
            if best_at < 0:
                return tokens
            tokens[best_at:best_at + 2] = [best_id]
    return encode


def train_sentencepiece(text_path, model_prefix, vocab_size):
    """Train a SentencePiece BPE vocabulary of vocab_size tokens on the text file, with
    llama2.c's settings (byte fallback, digits split, whitespace kept as is); returns the path
    of the .model file."""
    try:
        import sentencepiece as spm
    except ImportError:
        raise TokenizerError("training a SentencePiece vocabulary needs the sentencepiece "
                             "package: pip install sentencepiece") from None
    try:
        spm.SentencePieceTrainer.train(
            input=text_path, model_prefix=model_prefix, model_type="bpe", vocab_size=vocab_size,
            input_format="text", character_coverage=1.0,
            num_threads=os.cpu_count(), split_digits=True, allow_whitespace_only_pieces=True,
            byte_fallback=True, unk_surface=r" \342\201\207 ", normalization_rule_name="identity",
            minloglevel=2)
    except RuntimeError as e:
        raise TokenizerError(f"SentencePiece could not train a {vocab_size}-token vocabulary on "
                             f"{text_path}: {' '.join(str(e).split())}") from None
    return model_prefix + ".model"


def export_llama2c_tokenizer(model_path, bin_path):
    """Write the SentencePiece model at model_path as llama2.c's tokenizer.bin: each piece
    with "▁" as a space, BOS as "\n<s>\n", EOS as "\n</s>\n", and its score."""
    sp = sentencepiece_processor(model_path)
    pieces, scores = [], []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        if i == sp.bos_id():
            piece = "\n<s>\n"
        elif i == sp.eos_id():
            piece = "\n</s>\n"
        pieces.append(piece.replace(SP_WHITESPACE, " ").encode("utf-8"))
        scores.append(sp.get_score(i))
    write_llama2c_tokenizer(bin_path, pieces, scores)
