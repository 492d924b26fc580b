"""
What a backend brings to the training run besides its table: its command-line options, their
checks and its dry-run plan, so that train.py names no backend.  The module a backend is
registered with (accel/backend.pyx's register_backend) may set HOOKS to an instance of a
BackendHooks subclass (accel/ane/device.py's, for ane); a backend that does not adds nothing.

    for hooks in every_backend_hooks(): hooks.add_arguments(parser)   train.py --help lists all
    hooks = backend_hooks(args.backend)                                the chosen backend's
    hooks.check_arguments(args, parser.error)
    hooks.dry_run_plan(Model, config, name, args)                      None: llmc/dry_run.py's plan
    hooks.restarted()                              the process is the backend's own restart
    hooks.start_training(model, args, num_steps)   before the first step (BackendError: refused)
    hooks.before_step(model, step, save)           may save() the run and replace the process
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

    def dry_run_plan(self, family, config, name, args):
        """The text train.py --dry-run prints for this backend, or None for llmc/dry_run.py's:
        family is the model family's class (train_llama2.Llama2), config the model's config,
        name what the text calls the model.  BackendError in one line for what cannot be
        planned."""
        return None

    def restarted(self):
        """Whether this process is the backend's own restart of the run (before_step's
        exec()): train.py then prints its settings, the resume and the memory not again."""
        return False

    def start_training(self, model, args, num_steps):
        """After the model is made and before the first step: BackendError in one line for a
        run the backend cannot train (args: train.py's, num_steps: the steps it will run)."""

    def before_step(self, model, step, save):
        """Before training step `step` (0-based; its evaluations, samples and checkpoint are
        done): the backend may save() the run (its checkpoint at step) and replace the
        process with one that resumes it there (the ANE's static pipeline past its compile
        budget)."""

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


def with_wrapper(wrapper, name):
    """The backend name under a wrapper of accel/backend.pyx ("profile", "cpu" ->
    "profile:cpu"), unchanged when that wrapper is already its outermost."""
    return name if name.startswith(f"{wrapper}:") else f"{wrapper}:{name}"
