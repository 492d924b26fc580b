"""
The training loop of train.py and finetune.py, as llm.c's train_gpt2.c main loop: at each step
the evaluations and the checkpoint that are due, then one step of training.

    for step in start .. num_steps:
        the val loss           every val_every steps and at the last
        HellaSwag              at the val steps but the first, and at the last (train.py -h 1)
        a sample               every sample_every steps and at the last (train.py -s N)
        a checkpoint           every checkpoint_every steps and at the last (-o DIR)
        (the last step ends here: num_steps steps were trained)
        one step               its micro-batches (forward, then a backward that adds into the
                               gradients), the gradients summed over the processes, their
                               norm, clipped to GRAD_CLIP, AdamW; skipped when fp16 overflows
                               or -sl/-sg see an outlier

A resumed run (resuming=True) has taken its first step's evaluations and checkpoint before it
stopped: they are not taken again.

What a step trains on is the run's: next_step() gives a Step, this process's micro-batches of
the step and the number of targets the step scores on every process.  Each micro-batch's
backward adds the gradient of its summed loss divided by that number, so the step's gradient
is that of the mean loss over every scored target of the step, however micro-batches and
processes cut it (llm.c's dloss = 1 / (B*T*grad_accum_steps); transformers' num_items_in_batch
for examples of uneven lengths): train.py's token batches score every target, finetune.py's
examples only the completion's with --mask-prompt, and padding none.

train.py sets every part; finetune.py the val loss and checkpoints.  Each part left None (or 0)
is not run.
"""
import collections
import dataclasses
import math
import time
from typing import Any, Callable, Optional

from accel.hooks import NO_HOOKS
from llmc import evalloader

__all__ = ["GRAD_CLIP", "Loop", "Step", "outlier_skip"]

GRAD_CLIP = 1.0   # the gradient's norm is clipped to this, as llm.c's and transformers' Trainer

# this process's micro-batches of a step, (inputs, targets) each (B, T) or shorter, and the
# targets the step scores on every process (what each backward divides by; what tokens/s counts)
Step = collections.namedtuple("Step", "micro_batches scored")


def outlier_skip(zloss, zgrad, skip_lossz, skip_gradz):
    """(reason, z, threshold) when -sl or -sg skips the update, the loss checked first as
    llm.c does; None otherwise (and while the windows fill, their z-scores NaN)."""
    for reason, z, threshold in (("loss", zloss, skip_lossz), ("grad", zgrad, skip_gradz)):
        if threshold and math.isfinite(z) and z > threshold:
            return reason, z, threshold
    return None


@dataclasses.dataclass
class Loop:
    """A run's loop: its model and processes (llmc/distributed.py), where it prints and logs
    (llmc/logger.py's Console and Logger), its schedule and AdamW's settings, and what it runs
    at which steps."""
    model: Any
    dist: Any
    console: Any
    logger: Any
    num_steps: int
    next_step: Callable[[], Step]
    schedule: Any                       # llmc/schedulers.py's: the learning rate at a step
    betas: tuple
    eps: float
    weight_decay: float
    decay_2d_only: bool = True          # no decay of biases and norms' weights (llm.c's)
    val_every: int = 0
    val_loss: Optional[Callable[[], float]] = None   # the val loss (every process's share)
    hellaswag: tuple = ()               # llmc/evalloader.py's examples, scored at val steps
    hellaswag_B: int = 1
    sample_every: int = 0
    sample: Optional[Callable[[], None]] = None      # prints a sample (rank 0 only)
    checkpoint_every: int = 0
    save: Optional[Callable[[int], None]] = None     # save(step): every process calls it
    outliers: Optional[dict] = None     # -sl/-sg: {"loss": ..., "grad_norm": OutlierDetector}
    skip_lossz: float = 0.0
    skip_gradz: float = 0.0
    hooks: Any = NO_HOOKS               # the backend's (accel/hooks.py)
    restart: Optional[Callable[[int, str], None]] = None   # restart(step, why): a fresh process
    restarts: Optional[Callable[[], int]] = None     # the fresh processes so far, logged
    efficiency: Any = None              # llmc/report.py's Efficiency: each step's cost logged
    memory_line: Optional[Callable[[], str]] = None   # printed after the first step
    # what the steps took (timed: all but the first, which warms up), the targets the timed
    # steps scored on every process, and this process's micro-batches' targets and of them scored
    timed_steps: int = 0
    timed_s: float = 0.0
    collective_s: float = 0.0
    timed_scored: int = 0
    positions: int = 0
    scored_positions: int = 0
    hellaswag_s: float = 0.0
    hellaswag_evals: int = 0

    def run(self, step=0, resuming=False):
        """Steps step .. num_steps - 1 trained, the evaluations and checkpoints due from step to
        num_steps taken."""
        model, dist, console, logger = self.model, self.dist, self.console, self.logger
        ema_tokens_per_second, first_step = 0.0, True
        for step in range(step, self.num_steps + 1):
            last_step = step == self.num_steps

            if (self.val_loss is not None and (step % self.val_every == 0 or last_step)
                    and not resuming):
                val_loss = self.val_loss()
                console.print(f"val loss {val_loss:f}")
                logger.log_val(step, val_loss)

            if (self.hellaswag and (step > 0 and step % self.val_every == 0 or last_step)
                    and not resuming):   # every process scores its share
                start = time.perf_counter()
                correct = evalloader.evaluate(model, self.hellaswag, self.hellaswag_B, dist)
                eval_s = time.perf_counter() - start
                self.hellaswag_s, self.hellaswag_evals = self.hellaswag_s + eval_s, \
                    self.hellaswag_evals + 1
                examples = len(self.hellaswag)
                console.print(f"HellaSwag: {correct}/{examples} = {correct / examples:f}")
                logger.log_eval(step, correct / examples, correct, examples, eval_s)

            if (self.sample is not None and (step > 0 and step % self.sample_every == 0
                                             or last_step)
                    and not resuming and dist.process_rank == 0):
                self.sample()

            # -o keeps the final model, as llm.c's last checkpoint; -n N every N steps besides
            if self.save is not None and not resuming and (last_step or (
                    self.checkpoint_every > 0 and step > 0 and step % self.checkpoint_every == 0)):
                self.save(step)
            resuming = False

            if last_step:
                break
            # a backend that cannot run this step in this process (the ANE's static pipeline
            # past its compile budget, accel/ane/hooks.py): the run goes on from here in a
            # fresh one
            cannot = self.hooks.before_step(model, step)
            if cannot is not None:
                self.restart(step, cannot)

            # --------------- one step of training -----------------
            if self.efficiency is not None:
                self.efficiency.begin()
            start = time.perf_counter()
            collective_s = dist.collective_time_s
            batches = self.next_step()
            model.zero_grad()
            summed_loss = 0.0   # this process's, over its scored targets
            for inputs, targets in batches.micro_batches:
                scored = int((targets >= 0).sum())
                if not scored:   # rows of padding only (an epoch's last step): nothing to add
                    continue
                self.positions += targets.size
                self.scored_positions += scored
                summed_loss += model.forward(inputs, targets, training=True) * scored
                model.backward(batches.scored)   # adds its part of the step's mean
            loss = dist.sum(summed_loss) / max(batches.scored, 1)
            dist.reduce_gradients(model)   # summed over the processes (ZeRO-1: this rank's shard)
            lr = self.schedule.get_learning_rate(step)
            grad_norm = dist.grad_norm(model)
            # fp16: gradients that overflowed skip the update, halve the loss scale (model.pyx)
            overflow = model.gradients_overflowed(grad_norm)
            model.adjust_loss_scale(not overflow)
            skip, zscores = None, ("", "")
            if self.outliers is not None and not overflow:   # an outlier's update: skipped whole
                zloss = self.outliers["loss"].update(loss)
                zgrad = self.outliers["grad_norm"].update(grad_norm)
                skip = outlier_skip(zloss, zgrad, self.skip_lossz, self.skip_gradz)
                zscores = (f" ({zloss:+.2f}z)", f" ({zgrad:+.2f}z)")
            if skip is None and not overflow:   # t is the step's, skipped or not (llm.c's)
                clip = GRAD_CLIP / grad_norm if grad_norm > GRAD_CLIP else 1.0
                model.update(lr, self.betas[0], self.betas[1], self.eps, self.weight_decay,
                             step + 1, grad_scale=clip, decay_2d_only=self.decay_2d_only)
                dist.gather_parameters(model)   # ZeRO-1: every rank's updated shard to all
            elapsed_s = time.perf_counter() - start
            collective_s = dist.collective_time_s - collective_s
            # ------------------------------------------------------

            tokens_per_second = batches.scored / elapsed_s
            shown_tokens_per_second = tokens_per_second
            if not first_step:   # a bias-corrected moving average, as llm.c
                self.timed_steps += 1
                self.timed_s += elapsed_s
                self.collective_s += collective_s
                self.timed_scored += batches.scored
                ema_tokens_per_second = 0.95 * ema_tokens_per_second + 0.05 * tokens_per_second
                shown_tokens_per_second = ema_tokens_per_second / (1 - 0.95 ** self.timed_steps)
            if overflow:
                console.print(f"skipping update: the fp16 gradients overflowed; loss scale now "
                              f"2^{math.log2(model.loss_scale):.0f}")
            elif skip is not None:
                console.print(f"skipping update due to {skip[0]} z-score of {skip[1]:f}")
            console.status(f"step {step + 1:4d}/{self.num_steps} | loss {loss:.6f}{zscores[0]} | "
                           f"norm {grad_norm:.4f}{zscores[1]} | lr {lr:.2e} | "
                           f"{elapsed_s * 1000:.2f} ms | {shown_tokens_per_second:.0f} tok/s")
            backend_metrics = self.hooks.after_step(model)   # the ANE's engine, dW, compiles
            if self.restarts is not None:
                backend_metrics["restarts"] = self.restarts()
            cost = (dict(ms=elapsed_s * 1000, tokens_per_s=tokens_per_second, tflops=None)
                    if self.efficiency is None else
                    {**self.efficiency.end(elapsed_s), **backend_metrics})
            logger.log_train(step, loss, lr, grad_norm, **cost)
            if skip is not None:
                logger.log_skip(step, *skip)
            if overflow:
                logger.log_overflow(step, model.loss_scale)
            if first_step and self.memory_line is not None:   # everything is allocated now
                console.print(self.memory_line())
            first_step = False

    def summary_lines(self):
        """What the run's steps and evaluations took, for the console at the end."""
        lines = []
        if self.hellaswag_evals > 0:
            examples = len(self.hellaswag)
            lines.append(f"time in HellaSwag (-h 1): {self.hellaswag_s:.1f} s, "
                         f"{self.hellaswag_evals} evals of {examples} examples "
                         f"({self.hellaswag_s / self.hellaswag_evals / examples:.2f} s an example)")
        if self.timed_steps > 0:
            lines.append(f"total average iteration time: "
                         f"{self.timed_s / self.timed_steps * 1000:f} ms")
            if self.dist.num_processes > 1:   # the collectives' part, the slowest rank's wait too
                lines.append(f"of it in collectives: "
                             f"{self.collective_s / self.timed_steps * 1000:f} ms "
                             f"({100 * self.collective_s / self.timed_s:.1f}%)")
        return lines
