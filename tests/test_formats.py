"""
llmc/formats/llmc.py: llm.c's file formats, and what llmc/formats shares. Round trips of every
format, byte-for-byte equality with the files llm.c's own train_gpt2.py writes (rebuilt here
independently from its layout), the training state in train_gpt2.cu's layout, bf16 rounding
against torch, one-line FormatErrors for every kind of bad file, atomic writes.
"""
import errno
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import needs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llmc.formats import (FormatError, atomic_write, bfloat16_bits_to_float32,  # noqa: E402
                          float32_to_bfloat16_bits, param_views)
from llmc.formats.llmc import (read_checkpoint, read_debug_state, read_shard,  # noqa: E402
                               read_state, read_tokenizer, read_training_state,
                               write_checkpoint, write_debug_state, write_shard, write_state,
                               write_tokenizer)
from train_gpt2 import GPT2Config  # noqa: E402

# a small model with odd sizes: V=13 padded to Vp=128, C=6, NH=3, maxT=7
CONFIG = GPT2Config(max_seq_len=7, vocab_size=13, padded_vocab_size=128, num_layers=2,
                    num_heads=3, channels=6)


def random_params(config, seed=0):
    params = np.random.default_rng(seed).standard_normal(config.num_parameters()).astype(np.float32)
    param_views(config, params)["wte"][config.vocab_size:] = 0.0  # llm.c pads with zeros
    return params


def header(*values):
    h = np.zeros(256, dtype="<i4")
    h[:len(values)] = values
    return h.tobytes()


def assert_format_error(path, match, read, *args):
    with pytest.raises(FormatError) as info:
        read(path, *args)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message
    assert match in message, message
    return message


# ----------------------------------------------------------------------------
# config

def test_config_from_depth_llmc_sizes():
    d12 = GPT2Config.from_depth(12)
    assert (d12.max_seq_len, d12.vocab_size, d12.padded_vocab_size) == (1024, 50257, 50304)
    assert (d12.num_layers, d12.num_heads, d12.channels) == (12, 12, 768)
    assert d12.num_parameters() == 124475904  # what llm.c's train_gpt2.c prints for GPT-2 124M
    sizes = {d: (GPT2Config.from_depth(d).channels, GPT2Config.from_depth(d).num_heads)
             for d in (6, 24, 36, 48, 1, 3)}
    assert sizes == {6: (384, 6), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25),
                     1: (64, 1), 3: (192, 3)}
    tiny = GPT2Config.from_depth(2, max_seq_len=9, vocab_size=129)
    assert tiny.padded_vocab_size == 256 and tiny.max_seq_len == 9


def test_config_param_shapes_in_llmc_order():
    names = [name for name, _ in CONFIG.param_shapes()]
    assert names == ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                     "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
    shapes = dict(CONFIG.param_shapes())
    assert shapes["wte"] == (128, 6) and shapes["qkvw"] == (2, 18, 6)
    assert shapes["fcprojw"] == (2, 6, 24) and shapes["lnfb"] == (6,)
    assert CONFIG.num_parameters() == sum(int(np.prod(s)) for s in shapes.values())


@pytest.mark.parametrize("change", [dict(channels=7), dict(num_heads=0), dict(max_seq_len=-1),
                                    dict(padded_vocab_size=12)])
def test_config_rejects_nonsense(change):
    values = dict(max_seq_len=7, vocab_size=13, padded_vocab_size=128, num_layers=2,
                  num_heads=3, channels=6)
    with pytest.raises(ValueError):
        GPT2Config(**{**values, **change})


def test_config_sizes_are_python_ints():
    config = GPT2Config(*np.array([1024, 50257, 50304, 48, 25, 1600], dtype=np.int32))
    assert type(config.channels) is int
    assert config.num_parameters() > 2**31 // 4  # computed without int32 overflow


# ----------------------------------------------------------------------------
# model checkpoint

def llmc_write_model_bytes(config, params, version):
    """The bytes llm.c's train_gpt2.py write_model produces: the header, then each tensor as
    PyTorch holds it, per-layer tensors one layer after another, wte padded to Vp rows."""
    torch = needs.package("torch") if version == 5 else None   # bf16 is PyTorch's rounding
    views = param_views(config, params)
    out = [header(20240326, version, config.max_seq_len, config.vocab_size, config.num_layers,
                  config.num_heads, config.channels, config.padded_vocab_size)]
    for name, _ in config.param_shapes():
        tensor = views[name]
        layers = [tensor] if name in ("wte", "wpe", "lnfw", "lnfb") else list(tensor)
        for t in layers:
            if version == 3:
                out.append(np.ascontiguousarray(t, dtype="<f4").tobytes())
            else:  # torch's .to(bfloat16).view(int16)
                t32 = torch.from_numpy(np.ascontiguousarray(t, dtype=np.float32))
                out.append(t32.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    return b"".join(out)


def test_checkpoint_fp32_round_trip_and_llmc_layout(tmp_path):
    params = random_params(CONFIG)
    path = tmp_path / "model.bin"
    write_checkpoint(path, CONFIG, params)
    assert path.read_bytes() == llmc_write_model_bytes(CONFIG, params, 3)
    config, read = read_checkpoint(path, GPT2Config)
    assert config == CONFIG
    assert read.dtype == np.float32 and read.shape == (CONFIG.num_parameters(),)
    np.testing.assert_array_equal(read, params)


def test_checkpoint_reads_llmc_file(tmp_path):
    params = random_params(CONFIG, seed=1)
    path = tmp_path / "llmc.bin"
    path.write_bytes(llmc_write_model_bytes(CONFIG, params, 3))
    config, read = read_checkpoint(str(path), GPT2Config)
    views = param_views(config, read)
    expected = param_views(CONFIG, params)
    for name in expected:
        np.testing.assert_array_equal(views[name], expected[name])


def bf16_round_nearest_even(values):
    """Reference rounding done with Python ints, one value at a time."""
    out = []
    for v in np.asarray(values, dtype=np.float32):
        bits = int(v.view(np.uint32))
        if np.isnan(v):
            out.append(0x7FC0)
            continue
        upper, lower = bits >> 16, bits & 0xFFFF
        if lower > 0x8000 or (lower == 0x8000 and upper & 1):
            upper += 1
        out.append(upper & 0xFFFF)
    return np.array(out, dtype=np.uint16)


SPECIAL = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-40, -1e-45,
                    np.float32(3.3895314e38), 1.00390625, 1.01171875, -1.00390625,
                    np.nan], dtype=np.float32)  # ties at 1 + 2^-8 and 1 + 3*2^-8


def test_bfloat16_rounding_nearest_even():
    values = np.concatenate([SPECIAL, np.random.default_rng(0).standard_normal(5000)
                             .astype(np.float32) * 10.0 ** np.arange(-20, 30, 0.01)[:5000]])
    values = values.astype(np.float32)
    bits = float32_to_bfloat16_bits(values)
    np.testing.assert_array_equal(bits, bf16_round_nearest_even(values))
    back = bfloat16_bits_to_float32(bits)
    normal = (np.abs(values) >= np.finfo(np.float32).tiny) & (np.abs(values) < 3.3e38)
    assert np.all(np.abs(back[normal] - values[normal]) <= np.abs(values[normal]) * 2.0**-8)


def test_bfloat16_rounding_matches_torch():
    torch = needs.package("torch")
    values = np.concatenate([SPECIAL[:-1], np.random.default_rng(1).standard_normal(10000)
                             .astype(np.float32)]).astype(np.float32)
    ours = bfloat16_bits_to_float32(float32_to_bfloat16_bits(values))
    theirs = torch.from_numpy(values).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_checkpoint_bf16_matches_llmc_bytes(tmp_path):
    torch = needs.package("torch")
    params = random_params(CONFIG, seed=2)
    path = tmp_path / "model_bf16.bin"
    write_checkpoint(path, CONFIG, params, dtype="bfloat16")
    assert path.read_bytes() == llmc_write_model_bytes(CONFIG, params, 5)
    config, read = read_checkpoint(path, GPT2Config)
    assert config == CONFIG and read.dtype == np.float32
    np.testing.assert_array_equal(
        read, torch.from_numpy(params).to(torch.bfloat16).to(torch.float32).numpy())


def test_checkpoint_bf16_round_trip(tmp_path):
    params = random_params(CONFIG, seed=3)
    path = tmp_path / "model_bf16.bin"
    write_checkpoint(path, CONFIG, params, dtype="bfloat16")
    assert path.stat().st_size == 1024 + 2 * CONFIG.num_parameters()
    _, read = read_checkpoint(path, GPT2Config)
    np.testing.assert_array_equal(
        read, bfloat16_bits_to_float32(bf16_round_nearest_even(params)))


def test_write_checkpoint_rejects_bad_arguments(tmp_path):
    path = tmp_path / "model.bin"
    with pytest.raises(ValueError, match="parameters"):
        write_checkpoint(path, CONFIG, np.zeros(10, dtype=np.float32))
    with pytest.raises(ValueError, match="dtype"):
        write_checkpoint(path, CONFIG, random_params(CONFIG), dtype="float16")
    assert not path.exists()


# ----------------------------------------------------------------------------
# debug state

def make_state(config, B=2, T=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, config.vocab_size, (B, T)).astype(np.int32)
    y = rng.integers(0, config.vocab_size, (B, T)).astype(np.int32)
    logits = rng.standard_normal((B, T, config.vocab_size)).astype(np.float32)
    grads = random_params(config, seed + 1)
    return x, y, logits, 2.75, grads


def llmc_write_state_bytes(x, y, logits, loss, grads):
    """The bytes llm.c's train_gpt2.py write_state produces."""
    B, T = x.shape
    return b"".join([header(20240327, 2, B, T), x.astype("<i4").tobytes(),
                     y.astype("<i4").tobytes(), logits.astype("<f4").tobytes(),
                     np.array([loss], dtype="<f4").tobytes(), grads.astype("<f4").tobytes()])


def test_debug_state_round_trip_and_llmc_layout(tmp_path):
    x, y, logits, loss, grads = make_state(CONFIG)
    path = tmp_path / "state.bin"
    write_debug_state(path, x, y, logits, loss, grads)
    assert path.read_bytes() == llmc_write_state_bytes(x, y, logits, loss, grads)
    state = read_debug_state(path, CONFIG)
    assert state.x.dtype == np.int32 and state.y.dtype == np.int32
    np.testing.assert_array_equal(state.x, x)
    np.testing.assert_array_equal(state.y, y)
    assert state.logits.dtype == np.float32 and state.logits.shape == (2, 5, 13)
    np.testing.assert_array_equal(state.logits, logits)
    assert state.loss == 2.75
    np.testing.assert_array_equal(state.grads, grads)


def test_write_debug_state_rejects_bad_arguments(tmp_path):
    x, y, logits, loss, grads = make_state(CONFIG)
    path = tmp_path / "state.bin"
    with pytest.raises(ValueError, match="logits"):
        write_debug_state(path, x, y, logits[:, :3], loss, grads)
    with pytest.raises(ValueError, match="x and y"):
        write_debug_state(path, x, y[:1], logits, loss, grads)
    x[0, 0] = CONFIG.vocab_size
    with pytest.raises(ValueError, match="x holds"):
        write_debug_state(path, x, y, logits, loss, grads)
    assert not path.exists()


# ----------------------------------------------------------------------------
# tokenizer

def test_tokenizer_round_trip(tmp_path):
    tokens = [bytes([i]) for i in range(256)] + [b"hello", b" world", bytes(range(1, 256))]
    path = tmp_path / "tok.bin"
    write_tokenizer(path, tokens, eot_token=258)
    data = path.read_bytes()
    assert data[:16] == header(20240328, 2, 259, 258)[:16]
    assert data[1024:1026] == b"\x01\x00"  # token 0: length 1, byte 0
    assert read_tokenizer(path) == (tokens, 258)


def test_tokenizer_version_1(tmp_path):
    body = b"".join(bytes([1, i % 256]) for i in range(50257))
    path = tmp_path / "tok_v1.bin"
    path.write_bytes(header(20240328, 1, 50257) + body)
    tokens, eot = read_tokenizer(path)
    assert len(tokens) == 50257 and eot == 50256  # llm.c's assumption for version 1
    path.write_bytes(header(20240328, 1, 3) + b"\x01a\x01b\x02cd")
    assert read_tokenizer(path) == ([b"a", b"b", b"cd"], None)


def test_write_tokenizer_rejects_bad_tokens(tmp_path):
    path = tmp_path / "tok.bin"
    for tokens, eot in (([b"a", b""], 0), ([b"a", b"x" * 256], 0), ([b"a", "b"], 0),
                        ([b"a"], 1), ([], 0)):
        with pytest.raises(ValueError):
            write_tokenizer(path, tokens, eot)
    assert not path.exists()


# ----------------------------------------------------------------------------
# token shard

def test_shard_round_trip(tmp_path):
    tokens = np.array([0, 1, 50256, 65535, 7] * 11, dtype=np.int64)
    path = tmp_path / "shard.bin"
    write_shard(path, tokens)
    data = path.read_bytes()
    assert data == header(20240520, 1, tokens.size) + tokens.astype("<u2").tobytes()
    read = read_shard(path)
    assert read.dtype == np.uint16
    np.testing.assert_array_equal(read, tokens)
    mapped = read_shard(path, mmap=True)
    np.testing.assert_array_equal(mapped, tokens)
    del mapped
    write_shard(path, [])
    assert read_shard(path).size == 0


@pytest.mark.parametrize("tokens", [[1, 65536], [-1, 2], [0.5, 1.0]])
def test_write_shard_rejects_bad_tokens(tmp_path, tokens):
    with pytest.raises(ValueError):
        write_shard(tmp_path / "shard.bin", tokens)
    assert not (tmp_path / "shard.bin").exists()


# ----------------------------------------------------------------------------
# training state

def loader_state(rng_pos=5):
    """A shuffling data loader's state: 2 shards, the second one open, 4 samples in it."""
    return {"num_shards": 2, "shard_idx": 1, "sample_idx": 3, "shard_num_samples": 4,
            "shard_indices": np.array([1, 0], np.int32),
            "intra_shard_indices": np.array([2, 0, 3, 1], np.int32),
            "rng_key": np.arange(7, 7 + 624, dtype=np.uint32), "rng_pos": rng_pos}


def moments(n=50, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32), rng.random(n).astype(np.float32)


def test_state_layout_is_llmc(tmp_path):
    m, v = moments()
    path = tmp_path / "state.bin"
    write_state(path, 42, m, v, loader_state())
    h = np.zeros(256, dtype="<i4")
    h[:6] = [20240527, 1, 1, 0, 0, 1]  # magic, version, 1 process, rank 0, no master, shuffled
    h[10] = 42
    h[30:34].view("<u8")[:] = [1, 3]
    # llm.c's mt19937_state: seed (u64), left_ (int), next_ (u32), state[624], MATRIX_A[2]
    mt = (np.array([0], "<u8").tobytes() + np.array([625 - 5], "<i4").tobytes() +
          np.array([5], "<u4").tobytes() + np.arange(7, 7 + 624, dtype="<u4").tobytes() +
          np.array([0, 0x9908B0DF], "<u4").tobytes())
    expected = (h.tobytes() + m.tobytes() + v.tobytes() +
                np.array([2], "<u8").tobytes() + np.array([1, 0], "<i4").tobytes() +
                np.array([4], "<u8").tobytes() + np.array([2, 0, 3, 1], "<i4").tobytes() + mt)
    assert path.read_bytes() == expected


@pytest.mark.parametrize("rng_pos", [0, 5, 624])
def test_state_round_trip(tmp_path, rng_pos):
    m, v = moments()
    path = tmp_path / "state.bin"
    written = loader_state(rng_pos)
    write_state(path, 42, m, v, written)
    step, m2, v2, read = read_state(path, m.size)
    assert step == 42 and m2.dtype == v2.dtype == np.float32
    np.testing.assert_array_equal(m2, m)
    np.testing.assert_array_equal(v2, v)
    assert read.keys() == written.keys()
    for key in written:
        np.testing.assert_array_equal(read[key], written[key], err_msg=key)


def test_state_with_master_weights_is_llmcs_layout(tmp_path):
    """A bf16 run's state: llm.c's use_master_weights 1 and the float32 master weights after m
    and v (train_gpt2.cu save_state), and ours in header[11], the t of the last update."""
    m, v = moments()
    master = moments(seed=1)[0]
    plain, path = tmp_path / "plain.bin", tmp_path / "master.bin"
    write_state(plain, 42, m, v, loader_state())
    write_state(path, 42, m, v, loader_state(), master=master, last_update=41)
    raw, plain_raw = path.read_bytes(), plain.read_bytes()
    h = np.frombuffer(raw, "<i4", 256)
    assert list(h[:6]) == [20240527, 1, 1, 0, 1, 1] and h[10] == 42 and h[11] == 41
    body = 1024 + 2 * 4 * 50
    assert raw[1024:body] == plain_raw[1024:body]
    assert raw[body:body + 4 * 50] == master.tobytes()
    assert raw[body + 4 * 50:] == plain_raw[body:]   # then the data loader, as without
    state = read_training_state(path, 50)
    assert state.step == 42 and state.last_update == 41
    for got, want in ((state.m, m), (state.v, v), (state.master, master)):
        np.testing.assert_array_equal(got, want)
    plain_state = read_training_state(plain, 50)
    assert plain_state.master is None and plain_state.last_update == 0
    for key, value in loader_state().items():
        np.testing.assert_array_equal(state.loader_state[key], value, err_msg=key)
    step, m2, _, _ = read_state(path, 50)   # the old reader: the same, the master weights aside
    assert step == 42 and np.array_equal(m2, m)
    assert_format_error(path, "does not fit a model of 51 parameters", read_training_state, 51)
    path.write_bytes(raw[:body + 4 * 49])
    assert_format_error(path, "does not fit a model of 50", read_training_state, 50)
    with pytest.raises(ValueError, match="master weights must be laid out as m"):
        write_state(path, 42, m, v, loader_state(), master=master[:49])


def test_state_bad_files(tmp_path):
    m, v = moments()
    path = tmp_path / "state.bin"
    write_state(path, 42, m, v, loader_state())
    good = path.read_bytes()
    does_not_fit = "does not fit a model of 50 parameters (written for a model of another size"
    for cut in (good[:-3], good[:1024 + 4 * 50], good + b"\0\0", b""):
        path.write_bytes(cut)
        assert_format_error(path, does_not_fit, read_state, 50)
    path.write_bytes(good)
    assert_format_error(path, "does not fit a model of 51 parameters", read_state, 51)
    patch_header(path, 2, 8)
    assert_format_error(path, "written by process 0 of a run of 8, read by process 0 of 1",
                        read_state, 50)
    patch_header(path, 2, 1)
    patch_header(path, 4, 2)
    assert_format_error(path, "cannot continue (master weights 2, shuffled data 1)",
                        read_state, 50)
    patch_header(path, 4, 1)   # master weights said, not there: the loader's bytes do not fit
    assert_format_error(path, does_not_fit, read_state, 50)
    write_checkpoint(path, CONFIG, random_params(CONFIG))
    assert_format_error(path, "not a training state (magic 20240326, version 3)",
                        read_state, 50)
    assert_format_error(tmp_path / "none.bin", "no such file", read_state, 50)


def test_write_state_rejects_mismatched_moments(tmp_path):
    with pytest.raises(ValueError, match="m and v"):
        write_state(tmp_path / "state.bin", 1, np.zeros(5), np.zeros(6), loader_state())
    assert not (tmp_path / "state.bin").exists()


# ----------------------------------------------------------------------------
# bad files: every one a FormatError "<path>: <problem>" on one line

@pytest.fixture
def files(tmp_path):
    """One good file of each format."""
    paths = {kind: tmp_path / f"{kind}.bin" for kind in ("model", "state", "tok", "shard")}
    write_checkpoint(paths["model"], CONFIG, random_params(CONFIG))
    write_debug_state(paths["state"], *make_state(CONFIG))
    write_tokenizer(paths["tok"], [b"a", b"bc", b"def"], 2)
    write_shard(paths["shard"], np.arange(100))
    return paths


def read_config_debug_state(path):
    return read_debug_state(path, CONFIG)


def read_gpt2_checkpoint(path):
    return read_checkpoint(path, GPT2Config)


READERS = {"model": read_gpt2_checkpoint, "state": read_config_debug_state,
           "tok": read_tokenizer, "shard": read_shard}


def patch_header(path, index, value):
    data = bytearray(path.read_bytes())
    data[4 * index:4 * index + 4] = int(value).to_bytes(4, "little", signed=True)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", list(READERS))
def test_missing_file_and_directory(tmp_path, kind):
    assert_format_error(tmp_path / "nope.bin", "no such file", READERS[kind])
    assert_format_error(tmp_path, "directory", READERS[kind])


@pytest.mark.parametrize("kind", list(READERS))
def test_wrong_magic(files, kind):
    other = "state" if kind == "model" else "model"
    message = assert_format_error(files[other], "this is a", READERS[kind])
    assert {"model": "model checkpoint", "state": "debug state"}[other] in message
    patch_header(files[kind], 0, 12345)
    assert_format_error(files[kind], "bad magic number 12345", READERS[kind])


def test_recognises_llama3_shard(files):
    patch_header(files["shard"], 0, 20240801)
    assert_format_error(files["shard"], "unsupported token shard version 1 for magic 20240801",
                        read_shard)


@pytest.mark.parametrize("kind,version", [("model", 2), ("model", 4), ("state", 1),
                                          ("state", 3), ("tok", 3), ("shard", 2)])
def test_wrong_version(files, kind, version):
    patch_header(files[kind], 1, version)
    assert_format_error(files[kind], f"version {version}", READERS[kind])


@pytest.mark.parametrize("kind", list(READERS))
def test_truncated_and_too_long(files, kind):
    path = files[kind]
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    assert_format_error(path, "truncated", READERS[kind])
    path.write_bytes(data + b"\0\0")
    assert_format_error(path, "too long", READERS[kind])
    path.write_bytes(data[:100])
    assert_format_error(path, "1024-byte header", READERS[kind])
    path.write_bytes(b"")
    assert_format_error(path, "truncated", READERS[kind])


def test_size_message_gives_expected_and_actual_bytes(files):
    path = files["model"]
    path.write_bytes(path.read_bytes()[:-4])
    expected = 1024 + 4 * CONFIG.num_parameters()
    assert_format_error(path, f"expected {expected} bytes", read_gpt2_checkpoint)
    assert_format_error(path, f"found {expected - 4}", read_gpt2_checkpoint)


@pytest.mark.parametrize("index,value,match", [(2, 0, "max_seq_len=0"), (3, -5, "vocab_size=-5"),
                                               (4, 0, "num_layers=0"), (5, 4, "not divisible"),
                                               (7, 12, "padded_vocab_size=12")])
def test_checkpoint_nonsense_header(files, index, value, match):
    patch_header(files["model"], index, value)
    assert_format_error(files["model"], match, read_gpt2_checkpoint)


def test_checkpoint_header_size_mismatch(files):
    patch_header(files["model"], 6, 9)  # C=9, NH=3: valid sizes, but not this file's
    assert_format_error(files["model"], "expected", read_gpt2_checkpoint)


def test_debug_state_bad_header(files):
    path = files["state"]
    patch_header(path, 3, CONFIG.max_seq_len + 1)
    assert_format_error(path, "exceeds the model's max_seq_len=7", read_config_debug_state)
    patch_header(path, 3, 0)
    assert_format_error(path, "must be positive", read_config_debug_state)
    patch_header(path, 3, 4)  # the file holds T=5
    assert_format_error(path, "expected", read_config_debug_state)


@pytest.mark.parametrize("which,offset,value", [("x", 0, 13), ("x", 7, 99), ("y", 9, -1)])
def test_debug_state_token_ids_out_of_range(files, which, offset, value):
    path = files["state"]
    data = bytearray(path.read_bytes())
    start = 1024 + (0 if which == "x" else 4 * 10) + 4 * offset
    data[start:start + 4] = value.to_bytes(4, "little", signed=True)
    path.write_bytes(bytes(data))
    message = assert_format_error(path, f"{which}[{offset // 5}, {offset % 5}] = {value}",
                                  read_config_debug_state)
    assert "[0, V=13)" in message


def test_debug_state_for_another_model(files):
    other = GPT2Config(max_seq_len=7, vocab_size=13, padded_vocab_size=128, num_layers=1,
                       num_heads=3, channels=6)
    assert_format_error(files["state"], "expected", read_debug_state, other)


def test_tokenizer_bad_contents(files):
    path = files["tok"]
    good = path.read_bytes()
    path.write_bytes(good[:1024] + b"\x01a\x00\x03def")
    assert_format_error(path, "token 1 has length 0", read_tokenizer)
    patch_header(path, 3, 3)
    assert_format_error(path, "eot token 3", read_tokenizer)
    path.write_bytes(good)
    patch_header(path, 2, 4)
    assert_format_error(path, "declares 4 tokens", read_tokenizer)
    patch_header(path, 2, 0)
    assert_format_error(path, "vocab size 0", read_tokenizer)


def test_shard_negative_count(files):
    patch_header(files["shard"], 2, -1)
    assert_format_error(files["shard"], "negative", read_shard)


def test_format_error_is_value_error():
    e = FormatError("some/file.bin", "a problem\non two lines")
    assert isinstance(e, ValueError)
    assert str(e) == "some/file.bin: a problem on two lines"
    assert e.path == "some/file.bin" and e.problem == "a problem\non two lines"


# ----------------------------------------------------------------------------
# atomic writes

def leftovers(directory, keep):
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


def test_atomic_write_writes_and_replaces(tmp_path):
    path = tmp_path / "out.bin"
    atomic_write(path, [b"abc", bytearray(b"de"), np.arange(3, dtype="<i4")])
    assert path.read_bytes() == b"abcde" + np.arange(3, dtype="<i4").tobytes()
    atomic_write(str(path), b"new")
    assert path.read_bytes() == b"new"
    assert leftovers(tmp_path, {"out.bin"}) == []
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_atomic_write_failing_generator_keeps_old_file(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old contents")

    def chunks():
        yield b"first chunk"
        raise RuntimeError("failed midway")

    with pytest.raises(RuntimeError, match="failed midway"):
        atomic_write(path, chunks())
    assert path.read_bytes() == b"old contents"
    assert leftovers(tmp_path, {"out.bin"}) == []


def test_atomic_write_disk_full_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "model.bin"
    path.write_bytes(b"old model")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_checkpoint(path, CONFIG, random_params(CONFIG))
    assert path.read_bytes() == b"old model"
    assert leftovers(tmp_path, {"model.bin"}) == []


def test_atomic_write_new_file_not_created_on_failure(tmp_path):
    path = tmp_path / "new.bin"
    with pytest.raises(TypeError):
        atomic_write(path, [b"ok", "not bytes"])
    assert leftovers(tmp_path, set()) == []


def test_safetensors_metadata_written_in_sorted_order():
    """The safetensors package writes its metadata in a hash map's order, seeded anew in each
    process: in_sorted_order makes the same model the same bytes every time (a resumed run's
    file and an uninterrupted run's), the tensors and their data untouched."""
    safetensors_numpy = needs.package("safetensors.numpy")
    import json as json_module
    from llmc.formats.huggingface import in_sorted_order
    data = np.arange(6, dtype="<f4")
    header = json_module.dumps({"__metadata__": {"format": "pt", "config": '{"a": "\u00e9"}'},
                                "x": {"dtype": "F32", "shape": [2, 3],
                                      "data_offsets": [0, data.nbytes]}},
                               separators=(",", ":"), ensure_ascii=False).encode()
    header += b" " * (-len(header) % 8)
    unsorted = len(header).to_bytes(8, "little") + header + data.tobytes()
    written = b"".join(in_sorted_order(unsorted))
    length = int.from_bytes(written[:8], "little")
    assert length % 8 == 0 and written[8 + length:] == data.tobytes()
    assert list(json_module.loads(written[8:8 + length])["__metadata__"]) == ["config", "format"]
    assert (safetensors_numpy.load(written)["x"] == data.reshape(2, 3)).all()
    assert b"".join(in_sorted_order(written)) == written
