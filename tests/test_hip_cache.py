"""accel/hip's cache group (accel/hip/cache.hip): generation's attention over a KV cache, on the
CPU emulator.

test_hip.py and test_hip_bf16.py run its two entries with every other (check:hip-emu at odd
shapes under every schedule and warp size, and against the CPU's bf16 table), and
test_check_tolerance.py at d12's widths; here: the entries where each loop of the kernels takes
several turns (more keys than a block has threads, a head wider than the block, more new
elements than a grid of one compute unit has threads; a decoding step T = 1 among them), and
generation itself: greedy text with the cache on hip-emu is the CPU's, token for token, for
GPT-2 and a grouped-query Llama, and check:hip-emu finds every cached call within tolerance, at
fp32 and bf16; and HellaSwag's scores over the cache (segments at offsets into the device's
buffers) are the CPU's.
"""
import numpy as np
import pytest

from accel import instrument
from accel.backend import get_backend
from accel.hip import EMU_LIBRARY
from accel.spec import entries_of
from entries import SMALL, run_every_entry
from hip_emu import checked, finish, make, SCHEDULES, WARP_SIZES
from llmc.sampler import Sampler, continue_prompt
from train_gpt2 import GPT2, GPT2Config
from train_llama2 import Llama2, LlamaConfig

CACHE = set(entries_of(("cache",)))
# past the 256 threads of a block: the keys (P + T > 256, at a chunk of T = 3 and a decoding step
# T = 1), the channels of a head (hs = 260; 2 query heads on 1 key/value head); and past the 2,048
# threads of a grid on one compute unit, the new rows' elements (T = 9 rows of 520 and of 260)
LOOPS = [dict(SMALL, T=3, P=300), dict(SMALL, T=1, P=300),
         dict(SMALL, T=9, P=5, C=520, NH=2, NKV=1, hs=260)]
V = 97
PROMPT = [5, 17, 3, 60, 42]
STEPS = 24
MODELS = {
    "gpt2": (GPT2, GPT2Config.from_name("d2", vocab_size=V)),
    "llama-gqa": (Llama2, LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=V, hidden_dim=96,
                                      max_seq_len=64)),
}


@pytest.fixture(scope="module")
def builds():
    finish(make("emu"))


@pytest.mark.parametrize("warp_size", WARP_SIZES)
def test_the_cache_entries_where_their_loops_wrap(builds, warp_size):
    for dims in LOOPS:
        for schedule in (SCHEDULES[0], SCHEDULES[-1]):
            backend = checked(EMU_LIBRARY, schedule, warp_size, compute_units=1)
            run_every_entry(backend, dims=dims, groups=("cache",))
            report = backend.report()
            assert report["mismatches"] == 0, (dims, schedule, warp_size, backend.summary())
            assert all(report["entries"][name]["compared"] > 0 for name in CACHE)


def generate(family, backend, scale=6):
    """Greedy text after PROMPT with the KV cache on backend, from the same random model on every
    backend, its weights scaled (by 6: the text varies, tests/test_kv_cache.py)."""
    Model, config = MODELS[family]
    model = Model.random(config, seed=3, backend=backend)
    model.params = model.params * scale
    assert model.has_kv_cache
    return list(continue_prompt(model, PROMPT, STEPS, Sampler(0), (), cache=True))


@pytest.mark.parametrize("family", sorted(MODELS))
def test_cached_generation_on_hip_is_the_cpus(builds, family):
    text = generate(family, get_backend("hip-emu"))
    assert len(set(text)) > 4, "a text this repetitive would not test much"
    assert text == generate(family, get_backend("cpu"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_check_finds_every_cached_call_within_tolerance(builds, family, precision):
    """The model's own weights: scaled by 6, its scores and logits are large enough that softmax
    amplifies float32's reordering past check:'s error model, on the CPU as on the device (seen:
    the cached attention, the classifier and LayerNorm named, and flash attention without the
    cache)."""
    backend = instrument.create("check", get_backend("hip-emu", precision))
    generate(family, backend, scale=1)
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    form = "attention_cached_forward" if family == "gpt2" else "attention_gqa_cached_forward"
    layers = 2   # both models': one call per layer for the prompt and for each token after it
    assert report["entries"][form]["calls"] == layers * STEPS, report["entries"][form]
    assert report["entries"][form]["compared"] > 0


@pytest.mark.parametrize("family", sorted(MODELS))
def test_scores_over_the_cache_on_hip_are_the_cpus(builds, family):
    """HellaSwag's scorer packs examples into one row of segments (Model.forward_segments): on
    hip-emu each segment's rows are offsets into device buffers, and every completion's loss is
    the CPU's within float32's reordering."""
    from llmc import evalloader
    from llmc.formats.llmc import EvalExample
    rng = np.random.default_rng(0)
    examples = [EvalExample(context=rng.integers(0, V, 12), label=0,
                            completions=[rng.integers(0, V, n) for n in (3, 7, 5, 9)])
                for _ in range(3)]
    Model, config = MODELS[family]
    losses = []
    for backend in ("hip-emu", "cpu"):
        model = Model.random(config, seed=3, backend=get_backend(backend))
        assert model.has_kv_cache
        losses.append(evalloader.completion_losses(model, examples, 4))
    np.testing.assert_allclose(losses[0], losses[1], rtol=0, atol=1e-5)
