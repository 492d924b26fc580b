"""
Checkpoints, as llm.c's train_gpt2.cu writes them into the output dir every -n steps:

    model_%08d.bin          the model (llm.c's checkpoint format: llmc/formats/llmc.py)
    state_%08d_%05d.bin     per process (rank): its AdamW m and v (of its shard under ZeRO-1),
                            at bf16 the float32 master weights of that shard, and its data
                            loader (llmc.formats.llmc.write_state)
    outliers_%08d.json      with train.py -sl/-sg: the outlier detectors' windows, by rank 0
                            (llm.c's files have no room for them; llmc/outlier_detector.py)
    DONE_%08d               written last, by rank 0 once every rank's files are: complete

Each file is written whole or not at all (llmc.formats.atomic_write), so a run resumes from the
newest checkpoint with a DONE, continuing bit for bit as if it had never stopped. Rank 0
writes the model (the same on every rank); a run resumes only with the number of processes it
was written by (llmc/distributed.py), else one line says so.

Precision (train.py --precision): at bf16 the model file is the run's precision where the
family's format has one (GPT-2: llm.c's version 5, the bf16 parameters the kernels read,
Model.params_as_run; Llama: llama2.c's files are float32, so the master weights), and the
state holds the float32 master weights, as llm.c's use_master_weights. A resume takes the
master weights from the state and the bf16 parameters from a bf16 model file, else rounds
them from the master weights with the seed of the last update, as that update did; a state
of the other precision is refused in one line.  Without master weights (train.py -w 0, llm.c's
use_master_weights 0) the state holds none, and the model file's bf16 parameters (Llama's
float32 file holds them exactly) are all a resume needs.  At fp16 the model file is float32 (llm.c's has
no fp16 version: the master weights, the fp16 parameters rounded from them to nearest) and the
state keeps the loss scale.

An output dir holds one run: run.json is its configuration (model, B, T, data), which a
resume must match (run_differences), as it must the number of processes of the training
state (resume); -nk's rotation deletes only checkpoints older than the one just written.

A backend may run only so many steps in a process (the ANE's static pipeline: a compile budget
per process, accel/hooks.py's process_steps and before_step); the run then goes on in a fresh
one from its checkpoint (restart): the same command line with -y 1, replacing the process.
"""
import glob
import json
import os
import re
import signal
import sys

import numpy as np

from llmc.distributed import SINGLE
from llmc.formats import FormatError, atomic_write, model_format
from llmc.formats.hf_tokenizer import is_hf_tokenizer
from llmc.formats.llmc import (checkpoint_dtype, read_state_processes, read_training_state,
                               write_state)
from llmc.tokenizer import TOKENIZERS_BESIDE_DATA, tokenizer_beside_shards


def checkpoint_paths(output_dir, step, process_rank=0):
    """(model, state of process_rank, DONE) paths of the checkpoint at step."""
    return (os.path.join(output_dir, f"model_{step:08d}.bin"),
            os.path.join(output_dir, f"state_{step:08d}_{process_rank:05d}.bin"),
            os.path.join(output_dir, f"DONE_{step:08d}"))


def outliers_path(output_dir, step):
    """The path of the outlier detectors' side file of the checkpoint at step."""
    return os.path.join(output_dir, f"outliers_{step:08d}.json")


def checkpoint_files(output_dir):
    """The names of the checkpoint files (model, state, outliers, DONE of any step) in
    output_dir, sorted."""
    pattern = re.compile(r"model_\d{8}\.bin|state_\d{8}_\d{5}\.bin|outliers_\d{8}\.json|"
                         r"DONE_\d{8}")
    return sorted(name for name in os.listdir(output_dir) if pattern.fullmatch(name))


def complete_steps(output_dir):
    """The steps of the complete checkpoints in output_dir (a DONE and both files), sorted."""
    steps = []
    for done in glob.glob(os.path.join(output_dir, "DONE_*")):
        m = re.fullmatch(r"DONE_(\d{8})", os.path.basename(done))
        if m and all(os.path.exists(p) for p in checkpoint_paths(output_dir, int(m.group(1)))[:2]):
            steps.append(int(m.group(1)))
    return sorted(steps)


def find_max_step(output_dir):
    """The step of the newest complete checkpoint in output_dir, or None."""
    return max(complete_steps(output_dir), default=None)


def write_checkpoint(output_dir, step, model, loader, keep=0, dist=SINGLE, outliers=None):
    """The checkpoint at step: the model, the optimizer and data loader state, the outlier
    detectors' state when given (a dict, written as JSON), then DONE. keep > 0 then deletes the
    older complete checkpoints but the newest keep - 1 (llm.c's -nk; never this one). With many
    processes (dist, llmc/distributed.py) every one of them calls this."""
    rank = dist.process_rank
    model_path, state_path, done_path = checkpoint_paths(output_dir, step, rank)
    if rank == 0:
        model.save(model_path)
        if outliers is not None:
            atomic_write(outliers_path(output_dir, step), (json.dumps(outliers) + "\n").encode())
    master, last_update, loss_scale = None, 0, {}
    if model.master_weights:   # the float32 master weights of the optimizer shard
        start, end = model.optimizer_shard
        master, last_update = model.params[start:end], model.step
    if model.precision == "fp16":
        loss_scale = dict(loss_scale=model.loss_scale, loss_scale_steps=model.loss_scale_steps)
    write_state(state_path, step, model.m, model.v, loader.state(),
                dist.num_processes, rank, master=master, last_update=last_update, **loss_scale)
    dist.barrier()  # every rank's state is written
    if rank == 0:
        atomic_write(done_path, b"")
    if keep > 0:
        dist.barrier()  # every rank sees the new DONE ...
        old_steps = rotated_out(complete_steps(output_dir), step, keep)
        dist.barrier()  # ... before rank 0 deletes any
        for old_step in old_steps:
            delete_checkpoint(output_dir, old_step, rank)


def rotated_out(steps, step, keep):
    """Of a run's complete checkpoints' steps (sorted), those -nk keep deletes once the one at
    step is written: every older one but the newest keep - 1 (step itself always stays)."""
    older = [s for s in steps if s < step]
    return older[:max(len(older) - (keep - 1), 0)]


def newest_model_file(path):
    """path itself (a model file, or a Hugging Face model folder: it holds config.json), or for
    a run's output dir (train.py -o) the model file of its newest complete checkpoint;
    FormatError when the dir has none."""
    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "config.json")):
        return path
    step = find_max_step(path)
    if step is None:
        raise FormatError(path, "a directory without a complete checkpoint (train.py -o DIR -n N "
                                "writes them)")
    return checkpoint_paths(path, step)[0]


def delete_checkpoint(output_dir, step, process_rank=0):
    """Rank 0 deletes DONE, the model, its state and its outliers; another rank its state."""
    model_path, state_path, done_path = checkpoint_paths(output_dir, step, process_rank)
    # DONE first: never a DONE without files
    for path in (done_path, model_path, state_path) if process_rank == 0 else (state_path,):
        os.remove(path)
    if process_rank == 0 and os.path.exists(outliers_path(output_dir, step)):
        os.remove(outliers_path(output_dir, step))


# set in the environment of a process that restart() started: the restarts of the run so far
RESTARTS_ENV = "LLMPYX_RESTARTS"
# for the test of a kill between a restart's checkpoint and its exec(): SIGKILL there when set
KILL_BEFORE_RESTART_ENV = "LLMPYX_KILL_BEFORE_RESTART"


def restarts():
    """How many times the run restarted itself before this process (0: its own start)."""
    return int(os.environ.get(RESTARTS_ENV, "0"))


def restart(output_dir, step, save, checkpoint_every, resuming, reason):
    """Go on with the run in a fresh process from its checkpoint at step, because the backend
    cannot run step in this one (reason, one line): save() the checkpoint unless the schedule
    (-n checkpoint_every) wrote it, delete the ones only earlier restarts wrote (so the last
    stays), say so in one line, and replace the process with the same command line resuming
    (-y 1, unless it is a resume already)."""
    if step not in complete_steps(output_dir):
        save()
    for old in complete_steps(output_dir):
        if old < step and (checkpoint_every <= 0 or old % checkpoint_every):
            delete_checkpoint(output_dir, old)
    number = restarts() + 1
    print(f"{reason}: checkpoint at step {step}, exec() restart {number}", flush=True)
    sys.stderr.flush()
    if os.environ.get(KILL_BEFORE_RESTART_ENV):
        os.kill(os.getpid(), signal.SIGKILL)
    argv = [sys.executable] + sys.orig_argv[1:] + ([] if resuming else ["-y", "1"])
    os.execve(sys.executable, argv, dict(os.environ, **{RESTARTS_ENV: str(number)}))


def resume(output_dir, step, model, loader, dist=SINGLE):
    """Load the optimizer and data loader state of the checkpoint at step into model (already
    built from that checkpoint's model file) and loader, at bf16 the master weights too (none
    without them, -w 0: the model file's bf16 parameters are all there is); the step it was
    saved at."""
    # every rank checks rank 0's state first, so that all fail alike (one line) on a mismatch
    processes, _ = read_state_processes(checkpoint_paths(output_dir, step)[1])
    if processes != dist.num_processes:
        raise FormatError(output_dir, f"the checkpoint at step {step} was written by "
                          f"{processes} process{'es' if processes > 1 else ''}, this run "
                          f"has {dist.num_processes}: resume with as many (mpirun -np "
                          f"{processes})")
    model_path, state_path, _ = checkpoint_paths(output_dir, step, dist.process_rank)
    state = read_training_state(state_path, model.m.size, dist.num_processes, dist.process_rank)
    mixed = model.master_weights and model.precision != "fp32"
    written = ("fp32" if state.master is None else "fp16" if state.loss_scale is not None else
               "bf16")
    if state.master is None and mixed:
        raise FormatError(state_path, f"holds no master weights (an fp32 run's state, or a -w 0 "
                                      f"one's), this run is {model.precision} with them: resume "
                                      f"it with --precision fp32, or -w 0")
    if state.master is not None and written != model.precision:
        raise FormatError(state_path, f"holds the float32 master weights of a {written} run, "
                                      f"this run is {model.precision}: resume it with "
                                      f"--precision {written}")
    if state.master is not None and not mixed:
        raise FormatError(state_path, f"holds the float32 master weights of a {written} run, "
                                      f"this run keeps none (-w 0): resume it with -w 1")
    model.m = state.m
    model.v = state.v
    if mixed:
        restore_master_weights(model, model_path, state, dist)
    if state.loss_scale is not None:
        model.set_loss_scale(state.loss_scale, state.loss_scale_steps)
    loader.load_state(state.loader_state, source=state_path)
    return state.step


def restore_master_weights(model, model_path, state, dist):
    """A bf16 resume: the master weights of this rank's shard from its state, the others' by
    an all-gather (ZeRO-1); the bf16 parameters are the model file's when it holds bf16 ones
    (as built from it), else the master weights rounded as the last update rounded them (its
    t the seed; to nearest, as the model file was read, when there was none)."""
    start, end = model.optimizer_shard
    master = np.array(model.params)   # the model file's, where the shard does not reach
    master[start:end] = state.master
    model.set_master_weights(master)
    dist.gather_parameters(model, rounding=False)
    model.step = state.last_update
    bf16_file = model_format(model_path) == "llmc" and checkpoint_dtype(model_path) == "bfloat16"
    if not bf16_file and state.last_update > 0:
        model.round_params(state.last_update)


def read_json(path, what):
    """The JSON document in the file at path, or None when there is no such file; FormatError
    when it is not JSON."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:
        raise FormatError(path, f"not {what} ({e})") from None


def read_outliers(output_dir, step):
    """The outlier detectors' state saved with the checkpoint at step, or None when it has
    none (written without -sl/-sg, or by llm.c)."""
    return read_json(outliers_path(output_dir, step), "the outlier detectors' state")


# ----------------------------------------------------------------------------
# the run an output dir holds

RUN_NAME = "run.json"


def write_run_config(output_dir, config):
    """DIR/run.json: the run's configuration, a dict of what a resume must match."""
    atomic_write(os.path.join(output_dir, RUN_NAME),
                 (json.dumps(config, indent=1) + "\n").encode())


def model_tokenizer(path):
    """(where the tokenizer of the model at path is, why there, in words), the one lookup
    every tool makes: a GGUF file's own vocabulary, or a Hugging Face model folder's own
    tokenizer.json; else the one its run trained on (beside the training data of the run.json
    beside it); else a tokenizer.bin or tokenizer.json beside it; else ("gpt2", ...):
    GPT-2's."""
    run = read_run_config(os.path.dirname(path) or ".")
    beside = [p for p in (os.path.join(os.path.dirname(path), name)
                          for name in TOKENIZERS_BESIDE_DATA) if os.path.exists(p)]
    if model_format(path) == "gguf":
        return path, "the GGUF file's own vocabulary"
    if os.path.isdir(path) and is_hf_tokenizer(path):
        return path, "the model folder's own tokenizer.json"
    if run is not None and "-i" in run and tokenizer_beside_shards(run["-i"]):
        return tokenizer_beside_shards(run["-i"]), "the training data's"
    if beside:
        return beside[0], "the one beside the model"
    return "gpt2", "GPT-2's, none beside the model or its data"


def read_run_config(output_dir):
    """The configuration in output_dir's run.json, or None when it has none (a run of an older
    llm.pyx, or llm.c's)."""
    return read_json(os.path.join(output_dir, RUN_NAME), "a run configuration")


def run_differences(output_dir, config, defaults=None):
    """What differs between config and the run.json in output_dir, as "KEY SAVED (this run:
    NEW)" strings; none when the dir has no run.json. defaults: the value of a key that a
    run.json written before the key existed lacks; a key it lacks without one is not
    compared."""
    saved = read_run_config(output_dir)
    if saved is None:
        return []
    defaults = defaults or {}
    differences = []
    for key, value in config.items():
        if key not in saved and key not in defaults:   # a setting it did not record
            continue
        was = saved.get(key, defaults.get(key))
        if was != value:
            differences.append(f"{key} {was} (this run: {value})")
    return differences
