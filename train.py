"""
Trains GPT-2 (or Llama 2) on the CPU: the training run of llm.pyx, as llm.c's train_gpt2.cu
main() does it.

    make train_gpt2 && python train.py

With no arguments this is llm.c's CPU quickstart: tinyshakespeare (prepared on first use, also
offline), GPT-2 124M from gpt2_124M.bin (or a random GPT-2 d12 when that file is missing),
B=4, T=64, 40 steps of AdamW at lr 1e-4, the val loss every 10 steps over 5 batches and a
64-token sample every 20 steps. The flags are train_gpt2.cu's (python train.py --help).

Each step: grad_accum = total_batch_size / (B*T) micro-batches, each a forward and a backward
that adds its gradient into the same buffer; then the global gradient norm, clipped to 1.0,
and one AdamW update with a learning rate that warms up linearly and decays along a cosine.
With -o DIR: DIR/main.log in llm.c's format, checkpoints every -n steps and at the end
(llmc/checkpoint.py; -nk N keeps the newest N), and the loss curve DIR/loss.png. -y 1 resumes
from the newest checkpoint there, continuing bit for bit as if never stopped. DIR holds one
run: its settings in DIR/run.json, which -y 1 takes (no flag typed again: a flag given again
may change how far and how often, but not what shapes the run); a new run into a DIR that
holds another one is refused unless --overwrite deletes that run's files.

On many processes (llmc/distributed.py, MPI): `OMP_NUM_THREADS=1 mpirun -np N python train.py`.
Each process reads its own part of every batch, the gradients are summed across processes
before the norm and the update, -d counts the tokens of all of them (grad_accum = d / (B*T*N))
and -z 1 shards AdamW's state (ZeRO-1). Only rank 0 prints, logs and samples; the val loss is
split across the processes and averaged, as llm.c's.

Llama 2 (train_llama2.pyx) trains the same way, with the same flags: --model stories15M (any
Llama preset: stories15M, stories42M, stories110M, llama-1b, llama-7b), or --family llama with
-e dN (a tiny Llama of depth N) or a Llama model file. A new random model's vocabulary is the
data's tokenizer's (--vocab-size overrides it). --lr-schedule cosine-restarts is llama.cpp's
cosine decay with warm restarts.

-h 1 scores HellaSwag at every val loss (llmc/evalloader.py, llm.c's eval file from
dev/data/hellaswag.py; -hm examples of it), and -sl / -sg skip the update of a step whose loss or
gradient norm is an outlier (its z-score against the latest steps, llmc/outlier_detector.py),
as llm.c's train_gpt2.cu.

--precision bf16 is llm.c's mixed precision (its default there; fp32 here): bf16 parameters and
activations in the kernels, float32 gradients, AdamW m and v and master weights (llmc/model.pyx);
a GPT-2 checkpoint is then llm.c's bf16 model file (version 5), a Llama one stays llama2.c's
float32 file (the master weights), and the state holds the master weights.  --precision fp16 is
the GPUs' half precision (Metal's; the CPU's fp16 table is check:'s oracle, slower than fp32):
the same with fp16 instead of bf16, float32 model files, and dynamic loss scaling (a step whose
gradients overflow is skipped and halves the scale; the state keeps the scale).  At bf16,
--grad-precision bf16 keeps the gradients in bf16 and -w 0 keeps no master weights (the state
then holds m and v alone), as llm.c can: 2 and 4 bytes a parameter less.

--json-log writes each step's cost as a JSON line (ms, tokens/s, TFLOPS against the peak,
compile time, kernel groups with --profile) and ends with an efficiency report
(llmc/report.py; with --profile, the time per backend table entry); dev/dashboard.py follows
it live. --compact-vocab gives a new model only the token ids of the training data
(llmc/vocab.py; it changes the objective).

The pieces live in llmc/, as llm.c's: dataloader, tokenizer, sampler, schedulers, logger,
checkpoint, default_data, report, vocab, and the training loop (loop.py, finetune.py's too);
the file formats in llmc/formats/; the models in train_gpt2.pyx and train_llama2.pyx, each found
by its name (llmc/families.py).
"""
import argparse
import dataclasses
import difflib
import functools
import glob
import math
import os
import re
import sys

from accel.hooks import backend_hooks, every_backend_hooks, with_wrapper
from accel.spec import GRAD_PRECISIONS, PRECISIONS
from llmc import default_data, distributed, evalloader
from llmc.checkpoint import (RUN_NAME, checkpoint_files, checkpoint_paths, complete_steps,
                             find_max_step, outliers_path, read_outliers, read_run_config,
                             restart, restarts, resume, run_differences, write_checkpoint,
                             write_run_config)
from llmc.cli import Parser
from llmc.dataloader import DataError, DataLoader, shard_files
from llmc.families import (DEFAULT_FAMILY, FamilyError, family_names, family_of_file,
                           get_family, preset_family)
from llmc.formats import FormatError, describe_model_file
from llmc.formats.hf_tokenizer import is_hf_tokenizer
from llmc.formats.llama2c import read_llama2c_tokenizer
from llmc.formats.llmc import GPT2_EOT_TOKEN, read_evalfile
from llmc.logger import Console, Logger, note, plot_losses
from llmc.loop import Loop, Step
from llmc.outlier_detector import WINDOW, OutlierDetector
from llmc.recompute import RecomputePlan, parse_policy
from llmc.report import LOG_NAME, Efficiency, profile_lines
from llmc.sampler import generate
from llmc.schedulers import SCHEDULERS, get_scheduler
from llmc.tokenizer import (DEFAULT_TOKENIZER, GPT2_VOCAB_SIZE, Tokenizer, TokenizerError,
                            data_tokenizer, load_sample_tokenizer, load_tokenizer)
from llmc.vocab import MAP_NAME, VocabMap

BETA1, BETA2, EPS = 0.9, 0.95, 1e-8  # llm.c's train_gpt2.cu


class TrainError(Exception):
    """Bad input found after the arguments were parsed; one line, exit status 1."""


# ----------------------------------------------------------------------------
# command line

class HellaSwagOrHelp(argparse.Action):
    """-h 1 turns HellaSwag on, as llm.c's -h; -h alone is the help, as it always was."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            parser.print_help()
            parser.exit()
        setattr(namespace, self.dest, values)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # the defaults that are None are told in the help
        return action.help if action.default is None else super()._get_help_string(action)


def family_of(name):
    """The model family called name (llmc/families.py), or a TrainError saying to build it."""
    try:
        return get_family(name)
    except FamilyError as e:
        raise TrainError(str(e)) from None


def default_init_text(family):
    """-e's default under the family, as --help says it."""
    if family.stand_in is None:
        return family.default_init
    return f"{family.default_init} if present, else {family.stand_in}"


def argument_parser():
    """train.py's flags, each backend's own among them."""
    # what -e and --family take and default to, family by family
    families = [family_of(name) for name in family_names()]
    default = family_of(DEFAULT_FAMILY)
    with_presets = [family for family in families if family.presets]
    presets = "; ".join(f"a random {family.preset_noun}: {', '.join(family.presets)}"
                        for family in with_presets)
    defaults = "; ".join([default_init_text(default)] + [
        f"with --family {family.name}: {default_init_text(family)}"
        for family in families if family is not default])
    by_preset = "".join(f"{family.name} for a {family.preset_noun}, " for family in with_presets)
    p = Parser(prog="train.py", description="Train GPT-2 or Llama 2 on the CPU or another backend "
               "(--backend), with llm.c's train_gpt2.cu flags.", formatter_class=HelpFormatter,
               add_help=False)   # -h is llm.c's HellaSwag flag too: HellaSwagOrHelp
    p.add_argument("--help", action="help", help="show this help message and exit (so does -h "
                   "alone)")
    p.add_argument("-i", dest="train_data", metavar="PATTERN", default=default_data.TRAIN,
                   help="train data shards (glob); the default is prepared if missing")
    p.add_argument("-j", dest="val_data", metavar="PATTERN", default=None,
                   help="val data shards (glob) (default: the val split beside -i's shards, "
                        "its name with train -> val, else tinyshakespeare's)")
    p.add_argument("-o", dest="output_dir", metavar="DIR", default=None,
                   help="output dir: main.log, checkpoints (the final step's always), loss.png, "
                        "run.json (default: none)")
    p.add_argument("-e", "--model", dest="init", metavar="MODEL", default=None,
                   help=f"init from a model .bin, dN for a random model of depth N, or "
                        f"{presets} (default: {defaults})")
    p.add_argument("--family", choices=family_names(), default=None,
                   help=f"the model family of dN (default: the family of -e's file, told by "
                        f"its first bytes; {by_preset}else {DEFAULT_FAMILY})")
    p.add_argument("--vocab-size", metavar="INT", type=int, default=None,
                   help="vocabulary of a new random model (default: the data's tokenizer's, "
                        f"GPT-2's {GPT2_VOCAB_SIZE})")
    p.add_argument("--classifier", choices=("shared", "separate"), default=None,
                   help="the output head of a new random model: the token embedding (shared) "
                        "or a matrix of its own (separate; Llama only) (default: the preset's, "
                        "else shared)")
    p.add_argument("-b", dest="B", metavar="INT", type=int, default=4, help="micro batch size B")
    p.add_argument("-t", dest="T", metavar="INT", type=int, default=64, help="sequence length T")
    p.add_argument("-d", dest="total_batch_size", metavar="INT", type=int, default=-1,
                   help="total batch size in tokens, a multiple of B*T: gradient accumulation "
                        "(-1: B*T)")
    p.add_argument("-l", dest="lr", metavar="FLOAT", type=float, default=1e-4, help="learning rate")
    p.add_argument("-u", dest="warmup", metavar="INT", type=int, default=0,
                   help="learning rate warmup steps")
    p.add_argument("-q", dest="final_lr_frac", metavar="FLOAT", type=float, default=1.0,
                   help="final learning rate as a fraction of -l (cosine decay; 1.0: none)")
    p.add_argument("--lr-schedule", metavar="NAME", default="cosine", choices=list(SCHEDULERS),
                   help="learning rate schedule after the warmup: cosine (to -q at the last "
                        "step) or cosine-restarts (llama.cpp's: cycles down to -q, restarting)")
    p.add_argument("--cos-decay-steps", metavar="INT", type=int, default=1000,
                   help="cosine-restarts: the first cycle's length in steps")
    p.add_argument("--cos-decay-restart", metavar="FLOAT", type=float, default=1.1,
                   help="cosine-restarts: each cycle this many times the previous one's length")
    p.add_argument("-c", dest="weight_decay", metavar="FLOAT", type=float, default=0.0,
                   help="weight decay (of the 2-D weights only)")
    p.add_argument("-sl", dest="skip_lossz", metavar="FLOAT", type=float, default=0.0,
                   help="skip the update of a step whose loss has a z-score above this against "
                        "the latest --outlier-window steps (0: never)")
    p.add_argument("-sg", dest="skip_gradz", metavar="FLOAT", type=float, default=0.0,
                   help="skip the update of a step whose gradient norm has a z-score above this "
                        "(0: never)")
    p.add_argument("--outlier-window", metavar="INT", type=int, default=WINDOW,
                   help="-sl and -sg: the steps the z-scores are taken against (no update is "
                        "skipped before the window is full)")
    p.add_argument("-x", dest="max_steps", metavar="INT", type=int, default=40,
                   help="steps to train (-1: one epoch)")
    p.add_argument("-v", dest="val_every", metavar="INT", type=int, default=10,
                   help="val loss every this many steps")
    p.add_argument("-m", dest="val_batches", metavar="INT", type=int, default=5,
                   help="val batches per val loss (-1: the whole val split; 0: no val)")
    p.add_argument("-h", dest="hellaswag", metavar="INT", type=int, default=0, choices=(0, 1),
                   nargs="?", action=HellaSwagOrHelp,
                   help="1: HellaSwag's accuracy at every val loss but step 0's, and at the end "
                        "(-hm examples of --hellaswag's file); -h alone: this help")
    p.add_argument("-hm", dest="hellaswag_examples", metavar="INT", type=int, default=100,
                   help="-h 1: score the first this many examples (-1: all, llm.c's)")
    p.add_argument("--hellaswag", dest="hellaswag_file", metavar="FILE",
                   default=evalloader.HELLASWAG,
                   help="-h 1: the eval file (llm.c's format; python dev/data/hellaswag.py "
                        "writes the default)")
    p.add_argument("-s", dest="sample_every", metavar="INT", type=int, default=20,
                   help="sample every this many steps (0: never)")
    p.add_argument("-g", dest="gen_tokens", metavar="INT", type=int, default=64,
                   help="tokens per sample, counting the <|endoftext|> it starts from")
    p.add_argument("-n", dest="checkpoint_every", metavar="INT", type=int, default=0,
                   help="checkpoint every this many steps into -o (0: only at the end; with -o the "
                        "final step is always kept)")
    p.add_argument("-nk", dest="checkpoints_keep", metavar="INT", type=int, default=0,
                   help="keep only the newest this many checkpoints (0: all)")
    p.add_argument("-y", dest="resume", metavar="INT", type=int, default=0, choices=(0, 1),
                   help="1: resume from the newest checkpoint in -o, with the settings of the run "
                        "there (its run.json: no flag typed again)")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in -o: delete the run there first (its checkpoints, "
                        "main.log, loss.png, log.jsonl, vocab_map.bin, run.json; nothing else)")
    p.add_argument("-r", dest="seed", metavar="INT", type=int, default=42,
                   help="seed of the random init (-e dN)")
    p.add_argument("-z", dest="zero_stage", metavar="INT", type=int, default=0, choices=(0, 1),
                   help="with many processes (mpirun): 1 shards AdamW's m and v across them "
                        "(ZeRO-1)")
    p.add_argument("--backend", metavar="NAME", default="cpu",
                   help="where the model runs: cpu, check:NAME, profile:NAME, ... "
                        "(accel/README.md)")
    p.add_argument("--precision", choices=list(PRECISIONS), default="fp32",
                   help="llm.c's PRECISION: fp32, or bf16 (bf16 parameters and activations in "
                        "the kernels; float32 gradients, AdamW m and v and master weights). At "
                        "bf16 a GPT-2 checkpoint is llm.c's bf16 model file (version 5, the bf16 "
                        "parameters), a Llama one stays llama2.c's float32 file (the master "
                        "weights: llama2.c has no bf16 file); the state holds the master weights. "
                        "fp16: the same in half precision with dynamic loss scaling, float32 "
                        "model files (metal, metal-emu; the CPU's fp16 table is check:'s oracle)")
    p.add_argument("--grad-precision", choices=list(GRAD_PRECISIONS), default="fp32",
                   help="the parameter gradients: fp32, or at --precision bf16 bf16, as llm.c "
                        "keeps them (each kernel sums in float32 and adds into them rounded "
                        "once; 2 bytes a parameter less; the CPU)")
    p.add_argument("-w", dest="master_weights", metavar="INT", type=int, default=1,
                   choices=(0, 1),
                   help="llm.c's use_master_weights: 0 at --precision bf16 trains without the "
                        "float32 master weights (AdamW updates the bf16 parameters and rounds "
                        "them stochastically; 4 bytes a parameter less)")
    p.add_argument("--loss-scale", type=float, default=None, metavar="S",
                   help="fp16: the dynamic loss scale to start at, a power of two (default "
                        "65536, PyTorch's GradScaler's; it halves at each overflow and doubles "
                        "after 2000 steps without one)")
    p.add_argument("--recompute", metavar="POLICY", default="all",
                   help="activation checkpointing: all (keep every layer's activations), "
                        "every-N, sqrt, boundary, none (keep fewer, recompute them in backward: "
                        "less memory, more time; llmc/recompute.py)")
    p.add_argument("--compact-vocab", action="store_true",
                   help="a new random model's vocabulary is only the token ids of the training "
                        "data, renumbered (the map: -o DIR's vocab_map.bin). It changes the "
                        "objective: an unseen token can never be predicted, and the loss is not "
                        "comparable with a full vocabulary's (llmc/vocab.py)")
    p.add_argument("--json-log", metavar="FILE", nargs="?", const="", default=None,
                   help="a JSON line per step (ms, tokens/s, TFLOPS against the peak, compile "
                        "time, kernel groups) and per val loss, and an efficiency report at the "
                        f"end (llmc/report.py); without FILE: -o DIR's {LOG_NAME}")
    p.add_argument("--profile", action="store_true",
                   help="time every kernel call (the backend under profile:): the report's "
                        "time, calls and share per backend table entry and per kernel group; "
                        "costs two clock reads a call")
    p.add_argument("--peak-tflops", metavar="FLOAT", type=float, default=None,
                   help="the device's peak TFLOPS for the report (default: the backend's, or "
                        "the CPU's sgemm rate measured at the start)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan of a step of the model at -b, -t, --recompute (memory, "
                        "FLOPs, time estimate) without allocating it, and exit")
    for hooks in every_backend_hooks():   # each backend's own flags (accel/hooks.py)
        hooks.add_arguments(p)
    return p


def parse_args(argv):
    p = argument_parser()
    args = p.parse_args(argv)
    if args.resume and args.output_dir is None:
        p.error("argument -y: resuming needs the output dir of the run: add -o DIR")
    if args.overwrite and (args.output_dir is None or args.resume):
        p.error("argument --overwrite: starts the run in -o over: give -o DIR, without -y 1")
    if args.resume:
        args = resumed_arguments(p, argv, args)

    def require(ok, flag, value, requirement):
        if not ok:
            p.error(f"argument {flag}: {requirement}, got {value}")
    require(args.B >= 1, "-b", args.B, "the batch size must be at least 1")
    require(args.T >= 1, "-t", args.T, "the sequence length must be at least 1")
    require(args.total_batch_size == -1 or (args.total_batch_size > 0 and
            args.total_batch_size % (args.B * args.T) == 0), "-d", args.total_batch_size,
            f"must be -1 or a positive multiple of B*T = {args.B * args.T}")
    require(math.isfinite(args.lr) and args.lr >= 0, "-l", args.lr, "must be a number >= 0")
    require(args.warmup >= 0, "-u", args.warmup, "must be >= 0")
    require(math.isfinite(args.final_lr_frac) and 0 <= args.final_lr_frac <= 1, "-q",
            args.final_lr_frac, "must be in [0, 1]")
    require(math.isfinite(args.weight_decay) and args.weight_decay >= 0, "-c",
            args.weight_decay, "must be >= 0")
    require(args.max_steps >= -1, "-x", args.max_steps,
            "must be -1 (one epoch) or a number of steps >= 0")
    require(args.val_every >= 1, "-v", args.val_every, "must be at least 1")
    require(args.val_batches >= -1, "-m", args.val_batches,
            "must be -1 (all), 0 (none) or a number of batches")
    require(args.sample_every >= 0, "-s", args.sample_every, "must be >= 0")
    require(args.gen_tokens >= 1, "-g", args.gen_tokens, "must be at least 1")
    require(args.checkpoint_every >= 0, "-n", args.checkpoint_every, "must be >= 0")
    require(args.checkpoints_keep >= 0, "-nk", args.checkpoints_keep, "must be >= 0")
    require(args.seed >= 0, "-r", args.seed, "must be >= 0")
    require(args.hellaswag_examples == -1 or args.hellaswag_examples >= 1, "-hm",
            args.hellaswag_examples, "must be -1 (all) or a number of examples")
    if args.hellaswag and args.compact_vocab:
        p.error("argument -h: HellaSwag's tokens are the tokenizer's, not --compact-vocab's "
                "(drop one)")
    for flag, z in (("-sl", args.skip_lossz), ("-sg", args.skip_gradz)):
        require(math.isfinite(z) and z >= 0, flag, z, "must be a z-score >= 0 (0: off)")
    require(args.outlier_window >= 2, "--outlier-window", args.outlier_window,
            "must be at least 2")
    try:
        args.recompute = parse_policy(args.recompute)
    except ValueError as e:
        p.error(f"argument --recompute: {e}")
    require(args.grad_precision == "fp32" or args.precision == args.grad_precision,
            "--grad-precision", args.grad_precision,
            f"needs --precision {args.grad_precision} (the parameters and activations in it)")
    require(args.master_weights or args.precision == "bf16", "-w", args.master_weights,
            "needs --precision bf16 (fp32 keeps no master weights; fp16 rounds its updates to "
            "nearest, which loses the small ones)")
    if args.loss_scale is not None:
        require(args.precision == "fp16", "--loss-scale", args.loss_scale,
                f"only fp16 scales its loss, this run is --precision {args.precision}")
        require(math.isfinite(args.loss_scale) and args.loss_scale >= 1 and
                math.frexp(args.loss_scale)[0] == 0.5, "--loss-scale", args.loss_scale,
                "must be a power of two >= 1")
    require(args.vocab_size is None or args.vocab_size >= 1, "--vocab-size", args.vocab_size,
            "must be at least 1")
    if args.compact_vocab and args.vocab_size is not None:
        p.error("argument --compact-vocab: the vocabulary is the data's ids: drop --vocab-size")
    require(args.cos_decay_steps >= 1, "--cos-decay-steps", args.cos_decay_steps,
            "must be at least 1")
    require(math.isfinite(args.cos_decay_restart) and args.cos_decay_restart >= 1,
            "--cos-decay-restart", args.cos_decay_restart, "must be a number >= 1")
    preset_of = preset_family(args.init)   # the family whose preset -e names, or None
    args.family_note = None   # without --family, what -e's file is: said once it has loaded
    if args.init is not None and os.path.exists(args.init):   # a file, as model_source takes it
        family, what = file_family(args.init, args.family, p.error)
        if args.family is None:
            args.family_note = f"-e {args.init}: {what}: the {family} family"
        args.family = family
    elif args.family is None:
        args.family = preset_of or DEFAULT_FAMILY
    elif preset_of not in (None, args.family):
        p.error(f"argument --family: -e {args.init} is a {family_of(preset_of).preset_noun}, not "
                f"a {args.family} model")
    if args.classifier is not None and not has_field(family_of(args.family).config_class,
                                                     "shared_classifier"):
        if args.classifier == "separate":
            p.error(f"argument --classifier: a {family_of(args.family).title} model's classifier "
                    f"is always the token embedding (shared)")
        args.classifier = None   # shared: its only kind
    init = args.init or family_of(args.family).default_init
    if args.classifier is not None and os.path.exists(init):
        p.error(f"argument --classifier: the model file {init} has its own classifier (the "
                f"flag is for a new random model)")
    if args.checkpoint_every > 0 and args.output_dir is None:
        p.error("argument -n: checkpoints need an output dir: add -o DIR")
    if args.json_log == "":
        if args.output_dir is None:
            p.error(f"argument --json-log: without FILE it writes -o DIR's {LOG_NAME}: "
                    f"add -o DIR")
        args.json_log = os.path.join(args.output_dir, LOG_NAME)
    require(args.peak_tflops is None or (math.isfinite(args.peak_tflops) and
            args.peak_tflops > 0), "--peak-tflops", args.peak_tflops, "must be a number > 0")
    backend_hooks(args.backend).check_arguments(args, p.error)
    if args.profile:
        args.backend = with_wrapper("profile", args.backend)
    return args


def file_family(path, family, error):
    """(the name of the family of -e's model file, told by its first bytes; what the file is,
    in words); error() when --family (family, or None) names another."""
    try:
        found, _ = family_of_file(path)
    except FamilyError as e:
        raise TrainError(str(e)) from None
    what = describe_model_file(path)
    if family not in (None, found.name):
        error(f"argument --family: -e {path} is {what}, of the {found.name} family, not "
              f"{family}")
    return found.name, what


def has_field(config_class, name):
    return name in {field.name for field in dataclasses.fields(config_class)}


# ----------------------------------------------------------------------------
# model, tokenizer, evaluation

def data_vocab_size(args):
    """The vocabulary of the training data's tokenizer: a tokenizer.bin or a Hugging Face
    tokenizer.json beside the shards, or GPT-2's."""
    path = data_tokenizer(args.train_data)
    if path == DEFAULT_TOKENIZER:
        return GPT2_VOCAB_SIZE
    try:
        if is_hf_tokenizer(path):
            return Tokenizer.from_hf(path).vocab_size
        return len(read_llama2c_tokenizer(path)[0])
    except (FormatError, TokenizerError) as e:
        raise TrainError(f"the data's tokenizer: {e}") from None


def vocab_size(args):
    """The vocabulary of a new random model: --vocab-size, else the training data's
    tokenizer's (the one place that decides it)."""
    return args.vocab_size if args.vocab_size is not None else data_vocab_size(args)


def check_data_tokenizer(args, config):
    """The data's tokens must be the model's: a tokenizer with more tokens than the model's
    vocabulary (a model file given other data) is said first, before the token ids or the
    samples fail on it. --vocab-size and --compact-vocab choose the vocabulary themselves."""
    if args.vocab_size is not None or args.compact_vocab:
        return
    tokens = data_vocab_size(args)
    if tokens > config.vocab_size:
        path = data_tokenizer(args.train_data)
        which = ("GPT-2's (no tokenizer.bin beside -i's shards)" if path == DEFAULT_TOKENIZER
                 else path)
        raise TrainError(f"-i {args.train_data}: the data's tokenizer, {which}, has {tokens} "
                         f"tokens, more than the model's vocabulary of {config.vocab_size}: "
                         f"train it on data tokenized for it (-i, -j, with its tokenizer.bin "
                         f"or tokenizer.json beside the shards: dev/data/text_to_shards.py "
                         f"--tokenizer)")


def val_data_pattern(args):
    """-j, else the val split beside -i's shards (their name with train -> val, as the data
    scripts write them), else the default val data; a note says which when -i has no -j."""
    if args.val_data is not None:
        return args.val_data
    if args.train_data == default_data.TRAIN:
        return default_data.VAL
    directory, name = os.path.split(args.train_data)
    beside = os.path.join(directory, name.replace("train", "val")) if "train" in name else None
    if beside and glob.glob(beside):
        note(f"-i without -j: validating on {beside}, the val split beside the training data")
        return beside
    why = (f"no {os.path.basename(beside)} beside it" if beside else
           "its name has no 'train' to find a val split by")
    note(f"-i without -j: validating on {default_data.VAL}, the default val data ({why}); "
         f"give -j for a val loss on the training data's own split")
    return default_data.VAL


# ----------------------------------------------------------------------------
# the output dir: one run

# run.json: the settings of the run in -o, by flag. -y 1 takes every one of them as its flag's
# default, so a resume needs no flag typed again; a flag given again must agree with those that
# shape the run (RUN_SHAPE), while the others (how far it trains, how often it evaluates,
# samples and checkpoints, where it runs) may change, and the next resume takes the new ones.
RUN_SHAPE = ("--family", "-e", "-b", "-t", "-i", "-j", "--precision", "--grad-precision", "-w",
             "-d", "-l", "-u", "-q",
             "--lr-schedule", "--cos-decay-steps", "--cos-decay-restart", "-c", "-r",
             "--classifier", "--vocab-size", "--compact-vocab", "-sl", "-sg", "--outlier-window")
RUN_CARRIED = ("-x", "-v", "-m", "-s", "-g", "-n", "-nk", "-h", "-hm", "--hellaswag",
               "--recompute", "--backend", "--json-log")

# what a run.json written before a setting existed held: that setting's value then
RUN_CONFIG_DEFAULTS = {"--precision": "fp32", "--grad-precision": "fp32", "-w": 1}


def resumed_arguments(p, argv, args):
    """-y 1: args again, with the run.json of -o (when it has one) as the defaults of its
    flags: the flags given on the command line keep their values. A dir that does not exist or
    holds no run is an error (exit status 2)."""
    out = args.output_dir
    if not os.path.isdir(out):
        p.error(f"argument -y: -o {out} does not exist: no run to resume (without -y 1 a new "
                f"run starts there)")
    saved = read_run_config(out)
    if saved is None:   # an older llm.pyx's run, or llm.c's: its checkpoints say what they hold
        if not run_files(out):
            p.error(f"argument -y: -o {out} holds no run to resume (without -y 1 a new run "
                    f"starts there)")
        return args
    destinations = run_destinations()
    p.set_defaults(**{destinations[flag]: value for flag, value in saved.items()
                      if flag in destinations})
    return p.parse_args(argv)


@functools.cache
def run_destinations():
    """The flags of run.json, each with the attribute of args it sets (the parser's, built
    once)."""
    return {flag: action.dest for action in argument_parser()._actions
            for flag in action.option_strings if flag in RUN_SHAPE + RUN_CARRIED}


def run_config(args):
    """run.json: the value of each flag of RUN_SHAPE and RUN_CARRIED in this run, the data as
    absolute paths (the number of processes is checked against the training state, by
    resume)."""
    config = {flag: getattr(args, destination)
              for flag, destination in run_destinations().items()}
    config["-i"], config["-j"] = os.path.abspath(args.train_data), os.path.abspath(args.val_data)
    return config


def run_files(output_dir):
    """The files of the run in output_dir: its checkpoints and what its Logger, --json-log,
    --compact-vocab and run.json wrote; nothing else there."""
    names = checkpoint_files(output_dir) + ["main.log", "loss.png", LOG_NAME, MAP_NAME, RUN_NAME]
    return [name for name in names if os.path.exists(os.path.join(output_dir, name))]


def start_run(args, dist):
    """A new run in -o: refuse a dir that holds another run (its checkpoints or main.log)
    unless --overwrite deletes that run's files, or -y 1 finds this run there stopped before
    its first checkpoint (its run.json agrees: check_resumed_run) and starts it afresh; then
    write run.json."""
    out = args.output_dir
    found, checkpoints = run_files(out), checkpoint_files(out)
    afresh = args.resume and RUN_NAME in found
    if not (args.overwrite or afresh) and (checkpoints or "main.log" in found):
        steps = complete_steps(out)
        what = [f"checkpoints at steps {', '.join(map(str, steps))}" if steps else
                "checkpoint files"] if checkpoints else []
        what += ["main.log"] if "main.log" in found else []
        if args.resume:
            raise TrainError(f"-y 1: -o {out} holds another run ({' and '.join(what)}) but no "
                             f"complete checkpoint to resume: give this run another -o, or "
                             f"start over with --overwrite (without -y 1)")
        raise TrainError(f"-o {out} holds another run ({' and '.join(what)}): resume it with "
                         f"-y 1, or give this run another -o (--overwrite deletes that run)")
    if afresh:
        note(f"-y 1: the run in {out} stopped before its first checkpoint: starting it afresh")
    dist.barrier()   # every rank has looked before rank 0 deletes
    if dist.process_rank == 0:
        if args.overwrite or afresh:
            for name in found:
                os.remove(os.path.join(out, name))
        write_run_config(out, run_config(args))
    dist.barrier()


def make_run_dir(path):
    """A new -o: a run's files are not source code, so git ignores the dir (its .gitignore,
    as a Python venv's)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, ".gitignore"), "w") as f:
        f.write("# a run of llm.pyx's train.py: git ignores it all\n*\n")


def check_resumed_run(args):
    """-y 1 continues the run in -o only with the settings that shaped it: say each flag given
    that contradicts one. A new -x is said too where the learning rate decays over the run."""
    config = run_config(args)
    differences = run_differences(args.output_dir, {flag: config[flag] for flag in RUN_SHAPE},
                                  RUN_CONFIG_DEFAULTS)
    if differences:
        raise TrainError(f"-y 1: {args.output_dir} holds a run with other settings: "
                         f"{'; '.join(differences)}: drop those flags to resume it with its "
                         f"own (run.json), or give this run another -o")
    planned = (read_run_config(args.output_dir) or {}).get("-x", args.max_steps)
    if planned != args.max_steps and args.final_lr_frac < 1.0:
        note(f"-x {args.max_steps}: the run in {args.output_dir} was to take {planned} steps: "
             f"its learning rate now decays over {args.max_steps}")


def classifier_field(args):
    """--classifier as a config field (none for a family that has one kind only)."""
    return {} if args.classifier is None else {"shared_classifier": args.classifier == "shared"}


def random_config(args, init):
    """The config of -e dN or a preset of the family, or None when init names neither."""
    depth = re.fullmatch(r"d(\d+)", init)
    if depth and not 1 <= int(depth.group(1)) <= 1000:
        raise TrainError(f"-e {init}: the depth must be in 1..1000")
    family = family_of(args.family)
    if depth or init in family.presets:
        return family.config_class.from_name(init, vocab_size=vocab_size(args),
                                             **classifier_field(args))
    return None


def model_class(args):
    """The model class of args.family, or a TrainError saying to build it."""
    try:
        import kernels.blas   # first: LLMPYX_BLAS's errors are not a missing build
    except ModuleNotFoundError as e:
        raise TrainError(f"the model is not built ({e}): run `make train_gpt2` first") from None
    except ImportError as e:   # LLMPYX_BLAS names a library that is not there
        raise TrainError(str(e)) from None
    return family_of(args.family).model_class


def model_source(args):
    """-e as (init, config): the config of a new random model, or None for a model file."""
    family = family_of(args.family)
    init = args.init
    if init is None:
        init = family.default_init
        if family.stand_in is not None and not os.path.exists(init):
            note(f"{init} not found: starting from a random {family.title} {family.stand_in} "
                 f"(for the pretrained weights: {family.download})")
            init = family.stand_in
    config = None if os.path.exists(init) else random_config(args, init)
    if config is None:
        if args.vocab_size is not None:
            raise TrainError(f"--vocab-size: the model file {init} has its own vocabulary")
        if not os.path.exists(init):
            raise TrainError(f"-e {init}: no such model file (nor {family.random_inits})"
                             f"{near_presets(init)}")
    return init, config


def near_presets(init):
    """"; did you mean stories15M?" where init is near a preset's name (of any family, in any
    case), else the presets there are; a GPT-2 has none."""
    presets = [name for family in (family_of(n) for n in family_names()) for name in family.presets]
    lowered = {name.lower(): name for name in presets}
    close = [init.lower()] if init.lower() in lowered else \
        difflib.get_close_matches(init.lower(), lowered, n=3, cutoff=0.75)
    if close:
        return f"; did you mean {' or '.join(lowered[c] for c in close)}?"
    return f"; the presets: {', '.join(presets)}" if presets else ""


def load_model(args, Model, resume_path):
    """(model of class Model, how it was initialised)."""
    from accel.backend import BackendError
    try:
        options = dict(grad_precision=args.grad_precision,
                       master_weights=bool(args.master_weights))
        if resume_path is not None:
            return (Model.from_checkpoint(resume_path, args.backend, args.recompute,
                                          args.precision, **options),
                    f"checkpoint {resume_path}")
        init, config = model_source(args)
        if config is not None:
            return (Model.random(config, seed=args.seed, backend=args.backend,
                                 recompute=args.recompute, precision=args.precision, **options),
                    f"random {init} (seed {args.seed})")
        model = Model.from_checkpoint(init, args.backend, args.recompute, args.precision,
                                      **options)
        if args.family_note is not None:
            note(args.family_note)
        return model, f"checkpoint {init}"
    except (FormatError, BackendError) as e:
        raise TrainError(str(e)) from None
    except MemoryError as e:
        raise TrainError(f"not enough memory for the model: {e}") from None


def dry_run(args):
    """Print the plan of a training step of the model (llmc/dry_run.py's, or the backend's own:
    accel/hooks.py), without allocating it."""
    from llmc.dry_run import dry_run_text, memory_plan
    Model = model_class(args)
    model_family = family_of(args.family)
    init, config = model_source(args)
    if init in model_family.presets and args.vocab_size is None:
        # the published sizes, not the data's vocabulary
        config = model_family.config_class.from_name(init, **classifier_field(args))
    try:
        if config is None:   # a model file: its header's config
            config = model_family.read_model(init)[0]
            if args.family_note is not None:
                note(args.family_note)
    except FormatError as e:
        raise TrainError(str(e)) from None
    if args.T > config.max_seq_len:
        raise TrainError(f"-t {args.T} exceeds the model's max sequence length {config.max_seq_len}")
    family = model_family.title
    require_backend(args, here=False)   # one without --precision's kernels: not at it
    from accel.backend import BackendError
    try:   # the backend's own plan (the ANE's: its pipeline against the compile budget), if any
        text = backend_hooks(args.backend).dry_run_plan(
            Model, config, f"{family} {init}", args,
            RecomputePlan(args.recompute, Model.num_layers_of(config)),
            memory_plan(Model, config, args.B, args.T, args.recompute,
                        grad_precision=args.grad_precision,
                        master_weights=bool(args.master_weights)))
        if text is None:
            text = dry_run_text(Model, config, f"{family} {init}", args.B, args.T, args.recompute,
                                backend=args.backend, precision=args.precision,
                                grad_precision=args.grad_precision,
                                master_weights=bool(args.master_weights))
    except BackendError as e:   # one the plan cannot have here (metal on Linux), or refuses
        raise TrainError(str(e)) from None
    print(text)


def sample_start_token(args):
    """The token samples start from: the eot of the data's tokenizer file (llama2.c's BOS),
    GPT-2's <|endoftext|> without one."""
    path = data_tokenizer(args.train_data)
    if not os.path.exists(path):
        return GPT2_EOT_TOKEN
    try:
        return load_tokenizer(path).eot_token
    except (TokenizerError, FormatError) as e:
        raise TrainError(f"the data's tokenizer: {e}") from None


def compact_vocabulary(args, resume_step, rank=0):
    """--compact-vocab's map (llmc/vocab.py): a resumed run's saved one, else the ids of the
    training data and the samples' first token, saved as -o DIR's vocab_map.bin; it sets the
    new model's vocabulary. None without the flag."""
    saved = None if args.output_dir is None else os.path.join(args.output_dir, MAP_NAME)
    if resume_step is not None:
        has_map = os.path.exists(saved)
        if has_map != args.compact_vocab:
            how = "with" if has_map else "without"
            raise TrainError(f"-y 1: {args.output_dir} was trained {how} --compact-vocab, "
                             f"resume it {how} it")
        return VocabMap.load(saved) if has_map else None
    if not args.compact_vocab:
        return None
    init = args.init or family_of(args.family).default_init
    if os.path.exists(init):
        raise TrainError(f"--compact-vocab: {init} is a model file with its own vocabulary; "
                         f"compaction needs a new random model (-e dN or a Llama preset)")
    vocab_map = VocabMap.from_shards(shard_files(args.train_data), extra=[sample_start_token(args)])
    if saved is not None and rank == 0:
        vocab_map.save(saved)
    args.vocab_size = len(vocab_map)
    return vocab_map


def memory_line(model):
    """One line of what the model allocated on its backend, by kind (Model.memory()); at bf16
    it says what is bf16: the activations (half the bytes of fp32's; their statistics and
    losses float32), the parameters (beside the float32 master weights, or alone with -w 0),
    and the gradients with --grad-precision bf16."""
    mib = lambda n: f"{n / 2 ** 20:,.0f} MiB"  # noqa: E731
    precision, memory = model.precision, model.memory()
    what = {}
    if precision != "fp32":
        what = dict(params=f" ({precision} + float32 master weights)" if model.master_weights
                    else f" ({precision}, no master weights)",
                    activations=f" ({precision})", activation_grads=f" ({precision})")
    if model.grad_precision != "fp32":
        what["grads"] = f" ({model.grad_precision})"
    return ("memory allocated: " + ", ".join(f"{kind} {mib(n)}{what.get(kind, '')}"
                                             for kind, n in memory.items())
            + f"; total {mib(sum(memory.values()))}")


def precision_text(model):
    """The config table's precision: what it keeps in which type."""
    if model.precision == "fp16":
        return "fp16, scaled loss (float32 master, grads, AdamW)"
    if model.precision != "bf16":
        return model.precision
    float32 = (["master weights"] if model.master_weights else []) + \
        (["gradients"] if model.grad_precision == "fp32" else []) + ["AdamW"]
    return ("bf16" + (", bf16 gradients" if model.grad_precision == "bf16" else "")
            + ("" if model.master_weights else ", no master weights")
            + f" (float32 {', '.join(float32)})")


def require_backend(args, here=True):
    """A TrainError in one line when --backend cannot run here (unless not here: a dry run
    plans backends of other machines), or has no kernels of --precision and --grad-precision
    (accel/backend.pyx's BackendError), without making the backend."""
    from accel.backend import BackendError, require_available, require_precision
    try:
        if here:
            require_available(args.backend)
        require_precision(args.backend, args.precision, args.grad_precision)
    except BackendError as e:
        raise TrainError(str(e)) from None


def runs_on_cpu(backend):
    """Whether the backend's kernels are the CPU's (cpu, or a wrapper around it)."""
    return backend.rpartition(":")[2] == "cpu"


def bf16_hardware_note():
    """--precision bf16 on the CPU: one line when the bf16 GEMMs have no bf16 dot-product
    hardware to run on (kernels.blas.HARDWARE_BF16: AVX512_BF16 or AMX-BF16, through oneMKL's
    cblas_gemm_bf16bf16f32), else None."""
    from kernels.blas import HARDWARE_BF16, cpu_bf16_features
    if HARDWARE_BF16:
        return None
    features = cpu_bf16_features()
    if not features:
        why = "no AVX512_BF16 or AMX-BF16"
    elif os.environ.get("LLMPYX_BF16_GEMM", "").strip().lower() == "fp32":
        why = f"the CPU has {', '.join(features)}, unused under LLMPYX_BF16_GEMM=fp32"
    else:
        why = f"the CPU has {', '.join(features)}, but no oneMKL to use it: pip install mkl"
    return (f"--precision bf16: this machine has no bf16 hardware in use ({why}): the bf16 "
            f"GEMMs run as float32 GEMMs, and the run will be slower than fp32")


def evaluate(model, loader, num_batches, dist):
    """The mean loss of num_batches batches on every process, averaged over the processes."""
    loader.reset()
    loss = sum(model.forward(*loader.next_batch()) for _ in range(num_batches)) / num_batches
    return dist.mean(loss)


def require_hellaswag_file(args):
    """-h 1's eval file must be there, else one line says how to prepare it (now, before the
    data and the model)."""
    if args.hellaswag and not os.path.exists(args.hellaswag_file):
        raise TrainError(f"-h 1: {args.hellaswag_file}: no such file (`python "
                         f"dev/data/hellaswag.py` writes HellaSwag's, {evalloader.HELLASWAG})")


def load_hellaswag(args, config):
    """(-h 1's examples: the first -hm of the eval file, its tokens checked against the model's
    vocabulary; how many the file holds), or (None, 0) without -h 1."""
    if not args.hellaswag:
        return None, 0
    examples = read_evalfile(args.hellaswag_file, config.vocab_size)
    count = len(examples) if args.hellaswag_examples == -1 else args.hellaswag_examples
    return examples[:count], len(examples)


# ----------------------------------------------------------------------------
# -sl, -sg: updates skipped as outliers

OUTLIER_STREAMS = ("loss", "grad_norm")   # what the detectors watch, as the side file names them


def new_outliers(args):
    """The detectors of -sl and -sg ({stream: OutlierDetector}), or None when both are off."""
    if not (args.skip_lossz or args.skip_gradz):
        return None
    return {name: OutlierDetector(args.outlier_window) for name in OUTLIER_STREAMS}


def resumed_outliers(args, step):
    """-sl and -sg's detectors as the checkpoint at step saved them (llmc/checkpoint.py's side
    file); empty ones, said in a note, when it saved none."""
    saved = read_outliers(args.output_dir, step)
    if saved is None:
        note(f"-y 1: the checkpoint at step {step} holds no outlier windows (its run had no -sl "
             f"or -sg): they start empty, and no update is skipped for {args.outlier_window} "
             f"steps")
        return new_outliers(args)
    path = outliers_path(args.output_dir, step)
    if not isinstance(saved, dict) or sorted(saved) != sorted(OUTLIER_STREAMS):
        raise FormatError(path, f"not the outlier detectors' state (expected the streams "
                                f"{', '.join(OUTLIER_STREAMS)})")
    try:
        detectors = {name: OutlierDetector.from_state(saved[name]) for name in OUTLIER_STREAMS}
    except ValueError as e:
        raise FormatError(path, str(e)) from None
    window = detectors["loss"].window
    if window != args.outlier_window:
        raise TrainError(f"-y 1: {path} holds windows of {window} steps, --outlier-window is "
                         f"{args.outlier_window}: resume with --outlier-window {window}")
    return detectors


# ----------------------------------------------------------------------------
# main training loop

def main(argv=None):
    dist = distributed.init()  # first: only rank 0 prints, argument errors included
    args = parse_args(argv)
    try:
        train(args, dist)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(interrupted_line(args)) from None


def interrupted_line(args):
    """What Ctrl-C leaves: how to go on from the newest checkpoint, if there is one."""
    out = args.output_dir
    step = None if out is None or not os.path.isdir(out) else find_max_step(out)
    if step is not None:
        return f"step {step} is saved in {out}: resume with train.py -o {out} -y 1"
    if out is not None:
        return f"no checkpoint in {out} yet: train.py -o {out} -y 1 starts the run afresh"
    return "nothing saved (-o DIR keeps the run, -n N a checkpoint every N steps)"


def train(args, dist):
    if args.dry_run:
        return dry_run(args)
    args.val_data = val_data_pattern(args)
    require_hellaswag_file(args)
    console = Console()
    B, T = args.B, args.T
    rank, num_processes = dist.process_rank, dist.num_processes
    tokens_per_fwdbwd = B * T * num_processes  # one micro-batch of every process
    total_batch_size = tokens_per_fwdbwd if args.total_batch_size == -1 else args.total_batch_size
    if total_batch_size % tokens_per_fwdbwd != 0:
        raise TrainError(f"-d {total_batch_size}: must be a multiple of B*T*processes = "
                         f"{B}*{T}*{num_processes} = {tokens_per_fwdbwd}")
    grad_accum_steps = total_batch_size // tokens_per_fwdbwd

    # resume from the newest complete checkpoint in the output dir, if asked and there is one
    resume_step = None
    if args.output_dir is not None:
        if rank == 0 and not os.path.isdir(args.output_dir):
            make_run_dir(args.output_dir)
        dist.barrier()   # the dir is there for every rank
        if args.resume:
            check_resumed_run(args)
            resume_step = find_max_step(args.output_dir)
        if resume_step is None:
            start_run(args, dist)
        elif rank == 0:   # the settings it goes on with: the next resume's
            write_run_config(args.output_dir, run_config(args))

    Model = model_class(args)   # a missing build or a bad LLMPYX_BLAS fails now, not after the data
    from kernels.blas import BF16_LIBRARY, LIBRARY as cpu_gemms
    require_backend(args)   # and so does a backend that cannot run here, or not at --precision
    if args.precision == "bf16" and runs_on_cpu(args.backend) and rank == 0:
        hardware_note = bf16_hardware_note()
        if hardware_note is not None:
            note(hardware_note)
    if args.precision == "fp16" and runs_on_cpu(args.backend) and rank == 0:
        note("--precision fp16 on the CPU: its fp16 table is check:'s oracle for the GPUs (the "
             "float32 kernels on widened copies), slower than fp32")

    # the data's shards (tinyshakespeare's prepared if they are the default and missing): the
    # model's vocabulary comes from them with --compact-vocab, or from their tokenizer.bin
    default_data.prepare_default(args.train_data, args.val_data)

    # the model (its vocabulary the data's ids with --compact-vocab)
    vocab_map = compact_vocabulary(args, resume_step, rank)
    resume_model_path = (None if resume_step is None else
                         checkpoint_paths(args.output_dir, resume_step)[0])
    model, init_desc = load_model(args, Model, resume_model_path)
    if args.loss_scale is not None:   # a resume's state sets its own below
        model.set_loss_scale(args.loss_scale)
    dist.set_zero_stage(args.zero_stage, model)
    config = model.config
    check_data_tokenizer(args, config)
    if T > config.max_seq_len:
        raise TrainError(f"-t {T} exceeds the model's max sequence length {config.max_seq_len}")
    if args.gen_tokens > config.max_seq_len:
        raise TrainError(f"-g {args.gen_tokens} exceeds the model's max sequence length "
                         f"{config.max_seq_len}")
    if (args.sample_every > 0 and data_tokenizer(args.train_data) == DEFAULT_TOKENIZER
            and config.vocab_size <= GPT2_EOT_TOKEN and vocab_map is None):
        raise TrainError(f"-s {args.sample_every}: samples start from GPT-2's <|endoftext|> "
                         f"({GPT2_EOT_TOKEN}), outside the model's vocabulary of "
                         f"{config.vocab_size}: add -s 0")

    # the data
    train_loader = DataLoader(args.train_data, B, T, shuffle=True, vocab_size=config.vocab_size,
                              process_rank=rank, num_processes=num_processes, token_map=vocab_map)
    val_loader = DataLoader(args.val_data, B, T, shuffle=False, vocab_size=config.vocab_size,
                            process_rank=rank, num_processes=num_processes, token_map=vocab_map)
    if vocab_map is not None:   # now, not at the first val loss that reads the token
        vocab_map.check_shards(val_loader.files)
    num_steps = args.max_steps
    if num_steps == -1:  # one epoch
        num_steps = train_loader.num_tokens // total_batch_size
        if num_steps == 0:
            raise TrainError(f"{args.train_data}: {train_loader.num_tokens} tokens, less than one "
                             f"step of {total_batch_size}")
    val_batches = args.val_batches
    if val_batches == -1:
        val_batches = val_loader.num_tokens // tokens_per_fwdbwd
    hellaswag, hellaswag_total = load_hellaswag(args, config)
    hooks = backend_hooks(args.backend)   # what the backend adds to the run (accel/hooks.py)
    from accel.backend import BackendError
    try:
        hooks.start_training(model, args, num_steps)
    except BackendError as e:
        raise TrainError(str(e)) from None
    # a backend that runs only so many steps in a process (the ANE's static pipeline): the run
    # goes on in fresh processes from its checkpoints (llmc/checkpoint.py's restart)
    process_steps = hooks.process_steps(model)
    if process_steps is not None and num_steps > process_steps:
        if args.output_dir is None:
            raise TrainError(f"--backend {args.backend} runs {process_steps} steps of this model "
                             f"in a process, the run {num_steps}: it goes on in fresh processes "
                             f"from its checkpoints, give it -o DIR")
        if os.path.basename(sys.argv[0]) != "train.py":
            raise TrainError(f"--backend {args.backend} restarts the command line after "
                             f"{process_steps} steps: run train.py as a command, not train.main()")
    restarted = restarts() > 0

    # a restart of the run says one line, not the settings again
    settings = Console(open(os.devnull, "w")) if restarted else console
    settings.table([
        ("train data pattern", args.train_data), ("val data pattern", args.val_data),
        ("output log dir", args.output_dir or "none"), ("checkpoint every", args.checkpoint_every),
        ("checkpoints keep", args.checkpoints_keep), ("resume", args.resume),
        ("micro batch size B", B), ("sequence length T", T),
        ("total batch size", total_batch_size), ("learning rate (LR)", f"{args.lr:e}"),
        ("LR schedule", "constant" if args.final_lr_frac == 1.0 else args.lr_schedule),
        ("warmup iterations", args.warmup), ("final LR fraction", f"{args.final_lr_frac:e}"),
        ("weight decay", f"{args.weight_decay:e}"), ("skip update lossz", f"{args.skip_lossz:f}"),
        ("skip update gradz", f"{args.skip_gradz:f}"), ("max_steps", num_steps),
        ("val_loss_every", args.val_every), ("val_max_steps", val_batches),
        ("sample_every", args.sample_every), ("genT", args.gen_tokens), None,
        ("model family", args.family), ("weight init method", init_desc), *config.table_rows(),
        ("vocab compaction", "off" if vocab_map is None else
         f"{len(vocab_map)} ids of the data (--compact-vocab)"),
        ("num_parameters", model.num_parameters),
        ("backend", model.backend.name),
        ("precision", precision_text(model)),
        ("CPU GEMMs", cpu_gemms),
        *([("bf16 GEMMs", BF16_LIBRARY)] if model.precision == "bf16" else []),
        ("recompute", model.recompute), None,
        ("train tokens", train_loader.num_tokens), ("val tokens", val_loader.num_tokens),
        ("run hellaswag", f"{len(hellaswag)} of the {hellaswag_total} examples of "
                          f"{args.hellaswag_file}" if hellaswag else "no"), None,
        ("num_processes", num_processes), ("zero_stage", dist.zero_stage),
        *([("all-reduce", dist.path(model.backend))] if num_processes > 1 else []),
    ])
    processes = f" * num_processes={num_processes}" if num_processes > 1 else ""
    settings.print(f"batch_size B={B} * seq_len T={T}{processes} and total_batch_size="
                  f"{total_batch_size} => grad_accum_steps={grad_accum_steps}")

    logger = Logger(args.output_dir if rank == 0 else None, resume_step=resume_step,
                    json_path=args.json_log if rank == 0 else None)
    efficiency = None
    if args.json_log is not None or args.profile or args.peak_tflops is not None:
        efficiency = Efficiency(model, B, T, total_batch_size, num_processes, args.peak_tflops)
    if efficiency is not None and not restarted:
        logger.log_json("run", max_steps=num_steps, B=B, T=T, grad_accum_steps=grad_accum_steps,
                        num_processes=num_processes, family=args.family, init=init_desc,
                        num_parameters=model.num_parameters, vocab_size=config.vocab_size,
                        backend=model.backend.name, precision=model.precision,
                        grad_precision=model.grad_precision, master_weights=model.master_weights,
                        recompute=model.recompute, train_data=args.train_data,
                        output_dir=args.output_dir, compact_vocab=vocab_map is not None,
                        **efficiency.header())
    options = (dict(decay_steps=args.cos_decay_steps, restart_mult=args.cos_decay_restart)
               if args.lr_schedule == "cosine-restarts" else {})
    lr_scheduler = get_scheduler(args.lr_schedule, args.lr, args.warmup, num_steps,
                                 args.final_lr_frac, **options)
    step = 0
    outliers = new_outliers(args)
    if resume_step is not None:
        step = resume(args.output_dir, resume_step, model, train_loader, dist)
        if outliers is not None:
            outliers = resumed_outliers(args, resume_step)
        if not restarted:
            console.print(f"resuming from the checkpoint at step {step} in {args.output_dir}")
        if step >= num_steps:
            console.print(f"the run is at step {step} already, -x {args.max_steps} asks for "
                          f"{num_steps}: nothing to train (raise -x to go on)")
            return

    def next_step():   # grad_accum_steps micro-batches of B x T tokens, every one scored
        return Step((train_loader.next_batch() for _ in range(grad_accum_steps)),
                    total_batch_size)

    @functools.cache   # loaded at the first sample
    def sample_tokenizer():
        console.write("")  # its notes go below the last step line
        return load_sample_tokenizer(args.train_data, vocab_map)

    def sample():
        generate(model, sample_tokenizer(), args.gen_tokens, console)

    def save(step):
        write_checkpoint(args.output_dir, step, model, train_loader, args.checkpoints_keep,
                         dist, outliers=None if outliers is None else
                         {name: detector.state() for name, detector in outliers.items()})

    def checkpoint(step):
        save(step)
        console.print(f"checkpoint at step {step} written to {args.output_dir}")

    def restart_at(step, why):
        if args.output_dir is None:
            raise TrainError(f"{why}: the run would go on in a fresh process from its "
                             f"checkpoint, give it -o DIR")
        restart(args.output_dir, step, functools.partial(save, step), args.checkpoint_every,
                args.resume, why)

    loop = Loop(model, dist, console, logger, num_steps, next_step, lr_scheduler,
                (BETA1, BETA2), EPS, args.weight_decay,
                val_every=args.val_every,
                val_loss=(lambda: evaluate(model, val_loader, val_batches, dist))
                if val_batches > 0 else None,
                hellaswag=hellaswag, hellaswag_B=B,
                sample_every=args.sample_every, sample=sample if args.sample_every > 0 else None,
                checkpoint_every=args.checkpoint_every,
                save=checkpoint if args.output_dir is not None else None,
                outliers=outliers, skip_lossz=args.skip_lossz, skip_gradz=args.skip_gradz,
                hooks=hooks, restart=restart_at,
                restarts=restarts if process_steps is not None else None,
                efficiency=efficiency,
                memory_line=None if restarted else functools.partial(memory_line, model))
    loop.run(step, resuming=resume_step is not None)
    for line in loop.summary_lines():
        console.print(line)
    if efficiency is not None:
        summary = efficiency.summary()
        logger.log_json("report", **summary)
        console.print("efficiency report (llmc/report.py):")
        console.table(efficiency.table_rows(summary))
        if "profile" in summary:
            for line in profile_lines(summary, model.backend.name):
                console.print(line)
    if model.backend.summary() is not None:  # check: and profile: say what they saw
        console.print(model.backend.summary())
    if args.output_dir is not None and rank == 0:
        family = family_of(args.family)
        title = f"{family.title} {args.init or family.default_init} on {args.train_data}"
        path = plot_losses(args.output_dir, title)
        if path:
            console.print(f"loss curve written to {path}")
        console.print(f"{args.output_dir} holds the run: its checkpoint at step {num_steps} (model "
                      f"and training state), main.log{', loss.png' if path else ''}, run.json: "
                      f"python generate.py {args.output_dir} samples it, train.py -o "
                      f"{args.output_dir} -y 1 -x MORE trains it on")


def run(argv=None):
    """main() with bad input reported in one line (exit status 1), never a traceback. With many
    processes an error on any of them ends them all (llmc/distributed.py's fail)."""
    try:
        main(argv)
    except (TrainError, DataError, TokenizerError, FormatError,
            distributed.DistributedError) as e:
        distributed.fail(f"train.py: error: {e}", 1)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        distributed.fail(f"train.py: error: {where}{e.strerror or e}", 1)
    except KeyboardInterrupt as e:
        distributed.fail(f"\ntrain.py: interrupted{': ' if str(e) else ''}{e}", 130)
    except BaseException as e:  # a bug on one rank must not leave the others waiting
        distributed.abort_on_exception(e)
        raise


if __name__ == "__main__":
    run()
