"""
finetune.py as a user runs it, on a small Hugging Face model transformers makes at test time
(SmolLM2's shape, ChatML template): LoRA learns a fixed question -> answer table from chat data
with --mask-prompt as PyTorch + PEFT does (the masked validation loss after 40 steps within 2%
of theirs with the same settings), the run resumes bit for bit, its
adapter talks through generate.py --adapter and merges into every format (dev/export.py
--merge: transformers then gives the adapted model's logits), full fine-tuning runs, and bad
input is one line with nothing lost.
"""
import json
import os
import re

import numpy as np
import pytest

import finetune
import generate
from dev import export
from llmc import adapter as lora
from llmc.families import family_of_file
from tests import needs
from tests.hf_models import make_hf_model

torch = needs.package("torch")
transformers = needs.package("transformers")

WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree"]
ANSWERS = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
B, T, RANK, ALPHA = 4, 64, 8, 16.0


def chats(path, rows=None):
    with open(path, "w") as f:
        for word, answer in rows or zip(WORDS, ANSWERS):
            f.write(json.dumps({"messages": [{"role": "user", "content": word},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    make_hf_model("smollm2", root / "model")
    return root / "model", chats(root / "train.jsonl")


def run(capfd, *argv):
    finetune.run([str(a) for a in argv])
    return capfd.readouterr()


def val_losses(out):
    return [float(x) for x in re.findall(r"val loss ([0-9.]+)", out)]


def peft_val_loss(model, data_path, lr, steps, tmp_path):
    """PyTorch + PEFT's masked validation loss after the steps finetune.py takes with these
    settings: the same initial adapter (seed 0), batches, AdamW and clipping."""
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
        torch.nn.utils.clip_grad_norm_(trained, finetune.GRAD_CLIP)
        optimizer.step()
    total = count = 0
    with torch.no_grad():
        for inputs, targets in data.eval_batches(B):
            scored = int((targets >= 0).sum())
            total, count = total + loss_of(inputs, targets).item() * scored, count + scored
    return total / count


def test_lora_learns_as_peft_does_and_resumes_bit_for_bit(base, tmp_path, capfd):
    model, data = base
    common = ["-e", model, "-i", data, "-j", data, "--mask-prompt", "-b", B, "-t", T,
              "-l", 1e-2, "--rank", RANK, "--alpha", ALPHA, "-v", 20]
    out = run(capfd, *common, "-x", 40, "-o", tmp_path / "whole").out
    losses = val_losses(out)
    assert losses[-1] < 0.95 * losses[0], losses
    assert abs(losses[-1] / peft_val_loss(model, data, 1e-2, 40, tmp_path) - 1) < 0.02
    assert "trained parameters" in out and "frozen parameters" in out
    # stopped after step 20's checkpoint and resumed: the same adapter, bit for bit
    run(capfd, *common, "-x", 40, "-n", 20, "-o", tmp_path / "split")
    os.remove(os.path.join(finetune.step_dir(tmp_path / "split", 40), "DONE"))
    out = run(capfd, *common, "-x", 40, "-n", 20, "-o", tmp_path / "split", "-y", 1).out
    assert "resuming from the checkpoint at step 20" in out
    whole = lora.read_adapter_file(tmp_path / "whole" / "adapter", *targets_of(model))[1]
    split = lora.read_adapter_file(tmp_path / "split" / "adapter", *targets_of(model))[1]
    for name in whole:
        np.testing.assert_array_equal(whole[name], split[name])


def targets_of(folder):
    family, _ = family_of_file(folder)
    config = family.read_model(folder)[0]
    return config, family.model_class.LORA_TARGETS, config.n_layers


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


def test_bad_input_is_one_line(base, tmp_path, capfd):
    model, data = base
    broken = tmp_path / "broken.jsonl"
    broken.write_text(data.read_text() + "{not json\n")
    no_reply = tmp_path / "no_reply.jsonl"
    no_reply.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    cases = [(["-i", broken], f"{broken}:9:"),
             (["-i", no_reply, "--mask-prompt"], f"{no_reply}:1:"),
             (["-i", data, "--targets", "qkv"], "LoRA target 'qkv'")]
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
