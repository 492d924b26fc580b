"""Every staged kernel variant in dev/cpu/ (and the promoted kernel beside it) stays correct:
dev/ab.py's check - forward outputs and the gradients backward adds into non-zero buffers,
against the float64 reference (kernels/reference.py) - on small shapes.  Timings never run here.
The variants are the lab, built by `make dev` (CI does): without it their tests are skipped,
all for that one reason; once it is built, a variant that does not import fails."""
import os
import subprocess
import sys

import numpy as np
import pytest

import needs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dev import ab  # noqa: E402

SMALL = ab.SHAPES["small"][0]
# odd sizes: B*T not a multiple of 8 (llm.c's unrolled matmul falls back), C not a multiple
# of the vector width or of the tiles, a head size that is not 64
ODD = dict(B=3, T=7, C=40, NH=5, V=97, Vp=128, maxT=9, L=1)


def variants():
    """(kernel, module) for every variant (needs the lab) and every promoted kernel."""
    return [(kernel, name) for kernel in ab.KERNELS for name in ab.variant_names(kernel)]


@pytest.mark.parametrize("kernel,name", variants())
@pytest.mark.parametrize("shape", [SMALL, ODD], ids=["small", "odd"])
def test_variant_matches_reference(kernel, name, shape):
    if name.startswith("dev."):
        needs.lab()
    worst, rows = ab.check(kernel, name, shape)
    bad = [r for r in rows if not r[4] <= ab.KERNELS[kernel].tolerance]
    assert not bad, f"{name} is wrong: " + "; ".join(
        f"{case} {pass_} {tensor}: max abs err {a:.3g}, rel {r:.3g}" for case, pass_, tensor, a, r in bad)


def test_every_kernel_has_its_straight_port():
    # variant 1 is the llm.c port that the others are measured against
    for kernel in ("matmul", "attention", "layernorm", "gelu", "adamw", "crossentropy", "encoder"):
        assert f"dev.cpu.{kernel}_1" in ab.variant_names(kernel), kernel


def test_matmul_has_the_three_kinds():
    # straight port, hand-tiled, BLAS with its own thread pool
    names = ab.variant_names("matmul")
    for n in (1, 2, 3):
        assert f"dev.cpu.matmul_{n}" in names


def test_check_catches_a_wrong_kernel():
    # the checker itself: a "variant" that is off by a little must fail its tolerance
    class Wrong:
        @staticmethod
        def forward(out, inp):
            x = inp.astype(np.float64)
            out[:] = 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3))) * 1.001

        @staticmethod
        def backward(dinp, inp, dout):
            pass

    kernel = ab.KERNELS["gelu"]
    st = kernel.make(SMALL, {}, np.random.default_rng(0))
    errs = ab.check_case(kernel, Wrong, st)
    assert max(r for _, r in errs["forward"].values()) > kernel.tolerance
    assert max(r for _, r in errs["backward"].values()) > kernel.tolerance


def test_ab_cli_list():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "ab.py"), "--list"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0 and "matmul" in out.stdout


def test_ab_cli_check_only():
    needs.lab()
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "ab.py"), "gelu", "--shapes",
                          "small", "--check-only", "--threads", "1"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "gelu_1" in out.stdout and "WRONG" not in out.stdout


def test_unknown_kernel_is_an_error():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "ab.py"), "nosuchkernel"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode != 0 and "unknown kernel" in out.stderr


def test_bench_step_flops_match_the_issue():
    # 190.7 GFLOP per step for d12 at B=4, T=64: the matmuls and the causal half of attention
    from dev import bench_step
    from train_gpt2 import GPT2Config
    matmul, attention = bench_step.model_flops(GPT2Config.from_depth(12), 4, 64)
    assert abs((matmul + attention) / 1e9 - 190.7) < 0.1
