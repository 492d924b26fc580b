"""
llmc/sampler.py against llm.c's C definitions: random_u32 (xorshift* on a 64-bit state),
random_f32 (its top 24 bits / 2^24) and sample_mult (first index whose float32 running sum of
probabilities exceeds the coin); and llmc/schedulers.py's cosine learning rate schedule.
"""
import numpy as np
import pytest

from llmc.sampler import XorShift, sample_mult
from llmc.schedulers import get_scheduler

# from the C definitions, seed 1337 (what llm.c's trainer samples with)
U32_1337 = [989205090, 818269915, 1335155955, 3876892996, 2941700015]
F32_1337 = [0.23031723499298096, 0.19051826000213623, 0.3108651638031006,
            0.9026594758033752, 0.6849178671836853]


def test_random_u32_known_values():
    rng = XorShift(1337)
    assert [rng.random_u32() for _ in range(5)] == U32_1337
    assert rng.state == 12737515200271808181


def test_random_u32_by_hand():
    # one step worked through: s ^= s>>12; s ^= s<<25; s ^= s>>27; (s * M) >> 32, mod 2^64
    s = 1
    s ^= s >> 12               # 1
    s ^= (s << 25) % 2**64     # 1 + 2^25
    s ^= s >> 27               # unchanged: both bits are below 2^27
    assert s == 33554433
    assert XorShift(1).random_u32() == (s * 0x2545F4914F6CDD1D % 2**64) >> 32


def test_random_f32_known_values():
    rng = XorShift(1337)
    values = [rng.random_f32() for _ in range(5)]
    assert all(isinstance(v, np.float32) for v in values)
    assert [float(v) for v in values] == F32_1337
    assert [float(v) for v in values] == [(u >> 8) / 2**24 for u in U32_1337]


def test_sample_mult():
    probs = np.array([0.1, 0.2, 0.3, 0.15, 0.25], dtype=np.float32)
    cdf = np.cumsum(probs, dtype=np.float32)
    assert sample_mult(probs, np.float32(0.0)) == 0
    assert sample_mult(probs, np.float32(0.05)) == 0
    assert sample_mult(probs, cdf[0]) == 1       # coin < cdf is strict
    assert sample_mult(probs, np.float32(0.35)) == 2
    assert sample_mult(probs, np.float32(0.99)) == 4
    # rounding can leave the sum below the coin: the last index, as llm.c
    assert sample_mult(np.array([0.25, 0.25], dtype=np.float32), np.float32(0.75)) == 1
    # zero-probability entries are never drawn
    assert sample_mult(np.array([0.0, 0.5, 0.0, 0.5], dtype=np.float32), np.float32(0.5)) == 3


def test_sample_mult_matches_c_loop():
    rng = np.random.default_rng(0)
    probs = rng.random(1000).astype(np.float32)
    probs /= probs.sum(dtype=np.float32)
    coins = XorShift(1337)
    for _ in range(200):
        coin = coins.random_f32()
        cdf, expected = np.float32(0.0), len(probs) - 1
        for i, p in enumerate(probs):  # llm.c's loop, in float32
            cdf = np.float32(cdf + p)
            if coin < cdf:
                expected = i
                break
        assert sample_mult(probs, coin) == expected


def test_learning_rate_schedule():
    lr = 1e-3

    def get_learning_rate(step, warmup, num_steps, final_frac):
        return get_scheduler("cosine", lr, warmup, num_steps, final_frac).get_learning_rate(step)
    # warmup: linear from lr/warmup to lr
    assert get_learning_rate(0, 10, 100, 0.1) == lr / 10
    assert get_learning_rate(9, 10, 100, 0.1) == lr
    # then cosine from lr down to lr * final fraction at the last step
    assert abs(get_learning_rate(10, 10, 100, 0.1) - lr) < 1e-15
    assert abs(get_learning_rate(55, 10, 100, 0.1) - 0.55 * lr) < 1e-12
    assert abs(get_learning_rate(100, 10, 100, 0.1) - 0.1 * lr) < 1e-15
    # final fraction 1: constant
    assert all(get_learning_rate(s, 0, 40, 1.0) == lr for s in range(40))


def test_unknown_scheduler():
    with pytest.raises(ValueError, match="unknown learning rate scheduler 'wsd'"):
        get_scheduler("wsd", 1e-3, 0, 10, 1.0)
