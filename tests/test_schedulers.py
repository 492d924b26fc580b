"""llmc/schedulers.py's cosine-restarts: llama.cpp's cosine decay with warm restarts, checked
against its formula written out cycle by cycle."""
import math

import pytest

from llmc.schedulers import get_scheduler

LR, FINAL_FRAC = 1e-3, 0.1


def restarts_formula(step, warmup, decay_steps, mult):
    """lr at step from the cycles laid end to end: cycle i is lengths[i] steps long and its
    last step is at the minimum; the first step after warmup is at the maximum."""
    if step < warmup:
        return LR * (step + 1) / warmup
    u = step - warmup
    if u == 0:
        return LR
    start, length = 0, decay_steps   # cycle i covers steps (start, start + length]
    while u > start + length:
        start, length = start + length, math.floor(mult * length)
    coeff = 0.5 * (1 + math.cos(math.pi * (u - start) / length))
    return LR * FINAL_FRAC + coeff * (LR - LR * FINAL_FRAC)


@pytest.mark.parametrize("warmup, decay_steps, mult", [(0, 10, 1.0), (5, 10, 1.5), (3, 7, 1.1)])
def test_cosine_restarts_follows_llama_cpp_formula(warmup, decay_steps, mult):
    schedule = get_scheduler("cosine-restarts", LR, warmup, 200, FINAL_FRAC,
                             decay_steps=decay_steps, restart_mult=mult)
    for step in range(200):
        assert schedule.get_learning_rate(step) == pytest.approx(
            restarts_formula(step, warmup, decay_steps, mult), rel=1e-12, abs=1e-18), step


def test_cosine_restarts_landmarks():
    schedule = get_scheduler("cosine-restarts", LR, 5, 100, FINAL_FRAC, decay_steps=10,
                             restart_mult=1.5)
    lr = schedule.get_learning_rate
    assert lr(0) == LR / 5 and lr(4) == LR                      # warmup
    assert lr(5) == LR                                           # the first cycle's top
    assert lr(15) == pytest.approx(LR * FINAL_FRAC)              # its end: the minimum
    assert lr(16) == pytest.approx(LR * FINAL_FRAC + 0.5 * (1 + math.cos(math.pi / 15)) * 0.9 * LR)
    assert lr(30) == pytest.approx(LR * FINAL_FRAC)              # the second cycle: 15 steps
    assert lr(31) > 0.99 * LR                                    # restarted near the top
    assert lr(52) == pytest.approx(LR * FINAL_FRAC)              # the third: int(22.5) = 22


def test_cosine_restarts_rejects_bad_cycles():
    with pytest.raises(ValueError, match="decay_steps >= 1"):
        get_scheduler("cosine-restarts", LR, 0, 10, 0.1, decay_steps=0)
    with pytest.raises(ValueError, match="restart_mult >= 1"):
        get_scheduler("cosine-restarts", LR, 0, 10, 0.1, restart_mult=0.5)
