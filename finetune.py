"""
Fine-tune a pretrained model on your own examples: LoRA or full, on chat, completions or text.

    python finetune.py -e MODEL -i train.jsonl [-j valid.jsonl] -o DIR [--mask-prompt]
    python finetune.py -e MODEL -i train.jsonl --method full -o DIR        # every parameter

MODEL is any model train.py takes (a Hugging Face folder, a .safetensors file, llm.c's,
llama2.c's or a GGUF file); its tokenizer is the one generate.py finds (the folder's own
tokenizer.json and chat template, or --tokenizer).  The data are JSONL in MLX-LM's forms
(text, chat, completions, tools: llmc/sft_data.py), chats rendered through the model's chat
template, one example a row padded to T (a micro-batch cut after its last scored target);
--mask-prompt scores only the completion or the assistant's turns (llm.c's targets of -1
elsewhere).

--method lora (the default; llmc/adapter.py): the model's parameters stay frozen (no gradient
computed, no AdamW state), and rank-r updates train beside the linear layers --targets names
(default all: q, k, v, o, gate, up, down) of the last --layers layers (default all); they are
saved in PEFT's layout, DIR/adapter (the last checkpoint's files, linked), which
peft.PeftModel.from_pretrained loads on transformers' model and generate.py --adapter reads.
--adapter DIR starts from an existing adapter instead.  --dropout P drops a fraction P of each
update's input in the training steps (PEFT's lora_dropout; never in the validation loss).
--method full trains every parameter at --precision, as train.py does, and saves the model; at
bf16 --grad-precision bf16 keeps its gradients in bf16 and -w 0 keeps no float32 master weights
(train.py's flags: 6 bytes a parameter less together, what lets a 1B model fine-tune fully in
about 11 GiB of weights, gradients and AdamW state instead of 17).

A step is -d examples (default: -b on each process), a batch of examples alike in length
(llmc/sft_data.py) run -b at a time: micro-batches, each a forward and a backward that adds into
the gradient, then one update (MLX-LM's --grad-accumulation-steps N says -d N*B).  A
micro-batch's loss is the sum over its scored targets divided by the step's count of them, so
that the accumulated gradient is that of the mean over every scored target of the step however
the micro-batches cut it, as transformers' Trainer counts num_items_in_batch (a mean of the
micro-batches' means would weigh a target of a short answer more than one of a long answer):
-b 2 -d 8 trains as -b 8 does, in a quarter of the activations' memory.

On many processes (llmc/distributed.py, MPI), as train.py:
    OMP_NUM_THREADS=1 mpirun -np 2 python finetune.py -e MODEL -i train.jsonl -b 2 -d 8 -o DIR
each runs its micro-batches of every step (the k-th of each a neighbour in length of the
others'), the gradients of what trains (LoRA's updates alone: the frozen model has none) are
summed across the processes before the norm and the update, -d counts the examples of all of
them (micro-batches a step on each: d / (B * processes)), the val loss is shared among them, and
only rank 0 prints, logs and writes checkpoints.  A run resumes on another number of processes
with the same -d and -b: the same examples a step.

The loop is train.py's (llmc/loop.py): evaluations and checkpoints at the same steps, the
same step lines (tok/s counting the scored targets), a resumed run taking again nothing its
checkpoint had taken.  DIR keeps the run as train.py's does: main.log, log.jsonl
(llmc/report.py's records, which python dev/dashboard.py DIR follows: a "run" head with the
trained and frozen parameters and the data's masked share, each step's ms and scored tokens/s,
a "report" at the end with the mean step, the masked share of the batches' targets and memory
by kind), finetune.json (its settings), checkpoints every -n steps and at the end (step_%08d/:
the adapter or the model, and state.npz: AdamW's m and v, the data's position; DONE last; -nk
N keeps the newest N), resumed bit for bit by -y 1.
AdamW as PyTorch's defaults (betas 0.9, 0.999; eps 1e-8), the gradient clipped to norm 1, the
learning rate constant after -u warmup steps unless -q sets a cosine decay's final fraction.
"""
import argparse
import io
import json
import os
import shutil
import sys

import numpy as np

from accel.backend import BackendError
from llmc import adapter, distributed
from llmc.checkpoint import model_tokenizer, rotated_out
from llmc.families import FamilyError, family_of_file
from llmc.formats import FormatError
from llmc.formats.common import atomic_write
from llmc.logger import Console, Logger, plot_losses
from llmc.loop import Loop, Step
from llmc.report import LOG_NAME
from llmc.schedulers import get_scheduler
from llmc.sft_data import SFTDataError, SFTDataset
from llmc.tokenizer import TokenizerError, load_tokenizer

BETAS, EPS = (0.9, 0.999), 1e-8   # PyTorch's AdamW, as transformers' Trainer
SETTINGS = "finetune.json"
MODEL_FILE = "model.bin"   # full fine-tuning's model, in a checkpoint and in DIR
TRIM = 32   # a batch's length is cut to a multiple of this (trimmed), so few lengths recur
# the settings that shape a run: a resume must not change them (the rest it may)
SHAPING = ("model", "train_data", "method", "rank", "alpha", "dropout", "targets", "layers",
           "adapter", "mask_prompt", "B", "total_batch_size", "T", "lr", "warmup",
           "final_lr_frac", "weight_decay", "seed", "precision", "grad_precision",
           "master_weights", "max_steps")
# what a run's settings written before a setting existed held: that setting's value then
SHAPING_BEFORE = {"grad_precision": "fp32", "master_weights": 1}


class FinetuneError(Exception):
    """Bad input, said in one line (exit status 1)."""


def parse_args(argv):
    p = argparse.ArgumentParser(prog="finetune.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-e", "--model", required=True, metavar="MODEL",
                   help="the pretrained model: a Hugging Face folder or any file train.py takes")
    p.add_argument("-i", dest="train_data", required=True, metavar="FILE",
                   help="training examples, JSONL (text, chat, completions or tools)")
    p.add_argument("-j", dest="val_data", metavar="FILE", default=None,
                   help="validation examples, JSONL: their masked loss every -v steps")
    p.add_argument("-o", dest="output_dir", metavar="DIR", default=None,
                   help="where the run is kept: the adapter (or model), checkpoints, main.log")
    p.add_argument("--tokenizer", metavar="PATH", default=None,
                   help="the model's tokenizer, where it is not beside the model")
    p.add_argument("--method", choices=("lora", "full"), default="lora")
    p.add_argument("--rank", type=int, default=8, help="LoRA's rank r")
    p.add_argument("--alpha", type=float, default=16.0, help="LoRA's alpha: updates scale by "
                   "alpha / r")
    p.add_argument("--dropout", type=float, default=0.0, help="LoRA's dropout: the fraction of "
                   "each update's input dropped at training (PEFT's lora_dropout; an "
                   "--adapter's own is replaced by it)")
    p.add_argument("--targets", default="all", help="LoRA's linear layers, comma-separated "
                   "(q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj), or all")
    p.add_argument("--layers", type=int, default=None, help="LoRA in the last N layers "
                   "(default: every layer)")
    p.add_argument("--adapter", metavar="DIR", default=None,
                   help="start from this LoRA adapter (PEFT's layout) instead of a new one")
    p.add_argument("--mask-prompt", action="store_true",
                   help="score only the completion, or the assistant's turns")
    p.add_argument("-b", dest="B", type=int, default=4,
                   help="examples a micro-batch (one forward and backward, on each process)")
    steps = p.add_mutually_exclusive_group()
    steps.add_argument("-d", dest="total_batch_size", type=int, default=None, metavar="N",
                       help="examples a step, of every process: micro-batches of -b, their "
                       "gradients accumulated (default: one micro-batch on each process)")
    steps.add_argument("--grad-accumulation-steps", type=int, default=None, metavar="N",
                       help="MLX-LM's way to say -d: N micro-batches a step on each process")
    p.add_argument("-t", dest="T", type=int, default=512,
                   help="the longest example, in tokens (longer ones are cut, and counted)")
    p.add_argument("-l", dest="lr", type=float, default=1e-4, help="learning rate")
    p.add_argument("-u", dest="warmup", type=int, default=0, help="warmup steps")
    p.add_argument("-q", dest="final_lr_frac", type=float, default=1.0,
                   help="the learning rate's final fraction (1: constant, else cosine decay)")
    p.add_argument("-c", dest="weight_decay", type=float, default=0.0, help="AdamW's decay")
    p.add_argument("-x", dest="max_steps", type=int, default=100, help="steps")
    p.add_argument("-v", dest="val_every", type=int, default=20, help="val loss every N steps")
    p.add_argument("-n", dest="checkpoint_every", type=int, default=0,
                   help="a checkpoint every N steps (0: at the end only)")
    p.add_argument("-nk", dest="checkpoints_keep", type=int, default=0,
                   help="keep only the newest this many checkpoints (0: all; train.py's)")
    p.add_argument("-y", dest="resume", type=int, default=0, choices=(0, 1),
                   help="resume the run in -o DIR from its newest checkpoint")
    p.add_argument("-r", dest="seed", type=int, default=0,
                   help="LoRA's init, its dropout's masks and the data order")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--grad-precision", choices=("fp32", "bf16"), default="fp32",
                   help="--method full at --precision bf16: bf16 parameter gradients (train.py's)")
    p.add_argument("-w", dest="master_weights", type=int, default=1, choices=(0, 1),
                   help="--method full at --precision bf16: 0 keeps no float32 master weights "
                        "(train.py's)")
    p.add_argument("--recompute", default="all", metavar="POLICY",
                   help="activation checkpointing, as train.py's")
    p.add_argument("--backend", default="cpu")
    args = p.parse_args(argv)
    for flag, value, low in (("-b", args.B, 1), ("-t", args.T, 1), ("-x", args.max_steps, 1),
                             ("--rank", args.rank, 1), ("-v", args.val_every, 1),
                             ("-d", args.total_batch_size, 1), ("-nk", args.checkpoints_keep, 0),
                             ("--grad-accumulation-steps", args.grad_accumulation_steps, 1)):
        if value is not None and value < low:
            p.error(f"{flag} {value}: must be at least {low}")
    if not 0 <= args.dropout < 1:
        p.error(f"--dropout {args.dropout:g}: must be at least 0 and below 1")
    if args.dropout and args.method == "full":
        p.error("--dropout is LoRA's (its updates' input): --method full has none")
    for flag, changed in (("--grad-precision bf16", args.grad_precision != "fp32"),
                          ("-w 0", not args.master_weights)):
        if changed and (args.method != "full" or args.precision != "bf16"):
            p.error(f"{flag} is full fine-tuning's at --precision bf16 (LoRA's updates keep "
                    f"float32 gradients, its base no master weights)")
    if args.resume and args.output_dir is None:
        p.error("-y 1 resumes the run in -o DIR: give -o")
    return args


def micro_batches_per_step(args, num_processes):
    """How many micro-batches each process runs a step; sets args.total_batch_size, the
    examples a step, from -d or --grad-accumulation-steps."""
    per_round = args.B * num_processes   # a micro-batch on every process
    if args.grad_accumulation_steps is not None:
        args.total_batch_size = args.grad_accumulation_steps * per_round
    elif args.total_batch_size is None:
        args.total_batch_size = per_round
    if args.total_batch_size % per_round:
        raise FinetuneError(f"-d {args.total_batch_size}: must be a multiple of -b {args.B} "
                            f"times {num_processes} process(es), {per_round}")
    return args.total_batch_size // per_round


def settings_of(args):
    return {key: getattr(args, key) for key in SHAPING}


def start_or_resume(args, dist):
    """The step to resume from (None: a new run), DIR's settings checked, or written by rank 0
    once every process has looked."""
    out = args.output_dir
    if out is None:
        return None
    path = os.path.join(out, SETTINGS)
    if args.resume:
        if not os.path.exists(path):
            raise FinetuneError(f"-y 1: {out} holds no fine-tuning run ({SETTINGS})")
        with open(path) as f:
            saved = json.load(f)
        saved = {**SHAPING_BEFORE, **saved}
        differ = [f"{key} {getattr(args, key)!r} (the run's: {saved.get(key)!r})"
                  for key in SHAPING if saved.get(key) != getattr(args, key)]
        if differ:
            raise FinetuneError(f"-y 1: {out} holds a run with other settings: "
                                f"{'; '.join(differ)}")
        return newest_step(out)
    if os.path.exists(path):
        raise FinetuneError(f"{out} holds a fine-tuning run already: -y 1 resumes it, or give "
                            f"another -o")
    dist.barrier()
    if dist.process_rank == 0:
        os.makedirs(out, exist_ok=True)
        atomic_write(path, [(json.dumps(settings_of(args), indent=1) + "\n").encode()])
    return None


def step_dir(out, step):
    return os.path.join(out, f"step_{step:08d}")


def complete_steps(out):
    """The steps of DIR's complete checkpoints (a DONE written last), sorted."""
    return sorted(int(name[5:]) for name in os.listdir(out) if name.startswith("step_")
                  and os.path.exists(os.path.join(out, name, "DONE")))


def newest_step(out):
    return max(complete_steps(out), default=None)


def save_checkpoint(out, step, model, batches, base_model, keep=0):
    """step_%08d/: the adapter (LoRA) or the model (full), state.npz, then DONE; keep > 0 then
    deletes the older checkpoints but the newest keep - 1."""
    folder = step_dir(out, step)
    os.makedirs(folder, exist_ok=True)
    if model.frozen:
        adapter.write_adapter(folder, model, base_model=base_model)
    else:
        model.save(os.path.join(folder, MODEL_FILE))
    state = dict(m=np.asarray(model.m), v=np.asarray(model.v), step=step,
                 **{f"batches_{k}": v for k, v in batches.state_dict().items()})
    if model.master_weights:
        state["master"] = np.asarray(model.params)
    npz = io.BytesIO()
    np.savez(npz, **state)
    atomic_write(os.path.join(folder, "state.npz"), [npz.getbuffer()])
    atomic_write(os.path.join(folder, "DONE"), [b""])
    if keep > 0:   # train.py's -nk
        for old in rotated_out(complete_steps(out), step, keep):
            os.remove(os.path.join(step_dir(out, old), "DONE"))   # incomplete first
            shutil.rmtree(step_dir(out, old))


def link_final(out, step, model):
    """DIR/adapter (its two files) or DIR/model.bin: the last checkpoint's, hard-linked (one
    copy on disk, written once); returns its path."""
    folder = step_dir(out, step)
    names = [adapter.ADAPTER_CONFIG, adapter.ADAPTER_WEIGHTS] if model.frozen else [MODEL_FILE]
    final = os.path.join(out, "adapter") if model.frozen else os.path.join(out, MODEL_FILE)
    os.makedirs(final if model.frozen else out, exist_ok=True)
    for name in names:
        target = os.path.join(final, name) if model.frozen else final
        if os.path.exists(target):
            os.remove(target)
        os.link(os.path.join(folder, name), target)
    return final


def resume(out, step, model, batches):
    folder = step_dir(out, step)
    with np.load(os.path.join(folder, "state.npz")) as state:
        if "master" in state:
            model.params = state["master"]
        model.m, model.v = state["m"], state["v"]
        batches.load_state_dict({"epoch": int(state["batches_epoch"]),
                                 "index": int(state["batches_index"])})
    model.step = step


def load_model(args, source):
    """The model at source, with LoRA attached (--method lora) from --adapter or new."""
    family, _ = family_of_file(source)
    model = family.model_class.from_checkpoint(source, backend=args.backend,
                                               recompute=args.recompute,
                                               precision=args.precision,
                                               trainable=args.method == "full",
                                               grad_precision=args.grad_precision,
                                               master_weights=bool(args.master_weights))
    if args.method == "full":
        return model
    if args.adapter is not None:
        adapter.read_adapter(args.adapter, model, dropout=args.dropout, seed=args.seed)
        return model
    targets = "all" if args.targets == "all" else args.targets.split(",")
    layers = None if args.layers is None else range(max(model.num_layers - args.layers, 0),
                                                    model.num_layers)
    try:
        adapter.attach(model, args.rank, args.alpha, targets, layers, seed=args.seed,
                       dropout=args.dropout)
    except ValueError as e:
        raise FinetuneError(str(e)) from None
    return model


def trimmed(inputs, targets):
    """The batch without its columns past the last scored target (to a multiple of TRIM): a
    position there changes no loss nor gradient (attention looks back only), and a batch of
    short examples costs what they do, not what -t does."""
    scored = np.flatnonzero((targets >= 0).any(axis=0))
    n = min(inputs.shape[1], -(-(scored[-1] + 1 if scored.size else 1) // TRIM) * TRIM)
    return inputs[:, :n], targets[:, :n]


def micro_batches(batch, B, grad_accum, dist):
    """This process's micro-batches of a step's batch, trimmed: the k-th is the batch's rows
    block k * processes + rank, of B rows each.  The batch's examples are sorted by length, so
    the processes' k-th micro-batches are alike in length, and none waits long for another."""
    inputs, targets = batch
    for k in range(grad_accum):
        rows = slice((k * dist.num_processes + dist.process_rank) * B,
                     (k * dist.num_processes + dist.process_rank + 1) * B)
        yield trimmed(inputs[rows], targets[rows])


def mean_loss(model, data, B, dist):
    """The mean loss over every scored target of data (each example once), its batches shared
    among the processes."""
    total, count = 0.0, 0
    for i, batch in enumerate(data.eval_batches(B)):
        if i % dist.num_processes != dist.process_rank:
            continue
        inputs, targets = trimmed(*batch)
        scored = int(np.count_nonzero(targets >= 0))
        if scored:
            total += model.forward(inputs, targets) * scored
            count += scored
    return dist.sum(total) / max(dist.sum(count), 1)


def main(argv=None):
    args = parse_args(argv)
    try:
        fine_tune(args)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(interrupted_line(args)) from None


def interrupted_line(args):
    """What Ctrl-C leaves: how to go on from the newest checkpoint, if there is one."""
    out = args.output_dir
    step = None if out is None or not os.path.isdir(out) else newest_step(out)
    if step is not None:
        return f"step {step} is saved in {out}: the same command with -y 1 resumes it"
    if out is not None:
        return f"no checkpoint in {out} yet (-n N writes one every N steps)"
    return "nothing saved (-o DIR keeps the run, -n N a checkpoint every N steps)"


def fine_tune(args):
    dist = distributed.init()   # one process: SINGLE, its collectives no-ops
    grad_accum = micro_batches_per_step(args, dist.num_processes)
    console = Console(sys.stdout)   # the stdout of now (a test redirects it)
    resume_step = start_or_resume(args, dist)
    source = args.model
    if resume_step is not None:   # the checkpoint's adapter, or its model
        if args.method == "lora":
            args.adapter = step_dir(args.output_dir, resume_step)
        else:
            source = os.path.join(step_dir(args.output_dir, resume_step), MODEL_FILE)
    model = load_model(args, source)
    if model.frozen and dist.num_processes > 1:   # LoRA: each process its own dropout masks
        model.lora_seed = args.seed + (dist.process_rank << 16)
    dist.set_zero_stage(0, model)   # the collectives' path for its backend
    path, why = (args.tokenizer, "--tokenizer") if args.tokenizer else model_tokenizer(args.model)
    tokenizer = load_tokenizer(path)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise FinetuneError(f"the tokenizer ({tokenizer.source}) has {tokenizer.vocab_size} "
                            f"tokens, the model {model.config.vocab_size}: give its own "
                            f"(--tokenizer)")
    T = min(args.T, model.config.max_seq_len)
    train_data = SFTDataset(args.train_data, tokenizer, T, mask_prompt=args.mask_prompt)
    val_data = (None if args.val_data is None else
                SFTDataset(args.val_data, tokenizer, T, mask_prompt=args.mask_prompt))
    batches = train_data.batches(args.total_batch_size, seed=args.seed)   # a step's each
    trained = model.num_trained
    console.table([
        ("model", f"{args.model} ({model.FAMILY}, {model.num_parameters:,} parameters)"),
        ("tokenizer", f"{path} ({why})"),
        ("method", "full" if args.method == "full" else
         f"LoRA r={model.lora.rank} alpha={model.lora.alpha:g} "
         f"dropout={model.lora.dropout:g} on "
         f"{', '.join(adapter.short_name(t) for t in model.lora.targets)} of "
         f"{len(model.lora.layers)} layers"),
        ("trained parameters", f"{trained:,} ({100 * trained / model.num_parameters:.3f}%)"),
        ("frozen parameters", f"{model.num_parameters - trained:,}" if model.frozen else "0"),
        ("train data", train_data.describe()),
        ("val data", val_data.describe() if val_data else "none"),
        ("batch", f"B={args.B} T={T}, one example a row"),
        ("examples a step", f"{args.total_batch_size}: {grad_accum} micro-batch(es) of B on "
         f"each of {dist.num_processes} process(es)"),
        *([("all-reduce", f"{trained:,} gradients a step, {dist.path(model.backend)}")]
          if dist.num_processes > 1 else []),
        ("precision", model.precision), ("backend", model.backend.name),
    ])
    step = 0
    if resume_step is not None:
        resume(args.output_dir, resume_step, model, batches)
        step = resume_step
        console.print(f"resuming from the checkpoint at step {step} in {args.output_dir}")
    writes = args.output_dir is not None and dist.process_rank == 0
    logger = Logger(args.output_dir if writes else None, resume_step=resume_step,
                    json_path=os.path.join(args.output_dir, LOG_NAME) if writes else None)
    frozen = model.num_parameters - trained if model.frozen else 0
    logger.log_json("run", max_steps=args.max_steps, B=args.B, T=T, family=model.FAMILY,
                    init=f"{args.method} fine-tuning of {args.model}", method=args.method,
                    backend=model.backend.name, precision=model.precision,
                    recompute=model.recompute, num_parameters=model.num_parameters,
                    trained_parameters=trained, frozen_parameters=frozen,
                    examples_per_step=args.total_batch_size, num_processes=dist.num_processes,
                    train_data=args.train_data, masked_share=train_data.summary()["masked_share"],
                    output_dir=args.output_dir)
    scheduler = get_scheduler("cosine", args.lr, args.warmup, args.max_steps, args.final_lr_frac)

    def next_step():   # the step's examples, of every process, and this process's micro-batches
        batch = next(batches)
        return Step(micro_batches(batch, args.B, grad_accum, dist),
                    int(np.count_nonzero(batch[1] >= 0)))

    def save(step):
        if writes and step > 0:
            save_checkpoint(args.output_dir, step, model, batches, os.path.abspath(args.model),
                            args.checkpoints_keep)

    loop = Loop(model, dist, console, logger, args.max_steps, next_step, scheduler, BETAS, EPS,
                args.weight_decay, decay_2d_only=False, val_every=args.val_every,
                val_loss=None if val_data is None else
                (lambda: mean_loss(model, val_data, args.B, dist)),
                checkpoint_every=args.checkpoint_every, save=save)
    loop.run(step, resuming=resume_step is not None)
    for line in loop.summary_lines():
        console.print(line)
    masked_share = 1 - loop.scored_positions / max(loop.positions, 1)
    if loop.positions:
        console.print(f"{100 * masked_share:.1f}% of the batches' targets masked or padding")
    memory = model.memory()
    console.print("memory: " + ", ".join(f"{k} {v / 2 ** 20:.1f} MiB" for k, v in memory.items()
                                         if v))
    if loop.timed_steps:
        logger.log_json("report", mean_ms=loop.timed_s / loop.timed_steps * 1000,
                        tokens_per_s=loop.timed_scored / loop.timed_s, masked_share=masked_share,
                        trained_parameters=trained, frozen_parameters=frozen, memory=memory)
    if writes:
        final = link_final(args.output_dir, args.max_steps, model)
        plot_losses(args.output_dir, f"{args.method} fine-tuning of {args.model}")
        console.print(f"{final} holds the fine-tuned {'adapter' if model.frozen else 'model'}: "
                      f"python generate.py {args.model} --adapter {final} --chat talks to it"
                      if model.frozen else
                      f"{final} holds the fine-tuned model: python generate.py {final}")


def fail(message):
    """The one-line error, exit status 1: sys.exit's for one process; with many, every process
    ended (llmc/distributed.py's fail: none left waiting in a collective)."""
    if distributed.launched_size() == 1:
        sys.exit(message)
    distributed.fail(message, 1)


def run(argv=None):
    try:
        main(argv)
    except KeyboardInterrupt as e:
        distributed.fail(f"\nfinetune.py: interrupted{': ' if str(e) else ''}{e}", 130)
    except (FinetuneError, SFTDataError, FormatError, FamilyError, TokenizerError,
            BackendError, distributed.DistributedError) as e:
        fail(f"finetune.py: error: {e}")
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        fail(f"finetune.py: error: {where}{e.strerror or e}")
    except BaseException as e:   # a bug on one process must not leave the others waiting
        distributed.abort_on_exception(e)
        raise


if __name__ == "__main__":
    run()
