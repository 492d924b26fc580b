"""
Parity check of the Cython GPT-2 against a PyTorch reference, as llm.c's test_gpt2.c:
load a model and a debug state (a batch, its logits, loss and gradients, written by the
reference), run forward and compare logits and loss, run backward and compare all 16 gradient
tensors, then take 10 AdamW steps on the batch and compare the losses.

    python test_gpt2.py                                   # the committed tiny fixture
    python test_gpt2.py --model M.bin --state S.bin       # any llm.c-format pair
    python test_gpt2.py --backend check:cpu               # on a backend (accel/README.md)
    python test_gpt2.py --precision bf16                  # the model in bf16 (llm.c's PRECISION)
    python test_gpt2.py --backend check:metal-emu --precision fp16   # in half precision

The tolerances are fp32's, or a lower-precision backend's own (ane-emu's fp16: see
parity_tolerances); the output says which. Exits 0 only when every comparison passes
("overall okay: 1"), 2 for a bad argument, 1 for a bad file or a backend that cannot run here.

--precision bf16 runs the model as llm.c's bf16 build (bf16 parameters and activations, float32
gradients and master weights) and compares it, as llm.c's test_gpt2.cu does, with the float32
reference: the state's logits, loss and gradients and the float32 run's 10 step losses; and,
where PyTorch is installed, with the live PyTorch reference at bf16 autocast as well (llm.c's
train_gpt2.py --dtype bfloat16: float32 parameters and AdamW, bf16 matmuls), whose own bf16
errors are of the same size as ours.  The tolerances (BF16_*, below) are llm.c's bf16 ones, made
scale-free, since llm.c's absolute numbers belong to GPT-2 124M's magnitudes:
  - logits and each gradient tensor: test_gpt2.cu's check_tensor, elementwise
    |ours - ref| <= floor + 0.079 |ref|, with llm.c's 0.079 (its "BF16 epsilon", ten bf16
    epsilons 2^-7) and, for its per-tensor absolute floors (wte 0.5, ln1w 0.1, ..., fcprojb
    0.01, set by hand on 124M), 2^-5 (four bf16 epsilons) of the tensor's largest |ref|.  On the
    tiny fixtures llm.c's floors would let a gradient of zeros pass (wte's largest gradient is
    0.6, ln1w's 0.003), and its logits' 25 exceeds every logit (0.3 at most).  The correct
    model takes at most 39% of this tolerance against either reference (GPT-2 d12, 124M
    parameters, B=4 T=64: fcw), 19% on the GPT-2 fixture and 32% on the Llama one.
  - the loss and the 10 step losses: llm.c's loss_diff_threshold 0.05 (absolute), and at most
    3% of the reference's 10-step drop (its first loss minus its last).  llm.c's 0.05 is 1% of
    its 10-step drop (5.27 to 0.19 on GPT-2 124M); the fixtures' 10 steps drop 0.027 nats, so
    0.05 alone would pass a model that does not train at all.  bf16's own noise on these
    losses is up to 1.3% of their drop (up to 3.5e-4 nats): hence 3%.
What they catch (tests/test_bf16_parity.py): an update that keeps no float32 master weights and
truncates into bf16 (its small steps lost: the step losses, 1.4 to 1.7 times their tolerance on
the fixtures), parameters off by a tenth of their init's spread, one gradient element off by a
tenth of its tensor's largest.  What no tolerance of this size can catch: a bf16 store that
truncates instead of rounding (off by up to one bf16 step where rounding is off by half of
one; the fixtures pass with every matmul output truncated), a kernel test's job.

--precision fp16 (the GPUs' half precision: Metal's) is held to the float32 reference alone,
at the bf16 tolerances scaled to fp16's epsilon (2^-10, eight times finer): NARROW_TOLERANCES.
Its gradients are compared with the loss scale divided out (llmc/model.pyx).
"""
import argparse
import importlib
import importlib.util
import json
import os
import sys
import time

import numpy as np

from llmc.formats import FormatError, param_views
from llmc.formats.llmc import read_checkpoint, read_debug_state

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE_MODEL = os.path.join(HERE, "tests", "fixtures", "gpt2_tiny.bin")
FIXTURE_STATE = os.path.join(HERE, "tests", "fixtures", "gpt2_tiny_debug_state.bin")

# Tolerances (the contract): logits and loss relative-or-absolute, gradients relative
# to the tensor's largest magnitude, the 10 step losses absolute.
LOGITS_TOL = 1e-4
GRAD_TOL = 1e-3
LOSS_STEP_TOL = 1e-3
# --precision bf16 (see the module docstring): elementwise |ours - ref| <= BF16_FLOOR * max|ref|
# + BF16_EPSILON * |ref| for logits and gradients; the losses within BF16_LOSS_TOL, and within
# BF16_LOSS_DROP of the reference's 10-step drop
BF16_EPSILON = 0.079
BF16_FLOOR = 2.0 ** -5
BF16_LOSS_TOL = 0.05
BF16_LOSS_DROP = 0.03
# --precision fp16: the same, each in fp16's epsilons (2^-10, eight times finer than bf16's):
# (epsilon, floor, loss, loss drop) by narrow precision
NARROW_TOLERANCES = {"bf16": (BF16_EPSILON, BF16_FLOOR, BF16_LOSS_TOL, BF16_LOSS_DROP),
                     "fp16": (BF16_EPSILON / 8, BF16_FLOOR / 8, BF16_LOSS_TOL / 8, BF16_LOSS_DROP / 8)}
PRECISIONS = ("fp32", "bf16", "fp16")
STEPS = 10
# llm.c's test_gpt2.c optimizer: AdamW on every tensor
LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-4, 0.9, 0.999, 1e-8, 0.01

# llm.c's expected losses for pretrained GPT-2 124M on its debug-state batch (B=4, T=64)
GPT2_124M_LOSSES = [5.270007133483887, 4.059706687927246, 3.3751230239868164, 2.8007826805114746,
                    2.315382242202759, 1.8490285873413086, 1.3946564197540283, 0.9991465210914612,
                    0.6240804195404053, 0.37651097774505615]


def within(actual, expected, tol):
    """Elementwise: |a - e| <= tol, or |a - e| <= tol * |e| (relative-or-absolute)."""
    err = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    return err <= tol * np.maximum(1.0, np.abs(expected))


def expected_losses(config, params, state, state_path):
    """The 10 step losses to compare with, and where they came from (None if nowhere)."""
    if importlib.util.find_spec("torch") is not None:
        from train_gpt2_torch import reference_losses
        return reference_losses(config, params, state.x, state.y, steps=STEPS), "the PyTorch reference"
    is_gpt2_124m = (config.num_layers, config.channels, config.vocab_size) == (12, 768, 50257)
    if is_gpt2_124m and state.x.shape == (4, 64) and abs(state.loss - GPT2_124M_LOSSES[0]) < 1e-3:
        return GPT2_124M_LOSSES, "llm.c's list for GPT-2 124M"
    losses_path = os.path.splitext(state_path)[0] + ".losses.json"
    if os.path.exists(losses_path):
        with open(losses_path) as f:
            return json.load(f)["losses"], losses_path
    return None, None


def narrow_tolerance(expected, precision="bf16"):
    """The elementwise tolerance of a tensor at a narrow precision: its floor of the tensor's
    largest magnitude plus its epsilon of each element's (llm.c's check_tensor, scaled to the
    tensor; NARROW_TOLERANCES)."""
    epsilon, floor, _, _ = NARROW_TOLERANCES[precision]
    expected = np.abs(np.asarray(expected, np.float64))
    return floor * expected.max() + epsilon * expected


def tolerance_used(err, tol):
    """The largest err / tol, the share of its tolerance the worst element takes (0 where err
    and tol are both 0; inf where only tol is)."""
    err, tol = np.asarray(err, np.float64), np.asarray(tol, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        used = np.where(err > 0, err / tol, 0.0)
    return float(used.max()) if used.size else 0.0


def narrow_loss_tolerance(expected_losses, precision="bf16"):
    """The tolerance of the loss and the step losses at a narrow precision: llm.c's
    BF16_LOSS_TOL (in fp16's epsilons at fp16), and at most its share of the reference's drop
    over its steps (when it has them)."""
    _, _, loss_tol, loss_drop = NARROW_TOLERANCES[precision]
    if expected_losses is None or len(expected_losses) < 2:
        return loss_tol
    drop = abs(expected_losses[0] - expected_losses[min(STEPS, len(expected_losses)) - 1])
    return min(loss_tol, loss_drop * drop)


def narrow_tolerance_line(loss_tol, precision="bf16"):
    epsilon, floor, loss, drop = NARROW_TOLERANCES[precision]
    return (f"tolerances {precision} (llm.c's test_gpt2.cu bf16 ones, scaled to each tensor"
            f"{'' if precision == 'bf16' else ' and to fp16'}): logits and gradients "
            f"|ours - ref| <= {floor:g} max|ref| + {epsilon:g} |ref|, loss and step losses "
            f"{loss_tol:.3g} ({loss:g}, at most {drop:g} of the reference's {STEPS}-step drop)")


def parity_tolerances(backend):
    """(logits, gradients, step losses) tolerances and a line saying which: fp32's, or for a
    backend that computes some entries in lower precision (its Backend.tolerances: the ANE's
    fp16) its loosest entry's where that is looser, as the model is no closer than its
    loosest kernel."""
    fp32 = (LOGITS_TOL, GRAD_TOL, LOSS_STEP_TOL)
    loosest = max(backend.tolerances.values(), default=0.0)
    if loosest == 0.0:
        return fp32, (f"tolerances fp32: logits {LOGITS_TOL:g}, gradients {GRAD_TOL:g}, step "
                      f"losses {LOSS_STEP_TOL:g}")
    tolerances = tuple(max(tol, loosest) for tol in fp32)
    return tolerances, (f"tolerances {backend.name}'s, lower precision (its loosest entry "
                        f"{loosest:g}): logits {tolerances[0]:g}, gradients {tolerances[1]:g}, "
                        f"step losses {tolerances[2]:g}")


def check_parity(model, state, expected_grads, losses_source, autocast_source=None, steps=STEPS):
    """The parity check of any model family: `steps` (of STEPS) steps (forward, zero_grad, backward, AdamW)
    on the debug state's batch; at the first, logits and loss against the state's and every
    gradient tensor against expected_grads (name -> array); then the step losses against
    losses_source() -> (losses or None, where they came from).  A bf16 or fp16 model
    (model.precision) is held to that precision's tolerances (module docstring), its gradients
    with the loss scale divided out, and at bf16, given autocast_source() -> (logits, loss,
    grads by name, step losses) or None, compared with that reference too.  Prints a line per
    comparison and "overall okay: 0/1"; returns whether all passed."""
    okay = True
    precision = model.precision
    narrow = precision != "fp32"
    if narrow:   # the loss's tolerance depends on the expected step losses: first (at fp32, last)
        expected, source = losses_source()
        loss_tol = narrow_loss_tolerance(expected, precision)
        print(narrow_tolerance_line(loss_tol, precision))
    else:
        (logits_tol, grad_tol, loss_step_tol), which = parity_tolerances(model.backend)
        print(which)

    def report(what, ok, detail):
        nonlocal okay
        okay &= bool(ok)
        print(f"{what:<10} {'OK' if ok else 'NOT OK':<7} {detail}")

    def compare_narrow(logits, loss, grads, ref_logits, ref_loss, ref_grads, loss_tol):
        """The first step's comparisons at the precision's tolerances, against one reference."""
        err = np.abs(logits.astype(np.float64) - ref_logits)
        tol = narrow_tolerance(ref_logits, precision)
        bad = err > tol
        report("logits", not bad.any(), f"max abs err {err.max():.2e}, {bad.sum()} of {err.size} "
               f"outside, {tolerance_used(err, tol):.0%} of the tolerance at worst")
        report("loss", abs(loss - ref_loss) <= loss_tol,
               f"{loss:.6f} vs {ref_loss:.6f} (|diff| {abs(loss - ref_loss):.2e})")
        for name, grad in grads.items():
            expected = np.asarray(ref_grads[name], np.float64)
            err = np.abs(grad - expected)
            scale = np.abs(expected).max()
            rel = err.max() / scale if scale > 0 else err.max()
            used = tolerance_used(err, narrow_tolerance(expected, precision))
            report(name, used <= 1.0, f"max abs err / max |grad| = {rel:.2e}, {used:.0%} of the "
                   f"tolerance at worst")

    def compare_losses(losses, expected, source, tol):
        diff = np.abs(np.array(losses) - np.array(expected[:len(losses)]))
        report("losses", diff.max() <= tol, f"max |diff| {diff.max():.2e} vs {source}" +
               (f" ({diff.max() / tol:.0%} of the tolerance)" if narrow else ""))

    V = state.logits.shape[2]
    losses = []
    for step in range(steps):
        start = time.perf_counter()
        loss = model.forward(state.x, state.y)
        model.zero_grad()
        model.backward()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        if step == 0 and narrow:   # the gradients of the loss: its scale (fp16) divided out
            first = (model.logits[:, :, :V].copy(), loss,
                     {name: grad / np.float32(model.loss_scale)
                      for name, grad in model.grad_tensors().items()})
            compare_narrow(*first, state.logits, state.loss, expected_grads, loss_tol)
        elif step == 0:
            logits = model.logits[:, :, :V]
            err = np.abs(logits.astype(np.float64) - state.logits)
            bad = ~within(logits, state.logits, logits_tol)
            report("logits", not bad.any(), f"max abs err {err.max():.2e}, {bad.sum()} of {err.size} "
                   f"outside {logits_tol:g} rel-or-abs")
            report("loss", within(loss, state.loss, logits_tol), f"{loss:.6f} vs {state.loss:.6f}")
            for name, grad in model.grad_tensors().items():
                expected_grad = expected_grads[name]
                scale = np.abs(expected_grad).max()
                rel = np.abs(grad - expected_grad).max() / scale if scale > 0 else np.abs(grad).max()
                report(name, rel <= grad_tol, f"max abs err / max |grad| = {rel:.2e}")
        losses.append(loss)
        print(f"step {step}: loss {loss:.6f} (took {elapsed_ms:.1f} ms)")
        model.update(LR, BETA1, BETA2, EPS, WEIGHT_DECAY, step + 1)

    if not narrow:
        expected, source = losses_source()
    if expected is None:
        print("losses     no expected step losses (no PyTorch, no .losses.json beside the state): not compared")
    else:
        compare_losses(losses, expected, source, loss_tol if narrow else loss_step_tol)
    if precision == "fp16":
        print("against a PyTorch fp16 reference: not compared (PyTorch's CPU autocast reference "
              "is bf16's; fp16 is held to the float32 reference, at fp16's tolerances)")
    if precision == "bf16" and autocast_source is not None:
        autocast = autocast_source()
        if autocast is None:
            print("against the PyTorch bf16-autocast reference: not compared (no PyTorch)")
        else:
            ref_logits, ref_loss, ref_grads, ref_losses = autocast
            tol = narrow_loss_tolerance(ref_losses)
            print(f"against the PyTorch bf16-autocast reference (loss and step losses {tol:.3g}):")
            compare_narrow(*first, ref_logits, ref_loss, ref_grads, tol)
            compare_losses(losses, ref_losses, "the PyTorch bf16-autocast reference", tol)
    if model.backend.name.startswith("check:"):
        report("check", model.backend.report()["mismatches"] == 0, model.backend.summary())
    print(f"overall okay: {int(okay)}")
    return okay


def add_steps_argument(parser):
    """--steps: the first N of the STEPS training steps (both scripts)."""
    parser.add_argument("--steps", type=int, choices=range(1, STEPS + 1), default=STEPS,
                        metavar=f"1..{STEPS}", help=f"compare the first N of the {STEPS} training "
                        f"steps' losses (a slow backend's check: the emulators; default {STEPS})")


def autocast_reference(config, params, state, reference="train_gpt2_torch"):
    """The live PyTorch reference at bf16 autocast (the reference module's --dtype bfloat16:
    train_gpt2_torch, train_llama2_torch) on the state's batch: (logits, loss, gradients by
    name, step losses); None without PyTorch."""
    if importlib.util.find_spec("torch") is None:
        return None
    module = importlib.import_module(reference)
    reference_forward_backward, reference_losses = module.reference_forward_backward, module.reference_losses
    logits, loss, grads = reference_forward_backward(config, params, state.x, state.y,
                                                     dtype="bfloat16")
    losses = reference_losses(config, params, state.x, state.y, steps=STEPS, dtype="bfloat16")
    return logits, loss, param_views(config, grads), losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=FIXTURE_MODEL, help="llm.c model file (v3 or v5)")
    parser.add_argument("--state", default=FIXTURE_STATE, help="llm.c debug state file")
    parser.add_argument("--backend", default="cpu",
                        help="the backend to run on: cpu, check:NAME, profile:NAME, ...")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="the model's precision (llm.c's PRECISION; bf16: bf16 parameters "
                             "and activations, float32 master weights; fp16 likewise, with "
                             "dynamic loss scaling), compared with the reference at its "
                             "tolerances (default: fp32)")
    add_steps_argument(parser)
    args = parser.parse_args()

    # after argument parsing, so --help works before a build
    from accel.backend import BackendError
    from train_gpt2 import GPT2, GPT2Config
    try:
        config, params = read_checkpoint(args.model, GPT2Config)
        state = read_debug_state(args.state, config)
        model = GPT2(config, backend=args.backend, precision=args.precision)
    except (FormatError, BackendError) as e:
        parser.exit(1, f"test_gpt2.py: error: {e}\n")
    model.params = params
    B, T = state.x.shape
    V = config.vocab_size
    print(f"[GPT-2] {args.model}: L={config.num_layers} NH={config.num_heads} C={config.channels} "
          f"V={V} Vp={config.padded_vocab_size} maxT={config.max_seq_len}, "
          f"{config.num_parameters():,} parameters")
    print(f"[State] {args.state}: B={B} T={T}")
    print(f"[Backend] {model.backend.name}" +
          (f", precision {model.precision}" if model.precision != "fp32" else ""))
    okay = check_parity(model, state, param_views(config, state.grads),
                        lambda: expected_losses(config, params, state, args.state),
                        lambda: autocast_reference(config, params, state), args.steps)
    return 0 if okay else 1


if __name__ == "__main__":
    sys.exit(main())
