"""
The ANE pipeline planner: how a Llama model trains on the Apple Neural Engine within the ANE
compiler's budget of compiles per process, computed without a Mac and without allocating it.

    python train.py --model llama-7b --backend ane --dry-run [--ane-pipeline static|dynamic]
        [--recompute POLICY] [--ane-budget 119] [-b B -t T]

Each layer runs eight ANE kernels (accel/ane/mil.py's pieces: what train.py's step runs, the
table's fused group, wo's matmul and attention, accel/ane/table.pyx); the weight gradients, the
norms, RoPE, the embedding, the classifier, the loss and AdamW stay on the CPU, as in the anchor:

    forward   qkv_forward*  attention_forward  wo_forward*  ffn_forward*
    backward  ffn_backward*  wo_backward*  attention_backward  qkv_backward*     (* weights)

Two pipelines:
    static   the weights are constants in the program: one compile per weighted kernel per layer
             after every weight update (the weight-free attention kernels once per process:
             every layer has the same shapes)
    dynamic  the weights are inputs: one compile per distinct kernel shape (eight), once per
             process, whatever the updates

A step (one weight update) is, for each of `accum` micro-batches, the forward of layers 0..L-1
then the backward of layers L-1..0, and then the update on the CPU; a backward first recomputes
the layers the checkpoint policy dropped (the run's recompute plan, llmc/recompute.py's
RecomputePlan: its recomputes() are the model's own walk), which needs their forward kernels
again.  The phases (one layer's
forward, one layer's backward with its recomputes, the update) run in order; a phase needs the
kernels it runs that this process has not compiled since the last update.  When they would pass
the budget (CompileBudget.usable: the limit less the headroom, the one object the runtime
refuses by too), the process saves its state and exec()s itself (training between steps:
llmc/checkpoint.py's restart; inside a step: the lab's dev/ane/restart.py) and the
phase runs in the fresh process.  A layer group is the layers one process runs a pass of: the
plan lists them, the compiles per step, the steps a process lasts, the memory of each group and
of the whole model (the run's: llmc/dry_run.py's memory_plan), and the state a restart writes.

The model and the run come from the caller (the backend's dry_run_plan hook, accel/hooks.py),
which knows them: the config (a Llama config, read by its attributes: n_layers, max_seq_len,
dim, n_heads, n_kv_heads, hidden_dim, describe(); the memory also by param_shapes() and
num_parameters()), the recompute plan (policy, num_layers, slots, output_of, recomputed,
recomputes()) and the model's memory; nothing here imports the run.  Bad plans are refused in
one line (PlanError): a phase needing more compiles than a whole process gets, an unknown
pipeline, a bad budget, B, T or accum.
"""
from dataclasses import dataclass, replace

from accel.ane.runtime import ANE_INNER_MULTIPLE, ANE_LIMIT, CompileBudget
from accel.hooks import format_bytes

__all__ = ["FORWARD", "BACKWARD", "PIPELINES", "Phase", "PlanError", "Plan", "Process",
           "format_pipeline_plan", "inner_sizes", "kernel_id", "make_plan", "place",
           "static_step_compiles", "step_fits"]

PIPELINES = ("static", "dynamic")
# (kernel, takes the layer's weights): accel/ane/mil.py's pieces, in the order a layer runs them
FORWARD = (("qkv_forward", True), ("attention_forward", False), ("wo_forward", True),
           ("ffn_forward", True))
BACKWARD = (("ffn_backward", True), ("wo_backward", True), ("attention_backward", False),
            ("qkv_backward", True))
SECONDS_PER_COMPILE = 0.105   # the anchor's M-series figure: 7.6 s for 72 kernels
HALF = 2   # bytes of an fp16
FLOAT = 4  # bytes of a float32


class PlanError(ValueError):
    """A configuration the planner refuses; str() is one line."""


@dataclass(frozen=True)
class Phase:
    """One unit of a step: a layer's forward or backward (with the forward kernels of the
    layers it recomputes first), or the update. kernels: the kernel ids it runs."""
    kind: str                  # "forward", "backward", "update"
    layer: int = -1
    micro: int = 0             # the micro-batch (gradient accumulation)
    kernels: tuple = ()
    recomputed: tuple = ()     # the layers a backward recomputes first

    def __str__(self):
        if self.kind == "update":
            return "update"
        return f"the {self.kind} of layer {self.layer}" + (f" (micro-batch {self.micro})"
                                                           if self.micro else "")


def kernel_id(pipeline, kernel, weighted, layer):
    """A kernel's identity in a process: per layer for static weighted kernels, else one per
    kernel shape (every layer's are the same)."""
    return f"{kernel}[{layer}]" if pipeline == "static" and weighted else kernel


def step_phases(pipeline, rplan, accum=1):
    """The phases of one step under a RecomputePlan, in order."""
    L = rplan.num_layers
    runs = rplan.recomputes()
    forward = [[kernel_id(pipeline, k, w, l) for k, w in FORWARD] for l in range(L)]
    phases = []
    for micro in range(accum):
        phases += [Phase("forward", l, micro, tuple(forward[l])) for l in range(L)]
        for l in range(L - 1, -1, -1):
            ids = [i for r in runs[l] for i in forward[r]]
            ids += [kernel_id(pipeline, k, w, l) for k, w in BACKWARD]
            phases.append(Phase("backward", l, micro, tuple(dict.fromkeys(ids)), tuple(runs[l])))
    phases.append(Phase("update"))
    return phases


class Process:
    """The kernels one process has compiled since the last update, and its compile count: the
    planner's model of a runtime (accel/ane/runtime.py), deciding restarts by the same rule."""

    def __init__(self, pipeline, budget):
        self.pipeline, self.budget = pipeline, budget
        self.resident, self.compiles = set(), 0

    def needed(self, phase):
        return [k for k in phase.kernels if k not in self.resident]

    def needs_restart(self, compiles):   # = Runtime.needs_restart
        return self.compiles + compiles > self.budget.usable

    def enter(self, phase):
        """Compile what the phase needs (the caller restarted first if needed); the update
        makes a static pipeline's weighted kernels stale."""
        needed = self.needed(phase)
        self.resident.update(needed)
        self.compiles += len(needed)
        if phase.kind == "update" and self.pipeline == "static":
            self.resident = {k for k in self.resident if "[" not in k}
        return needed


def step_fits(process, phases):
    """Whether the phases run in `process` without passing its budget (it is not changed)."""
    trial = Process(process.pipeline, process.budget)
    trial.resident, trial.compiles = set(process.resident), process.compiles
    for phase in phases:
        if trial.needs_restart(len(trial.needed(phase))):
            return False
        trial.enter(phase)
    return True


def place(pipeline, phases, budget, steps):
    """Walk `steps` steps of phases through processes: [(step, phase index, process number,
    kernels compiled)].  A step that fits a fresh process never straddles two: the process
    restarts before a step that would not fit what it has left (the state file is then the
    smallest); a bigger step restarts before the first phase whose kernels would pass the
    budget.  PlanError when a phase alone needs more than a fresh process gets."""
    process, number, events = Process(pipeline, budget), 1, []
    whole_steps = step_fits(Process(pipeline, budget), phases)
    for step in range(steps):
        if whole_steps and not step_fits(process, phases):
            process, number = Process(pipeline, budget), number + 1
        for i, phase in enumerate(phases):
            if process.needs_restart(len(process.needed(phase))):
                process, number = Process(pipeline, budget), number + 1
                if process.needs_restart(len(process.needed(phase))):
                    raise PlanError(
                        f"the compile budget, {budget}, is smaller than {phase} needs: "
                        f"{len(phase.kernels)} compiles"
                        + (f" (it recomputes layers {phase.recomputed[0]}..{phase.recomputed[-1]}"
                           f" first)" if phase.recomputed else "")
                        + ": raise the budget, or use a policy that recomputes less, or the "
                          "dynamic pipeline")
            events.append((step, i, number, len(process.enter(phase))))
    return events


def static_step_compiles(config, compiled=()):
    """The programs a static training step of config compiles (train.py's step: the model runs
    these kernels as the backend table's fused group and its wo matmul and attention, the
    classifier on the CPU, accel/ane/table.pyx) in a process that has compiled the kernels
    named in `compiled`: each weighted kernel of every layer, and the weight-free ones not
    compiled yet: the plan's compiles of a step that fits one process (recomputed layers rerun
    kernels compiled since the update: free)."""
    kernels = FORWARD + BACKWARD
    return (sum(weighted for _, weighted in kernels) * config.n_layers
            + len({kernel for kernel, weighted in kernels if not weighted} - set(compiled)))


def inner_sizes(config, T):
    """{the dimension's name: its size} of every sum a matmul of the eight kernels runs over
    (forward and dx): the private ANE path needs each a multiple of 32."""
    hs = config.dim // config.n_heads
    return {"C (dim)": config.dim, "H (hidden_dim)": config.hidden_dim,
            "QD (n_heads*hs)": config.n_heads * hs, "KVD (n_kv_heads*hs)": config.n_kv_heads * hs,
            "hs (head size)": hs, "T (sequence)": T}


@dataclass
class Plan:
    config: object
    pipeline: str
    budget: CompileBudget
    B: int
    T: int
    accum: int
    rplan: object
    phases: list
    events: list                 # place() of `steps_simulated` steps
    steps_simulated: int

    @property
    def policy(self):
        """The activation checkpoint policy (llmc/recompute.py), as the RecomputePlan has it."""
        return self.rplan.policy

    @property
    def restarts(self):
        """[(step, phase index)] where a process is replaced, in the simulated steps."""
        out, last = [], 1
        for step, i, number, _ in self.events:
            if number != last:
                out.append((step, i))
                last = number
        return out

    @property
    def compiles_per_step(self):
        """The compiles of the last simulated step (the steady state: the first step of a
        static pipeline is the same, a dynamic one compiles only in its first)."""
        return sum(n for step, _, _, n in self.events if step == self.steps_simulated - 1)

    @property
    def first_step_compiles(self):
        return sum(n for step, _, _, n in self.events if step == 0)

    @property
    def steps_per_process(self):
        """Whole steps a process runs before its restart (None: it never restarts), 0 when a
        step itself needs more than one process."""
        restarts = self.restarts
        if not restarts:
            return None
        step, i = restarts[0]
        return step if i == 0 else 0

    @property
    def processes_per_step(self):
        """For a step that spans processes: how many processes its phases run in (steady)."""
        last = self.steps_simulated - 1
        return len({number for step, _, number, _ in self.events if step == last})

    def groups(self, step=None):
        """[(process, [(pass, first layer, last layer, micro-batch)], compiles)] of one step
        (the last simulated: the steady state): the layer groups, what each process runs of
        it; processes numbered from 1 in the step, 1 being the previous step's last process
        when the step starts in it."""
        step = self.steps_simulated - 1 if step is None else step
        out = {}
        for s, i, number, n in self.events:
            if s != step:
                continue
            passes, compiles = out.setdefault(number, ([], 0))
            phase = self.phases[i]
            if phase.kind == "update":
                passes.append(("update", -1, -1, 0))
            elif passes and passes[-1][0] == phase.kind and passes[-1][3] == phase.micro:
                passes[-1] = (phase.kind, passes[-1][1], phase.layer, phase.micro)
            else:
                passes.append((phase.kind, phase.layer, phase.layer, phase.micro))
            out[number] = (passes, compiles + n)
        return [(k + 1, passes, compiles) for k, (passes, compiles) in enumerate(out.values())]

    def continues_process(self, step=None):
        """Whether the step starts in the process that ran the step before it."""
        step = self.steps_simulated - 1 if step is None else step
        first = next(number for s, _, number, _ in self.events if s == step)
        return step > 0 and any(s == step - 1 and number == first
                                for s, _, number, _ in self.events)

    def checkpointed_layers(self):
        """The layers whose outputs the forward keeps for the backward (every layer under all,
        each segment's last layer under every-N, boundary and sqrt, none under none): where
        the recomputes start.  Read off the RecomputePlan's layout: a segment's last layer
        writes an output past the segment's chain of slots-1 streams."""
        r = self.rplan
        if r.policy == "all":
            return list(range(r.num_layers))
        if r.policy == "none":
            return []
        return [l for l in range(r.num_layers) if r.output_of[l] >= r.slots - 1]


def make_plan(config, pipeline, budget, rplan, B=1, T=None, accum=1, steps=None):
    """The plan of training the model of `config` (its sizes, as the module says) on the ANE
    under the recompute plan rplan (llmc/recompute.py's RecomputePlan of its layers);
    PlanError (one line) for what cannot be planned."""
    if pipeline not in PIPELINES:
        raise PlanError(f"ANE plan: unknown pipeline {pipeline!r}: one of {', '.join(PIPELINES)}")
    try:
        budget = budget if isinstance(budget, CompileBudget) else CompileBudget.for_limit(
            ANE_LIMIT if budget is None else budget)
    except ValueError as e:
        raise PlanError(f"ANE plan: {e}") from None
    T = config.max_seq_len if T is None else T
    for name, value in (("B", B), ("T", T), ("accum", accum)):
        if value < 1:
            raise PlanError(f"ANE plan: {name} must be at least 1, got {value}")
    if rplan.num_layers != config.n_layers:
        raise PlanError(f"ANE plan: a recompute plan of {rplan.num_layers} layers for a model "
                        f"of {config.n_layers}")
    if T > config.max_seq_len:
        raise PlanError(f"ANE plan: T={T} exceeds the model's max sequence length "
                        f"{config.max_seq_len}")
    phases = step_phases(pipeline, rplan, accum)
    if steps is None:   # enough to see the first restart and the steady state after it: a
        # static step compiles at least 6 kernels (one layer's), a dynamic one is steady by its 2nd
        steps = budget.usable // 6 + 2 if pipeline == "static" else 2
    events = place(pipeline, phases, budget, steps)
    return Plan(config, pipeline, budget, B, T, accum, rplan, phases, events, steps)


# ----------------------------------------------------------------------------
# memory, from the run's, and the dry run's text

def memory(plan, whole):
    """Bytes: the whole model's buffers on the CPU (whole: the run's, llmc/dry_run.py's
    memory_plan under the plan's policy), one layer's parameters, the fp16 weights each
    process's kernels hold, and the state file a restart writes (between steps; inside a step
    also the gradients and the kept activations)."""
    config = plan.config
    layer_params = FLOAT * (replace(config, n_layers=2).num_parameters() -
                        replace(config, n_layers=1).num_parameters())   # fp32 bytes
    layer_weights = sum(shape[1] * shape[2] for name, shape in config.param_shapes()
                        if len(shape) == 3)   # (L, rows, cols): one layer's matrices, not norms
    state_between = whole["params"] + whole["adamw"]
    return dict(whole=whole, layer_params=layer_params, layer_matrix_elements=layer_weights,
                state_between_steps=state_between,
                state_inside_step=state_between + whole["grads"] + whole["activations"])


def _layers(first, last):
    if first == last:
        return f"layer {first}"
    return f"layers {first}..{last}" if first < last else f"layers {first}..{last} (down)"


def format_pipeline_plan(plan, whole, name=""):
    """The dry run's text of the ANE pipeline: the budget, the kernels, the compiles per step,
    the layer groups (what each process runs of a step), the restarts, memory (whole: the
    run's, as memory() takes it) and the private path's shapes."""
    c, r = plan.config, plan.rplan
    mem = memory(plan, whole)
    steady = plan.compiles_per_step
    lines = [
        f"ANE plan: {name} ({c.describe()}), B={plan.B} T={plan.T}, {plan.pipeline} pipeline, "
        f"recompute {plan.policy}" + (f", {plan.accum} micro-batches per update"
                                      if plan.accum > 1 else ""),
        f"compile budget: {plan.budget}",
        "kernels per layer (* the layer's weights in it):",
        "  forward   " + "  ".join(k + ("*" if w else "") for k, w in FORWARD),
        "  backward  " + "  ".join(k + ("*" if w else "") for k, w in BACKWARD),
    ]
    lines.append("  train.py's step runs them: the backend table's fused group (qkv_*, ffn_*), wo's "
                 "matmul and attention; the classifier's matmul on the CPU")
    if plan.pipeline == "static":
        lines.append(f"  static: each * kernel compiled per layer after every update "
                     f"({6 * c.n_layers} per pass of the model), the 2 attention kernels once "
                     f"per process")
    else:
        lines.append("  dynamic: 8 kernels compiled once per process, the weights sent as "
                     "inputs every call")
    lines.append(f"checkpoints: {r.policy}: {len(plan.checkpointed_layers())} of {r.num_layers} "
                 f"layer outputs kept, {r.recomputed} layer forwards recomputed per backward "
                 f"(they rerun forward kernels)")
    lines.append(f"compiles per step: {steady} (first step {plan.first_step_compiles}), about "
                 f"{steady * SECONDS_PER_COMPILE:,.1f} s of compiling at "
                 f"{SECONDS_PER_COMPILE * 1e3:.0f} ms each (the anchor's M-series figure)")
    lines.append("schedule of a step: forward -> backward -> update, by process (layer groups):")
    for number, passes, compiles in plan.groups():
        what = ", ".join("update (CPU AdamW)" if kind == "update" else
                         f"{kind} {_layers(a, b)}" + (f" [micro-batch {m}]" if plan.accum > 1
                                                      else "")
                         for kind, a, b, m in passes)
        layers = {l for kind, a, b, _ in passes if kind != "update"
                  for l in range(min(a, b), max(a, b) + 1)}
        weights = HALF * mem["layer_matrix_elements"] * len(layers) * (
            2 if plan.pipeline == "static" else 0)
        extra = (f"; {format_bytes(4 * mem['layer_params'] * len(layers))} of its layers' fp32 "
                 f"parameters, gradients, AdamW m, v" if layers else "")
        extra += f", {format_bytes(weights)} fp16 weights baked in" if weights else ""
        carried = " (the previous step's last process)" if (
            number == 1 and plan.restarts and plan.continues_process()) else ""
        lines.append(f"  process {number}{carried}: {compiles:3d} compiles: {what}{extra}")
    spp = plan.steps_per_process
    if spp is None:
        lines.append("restarts: none: every kernel is compiled once, the process runs any "
                     "number of steps")
    elif spp == 0:
        lines.append(f"restarts: a step spans {plan.processes_per_step} processes: exec() "
                     f"restarts inside it (at the group boundaries above), the state file then "
                     f"holds the gradients and kept activations too")
    else:
        lines.append(f"restarts: exec() every {spp} step{'s' if spp > 1 else ''} (the next "
                     f"step's compiles would pass the budget)")
    w = mem["whole"]
    lines += [
        "memory on the CPU (float32, llmc/dry_run.py):",
        f"  parameters {format_bytes(w['params'])}, gradients {format_bytes(w['grads'])}, "
        f"AdamW m + v {format_bytes(w['adamw'])}, activations {format_bytes(w['activations'])} "
        f"(recompute {plan.policy}), activation gradients {format_bytes(w['activation_grads'])}",
        f"  one layer's parameters {format_bytes(mem['layer_params'])}; its fp16 copy for the ANE "
        f"{format_bytes(HALF * mem['layer_matrix_elements'])} (static: in each of 2 kernels)",
        f"state file of a restart: {format_bytes(mem['state_between_steps'])} between steps "
        f"(weights, AdamW m and v, step, data position, RNG), "
        f"{format_bytes(mem['state_inside_step'])} inside one",
    ]
    bad = {k: v for k, v in inner_sizes(c, plan.T).items() if v % ANE_INNER_MULTIPLE}
    if bad:
        pads = ", ".join(f"{k}={v} -> {-(-v // ANE_INNER_MULTIPLE) * ANE_INNER_MULTIPLE}"
                         for k, v in bad.items())
        lines.append(f"private ANE path: matmul sums over sizes not a multiple of "
                     f"{ANE_INNER_MULTIPLE}: {pads} (zero-padded, or the runtime refuses "
                     f"them; Core ML is not affected)")
    else:
        lines.append(f"private ANE path: every matmul sums over a multiple of "
                     f"{ANE_INNER_MULTIPLE}")
    return "\n".join(lines)
