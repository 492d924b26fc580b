"""
Checkpoints, as llm.c's train_gpt2.cu writes them into the output dir every -n steps:

    model_%08d.bin          the model (llm.c's checkpoint format, llmc_io.write_checkpoint)
    state_%08d_00000.bin    AdamW's m and v and the data loader (llmc_io.write_state)
    DONE_%08d               written last: the pair is complete

Each file is written whole or not at all (llmc_io.atomic_write), so a run resumes from the
newest checkpoint with a DONE, continuing bit for bit as if it had never stopped.
"""
import glob
import os
import re

import llmc_io


def checkpoint_paths(output_dir, step):
    """(model, state, DONE) paths of the checkpoint at step."""
    return (os.path.join(output_dir, f"model_{step:08d}.bin"),
            os.path.join(output_dir, f"state_{step:08d}_00000.bin"),
            os.path.join(output_dir, f"DONE_{step:08d}"))


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


def write_checkpoint(output_dir, step, model, loader, keep=0):
    """The checkpoint at step: the model, the optimizer and data loader state, then DONE.
    keep > 0 then deletes all but the newest `keep` complete checkpoints (llm.c's -nk)."""
    model_path, state_path, done_path = checkpoint_paths(output_dir, step)
    model.save(model_path)
    llmc_io.write_state(state_path, step, model.m, model.v, loader.state())
    llmc_io.atomic_write(done_path, b"")
    if keep > 0:
        for old_step in complete_steps(output_dir)[:-keep]:
            delete_checkpoint(output_dir, old_step)


def delete_checkpoint(output_dir, step):
    model_path, state_path, done_path = checkpoint_paths(output_dir, step)
    for path in (done_path, model_path, state_path):  # DONE first: never a DONE without files
        os.remove(path)


def resume(output_dir, step, model, loader):
    """Load the optimizer and data loader state of the checkpoint at step into model (already
    built from that checkpoint's model file) and loader; the step it was saved at."""
    state_path = checkpoint_paths(output_dir, step)[1]
    saved_step, m, v, loader_state = llmc_io.read_state(state_path, model.params.size)
    model.m = m
    model.v = v
    loader.load_state(loader_state, source=state_path)
    return saved_step
