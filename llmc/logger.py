"""
What a training run writes: the Console (stdout, with a live step line on a terminal), notes on
stderr, llm.c's main.log (llmc/logger.h) and the loss plot of it, loss.png; with --json-log the
same records and more as JSON lines (llmc/report.py says which).
"""
import json
import os
import re
import sys

TABLE_RULE = "+-----------------------+" + "-" * 52 + "+"


def note(message):
    print(f"train.py: {message}", file=sys.stderr, flush=True)


class Console:
    """stdout: a live progress line on a terminal, plain lines when piped."""

    def __init__(self, stream=sys.stdout):
        self.stream = stream
        self.live = stream.isatty()
        self.status_shown = False

    def status(self, line):
        """The per-step line: redrawn in place on a terminal, one line each when piped."""
        if self.live:
            self.stream.write("\r\033[K" + line)
            self.status_shown = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def write(self, text):
        """Other output, starting below the last status line."""
        if self.status_shown:
            self.stream.write("\n")
            self.status_shown = False
        self.stream.write(text)
        self.stream.flush()

    def print(self, line=""):
        self.write(line + "\n")

    def table(self, rows):
        """llm.c's table of settings: rows of (name, value), None for a rule."""
        self.print(TABLE_RULE)
        for row in rows:
            self.print(TABLE_RULE if row is None else f"| {row[0]:<21} | {str(row[1]):<50} |")
        self.print(TABLE_RULE)


class Logger:
    """DIR/main.log in llm.c's format: "s:STEP trl:LOSS lr:LR norm:NORM", "s:STEP tel:LOSS",
    "s:STEP eval:ACCURACY" (HellaSwag), and ours for an update skipped as an outlier,
    "s:STEP skip_lossz:Z" or "s:STEP skip_gradz:Z" (a stream and a value, as llm.c's
    dev/vislog.ipynb reads every line); and the JSON log at json_path, one object a line
    (llmc/report.py)."""

    def __init__(self, output_dir, resume_step=None, json_path=None):
        """A new log, or with resume_step the log of the run resumed at that step: its lines
        up to the checkpoint, so that the lines after it (of steps a stopped run did past its
        last checkpoint) are not there twice; the JSON log's train and val records alike."""
        self.path = None if output_dir is None else os.path.join(output_dir, "main.log")
        self.json_path = json_path
        for path in (self.path, json_path):
            if path and resume_step is None:
                open(path, "w").close()
        for path, kept in ((self.path, logged_before), (json_path, json_logged_before)):
            if path and resume_step is not None and os.path.exists(path):
                with open(path) as f:
                    lines = f.read().splitlines(keepends=True)
                with open(path, "w") as f:
                    f.writelines(line for line in lines if kept(line, resume_step))

    @staticmethod
    def _append(path, line):
        if path:
            with open(path, "a") as f:
                f.write(line + "\n")

    def _log(self, line):
        self._append(self.path, line)

    def log_json(self, kind, **fields):
        """One line of the JSON log: {"type": kind, **fields}."""
        self._append(self.json_path, json.dumps(dict(type=kind, **fields)))

    def log_train(self, step, loss, lr, norm, **metrics):
        self._log(f"s:{step} trl:{loss:.4f} lr:{lr:.6f} norm:{norm:.2f}")
        self.log_json("train", step=step, loss=loss, lr=lr, norm=norm, **metrics)

    def log_val(self, step, loss):
        self._log(f"s:{step} tel:{loss:.4f}")
        self.log_json("val", step=step, loss=loss)

    def log_eval(self, step, accuracy, correct, examples, seconds):
        """HellaSwag's accuracy at step (llm.c's logger_log_eval), and what it took."""
        self._log(f"s:{step} eval:{accuracy:.4f}")
        self.log_json("eval", step=step, accuracy=accuracy, correct=correct, examples=examples,
                      seconds=seconds)

    def log_skip(self, step, reason, z, threshold):
        """The update of step skipped: its reason's ("loss" or "grad") z-score was above the
        threshold (-sl, -sg)."""
        self._log(f"s:{step} skip_{reason}z:{z:.4f}")
        self.log_json("skip", step=step, reason=reason, z=z, threshold=threshold)

    def log_overflow(self, step, loss_scale):
        """The update of step skipped: its fp16 gradients overflowed; the loss scale is now
        loss_scale (llmc/model.pyx)."""
        self._log(f"s:{step} overflow_loss_scale:{loss_scale:g}")
        self.log_json("skip", step=step, reason="overflow", loss_scale=loss_scale)


# the main.log lines of evaluations at a step, taken before that step's checkpoint is written
EVALUATED = ("tel", "eval")


def logged_before(line, step):
    """Whether a main.log line was written before the checkpoint at step: the lines of the
    steps before it (train losses, skipped updates) and the evaluations up to it (its own are
    taken before it is written)."""
    m = re.match(r"s:(\d+) (\w+):", line)
    return m is None or int(m.group(1)) < step + (m.group(2) in EVALUATED)


def json_logged_before(line, step):
    """logged_before for a JSON log line: its train, val, eval and skip records by their
    step; every other record (the run's header, reports) is kept."""
    try:
        record = json.loads(line)
    except ValueError:
        return True
    kind = {"train": "trl", "val": "tel", "eval": "eval", "skip": "skip"}.get(record.get("type"))
    if kind is None or "step" not in record:
        return True
    return logged_before(f"s:{record['step']} {kind}:", step)


def read_log(path):
    """The curves in a main.log: {"trl": {step: loss}, "tel": {step: loss}, "eval": {step:
    HellaSwag accuracy}}."""
    curves = {"trl": {}, "tel": {}, "eval": {}}
    with open(path) as f:
        for line in f:
            m = re.match(r"s:(\d+) (trl|tel|eval):(\S+)", line)
            if m:
                curves[m.group(2)][int(m.group(1))] = float(m.group(3))
    return curves


def plot_losses(output_dir, title=None):
    """DIR/loss.png: the train and val losses of DIR/main.log, by step as the console counts
    them (a train loss at step s + 1: after s + 1 updates, a val loss at step s), under title,
    and beside them HellaSwag's accuracy when the run scored it (-h 1), as llm.c's vislog
    draws the two; its path, or None (with a note) when matplotlib cannot be imported."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError as e:
        note(f"cannot import matplotlib ({e}), skipping the loss plot (pip install matplotlib)")
        return None
    curves = read_log(os.path.join(output_dir, "main.log"))
    if curves["eval"]:
        fig, (ax, eval_ax) = plt.subplots(1, 2, figsize=(13, 5),
                                          gridspec_kw={"width_ratios": (8, 5)})
        steps = sorted(curves["eval"])
        eval_ax.plot(steps, [curves["eval"][s] for s in steps], marker="o", color="tab:green")
        eval_ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        eval_ax.set_xlabel("step")
        eval_ax.set_ylabel("HellaSwag accuracy")
        eval_ax.grid(alpha=0.3)
    else:
        fig, ax = plt.subplots(figsize=(8, 5))
    for key, label, shown in (("trl", "train loss", 1), ("tel", "val loss", 0)):
        if curves[key]:
            steps = sorted(curves[key])
            ax.plot([s + shown for s in steps], [curves[key][s] for s in steps], label=label,
                    marker="o" if key == "tel" else None)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # whole steps
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if title:
        ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    path = os.path.join(output_dir, "loss.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
