# kernels.rope and its tables (llmc/rope_tables.py): the tables against float64 and the same on every
# SIMD level of NumPy's, forward and backward against float64 NumPy references and Meta's
# complex-number formulation of RoPE under PyTorch autograd.
import os
import subprocess
import sys

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import needs
from kernels import rope
from llmc.rope_tables import rope_tables

THETA = 10000.0  # Llama 2's rope_theta


# ----------------------------------------------------------------------------
# float64 references

def rope_angles_ref(T, hs, theta=THETA):
    """(T, hs/2): t * theta^(-2i/hs)."""
    return np.arange(T)[:, None] * theta ** (-np.arange(0, hs, 2) / hs)[None, :]


def rope_forward_ref(inp, theta=THETA):
    """inp (B,T,NH,hs): each pair (2i, 2i+1) rotated by angle[t, i], in float64."""
    x = inp.astype(np.float64)
    angle = rope_angles_ref(x.shape[1], x.shape[3], theta)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * np.cos(angle) - x1 * np.sin(angle)
    out[..., 1::2] = x0 * np.sin(angle) + x1 * np.cos(angle)
    return out


def rope_backward_ref(dout, theta=THETA):
    """The gradient through the rotation: dout rotated back by -angle, in float64."""
    angle = rope_angles_ref(dout.shape[1], dout.shape[3], theta)[None, :, None, :]
    d = dout.astype(np.float64)
    d0, d1 = d[..., 0::2], d[..., 1::2]
    dinp = np.empty_like(d)
    dinp[..., 0::2] = d0 * np.cos(angle) + d1 * np.sin(angle)
    dinp[..., 1::2] = d1 * np.cos(angle) - d0 * np.sin(angle)
    return dinp


# ----------------------------------------------------------------------------

# (B, T, NH, hs): odd B*T, hs not a multiple of 8, one head, hs = 2, T = 1
SHAPES = [(3, 7, 6, 16), (2, 13, 2, 10), (1, 5, 1, 2), (2, 1, 3, 8),
          (3, 7, 5, 10002)]  # the last above kernels.parallel's SERIAL_BELOW: threaded


def run_forward(inp, maxT=None, theta=THETA):
    freqs_cos, freqs_sin = rope_tables(maxT or inp.shape[1], inp.shape[3], theta)
    out = np.full_like(inp, np.nan)
    rope.forward(out, inp, freqs_cos, freqs_sin)
    return out


def test_tables_match_float64():
    freqs_cos, freqs_sin = rope_tables(4096, 128, THETA)
    angle = rope_angles_ref(4096, 128)
    # computed in double and rounded once: within an ulp even at t = 4095
    np.testing.assert_allclose(freqs_cos, np.cos(angle), rtol=0, atol=1.2e-7)
    np.testing.assert_allclose(freqs_sin, np.sin(angle), rtol=0, atol=1.2e-7)


@pytest.mark.parametrize("B,T,NH,hs", SHAPES)
def test_forward_matches_numpy(B, T, NH, hs):
    inp = np.random.default_rng(B * T).standard_normal((B, T, NH, hs)).astype(np.float32)
    # tables longer than T: the kernel reads rows 0..T-1
    np.testing.assert_allclose(run_forward(inp, maxT=T + 3), rope_forward_ref(inp),
                               rtol=1e-5, atol=1e-6)


def test_forward_theta_is_used():
    inp = np.random.default_rng(0).standard_normal((1, 9, 2, 8)).astype(np.float32)
    np.testing.assert_allclose(run_forward(inp, theta=500000.0),
                               rope_forward_ref(inp, theta=500000.0), rtol=1e-5, atol=1e-6)


def test_forward_in_place():
    inp = np.random.default_rng(1).standard_normal((3, 7, 6, 16)).astype(np.float32)
    expected = run_forward(inp)
    freqs_cos, freqs_sin = rope_tables(7, 16)
    x = inp.copy()
    rope.forward(x, x, freqs_cos, freqs_sin)
    np.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("num_threads", [1, 3])
@pytest.mark.parametrize("B,T,NH,hs", SHAPES)
def test_backward_adds_and_matches_numpy_and_torch(B, T, NH, hs, num_threads):
    rng = np.random.default_rng(B + T + NH)
    inp = rng.standard_normal((B, T, NH, hs)).astype(np.float32)
    dout = rng.standard_normal((B, T, NH, hs)).astype(np.float32)
    dinp_start = rng.standard_normal((B, T, NH, hs)).astype(np.float32)
    dinp = dinp_start.copy()
    freqs_cos, freqs_sin = rope_tables(T, hs)
    with threadpool_limits(limits=num_threads, user_api="openmp"):
        rope.backward(dinp, dout, freqs_cos, freqs_sin)
    dinp_ref = rope_backward_ref(dout)
    np.testing.assert_allclose(dinp, dinp_start + dinp_ref, rtol=1e-5, atol=1e-5)

    # Meta's apply_rotary_emb: pairs as complex numbers times exp(i angle), differentiated
    torch = needs.package("torch")
    x = torch.tensor(inp, dtype=torch.float64, requires_grad=True)
    freqs_cis = torch.polar(torch.ones(T, hs // 2, dtype=torch.float64),
                            torch.from_numpy(rope_angles_ref(T, hs)))
    x_complex = torch.view_as_complex(x.reshape(B, T, NH, hs // 2, 2))
    out = torch.view_as_real(x_complex * freqs_cis[None, :, None, :]).flatten(3)
    np.testing.assert_allclose(rope_forward_ref(inp), out.detach().numpy(), rtol=1e-12, atol=1e-12)
    out.backward(torch.tensor(dout, dtype=torch.float64))
    np.testing.assert_allclose(dinp_ref, x.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_backward_undoes_forward():
    # the rotation is orthogonal: backward of forward's output gives back the input
    inp = np.random.default_rng(2).standard_normal((2, 13, 2, 10)).astype(np.float32)
    freqs_cos, freqs_sin = rope_tables(13, 10)
    back = np.zeros_like(inp)
    rope.backward(back, run_forward(inp), freqs_cos, freqs_sin)
    np.testing.assert_allclose(back, inp, rtol=1e-5, atol=1e-5)


def test_bad_arguments_raise():
    x = np.zeros((2, 5, 3, 8), np.float32)
    freqs_cos, freqs_sin = rope_tables(5, 8)
    with pytest.raises(ValueError, match="out"):
        rope.forward(np.zeros((2, 5, 3, 6), np.float32), x, freqs_cos, freqs_sin)
    with pytest.raises(ValueError, match="dinp"):
        rope.backward(np.zeros((2, 4, 3, 8), np.float32), x, freqs_cos, freqs_sin)
    with pytest.raises(ValueError, match="exceeds"):
        rope.forward(x, x, *rope_tables(4, 8))
    with pytest.raises(ValueError, match="freqs_cos"):
        rope.forward(x, x, *rope_tables(5, 6))
    with pytest.raises(ValueError, match="freqs_sin"):
        rope.forward(x, x, freqs_cos, np.zeros((5, 3), np.float32))
    with pytest.raises(ValueError, match="odd"):
        odd = np.zeros((2, 5, 3, 7), np.float32)
        rope.forward(odd, odd, freqs_cos, freqs_sin)
    with pytest.raises(ValueError, match="even"):
        rope_tables(5, 7)
    with pytest.raises(ValueError, match="theta"):
        rope_tables(5, 8, 0.0)


# ----------------------------------------------------------------------------
# the same tables whatever the CPU: NumPy's float64 power, cos and sin take other SIMD paths
# by CPU (SVML on AVX-512), which differ in a float64's last bits; rounded once to float32 they
# must not show.  A subprocess with NumPy's dispatch turned down to its baseline stands in for
# a CPU without this one's extensions (an AVX2-only machine where this one has AVX-512).

# every preset's tables (max_seq_len, head size, theta), the fixture's, and Llama 3's theta
TABLE_SIZES = [(256, 48, 1e4), (1024, 64, 1e4), (2048, 64, 1e4), (4096, 128, 1e4), (16, 6, 1e4),
               (8192, 128, 5e5)]

TABLES_SCRIPT = """
import sys
import numpy as np
from llmc.rope_tables import rope_tables
from test_rope import numpy_dispatch_features
sizes = eval(sys.argv[2])
np.savez(sys.argv[1], *[t for size in sizes for t in rope_tables(*size)],
         enabled=numpy_dispatch_features())
"""


def numpy_dispatch_features():
    """The SIMD extensions above NumPy's baseline that it dispatches to on this CPU."""
    try:
        from numpy._core import _multiarray_umath
    except ImportError:   # NumPy 1
        from numpy.core import _multiarray_umath
    features = _multiarray_umath.__cpu_features__
    return [f for f in _multiarray_umath.__cpu_dispatch__ if features[f]]


def test_tables_are_the_same_under_numpys_baseline_dispatch(tmp_path):
    features = numpy_dispatch_features()
    if not features:
        pytest.skip("NumPy dispatches to nothing above its baseline on this CPU: nothing to compare")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # with what the caller disabled already: NumPy reads only the child's list
    disabled = os.environ.get("NPY_DISABLE_CPU_FEATURES", "").split() + features
    env = dict(os.environ, NPY_DISABLE_CPU_FEATURES=" ".join(disabled),
               PYTHONPATH=os.pathsep.join([root, os.path.join(root, "tests")]))
    out = tmp_path / "baseline.npz"
    subprocess.run([sys.executable, "-c", TABLES_SCRIPT, str(out), repr(TABLE_SIZES)], env=env,
                   check=True, timeout=300)
    baseline = np.load(out)
    assert list(baseline["enabled"]) == []   # it really ran on the baseline paths
    ours = [t for size in TABLE_SIZES for t in rope_tables(*size)]
    for i, table in enumerate(ours):
        assert np.array_equal(table.view(np.uint32), baseline[f"arr_{i}"].view(np.uint32)), \
            (TABLE_SIZES[i // 2], "sin" if i % 2 else "cos")
