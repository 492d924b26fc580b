"""
Training at bf16 without float32 master weights (Model(master_weights=False), train.py -w 0;
llm.c's use_master_weights 0): AdamW updates the bf16 parameters themselves, each read widened
and its new value rounded stochastically as the update with master weights rounds it.  The
kernel is that update with the master weights being the bf16 ones, bit for bit; a model trains
as closely to the master-weight run as stochastic rounding allows, in 4 bytes a parameter less;
what cannot train so says so in one line.
"""
import numpy as np
import pytest

from accel.backend import BackendError, get_backend
from kernels import adamw
from kernels.bf16 import to_bf16, to_float32
from llmc.dry_run import memory_plan
from test_bf16_grads import batch, train
from train_gpt2 import GPT2, GPT2Config

CONFIG = GPT2Config.from_depth(2, max_seq_len=32, vocab_size=97)


@pytest.mark.parametrize("grads_bf16", [False, True])
def test_the_update_is_the_master_weight_update_from_the_bf16_values(grads_bf16):
    rng = np.random.default_rng(0)
    n = 10_001
    params = to_bf16(rng.standard_normal(n).astype(np.float32))
    m = rng.standard_normal(n).astype(np.float32) * 1e-3
    v = rng.random(n).astype(np.float32) * 1e-6
    grads = rng.standard_normal(n).astype(np.float32) * 1e-2
    if grads_bf16:
        grads = to_bf16(grads)
    settings = (1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0, 7)
    master, rounded = to_float32(params), np.empty(n, np.uint16)
    m1, v1, m2, v2 = m.copy(), v.copy(), m.copy(), v.copy()
    adamw.update_rounded(rounded, master, m1, v1, grads, *settings, first=5)
    narrow = params.copy()
    adamw.update_narrow(narrow, m2, v2, grads, *settings, first=5)
    assert np.array_equal(narrow, rounded)
    assert np.array_equal(m1, m2) and np.array_equal(v1, v2)
    assert np.count_nonzero(narrow != params) > n // 4   # updates of a fraction of an ulp land




@pytest.mark.parametrize("grad_precision", ["fp32", "bf16"])
def test_training_without_master_weights_tracks_the_run_with_them(grad_precision):
    with_master = GPT2.random(CONFIG, seed=3, precision="bf16", grad_precision=grad_precision)
    without = GPT2.random(CONFIG, seed=3, precision="bf16", grad_precision=grad_precision,
                          master_weights=False)
    assert with_master.master_weights and not without.master_weights
    expected, got = train(with_master, 10, batch(97)), train(without, 10, batch(97))
    assert expected[-1] < expected[0] - 1.0
    assert np.allclose(got, expected, rtol=0, atol=0.05), (got, expected)
    # its parameters are the bf16 ones alone, 2 bytes each, and params widens them
    memory = without.memory()
    assert memory["params"] == 2 * without.num_parameters
    assert memory["params"] == with_master.memory()["params"] - 4 * without.num_parameters
    assert np.array_equal(without.params, without.params_as_run())
    B, T = batch(97)[0].shape
    assert memory_plan(GPT2, CONFIG, B, T, precision="bf16", grad_precision=grad_precision,
                       master_weights=False) == memory


def test_check_cpu_is_clean_without_master_weights():
    model = GPT2.random(CONFIG, seed=3, backend="check:cpu", precision="bf16",
                        master_weights=False)
    train(model, 2, batch(97))
    assert model.backend.report()["mismatches"] == 0, model.backend.summary()


def test_what_cannot_train_without_master_weights_says_so_in_one_line():
    for precision, why in (("fp32", "has none"), ("fp16", "rounds to nearest")):
        with pytest.raises(ValueError, match=f"needs bf16, whose updates round stochastically "
                                             f"\\({precision} {why}\\)"):
            GPT2(CONFIG, precision=precision, master_weights=False)
    without_group = get_backend("cpu", "bf16")._with_groups(("linear", "gpt2", "mixed"))
    with pytest.raises(BackendError, match="has no no_master kernels, which the gpt2 family"):
        GPT2(CONFIG, backend=without_group, master_weights=False)
    GPT2(CONFIG, backend=without_group, master_weights=False, trainable=False)   # no update
