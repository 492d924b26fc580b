"""
The KV cache of generation (issue 36): kernels/attention_cached's two forms against a float64
NumPy reference (new positions after cached ones, grouped-query heads, the cache rows they
write, the probabilities), and llmc/model.pyx's forward_cached on every family and
architecture: greedy generation with the cache equals generation without it, token for token,
for 256 tokens at fp32; the logits of each cached step are those of one forward over the whole
text, within float32 rounding (the two sum in different orders); a prompt longer than a chunk
goes in chunks; a text past the cache is refused; forward_segments (HellaSwag's scorer) scores
texts that share a beginning in one forward as each alone; generate.py --chat keeps the cache across
turns, each reply the one a generation without the cache gives, and refuses a tokenizer
without a chat template in one line.
"""
import dataclasses

import numpy as np
import pytest

from accel.backend import get_backend
from kernels import bf16
from llmc.sampler import Sampler, continue_prompt
from train_gpt2 import GPT2, GPT2Config
from train_llama2 import Llama2, LlamaConfig
import llmc.model

V = 97
STEPS = 256
PROMPT = [5, 17, 3, 60, 42]
LLAMA = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=V, hidden_dim=96,
                    max_seq_len=320)
ARCHITECTURES = {   # each switch of the Llama block that touches attention or positions
    "gpt2": (GPT2, GPT2Config.from_name("d2", vocab_size=V)),
    "llama-gqa": (Llama2, LLAMA),
    "qwen2-qkv-bias": (Llama2, dataclasses.replace(LLAMA, qkv_bias=True, norm_eps=1e-6,
                                                   rope_theta=1e6)),
    "qwen3-qk-norm-head-dim": (Llama2, dataclasses.replace(LLAMA, qk_norm=True, head_dim=32)),
    "llama3-rope-scaling": (Llama2, dataclasses.replace(
        LLAMA, rope_theta=500000.0, rope_scaling=("llama3", 32.0, 1.0, 4.0, 64))),
    "multi-query": (Llama2, dataclasses.replace(LLAMA, n_kv_heads=1, shared_classifier=False)),
}


def cached_reference(q, k_cache, v_cache, P, NH, NKV):
    """(out (T, NH*hs), att (NH, T, P+T)) in float64: query t at position P+t over keys
    0..P+t of the caches (P+T, NKV*hs); query head h reads key/value head h // (NH/NKV)."""
    q, k_cache, v_cache = (np.asarray(x, np.float64) for x in (q, k_cache, v_cache))
    T, hs = q.shape[0], q.shape[1] // NH
    out, att = np.zeros_like(q), np.zeros((NH, T, P + T))
    for h in range(NH):
        kv = h // (NH // NKV)
        k, v = (x[:, kv * hs:(kv + 1) * hs] for x in (k_cache, v_cache))
        for t in range(T):
            scores = k[:P + t + 1] @ q[t, h * hs:(h + 1) * hs] / np.sqrt(hs)
            p = np.exp(scores - scores.max())
            att[h, t, :P + t + 1] = p / p.sum()
            out[t, h * hs:(h + 1) * hs] = att[h, t, :P + t + 1] @ v[:P + t + 1]
    return out, att


def on_backend(backend, array):
    """array's values on backend, at its precision (float32, or bf16 bits rounded to nearest)."""
    values = np.ascontiguousarray(array, dtype=np.float32)
    if backend.precision == "bf16":
        values = bf16.to_bf16(values)
    buffer = backend.alloc(values.nbytes)
    buffer.load(values)
    return buffer


def read(buffer, n):
    return buffer.to_numpy(np.float32, 0, n)


# decode (T = 1) at 300 cached positions, 6 query heads of 20 on 6, 2 and 1 key/value heads
@pytest.mark.parametrize("T, P, hs", [(1, 0, 8), (1, 9, 8), (1, 300, 20), (4, 0, 8), (5, 7, 8)])
@pytest.mark.parametrize("NKV", [6, 2, 1])
def test_the_gqa_kernel_against_float64(T, P, hs, NKV):
    NH = 6
    rng = np.random.default_rng(T * 100 + P * 10 + NKV)
    q, k, v = (rng.standard_normal((T, n * hs)).astype(np.float32) for n in (NH, NKV, NKV))
    cached_k, cached_v = (rng.standard_normal((P, NKV * hs)).astype(np.float32) for _ in "kv")
    backend = get_backend("cpu")
    out, att = backend.alloc(4 * T * NH * hs), backend.alloc(4 * NH * T * (P + T))
    k_cache = on_backend(backend, np.concatenate([cached_k, np.full((T, NKV * hs), np.nan)]))
    v_cache = on_backend(backend, np.concatenate([cached_v, np.full((T, NKV * hs), np.nan)]))
    backend.call("attention_gqa_cached_forward", out, att, k_cache, v_cache,
                 on_backend(backend, q), on_backend(backend, k), on_backend(backend, v),
                 T, P, NH, NKV, hs)
    all_k, all_v = np.concatenate([cached_k, k]), np.concatenate([cached_v, v])
    assert np.array_equal(read(k_cache, (P + T) * NKV * hs), all_k.ravel())
    assert np.array_equal(read(v_cache, (P + T) * NKV * hs), all_v.ravel())
    want_out, want_att = cached_reference(q, all_k, all_v, P, NH, NKV)
    np.testing.assert_allclose(read(out, T * NH * hs), want_out.ravel(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(read(att, NH * T * (P + T)), want_att.ravel(), rtol=0, atol=1e-6)


# decode at bf16 reads the cache as it is, 4 keys a pass (kernels/attention_cached.pyx's
# decode_scores, decode_values): key counts below, at and past a multiple of 4, heads of 64, 20
@pytest.mark.parametrize("P, hs", [(0, 64), (2, 64), (3, 20), (300, 64), (301, 20)])
@pytest.mark.parametrize("NKV", [6, 2])
def test_the_gqa_kernel_at_bf16_decode_against_float64(P, hs, NKV):
    NH = 6
    rng = np.random.default_rng(P * 10 + NKV + hs)
    q, k, v = (bf16.to_float32(bf16.to_bf16(rng.standard_normal((1, n * hs)).astype(np.float32)))
               for n in (NH, NKV, NKV))
    cached_k, cached_v = (bf16.to_float32(bf16.to_bf16(
        rng.standard_normal((P, NKV * hs)).astype(np.float32))) for _ in "kv")
    backend = get_backend("cpu", "bf16")
    out, att = backend.alloc(2 * NH * hs), backend.alloc(2 * NH * (P + 1))
    k_cache = on_backend(backend, np.concatenate([cached_k, np.zeros((1, NKV * hs))]))
    v_cache = on_backend(backend, np.concatenate([cached_v, np.zeros((1, NKV * hs))]))
    backend.call("attention_gqa_cached_forward", out, att, k_cache, v_cache,
                 on_backend(backend, q), on_backend(backend, k), on_backend(backend, v),
                 1, P, NH, NKV, hs)
    all_k, all_v = np.concatenate([cached_k, k]), np.concatenate([cached_v, v])
    want_out, want_att = cached_reference(q, all_k, all_v, P, NH, NKV)
    got_out = bf16.to_float32(out.to_numpy(np.uint16, 0, NH * hs))
    got_att = bf16.to_float32(att.to_numpy(np.uint16, 0, NH * (P + 1)))
    # each output summed in float32 and rounded once: within bf16's half ulp (2^-9 relative)
    # and float32's sums
    np.testing.assert_allclose(got_out, want_out.ravel(), rtol=2 ** -8, atol=1e-5)
    np.testing.assert_allclose(got_att, want_att.ravel(), rtol=2 ** -8, atol=1e-6)


@pytest.mark.parametrize("T, P, C", [(1, 6, 32), (1, 300, 120), (3, 0, 32), (3, 5, 32)])
def test_the_gpt2_kernel_against_float64(T, P, C):
    NH = 4
    rng = np.random.default_rng(T + P)
    inp = rng.standard_normal((T, 3 * C)).astype(np.float32)   # q, k, v side by side
    cached_k, cached_v = (rng.standard_normal((P, C)).astype(np.float32) for _ in "kv")
    backend = get_backend("cpu")
    out, att = backend.alloc(4 * T * C), backend.alloc(4 * NH * T * (P + T))
    k_cache = on_backend(backend, np.concatenate([cached_k, np.zeros((T, C))]))
    v_cache = on_backend(backend, np.concatenate([cached_v, np.zeros((T, C))]))
    backend.call("attention_cached_forward", out, att, k_cache, v_cache, on_backend(backend, inp),
                 T, P, C, NH)
    all_k = np.concatenate([cached_k, inp[:, C:2 * C]])
    all_v = np.concatenate([cached_v, inp[:, 2 * C:]])
    assert np.array_equal(read(k_cache, (P + T) * C), all_k.ravel())
    assert np.array_equal(read(v_cache, (P + T) * C), all_v.ravel())
    want_out, _ = cached_reference(inp[:, :C], all_k, all_v, P, NH, NH)
    np.testing.assert_allclose(read(out, T * C), want_out.ravel(), rtol=0, atol=1e-5)


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def model(request):
    """A random model of each architecture, its weights scaled up so that greedy text varies
    (a random model's logits are nearly flat: its argmax would repeat one token)."""
    Model, config = ARCHITECTURES[request.param]
    model = Model.random(config, seed=3)
    model.params = model.params * 6
    return model


def test_greedy_text_with_the_cache_is_the_text_without(model):
    cached = list(continue_prompt(model, PROMPT, STEPS, Sampler(0), (), cache=True))
    uncached = list(continue_prompt(model, PROMPT, STEPS, Sampler(0), (), cache=False))
    assert len(set(cached)) > 8, "a text this repetitive would not test much"
    assert cached == uncached


def test_each_cached_step_has_the_logits_of_the_whole_text(model):
    text = list(continue_prompt(model, PROMPT, 40, Sampler(0), (), cache=True))
    model.forward(np.array([PROMPT + text], dtype=np.int32))
    whole = model.logits[0, :, :V].copy()
    model.start_cache(len(PROMPT) + len(text))
    steps = [model.forward_cached(PROMPT).copy()] + [model.forward_cached([t]).copy()
                                                     for t in text]
    # A step's one-position matmuls sum in another order than the whole text's GEMMs, and the
    # fixture's weights (x6) amplify those float32 roundings: on a Zen 3 the worst step came to
    # 0.84 of 1e-5 of the largest logit with OpenBLAS's sgemv, and to 1.02 with gemv_rows.  A
    # misplaced key, position or row is off by whole units.
    for i, logits in enumerate(steps):
        expected = whole[len(PROMPT) - 1 + i]
        np.testing.assert_allclose(logits, expected, rtol=0,
                                   atol=3e-5 * np.abs(whole).max(), err_msg=f"step {i}")


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_cached_steps_at_bf16_are_the_fp32_texts_logits_within_bf16s_error(name):
    """At bf16 (weights, activations and the cache; generate.py --precision bf16, whose one
    position's matmuls read the bf16 weights in kernels/matmul_bf16's gemv_rows) each cached
    step's logits are those of the fp32 model's forward over the whole text, within the error
    bf16's roundings make, and as near them as bf16's own forward over the whole text is (the
    two round in different places, neither nearer)."""
    Model, config = ARCHITECTURES[name]
    fp32 = Model.random(config, seed=3)
    narrow = Model(config, precision="bf16", trainable=False)
    narrow.params = fp32.params
    text = [int(t) for t in np.random.default_rng(1).integers(0, V, 24)]
    tokens = np.array([PROMPT + text], dtype=np.int32)
    fp32.forward(tokens)
    want = fp32.logits[0, len(PROMPT) - 1:, :V].copy()
    narrow.forward(tokens)
    whole = narrow.logits[0, len(PROMPT) - 1:, :V].astype(np.float32)
    narrow.start_cache(tokens.shape[1])
    steps = np.array([narrow.forward_cached(PROMPT)] + [narrow.forward_cached([t]) for t in text])
    scale = np.abs(want).max()
    whole_error = np.abs(whole - want).max() / scale
    cached_error = np.abs(steps - want).max() / scale
    assert 0 < whole_error < 0.02 and 0 < cached_error < 0.02, (whole_error, cached_error)
    assert cached_error < 2 * whole_error, (whole_error, cached_error)


def test_a_prompt_longer_than_a_chunk_goes_in_chunks(monkeypatch):
    Model, config = ARCHITECTURES["llama-gqa"]
    model = Model.random(config, seed=5)
    prompt = list(np.random.default_rng(0).integers(0, V, 300))
    model.forward(np.array([prompt], dtype=np.int32))
    whole = model.logits[0, -1, :V].copy()
    assert 300 > llmc.model.CACHE_CHUNK
    model.start_cache(301)
    np.testing.assert_allclose(model.forward_cached(prompt), whole, rtol=0,
                               atol=1e-5 * np.abs(whole).max())
    assert model.kv_positions == 300


def test_a_text_past_the_cache_is_refused():
    Model, config = ARCHITECTURES["gpt2"]
    model = Model.random(config, seed=1)
    with pytest.raises(ValueError, match=r"must be in 1\.\.1024, the model's max_seq_len"):
        model.start_cache(1025)
    model.start_cache(4)
    model.forward_cached([1, 2, 3])
    with pytest.raises(ValueError, match="2 more positions after 3 do not fit the KV cache of 4"):
        model.forward_cached([4, 5])


# ----------------------------------------------------------------------------
# forward_segments: texts that share a beginning, in one forward (HellaSwag's scorer)

def per_position_losses(model, text):
    """The losses of one forward over text: position i's of predicting text[i + 1]."""
    text = np.asarray(text, dtype=np.int32)
    model.forward(text[None, :-1], text[None, 1:])
    return model.activation("losses")[0].astype(np.float64)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_texts_sharing_a_beginning_score_as_each_text_alone(name, monkeypatch):
    """Two beginnings, each continued three ways (one continuation longer than a chunk), and a
    text without one, packed as HellaSwag's scorer packs them (the beginnings' rows first, the
    scored rows after: not in the order they run) and scored in one forward: each scored
    position's loss is that of a forward over its whole text alone."""
    monkeypatch.setattr(llmc.model, "CACHE_CHUNK", 7)
    Model, config = ARCHITECTURES[name]
    model = Model.random(config, seed=3)
    rng = np.random.default_rng(4)
    tokens = lambda n: [int(t) for t in rng.integers(0, V, n)]
    texts = [(tokens(9), [tokens(5), tokens(2), tokens(16)]), (tokens(3), [tokens(4), tokens(6)]),
             ([], [tokens(6)])]
    beginnings, scored, targets, segments, want = [], [], [], [], []
    head_from = sum(len(b) for b, _ in texts)
    row = 0
    for beginning, continuations in texts:
        if beginning:
            segments.append((row, len(beginning), 0))
            beginnings += beginning
            row += len(beginning)
        for continuation in continuations:
            whole = beginning + continuation
            segments.append((head_from + len(scored), len(continuation) - 1, len(beginning)))
            scored += continuation[:-1]
            targets += continuation[1:]
            want.append(per_position_losses(model, whole)[len(beginning):])
    got = model.forward_segments(beginnings + scored, segments, head_from, targets)
    want = np.concatenate(want)
    assert got.shape == want.shape and np.abs(want).max() > 1
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    assert model.kv_positions == 0


def test_bad_segments_are_refused():
    Model, config = ARCHITECTURES["llama-gqa"]
    model = Model.random(config, seed=1)
    with pytest.raises(ValueError, match=r"segment \(4, 3, 0\): not within the 6 rows"):
        model.forward_segments(range(6), [(0, 4, 0), (4, 3, 0)], 4, [1, 2])
    with pytest.raises(ValueError, match=r"head from row 2 of 6: targets of shape \(3,\), not \(4,\)"):
        model.forward_segments(range(6), [(0, 6, 0)], 2, [1, 2, 3])
    with pytest.raises(ValueError, match=r"segment \(0, 6, 315\): its positions run past the "
                                         r"model's max_seq_len 320"):
        model.forward_segments(range(6), [(0, 6, 315)], 5, [1])


# ----------------------------------------------------------------------------
# generate.py --chat: the cache kept across turns

@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A random Llama with a byte-level BPE tokenizer (ChatML turns) beside it."""
    from tests import needs
    needs.package("tokenizers")
    needs.package("jinja2")
    from tests.hf_tokenizers import make_byte_level
    folder = tmp_path_factory.mktemp("chat")
    vocab = make_byte_level(folder, 400).get_vocab_size()
    config = dataclasses.replace(LLAMA, vocab_size=vocab, max_seq_len=256)
    model = Llama2.random(config, seed=7)
    model.params = model.params * 6
    model.save(str(folder / "model.bin"))
    return folder / "model.bin"


def run_generate(*args, stdin=""):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, os.path.join(root, "generate.py"), *map(str, args)],
                          input=stdin, capture_output=True, text=True, timeout=300)


def test_a_chat_keeps_its_cache_and_replies_as_a_fresh_generation(chat_model):
    """Two turns: the second feeds the cache only what the first left out, and each reply is
    the one a generation without a cache gives on the whole conversation rendered."""
    from llmc.tokenizer import load_tokenizer
    done = run_generate(chat_model, "--chat", "-n", 8, "--temperature", 0, "-p", "Be brief.",
                        stdin="hello there\nhow are you\n")
    assert done.returncode == 0, done.stderr
    replies = done.stdout.splitlines()
    assert len(replies) == 2
    tokenizer = load_tokenizer(str(chat_model.parent / "tokenizer.json"))
    model = Llama2.from_checkpoint(str(chat_model))
    messages = [{"role": "system", "content": "Be brief."}]
    for turn, printed in zip(("hello there", "how are you"), replies):
        messages.append({"role": "user", "content": turn})
        text = tokenizer.text_encoder(tokenizer.chat_template.render(messages,
                                                                     add_generation_prompt=True))
        fresh = list(continue_prompt(model, text, 8, Sampler(0), tokenizer.stop_tokens,
                                     cache=False))
        piece = tokenizer.stream_decoder()
        assert printed == "".join(piece(t) for t in fresh)
        messages.append({"role": "assistant", "content": tokenizer.decode(fresh)})
    turns = [line for line in done.stderr.splitlines() if "new prompt tokens" in line]
    first_new, second_new = (int(line.split()[1]) for line in turns)
    assert first_new + 8 + second_new < len(text) + 8   # the second turn reused the cache
    assert f"{len(text) + 8} of 256 positions cached" in turns[1] or \
        f"{len(text) + 7} of 256 positions cached" in turns[1]


def test_a_chat_without_a_template_is_refused_in_one_line(chat_model):
    done = run_generate(chat_model, "--chat", "--tokenizer", "gpt2", stdin="hi\n")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "generate.py: error: --chat: the tokenizer (tiktoken gpt2) has no chat template (a "
        "Hugging Face tokenizer_config.json's chat_template): give a model folder, or "
        "--tokenizer, that has one")



def test_prompts_from_a_file_are_each_generated_as_alone(chat_model, tmp_path):
    """--prompts: each line as -p would generate it, a blank line between; --ids and why it
    stopped on stderr."""
    (tmp_path / "prompts.txt").write_text("the quick\\nbrown\nseven wizards\n")
    flags = ["-n", 5, "--temperature", 0, "--ids"]
    both = run_generate(chat_model, "--prompts", tmp_path / "prompts.txt", *flags)
    assert both.returncode == 0, both.stderr
    alone = [run_generate(chat_model, "-p", text, *flags) for text in ("the quick\nbrown",
                                                                       "seven wizards")]
    assert both.stdout == alone[0].stdout + "\n" + alone[1].stdout
    assert both.stderr.count("stopped at -n 5: 5 tokens") == 2
    ids = [line for line in both.stderr.splitlines() if line.startswith("token ids: prompt [")]
    assert len(ids) == 2 and all(line.count(",") >= 5 for line in ids)
