"""
Every kernel entry of a backend called once on random data, its arguments made from
accel/spec.py: what tests/test_backend.py, test_hip.py, test_metal_emu.py and test_llama_model.py
run through check:NAME.

    run_every_entry(backend)                 odd shapes (SMALL), every group the backend fills
    run_every_entry(backend, dims=D12_WIDTHS, groups=("linear",))
"""
import numpy as np

from accel.spec import BY_NAME, ORDER, evaluate
from kernels.bf16 import to_bf16
from kernels.fp16 import to_fp16

# odd sizes: no dimension a multiple of a tile, a warp or another dimension
SMALL = dict(B=3, T=7, C=20, NH=4, NKV=2, hs=5, OC=60, H=26, V=37, Vp=40, P=6, R=3)
# GPT-2 d12's widths at a small B*T (odd B and T), for check: at the shapes users run
D12_WIDTHS = dict(B=3, T=5, C=768, NH=12, NKV=4, hs=64, OC=3072, H=2048, V=50257, Vp=50304,
                  P=250, R=16)


def numbers(entry, dims):
    """The entry's number arguments at these dims: N, n (elements) are a wide layer's."""
    return dict(dims, N=dims["B"] * dims["T"] * 4 * dims["C"], n=101,
                eps=1e-8 if entry == "adamw_update" else 1e-5, value=0.25, lr=1e-3, beta1=0.9,
                beta2=0.999, weight_decay=0.01, grad_scale=1.0, t=3, first=5, seed=7, scale=2.0,
                p=0.25, stream=3)


def host_data(arg, dims, rng):
    """A pointer argument's values on the host, as the spec's init says: int32 token ids
    (targets: about a quarter of them -1, not scored, the first always; the last 0, the id a mask
    off by one would skip too), or float32 (before any rounding to the table's precision)."""
    n = evaluate(arg.elements, dims)
    if arg.init == "tokens":
        return rng.integers(0, dims["V"], n).astype(np.int32)
    if arg.init == "targets":
        targets = np.where(rng.random(n) < 0.25, -1, rng.integers(0, dims["V"], n))
        targets[0], targets[-1] = -1, 0
        return targets.astype(np.int32)
    if arg.init == "positive":
        data = rng.random(n)
    elif arg.init == "small":
        data = rng.standard_normal(n) / 10
    elif arg.init == "rope":
        data = np.cos(rng.random(n) * np.pi)
    else:
        data = rng.standard_normal(n)
    return data.astype(np.float32)


def fill(backend, arg, dims, rng):
    """A Buffer for a pointer argument, filled as the spec's init says (a floatX one in the
    backend's precision, a floatG one in its gradients')."""
    data = host_data(arg, dims, rng)
    precision, itemsize = ((backend.precision, backend.itemsize) if arg.floatx else
                           (backend.grad_precision, backend.grad_itemsize) if arg.floatg else
                           ("fp32", 4))
    buffer = backend.alloc(itemsize * data.size)
    narrow = {"bf16": to_bf16, "fp16": to_fp16}.get(precision)
    buffer.load(narrow(data) if narrow else data)
    return buffer


def call_entry(backend, name, dims, rng, with_optional=True):
    """One call of an entry; returns what it returns.  Inputs marked init=forward (a backward's
    saved activations) are what the forward entry writes from the inputs the two share."""
    entry = BY_NAME[name]
    values = numbers(name, dims)
    made = {a.name: fill(backend, a, values, rng) for a in entry.args
            if a.pointer and a.init != "forward" and (with_optional or not a.optional)}
    if any(a.init == "forward" for a in entry.args):
        forward = BY_NAME[name.replace("_backward", "_forward")]
        forward_args = [values[a.name] if not a.pointer else
                        made.get(a.name) or fill(backend, a, values, rng) for a in forward.args]
        backend.call(forward.name, *forward_args)
        for a, value in zip(forward.args, forward_args):
            made.setdefault(a.name, value)
    return backend.call(name, *[made.get(a.name) if a.pointer else values[a.name]
                                for a in entry.args])


def run_every_entry(backend, dims=SMALL, seed=0, groups=None):
    """Call each kernel entry of these groups (of every group the backend fills) once, and once
    more with its optional pointers None where it has any."""
    rng = np.random.default_rng(seed)
    groups = backend.groups if groups is None else groups
    for name in ORDER:
        entry = BY_NAME[name]
        if not entry.wrap or entry.group not in groups:
            continue
        result = call_entry(backend, name, dims, rng)
        if entry.returns != "void":
            assert np.isfinite(result), f"{name} returned {result}"
        if any(a.optional for a in entry.args):
            call_entry(backend, name, dims, rng, with_optional=False)
