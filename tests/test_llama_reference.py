"""
train_llama2_torch.py with train_llama2.pyx's configs, the PyTorch reference for Llama 2: the
presets' sizes and parameter counts (the big ones counted on PyTorch's meta device, nothing
allocated), gradients against finite differences in float64 (so the flat-vector mapping and
the tied classifier are right), attention and RoPE against independent formulations, and a
command-line run whose files read back.
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
import train_llama2_torch as ref  # noqa: E402
from llmc.formats import FormatError, param_views  # noqa: E402
from llmc.formats.llama2c import read_llama_model  # noqa: E402
from llmc.formats.llmc import read_debug_state  # noqa: E402
from llmc.rope_tables import rope_tables  # noqa: E402
from train_llama2 import PRESETS, LlamaConfig, llama2c_hidden_dim  # noqa: E402

# name: (hidden_dim, parameters); the counts of llama2.c's, TinyLlama's and Meta's models
PRESET_SIZES = {
    "stories15M": (768, 15_191_712),
    "stories42M": (1376, 41_689_600),
    "stories110M": (2048, 109_529_856),
    "llama-1b": (5632, 1_100_048_384),
    "llama-7b": (11008, 6_738_415_616),
}

# tiny models with odd sizes: GQA (6 heads on 2 kv heads), a separate classifier; and
# multi-query attention with the classifier tied to the embedding
TINY_GQA = LlamaConfig(dim=24, n_layers=2, n_heads=6, n_kv_heads=2, vocab_size=37,
                       hidden_dim=40, max_seq_len=9, shared_classifier=False)
TINY_MQA = LlamaConfig(dim=16, n_layers=1, n_heads=4, n_kv_heads=1, vocab_size=29,
                       hidden_dim=48, max_seq_len=9, shared_classifier=True)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: threads only cost here, and the machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", PRESET_SIZES)
def test_preset_sizes_and_torch_shapes(name):
    config = PRESETS[name]
    hidden_dim, count = PRESET_SIZES[name]
    assert config.hidden_dim == hidden_dim
    assert config.num_parameters() == count
    with torch.device("meta"):
        model = ref.Transformer(config)
    assert sum(p.numel() for p in model.parameters()) == count  # a tied head counts once
    tensors = dict(model.named_parameters())
    for flat_name, shape in config.param_shapes():
        torch_name = ref.FLAT_TO_TORCH[flat_name]
        if "{}" in torch_name:
            assert all(tuple(tensors[torch_name.format(l)].shape) == shape[1:]
                       for l in range(config.n_layers)) and shape[0] == config.n_layers
        else:
            assert tuple(tensors[torch_name].shape) == shape


def test_llama2c_hidden_dim_and_depths():
    assert [llama2c_hidden_dim(d) for d in (288, 512, 768)] == [768, 1376, 2048]
    assert llama2c_hidden_dim(4096, multiple_of=256) == 11008  # Meta's 7B
    d1, d2, d3, d4 = (LlamaConfig.from_name(f"d{n}") for n in (1, 2, 3, 4))
    assert (d1.n_heads, d1.n_kv_heads, d2.n_kv_heads, d3.n_kv_heads, d4.n_kv_heads) == (1, 1, 1, 1, 2)
    assert d4.dim == 256 and d4.head_size == 64 and d4.n_layers == 4
    for bad in ("d0", "gpt2", "stories"):
        with pytest.raises(ValueError):
            LlamaConfig.from_name(bad)
    with pytest.raises(ValueError, match="does not divide"):
        LlamaConfig.from_name("d4", n_kv_heads=3)
    with pytest.raises(ValueError, match="odd"):
        LlamaConfig.from_name("d2", dim=6, n_heads=2)


# Meta's state_dict names of each flat tensor, written out here rather than taken from the
# reference, so that a mix-up in its mapping shows as wrong gradients
META_NAMES = {"tok_embeddings": "tok_embeddings.weight", "norm": "norm.weight",
              "output": "output.weight", "attention_norm": "layers.{}.attention_norm.weight",
              "ffn_norm": "layers.{}.ffn_norm.weight",
              **{w: f"layers.{{}}.attention.{w}.weight" for w in ("wq", "wk", "wv", "wo")},
              **{w: f"layers.{{}}.feed_forward.{w}.weight" for w in ("w1", "w2", "w3")}}


def load_flat(model, flat):
    """Copy the flat vector (any float dtype) into the model."""
    views = param_views(model.config, flat)
    tensors = dict(model.named_parameters())
    with torch.no_grad():
        for name, _ in model.config.param_shapes():
            value = torch.from_numpy(views[name].copy())
            if "{}" in META_NAMES[name]:
                for l in range(model.config.n_layers):
                    tensors[META_NAMES[name].format(l)].copy_(value[l])
            else:
                tensors[META_NAMES[name]].copy_(value)


@pytest.mark.parametrize("config", [TINY_GQA, TINY_MQA], ids=["gqa", "mqa_tied"])
def test_gradients_match_finite_differences(config):
    rng = np.random.default_rng(3)
    params = ref.init_params(config, seed=5)
    params += 0.1 * rng.standard_normal(params.size).astype(np.float32)  # norms away from 1
    x, y = ref.make_batch(config, 3, 7, seed=4)
    logits, loss, grads = ref.reference_forward_backward(config, params, x, y)
    assert logits.shape == (3, 7, config.vocab_size) and grads.shape == params.shape

    model = ref.Transformer(config).double()
    tokens_x, tokens_y = torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))

    def loss_of(flat):
        load_flat(model, flat)
        with torch.no_grad():
            return model(tokens_x, tokens_y)[1].item()

    flat = params.astype(np.float64)
    assert abs(loss_of(flat) - loss) < 1e-5
    h = 1e-6
    views = param_views(config, np.arange(params.size))
    for name, _ in config.param_shapes():  # a few entries of every tensor
        for i in rng.choice(views[name].reshape(-1), size=4, replace=False):
            up, down = flat.copy(), flat.copy()
            up[i] += h
            down[i] -= h
            numeric = (loss_of(up) - loss_of(down)) / (2 * h)
            assert abs(grads[i] - numeric) <= 1e-4 * max(1.0, abs(numeric)), (name, i)


def test_attention_and_rope_match_independent_formulations():
    # Meta's complex-number RoPE and PyTorch's fused GQA attention
    config = TINY_GQA
    torch.manual_seed(0)
    attention = ref.Attention(config)
    B, T, NH, NKV, hs = 2, 7, config.n_heads, config.n_kv_heads, config.head_size
    x = torch.randn(B, T, config.dim)
    cos, sin = (torch.from_numpy(table) for table in rope_tables(T, hs, config.rope_theta))
    freqs_cis = torch.polar(torch.ones(T, hs // 2), torch.atan2(sin, cos))

    def rope_complex(t):
        t_complex = torch.view_as_complex(t.reshape(t.shape[:-1] + (-1, 2)))
        return torch.view_as_real(t_complex * freqs_cis[None, :, None, :]).flatten(3)

    with torch.no_grad():
        q = rope_complex(attention.wq(x).view(B, T, NH, hs)).transpose(1, 2)
        k = rope_complex(attention.wk(x).view(B, T, NKV, hs)).transpose(1, 2)
        v = attention.wv(x).view(B, T, NKV, hs).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             enable_gqa=True)
        y = y.transpose(1, 2).reshape(B, T, NH * hs)
        torch.testing.assert_close(attention(x, cos, sin), attention.wo(y), rtol=1e-5, atol=1e-6)


def test_init_is_llama2c():
    config = LlamaConfig.from_name("d2", vocab_size=61)
    views = param_views(config, ref.init_params(config, seed=1))
    for name in ("attention_norm", "ffn_norm", "norm"):
        assert np.all(views[name] == 1)
    assert abs(views["wq"].std() - 0.02) < 0.002 and abs(views["w2"].std() - 0.02) < 0.002
    for name in ("wo", "w3"):  # scaled by 1/sqrt(2L), as llama2.c does
        assert abs(views[name].std() - 0.02 / math.sqrt(4)) < 0.001
    assert "output" not in views  # stories-style shared classifier


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One command-line run on a tiny GQA model with a separate classifier."""
    out = tmp_path_factory.mktemp("llama_reference")
    ref.main(["-e", "d2", "--vocab-size", "61", "--dim", "24", "--heads", "6", "--kv-heads", "2",
              "--max-seq-len", "9", "--no-shared-classifier", "-b", "3", "-t", "5", "--seed", "7",
              "-o", str(out), "--name", "tiny"])
    return out


def test_run_writes_files_that_read_back(run):
    config, params = read_llama_model(run / "tiny.bin", LlamaConfig)
    assert config == LlamaConfig(dim=24, n_layers=2, n_heads=6, n_kv_heads=2, vocab_size=61,
                                 hidden_dim=llama2c_hidden_dim(24), max_seq_len=9,
                                 shared_classifier=False)
    np.testing.assert_array_equal(params, ref.init_params(config, seed=7))
    state = read_debug_state(run / "tiny_debug_state.bin", config)
    x, y = ref.make_batch(config, 3, 5, seed=7)
    np.testing.assert_array_equal(state.x, x)
    np.testing.assert_array_equal(state.y, y)
    logits, loss, grads = ref.reference_forward_backward(config, params, x, y)
    np.testing.assert_array_equal(state.logits, logits)
    assert state.loss == np.float32(loss) and abs(loss - math.log(61)) < 0.2
    np.testing.assert_array_equal(state.grads, grads)
    record = json.loads((run / "tiny_debug_state.losses.json").read_text())
    assert record["lr"] == 1e-4 and record["beta2"] == 0.999 and record["weight_decay"] == 0.01
    assert len(record["losses"]) == 10 and record["losses"][0] == pytest.approx(loss, abs=1e-6)
    assert all(b < a for a, b in zip(record["losses"], record["losses"][1:]))


def test_read_model_rejects_other_files(run, tmp_path):
    with pytest.raises(FormatError, match="not a llama2.c model"):
        read_llama_model(run / "tiny_debug_state.bin", LlamaConfig)
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes((run / "tiny.bin").read_bytes()[:-4])
    with pytest.raises(FormatError, match="truncated: expected"):
        read_llama_model(truncated, LlamaConfig)
    with pytest.raises(FormatError, match="no such file"):
        read_llama_model(tmp_path / "missing.bin", LlamaConfig)


@pytest.mark.parametrize("argv,message", [
    (["-e", "d4", "--kv-heads", "3"], "does not divide"),
    (["-e", "stories15M", "-t", "300"], "exceeds max_seq_len"),
    (["-e", "llama-3b"], "neither dN"),
    (["-e", "d2", "--dim", "0"], "must be positive"),
])
def test_bad_arguments_exit(argv, message, capsys):
    with pytest.raises(SystemExit):
        ref.parse_args(argv)
    assert message in capsys.readouterr().err
