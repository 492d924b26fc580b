"""
Backend ane (macOS): the ANE's share of a Llama step (accel/ane/table.pyx: matmul and its dx,
attention_gqa, SwiGLU; the rest on the CPU) as Core ML ML Programs with CPU_AND_NE compute units
(accel/ane/runtime.py's CoreMLRuntime), or with LLMPYX_ANE_RUNTIME=private on the private
in-memory ANE API, each kernel checked against Core ML's outputs before it is trusted.
Written and reviewed against Apple's documentation, UNRUN: there is no Mac here (README.md).

Its hooks into train.py (accel/hooks.py): the flags --ane-pipeline and --ane-budget, and the
dry run, which plans the pipeline against the compile budget (accel/ane/plan.py) on any
machine: python train.py --model stories110M --backend ane --dry-run.
"""
import os

from accel.ane import runtime
from accel.ane.plan import PIPELINES, PlanError, format_pipeline_plan, make_plan
from accel.backend import BackendError
from accel.hooks import BackendHooks


def create():
    from accel.ane import table   # not at the top: train.py imports this module for its hooks
    if os.environ.get("LLMPYX_ANE_RUNTIME", "coreml") == "private":
        chosen = runtime.PrivateANERuntime(check_against=runtime.CoreMLRuntime())
    else:
        chosen = runtime.CoreMLRuntime()
    return table.create(chosen, name="ane")


class ANEHooks(BackendHooks):
    """--backend ane's flags, their check, and its dry run: the pipeline's plan against the
    compile budget (accel/ane/plan.py)."""

    def add_arguments(self, parser):
        parser.add_argument("--ane-pipeline", choices=PIPELINES, default="dynamic",
                            help="--backend ane: weights as constants (recompiled after every "
                                 "update) or as inputs (compiled once); accel/ane/plan.py")
        parser.add_argument("--ane-budget", metavar="INT", type=int, default=None,
                            help="--backend ane: ANE compiles per process (default: 119, the "
                                 "anchor's)")

    def check_arguments(self, args, error):
        if args.ane_budget is not None:   # the compiler's limit -> the budget the plan keeps to
            try:
                args.ane_budget = runtime.CompileBudget.for_limit(args.ane_budget)
            except ValueError as e:
                error(f"argument --ane-budget: {e}")

    def dry_run_plan(self, family, config, name, args):
        if family.FAMILY != "llama":   # the plan's kernels are the Llama block's
            raise BackendError("--backend ane trains Llama models: -e stories15M, ..., llama-7b")
        accum = 1 if args.total_batch_size == -1 else args.total_batch_size // (args.B * args.T)
        try:
            plan = make_plan(config, args.ane_pipeline, args.ane_budget, args.recompute, args.B,
                             args.T, accum)
        except PlanError as e:
            raise BackendError(str(e)) from None
        return format_pipeline_plan(plan, family, name)


HOOKS = ANEHooks()
