"""
The efficiency report of a training run, for every backend: what each step cost and how close
it came to the device's peak.

    python train.py ... -o DIR --json-log               DIR/log.jsonl
    python train.py ... --json-log FILE [--profile-groups] [--peak-tflops X]

The JSON log (llmc/logger.py's Logger writes it beside main.log) has one object a line:
    {"type": "run", ...}     at the start: the shapes, the backend, FLOPs per step, the peak
    {"type": "train", "step", "loss", "lr", "norm", "ms", "tokens_per_s", "tflops",
     "peak_percent", "compile_ms", "compile_share", "groups_ms"}     every step
    {"type": "val", "step", "loss"}                                  every val loss
    {"type": "report", ...}  at the end: the summary the console prints as a table
A resumed run appends to it (a new "run" line first).

FLOPs are the model's, llmc/plan.py's flops_plan (forward + backward, 3x the forward): what the
step must compute, not what a recompute policy adds on top, so the rate is comparable across
policies (model FLOPs utilization). tokens/s = tokens per step * 1000 / ms.

The peak (per process; times the number of processes for a run on many): --peak-tflops, else
the backend's `peak_tflops` attribute where it has one, else, for a backend in host memory,
the sgemm rate of kernels.matmul measured now (llmc/plan.py's measure_gflops, about 0.1 s).

Compile time: a backend that compiles programs (the ANE runtime) exposes `compile_seconds`,
its seconds spent compiling so far; a step's compile time is its increase. 0 for the others.

Time per kernel group (core, gpt2, llama, flash: accel/backend.pyx's ENTRY_GROUPS of the
backend table's entries; a Llama's matmuls and residuals are gpt2 entries) comes from
the profile:NAME wrapper (accel/instrument.pyx), which times every table call; --profile-groups
runs the backend under it. Its cost: two clock reads and two synchronizes a call (no-ops on the
CPU): below the noise here (a d1 at B=1 T=16, 46 calls a step: the fastest step 9.3 ms without,
7.5-8.1 ms with, on a busy 2-core machine); on a device every synchronize drains its queue, so
the steps are slower there.
"other" is the rest of the step: Python, the data loader, the collectives.
"""
__all__ = ["Efficiency", "LOG_NAME", "device_peak"]

LOG_NAME = "log.jsonl"   # train.py --json-log's file in -o DIR when no FILE is given


def device_peak(backend, peak_tflops=None):
    """(peak TFLOPS of one process, where the number comes from), or (None, why not)."""
    if peak_tflops is not None:
        return float(peak_tflops), "--peak-tflops"
    if backend.peak_tflops is not None:
        return float(backend.peak_tflops), f"{backend.name}'s peak_tflops"
    if backend.host_visible:
        from llmc.plan import measure_gflops
        return measure_gflops() / 1e3, "kernels.matmul's sgemm, measured now"
    return None, f"unknown for {backend.name}: give --peak-tflops"


def _profiled_seconds(backend):
    """{entry: seconds so far} of a profile:NAME backend, else None."""
    if not backend.name.startswith("profile:"):
        return None
    return {name: e["seconds"] for name, e in backend.report()["entries"].items()}


class Efficiency:
    """Each step's cost (begin() before it, end(elapsed_s) after it: that step's JSON fields)
    and the run's summary (summary(), table_rows())."""

    def __init__(self, model, B, T, total_batch_size, num_processes=1, peak_tflops=None):
        from accel.backend import ENTRY_GROUPS
        from llmc.plan import flops_plan
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

    def header(self):
        """The fields of the JSON log's "run" line that this report adds."""
        return dict(tokens_per_step=self.tokens_per_step, flops_per_step=self.flops_per_step,
                    peak_tflops=self.peak_tflops, peak_source=self.peak_source,
                    profile_groups=self.profiled)

    def _compile_seconds(self):
        return float(self.backend.compile_seconds)

    def begin(self):
        """Before a step: where the compile and kernel clocks stand."""
        self._compile_start = self._compile_seconds()
        self._entries_start = _profiled_seconds(self.backend)

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
            groups = dict.fromkeys(self.groups, 0.0)
            start = self._entries_start
            for entry, seconds in _profiled_seconds(self.backend).items():
                groups[self.group_of[entry]] += (seconds - start.get(entry, 0.0)) * 1e3
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
        return summary

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

