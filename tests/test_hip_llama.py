"""accel/hip's llama and classifier groups (accel/hip/llama.hip), on the CPU emulator.

test_hip.py runs every entry of the emulated build, these groups' too, through check:hip-emu at
odd shapes under every schedule and warp size, and test_hip_bf16.py against the CPU's bf16 table;
here: the same at shapes where every loop of these kernels takes several turns, a Llama step
through check: there (fp32, both warp sizes) and at bf16 against the CPU's bf16 model, the
committed fixture through test_llama2.py (fp32 and bf16, plain and check:), GPT-2 on hip taking
the classifier, train.py starting a Llama run on hip-emu, and the planted fault (query heads paired
with the wrong key/value heads) caught by check:.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from accel.backend import get_backend
from accel.hip import EMU_LIBRARY, EMU_LIBRARY_BF16
from accel.spec import BY_NAME, entries_of
from entries import SMALL, D12_WIDTHS, run_every_entry
from hip_emu import adamw_steps, checked, device, finish, first_mismatch, make, WARP_SIZES

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

GROUPS = ("llama", "classifier")
KERNELS = {name for name in entries_of(GROUPS) if BY_NAME[name].wrap}
# what a Llama step calls: its attention is flash's (the build has it), not llama.hip's
LLAMA_STEP = KERNELS - {"attention_gqa_forward", "attention_gqa_backward"} | {
    "flash_attention_gqa_forward", "flash_attention_gqa_backward"}
# Shapes where each loop takes several turns on a device of one compute unit (grids of at most 8
# blocks of 256 threads): T = 67 score rows (more than a warp's lanes), B T = 134 rows (more than
# the 64 warps of the grid at warp size 32), 6 query heads on 2 key/value heads of size 6 (even:
# RoPE's paired loads; SMALL's 5 takes the unpaired ones), V = 601 (more than a vocabulary
# block's 512 threads), N = B T 4 C = 19,296 elements (more than the grid's 2,048 threads); and for
# the cache group, P = 200 cached positions (P + T = 267 keys, more than a block's 256 threads).
LOOPS = dict(B=2, T=67, C=36, NH=6, NKV=2, hs=6, OC=40, V=601, Vp=608, P=200)
# the wrong key/value head for a query head, planted in both of the build's grouped-query
# attentions: llama.hip's (the every-entry tests) and flash.hip's (what a Llama step runs)
PLANTS = "-DACCEL_HIP_PLANT_GQA_HEAD -DACCEL_HIP_PLANT_FLASH_KV_HEAD"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The emulated builds where the backends look for them, and one with the planted fault."""
    planted = str(tmp_path_factory.mktemp("hip_gqa_head"))
    paths = {"emu": EMU_LIBRARY, "emu_bf16": EMU_LIBRARY_BF16, "gqa_head": f"{planted}/libgpt2_hip_emu.so"}
    jobs = [make("emu"), make(paths["gqa_head"], build=planted, defines=PLANTS)]
    finish(*jobs)
    return paths


# --- the kernels where their loops wrap ---------------------------------------------------------

@pytest.mark.parametrize("warp_size", WARP_SIZES)
def test_every_entry_matches_the_oracle_where_the_loops_wrap(builds, warp_size):
    """Every entry the build has (GPT-2's softmax at V = 601 too, which a GPT-2 step no longer
    calls now that it takes the classifier), on one compute unit, shuffled."""
    backend = checked(builds["emu"], ("shuffled", 3), warp_size, compute_units=1)
    run_every_entry(backend, dims=LOOPS)
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    assert KERNELS <= set(report["entries"])


def llama_step(backend, precision="fp32", steps=1, seed=0):
    """[(loss, gradients, parameters after the update)] of AdamW steps of a random one-layer Llama at LOOPS' shapes (a separate
    classifier, the output head's V = 601 rows), and the model."""
    from train_llama2 import Llama2, LlamaConfig
    config = LlamaConfig(dim=LOOPS["C"], n_layers=1, n_heads=LOOPS["NH"], n_kv_heads=LOOPS["NKV"],
                         vocab_size=LOOPS["V"], hidden_dim=52, max_seq_len=72, shared_classifier=False)
    model = Llama2.random(config, seed=seed, backend=backend, precision=precision)
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, (LOOPS["B"], LOOPS["T"] + 1)).astype(np.int32)
    return adamw_steps(model, tokens, steps), model


@pytest.mark.parametrize("warp_size", WARP_SIZES)
def test_a_llama_step_matches_the_oracle_where_the_loops_wrap(builds, warp_size):
    backend = checked(builds["emu"], ("shuffled", 5), warp_size, compute_units=1)
    llama_step(backend, steps=2)
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    assert LLAMA_STEP <= set(report["entries"]), LLAMA_STEP - set(report["entries"])


def test_a_llama_trains_at_bf16_as_on_the_cpu(builds):
    """The bf16 build against the CPU's bf16 model at LOOPS' shapes (one compute unit, warp size
    64, shuffled): 3 steps, losses, gradients and master weights as test_hip_bf16.py's GPT-2 d2."""
    from test_hip_bf16 import assert_trains_alike
    device.configure_emulator("shuffled", 6, 64, 1, library=builds["emu_bf16"])
    hip, _ = llama_step(device.load(builds["emu_bf16"], "hip-emu", "bf16"), "bf16", steps=3)
    cpu, _ = llama_step(get_backend("cpu", "bf16"), "bf16", steps=3)
    assert_trains_alike(hip, cpu)


# --- the whole model: test_llama2.py, and GPT-2's classifier ----------------------------------------

@pytest.mark.parametrize("args", [("--backend", "hip-emu"), ("--backend", "check:hip-emu"),
                                  ("--backend", "hip-emu", "--precision", "bf16"),
                                  ("--backend", "check:hip-emu", "--precision", "bf16")],
                         ids=["hip-emu", "check", "bf16", "check-bf16"])
def test_test_llama2_passes_on_the_fixture(builds, args):
    done = subprocess.run([sys.executable, "test_llama2.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "overall okay: 1" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"[Backend] {args[1]}" in done.stdout
    if "check" in args[1]:
        assert "outputs compared, all within tolerance" in done.stdout


def test_gpt2_on_hip_takes_the_classifier(builds):
    from train_gpt2 import GPT2, GPT2Config
    config = GPT2Config(max_seq_len=8, vocab_size=37, padded_vocab_size=40, num_layers=1, num_heads=2, channels=8)
    assert GPT2.random(config, backend=get_backend("hip-emu")).classifier
    assert GPT2.random(config, backend=get_backend("hip-emu", "bf16"), precision="bf16").classifier


def test_train_py_runs_a_llama_step_on_hip_emu(builds, tmp_path):
    """train.py --backend hip-emu with a random Llama (d1, GPT-2's vocabulary for the committed
    data): one step and the validation loss, on the emulated build."""
    done = subprocess.run([sys.executable, "train.py", "-e", "d1", "--family", "llama", "--backend", "hip-emu", "-x", "1",
                           "-b", "1", "-t", "8", "-s", "0", "-v", "100", "-o", str(tmp_path / "run")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "| backend               | hip-emu" in done.stdout
    assert "step    1/1 | loss" in done.stdout and "val loss" in done.stdout


# --- the planted fault ------------------------------------------------------------------------

def test_wrong_key_value_head_is_caught(builds):
    """attention_gqa_forward pairing query head h with key/value head h % NKV instead of
    h / (NH / NKV): named by check: at SMALL's 4 heads on 2 and at d12's widths (12 on 4); the
    same pairing where NKV = NH or NKV = 1, so there it passes (why the shapes have NKV < NH)."""
    for dims in (SMALL, D12_WIDTHS):
        backend = checked(builds["gqa_head"])
        run_every_entry(backend, dims=dims, groups=("llama",))
        assert first_mismatch(backend) == "attention_gqa_forward", backend.summary()
    for nkv in (SMALL["NH"], 1):
        backend = checked(builds["gqa_head"])
        run_every_entry(backend, dims=dict(SMALL, NKV=nkv), groups=("llama",))
        assert first_mismatch(backend) is None, (nkv, backend.summary())


def test_wrong_key_value_head_is_caught_in_a_llama_step(builds):
    backend = checked(builds["gqa_head"], warp_size=64)
    llama_step(backend)
    assert first_mismatch(backend) == "flash_attention_gqa_forward", backend.summary()
