"""The dry-run planner (llmc/dry_run.py): its bytes are what a real model allocates, its FLOPs
those of dev/bench_step.py, and train.py --dry-run prints it without training."""
import os
import subprocess
import sys

import numpy as np
import pytest

from accel import cpu
from dev import bench_step   # its FLOP count, written apart
from llmc.dry_run import dry_run_text, flops_plan, measure_gflops, memory_plan
from train_gpt2 import GPT2, GPT2Config
from train_llama2 import PRESETS, Llama2, LlamaConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

POLICIES = ["all", "boundary", "sqrt", "every-2", "none"]


def training_step_memory(model, B, T):
    rng = np.random.default_rng(0)
    V = model.config.vocab_size
    model.forward(rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T)))
    model.zero_grad()
    model.backward()
    model.update(1e-3, 0.9, 0.999, 1e-8, 0.0, 1)
    return model.memory()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("depth, B, T", [(1, 3, 7), (3, 2, 5), (4, 1, 9)])
def test_planned_bytes_are_what_a_training_step_allocates(depth, B, T, policy):
    config = GPT2Config.from_depth(depth, max_seq_len=16, vocab_size=101)
    model = GPT2.random(config, recompute=policy)
    assert training_step_memory(model, B, T) == memory_plan(GPT2, config, B, T, policy)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name, B, T", [("d2", 3, 7), ("d3", 2, 5), ("d4", 1, 9)])
def test_planned_bytes_of_llama_are_what_it_allocates(name, B, T, policy):
    config = LlamaConfig.from_name(name, vocab_size=97, max_seq_len=16)
    model = Llama2.random(config, recompute=policy)
    assert training_step_memory(model, B, T) == memory_plan(Llama2, config, B, T, policy)


@pytest.mark.parametrize("policy", ["all", "sqrt", "none"])
@pytest.mark.parametrize("family, config", [
    (GPT2, GPT2Config.from_depth(3, max_seq_len=16, vocab_size=101)),
    (Llama2, LlamaConfig.from_name("d3", vocab_size=97, max_seq_len=16))])
def test_planned_bytes_at_bf16_are_what_a_training_step_allocates(family, config, policy):
    """bf16: the activations and their gradients at 2 bytes but FP32_ACTIVATIONS, each tensor
    aligned as the model lays it out; the parameters 2 bytes plus 4 of master weights; the
    gradients and AdamW's m and v 4 each."""
    B, T = 2, 7   # odd sizes: bf16 tensors that end off a 4-byte boundary
    model = family.random(config, recompute=policy, precision="bf16")
    planned = memory_plan(family, config, B, T, policy, precision="bf16")
    assert training_step_memory(model, B, T) == planned
    fp32 = memory_plan(family, config, B, T, policy)
    P = config.num_parameters()
    assert planned["params"] == 6 * P and fp32["params"] == 4 * P
    assert {k: planned[k] for k in ("grads", "adamw", "tokens")} == \
        {k: fp32[k] for k in ("grads", "adamw", "tokens")}
    # the activations: the bf16 ones in half their fp32 bytes, the float32 ones (statistics,
    # losses) in all of theirs, each of those after at most 2 bytes of alignment
    layout = model.act_layout
    bf16 = sum(2 * size for name, size in zip(layout.names, layout.sizes)
               if name not in family.FP32_ACTIVATIONS)
    fp32_tensors = len(set(layout.names) & family.FP32_ACTIVATIONS)
    assert 0 <= planned["activations"] - (fp32["activations"] - bf16) <= 2 * fp32_tensors


def test_the_plan_text_at_bf16():
    text = dry_run_text(GPT2, GPT2Config.from_depth(12), "GPT-2 d12", 4, 256, "all",
                        gflops=100.0, precision="bf16")
    assert "recompute all, precision bf16" in text
    assert "parameters               712.3 MiB   (bf16 + float32 master weights)" in text
    assert "AdamW m + v              949.7 MiB" in text and "(this machine's bf16 GEMM now)" in text


@pytest.mark.parametrize("family, config", [
    (GPT2, GPT2Config.from_depth(2, max_seq_len=16, vocab_size=101)),
    (Llama2, LlamaConfig.from_name("d2", vocab_size=97, max_seq_len=16))])
def test_planned_bytes_follow_the_backends_attention(family, config):
    """Without flash attention GPT-2 and Llama keep (B,NH,T,T) buffers: the plan for that
    backend too."""
    backend = cpu.create(flash=False)
    model = family.random(config, backend=backend, recompute="sqrt")
    planned = memory_plan(family, config, 3, 7, "sqrt", backend=backend)
    assert training_step_memory(model, 3, 7) == planned
    assert planned["activations"] > memory_plan(family, config, 3, 7, "sqrt")["activations"]


@pytest.mark.parametrize("family, config", [
    (GPT2, GPT2Config.from_depth(12)), (GPT2, GPT2Config.from_depth(2)),
    (Llama2, PRESETS["stories15M"]), (Llama2, PRESETS["llama-1b"]),
    (Llama2, LlamaConfig.from_name("d3"))])
def test_flops_are_bench_steps(family, config):
    for B, T in [(4, 64), (3, 7)]:
        matmul, attention = bench_step.model_flops(config, B, T)
        assert flops_plan(family, config, B, T)["step"] == pytest.approx(matmul + attention,
                                                                        rel=1e-12)


def test_recompute_adds_the_recomputed_layers_forwards():
    config = GPT2Config.from_depth(12)
    f = GPT2.flops_per_token(config, 64)
    layer = 4 * 64 * (f["layer_matmul"] + f["layer_attention"])
    base = flops_plan(GPT2, config, 4, 64)["step"]
    assert flops_plan(GPT2, config, 4, 64, "boundary")["step"] == pytest.approx(base + 11 * layer)
    assert flops_plan(GPT2, config, 4, 64, "none")["step"] == pytest.approx(base + 66 * layer)


def test_the_plan_text_of_gpt2_124m():
    text = dry_run_text(GPT2, GPT2Config.from_depth(12), "GPT-2 d12", 4, 256, "sqrt",
                        gflops=100.0)
    assert "parameters: 124,475,904" in text
    assert "recompute sqrt" in text and "(4 layers' internals, 6 layer outputs kept of 12)" in text
    assert "AdamW m + v              949.7 MiB" in text
    for policy in POLICIES:
        assert f"\n  {policy} " in text


def test_the_gemm_rate_is_measured():
    assert measure_gflops(n=128, repeats=1) > 0
    assert measure_gflops(n=128, repeats=1, precision="bf16") > 0


def run_train(*args):
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                          text=True)


def test_train_dry_run_prints_the_plan_and_trains_nothing(tmp_path):
    done = run_train("-e", "d12", "--dry-run", "-b", "2", "-t", "128", "--recompute", "every-3",
                     "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "dry run: GPT-2 d12" in done.stdout and "recompute every-3" in done.stdout
    assert "B=2 T=128" in done.stdout and "step time estimate" in done.stdout
    assert not os.path.exists(tmp_path / "out")


def test_train_dry_run_of_llama_7b():
    done = run_train("--model", "llama-7b", "--dry-run", "-b", "1", "-t", "2048",
                     "--recompute", "sqrt", "--vocab-size", "32000")
    assert done.returncode == 0, done.stderr
    assert "dry run: Llama 2 llama-7b" in done.stdout
    parameters = PRESETS["llama-7b"].num_parameters()
    assert f"parameters: {parameters:,}" in done.stdout and parameters > 6.7e9
    assert "(6 layers' internals, 11 layer outputs kept of 32)" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["--recompute", "half"], "argument --recompute: unknown recompute policy 'half'"),
    (["--recompute", "every-0"], "unknown recompute policy 'every-0'"),
    (["-e", "d12", "-t", "2048", "--dry-run"], "-t 2048 exceeds the model's max sequence length"),
])
def test_train_refuses_bad_plans_in_one_line(args, message):
    done = run_train(*args)
    assert done.returncode in (1, 2) and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
