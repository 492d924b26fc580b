"""
Parity check of the Cython Llama 2 against its PyTorch reference (train_llama2_torch.py), as
test_gpt2.py is for GPT-2 and with its comparisons and tolerances: load a model and a debug
state, compare logits and loss, every gradient tensor, then the losses of 10 AdamW steps.

    python test_llama2.py                                 # the committed tiny fixture (GQA)
    python test_llama2.py --model M.bin --state S.bin     # what train_llama2_torch.py wrote
    python test_llama2.py --backend check:cpu             # on a backend (accel/README.md)
    python test_llama2.py --precision bf16                # the model in bf16

The tolerances are test_gpt2.py's (parity_tolerances: fp32's, or a lower-precision backend's
own). Exits 0 only when every comparison passes ("overall okay: 1"), 2 for a bad argument, 1 for
a bad file or a backend that cannot run here.

--precision bf16 is test_gpt2.py's, with its tolerances (llm.c's test_gpt2.cu bf16 ones, scaled
to each tensor: see test_gpt2.py's docstring): the bf16 model against the float32 state and step
losses, and, where PyTorch is installed, against the live reference at bf16 autocast
(train_llama2_torch.py --dtype bfloat16).  Llama's bf16 errors are its own, not llm.c's (llm.c
has no Llama), but of the same kind: on the fixture the model takes at most 32% of a gradient's
tolerance (wq, wo) and 26% of the step losses', on a d4 model (dim 256, V=512) 34% and 1%.
"""
import argparse
import importlib.util
import json
import os
import sys

from llmc.formats import FormatError, param_views
from llmc.formats.llmc import read_debug_state
from test_gpt2 import (PRECISIONS, STEPS, add_steps_argument, autocast_reference as
                       gpt2s_autocast_reference, check_parity)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE_MODEL = os.path.join(HERE, "tests", "fixtures", "llama2_tiny.bin")
FIXTURE_STATE = os.path.join(HERE, "tests", "fixtures", "llama2_tiny_debug_state.bin")


def expected_losses(config, params, state, state_path):
    """The 10 step losses to compare with, and where they came from (None if nowhere)."""
    if importlib.util.find_spec("torch") is not None:
        from train_llama2_torch import reference_losses
        return reference_losses(config, params, state.x, state.y, steps=STEPS), "the PyTorch reference"
    losses_path = os.path.splitext(state_path)[0] + ".losses.json"
    if os.path.exists(losses_path):
        with open(losses_path) as f:
            return json.load(f)["losses"], losses_path
    return None, None


def autocast_reference(config, params, state):
    """The live PyTorch bf16-autocast reference (train_llama2_torch.py --dtype bfloat16), as
    test_gpt2.py's; None without PyTorch."""
    return gpt2s_autocast_reference(config, params, state, "train_llama2_torch")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=FIXTURE_MODEL, help="Llama model file")
    parser.add_argument("--state", default=FIXTURE_STATE, help="llm.c-format debug state file")
    parser.add_argument("--backend", default="cpu",
                        help="the backend to run on: cpu, check:NAME, profile:NAME, ...")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="the model's precision (bf16: bf16 parameters and activations, "
                             "float32 master weights; fp16 likewise, with dynamic loss "
                             "scaling), compared at its tolerances (default: fp32)")
    add_steps_argument(parser)
    args = parser.parse_args()

    # after argument parsing, so --help works before a build
    from accel.backend import BackendError
    from train_llama2 import Llama2
    try:
        model = Llama2.from_checkpoint(args.model, backend=args.backend, precision=args.precision)
        state = read_debug_state(args.state, model.config)
    except (FormatError, BackendError) as e:
        parser.exit(1, f"test_llama2.py: error: {e}\n")
    config, params = model.config, model.params.copy()
    B, T = state.x.shape
    print(f"[Llama 2] {args.model}: {config.describe()}, {config.num_parameters():,} parameters")
    print(f"[State] {args.state}: B={B} T={T}")
    print(f"[Backend] {model.backend.name}" +
          (f", precision {model.precision}" if model.precision != "fp32" else ""))
    okay = check_parity(model, state, param_views(config, state.grads),
                        lambda: expected_losses(config, params, state, args.state),
                        lambda: autocast_reference(config, params, state), args.steps)
    return 0 if okay else 1


if __name__ == "__main__":
    sys.exit(main())
