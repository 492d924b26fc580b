"""
finetune.py as a user runs it, on a small Hugging Face model transformers makes at test time
(SmolLM2's shape, ChatML template): LoRA learns a rule from chat data with --mask-prompt as
PyTorch + PEFT does (the masked validation loss after 60 steps within 2% of theirs with the same
settings, and prompts held out from training answered by the rule, greedily, at least as often
as their model answers them), the run resumes bit for bit, its adapter talks through generate.py
--adapter and merges into every format (dev/export.py --merge: transformers then gives the
adapted model's logits), full fine-tuning runs, and bad input is one line with nothing lost.
Gradient accumulation: 4 micro-batches of 2 train as one batch of 8 (their answers of uneven
lengths: each micro-batch weighed by its scored targets), and resume bit for bit; and 2
processes through MPI (skipped without mpiexec) train as 1 with the step's examples.
"""
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import finetune
import generate
from dev import export
from llmc import adapter as lora
from llmc import distributed
from llmc.families import family_of_file
from llmc.loop import GRAD_CLIP
from llmc.sampler import Sampler, continue_prompt
from llmc.tokenizer import load_tokenizer
from tests import needs
from tests.hf_models import make_hf_model

torch = needs.package("torch")
transformers = needs.package("transformers")

# The rule: "FILLER MARKER" is answered by the marker's word, whatever the filler; learnt with
# TRAIN_FILLERS, asked with HELD_OUT ones never seen.  Markers and answers are single tokens of
# the test tokenizer, the fillers spelt in single letters; a random model learns to attend to
# the marker within 60 steps where its weights are drawn at 0.1 (at transformers' 0.02 its
# logits are too flat: the same steps answer a third of the prompts).
MARKERS = {"seven": "over", "lazy": "the", "hex": "tag", "owners": "caf"}
TRAIN_FILLERS = ["red", "blue", "green", "fox", "box", "moon"]
HELD_OUT_FILLERS = ["pink", "gray", "wolf"]
B, T, RANK, ALPHA = 4, 64, 8, 16.0
LR, STEPS = 3e-3, 60


def by_the_rule(fillers):
    return [(f"{filler} {marker}", answer) for filler in fillers
            for marker, answer in MARKERS.items()]


def chats(path, rows):
    with open(path, "w") as f:
        for word, answer in rows:
            f.write(json.dumps({"messages": [{"role": "user", "content": word},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    make_hf_model("smollm2", root / "model", initializer_range=0.1)
    return root / "model", chats(root / "train.jsonl", by_the_rule(TRAIN_FILLERS))


def run(capfd, *argv):
    finetune.run([str(a) for a in argv])
    return capfd.readouterr()


def val_losses(out):
    return [float(x) for x in re.findall(r"val loss ([0-9.]+)", out)]


def peft_run(model, data_path, lr, steps, tmp_path):
    """PyTorch + PEFT's model after the steps finetune.py takes with these settings (the same
    initial adapter (seed 0), batches, AdamW and clipping), and its masked validation loss."""
    import peft
    from llmc.sft_data import SFTDataset
    from llmc.tokenizer import load_tokenizer
    family, _ = family_of_file(model)
    ours = family.model_class.from_checkpoint(model)
    lora.attach(ours, RANK, ALPHA, seed=0)
    lora.write_adapter(tmp_path / "init", ours)
    data = SFTDataset(data_path, load_tokenizer(str(model)), T, mask_prompt=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf, tmp_path / "init", is_trainable=True)
    trained = [p for p in theirs.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, betas=finetune.BETAS, eps=finetune.EPS,
                                  weight_decay=0.0)

    def loss_of(inputs, targets):
        logits = theirs(torch.tensor(inputs, dtype=torch.long)).logits
        labels = torch.tensor(np.where(targets < 0, -100, targets), dtype=torch.long)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                 ignore_index=-100)
    batches = data.batches(B, seed=0)
    for _ in range(steps):
        optimizer.zero_grad()
        loss_of(*next(batches)).backward()
        torch.nn.utils.clip_grad_norm_(trained, GRAD_CLIP)
        optimizer.step()
    total = count = 0
    with torch.no_grad():
        for inputs, targets in data.eval_batches(B):
            scored = int((targets >= 0).sum())
            total, count = total + loss_of(inputs, targets).item() * scored, count + scored
    return theirs, total / count


def prompt_tokens(tokenizer, prompt):
    """The prompt as a user's turn and the assistant's to come, through the chat template."""
    return tokenizer.text_encoder(tokenizer.chat_template.render(
        [{"role": "user", "content": prompt}], add_generation_prompt=True))


def answer_rate(answer, rows):
    """The share of rows (prompt, answer) that answer(prompt) gets right."""
    return sum(answer(prompt) == want for prompt, want in rows) / len(rows)


def dashboard_shows_the_report(run_dir):
    """The run's log.jsonl, drawn by dev/dashboard.py: the trained and frozen parameters, the
    masked share, scored tokens/s (the last step's beside the mean), memory by kind."""
    from dev import dashboard
    d = dashboard.Dashboard(str(run_dir / "log.jsonl"), background=False)
    assert d.poll() and d.done()
    console = dashboard.Console(width=100, record=True, file=io.StringIO())
    console.print(d.render(100))
    text = console.export_text()
    head, report = d.head, d.report
    assert head["trained_parameters"] + head["frozen_parameters"] == head["num_parameters"]
    assert f"trained {head['trained_parameters']:,} of {head['num_parameters']:,}" in text
    assert f"{100 * head['masked_share']:.1f}% of targets masked" in text
    assert re.search(rf"scored tokens/s +{d.last['tokens_per_s']:,.0f} +"
                     rf"{report['tokens_per_s']:,.0f}", text)
    assert f"activations {report['memory']['activations'] / 2 ** 20:.1f} MiB" in text
    assert 0 < report["masked_share"] < 1


def test_lora_learns_as_peft_does_and_resumes_bit_for_bit(base, tmp_path, capfd):
    model, data = base
    common = ["-e", model, "-i", data, "-j", data, "--mask-prompt", "-b", B, "-t", T,
              "-l", LR, "--rank", RANK, "--alpha", ALPHA, "-v", 20, "-x", STEPS, "-n", STEPS // 2,
              "-o", tmp_path / "run"]
    out = run(capfd, *common).out
    losses = val_losses(out)
    assert losses[-1] < 0.1 * losses[0], losses
    theirs, their_loss = peft_run(model, data, LR, STEPS, tmp_path)
    assert abs(losses[-1] / their_loss - 1) < 0.02
    assert "trained parameters" in out and "frozen parameters" in out
    dashboard_shows_the_report(tmp_path / "run")

    # the prompts held out, answered greedily: ours at least as often as PEFT's model, which
    # answers most of them (the rule can be learnt from these examples)
    tokenizer = load_tokenizer(str(model))
    family, _ = family_of_file(model)
    ours = family.model_class.from_checkpoint(model)
    lora.read_adapter(tmp_path / "run" / "adapter", ours)

    def our_answer(prompt):
        return tokenizer.decode(list(continue_prompt(ours, prompt_tokens(tokenizer, prompt), 4,
                                                     Sampler(temperature=0),
                                                     tokenizer.stop_tokens)))

    def their_answer(prompt):
        tokens = prompt_tokens(tokenizer, prompt)
        reply = []
        with torch.no_grad():
            while len(reply) < 4:
                token = int(theirs(torch.tensor([tokens + reply])).logits[0, -1].argmax())
                if token in tokenizer.stop_tokens:
                    break
                reply.append(token)
        return tokenizer.decode(reply)
    held_out = by_the_rule(HELD_OUT_FILLERS)
    their_rate = answer_rate(their_answer, held_out)
    assert their_rate >= 0.75, their_rate
    assert answer_rate(our_answer, held_out) >= their_rate

    # stopped after the checkpoint half way and resumed: the same adapter, bit for bit, and
    # the same main.log
    whole = lora.read_adapter_file(tmp_path / "run" / "adapter", *targets_of(model))[1]
    whole_log = (tmp_path / "run" / "main.log").read_text()
    os.remove(os.path.join(finetune.step_dir(tmp_path / "run", STEPS), "DONE"))
    out = run(capfd, *common, "-y", 1).out
    assert f"resuming from the checkpoint at step {STEPS // 2}" in out
    assert (tmp_path / "run" / "main.log").read_text() == whole_log
    resumed = lora.read_adapter_file(tmp_path / "run" / "adapter", *targets_of(model))[1]
    for name in whole:
        np.testing.assert_array_equal(whole[name], resumed[name])


def targets_of(folder):
    family, _ = family_of_file(folder)
    config = family.read_model(folder)[0]
    return config, family.model_class.LORA_TARGETS, config.n_layers


# answers of 1 to 3 tokens: micro-batches that score different numbers of targets; 10 examples
# in steps of 8: an epoch is a step of 8, then one of 2 and 6 rows of padding
UNEVEN = [("red", "over"), ("blue", "the the"), ("green", "tag"), ("fox", "caf caf caf"),
          ("box", "over"), ("moon", "seven lazy"), ("pink", "hex"), ("gray", "the"),
          ("wolf", "owners owners"), ("cat", "tag")]
ACCUMULATING = ["--mask-prompt", "-t", T, "-l", 1e-2, "-x", 4, "-v", 2, "-n", 3]
STEP_LINE = re.compile(r"^step\s+\d+/\d+ \| loss (\S+) \| norm (\S+) \|", re.M)
MPI_ENV = dict(OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


@pytest.fixture(scope="module")
def accumulated(base, tmp_path_factory):
    """One process, 4 micro-batches of 2 a step (-b 2 -d 8), 4 steps with a checkpoint at 3
    (inside the second epoch): its folder, data and what it printed."""
    model, _ = base
    root = tmp_path_factory.mktemp("accumulated")
    data = chats(root / "uneven.jsonl", UNEVEN)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        finetune.run([str(a) for a in ("-e", model, "-i", data, "-j", data, *ACCUMULATING,
                                       "-b", 2, "-d", 8, "-o", root / "run")])
    return root / "run", data, printed.getvalue()


def assert_trains_alike(out, folder, want_out, want_folder, model):
    """The same step losses, norms and val losses, as printed, and adapter (to 1e-3 of each
    tensor's largest, measured 4e-5: AdamW's steps, a gradient over the root of its square's
    average, magnify a difference in rounding of a gradient near zero)."""
    assert len(STEP_LINE.findall(want_out)) == 4
    assert np.allclose(np.float64(STEP_LINE.findall(out)),
                       np.float64(STEP_LINE.findall(want_out)), rtol=0, atol=2e-6)
    assert np.allclose(val_losses(out), val_losses(want_out), rtol=0, atol=2e-6)
    got = lora.read_adapter_file(folder / "adapter", *targets_of(model))[1]
    want = lora.read_adapter_file(want_folder / "adapter", *targets_of(model))[1]
    for name in want:
        assert np.abs(got[name] - want[name]).max() <= 1e-3 * np.abs(want[name]).max(), name


def test_micro_batches_train_as_one_batch_and_resume_bit_for_bit(base, accumulated, tmp_path,
                                                                 capfd):
    model, _ = base
    folder, data, out = accumulated
    assert "| examples a step       | 8: 4 micro-batch(es) of B on each of 1 process(es)" in out
    one = run(capfd, "-e", model, "-i", data, "-j", data, *ACCUMULATING, "-b", 8,
              "-o", tmp_path / "one").out
    assert_trains_alike(out, folder, one, tmp_path / "one", model)
    # stopped after step 3 and resumed (MLX-LM's flag saying -d 8): the same step, bit for bit
    shutil.copytree(folder, tmp_path / "resumed")
    os.remove(os.path.join(finetune.step_dir(tmp_path / "resumed", 4), "DONE"))
    resumed = run(capfd, "-e", model, "-i", data, "-j", data, *ACCUMULATING, "-b", 2,
                  "--grad-accumulation-steps", 4, "-o", tmp_path / "resumed", "-y", 1).out
    assert STEP_LINE.findall(resumed) == STEP_LINE.findall(out)[3:]
    assert ((tmp_path / "resumed" / "adapter" / lora.ADAPTER_WEIGHTS).read_bytes() ==
            (folder / "adapter" / lora.ADAPTER_WEIGHTS).read_bytes())


def test_two_processes_train_as_one(base, accumulated, tmp_path, mpiexec):
    """2 ranks x 2 micro-batches of 2 a step through MPI: one process's 4; only LoRA's gradients
    all-reduced, and only rank 0 logs."""
    model, _ = base
    folder, data, out = accumulated
    env = {k: v for k, v in os.environ.items()
           if k not in distributed.LAUNCHER_SIZE_VARIABLES + distributed.LAUNCHER_RANK_VARIABLES}
    argv = ("-e", model, "-i", data, "-j", data, *ACCUMULATING, "-b", 2, "-d", 8,
            "-o", tmp_path / "two")
    two = subprocess.run([mpiexec, "-n", "2", sys.executable, finetune.__file__,
                          *map(str, argv)], env=dict(env, **MPI_ENV), capture_output=True,
                         text=True, timeout=300)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr
    assert ("| examples a step       | 8: 2 micro-batch(es) of B on each of 2 process(es)"
            in two.stdout)
    trained = re.search(r"\| trained parameters +\| ([0-9,]+) ", two.stdout).group(1)
    assert (f"| all-reduce            | {trained} gradients a step, MPI on the host memory, "
            f"in place") in two.stdout
    assert_trains_alike(two.stdout, tmp_path / "two", out, folder, model)
    log = (tmp_path / "two" / "main.log").read_text()
    assert log.count("trl:") == 4, log


def test_the_adapter_generates_and_merges(base, tmp_path, capfd):
    model, data = base
    run(capfd, "-e", model, "-i", data, "--mask-prompt", "-b", 4, "-t", 64, "-l", 3e-3,
        "-x", 10, "-o", tmp_path / "run")
    adapter = tmp_path / "run" / "adapter"
    generate.main([str(model), "--adapter", str(adapter), "-p", "red", "-n", "4",
                   "--temperature", "0"])
    assert "adapter:" in capfd.readouterr().err
    export.main([str(model), "--format", "hf", "-o", str(tmp_path / "merged"), "--merge",
                 str(adapter)])
    family, _ = family_of_file(model)
    ours = family.model_class.from_checkpoint(model)
    lora.read_adapter(adapter, ours)
    tokens = np.random.default_rng(0).integers(0, 400, (2, 12))
    ours.forward(tokens)
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged",
                                                               dtype=torch.float32)
    with torch.no_grad():
        want = merged(torch.tensor(tokens)).logits.numpy()
    assert abs(ours.logits[..., :want.shape[-1]] - want).max() <= 1e-5 * abs(want).max()


def test_full_fine_tuning(base, tmp_path, capfd):
    model, data = base
    out = run(capfd, "-e", model, "-i", data, "-j", data, "--method", "full", "-b", 4,
              "-t", 64, "-l", 1e-3, "-x", 10, "-v", 10, "-o", tmp_path / "full").out
    losses = val_losses(out)
    assert losses[-1] < losses[0]
    assert (tmp_path / "full" / "model.bin").exists()


def test_full_fine_tuning_with_bf16_gradients_and_no_master_weights(base, tmp_path, capfd):
    """--grad-precision bf16 -w 0 (train.py's): it learns as the run with float32 gradients and
    master weights does, within bf16's rounding, and resumes bit for bit (its state has no
    master weights: the model file's bf16 parameters are all there is); LoRA refuses both."""
    model, data = base
    common = ["-e", model, "-i", data, "-j", data, "--method", "full", "-b", 4, "-t", 64,
              "-l", 1e-3, "-v", 2, "--precision", "bf16"]
    lean = ["--grad-precision", "bf16", "-w", 0]
    full = val_losses(run(capfd, *common, "-x", 6, "-o", tmp_path / "full").out)
    straight = val_losses(run(capfd, *common, *lean, "-x", 6, "-n", 2, "-nk", 2,
                              "-o", tmp_path / "lean").out)
    assert straight[-1] < straight[0] and abs(straight[-1] - full[-1]) < 0.05 * full[-1]
    # stopped after the checkpoint at step 4 and resumed: the same model file, byte for byte,
    # and main.log (step 4's val loss, taken before its checkpoint, not taken again); -nk 2
    # kept the newest two checkpoints
    shutil.copytree(tmp_path / "lean", tmp_path / "resumed")
    os.remove(os.path.join(finetune.step_dir(tmp_path / "resumed", 6), "DONE"))
    resumed = val_losses(run(capfd, *common, *lean, "-x", 6, "-n", 2, "-nk", 2,
                             "-o", tmp_path / "resumed", "-y", 1).out)
    assert resumed == straight[-1:]
    for name in ("model.bin", "main.log"):
        assert (tmp_path / "resumed" / name).read_bytes() == (tmp_path / "lean" / name).read_bytes()
    for run_dir in ("lean", "resumed"):   # -nk 2: the newest two checkpoints
        assert sorted(p.name for p in (tmp_path / run_dir).glob("step_*")) == [
            "step_00000004", "step_00000006"]
    for flag in (["--grad-precision", "bf16"], ["-w", 0]):
        with pytest.raises(SystemExit) as e:
            finetune.run(["-e", str(model), "-i", str(data), "--precision", "bf16",
                          *map(str, flag)])
        assert e.value.code == 2
        assert "is full fine-tuning's at --precision bf16" in capfd.readouterr().err


def test_bad_input_is_one_line(base, tmp_path, capfd):
    model, data = base
    broken = tmp_path / "broken.jsonl"
    broken.write_text(data.read_text() + "{not json\n")
    no_reply = tmp_path / "no_reply.jsonl"
    no_reply.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    cases = [(["-i", broken], f"{broken}:{len(by_the_rule(TRAIN_FILLERS)) + 1}:"),
             (["-i", no_reply, "--mask-prompt"], f"{no_reply}:1:"),
             (["-i", data, "--targets", "qkv"], "LoRA target 'qkv'"),
             (["-i", data, "-b", 4, "-d", 6], "-d 6: must be a multiple of -b 4 times 1 "
                                              "process(es), 4")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as e:
            finetune.run(["-e", str(model), *map(str, argv)])
        assert message in str(e.value) and "\n" not in str(e.value), e.value
    # -y 1 with another method: refused, the run as it was
    run(capfd, "-e", model, "-i", data, "-b", 4, "-t", 64, "-x", 2, "-o", tmp_path / "r")
    before = sorted(os.listdir(tmp_path / "r"))
    with pytest.raises(SystemExit) as e:
        finetune.run(["-e", str(model), "-i", str(data), "-b", "4", "-t", "64", "-x", "2",
                      "-o", str(tmp_path / "r"), "-y", "1", "--method", "full"])
    assert "method 'full' (the run's: 'lora')" in str(e.value)
    assert sorted(os.listdir(tmp_path / "r")) == before
    # an adapter of another base: its shapes differ
    other = make_hf_model("smollm2", tmp_path / "wider", hidden_size=48, num_attention_heads=3)
    del other
    with pytest.raises(SystemExit) as e:
        finetune.run(["-e", str(tmp_path / "wider"), "-i", str(data), "--adapter",
                      str(tmp_path / "r" / "adapter"), "-x", "1"])
    assert "another base model" in str(e.value)


def test_ctrl_c_says_how_to_resume(base, tmp_path):
    model, data = base
    out = tmp_path / "run"
    command = [sys.executable, os.path.join(os.path.dirname(finetune.__file__), "finetune.py"),
               "-e", str(model), "-i", str(data), "-b", "4", "-t", "64", "-x", "100000",
               "-n", "1", "-o", str(out)]
    # SIGINT's default action in the child (a shell running the tests in the background
    # leaves it ignored, and Python then never raises KeyboardInterrupt)
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as process:
        try:
            while not list(out.glob("step_*/DONE")) and process.poll() is None:
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            stderr = process.stderr.read()
        finally:
            process.kill()
    assert process.returncode == 130, stderr
    step = finetune.newest_step(out)
    assert stderr.strip().splitlines()[-1] == (
        f"finetune.py: interrupted: step {step} is saved in {out}: the same command with -y 1 "
        f"resumes it")
