"""
What the ANE brings to a training run (accel/hooks.py's BackendHooks), shared by ane
(accel/ane/device.py) and ane-emu (accel/ane/table.pyx): the flags --ane-pipeline, --ane-budget
and --ane-dw (the backend made for the run reads them from OPTIONS), the dry run, which plans the
pipeline against the compile budget (accel/ane/plan.py) on any machine (python train.py --model
stories110M --backend ane --dry-run), the static pipeline's budget between steps (before a step
whose compiles would pass it, before_step says so and train.py goes on in a fresh process), and
the step's engine, CPU dW and overlap times and its compiles for the JSON log (after_step).
Nothing here knows the run: its checkpoints and restarts are train.py's.
"""

from accel.ane import runtime
from accel.ane.plan import PIPELINES, PlanError, format_pipeline_plan, make_plan
from accel.backend import BackendError
from accel.hooks import BackendHooks

# what the backend made for this run takes (accel/ane/table.pyx's create), set by train.py's flags
OPTIONS = dict(pipeline="dynamic", budget=runtime.CompileBudget(), parallel_dw=True)


class ANEHooks(BackendHooks):
    """--backend ane's (and ane-emu's) flags, their check, its dry run (the pipeline's plan
    against the compile budget, accel/ane/plan.py), the static pipeline's budget between steps
    and the step's times for the JSON log."""

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

    def _static(self, model):
        """The emulator of the run's backend when it runs the static pipeline, else None."""
        emulator = getattr(model.backend, "emulator", None)   # check:ane-emu: none
        return emulator if emulator is not None and emulator.pipeline == "static" else None

    def start_training(self, model, args, num_steps):
        self.backend = model.backend
        emulator = self._static(model)
        if emulator is None:
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
        emulator.on_cpu = True   # evaluations and samples between steps compile nothing

    def process_steps(self, model):
        emulator = self._static(model)
        if emulator is None:
            return None
        return emulator.runtime.budget.usable // emulator.static_step_compiles(model.config)

    def before_step(self, model, step):
        emulator = getattr(self.backend, "emulator", None)
        if emulator is None:
            return None
        if emulator.pipeline == "static":
            need = emulator.static_step_compiles(model.config)
            if emulator.runtime.needs_restart(need):
                return (f"ANE static pipeline: {emulator.runtime.compile_count} compiles in this "
                        f"process, step {step + 1} needs {need} more, past "
                        f"{emulator.runtime.budget}")
            emulator.on_cpu = False
        self.compiles_before = emulator.runtime.compile_count
        return None

    def after_step(self, model):
        emulator = getattr(self.backend, "emulator", None)
        if emulator is None:
            return {}
        metrics = dict(self.backend.step_times(),
                       compiles=emulator.runtime.compile_count - self.compiles_before)
        if emulator.pipeline == "static":
            emulator.on_cpu = True
        return {f"ane_{name}": value for name, value in metrics.items()}

    def dry_run_plan(self, family, config, name, args, recompute_plan, memory):
        if family.FAMILY != "llama":   # the plan's kernels are the Llama block's
            raise BackendError("--backend ane trains Llama models: -e stories15M, ..., llama-7b")
        accum = 1 if args.total_batch_size == -1 else args.total_batch_size // (args.B * args.T)
        try:
            plan = make_plan(config, args.ane_pipeline, args.ane_budget, recompute_plan, args.B,
                             args.T, accum)
        except PlanError as e:
            raise BackendError(str(e)) from None
        return format_pipeline_plan(plan, memory, name)


HOOKS = ANEHooks()
