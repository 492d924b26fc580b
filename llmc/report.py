"""
The efficiency report of a training run, for every backend: what each step cost and how close
it came to the device's peak.

    python train.py ... -o DIR --json-log               DIR/log.jsonl
    python train.py ... --json-log FILE [--profile] [--peak-tflops X]

The JSON log (llmc/logger.py's Logger writes it beside main.log) has one object a line:
    {"type": "run", ...}     at the start: the shapes, the backend, FLOPs per step, the peak
    {"type": "train", "step", "loss", "lr", "norm", "ms", "tokens_per_s", "tflops",
     "peak_percent", "compile_ms", "compile_share", "groups_ms"}     every step
    {"type": "val", "step", "loss"}                                  every val loss
    {"type": "eval", "step", "accuracy", "correct", "examples"}      HellaSwag (-h 1)
    {"type": "skip", "step", "reason", "z", "threshold"}             an update -sl/-sg skipped
    {"type": "skip", "step", "reason": "overflow", "loss_scale"}      one fp16's overflow skipped
    {"type": "report", ...}  at the end: the summary the console prints as a table
A resumed run appends to it (a new "run" line first).

FLOPs are the model's, llmc/dry_run.py's flops_plan (forward + backward, 3x the forward): what the
step must compute, not what a recompute policy adds on top, so the rate is comparable across
policies (model FLOPs utilization). tokens/s = tokens per step * 1000 / ms.

The peak (per process; times the number of processes for a run on many): --peak-tflops, else
the backend's `peak_tflops` attribute where it has one, else, for a backend in host memory,
the GEMM rate of the backend's precision measured now (llmc/dry_run.py's measure_gflops, about
0.1 s): kernels.matmul's sgemm at fp32, kernels.matmul_bf16's bf16 GEMM at bf16 (--precision
bf16), so a bf16 run's TFLOPS count against the bf16 peak.

Compile time: a backend that compiles programs (the ANE runtime) exposes `compile_seconds`,
its seconds spent compiling so far; a step's compile time is its increase. 0 for the others.

Time per table entry (matmul_forward, attention_backward, adamw_update, ...: accel/spec.py's
names) and per kernel group (core, linear, gpt2, llama, classifier, flash, mixed: its GROUPS)
comes from the profile:NAME wrapper (accel/instrument.pyx), which counts and times every table call; --profile
runs the backend under it. Each step's record gets its groups' ms ("groups_ms", "other" the rest
of the step: Python, the data loader, the collectives), the report the mean per step of every
entry ("profile": calls, ms, share of the step) and train.py prints it as a table
(profile_lines). Its cost: two clock reads and two synchronizes a call (no-ops on the CPU):
below the noise here (a d2 at B=4 T=64, 71 calls a step, one thread on a shared 2-core machine:
108.3 and 108.3 ms a step without it, 109.3 and 107.8 ms with it, its entries all but 0.3-0.4 ms
of the step); on a device every synchronize drains its queue, so the steps are slower there.
"""
__all__ = ["Efficiency", "LOG_NAME", "device_peak", "profile_lines"]

LOG_NAME = "log.jsonl"   # train.py --json-log's file in -o DIR when no FILE is given


def device_peak(backend, peak_tflops=None):
    """(peak TFLOPS of one process, where the number comes from), or (None, why not)."""
    if peak_tflops is not None:
        return float(peak_tflops), "--peak-tflops"
    if backend.peak_tflops is not None:
        return float(backend.peak_tflops), f"{backend.name}'s peak_tflops"
    if backend.host_visible:
        from llmc.dry_run import measure_gflops
        if backend.precision == "bf16":
            from kernels.blas import BF16_LIBRARY
            return (measure_gflops(precision="bf16") / 1e3,
                    f"kernels.matmul_bf16's bf16 GEMM ({BF16_LIBRARY}), measured now")
        return measure_gflops() / 1e3, "kernels.matmul's sgemm, measured now"
    return None, f"unknown for {backend.name}: give --peak-tflops"


def _profiled(backend):
    """{entry: (calls, seconds) so far} of a profile:NAME backend, else None."""
    if not backend.name.startswith("profile:"):
        return None
    return {name: (e["calls"], e["seconds"]) for name, e in backend.report()["entries"].items()}


def _pass_of(entry):
    """forward, backward, or other (AdamW, the norm, memory: the entries of neither)."""
    for name in ("forward", "backward"):
        if entry.endswith("_" + name):
            return name
    return "other"


class Efficiency:
    """Each step's cost (begin() before it, end(elapsed_s) after it: that step's JSON fields)
    and the run's summary (summary(), table_rows())."""

    def __init__(self, model, B, T, total_batch_size, num_processes=1, peak_tflops=None):
        from accel.backend import ENTRY_GROUPS
        from llmc.dry_run import flops_plan
        self.backend = model.backend
        self.tokens_per_step = total_batch_size
        per_batch = flops_plan(type(model), model.config, B, T, model.recompute)
        # flops_plan counts one micro-batch of B*T tokens; a step is total_batch_size tokens
        self.flops_per_step = (per_batch["forward"] + per_batch["backward"]) * (
            total_batch_size // (B * T))
        peak, self.peak_source = device_peak(self.backend, peak_tflops)
        self.peak_tflops = None if peak is None else peak * num_processes
        self.groups = list(ENTRY_GROUPS)
        self.group_of = {entry: group for group, entries in ENTRY_GROUPS.items()
                         for entry in entries}
        self.profiled = self.backend.name.startswith("profile:")
        self.steps = []
        self.entry_steps = []   # profiled: each step's {entry: (calls, ms)}

    def header(self):
        """The fields of the JSON log's "run" line that this report adds."""
        return dict(tokens_per_step=self.tokens_per_step, flops_per_step=self.flops_per_step,
                    peak_tflops=self.peak_tflops, peak_source=self.peak_source,
                    profile=self.profiled)

    def _compile_seconds(self):
        return float(self.backend.compile_seconds)

    def begin(self):
        """Before a step: where the compile and kernel clocks stand."""
        self._compile_start = self._compile_seconds()
        self._entries_start = _profiled(self.backend)

    def end(self, elapsed_s):
        """After a step of elapsed_s seconds: its JSON fields (also kept for the summary)."""
        ms = elapsed_s * 1e3
        tflops = self.flops_per_step / elapsed_s / 1e12
        compile_ms = (self._compile_seconds() - self._compile_start) * 1e3
        record = dict(ms=ms, tokens_per_s=self.tokens_per_step / elapsed_s, tflops=tflops,
                      peak_percent=None if self.peak_tflops is None else
                      100 * tflops / self.peak_tflops,
                      compile_ms=compile_ms, compile_share=compile_ms / ms)
        if self.profiled:
            start = self._entries_start
            entries = {}
            for entry, (calls, seconds) in _profiled(self.backend).items():
                calls0, seconds0 = start.get(entry, (0, 0.0))
                if calls > calls0:
                    entries[entry] = (calls - calls0, (seconds - seconds0) * 1e3)
            self.entry_steps.append(entries)
            groups = dict.fromkeys(self.groups, 0.0)
            for entry, (_, entry_ms) in entries.items():
                groups[self.group_of[entry]] += entry_ms
            groups = {g: t for g, t in groups.items() if t > 0}
            groups["other"] = ms - sum(groups.values())
            record["groups_ms"] = groups
        self.steps.append(record)
        return record

    def summary(self):
        """The run's means over its steps, the first left out (it warms caches and threads)
        unless it is the only one: the JSON log's "report" line."""
        timed = self.steps[1:] or self.steps
        if not timed:
            return dict(steps=0)
        total_ms = sum(s["ms"] for s in timed)
        mean_ms = total_ms / len(timed)
        compile_ms = sum(s["compile_ms"] for s in self.steps)
        all_ms = sum(s["ms"] for s in self.steps)
        tflops = self.flops_per_step / (mean_ms / 1e3) / 1e12
        summary = dict(steps=len(self.steps), timed_steps=len(timed), mean_ms=mean_ms,
                       compile_ms=compile_ms, compile_share=compile_ms / all_ms,
                       tflops=tflops, peak_tflops=self.peak_tflops,
                       peak_percent=None if self.peak_tflops is None else
                       100 * tflops / self.peak_tflops,
                       tokens_per_s=self.tokens_per_step / (mean_ms / 1e3))
        if self.profiled:
            groups = {}
            for s in timed:
                for g, t in s["groups_ms"].items():
                    groups[g] = groups.get(g, 0.0) + t
            summary["group_share"] = {g: t / total_ms for g, t in groups.items()}
            summary["profile"] = self._entry_means(total_ms)
        return summary

    def _entry_means(self, total_ms):
        """{entry: {group, pass, calls, ms, share}} a step, over the timed steps, the slowest
        first: calls and ms are the mean per step, share the part of the mean step."""
        timed = self.entry_steps[1:] or self.entry_steps
        totals = {}
        for entries in timed:
            for entry, (calls, entry_ms) in entries.items():
                c, t = totals.get(entry, (0, 0.0))
                totals[entry] = (c + calls, t + entry_ms)
        n = len(timed)
        return {entry: {"group": self.group_of[entry], "pass": _pass_of(entry),
                        "calls": calls / n, "ms": t / n, "share": t / total_ms}
                for entry, (calls, t) in sorted(totals.items(), key=lambda kv: -kv[1][1])}

    def table_rows(self, summary):
        """The end-of-run report as Console.table rows."""
        if summary["steps"] == 0:
            return [("steps", 0)]
        s = summary
        peak = ("peak unknown (--peak-tflops)" if s["peak_tflops"] is None else
                f"{s['peak_percent']:.1f}% of the peak {s['peak_tflops']:.4g}")
        rows = [("steps", f"{s['steps']} ({s['timed_steps']} timed: the first left out)"
                 if s["timed_steps"] < s["steps"] else s["steps"]),
                ("mean ms/step", f"{s['mean_ms']:.2f}"),
                ("compile", f"{s['compile_ms']:.1f} ms, {100 * s['compile_share']:.1f}% of "
                            f"the steps' time"),
                ("TFLOPS (model)", f"{s['tflops']:.4g}, {peak}"),
                ("peak from", self.peak_source),
                ("tokens/s", f"{s['tokens_per_s']:,.0f}")]
        for group, share in s.get("group_share", {}).items():
            rows.append((f"  {group} entries" if group != "other" else "  other (no entry)",
                         f"{100 * share:.1f}% of the step time"))
        return rows


def profile_lines(summary, backend_name):
    """The report's "profile" as console lines: per kernel group (accel/spec.py's GROUPS, the
    slowest first) a subtotal, then its entries, the slowest first; then forward, backward and
    the other entries apart, and how much of the step the entries account for."""
    profile, mean_ms = summary["profile"], summary["mean_ms"]
    groups = {}
    for entry, e in profile.items():
        groups.setdefault(e["group"], []).append(entry)

    def total(entries):
        return sum(profile[e]["ms"] for e in entries), sum(profile[e]["calls"] for e in entries)

    timed = summary["timed_steps"]
    lines = [f"profile of {backend_name}: the table's entries, mean per step over {timed} timed "
             f"step{'s' if timed != 1 else ''}",
             f"  {'entry':<32} {'calls':>7} {'ms':>10} {'share':>7}"]
    for group, entries in sorted(groups.items(), key=lambda kv: -total(kv[1])[0]):
        group_ms, group_calls = total(entries)
        lines.append(f"  {group + ' (group)':<32} {group_calls:>7g} {group_ms:>10.2f} "
                     f"{100 * group_ms / mean_ms:>6.1f}%")
        for entry in entries:
            e = profile[entry]
            lines.append(f"    {entry:<30} {e['calls']:>7g} {e['ms']:>10.2f} "
                         f"{100 * e['share']:>6.1f}%")
    passes = {}
    for entry, e in profile.items():
        passes[e["pass"]] = passes.get(e["pass"], 0.0) + e["ms"]
    labels = dict(forward="forward", backward="backward", other="other entries")
    lines.append("  " + ", ".join(f"{labels[name]} {passes[name]:.2f} ms "
                                  f"({100 * passes[name] / mean_ms:.1f}%)"
                                  for name in labels if name in passes))
    profiled_ms = sum(passes.values())
    lines.append(f"  profiled entries: {profiled_ms:.2f} ms of {mean_ms:.2f} ms a step; the rest, "
                 f"{mean_ms - profiled_ms:.2f} ms,")
    lines.append("  is Python, the data loader and the profiler (two clock reads a call)")
    return lines
