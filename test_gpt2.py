"""
Parity check of the Cython GPT-2 against a PyTorch reference, as llm.c's test_gpt2.c:
load a model and a debug state (a batch, its logits, loss and gradients, written by the
reference), run forward and compare logits and loss, run backward and compare all 16 gradient
tensors, then take 10 AdamW steps on the batch and compare the losses.

    python test_gpt2.py                                   # the committed tiny fixture
    python test_gpt2.py --model M.bin --state S.bin       # any llm.c-format pair
    python test_gpt2.py --backend check:cpu               # on a backend (accel/README.md)

The tolerances are fp32's, or a lower-precision backend's own (ane-emu's fp16: see
parity_tolerances); the output says which. Exits 0 only when every comparison passes
("overall okay: 1"), 2 for a bad argument, 1 for a bad file or a backend that cannot run here.
"""
import argparse
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


def check_parity(model, state, expected_grads, losses_source):
    """The parity check of any model family: STEPS steps (forward, zero_grad, backward, AdamW)
    on the debug state's batch; at the first, logits and loss against the state's and every
    gradient tensor against expected_grads (name -> array); then the step losses against
    losses_source() -> (losses or None, where they came from).  Prints a line per comparison
    and "overall okay: 0/1"; returns whether all passed."""
    V = state.logits.shape[2]
    okay = True
    (logits_tol, grad_tol, loss_step_tol), which = parity_tolerances(model.backend)
    print(which)

    def report(what, ok, detail):
        nonlocal okay
        okay &= bool(ok)
        print(f"{what:<10} {'OK' if ok else 'NOT OK':<7} {detail}")

    losses = []
    for step in range(STEPS):
        start = time.perf_counter()
        loss = model.forward(state.x, state.y)
        model.zero_grad()
        model.backward()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        if step == 0:
            logits = model.logits[:, :, :V]
            err = np.abs(logits.astype(np.float64) - state.logits)
            bad = ~within(logits, state.logits, logits_tol)
            report("logits", not bad.any(), f"max abs err {err.max():.2e}, {bad.sum()} of {err.size} "
                   f"outside {logits_tol:g} rel-or-abs")
            report("loss", within(loss, state.loss, logits_tol), f"{loss:.6f} vs {state.loss:.6f}")
            for name, grad in model.grad_tensors().items():
                expected = expected_grads[name]
                scale = np.abs(expected).max()
                rel = np.abs(grad - expected).max() / scale if scale > 0 else np.abs(grad).max()
                report(name, rel <= grad_tol, f"max abs err / max |grad| = {rel:.2e}")
        losses.append(loss)
        print(f"step {step}: loss {loss:.6f} (took {elapsed_ms:.1f} ms)")
        model.update(LR, BETA1, BETA2, EPS, WEIGHT_DECAY, step + 1)

    expected, source = losses_source()
    if expected is None:
        print("losses     no expected step losses (no PyTorch, no .losses.json beside the state): not compared")
    else:
        diff = np.abs(np.array(losses) - np.array(expected[:STEPS]))
        report("losses", diff.max() <= loss_step_tol, f"max |diff| {diff.max():.2e} vs {source}")
    if model.backend.name.startswith("check:"):
        report("check", model.backend.report()["mismatches"] == 0, model.backend.summary())
    print(f"overall okay: {int(okay)}")
    return okay


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=FIXTURE_MODEL, help="llm.c model file (v3 or v5)")
    parser.add_argument("--state", default=FIXTURE_STATE, help="llm.c debug state file")
    parser.add_argument("--backend", default="cpu",
                        help="the backend to run on: cpu, check:NAME, profile:NAME, ...")
    args = parser.parse_args()

    # after argument parsing, so --help works before a build
    from accel.backend import BackendError
    from train_gpt2 import GPT2
    try:
        config, params = read_checkpoint(args.model)
        state = read_debug_state(args.state, config)
        model = GPT2(config, backend=args.backend)
    except (FormatError, BackendError) as e:
        parser.exit(1, f"test_gpt2.py: error: {e}\n")
    model.params = params
    B, T = state.x.shape
    V = config.vocab_size
    print(f"[GPT-2] {args.model}: L={config.num_layers} NH={config.num_heads} C={config.channels} "
          f"V={V} Vp={config.padded_vocab_size} maxT={config.max_seq_len}, "
          f"{config.num_parameters():,} parameters")
    print(f"[State] {args.state}: B={B} T={T}")
    print(f"[Backend] {model.backend.name}")
    okay = check_parity(model, state, param_views(config, state.grads),
                        lambda: expected_losses(config, params, state, args.state))
    return 0 if okay else 1


if __name__ == "__main__":
    sys.exit(main())
