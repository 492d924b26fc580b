"""
train_gpt2_torch.py, the PyTorch reference: a run writes files that read back with the right
config, its gradients agree with finite differences (so the parameter-vector mapping is
right), its losses go down, and the committed fixture is what the reference computes.
"""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import needs

torch = needs.package("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_gpt2_torch as ref  # noqa: E402
from llmc.formats import param_views  # noqa: E402
from llmc.formats.llmc import read_checkpoint, read_debug_state  # noqa: E402
from train_gpt2 import GPT2Config  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# a d2 with odd sizes: V=61 padded to Vp=128, C=12, NH=3, maxT=9; batch B=3, T=5
TINY_ARGS = ["-e", "d2", "--vocab-size", "61", "--channels", "12", "--heads", "3",
             "--max-seq-len", "9", "-b", "3", "-t", "5", "--seed", "7"]
TINY = GPT2Config(max_seq_len=9, vocab_size=61, padded_vocab_size=128, num_layers=2,
                  num_heads=3, channels=12)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: threads only cost here, and the machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One command-line run of the reference on the tiny d2, in a temporary directory."""
    out = tmp_path_factory.mktemp("reference")
    ref.main(TINY_ARGS + ["-o", str(out), "--name", "tiny"])
    return out


def test_run_writes_files_that_read_back(run):
    config, params = read_checkpoint(run / "tiny.bin", GPT2Config)
    assert config == TINY
    views = param_views(config, params)
    assert np.all(views["wte"][config.vocab_size:] == 0)  # llm.c's zero padding
    assert np.all(views["ln1w"] == 1) and np.all(views["qkvb"] == 0)
    assert abs(views["qkvw"].std() - 0.02) < 0.004
    assert abs(views["fcprojw"].std() - 0.02 / math.sqrt(2 * 2)) < 0.002

    config_bf16, params_bf16 = read_checkpoint(run / "tiny_bf16.bin", GPT2Config)
    assert config_bf16 == TINY
    np.testing.assert_allclose(params_bf16, params, rtol=2.0**-8, atol=0)

    state = read_debug_state(run / "tiny_debug_state.bin", config)
    assert state.x.shape == (3, 5) and state.logits.shape == (3, 5, 61)
    np.testing.assert_array_equal(state.x[:, 1:], state.y[:, :-1])  # y is x shifted by one
    grads = param_views(config, state.grads)
    assert np.all(grads["wte"][config.vocab_size:] == 0)
    assert np.all(grads["wpe"][5:] == 0)  # positions beyond T get no gradient
    assert np.all(grads["wpe"][:5] != 0)

    record = json.loads((run / "tiny_debug_state.losses.json").read_text())
    losses = record.pop("losses")
    assert record == {"lr": 1e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                      "weight_decay": 0.01, "decay": "all"}
    assert len(losses) == 10
    assert abs(losses[0] - state.loss) < 1e-6
    assert abs(losses[0] - math.log(61)) < 0.1  # a fresh init guesses uniformly
    assert all(later < earlier for earlier, later in zip(losses, losses[1:]))


def test_debug_state_matches_the_reference_functions(run):
    config, params = read_checkpoint(run / "tiny.bin", GPT2Config)
    state = read_debug_state(run / "tiny_debug_state.bin", config)
    logits, loss, grads = ref.reference_forward_backward(config, params, state.x, state.y)
    np.testing.assert_array_equal(logits, state.logits)
    np.testing.assert_array_equal(grads, state.grads)
    # the loss is the mean cross-entropy of the logits
    z = state.logits.astype(np.float64)
    logsumexp = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    picked = np.take_along_axis(z, state.y[..., None].astype(np.int64), -1)[..., 0]
    assert abs((logsumexp - picked).mean() - loss) < 1e-5


def loss64(config, params, x, y):
    model = ref.build_model(config, params).double()
    _, loss = model(torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)))
    return loss.item()


def test_gradients_match_finite_differences(run):
    config, params = read_checkpoint(run / "tiny.bin", GPT2Config)
    state = read_debug_state(run / "tiny_debug_state.bin", config)
    views = param_views(config, params)
    offsets = np.cumsum([0] + [int(np.prod(s)) for _, s in config.param_shapes()])
    offset = dict(zip((name for name, _ in config.param_shapes()), offsets))
    C = config.channels
    # one entry with a large gradient in a few tensors, plus an embedding row x uses
    picks = [offset["wte"] + int(state.x[0, 0]) * C + 3]
    for name in ("wpe", "qkvw", "attprojb", "fcprojw", "ln2w", "lnfb"):
        size = views[name].size
        picks.append(offset[name] + int(np.argmax(np.abs(state.grads[offset[name]:][:size]))))
    eps = 1e-3
    for i in picks:
        plus, minus = params.copy(), params.copy()
        plus[i] += eps
        minus[i] -= eps
        step = float(plus[i]) - float(minus[i])  # what float32 made of the +-eps
        numeric = (loss64(config, plus, state.x, state.y)
                   - loss64(config, minus, state.x, state.y)) / step
        assert abs(numeric - state.grads[i]) <= 1e-3 * abs(numeric) + 1e-6, (i, numeric,
                                                                              state.grads[i])


def test_vector_to_module_and_back_is_exact():
    params = ref.init_params(TINY, seed=3)
    np.testing.assert_array_equal(ref.llmc_vector(ref.build_model(TINY, params)), params)
    # and the module's tensors sit where llm.c's names say
    model = ref.build_model(TINY, params)
    views = param_views(TINY, params)
    np.testing.assert_array_equal(model.transformer.h[1].attn.c_attn.weight.detach().numpy(),
                                  views["qkvw"][1])
    np.testing.assert_array_equal(model.transformer.h[0].mlp.c_proj.weight.detach().numpy(),
                                  views["fcprojw"][0])
    np.testing.assert_array_equal(model.lm_head.weight.detach().numpy(),
                                  views["wte"][:TINY.vocab_size])


def test_init_is_deterministic():
    np.testing.assert_array_equal(ref.init_params(TINY, seed=5), ref.init_params(TINY, seed=5))
    assert not np.array_equal(ref.init_params(TINY, seed=5), ref.init_params(TINY, seed=6))


def test_fixture_is_what_the_reference_computes():
    config, params = read_checkpoint(FIXTURES / "gpt2_tiny.bin", GPT2Config)
    assert config == GPT2Config(max_seq_len=16, vocab_size=50257, padded_vocab_size=50304,
                                num_layers=2, num_heads=2, channels=8)
    state = read_debug_state(FIXTURES / "gpt2_tiny_debug_state.bin", config)
    assert state.x.shape == (2, 3)
    logits, loss, grads = ref.reference_forward_backward(config, params, state.x, state.y)
    np.testing.assert_allclose(logits, state.logits, rtol=0, atol=1e-5)
    assert abs(loss - state.loss) < 1e-5
    np.testing.assert_allclose(grads, state.grads, rtol=1e-4, atol=1e-7)
    record = json.loads((FIXTURES / "gpt2_tiny_debug_state.losses.json").read_text())
    losses = ref.reference_losses(config, params, state.x, state.y)
    np.testing.assert_allclose(losses, record["losses"], rtol=0, atol=1e-5)
    assert all(later < earlier for earlier, later in zip(losses, losses[1:]))


def test_command_line_errors(capsys):
    with pytest.raises(SystemExit) as info:
        ref.main(["--help"])
    assert info.value.code == 0
    assert "--input-text" in capsys.readouterr().out
    for argv in (["-e", "x12"], ["-e", "d0"], ["-e", "d2", "-t", "2000"],
                 ["-e", "d2", "--channels", "10", "--heads", "3"],
                 ["-e", "gpt2", "--vocab-size", "10"], ["-b", "0"]):
        with pytest.raises(SystemExit) as info:
            ref.main(argv)
        assert info.value.code == 2, argv


def test_pretrained_without_transformers_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(SystemExit) as info:
        ref.pretrained_params("gpt2")
    message = str(info.value.code)
    assert "transformers" in message and "internet" in message and "\n" not in message
