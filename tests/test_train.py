"""
train.py end to end on a small random GPT-2 (d2) and token shards written here (no tokenizer,
no internet): a run stopped at a checkpoint and resumed gives exactly the losses, samples and
final files of an uninterrupted one; -nk keeps the newest checkpoints only; -o writes loss.png;
every bad input ends in one line "train.py: error: ..."; checkpoints and the training state
follow llm.c's names and layout (llmc/checkpoint.py); main.log and its plot (llmc/logger.py).
"""
import os
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

import needs
import train
from llmc import checkpoint
from llmc.dataloader import DataLoader
from llmc.formats import FormatError
from llmc.formats.llmc import checkpoint_dtype, read_training_state, write_shard
from llmc.logger import plot_losses, read_log

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STEP_LINE = re.compile(r"^step\s+(\d+)/(\d+) \| loss (\S+) \| norm (\S+) \| lr (\S+) \| "
                       r"\S+ ms \| \d+ tok/s$", re.M)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two train shards and a val shard of random GPT-2 token ids."""
    d = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    for i in range(2):
        write_shard(d / f"train_{i:03d}.bin", rng.integers(0, 50257, 6000))
    write_shard(d / "val_000.bin", rng.integers(0, 50257, 2000))
    return types.SimpleNamespace(dir=d, train=str(d / "train_*.bin"), val=str(d / "val_000.bin"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A tokenizer cache holding GPT-2's ranks (from ../shared), so sampling needs no network;
    None when ../shared has none (the runs then do not sample)."""
    if not os.path.exists(needs.GPT2_RANKS):
        return None
    d = tmp_path_factory.mktemp("cache")
    shutil.copy(needs.GPT2_RANKS, d / "gpt2.tiktoken")
    return str(d)


def run_train(*args, cache=None):
    env = dict(os.environ, LLMPYX_CACHE_DIR=cache or "/nonexistent-llmpyx-cache")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *map(str, args)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    return run.stdout


def step_losses(stdout):
    return {int(m.group(1)): m.group(3) for m in STEP_LINE.finditer(stdout)}


def samples(stdout):
    return re.findall(r"generating:\n---\n(.*?)\n---\n", stdout, re.S)


def train_log(path):
    with open(path) as f:
        return [line for line in f.read().splitlines() if " trl:" in line]


def test_resume_is_bit_identical(data, cache, tmp_path):
    sampling = ["-s", "3", "-g", "6"] if cache else ["-s", "0"]
    common = ["-e", "d2", "-b", 4, "-t", 64, "-i", data.train, "-j", data.val, "-m", 1, *sampling]
    out, straight_dir = tmp_path / "out", tmp_path / "straight"
    first = run_train(*common, "-x", 3, "-n", 3, "-o", out, cache=cache)
    resumed = run_train(*common, "-x", 6, "-o", out, "-y", 1, "-n", 3, cache=cache)
    straight = run_train(*common, "-x", 6, "-n", 3, "-o", straight_dir, cache=cache)

    assert sorted(step_losses(first)) == [1, 2, 3]
    assert sorted(step_losses(resumed)) == [4, 5, 6]  # it continues, not restarts
    assert "resuming from the checkpoint at step 3" in resumed
    assert {**step_losses(first), **step_losses(resumed)} == step_losses(straight)
    assert train_log(out / "main.log") == train_log(straight_dir / "main.log")
    for name in ("model_00000006.bin", "state_00000006_00000.bin"):
        with open(out / name, "rb") as a, open(straight_dir / name, "rb") as b:
            assert a.read() == b.read(), name
    if cache:  # the samples at steps 3 and 6, decoded text
        assert samples(first) + samples(resumed) == samples(straight)
        assert len(samples(straight)) == 2 and all(samples(straight))
    # val losses are printed, the log is llm.c's
    assert re.search(r"^val loss \d+\.\d{6}$", straight, re.M)
    with open(straight_dir / "main.log") as f:
        log = f.read().splitlines()
    assert log[0].startswith("s:0 tel:") and re.fullmatch(
        r"s:0 trl:\d+\.\d{4} lr:0\.000100 norm:\d+\.\d{2}", log[1])


def test_grad_accumulation_and_schedule(data, tmp_path):
    # -d 128 = 2 micro-batches of 2x32; warmup 2 steps then cosine down to lr * 0.1
    stdout = run_train("-e", "d2", "-b", 2, "-t", 32, "-d", 128, "-i", data.train, "-j", data.val,
                       "-m", 1, "-s", 0, "-x", 3, "-u", 2, "-q", 0.1, "-l", 1e-3)
    assert "grad_accum_steps=2" in stdout
    # after the first step, once: what the model allocated, as llm.c prints it
    assert len(re.findall(r"^memory allocated: params \d+ MiB, grads \d+ MiB, adamw \d+ MiB, "
                          r"activations \d+ MiB.*; total \d+ MiB$", stdout, re.M)) == 1
    lrs = [m.group(5) for m in STEP_LINE.finditer(stdout)]
    assert lrs == ["5.00e-04", "1.00e-03", "1.00e-03"]


# ----------------------------------------------------------------------------
# bad input: one line on stderr, exit status 2 (arguments) or 1 (files), no traceback

def error_of(capsys, *args, status=1):
    with pytest.raises(SystemExit) as e:
        train.run([str(a) for a in args])
    err = capsys.readouterr().err
    assert e.value.code == status, err
    # a bf16 run on a machine without bf16 GEMMs says so first (train.py's bf16_hardware_note)
    note = train.bf16_hardware_note() if "bf16" in map(str, args) else None
    lines = [line for line in err.strip().splitlines() if line != f"train.py: {note}"]
    assert len(lines) == 1 and lines[0].startswith("train.py: error: "), err
    return lines[0]


def write_raw(path, ints, payload=b""):
    header = np.zeros(256, dtype="<i4")
    header[:len(ints)] = ints
    path.write_bytes(header.tobytes() + payload)
    return str(path)


@pytest.mark.parametrize("flags, message", [
    (["-b", 0], "argument -b"),
    (["-b", "four"], "argument -b: invalid int value"),
    (["-t", 0], "argument -t"),
    (["-t", -64], "argument -t"),
    (["-x", -2], "argument -x"),
    (["-x", "many"], "argument -x: invalid int value"),
    (["-d", 100], "multiple of B*T = 256"),
    (["-q", 2], "argument -q"),
    (["-l", "nan"], "argument -l"),
    (["-v", 0], "argument -v"),
    (["-y", 2], "argument -y"),
    (["-n", 5], "add -o DIR"),
    (["-nk", -1], "argument -nk"),
    (["-y", 1], "add -o DIR"),
    (["-k", "cosine"], "unrecognized arguments"),
])
def test_bad_arguments(capsys, data, flags, message):
    line = error_of(capsys, "-e", "d2", "-i", data.train, "-j", data.val, *flags, status=2)
    assert message in line


def test_bad_files(capsys, data, tmp_path):
    d2 = ["-e", "d2", "-s", 0]

    def error(*args):
        return error_of(capsys, *d2, *args)
    assert "no file matches this pattern" in error("-i", tmp_path / "none_*.bin", "-j", data.val)
    assert "no such file" in error("-i", data.train, "-j", tmp_path / "missing.bin")
    (tmp_path / "empty.bin").write_bytes(b"")
    assert "empty file" in error("-i", tmp_path / "empty.bin", "-j", data.val)
    small = write_raw(tmp_path / "small.bin", [20240520, 1, 100], b"\x00" * 200)
    assert "too small: 100 tokens" in error("-i", small, "-j", data.val)
    magic = write_raw(tmp_path / "magic.bin", [20240326, 3, 1000], b"\x00" * 2000)
    line = error("-i", data.train, "-j", magic)
    assert "this is a model checkpoint, not a GPT-2 token shard (magic number 20240326" in line
    truncated = write_raw(tmp_path / "cut.bin", [20240520, 1, 1000], b"\x00" * 1000)
    assert "truncated: expected 3024 bytes" in error("-i", truncated, "-j", data.val)
    tokens = np.zeros(1000, dtype=np.int64)
    tokens[7] = 50300  # a valid uint16, but GPT-2 has 50257 tokens
    write_shard(tmp_path / "vocab.bin", tokens)
    line = error("-i", data.train, "-j", tmp_path / "vocab.bin")
    assert "token id 50300 at position 7 is outside the model's vocabulary of 50257" in line


def test_bad_model(capsys, data, tmp_path):
    files = ["-i", data.train, "-j", data.val, "-s", 0]
    (tmp_path / "junk.bin").write_bytes(b"\x01" * 5000)
    assert "junk.bin: not a model file (5000 bytes): neither llm.c's" in error_of(
        capsys, "-e", tmp_path / "junk.bin", *files)
    write_raw(tmp_path / "cut.bin", [20240326, 3, 1024, 50257, 2, 2, 128, 50304], b"\x00" * 64)
    assert "cut.bin: truncated" in error_of(capsys, "-e", tmp_path / "cut.bin", *files)
    assert "no such model file" in error_of(capsys, "-e", tmp_path / "none.bin", *files)
    assert "depth must be in 1..1000" in error_of(capsys, "-e", "d0", *files)
    line = error_of(capsys, "-e", "d2", "-t", 1025, *files)
    assert "-t 1025 exceeds the model's max sequence length 1024" in line
    assert "-g 2000 exceeds" in error_of(capsys, "-e", "d2", "-g", 2000, *files)


def test_cli_error_and_help(data, tmp_path):
    script = os.path.join(ROOT, "train.py")
    run = subprocess.run([sys.executable, script, "-e", "d2", "-i", str(tmp_path / "x_*.bin"),
                          "-j", data.val], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        f"train.py: error: {tmp_path / 'x_*.bin'}: no file matches this pattern"]
    run = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True)
    assert run.returncode == 0
    for flag in [*"ijoebtdluqcxvmsgnyr", "nk"]:
        assert f"  -{flag} " in run.stdout


def test_profile_wraps_the_backend_once():
    assert train.parse_args(["--profile"]).backend == "profile:cpu"
    assert train.parse_args(["--backend", "profile:cpu", "--profile"]).backend == \
        "profile:cpu"
    assert train.parse_args(["--backend", "check:cpu", "--profile"]).backend == \
        "profile:check:cpu"
    assert train.parse_args(["--backend", "ane-emu"]).backend == "ane-emu"


# ----------------------------------------------------------------------------
# checkpoints: llm.c's names, the newest complete one, llm.c's state layout

def test_find_max_step_takes_newest_complete(tmp_path):
    def touch(name):
        (tmp_path / name).write_bytes(b"")
    for step in (3, 6):
        for path in checkpoint.checkpoint_paths(str(tmp_path), step):
            touch(os.path.basename(path))
    touch("model_00000009.bin")  # a checkpoint cut short: no state, no DONE
    touch("DONE_00000012")  # a DONE without its files
    touch(".model_00000015.bin.123.abcd.tmp")  # an atomic write that never finished
    assert checkpoint.find_max_step(str(tmp_path)) == 6
    assert checkpoint.find_max_step(str(tmp_path / "empty")) is None


def fake_model(size, rng=None):
    """What checkpoint.py uses of a model at fp32: its parameter count, AdamW's m and v,
    save()."""
    def save(path):
        with open(path, "wb") as f:
            f.write(b"model")
    m, v = np.zeros(size, np.float32), np.zeros(size, np.float32)
    if rng is not None:
        m, v = rng.standard_normal(size).astype(np.float32), rng.random(size).astype(np.float32)
    return types.SimpleNamespace(params=np.zeros(size, np.float32), m=m, v=v, save=save,
                                 precision="fp32", master_weights=False)


def test_checkpoint_state_layout_and_resume(tmp_path):
    B, T = 2, 4
    for i, n in enumerate((8 * 6 + 1, 8 * 4 + 1)):
        write_shard(tmp_path / f"s_{i}.bin", np.arange(n) % 50000)
    pattern = str(tmp_path / "s_*.bin")
    loader = DataLoader(pattern, B, T, shuffle=True)
    for _ in range(8):  # into the second shard
        loader.next_batch()
    model = fake_model(1000, np.random.default_rng(1))
    out = tmp_path / "out"
    out.mkdir()
    checkpoint.write_checkpoint(str(out), 7, model, loader)
    assert sorted(os.listdir(out)) == ["DONE_00000007", "model_00000007.bin",
                                       "state_00000007_00000.bin"]

    raw = (out / "state_00000007_00000.bin").read_bytes()
    header = np.frombuffer(raw, "<i4", 256)
    assert list(header[:6]) == [20240527, 1, 1, 0, 0, 1] and header[10] == 7
    assert list(header[30:34].view("<u8")) == [loader.current_shard_idx, loader.current_sample_idx]
    assert np.array_equal(np.frombuffer(raw, "<f4", 1000, 1024), model.m)
    assert np.array_equal(np.frombuffer(raw, "<f4", 1000, 1024 + 4000), model.v)
    # then the shard order, the sample order, and llm.c's mt19937_state struct (2520 bytes)
    assert len(raw) == 1024 + 8000 + 8 + 4 * 2 + 8 + 4 * loader.shard_num_samples + 2520

    expected = [loader.next_batch()[0] for _ in range(12)]
    fresh = fake_model(1000)
    resumed = DataLoader(pattern, B, T, shuffle=True)
    assert checkpoint.resume(str(out), 7, fresh, resumed) == 7
    assert np.array_equal(fresh.m, model.m) and np.array_equal(fresh.v, model.v)
    assert all(np.array_equal(resumed.next_batch()[0], e) for e in expected)

    with pytest.raises(FormatError, match="does not fit a model of 1001 parameters"):
        checkpoint.resume(str(out), 7, fake_model(1001), DataLoader(pattern, B, T, shuffle=True))


def test_keep_newest_checkpoints_and_plot(data, tmp_path):
    common = ["-e", "d2", "-b", 2, "-t", 32, "-i", data.train, "-j", data.val, "-m", 1, "-s", 0]
    out = tmp_path / "out"
    run_train(*common, "-x", 5, "-n", 2, "-nk", 2, "-o", out)  # checkpoints at 2, 4 and 5
    assert sorted(p.name for p in out.iterdir()) == [
        ".gitignore", "DONE_00000004", "DONE_00000005", "loss.png", "main.log", "model_00000004.bin",
        "model_00000005.bin", "run.json", "state_00000004_00000.bin", "state_00000005_00000.bin"]
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stdout = run_train(*common, "-x", 6, "-n", 2, "-nk", 1, "-o", out, "-y", 1)
    assert "resuming from the checkpoint at step 5" in stdout
    assert sorted(p.name for p in out.iterdir() if "_0000000" in p.name) == [
        "DONE_00000006", "model_00000006.bin", "state_00000006_00000.bin"]


# ----------------------------------------------------------------------------
# main.log and loss.png

def test_plot_losses(tmp_path):
    train_log = [f"s:{s} trl:{10 - s / 2:.4f} lr:0.000100 norm:1.00" for s in range(10)]
    (tmp_path / "main.log").write_text("s:0 tel:10.5000\n" + "\n".join(train_log) + "\n")
    assert plot_losses(str(tmp_path)) == str(tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_losses_draws_hellaswag_beside_them(tmp_path):
    """-h 1's accuracies (main.log's eval lines) get a panel of their own: a wider picture."""
    train_log = [f"s:{s} trl:{10 - s / 2:.4f} lr:0.000100 norm:1.00" for s in range(10)]
    (tmp_path / "main.log").write_text("\n".join(train_log + ["s:5 tel:8.0000", "s:5 eval:0.2600",
                                                            "s:9 eval:0.3100"]) + "\n")
    assert read_log(tmp_path / "main.log")["eval"] == {5: 0.26, 9: 0.31}
    plot_losses(str(tmp_path))
    width = int.from_bytes((tmp_path / "loss.png").read_bytes()[16:20], "big")   # IHDR's
    assert width == 1300   # 13 inches at 100 dpi, the losses alone 8


def test_plot_losses_without_matplotlib(tmp_path, monkeypatch, capsys):
    (tmp_path / "main.log").write_text("s:0 trl:10.0000 lr:0.000100 norm:1.00\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    assert plot_losses(str(tmp_path)) is None
    assert "skipping the loss plot" in capsys.readouterr().err
    assert not (tmp_path / "loss.png").exists()


# ----------------------------------------------------------------------------
# --precision bf16: llm.c's mixed precision, its files and its resume

def run_train_env(*args, env=None, status=0):
    """train.py in a subprocess with extra environment variables: the run (stdout, stderr)."""
    env = dict(os.environ, LLMPYX_CACHE_DIR="/nonexistent-llmpyx-cache", **(env or {}))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *map(str, args)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == status, run.stderr
    assert "Traceback" not in run.stderr
    return run


def state_header(path):
    return np.fromfile(path, "<i4", 256)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_resume_at_bf16_is_bit_identical(data, tmp_path, family):
    """A bf16 run stopped at a checkpoint and resumed gives the losses and every byte of the
    files of an uninterrupted one. GPT-2's checkpoint is llm.c's bf16 model file (version 5) of
    the parameters the kernels ran; Llama's stays llama2.c's float32 file (the master weights);
    both states hold the float32 master weights after m and v (use_master_weights 1)."""
    common = ["--family", family, "-e", "d2", "-b", 4, "-t", 32, "-i", data.train, "-j", data.val,
              "-m", 1, "-s", 0, "-l", 1e-3, "--precision", "bf16"]
    out, straight_dir = tmp_path / "out", tmp_path / "straight"
    first = run_train(*common, "-x", 2, "-n", 2, "-o", out)
    resumed = run_train(*common, "-x", 4, "-n", 2, "-o", out, "-y", 1)
    straight = run_train(*common, "-x", 4, "-n", 2, "-o", straight_dir)
    assert sorted(step_losses(resumed)) == [3, 4]
    assert {**step_losses(first), **step_losses(resumed)} == step_losses(straight)
    for name in ("model_00000004.bin", "state_00000004_00000.bin"):
        assert (out / name).read_bytes() == (straight_dir / name).read_bytes(), name
    assert re.search(r"^\| precision\s+\| bf16 \(float32 master weights, gradients, AdamW\)",
                     straight, re.M)
    assert re.search(r"^\| bf16 GEMMs\s+\| \S", straight, re.M)
    assert re.search(r"^memory allocated: params \d+ MiB \(bf16 \+ float32 master weights\), "
                     r".*activations \d+ MiB \(bf16\)", straight, re.M)
    assert checkpoint.read_run_config(str(out))["--precision"] == "bf16"

    from llmc.families import get_family
    Model = get_family(family).model_class
    model_path = str(out / "model_00000004.bin")
    header = state_header(out / "state_00000004_00000.bin")
    assert header[4] == 1 and header[10] == 4 and header[11] == 4   # master weights; last t
    at_fp32 = Model.from_checkpoint(model_path, precision="fp32")   # the files load back
    n = at_fp32.num_parameters
    state = read_training_state(str(out / "state_00000004_00000.bin"), n)
    if family == "gpt2":   # version 5: the bf16 parameters, the stochastic rounding of the master
        assert checkpoint_dtype(model_path) == "bfloat16"
        at_bf16 = Model.from_checkpoint(model_path, precision="bf16")
        assert np.array_equal(at_bf16.params_as_run(), at_bf16.params)
        assert os.path.getsize(model_path) == 1024 + 2 * n
        bits = lambda x: x.view(np.uint32)   # noqa: E731
        up = ((bits(state.master) + np.uint32(0xFFFF)) & np.uint32(0xFFFF0000)).view(np.float32)
        down = (bits(state.master) & np.uint32(0xFFFF0000)).view(np.float32)
        assert np.all((at_fp32.params == up) | (at_fp32.params == down))
        assert not np.array_equal(at_fp32.params, state.master)
    else:   # llama2.c's float32 file: the master weights themselves
        assert np.array_equal(at_fp32.params, state.master)


def test_bf16_gradients_run_resume_bit_identically_and_say_so(data, tmp_path, capsys):
    """--grad-precision bf16 (llm.c's bf16 gradients): a run resumed from its checkpoint goes
    on as the uninterrupted one (the gradients are no part of the state); the config table and
    the memory line say the gradients are bf16; without --precision bf16 it is refused."""
    common = ["-e", "d2", "-b", 4, "-t", 32, "-i", data.train, "-j", data.val, "-m", 1, "-s", 0,
              "-l", 1e-3, "--precision", "bf16", "--grad-precision", "bf16"]
    out, straight_dir = tmp_path / "out", tmp_path / "straight"
    first = run_train(*common, "-x", 2, "-n", 2, "-o", out)
    resumed = run_train(*common[:-2], "-x", 4, "-n", 2, "-o", out, "-y", 1)   # from run.json
    straight = run_train(*common, "-x", 4, "-n", 2, "-o", straight_dir)
    assert {**step_losses(first), **step_losses(resumed)} == step_losses(straight)
    for name in ("model_00000004.bin", "state_00000004_00000.bin"):
        assert (out / name).read_bytes() == (straight_dir / name).read_bytes(), name
    assert re.search(r"^\| precision\s+\| bf16, bf16 gradients \(float32 master weights, "
                     r"AdamW\)", straight, re.M)
    assert re.search(r"^memory allocated: .*grads \d+ MiB \(bf16\)", straight, re.M)
    fp32_grads = run_train(*common[:-2], "-x", 4, "-n", 2, "-o", tmp_path / "fp32-grads")
    assert step_losses(fp32_grads) != step_losses(straight)   # another run, close to it
    line = error_of(capsys, "-e", "d1", "-i", data.train, "-j", data.val, "--grad-precision",
                    "bf16", status=2)
    assert line == ("train.py: error: argument --grad-precision: needs --precision bf16 (the "
                    "parameters and activations in it), got bf16 (see --help)"), line


def test_without_master_weights_a_run_resumes_bit_identically(data, tmp_path, capsys):
    """-w 0 (llm.c's use_master_weights 0): the state holds AdamW's m and v alone, the model
    file the bf16 parameters, which is all a resume needs; the lines say so; a state of a run
    with master weights, or -w 0 without --precision bf16, is refused in one line."""
    common = ["-e", "d2", "-b", 4, "-t", 32, "-i", data.train, "-j", data.val, "-m", 1, "-s", 0,
              "-l", 1e-3, "--precision", "bf16", "--grad-precision", "bf16", "-w", 0]
    out, straight_dir = tmp_path / "out", tmp_path / "straight"
    first = run_train(*common, "-x", 2, "-n", 2, "-o", out)
    resumed = run_train(*common, "-x", 4, "-n", 2, "-o", out, "-y", 1)
    straight = run_train(*common, "-x", 4, "-n", 2, "-o", straight_dir)
    assert {**step_losses(first), **step_losses(resumed)} == step_losses(straight)
    for name in ("model_00000004.bin", "state_00000004_00000.bin"):
        assert (out / name).read_bytes() == (straight_dir / name).read_bytes(), name
    assert re.search(r"^\| precision\s+\| bf16, bf16 gradients, no master weights \(float32 "
                     r"AdamW\)", straight, re.M)
    assert re.search(r"^memory allocated: params \d+ MiB \(bf16, no master weights\)", straight,
                     re.M)
    header = state_header(out / "state_00000004_00000.bin")
    assert header[4] == 0   # use_master_weights
    os.remove(out / "run.json")   # a run with master weights cannot take this state
    state = out / "state_00000004_00000.bin"
    assert error_of(capsys, *common[:-2], "-x", 6, "-o", out, "-y", 1) == (
        f"train.py: error: {state}: holds no master weights (an fp32 run's state, or a -w 0 "
        f"one's), this run is bf16 with them: resume it with --precision fp32, or -w 0")
    line = error_of(capsys, "-e", "d1", "-i", data.train, "-j", data.val, "-w", 0, status=2)
    assert line == ("train.py: error: argument -w: needs --precision bf16 (fp32 keeps no master "
                    "weights; fp16 rounds its updates to nearest, which loses the small ones), "
                    "got 0 (see --help)"), line


def test_a_resume_at_another_precision_is_refused_in_one_line(data, tmp_path, capsys):
    common = ["-e", "d1", "-b", 2, "-t", 16, "-i", data.train, "-j", data.val, "-m", 0, "-s", 0]
    out = tmp_path / "out"
    run_train(*common, "-x", 1, "-n", 1, "-o", out, "--precision", "bf16")
    line = error_of(capsys, *common, "-x", 2, "-o", out, "-y", 1, "--precision", "fp32")
    assert line == (f"train.py: error: -y 1: {out} holds a run with other settings: --precision "
                    f"bf16 (this run: fp32): drop those flags to resume it with its own "
                    f"(run.json), or give this run another -o")
    # without run.json (llm.c's dir, an older llm.pyx): the state says what it holds
    os.remove(out / "run.json")
    state = out / "state_00000001_00000.bin"
    assert error_of(capsys, *common, "-x", 2, "-o", out, "-y", 1) == (
        f"train.py: error: {state}: holds the float32 master weights of a bf16 run, this run is "
        f"fp32: resume it with --precision bf16")
    fp32_out = tmp_path / "fp32"
    run_train(*common, "-x", 1, "-n", 1, "-o", fp32_out)
    config = checkpoint.read_run_config(str(fp32_out))
    assert config["--precision"] == "fp32"
    os.remove(fp32_out / "run.json")
    state = fp32_out / "state_00000001_00000.bin"
    assert error_of(capsys, *common, "-x", 2, "-o", fp32_out, "-y", 1, "--precision", "bf16") == (
        f"train.py: error: {state}: holds no master weights (an fp32 run's state, or a -w 0 "
        f"one's), this run is bf16 with them: resume it with --precision fp32, or -w 0")
    # a run.json of before --precision was an fp32 run's
    del config["--precision"]
    checkpoint.write_run_config(str(fp32_out), config)
    assert "--precision fp32 (this run: bf16)" in error_of(
        capsys, *common, "-x", 2, "-o", fp32_out, "-y", 1, "--precision", "bf16")


def test_precision_flag_errors_in_one_line(capsys, data):
    line = error_of(capsys, "-e", "d1", "-i", data.train, "-j", data.val, "--precision", "fp8",
                    status=2)
    assert "argument --precision: invalid choice: 'fp8'" in line
    line = error_of(capsys, "-e", "d1", "-i", data.train, "-j", data.val, "--loss-scale", 1024,
                    status=2)
    assert line.startswith("train.py: error: argument --loss-scale: only fp16 scales its loss, "
                           "this run is --precision fp32, got 1024.0")
    line = error_of(capsys, "-e", "d1", "-i", data.train, "-j", data.val, "--precision", "fp16",
                    "--loss-scale", 1000, status=2)
    assert "argument --loss-scale: must be a power of two >= 1, got 1000.0" in line
    # a backend without bf16 kernels: accel's line
    needs.emulator("ane-emu")
    line = error_of(capsys, "-e", "d1", "-i", data.train, "-j", data.val, "--precision", "bf16",
                    "--backend", "ane-emu")
    assert "backend 'ane-emu' has no bf16 kernels" in line


def test_bf16_without_hardware_says_so_in_one_line(data):
    """Where the bf16 GEMMs have no bf16 hardware (forced here: LLMPYX_BF16_GEMM=fp32), one
    line says so before the run, which trains on; with the hardware, or at fp32, none."""
    from kernels.blas import HARDWARE_BF16
    args = ["-e", "d1", "-b", 2, "-t", 16, "-i", data.train, "-j", data.val, "-m", 0, "-s", 0,
            "-x", 1]
    run = run_train_env(*args, "--precision", "bf16", env={"LLMPYX_BF16_GEMM": "fp32"})
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "train.py: --precision bf16: this machine has no bf16 hardware in use ("), run.stderr
    assert lines[0].endswith("the bf16 GEMMs run as float32 GEMMs, and the run will be slower "
                             "than fp32")
    assert re.search(r"^\| bf16 GEMMs\s+\| float32 GEMMs on widened bf16", run.stdout, re.M)
    assert step_losses(run.stdout)
    quiet = run_train_env(*args, env={"LLMPYX_BF16_GEMM": "fp32"})   # fp32: nothing to say
    assert "bf16" not in quiet.stderr and "bf16" not in quiet.stdout
    if HARDWARE_BF16:
        assert "no bf16 hardware" not in run_train_env(*args, "--precision", "bf16").stderr


def test_model_files_cross_precisions(tmp_path):
    """A bf16 model's llm.c file (version 5, its bf16 parameters) starts an fp32 model, and an
    fp32 file (version 3) a bf16 one, rounded to nearest; a Llama's file is float32 at bf16,
    the master weights."""
    from llmc.formats import bfloat16_bits_to_float32, float32_to_bfloat16_bits
    from train_gpt2 import GPT2, GPT2Config
    from train_llama2 import Llama2, LlamaConfig
    rng = np.random.default_rng(0)
    config = GPT2Config.from_depth(1, max_seq_len=16, vocab_size=101)
    bf16 = GPT2.random(config, seed=1, precision="bf16")
    bf16.forward(rng.integers(0, 101, (2, 8)), rng.integers(0, 101, (2, 8)))
    bf16.zero_grad()
    bf16.backward()
    bf16.update(1e-2, 0.9, 0.95, 1e-8, 0.0, 1)   # the master weights now off the bf16 grid
    assert not np.array_equal(bf16.params, bf16.params_as_run())
    bf16.save(tmp_path / "v5.bin")
    assert checkpoint_dtype(tmp_path / "v5.bin") == "bfloat16"
    fp32 = GPT2.from_checkpoint(tmp_path / "v5.bin", precision="fp32")
    assert fp32.precision == "fp32" and np.array_equal(fp32.params, bf16.params_as_run())
    fp32.params = bf16.params   # off the grid again
    fp32.save(tmp_path / "v3.bin")
    assert checkpoint_dtype(tmp_path / "v3.bin") == "float32"
    again = GPT2.from_checkpoint(tmp_path / "v3.bin", precision="bf16")
    assert np.array_equal(again.params, bf16.params)   # the master weights: the file's
    nearest = bfloat16_bits_to_float32(float32_to_bfloat16_bits(bf16.params))
    assert np.array_equal(again.params_as_run(), nearest)

    llama = Llama2.random(LlamaConfig.from_name("d1", vocab_size=97, max_seq_len=16), seed=1,
                          precision="bf16")
    llama.save(tmp_path / "llama.bin")
    assert np.array_equal(Llama2.from_checkpoint(tmp_path / "llama.bin").params, llama.params)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_bf16_resume_rounds_as_the_last_update_did(tmp_path, family):
    """The bf16 parameters of a resumed model are those the run had, also when the last update
    was before the checkpoint's step (updates skipped by -sl/-sg): from a bf16 model file
    (GPT-2), else rounded from the state's master weights with the last update's t (Llama)."""
    from train_gpt2 import GPT2, GPT2Config
    from train_llama2 import Llama2, LlamaConfig
    Model, config = {
        "gpt2": (GPT2, GPT2Config.from_depth(1, max_seq_len=16, vocab_size=101)),
        "llama": (Llama2, LlamaConfig.from_name("d1", vocab_size=101, max_seq_len=16))}[family]
    rng = np.random.default_rng(0)
    model = Model.random(config, seed=1, precision="bf16")
    for t in (1, 2):   # then steps 3-5 skipped: the checkpoint at step 5 holds t = 2's rounding
        model.forward(rng.integers(0, 101, (2, 8)), rng.integers(0, 101, (2, 8)))
        model.zero_grad()
        model.backward()
        model.update(1e-2, 0.9, 0.95, 1e-8, 0.0, t)
    write_shard(tmp_path / "s.bin", np.arange(200) % 101)
    loader = DataLoader(str(tmp_path / "s.bin"), 2, 8, shuffle=True)
    checkpoint.write_checkpoint(str(tmp_path), 5, model, loader)
    assert state_header(tmp_path / "state_00000005_00000.bin")[11] == 2
    model_path = checkpoint.checkpoint_paths(str(tmp_path), 5)[0]
    resumed = Model.from_checkpoint(model_path, precision="bf16")
    assert checkpoint.resume(str(tmp_path), 5, resumed, DataLoader(str(tmp_path / "s.bin"), 2, 8,
                                                                    shuffle=True)) == 5
    assert resumed.step == 2
    assert np.array_equal(resumed.params, model.params)
    assert np.array_equal(resumed.params_as_run(), model.params_as_run())
    assert np.array_equal(resumed.m, model.m) and np.array_equal(resumed.v, model.v)
    rounded_at_5 = Model.from_checkpoint(model_path, precision="bf16")
    rounded_at_5.set_master_weights(model.params)
    rounded_at_5.round_params(5)   # the step's seed would not give the run's parameters
    assert not np.array_equal(rounded_at_5.params_as_run(), model.params_as_run())
