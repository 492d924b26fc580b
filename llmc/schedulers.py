"""
Learning rate schedulers, as llm.c's llmc/schedulers.h: get_scheduler(name, ...) gives an object
whose get_learning_rate(step) is the learning rate of step (0-based). One kind so far:

    cosine   linear warmup over warmup_iterations steps, then a cosine decay from
             learning_rate down to learning_rate * final_learning_rate_frac at the last step
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


SCHEDULERS = {"cosine": CosineWithWarmup}


def get_scheduler(name, learning_rate, warmup_iterations, train_num_batches,
                  final_learning_rate_frac):
    if name not in SCHEDULERS:
        raise ValueError(f"unknown learning rate scheduler {name!r} (known: "
                         f"{', '.join(SCHEDULERS)})")
    return SCHEDULERS[name](learning_rate, warmup_iterations, train_num_batches,
                            final_learning_rate_frac)
