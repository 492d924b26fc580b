"""
Learning rate schedulers, as llm.c's llmc/schedulers.h: get_scheduler(name, ...) gives an object
whose get_learning_rate(step) is the learning rate of step (0-based):

    cosine            linear warmup over warmup_iterations steps, then a cosine decay from
                      learning_rate down to learning_rate * final_learning_rate_frac at the last step
    cosine-restarts   llama.cpp's training schedule (common/train.cpp, cosine_decay_restart):
                      the same warmup, then cosine cycles from learning_rate down to
                      learning_rate * final_learning_rate_frac, the first decay_steps long, each
                      next one restart_mult times longer (truncated to whole steps), restarting at
                      learning_rate (SGDR, warm restarts).  llama.cpp's --cos-decay-steps and
                      --cos-decay-restart; its --cos-decay-min is final_learning_rate_frac.
"""
import math


class CosineWithWarmup:
    def __init__(self, learning_rate, warmup_iterations, train_num_batches,
                 final_learning_rate_frac):
        self.learning_rate = learning_rate
        self.warmup_iterations = warmup_iterations
        self.train_num_batches = train_num_batches
        self.final_learning_rate_frac = final_learning_rate_frac

    def get_learning_rate(self, step):
        lr, warmup = self.learning_rate, self.warmup_iterations
        if step < warmup:
            return lr * (step + 1) / warmup
        decay_ratio = (step - warmup) / (self.train_num_batches - warmup)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
        min_lr = lr * self.final_learning_rate_frac
        return min_lr + coeff * (lr - min_lr)


class CosineWithRestarts:
    def __init__(self, learning_rate, warmup_iterations, train_num_batches,
                 final_learning_rate_frac, decay_steps=1000, restart_mult=1.1):
        if decay_steps < 1 or not restart_mult >= 1.0:
            raise ValueError(f"cosine-restarts: need decay_steps >= 1 and restart_mult >= 1, "
                             f"got {decay_steps} and {restart_mult}")
        self.learning_rate = learning_rate
        self.warmup_iterations = warmup_iterations
        self.final_learning_rate_frac = final_learning_rate_frac
        self.decay_steps = decay_steps
        self.restart_mult = restart_mult

    def get_learning_rate(self, step):
        lr, warmup = self.learning_rate, self.warmup_iterations
        if step < warmup:
            return lr * (step + 1) / warmup
        # llama.cpp's cosine_decay_restart: the step within its cycle; a cycle ends at the
        # minimum (step == cycle) and the next one goes on from its step 1
        step, cycle = step - warmup, self.decay_steps
        while step > cycle:
            step -= cycle
            cycle = int(self.restart_mult * cycle)
        coeff = 0.5 * (1.0 + math.cos(math.pi * step / cycle))  # 1 -> 0 over the cycle
        min_lr = lr * self.final_learning_rate_frac
        return min_lr + coeff * (lr - min_lr)


SCHEDULERS = {"cosine": CosineWithWarmup, "cosine-restarts": CosineWithRestarts}


def get_scheduler(name, learning_rate, warmup_iterations, train_num_batches,
                  final_learning_rate_frac, **options):
    """The scheduler called name; options are its own (cosine-restarts: decay_steps,
    restart_mult)."""
    if name not in SCHEDULERS:
        raise ValueError(f"unknown learning rate scheduler {name!r} (known: "
                         f"{', '.join(SCHEDULERS)})")
    return SCHEDULERS[name](learning_rate, warmup_iterations, train_num_batches,
                            final_learning_rate_frac, **options)
