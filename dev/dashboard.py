"""
A live terminal dashboard of a training run (rich): it follows the run's JSON log (train.py
--json-log, llmc/report.py; finetune.py -o DIR always writes one, with the trained and frozen
parameters, the masked share and memory by kind) as tail -f does, or for a run without one its main.log; or it
starts the run itself.

    python dev/dashboard.py OUT_DIR             follow OUT_DIR/log.jsonl, else OUT_DIR/main.log
                                                once it has a line (or a JSON log or main.log
                                                FILE; it waits for a run that has not started
                                                yet, saying so, and without a terminal for at
                                                most --wait seconds)
    python dev/dashboard.py --run -- -e d2 -x 100 -n 20 [train.py's flags]
                                                start train.py with --json-log (into its -o DIR,
                                                a new temporary one without -o), follow it; its
                                                console output goes to DIR/train.out

It shows the loss, the val loss and HellaSwag's accuracy (-h 1) as sparklines (the whole run,
squeezed to the width), the updates skipped as outliers (-sl, -sg), the step time and
throughput (the last step's beside the mean after the first, TFLOPS against the peak, compile
share, the kernel groups with --profile), and a sample decoded from the newest
checkpoint in the run's dir (train.py -n N writes them), made by train.py's own sampling
(llmc/sampler.generate, seed 1337: a checkpoint always gives the same sample) in a thread.
It stops when the run's end-of-run report arrives (or, with --run, the run ends), a finished
run drawn at once; Ctrl-C stops following (and the run it started).

main.log (llmc/logger.py's Logger, llm.c's format) holds the losses, learning rate, norm,
HellaSwag's accuracy and skipped updates, but no step times and no header: the title and the
samples' model family and tokenizer come from the run's run.json then. It marks no end of run
either: train.py's last act is to plot it into loss.png, so a loss.png as new as main.log is the
end (a resumed run rewrites main.log, newer than its earlier part's plot); without matplotlib
there is none, and without a terminal the dashboard stops once main.log has not grown for
--wait seconds.
"""
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rich.console import Console, Group  # noqa: E402
from rich.live import Live  # noqa: E402
from rich.panel import Panel  # noqa: E402
from rich.table import Table  # noqa: E402

from llmc.cli import Parser  # noqa: E402
from llmc.report import LOG_NAME  # noqa: E402   train.py --json-log's file in -o DIR

MAIN_LOG_NAME = "main.log"   # llmc/logger.py's Logger writes it in -o DIR, --json-log or not
PLOT_NAME = "loss.png"       # train.py plots main.log into it as the run's last act
BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values, width):
    """values squeezed to at most width characters (the mean of each bucket), as blocks from
    the lowest value (▁) to the highest (█)."""
    values = [v for v in values if v == v]   # NaN losses leave a gap in the data, not the line
    if not values:
        return ""
    if len(values) > width:
        buckets = [values[i * len(values) // width:(i + 1) * len(values) // width]
                   for i in range(width)]
        values = [sum(b) / len(b) for b in buckets]
    lo, hi = min(values), max(values)
    scale = (len(BLOCKS) - 1) / (hi - lo) if hi > lo else 0.0
    return "".join(BLOCKS[round((v - lo) * scale)] for v in values)


class LogFollower:
    """The records of a JSON log as they are written: poll() returns those of the lines
    completed since the last poll (a line still being written waits for its newline)."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.partial = b""
        self.skipped = 0   # complete lines that are no record (a JSON log's not JSON objects)

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:   # the run has not started writing yet
            return []
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        records = (self.record(line.decode()) for line in lines if line.strip())
        return [r for r in records if r is not None]

    def record(self, line):
        """The record of a complete line; None (counted in skipped) for one that is not a JSON
        object: a run's log is read while it is written, and a torn or foreign line must not
        end the dashboard."""
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            self.skipped += 1
            return None
        return record

    def ended(self):
        """Whether the run has ended apart from its records: a JSON log says so in one (its
        end-of-run report)."""
        return False


class MainLogFollower(LogFollower):
    """main.log's lines (llmc/logger.py's Logger) as the JSON log's records of the same steps,
    with what main.log holds of them: no step times."""

    def record(self, line):
        """The record of a line "s:STEP NAME:VALUE ..."; None for a line of another kind."""
        step, *fields = line.split()
        try:
            step = int(step.removeprefix("s:"))
            values = {name: float(value) for name, value in (f.split(":", 1) for f in fields)}
        except ValueError:
            return None
        if {"trl", "lr", "norm"} <= values.keys():
            return dict(type="train", step=step, loss=values["trl"], lr=values["lr"],
                        norm=values["norm"])
        if "tel" in values:
            return dict(type="val", step=step, loss=values["tel"])
        if "eval" in values:
            return dict(type="eval", step=step, accuracy=values["eval"])
        if "overflow_loss_scale" in values:
            return dict(type="skip", step=step, reason="overflow",
                        loss_scale=values["overflow_loss_scale"])
        for reason in ("loss", "grad"):
            if f"skip_{reason}z" in values:
                return dict(type="skip", step=step, reason=reason, z=values[f"skip_{reason}z"])
        return None

    def ended(self):
        """Whether the run's loss.png is as new as its main.log: plotted from all of it, at the
        run's end (a run resumed since appends to a main.log it rewrote first)."""
        try:
            return (os.path.getmtime(os.path.join(os.path.dirname(self.path), PLOT_NAME))
                    >= os.path.getmtime(self.path))
        except FileNotFoundError:
            return False


def log_to_follow(json_log):
    """The log of the run in json_log's dir: json_log, or that run's main.log when it has a
    line and json_log is not there, a run without --json-log (the Logger creates both before
    either has a line)."""
    main_log = os.path.join(os.path.dirname(json_log), MAIN_LOG_NAME)
    if (not os.path.exists(json_log) and os.path.exists(main_log)
            and os.path.getsize(main_log) > 0):
        return main_log
    return json_log


def run_config_head(run_dir):
    """What the JSON log's "run" record would say of the run in run_dir, from its run.json
    (train.py's settings of the run in -o) and vocab_map.bin: for the title, and for the
    samples' model family and tokenizer."""
    from llmc.checkpoint import read_run_config
    from llmc.formats import FormatError
    from llmc.vocab import MAP_NAME
    try:
        config = read_run_config(run_dir) or {}
    except FormatError:   # a broken run.json: GPT-2's samples, an unnamed run
        config = {}
    names = {"--family": "family", "-e": "init", "-b": "B", "-t": "T", "-i": "train_data"}
    head = {name: config[flag] for flag, name in names.items() if config.get(flag) is not None}
    head["compact_vocab"] = os.path.exists(os.path.join(run_dir, MAP_NAME))
    return head


def sample_checkpoint(model_path, head, gen_tokens):
    """The text train.py samples from the model file at model_path (its family, data's
    tokenizer and vocabulary compaction from the run's "run" record): its
    llmc/sampler.generate, seed 1337."""
    from llmc.families import get_family
    from llmc.logger import Console as TextConsole
    from llmc.sampler import generate
    from llmc.tokenizer import load_sample_tokenizer
    from llmc.vocab import MAP_NAME, VocabMap
    model = get_family(head.get("family", "gpt2")).model_class.from_checkpoint(model_path, "cpu")
    vocab_map = (VocabMap.load(os.path.join(os.path.dirname(model_path), MAP_NAME))
                 if head.get("compact_vocab") else None)
    out = io.StringIO()
    generate(model, load_sample_tokenizer(head.get("train_data", ""), vocab_map), gen_tokens,
             TextConsole(out))
    return out.getvalue().split("---\n", 1)[1].rsplit("\n---", 1)[0]


class Dashboard:
    """What the dashboard knows of a run, from its JSON log or main.log at log_path (poll())
    and the checkpoints in the log's directory; render() draws it. With main_log_fallback, a
    JSON log that is not there gives way to the run's main.log once that has a line
    (log_to_follow)."""

    def __init__(self, log_path, gen_tokens=64, background=True, main_log_fallback=False):
        self.run_dir = os.path.dirname(os.path.abspath(log_path))
        self.main_log_fallback = main_log_fallback
        self.head = {}
        self._follow(log_path)
        self.gen_tokens, self.background = gen_tokens, background
        self.report, self.last = None, None
        self.logged = False   # the log has had a record
        self.losses, self.val_losses, self.step_ms = {}, {}, {}
        self.hellaswag = {}   # step -> HellaSwag's accuracy
        self.skipped = {}     # step -> why its update was skipped ("loss", "grad", fp16's "overflow")
        self.sample_step, self.sample, self.sampling = None, None, None
        self.ended = False   # the run is over (follow() says so): no "(sampling ...)" then

    def _follow(self, log_path):
        """Read the log at log_path from its start: a JSON log, or a main.log, which has no
        "run" record (the run's run.json stands in for it)."""
        self.log_path = log_path
        self.from_main_log = os.path.basename(log_path) == MAIN_LOG_NAME
        self.follower = (MainLogFollower if self.from_main_log else LogFollower)(log_path)
        if self.from_main_log:
            self.head = run_config_head(self.run_dir)

    def poll(self):
        """Read the new records; start sampling a new checkpoint. True if anything changed."""
        if self.main_log_fallback:
            log_path = log_to_follow(self.log_path)
            if log_path != self.log_path:
                self.main_log_fallback = False
                self._follow(log_path)
        records = self.follower.poll()
        self.logged |= bool(records)
        for r in records:
            if r["type"] == "run":
                self.head, self.report = r, None
            elif r["type"] == "train":
                self.losses[r["step"]] = r["loss"]
                if "ms" in r:   # not in a main.log's
                    self.step_ms[r["step"]] = r["ms"]
                self.last = r
            elif r["type"] == "val":
                self.val_losses[r["step"]] = r["loss"]
            elif r["type"] == "eval":
                self.hellaswag[r["step"]] = r["accuracy"]
            elif r["type"] == "skip":
                self.skipped[r["step"]] = r["reason"]
            elif r["type"] == "report":
                self.report = r
        return bool(records) | self._check_checkpoint()

    def _check_checkpoint(self):
        from llmc.checkpoint import checkpoint_paths, find_max_step
        if self.gen_tokens == 0:
            return False
        step = find_max_step(self.run_dir)
        if step is None or step == self.sample_step or self.sampling is not None:
            return False
        self.sample_step = step
        path = checkpoint_paths(self.run_dir, step)[0]

        def work():
            try:
                self.sample = sample_checkpoint(path, self.head, self.gen_tokens)
            except Exception as e:   # a checkpoint deleted by -nk meanwhile, a missing build
                self.sample = f"(no sample: {type(e).__name__}: {e})"
            self.sampling = None
        if self.background:
            self.sampling = threading.Thread(target=work, daemon=True)
            self.sampling.start()
        else:
            work()
        return True

    def wait_for_sample(self):
        thread = self.sampling
        if thread is not None:
            thread.join()

    def done(self):
        return self.report is not None or self.follower.ended()

    def started(self):
        """True once the log has a record."""
        return self.logged

    def _rates(self):
        """The rows of the step time, throughput and TFLOPS: the last step's beside the mean
        of the steps after the first (the end-of-run report's, once it is there)."""
        head, last = self.head, self.last
        timed = [self.step_ms[s] for s in sorted(self.step_ms)[1:]] or [last["ms"]]
        mean_ms = self.report["mean_ms"] if self.report else sum(timed) / len(timed)
        tokens, flops, peak = (head.get("tokens_per_step"), head.get("flops_per_step"),
                               head.get("peak_tflops"))
        mean_tflops = None if flops is None else flops / mean_ms / 1e9

        def tflops(value, percent):
            return "" if value is None else f"{value:.4g}" + (
                "" if percent is None else f" ({percent:.1f}% of peak)")
        return [("", "last step", f"mean of {len(timed)} (the first left out)"
                 if len(self.step_ms) > 1 else "mean"),
                ("ms/step", f"{last['ms']:.1f}", f"{mean_ms:.1f}"),
                ("scored tokens/s" if "trained_parameters" in head else "tokens/s",
                 f"{last['tokens_per_s']:,.0f}",
                 f"{tokens * 1e3 / mean_ms:,.0f}" if tokens is not None else
                 f"{self.report['tokens_per_s']:,.0f}" if self.report else ""),
                ("TFLOPS", tflops(last["tflops"], last.get("peak_percent")),
                 tflops(mean_tflops, None if mean_tflops is None or not peak else
                        100 * mean_tflops / peak))]

    def render(self, width=100):
        head, last = self.head, self.last
        spark = max(10, width - 30)
        steps = sorted(self.losses)
        total = f"/{head['max_steps']}" if "max_steps" in head else ""   # not in run.json
        backend = f" on {head['backend']}" if "backend" in head else ""
        title = (f"{head.get('family', '?')} {head.get('init', '')}".rstrip() + backend +
                 f", B={head.get('B', '?')} T={head.get('T', '?')}")
        curves = Table.grid(padding=(0, 1))
        curves.add_column(width=22)
        curves.add_column()
        if last is not None:
            curves.add_row(f"loss {last['loss']:.4f}",
                           sparkline([self.losses[s] for s in steps], spark))
        if self.val_losses:
            val_steps = sorted(self.val_losses)
            curves.add_row(f"val loss {self.val_losses[val_steps[-1]]:.4f}",
                           sparkline([self.val_losses[s] for s in val_steps], spark))
        if self.hellaswag:
            eval_steps = sorted(self.hellaswag)
            curves.add_row(f"HellaSwag {self.hellaswag[eval_steps[-1]]:.4f}",
                           sparkline([self.hellaswag[s] for s in eval_steps], spark))
        if last is not None and "ms" in last:
            curves.add_row(f"ms/step {last['ms']:.1f}",
                           sparkline([self.step_ms[s] for s in steps[1:]], spark))

        stats = Table.grid(padding=(0, 2))
        rates = Table.grid(padding=(0, 2))
        if last is not None:
            done = last["step"] + 1
            stats.add_row(f"step {done}{total}" + (", finished" if self.done() else ""),
                          f"lr {last['lr']:.2e}", f"norm {last['norm']:.3f}")
            if "trained_parameters" in head:   # finetune.py's run
                stats.add_row(f"trained {head['trained_parameters']:,} of "
                              f"{head['num_parameters']:,} parameters "
                              f"({100 * head['trained_parameters'] / head['num_parameters']:.2f}%)",
                              f"{100 * head['masked_share']:.1f}% of targets masked")
            if self.report is not None and "memory" in self.report:
                stats.add_row("memory " + ", ".join(
                    f"{kind} {size / 2 ** 20:.1f} MiB"
                    for kind, size in self.report["memory"].items() if size))
            if self.skipped:
                newest = max(self.skipped)
                stats.add_row(f"skipped updates {len(self.skipped)}",
                              f"last at step {newest + 1} ({self.skipped[newest]}"
                              f"{'' if self.skipped[newest] == 'overflow' else ' z-score'})")
            if "ms" not in last:   # a main.log's step
                rates.add_row(f"step times: not in {MAIN_LOG_NAME} (train.py --json-log "
                              f"writes them)")
            else:
                self._add_timings(rates, last)
        elif not os.path.exists(self.log_path):
            stats.add_row(f"no {self.log_path} yet: train.py writes it with --json-log" +
                          (f", else {MAIN_LOG_NAME} beside it (once it has a line)"
                           if self.main_log_fallback else
                           " (a run without it cannot be followed)"))
        else:
            stats.add_row("waiting for the first step ...")

        sample_title = ("sample" if self.sample_step is None else
                        f"sample of the checkpoint at step {self.sample_step}")
        sample = (self.sample if self.sample is not None else
                  "(the run has ended; decoding this checkpoint's sample for the last frame)"
                  if self.sample_step is not None and self.ended else
                  "(sampling ...)" if self.sample_step is not None else
                  "(no samples: -g 0)" if self.gen_tokens == 0 else
                  "(a fine-tuning run: generate.py talks to what it writes)"
                  if "trained_parameters" in head else
                  "(no checkpoint yet: train.py -o writes the final step's, -n N one "
                  "every N steps)")
        return Panel(Group(stats, rates, curves, Panel(sample, title=sample_title)), title=title,
                     subtitle=f"following {self.log_path}" + (
                         f" ({self.follower.skipped} lines not records: skipped)"
                         if self.follower.skipped else ""), width=width)

    def _add_timings(self, rates, last):
        """The rows of the last step's timings: its rates, compile share, kernel groups and
        the ANE's parts."""
        for row in self._rates():
            rates.add_row(*row)
        if "compile_share" in last:   # train.py's (finetune.py's steps have no groups)
            rates.add_row(f"compile {100 * last['compile_share']:.1f}%",
                          *[f"{g} {100 * t / last['ms']:.0f}%"
                            for g, t in last.get("groups_ms", {}).items()][:2])
        if len(last.get("groups_ms", {})) > 2:
            rates.add_row("", *[f"{g} {100 * t / last['ms']:.0f}%"
                                for g, t in last["groups_ms"].items()][2:4])
        if "ane_engine_ms" in last:   # the ANE backends' step (accel/ane/device.py)
            rates.add_row(f"ANE engine {last['ane_engine_ms']:.1f} ms",
                          f"CPU dW {last['ane_dw_ms']:.1f} ms",
                          f"overlap {last['ane_overlap_ms']:.1f} ms")
        if "ane_compiles" in last:    # its static pipeline
            rates.add_row(f"ANE compiles {last['ane_compiles']}",
                          f"restarts {last.get('restarts', 0)}", "")


def follow(dashboard, console, process=None, interval=0.5, wait_s=5.0):
    """Redraw the dashboard as the log grows until the run ends: its end-of-run report, a
    main.log's loss.png (Dashboard.done), or process's end. Without a terminal (nobody to watch
    it wait) and without a run of its own, False when nothing came within wait_s seconds, and a
    main.log that has not grown for wait_s seconds is taken as the whole run (saying so), as
    its end may never be marked (no matplotlib, a stopped run)."""
    dashboard.poll()   # what is there already: a finished run is drawn at once
    unwatched = process is None and not console.is_terminal
    if unwatched:
        deadline = time.monotonic() + wait_s
        while not dashboard.started() and time.monotonic() < deadline:
            time.sleep(min(interval, wait_s))
            dashboard.poll()
        if not dashboard.started():
            return False
    grown_at = time.monotonic()
    with Live(dashboard.render(console.width), console=console, auto_refresh=False) as live:
        while True:
            changed = dashboard.poll()
            if changed:
                grown_at = time.monotonic()
            stalled = (unwatched and dashboard.from_main_log
                       and time.monotonic() - grown_at >= wait_s)
            finished = (dashboard.done() or stalled or
                        (process is not None and process.poll() is not None))
            if finished:   # the last lines, and a sample of the last checkpoint
                dashboard.ended = True
                live.update(dashboard.render(console.width), refresh=True)
                dashboard.wait_for_sample()
                dashboard.poll()
                dashboard.wait_for_sample()
            if changed or finished:
                live.update(dashboard.render(console.width), refresh=True)
            if finished:
                break
            time.sleep(interval)
    if not console.is_terminal:   # rich ends the last frame's line on a terminal only
        console.line()
    if stalled:
        console.print(f"{dashboard.log_path} has not grown for {wait_s:g} s and there is no "
                      f"terminal to wait on: stopped, taking it as the whole run")
    return True


def start_run(train_args):
    """Start train.py with these flags (and --json-log into its -o DIR); (process, log path)."""
    train_args = [str(a) for a in train_args]
    if train_args[:1] == ["train.py"] or train_args[:1] and train_args[0].endswith("/train.py"):
        train_args = train_args[1:]
    if "-o" not in train_args:
        train_args = [*train_args, "-o", tempfile.mkdtemp(prefix="llmpyx-run-")]
    out_dir = train_args[train_args.index("-o") + 1]
    os.makedirs(out_dir, exist_ok=True)
    if "--json-log" not in train_args:
        train_args = [*train_args, "--json-log"]
    after = train_args[train_args.index("--json-log") + 1:]
    # a bare --json-log (train.py's own default: -o DIR's log) is followed by a flag or nothing
    log_path = after[0] if after and not after[0].startswith("-") else os.path.join(out_dir, LOG_NAME)
    with open(os.path.join(out_dir, "train.out"), "w") as out:
        process = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *train_args],
                                   stdout=out, stderr=subprocess.STDOUT)
    return process, log_path


def main(argv=None, console=None):
    p = Parser(prog="dashboard.py",
               description="Live dashboard of a train.py run (its JSON log, else its main.log).")
    p.add_argument("run", nargs="?", help=f"the run's output dir (its {LOG_NAME}, else its "
                                          f"{MAIN_LOG_NAME}), or a JSON log or {MAIN_LOG_NAME}")
    p.add_argument("--run", dest="start", action="store_true",
                   help="start train.py with the flags after --, and follow it")
    p.add_argument("-g", dest="gen_tokens", type=int, default=64,
                   help="tokens per sample (0: no samples; they take CPU time beside the run)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    p.add_argument("--wait", type=float, default=5.0,
                   help="without a terminal: seconds to wait for the log's first line before "
                        "giving up, and for a main.log to grow before taking it as the whole "
                        "run (on a terminal it waits until Ctrl-C, saying for what)")
    argv = sys.argv[1:] if argv is None else list(argv)
    train_args = []
    if "--" in argv:
        at = argv.index("--")
        argv, train_args = argv[:at], argv[at + 1:]
    args = p.parse_args(argv)
    if args.start == (args.run is not None):
        p.error("give a run's dir or log, or --run -- TRAIN_FLAGS")
    console = console or Console()
    process, is_dir = None, False
    if args.start:
        process, log_path = start_run(train_args)
        console.print(f"started train.py (pid {process.pid}), following {log_path}")
    else:
        # a log FILE, else a run's dir (one that is not there is a mistyped one)
        is_dir = not (os.path.isfile(args.run) or args.run.endswith((".jsonl", ".json"))
                      or os.path.basename(args.run) == MAIN_LOG_NAME)
        log_path = log_to_follow(os.path.join(args.run, LOG_NAME)) if is_dir else args.run
        if not os.path.isdir(os.path.dirname(os.path.abspath(log_path))):   # else: wait for it
            p.error(f"{os.path.dirname(log_path)}: no such directory (train.py -o DIR writes "
                    f"DIR/{MAIN_LOG_NAME}, with --json-log DIR/{LOG_NAME})")
        if os.path.basename(log_path) == MAIN_LOG_NAME:
            console.print(f"following {log_path} (" + (f"no {LOG_NAME}: " if is_dir else "") +
                          "run with --json-log for step times)")
        else:
            console.print(f"following {log_path}" + (
                "" if os.path.exists(log_path) else
                " (not there yet: train.py writes it with --json-log" +
                (f", else {MAIN_LOG_NAME} beside it)" if is_dir else ")")))
    dashboard = Dashboard(log_path, args.gen_tokens, main_log_fallback=is_dir)
    try:
        if not follow(dashboard, console, process, args.interval, args.wait):
            writer = "train.py -o DIR" + ("" if dashboard.from_main_log else " --json-log")
            sys.stderr.write(f"dashboard.py: nothing in {dashboard.log_path} after "
                             f"{args.wait:g} s, and no terminal to wait on: is a run writing it "
                             f"({writer})?\n")
            return 1
    except KeyboardInterrupt:
        if process is not None:
            process.terminate()
            process.wait()
        return 130
    if process is not None:
        status = process.wait()
        if status != 0:
            console.print(f"train.py ended with status {status}: see "
                          f"{os.path.join(os.path.dirname(log_path), 'train.out')}")
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
