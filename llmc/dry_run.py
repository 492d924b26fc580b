"""
A dry run: what one training step of a model would take, computed without allocating it.

    python train.py -e d12 --dry-run [-b B -t T --recompute POLICY]

memory_plan: the bytes the model allocates, the dict Model.memory() reports after a training
step (parameters, their gradients, AdamW's m and v, the activations kept under the recompute
policy, the activation gradients, the tokens), from the family's shape functions
(config.param_shapes, Family.activation_shapes) laid out by llmc/recompute.py: the code the
model lays its buffers out with, so the plan and the model cannot disagree. At bf16
(train.py --precision bf16, llmc/model.pyx) the activations and their gradients take 2 bytes
(the family's FP32_ACTIVATIONS 4: statistics, losses), the parameters 2 bytes plus 4 of float32
master weights, the gradients and AdamW's m and v 4 each.

flops_plan: the family's forward FLOPs per token (Family.flops_per_token: matmuls 2*C*OC per
token, causal attention 2*C*(T+1) per layer), and per step
    B*T * (3 * forward + recomputed layers * one layer's forward)
(backward is twice the forward: dinp and dweight; the policy's recompute adds forwards).

The step time estimate divides those FLOPs by the GEMM rate this machine reaches now
(kernels.matmul, the product's own matmul, one 1024^3 product, best of 3, about 0.1 s; at bf16
kernels.matmul_bf16's, on bf16 operands): the time the FLOPs alone take, a floor; the
memory-bound kernels (layernorm, GELU, softmax, AdamW) come on top.

dry_run_text: what train.py --dry-run prints, all of the above and every policy side by side.
"""
import time

import numpy as np

from accel.hooks import format_bytes
from llmc import recompute

__all__ = ["dry_run_text", "flops_plan", "measure_gflops", "memory_plan"]

FLOAT = 4   # bytes: float32 everywhere, int32 tokens (at bf16: the master weights, gradients,
            # AdamW's m and v, FP32_ACTIVATIONS)


def _floats(shapes):
    return sum(int(np.prod(shape, dtype=np.int64)) for _, shape in shapes)


def memory_plan(family, config, B, T, policy="all", backend="cpu", precision="fp32",
                trainable=True, grad_precision="fp32", master_weights=True):
    """Bytes of each buffer a training step of family(config) at (B, T) allocates under the
    policy on the backend at the precision ("fp32", "bf16", "fp16"), its parameter gradients
    of grad_precision: {params, grads, adamw, activations, activation_grads, tokens};
    trainable=False (a model made for inference or a LoRA base) or master_weights=False: params
    without float32 master weights (llmc/model.pyx)."""
    from accel.backend import get_backend
    from accel.spec import GRAD_PRECISIONS, PRECISIONS
    from llmc.model import Layout   # the model's own layout: each tensor aligned to its size
    itemsize = PRECISIONS[precision][1]
    plan = recompute.RecomputePlan(policy, family.num_layers_of(config))
    options = family.activation_options(get_backend(backend, precision))
    embedding, layer, head = family.activation_shapes(config, B, T, **options)

    def nbytes(shapes):   # as Model._activation_layout lays them out
        return Layout(shapes, [FLOAT if name in family.FP32_ACTIVATIONS else itemsize
                               for name, _ in shapes]).nbytes
    count = _floats(config.param_shapes())
    params = FLOAT * count
    return dict(
        # at bf16 (fp16) the kernels' bf16 (fp16) parameters beside the float32 master weights
        params=itemsize * count + (FLOAT * count if precision != "fp32" and trainable and
                                   master_weights else 0),
        grads=GRAD_PRECISIONS[grad_precision][1] * count, adamw=2 * params,
        activations=nbytes(recompute.activation_shapes(plan, embedding, layer, head)),
        activation_grads=nbytes(recompute.gradient_shapes(layer, head, family.NO_GRAD)),
        tokens=2 * FLOAT * B * T)


def flops_plan(family, config, B, T, policy="all"):
    """FLOPs of one training step at (B, T) under the policy: {forward_per_token (the whole
    model's), forward, backward, recompute, step} (the last four per step)."""
    plan = recompute.RecomputePlan(policy, family.num_layers_of(config))
    f = family.flops_per_token(config, T)
    layer = f["layer_matmul"] + f["layer_attention"]
    forward = plan.num_layers * layer + f["head_matmul"]
    tokens = B * T
    step = dict(forward_per_token=forward, forward=tokens * forward,
                backward=2 * tokens * forward, recompute=tokens * plan.recomputed * layer)
    step["step"] = step["forward"] + step["backward"] + step["recompute"]
    return step


def measure_gflops(n=1024, repeats=3, precision="fp32"):
    """The GEMM rate (GFLOP/s) of the kernels' matmul now, on its usual threads: an (n, n) x
    (n, n) product, best of repeats after one warm-up; kernels.matmul's sgemm at fp32,
    kernels.matmul_bf16's at bf16 (bf16 operands and output as uint16 bits, float32 sums: the
    bf16 GEMM of kernels.blas.BF16_LIBRARY); the sgemm at fp16 too, which the CPU's fp16 table
    runs on widened copies."""
    rng = np.random.default_rng(0)
    inp = rng.standard_normal((1, n, n), dtype=np.float32)
    weight = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((1, n, n), dtype=np.float32)
    if precision != "bf16":
        from kernels import matmul
    else:
        from kernels import matmul_bf16 as matmul
        from llmc.formats import float32_to_bfloat16_bits
        inp, weight = float32_to_bfloat16_bits(inp), float32_to_bfloat16_bits(weight)
        out = np.empty((1, n, n), dtype=np.uint16)
    matmul.forward(out, inp, weight)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul.forward(out, inp, weight)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


def _listed(words):
    """"a", "a and b", "a, b and c"."""
    return " and ".join(filter(None, [", ".join(words[:-1]), words[-1]]))


def _seconds(t):
    if t < 10:
        return f"{t * 1e3:,.1f} ms"
    return f"{t:,.1f} s" if t < 600 else f"{t / 3600:,.2f} h"


def dry_run_text(family, config, name, B, T, policy="all", backend="cpu", gflops=None,
                 precision="fp32", grad_precision="fp32", master_weights=True):
    """The dry run's text at a precision (its gradients at grad_precision, with or without
    master weights): parameters, memory by buffer (on the backend), FLOPs, the step time
    estimate (at gflops, the precision's GEMM rate measured when None), and every policy's
    activation memory and FLOPs side by side."""
    gflops = measure_gflops(precision=precision) if gflops is None else gflops
    plan = recompute.RecomputePlan(policy, family.num_layers_of(config))
    memory = memory_plan(family, config, B, T, policy, backend, precision,
                         grad_precision=grad_precision, master_weights=master_weights)
    narrow = precision != "fp32"   # bf16, fp16: 2-byte parameters and activations
    flops = flops_plan(family, config, B, T, policy)
    f = family.flops_per_token(config, T)
    seconds = flops["step"] / (gflops * 1e9)
    internals = "1 layer's internals" if plan.slots == 1 else f"{plan.slots} layers' internals"
    params_note = (f"   ({precision} + float32 master weights)" if master_weights else
                   f"   ({precision}, no master weights)")
    narrow_kinds = ["parameters", "activations"] + (["gradients"] if grad_precision == precision
                                                    else [])
    float_kinds = ((["master weights"] if master_weights else []) +
                   (["gradients"] if grad_precision == "fp32" else []) +
                   ["AdamW", "statistics", "losses"])
    lines = [
        f"dry run: {name} ({config.describe()}), B={B} T={T}, recompute {plan.policy}"
        f"{f', precision {precision}' if narrow else ''}",
        f"parameters: {config.num_parameters():,}",
        f"memory ({precision}: {_listed(narrow_kinds)}; float32: {', '.join(float_kinds)}):"
        if narrow else "memory (float32):",
        f"  parameters            {format_bytes(memory['params']):>12}"
        f"{params_note if narrow else ''}",
        f"  gradients             {format_bytes(memory['grads']):>12}",
        f"  AdamW m + v           {format_bytes(memory['adamw']):>12}",
        f"  activations           {format_bytes(memory['activations']):>12}   ({internals}, "
        f"{plan.outputs} layer output{'s' if plan.outputs != 1 else ''} kept of {plan.num_layers})",
        f"  activation gradients  {format_bytes(memory['activation_grads']):>12}   (the head's, "
        f"one layer's, two streams)",
        f"  tokens                {format_bytes(memory['tokens']):>12}",
        f"  total                 {format_bytes(sum(memory.values())):>12}   (+ the Python "
        f"process, about 0.1-0.2 GiB)",
        f"FLOPs: forward {flops['forward_per_token'] / 1e6:,.1f} M per token = L * (matmuls "
        f"{f['layer_matmul'] / 1e6:,.2f} M + attention {f['layer_attention'] / 1e6:,.2f} M) + "
        f"head {f['head_matmul'] / 1e6:,.2f} M",
        f"  per step: forward {flops['forward'] / 1e9:,.2f} G + backward (2x) "
        f"{flops['backward'] / 1e9:,.2f} G + recompute ({plan.recomputed} layer forwards) "
        f"{flops['recompute'] / 1e9:,.2f} G = {flops['step'] / 1e9:,.2f} G",
        f"step time estimate: {_seconds(seconds)} at {gflops:.0f} GFLOP/s (this machine's "
        f"{'bf16 GEMM' if precision == 'bf16' else 'sgemm'} now), {B * T / seconds:,.3g} tokens/s; a floor: "
        f"the FLOPs alone",
        "every policy:          activations + grads   step FLOPs",
    ]
    L = plan.num_layers
    policies = ["all", "every-2" if L > 2 else None, "sqrt", "boundary", "none"]
    for p in dict.fromkeys(x for x in policies if x):   # d1..d4: sqrt may equal every-2
        m = memory_plan(family, config, B, T, p, backend, precision)
        fl = flops_plan(family, config, B, T, p)
        mark = "  <-" if p == plan.policy else ""
        lines.append(f"  {p:<20} {format_bytes(m['activations'] + m['activation_grads']):>12}"
                     f"   {fl['step'] / 1e9:10,.2f} G{mark}")
    return "\n".join(lines)
