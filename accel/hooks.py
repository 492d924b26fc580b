"""
What a backend brings to the training run besides its table: its command-line options, their
checks and its dry-run plan, so that train.py names no backend.  The module a backend is
registered with (accel/backend.pyx's register_backend) may set HOOKS to an instance of a
BackendHooks subclass (accel/ane/device.py's, for ane); a backend that does not adds nothing.

    for hooks in every_backend_hooks(): hooks.add_arguments(parser)   train.py --help lists all
    hooks = backend_hooks(args.backend)                                the chosen backend's
    hooks.check_arguments(args, parser.error)
    hooks.dry_run_plan(Model, config, name, args)                      None: llmc/plan.py's plan

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
        """The text train.py --dry-run prints for this backend, or None for llmc/plan.py's:
        family is the model family's class (train_llama2.Llama2), config the model's config,
        name what the text calls the model.  BackendError in one line for what cannot be
        planned."""
        return None


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
