"""
generate.py and what it stands on: greedy generation against PyTorch's argmax step by step
(a d2 GPT-2 and a d2 Llama, loaded from our files by train_gpt2_torch.py and
train_llama2_torch.py), the fixed-length forward exact to the bit (the model is causal), the
Sampler (seed determinism, top-k 1 is greedy, top-k and top-p against direct NumPy
computations in float64), the llama2.c prompt encoder against a line-by-line transcription of
run.c's encode() on a SentencePiece vocabulary trained here, the command on a train.py output
dir and on a --compact-vocab model, bad input in one line; and, where LLAMA2C_DIR names a
llama2.c checkout, dev/llama2c_check.py (run.c itself against generate.py).
"""
import bisect
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

import needs
import generate
from llmc import checkpoint, tokenizer
from llmc.formats.llama2c import read_llama2c_tokenizer, write_llama2c_tokenizer
from llmc.formats.llmc import write_shard
from llmc.sampler import Sampler, XorShift, continue_prompt, sample_topp
from llmc.vocab import MAP_NAME, VocabMap
from test_llama_formats import vocabulary  # noqa: F401  (a SentencePiece tokenizer.bin)
from train_gpt2 import GPT2, GPT2Config
from train_llama2 import Llama2, LlamaConfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
V = 97   # a small vocabulary: clear argmaxes, quick references
MODELS = {"gpt2": (GPT2, GPT2Config.from_name("d2", vocab_size=V)),
          "llama": (Llama2, LlamaConfig.from_name("d2", vocab_size=V))}
PROMPT = [5, 17, 3, 60, 42]


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_file(request, tmp_path_factory):
    """A random d2 of each family, written to its model file."""
    Model, config = MODELS[request.param]
    path = tmp_path_factory.mktemp(request.param) / "model.bin"
    Model.random(config, seed=3).save(str(path))
    return path


def load(path):
    from llmc.families import family_of_file
    family, _ = family_of_file(path)
    return family, family.model_class.from_checkpoint(str(path))


def run_generation(model, steps, sampler, prompt=PROMPT):
    return list(continue_prompt(model, prompt, steps, sampler, stop_tokens=()))


# ----------------------------------------------------------------------------
# the forward

def test_greedy_is_pytorchs_argmax_step_by_step(model_file):
    torch = needs.package("torch")
    import importlib
    family, model = load(model_file)
    reference = importlib.import_module(family.reference)
    config, params = family.read_model(str(model_file))
    torch_model = reference.build_model(config, params)
    seen = []

    def greedy(logits):   # ours, kept to compare
        seen.append(np.array(logits))
        return int(np.argmax(logits))
    ours = run_generation(model, 20, greedy)
    tokens = list(PROMPT)
    with torch.no_grad():
        for step in range(20):   # PyTorch's forward over the growing sequence
            idx = torch.tensor([tokens])
            logits = torch_model(idx, idx)[0][0, -1].numpy()
            np.testing.assert_allclose(seen[step], logits, atol=1e-4 * np.abs(logits).max())
            tokens.append(int(np.argmax(logits)))
    assert ours == tokens[len(PROMPT):]


def test_fixed_length_forward_is_exact(model_file):
    """Without a KV cache, the logits that chose each token are, bit for bit, those of one
    forward over the whole text, at the generation's length, whatever the padding after it
    (with the cache, within float32 rounding: tests/test_kv_cache.py)."""
    _, model = load(model_file)
    seen = []

    def greedy(logits):
        seen.append(np.array(logits))
        return int(np.argmax(logits))
    ours = list(continue_prompt(model, PROMPT, 12, greedy, (), cache=False))
    text = np.array([PROMPT + ours[:-1]], dtype=np.int32)   # the length the generation ran at
    model.forward(text)
    whole = np.array(model.logits[0, :, :V])
    for step, logits in enumerate(seen):
        assert np.array_equal(logits, whole[len(PROMPT) - 1 + step]), step
    padded = text.copy()
    padded[0, len(PROMPT) + 3:] = 7   # other tokens after position len(PROMPT) + 2
    model.forward(padded)
    assert np.array_equal(np.array(model.logits[0, len(PROMPT) + 2, :V]), seen[3])


# ----------------------------------------------------------------------------
# sampling

def test_seed_determinism_and_top_k_1_is_greedy(model_file):
    _, model = load(model_file)
    sampled = [run_generation(model, 10, Sampler(1.0, 0, 1.0, seed)) for seed in (42, 42, 7)]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]
    nucleus = [run_generation(model, 10, Sampler(0.8, 40, 0.9, 42)) for _ in range(2)]
    assert nucleus[0] == nucleus[1]
    greedy = run_generation(model, 10, Sampler(0.0))
    assert run_generation(model, 10, Sampler(1.3, 1, 0.9, 5)) == greedy
    assert greedy != sampled[0]


def test_greedy_and_top_k_1_take_the_first_of_equal_logits():
    logits = np.array([0.5, 2.0, -1.0, 2.0], dtype=np.float32)
    assert Sampler(0.0)(logits) == 1
    assert all(Sampler(1.0, 1, 1.0, seed)(logits) == 1 for seed in range(1, 20))


def nucleus_reference(probs, topp, coin):
    """Nucleus sampling computed directly, in float64: the most likely tokens up to the first
    whose running sum exceeds topp, renormalised, and the first whose cumulative share
    exceeds the coin; (token, distance of the coin from the nearest boundary)."""
    order = np.argsort(-probs, kind="stable")
    cdf = np.cumsum(probs[order].astype(np.float64))
    size = min(int(np.searchsorted(cdf, topp, side="right")) + 1, len(probs))
    shares = cdf[:size] / cdf[size - 1]
    chosen = min(int(np.searchsorted(shares, coin, side="right")), size - 1)
    return int(order[chosen]), float(np.abs(shares - coin).min())


def test_top_p_against_a_direct_computation():
    rng = np.random.default_rng(0)
    coins = XorShift(99)
    checked = 0
    for trial in range(300):
        n = int(rng.integers(2, 300))
        probs = rng.dirichlet(np.full(n, rng.choice([0.05, 0.5, 3.0]))).astype(np.float32)
        probs /= probs.sum(dtype=np.float32)
        topp = float(rng.choice([0.1, 0.5, 0.9, 0.99]))
        coin = coins.random_f32()
        expected, margin = nucleus_reference(probs, topp, float(coin))
        if margin < 1e-5:   # float32 and float64 may round to either side
            continue
        assert sample_topp(probs, topp, coin) == expected, (trial, n, topp, coin)
        checked += 1
    assert checked > 280


def test_top_p_nucleus_exceeds_top_p():
    """The nucleus is the most likely tokens up to the one whose running sum exceeds top_p,
    not the one where it reaches it (exact sums in binary)."""
    probs = np.array([0.125, 0.5, 0.125, 0.25], dtype=np.float32)   # running: .5 .75 .875 1
    coins = (np.arange(1000, dtype=np.float32) + 0.5) / 1000
    assert {sample_topp(probs, 0.75, c) for c in coins} == {1, 3, 0}
    assert {sample_topp(probs, 0.5, c) for c in coins} == {1, 3}


def test_top_p_draws_the_nucleus_in_proportion():
    probs = np.array([0.05, 0.4, 0.02, 0.3, 0.2, 0.03], dtype=np.float32)   # nucleus 0.8: 1, 3, 4
    coins = (np.arange(10000, dtype=np.float32) + 0.5) / 10000
    counts = np.bincount([sample_topp(probs, 0.8, c) for c in coins], minlength=len(probs))
    np.testing.assert_allclose(counts / len(coins), [0, 4 / 9, 0, 3 / 9, 2 / 9, 0], atol=2e-4)


def test_temperature_and_top_k_against_a_direct_computation():
    rng = np.random.default_rng(1)
    for trial in range(200):
        logits = rng.normal(0, 3, 50).astype(np.float32)
        temperature, k = float(rng.choice([0.5, 1.0, 2.0])), int(rng.choice([0, 1, 5, 20]))
        seed = int(rng.integers(1, 2 ** 32))
        coin = float(XorShift(seed).random_f32())
        # in float64: softmax of logits / temperature over the k largest, drawn in id order
        scaled = logits.astype(np.float64) / temperature
        kept = np.argsort(-scaled, kind="stable")[:k] if k else np.arange(len(logits))
        probs = np.zeros(len(logits))
        probs[kept] = np.exp(scaled[kept] - scaled[kept].max())
        cdf = np.cumsum(probs / probs.sum())
        if np.abs(cdf - coin).min() < 1e-5:
            continue
        expected = min(int(np.searchsorted(cdf, coin, side="right")), len(logits) - 1)
        assert Sampler(temperature, k, 1.0, seed)(logits) == expected, trial


def test_a_tiny_temperature_draws_among_the_largest_logits_only():
    """logits / 1e-45 overflow float32: the largest is taken away first, so the rest are -inf
    and the draw is among the equal largest ones, without a warning."""
    logits = np.array([1.0, 3.0, 2.0, 3.0, -5.0], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = {Sampler(temperature, k, p, seed)(logits) for temperature in (1e-30, 1e-45)
                 for k, p in ((0, 1.0), (2, 1.0), (0, 0.5)) for seed in range(1, 30)}
    assert drawn == {1, 3}


# ----------------------------------------------------------------------------
# llama2.c's prompt encoding

def run_c_encode(pieces, scores, text):
    """run.c's encode(t, text, bos=1, eos=0) line by line: the sorted vocabulary searched by
    bisection, the UTF-8 loop over a byte buffer, byte fallback at +3, and the merge loop."""
    sorted_vocab = sorted((piece, i) for i, piece in enumerate(pieces))
    keys = [piece for piece, _ in sorted_vocab]

    def str_lookup(s):
        at = bisect.bisect_left(keys, s)
        return sorted_vocab[at][1] if at < len(keys) and keys[at] == s else -1
    text = text.encode("utf-8", "surrogateescape") + b"\0"
    tokens = [1]
    if text[0] != 0:
        tokens.append(str_lookup(b" "))
    buffer = b""
    for c in range(len(text) - 1):
        if text[c] & 0xC0 != 0x80:
            buffer = b""
        buffer += bytes([text[c]])
        if text[c + 1] & 0xC0 == 0x80 and len(buffer) < 4:
            continue
        found = str_lookup(buffer)
        if found != -1:
            tokens.append(found)
        else:
            tokens += [b + 3 for b in buffer]
        buffer = b""
    while True:
        best_score, best_id, best_idx = np.float32(-1e10), -1, -1
        for i in range(len(tokens) - 1):
            found = str_lookup(pieces[tokens[i]] + pieces[tokens[i + 1]])
            if found != -1 and scores[found] > best_score:
                best_score, best_id, best_idx = scores[found], found, i
        if best_idx == -1:
            break
        tokens[best_idx] = best_id
        del tokens[best_idx + 1]
    return tokens


PROMPTS = ["", "First Citizen:", "Hello world", " leading space", "a  b   c\n\n", "1234567",
           "tab\there\nand a newline", "h\u00e9llo w\u00f6rld \u2603 \u65e5\u672c \U0001F642!",
           "x\udc80\udc80y", "\udc80\udc80\udc80\udc80\udc80\udc80 stray continuation bytes"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_prompt_encodes_as_run_c(vocabulary, prompt):  # noqa: F811
    _, bin_path, _ = vocabulary
    pieces, scores = read_llama2c_tokenizer(bin_path)
    tok = tokenizer.load_tokenizer(str(bin_path))
    ids = tok.encode_prompt(prompt)
    assert ids == run_c_encode(pieces, scores, prompt)
    if "\udc80" not in prompt:   # valid UTF-8 round-trips (byte fallback for unseen characters)
        assert tok.decode(ids) == prompt


def test_prompt_encoding_ties_and_long_byte_runs(tmp_path):
    """A vocabulary made for it: of merges that score the same the leftmost goes first (" a"
    scores lower than both), and a run of continuation bytes is cut after 4 bytes, as run.c
    cuts it."""
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n", *(b"<0x%02X>" % i for i in range(256)),
              b" ", b"a", b"b", b"ab", b"ba", b" a", b"\x80\x80\x80\x80"]
    scores = [0.0] * 259 + [-1.0, -1.0, -1.0, -5.0, -5.0, -9.0, -1.0]
    path = tmp_path / "tokenizer.bin"
    write_llama2c_tokenizer(path, pieces, scores)
    tok = tokenizer.load_tokenizer(str(path))
    ab, ba, run4 = 262, 263, 265
    for prompt, expected in [("bab", [1, 259, ba, 261]), ("aba", [1, 259, ab, 260]),
                             ("\udc80" * 5, [1, 259, run4, 0x80 + 3])]:
        assert tok.encode_prompt(prompt) == expected == run_c_encode(pieces, scores, prompt)


def test_prompt_encodes_as_sentencepiece(vocabulary):  # noqa: F811
    """On text without runs of spaces, run.c's algorithm gives SentencePiece's own tokens."""
    model, bin_path, _ = vocabulary
    sp = tokenizer.sentencepiece_processor(model)
    tok = tokenizer.load_tokenizer(str(bin_path))
    for prompt in ["First Citizen:\nBefore we proceed", "Speak, speak \u00e9\u00e8 \u4e16!"]:
        assert tok.encode_prompt(prompt) == [sp.bos_id()] + sp.encode(prompt)


# ----------------------------------------------------------------------------
# the command line

@pytest.fixture
def gpt2_ranks(monkeypatch, tmp_path):
    shutil.copy(needs.shared(needs.GPT2_RANKS), tmp_path / "gpt2.tiktoken")
    monkeypatch.setenv("LLMPYX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tokenizer, "_encoding", None)
    return str(tmp_path)


def error_of(capsys, *args, status=1):
    with pytest.raises(SystemExit) as e:
        generate.run([str(a) for a in args])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("generate.py: tok")]
    assert e.value.code == status, err
    assert len(lines) == 1 and lines[0].startswith("generate.py: error: "), err
    return lines[0]


def test_errors_are_one_line(capsys, tmp_path, vocabulary, gpt2_ranks):  # noqa: F811
    _, bin_path, _ = vocabulary
    gpt2 = tmp_path / "gpt2.bin"
    GPT2.random(GPT2Config.from_name("d1", vocab_size=V), seed=1).save(str(gpt2))
    llama = tmp_path / "llama.bin"
    Llama2.random(LlamaConfig.from_name("d1", vocab_size=50257, max_seq_len=16), 1).save(str(llama))
    assert "no such file" in error_of(capsys, tmp_path / "none.bin")
    (tmp_path / "junk.bin").write_bytes(b"not a model at all, just text\n")
    assert "junk.bin: not a model file" in error_of(capsys, tmp_path / "junk.bin")
    assert "without a complete checkpoint" in error_of(capsys, tmp_path)
    assert "argument -n" in error_of(capsys, llama, "-n", 0, status=2)
    assert "argument --top-p" in error_of(capsys, llama, "--top-p", 1.5, status=2)
    assert "argument --temperature" in error_of(capsys, llama, "--temperature", -1, status=2)
    assert "argument --seed" in error_of(capsys, llama, "--seed", 0, status=2)
    line = error_of(capsys, llama, "-p", "Hi", "-n", 20)
    assert "-n 20: the prompt (its first token included: 2) and 20 more tokens need 21 " \
           "positions, the model has 16: at most -n 15" in line
    line = error_of(capsys, llama, "-p", "word " * 20)
    assert "the prompt is 22 tokens, more than the model's max_seq_len 16" in line
    line = error_of(capsys, gpt2)   # starts from <|endoftext|>, outside 97 tokens
    assert "the prompt's token 50256 ('<|endoftext|>') is outside the model's vocabulary of " \
           "97" in line
    line = error_of(capsys, llama, "--tokenizer", bin_path)
    assert "has 400 tokens, fewer than the model's vocabulary of 50257" in line
    assert "--tokenizer x.bin: no such file" in error_of(capsys, llama, "--tokenizer", "x.bin")


def test_command_line_on_a_run_dir(tmp_path, vocabulary):  # noqa: F811
    """A train.py output dir: its newest checkpoint, the tokenizer beside its data (from
    run.json), the prompt and the greedy continuation streamed, tokens/s on stderr."""
    _, bin_path, _ = vocabulary
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    shutil.copy(bin_path, data / "tokenizer.bin")
    write_shard(data / "train_000.bin", np.arange(2000) % 400)
    checkpoint.write_run_config(str(out), {"-i": str(data / "train_*.bin")})
    config = LlamaConfig.from_name("d1", vocab_size=400, max_seq_len=64)
    for step, seed in ((1, 1), (2, 2)):   # the newest, step 2, is the one to load
        model_path, state_path, done_path = checkpoint.checkpoint_paths(str(out), step)
        Llama2.random(config, seed=seed).save(model_path)
        for path in (state_path, done_path):
            open(path, "wb").close()
    run = subprocess.run([sys.executable, os.path.join(ROOT, "generate.py"), str(out), "-p",
                          "First Citizen:", "-n", "12", "--temperature", "0"],
                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"generate.py: tokenizer: {data / 'tokenizer.bin'} (the training data's" in run.stderr
    assert "achieved tok/s: " in run.stderr and "Traceback" not in run.stderr
    tok = tokenizer.load_tokenizer(str(bin_path))
    model = Llama2.from_checkpoint(checkpoint.checkpoint_paths(str(out), 2)[0])
    prompt = tok.encode_prompt("First Citizen:")
    tokens = list(continue_prompt(model, prompt, 12, Sampler(0.0), tok.stop_tokens))
    piece = tok.stream_decoder(after=prompt[0])
    assert run.stdout == "".join(piece(t) for t in prompt[1:] + tokens) + "\n"
    assert run.stdout.startswith("First Citizen:")


def test_precision_bf16_generates_the_bf16_models_text(capsys, tmp_path, vocabulary):  # noqa: F811
    """--precision bf16: the model loads in bf16 (no master weights) and its greedy text, with
    the KV cache, is what that model gives; fp16 (the GPUs' precision) is refused."""
    _, bin_path, _ = vocabulary
    config = LlamaConfig.from_name("d1", vocab_size=400, max_seq_len=64)
    path = tmp_path / "model.bin"
    fp32 = Llama2.random(config, seed=4)
    fp32.params = fp32.params * 6   # a random model's logits are nearly flat: sharpen them
    fp32.save(str(path))
    generate.main([str(path), "-p", "First Citizen:", "-n", "16", "--temperature", "0",
                   "--tokenizer", str(bin_path), "--precision", "bf16", "--ids"])
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("token ids: ")][0]
    prompt_ids, generated = line.removeprefix("token ids: prompt ").split(", generated ")
    model = Llama2.from_checkpoint(str(path), precision="bf16", trainable=False)
    assert model.precision == "bf16"
    prompt = tokenizer.load_tokenizer(str(bin_path)).encode_prompt("First Citizen:")
    want = list(continue_prompt(model, prompt, 16, Sampler(0.0), ()))
    got = [int(t) for t in generated.strip("[]").split(", ")]
    assert prompt_ids == str(prompt) and 0 < len(got) and got == want[:len(got)]
    with pytest.raises(SystemExit):
        generate.parse_args([str(path), "--precision", "fp16"])


def test_a_compact_vocabulary_model(capsys, tmp_path, vocabulary):  # noqa: F811
    """A --compact-vocab run's model: the prompt's ids through the vocab_map.bin beside it,
    the text back through it; an id it lacks is one line."""
    _, bin_path, _ = vocabulary
    tok = tokenizer.load_tokenizer(str(bin_path))
    prompt = tok.encode_prompt("First Citizen:")
    vocab_map = VocabMap(sorted(set(prompt) | set(range(3, 80))))
    shutil.copy(bin_path, tmp_path / "tokenizer.bin")
    vocab_map.save(str(tmp_path / MAP_NAME))
    config = LlamaConfig.from_name("d1", vocab_size=len(vocab_map), max_seq_len=64)
    model = Llama2.random(config, seed=1)
    model.save(str(tmp_path / "model.bin"))
    generate.run([str(tmp_path / "model.bin"), "-p", "First Citizen:", "-n", "10",
                  "--temperature", "0"])
    compact = [int(vocab_map.index[t]) for t in prompt]
    compacted = vocab_map.tokenizer(tok)
    tokens = list(continue_prompt(model, compact, 10, Sampler(0.0), compacted.stop_tokens))
    piece = compacted.stream_decoder(after=compact[0])
    stdout = capsys.readouterr().out
    assert stdout == "".join(piece(t) for t in compact[1:] + tokens) + "\n"
    assert stdout.startswith("First Citizen:")
    line = error_of(capsys, tmp_path / "model.bin", "-p", "\u2603")
    assert "the prompt: token id" in line and "is not in the compacted vocabulary" in line


def test_run_c_prints_what_generate_generates():
    """dev/llama2c_check.py: run.c and generate.py, greedy, on a tiny Llama trained here."""
    text = needs.TINYSHAKESPEARE
    run = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "llama2c_check.py"),
                          needs.llama2c(), "--steps", "20", "-n", "32",
                          *(["--input-text", text] if os.path.exists(text) else [])],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    assert "match: run.c printed the pieces of generate.py's" in run.stdout


def test_a_gguf_brings_its_own_vocabulary(capsys, tmp_path, vocabulary, gpt2_ranks):  # noqa: F811
    """A GGUF model continues a prompt with the vocabulary written in it: a SentencePiece one
    gives what the llama2.c file and its tokenizer.bin give; GPT-2's is tiktoken's; another
    byte-level one is one line asking for --tokenizer."""
    from llmc.formats.gguf import gpt2_gguf_vocab, sentencepiece_gguf_vocab, write_gguf
    _, bin_path, _ = vocabulary
    pieces, scores = read_llama2c_tokenizer(bin_path)
    config = LlamaConfig.from_name("d1", vocab_size=len(pieces), max_seq_len=32)
    model = Llama2.random(config, seed=4)
    model.save(tmp_path / "model.bin")
    write_gguf(tmp_path / "model.gguf", config, model.params,
               sentencepiece_gguf_vocab(pieces, scores))
    prompt = ["-p", "First Citizen: héllo", "-n", "10", "--temperature", "0"]
    generate.run([str(tmp_path / "model.bin"), "--tokenizer", str(bin_path), *prompt])
    from_bin = capsys.readouterr().out
    generate.run([str(tmp_path / "model.gguf"), *prompt])
    out, err = capsys.readouterr()
    assert out == from_bin and "the GGUF file's own vocabulary" in err
    ours, theirs = tokenizer.load_tokenizer(str(bin_path)), tokenizer.gguf_tokenizer(
        str(tmp_path / "model.gguf"))
    assert theirs.token_bytes == ours.token_bytes
    for text in ("", "  two  spaces", "naïve ☃ 日本"):
        assert theirs.encode_prompt(text) == ours.encode_prompt(text)

    gpt2 = tokenizer.Tokenizer.from_encoding(tokenizer.gpt2_encoding())
    config = LlamaConfig.from_name("d1", vocab_size=50304, max_seq_len=8)
    params = np.zeros(config.num_parameters(), dtype=np.float32)
    write_gguf(tmp_path / "gpt2.gguf", config, params,
               gpt2_gguf_vocab(gpt2.token_bytes, gpt2.eot_token, 50304))
    assert tokenizer.gguf_tokenizer(str(tmp_path / "gpt2.gguf")).source == "tiktoken gpt2"
    other = list(gpt2.token_bytes)
    other[300], other[301] = other[301], other[300]   # not GPT-2's: another vocabulary
    write_gguf(tmp_path / "other.gguf", config, params,
               gpt2_gguf_vocab(other, gpt2.eot_token, 50304))
    with pytest.raises(tokenizer.TokenizerError, match="neither a SentencePiece one nor GPT-2's"):
        tokenizer.gguf_tokenizer(str(tmp_path / "other.gguf"))
