"""
Backend ane (macOS): the ANE's share of a Llama step (accel/ane/table.pyx: matmul and its dx,
attention_gqa, SwiGLU; the rest on the CPU) as Core ML ML Programs with CPU_AND_NE compute units
(accel/ane/runtime.py's CoreMLRuntime), or with LLMPYX_ANE_RUNTIME=private on the private
in-memory ANE API, each kernel checked against Core ML's outputs before it is trusted.
Written and reviewed against Apple's documentation, UNRUN: there is no Mac here (README.md).

Its hooks into train.py (accel/hooks.py), shared by ane-emu (accel/ane/table.pyx): the flags
--ane-pipeline, --ane-budget and --ane-dw (the backend made for the run reads them from
OPTIONS), the dry run, which plans the pipeline against the compile budget (accel/ane/plan.py)
on any machine (python train.py --model stories110M --backend ane --dry-run), and the static
pipeline's restarts: before a step whose compiles would pass the budget, the run's checkpoint
is written (train.py's, llmc/checkpoint.py) and the process replaced by exec() with the same
command line and -y 1, which resumes it there.  The step's engine, CPU dW and overlap times,
its compiles (both pipelines) and the restarts so far go to the JSON log (after_step).
"""
import os
import signal
import sys

from accel.ane import runtime
from accel.ane.plan import PIPELINES, PlanError, format_pipeline_plan, make_plan
from accel.backend import BackendError
from accel.hooks import BackendHooks

# what the backend made for this run takes (accel/ane/table.pyx's create), set by train.py's flags
OPTIONS = dict(pipeline="dynamic", budget=runtime.CompileBudget(), parallel_dw=True)
# set in the environment of a process the static pipeline exec()ed: the restarts so far
RESTARTS_ENV = "LLMPYX_ANE_RESTARTS"
# the test of a kill between a restart's checkpoint and its exec(): SIGKILL there when set
KILL_ENV = "LLMPYX_ANE_KILL_BEFORE_EXEC"


def create():
    from accel.ane import table   # not at the top: train.py imports this module for its hooks
    budget = OPTIONS["budget"]
    if os.environ.get("LLMPYX_ANE_RUNTIME", "coreml") == "private":
        chosen = runtime.PrivateANERuntime(budget, check_against=runtime.CoreMLRuntime(budget))
    else:
        chosen = runtime.CoreMLRuntime(budget)
    return table.create(chosen, name="ane")


class ANEHooks(BackendHooks):
    """--backend ane's (and ane-emu's) flags, their check, its dry run (the pipeline's plan
    against the compile budget, accel/ane/plan.py), the static pipeline's restarts and the
    step's times for the JSON log."""

    def __init__(self):
        self.backend = None   # the ANEBackend of the run (start_training)

    def add_arguments(self, parser):
        parser.add_argument("--ane-pipeline", choices=PIPELINES, default="dynamic",
                            help="--backend ane, ane-emu: weights as constants (recompiled "
                                 "after every update, the process replaced by exec() before a "
                                 "step that would pass --ane-budget: needs -o) or as inputs "
                                 "(compiled once); accel/ane/README.md")
        parser.add_argument("--ane-budget", metavar="INT", type=int, default=None,
                            help="--backend ane, ane-emu: ANE compiles per process (default: "
                                 "119, the anchor's; 10 of them kept as headroom)")
        parser.add_argument("--ane-dw", choices=("parallel", "sequential"), default="parallel",
                            help="--backend ane, ane-emu: the weight gradients' GEMMs on the "
                                 "CPU in a worker thread while the engine runs, or in turn")

    def check_arguments(self, args, error):
        if args.ane_budget is not None:   # the compiler's limit -> the budget the plan keeps to
            try:
                args.ane_budget = runtime.CompileBudget.for_limit(args.ane_budget)
            except ValueError as e:
                error(f"argument --ane-budget: {e}")
        if not args.dry_run:   # the backend this process makes for the run takes them
            OPTIONS.update(pipeline=args.ane_pipeline, parallel_dw=args.ane_dw == "parallel",
                           budget=args.ane_budget or runtime.CompileBudget())

    @property
    def restarts(self):
        """The static pipeline's restarts before this process (0: the run's own start)."""
        return int(os.environ.get(RESTARTS_ENV, "0"))

    def restarted(self):
        return self.restarts > 0

    def start_training(self, model, args, num_steps):
        self.backend, self.args = model.backend, args
        emulator = getattr(self.backend, "emulator", None)
        if emulator is None or emulator.pipeline != "static":   # check:ane-emu: no hooks
            return
        if type(model).FAMILY != "llama":
            raise BackendError("--ane-pipeline static trains Llama models: --family llama")
        budget, need = emulator.runtime.budget, emulator.static_step_compiles(model.config)
        if need > budget.usable:
            raise BackendError(
                f"--ane-pipeline static: a step of this model compiles {need} programs (6 "
                f"of each of its {model.config.n_layers} layers' weights and 2 weight-free "
                f"ones), more than a process gets ({budget}); restarts inside a step are not "
                f"done: use --ane-pipeline dynamic or raise --ane-budget")
        if num_steps * need > budget.usable:   # the run will restart itself
            if args.output_dir is None:
                raise BackendError(
                    f"--ane-pipeline static: {num_steps} steps of {need} compiles pass the "
                    f"budget ({budget}): the run restarts itself from checkpoints, give it -o DIR")
            if os.path.basename(sys.argv[0]) != "train.py":
                raise BackendError("--ane-pipeline static restarts the command line: run "
                                   "train.py as a command, not train.main()")
        emulator.on_cpu = True   # evaluations and samples between steps compile nothing

    def before_step(self, model, step, save):
        emulator = getattr(self.backend, "emulator", None)
        if emulator is None:
            return
        if emulator.pipeline == "static":
            need = emulator.static_step_compiles(model.config)
            if emulator.runtime.needs_restart(need):
                self._restart(step, save, emulator.runtime.compile_count, need)
            emulator.on_cpu = False
        self.compiles_before = emulator.runtime.compile_count

    def _restart(self, step, save, compiles, need):
        """Save the run at step (its checkpoint, unless the schedule wrote it), delete the
        previous restart's, and exec() the command line resuming it (-y 1)."""
        from llmc.checkpoint import complete_steps, delete_checkpoint
        args, out = self.args, self.args.output_dir
        if step not in complete_steps(out):
            save()
        every = args.checkpoint_every
        for old in complete_steps(out):   # the checkpoints only restarts wrote: the last stays
            if old < step and (every <= 0 or old % every):
                delete_checkpoint(out, old)
        number = self.restarts + 1
        print(f"ANE static pipeline: {compiles} compiles in this process, step {step + 1} needs "
              f"{need} more, past {self.backend.emulator.runtime.budget}: checkpoint at step "
              f"{step}, exec() restart {number}", flush=True)
        sys.stderr.flush()
        if os.environ.get(KILL_ENV):
            os.kill(os.getpid(), signal.SIGKILL)
        argv = [sys.executable] + sys.orig_argv[1:] + ([] if args.resume else ["-y", "1"])
        os.execve(sys.executable, argv, dict(os.environ, **{RESTARTS_ENV: str(number)}))

    def after_step(self, model):
        emulator = getattr(self.backend, "emulator", None)
        if emulator is None:
            return {}
        metrics = dict(self.backend.step_times(),
                       compiles=emulator.runtime.compile_count - self.compiles_before)
        if emulator.pipeline == "static":
            emulator.on_cpu = True
            metrics.update(restarts=self.restarts)
        return {f"ane_{name}": value for name, value in metrics.items()}

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
