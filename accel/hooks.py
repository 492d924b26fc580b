"""
What a backend brings to the training run besides its table: its command-line options, their
checks, its dry-run plan and what it needs of the run between steps, so that train.py names no
backend.  The module a backend is registered with (accel/backend.pyx's register_backend) may set
HOOKS to an instance of a BackendHooks subclass (accel/ane/hooks.py's, for ane and ane-emu); a
backend that does not adds nothing.  The hooks know the backend, never the run: what a hook
needs of the run (the recompute plan, the memory, a fresh process) is given to it or asked of
train.py through its return value.

    for hooks in every_backend_hooks(): hooks.add_arguments(parser)   train.py --help lists all
    hooks = backend_hooks(args.backend)                                the chosen backend's
    hooks.check_arguments(args, parser.error)
    hooks.dry_run_plan(Model, config, name, args, recompute_plan, memory)
                                                   None: llmc/dry_run.py's plan
    hooks.start_training(model, args, num_steps)   before the first step (BackendError: refused)
    hooks.process_steps(model)                     the steps one process can run (None: any)
    hooks.before_step(model, step)                 None, or why this process cannot run step:
                                                   train.py then saves the run and goes on in a
                                                   fresh process (llmc/checkpoint.py's restart)
    hooks.after_step(model)                        the step's numbers for the JSON log

A wrapped name (check:ane) has no hooks, and neither has a backend whose module cannot be
imported here (get_backend says why when the backend is asked for); a module with hooks keeps
its imports light (accel/ane/device.py imports its table in create()), as train.py imports it
to build its parser.
"""
import importlib


class BackendHooks:
    """A backend's part of the training run; each default adds nothing."""

    def add_arguments(self, parser):
        """Add the backend's flags (named for it: --ane-...) to train.py's argparse parser."""

    def check_arguments(self, args, error):
        """Refuse bad values of the backend's flags when it is the one chosen: error(message)
        ends the run in one line, as argparse's own errors do."""

    def dry_run_plan(self, family, config, name, args, recompute_plan, memory):
        """The text train.py --dry-run prints for this backend, or None for llmc/dry_run.py's:
        family is the model family's class (train_llama2.Llama2), config the model's config,
        name what the text calls the model, recompute_plan the run's activation checkpoint
        plan (llmc/recompute.py's RecomputePlan: policy, num_layers, recomputes(), ...) and
        memory the bytes of the model's buffers on the CPU at fp32 under it (llmc/dry_run.py's
        memory_plan: params, grads, adamw, activations, activation_grads, tokens).  BackendError
        in one line for what cannot be planned."""
        return None

    def start_training(self, model, args, num_steps):
        """After the model is made and before the first step: BackendError in one line for a
        run the backend cannot train (args: train.py's, num_steps: the steps it will run)."""

    def process_steps(self, model):
        """How many training steps of model one process can run on this backend (the ANE's
        static pipeline: its compile budget), or None for any number.  A run of more needs a
        place to save itself (-o DIR): before_step says when."""
        return None

    def before_step(self, model, step):
        """Before training step `step` (0-based; its evaluations, samples and checkpoint are
        done): None, or in one line why this process cannot run it (a compile budget spent);
        train.py then writes the run's checkpoint at step and replaces the process with one
        that resumes it there."""
        return None

    def after_step(self, model):
        """After the step's update: {name: number} of the step for the JSON log's train
        record (named for the backend: ane_...)."""
        return {}


NO_HOOKS = BackendHooks()


def backend_hooks(name):
    """The hooks of the backend called name (NO_HOOKS when it has none)."""
    try:
        from accel.backend import backend_module
    except ModuleNotFoundError:   # accel not built: the run says so (train.py's model_class)
        return NO_HOOKS
    module = backend_module(name)
    if module is None:
        return NO_HOOKS
    try:
        return getattr(importlib.import_module(module), "HOOKS", NO_HOOKS)
    except ImportError:   # as get_backend would refuse it, with the reason
        return NO_HOOKS


def every_backend_hooks():
    """The hooks of every registered backend, each once (backends may share a module)."""
    try:
        from accel.backend import backend_names
    except ModuleNotFoundError:   # accel not built: the run says so (train.py's model_class)
        return []
    return list(dict.fromkeys(backend_hooks(name) for name, _, _ in backend_names()))


def format_bytes(n):
    """n bytes in words ("1.5 GiB"), as the dry runs print them: llmc/dry_run.py's and a
    backend's own (dry_run_plan)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def with_wrapper(wrapper, name):
    """The backend name under a wrapper of accel/backend.pyx ("profile", "cpu" ->
    "profile:cpu"), unchanged when that wrapper is already its outermost."""
    return name if name.startswith(f"{wrapper}:") else f"{wrapper}:{name}"
