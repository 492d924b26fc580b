"""
llmc/loop.py, the loop train.py and finetune.py share, on a stand-in model that records what
it is asked: the evaluations, samples and checkpoints at their steps (none taken again at a
resumed run's first step), each micro-batch's backward dividing by the step's scored targets,
the loss the mean over them, the clip, and the update skipped on fp16's overflow.
"""
import numpy as np

from llmc.distributed import SINGLE
from llmc.loop import GRAD_CLIP, Loop, Step
from llmc.schedulers import get_scheduler


class Recorder:
    def __init__(self):
        self.calls = []

    def print(self, text):
        self.calls.append(("print", text))

    status = print

    def log_train(self, step, loss, lr, norm, **cost):
        self.calls.append(("train", step, loss, norm))

    def log_val(self, step, loss):
        self.calls.append(("val", step))

    def __getattr__(self, name):   # the logger's other records
        return lambda *args, **kwargs: self.calls.append((name,) + args)


class StandIn:
    """A model whose forward returns the mean of its targets, whose gradient norm is norm."""
    loss_scale = 1.0

    def __init__(self, norm=2.0, overflow=False):
        self.norm, self.overflow, self.calls = norm, overflow, []

    def zero_grad(self):
        self.calls.append(("zero_grad",))

    def forward(self, inputs, targets, training=False):
        scored = targets[targets >= 0]
        return float(scored.mean())

    def backward(self, scored_in_step=None):
        self.calls.append(("backward", scored_in_step))

    def grad_norm(self):
        return self.norm

    def gradients_overflowed(self, grad_norm):
        return self.overflow

    def adjust_loss_scale(self, grew):
        pass

    def update(self, lr, beta1, beta2, eps, weight_decay, t, grad_scale, decay_2d_only):
        self.calls.append(("update", t, grad_scale))


def batch(targets):
    targets = np.array([targets])
    return np.zeros_like(targets), targets


def loop_of(model, num_steps, console, **parts):
    # two micro-batches a step: 3 targets scored (mean 2), then 1 of 3 (the rest masked, 10)
    def next_step():
        return Step(iter([batch([1, 2, 3]), batch([-1, 10, -1])]), 4)
    return Loop(model, SINGLE, console, console, num_steps, next_step,
                get_scheduler("cosine", 1e-3, 0, num_steps, 1.0), (0.9, 0.95), 1e-8, 0.0,
                **parts)


def schedule(console):
    return [c[:2] for c in console.calls if c[0] in ("val", "save", "sample")]


def test_evaluations_samples_and_checkpoints_at_their_steps():
    console = Recorder()
    parts = dict(val_every=2, val_loss=lambda: 0.0, sample_every=3,
                 sample=lambda: console.calls.append(("sample", None)), checkpoint_every=2,
                 save=lambda step: console.calls.append(("save", step)))
    loop_of(StandIn(), 5, console, **parts).run()
    steps = [(kind, step) for kind, step in schedule(console)]
    assert steps == [("val", 0), ("val", 2), ("save", 2), ("sample", None), ("val", 4),
                     ("save", 4), ("val", 5), ("sample", None), ("save", 5)]
    # resumed at step 2: its val loss and checkpoint were taken before it stopped
    console = Recorder()
    loop_of(StandIn(), 5, console, **parts).run(2, resuming=True)
    assert schedule(console) == [("sample", None), ("val", 4), ("save", 4), ("val", 5),
                                 ("sample", None), ("save", 5)]


def test_a_step_is_the_mean_over_its_scored_targets():
    console, model = Recorder(), StandIn(norm=4.0)
    loop_of(model, 1, console).run()
    assert model.calls == [("zero_grad",), ("backward", 4), ("backward", 4),
                           ("update", 1, GRAD_CLIP / 4.0)]
    (_, step, loss, norm), = [c for c in console.calls if c[0] == "train"]
    assert (step, loss, norm) == (0, (3 * 2 + 1 * 10) / 4, 4.0)
    model = StandIn(norm=0.5)
    loop_of(model, 1, Recorder()).run()
    assert model.calls[-1] == ("update", 1, 1.0)   # under the clip: unscaled


def test_an_overflowed_step_is_not_applied():
    console, model = Recorder(), StandIn(overflow=True)
    loop_of(model, 1, console).run()
    assert not [c for c in model.calls if c[0] == "update"]
    assert [c for c in console.calls if c[0] == "log_overflow"]
