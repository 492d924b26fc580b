"""
LoRA (llmc/adapter.py, Model.attach_lora, kernels/lora.pyx) against PEFT on transformers' model:
the same adapter (PEFT writes it, we read it), the same batches and AdamW settings, dropout 0:
each step's loss within 1e-5 relative of PyTorch + PEFT's for 20 steps, and the adapters after
them within fp32 rounding; PEFT loads our adapter back with the same logits.  The kernel against
float64 NumPy, the frozen parameters' gradients never allocated, bf16 within the bf16
tolerances, and each bad adapter refused in one line.  Planted faults (the scale alpha/r
dropped, B's rows left in PEFT's order) fail.  Dropout (lora_dropout): the kernel drops a
fraction p and scales the rest, a training step's loss and gradients equal PEFT's given our
masks (also with every layer recomputed), evaluation is the no-dropout model's bit for bit,
and finetune.py --dropout resumes bit for bit.
"""
import json
import os
import shutil

import numpy as np
import pytest

from kernels import lora as lora_kernel
from llmc import adapter as lora
from llmc.families import family_of_file
from llmc.formats import FormatError
from test_gpt2 import BF16_LOSS_TOL
from tests import needs
from tests.hf_models import make_hf_model

torch = needs.package("torch")
needs.package("transformers")
peft = needs.package("peft")

B, T, STEPS = 2, 16, 20
RANK, ALPHA = 4, 8.0
LR, BETAS, EPS, DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_kernel_against_float64():
    rng = np.random.default_rng(0)
    N, C, OC, R, scale = 37, 50, 70, 5, 2.5
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    inp, A, Bm, out, dout = f32(N, C), f32(R, C), f32(OC, R), f32(N, OC), f32(N, OC)
    expected_out = out + scale * (inp.astype(float) @ A.T) @ Bm.T
    hidden = np.zeros((N, R), np.float32)
    lora_kernel.forward(out, hidden, inp, A, Bm, scale)
    np.testing.assert_allclose(out, expected_out, atol=1e-5 * abs(expected_out).max())
    dinp, dA, dB = f32(N, C), f32(R, C), f32(OC, R)
    dhidden = np.zeros((N, R), np.float32)
    dh = scale * dout.astype(float) @ Bm
    expected = (dinp + dh @ A, dA + dh.T @ inp, dB + scale * dout.T.astype(float) @ hidden)
    lora_kernel.backward(dinp, dA, dB, dhidden, dout, inp, hidden, A, Bm, scale)
    for got, want in zip((dinp, dA, dB), expected):
        np.testing.assert_allclose(got, want, atol=1e-5 * abs(want).max())


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(folder, PEFT's adapter folder) of a grouped-query Llama (TinyLlama's shape), PEFT's
    default init (B zero) on all seven projections of every layer."""
    root = tmp_path_factory.mktemp("lora")
    make_hf_model("tinyllama", root / "base")
    hf = make_hf_model("tinyllama", root / "base_copy")
    model = peft.get_peft_model(hf, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                    target_modules=ALL))
    model.save_pretrained(root / "peft")
    return root / "base", root / "peft"


def batches(seed=0):
    """STEPS batches (inputs, targets) of random tokens, a few targets masked (-1)."""
    rng = np.random.default_rng(seed)
    for _ in range(STEPS):
        tokens = rng.integers(0, 400, (B, T + 1)).astype(np.int32)
        targets = tokens[:, 1:].copy()
        targets[:, :3] = -1   # a prompt, unscored
        yield tokens[:, :-1], targets


def peft_run(folder, adapter):
    """PyTorch + PEFT: the losses of STEPS AdamW steps, and the adapter's tensors after them."""
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(hf, adapter, is_trainable=True)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=LR, betas=BETAS, eps=EPS, weight_decay=DECAY)
    losses = []
    for inputs, targets in batches():
        logits = model(torch.tensor(inputs, dtype=torch.long)).logits
        labels = torch.tensor(np.where(targets < 0, -100, targets), dtype=torch.long)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 labels.reshape(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    state = {name.replace(".default", ""): p.detach().numpy().copy()
             for name, p in model.named_parameters() if p.requires_grad}
    return losses, state


def our_model(folder, adapter, precision="fp32", **settings):
    family, _ = family_of_file(folder)
    model = family.model_class.from_checkpoint(folder, precision=precision)
    lora.read_adapter(adapter, model, **settings)
    return model


def our_run(model):
    losses = []
    for t, (inputs, targets) in enumerate(batches(), start=1):
        model.zero_grad()
        losses.append(model.forward(inputs, targets))
        model.backward()
        model.update(LR, BETAS[0], BETAS[1], EPS, DECAY, t)
    return losses


@pytest.fixture(scope="module")
def peft_result(base):
    return peft_run(*base)


def test_twenty_steps_equal_peft(base, peft_result):
    folder, adapter = base
    peft_losses, peft_state = peft_result
    model = our_model(folder, adapter)
    losses = our_run(model)
    np.testing.assert_allclose(losses, peft_losses, rtol=1e-5)
    ours = lora.peft_tensors(model)
    assert sorted(ours) == sorted(peft_state)
    for name, tensor in ours.items():
        want = peft_state[name]
        assert abs(tensor - want).max() <= 1e-4 * abs(want).max(), name
    assert model.memory()["grads"] == model.lora_layout.nbytes   # none of the frozen's


def test_bf16_steps_within_the_bf16_tolerance(base, peft_result):
    """At bf16 (the parameters frozen in bf16, no float32 master copy of them; the adapters
    float32) the losses stay within test_gpt2.py's bf16 loss tolerance of PEFT's fp32 ones."""
    model = our_model(*base, precision="bf16")
    losses = our_run(model)
    np.testing.assert_allclose(losses, peft_result[0], rtol=BF16_LOSS_TOL)
    assert model.memory()["params"] == model.num_parameters * 2 + model.lora_layout.nbytes


def test_peft_loads_our_adapter(base, tmp_path):
    import transformers
    folder, adapter = base
    model = our_model(folder, adapter)
    our_run(model)   # an adapter with B no longer zero
    lora.write_adapter(tmp_path / "ours", model)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf, tmp_path / "ours").eval()
    inputs, _ = next(batches(seed=5))
    with torch.no_grad():
        want = theirs(torch.tensor(inputs, dtype=torch.long)).logits.numpy()
    model.forward(inputs)
    got = model.logits[..., :want.shape[-1]]
    assert abs(got - want).max() <= 1e-5 * abs(want).max()
    again = our_model(folder, tmp_path / "ours")
    np.testing.assert_array_equal(again.lora_params, model.lora_params)


def test_planted_fault_scale_dropped(base, peft_result, monkeypatch):
    read = lora.read_adapter_file

    def unscaled(*args):   # alpha = r: the scale alpha / r is 1
        settings, stacks = read(*args)
        return settings._replace(alpha=float(settings.rank)), stacks
    monkeypatch.setattr(lora, "read_adapter_file", unscaled)
    losses = our_run(our_model(*base))
    assert not np.allclose(losses, peft_result[0], rtol=1e-5)


def test_planted_fault_rows_not_reordered(base, tmp_path, monkeypatch):
    """B of q and k written in our row order: PEFT's model is then another one."""
    monkeypatch.setattr(lora, "hf_rotate_half_rows", lambda w, heads: w)
    with pytest.raises(AssertionError):
        test_peft_loads_our_adapter(base, tmp_path)


def test_an_adapter_we_do_not_implement_is_refused_in_one_line(base, tmp_path):
    folder, adapter = base
    cases = {"use_dora": (True, "DoRA"), "use_rslora": (True, "rank-stabilised"),
             "target_modules": ("q_proj|v_proj", "as a list"),
             "layers_to_transform": ([7], "the model has 2 layers")}
    for key, (value, message) in cases.items():
        broken = tmp_path / key
        shutil.copytree(adapter, broken)
        settings = json.loads((broken / lora.ADAPTER_CONFIG).read_text())
        (broken / lora.ADAPTER_CONFIG).write_text(json.dumps(dict(settings, **{key: value})))
        with pytest.raises(FormatError, match=message) as e:
            our_model(folder, broken)
        assert "\n" not in str(e.value)
    with pytest.raises(FormatError, match="not a LoRA adapter folder"):
        our_model(folder, tmp_path)


def test_a_backend_without_lora_kernels_is_refused_in_one_line(base):
    from accel.backend import BackendError, get_backend
    family, _ = family_of_file(base[0])
    cpu = get_backend("cpu")
    model = family.model_class.from_checkpoint(base[0], backend=cpu._with_groups(
        tuple(g for g in cpu.groups if g != "lora")))
    with pytest.raises(BackendError, match="has no LoRA kernels"):
        lora.read_adapter(base[1], model)


# --- dropout (PEFT's lora_dropout): on each update's input at training, never at evaluation ---

P = 0.3


def test_dropout_kernel_drops_a_fraction_p_and_scales_the_rest():
    from kernels import dropout
    N = 1 << 18
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    scale = np.float32(1 / (1 - np.float32(P)))
    masks = {}
    for seed, stream in ((1, 0), (1, 1), (2, 0)):
        out = np.full(N, np.nan, np.float32)
        dropout.forward(out, x, P, seed, stream)
        kept = out != 0
        assert abs(1 - kept.mean() - P) < 5 * np.sqrt(P * (1 - P) / N)   # 5 sigma
        np.testing.assert_allclose(out[kept], x[kept] * scale, rtol=1e-7)
        masks[seed, stream] = kept
        dinp = np.ones(N, np.float32)   # backward adds dout through the same mask
        dropout.backward(dinp, x, P, seed, stream)
        np.testing.assert_allclose(dinp, 1 + out.astype(float), atol=3e-7)   # one rounding
        np.testing.assert_array_equal(dinp != 1, kept)
    # each stream and seed an independent mask: both dropped in about p^2
    for other in ((1, 1), (2, 0)):
        both = (~masks[1, 0] & ~masks[other]).mean()
        assert abs(both - P * P) < 5 * np.sqrt(P * P / N)



@pytest.fixture(scope="module")
def random_adapter(base, tmp_path_factory):
    """An adapter of `base` with B drawn away from zero (so that what A reads, dropped or not,
    shows in the logits and in every gradient), lora_dropout P."""
    folder, adapter = base
    model = our_model(folder, adapter, dropout=P)
    values = np.array(model.lora_params)
    rng = np.random.default_rng(1)
    for name, view in model.lora_layout.views(values).items():
        if name.endswith(".lora_B"):
            view[...] = rng.standard_normal(view.shape) / 10
    model.lora_params = values
    path = tmp_path_factory.mktemp("random_adapter")
    lora.write_adapter(path, model)
    return folder, path


def our_masks(model, inputs):
    """PEFT's module name -> the (B, T, C) mask times 1/(1-p) that the last training forward
    drew for that update's input (kernels/dropout.pyx's of the model's seed and the update's
    stream: layer * len(LORA_TARGETS) + target)."""
    from kernels import dropout
    shapes = dict(model.config.param_shapes())
    masks = {}
    for target in model.lora.targets:
        C = shapes[target][2]
        for l in model.lora.layers:
            out = np.empty(inputs.size * C, np.float32)
            dropout.forward(out, np.ones_like(out), model.lora.dropout, model.lora_draw_seed,
                            l * len(model.LORA_TARGETS) + model.LORA_TARGETS.index(target))
            masks[lora.module_of(target).format(l=l)] = out.reshape(*inputs.shape, C)
    return masks


def test_dropout_loss_and_gradients_equal_pytorch_with_the_same_masks(random_adapter):
    """A training step's loss and adapter gradients with dropout P equal PyTorch + PEFT's in
    training mode with each module's dropout replaced by our mask."""
    import transformers
    folder, adapter = random_adapter
    model = our_model(folder, adapter, seed=5)
    assert model.lora.dropout == P   # read from adapter_config.json
    inputs, targets = next(batches(seed=7))
    model.zero_grad()
    loss = model.forward(inputs, targets, training=True)
    model.backward()
    ours = lora.peft_tensors(model, model.grads)

    class Masked(torch.nn.Module):
        def __init__(self, mask):
            super().__init__()
            self.mask = torch.tensor(mask)

        def forward(self, x):
            return x * self.mask
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf, adapter, is_trainable=True).train()
    for name, mask in our_masks(model, inputs).items():
        theirs.get_submodule(lora.PEFT_PREFIX + name).lora_dropout["default"] = Masked(mask)
    logits = theirs(torch.tensor(inputs, dtype=torch.long)).logits
    labels = torch.tensor(np.where(targets < 0, -100, targets), dtype=torch.long)
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                             ignore_index=-100)
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-5)
    grads = {name.replace(".default", ""): p.grad.numpy() for name, p in theirs.named_parameters()
             if p.requires_grad}
    assert sorted(ours) == sorted(grads)
    for name, grad in ours.items():
        assert abs(grad - grads[name]).max() <= 1e-4 * abs(grads[name]).max(), name
    # every layer recomputed in backward: the same masks drawn again, the same gradients
    family, _ = family_of_file(folder)
    again = family.model_class.from_checkpoint(folder, recompute="none")
    lora.read_adapter(adapter, again, seed=5)
    again.zero_grad()
    assert again.forward(inputs, targets, training=True) == loss
    again.backward()
    np.testing.assert_array_equal(again.grads, model.grads)


def test_evaluation_runs_without_dropout(random_adapter):
    """With dropout P a forward that is not training (validation, generation) is the forward
    without dropout, bit for bit, before and after training steps; a training one is not."""
    folder, adapter = random_adapter
    dropping, plain = our_model(folder, adapter), our_model(folder, adapter, dropout=0.0)
    inputs, targets = next(batches(seed=3))

    def evaluated(model):
        loss = model.forward(inputs, targets)
        model.start_cache(T)
        return loss, np.array(model.logits), np.array(model.forward_cached(inputs[0]))
    for step in range(2):
        want = evaluated(plain)
        for got, expected in zip(evaluated(dropping), want):
            np.testing.assert_array_equal(got, expected)
        dropping.zero_grad()
        assert dropping.forward(inputs, targets, training=True) != pytest.approx(want[0])
        dropping.backward()
        dropping.update(LR, BETAS[0], BETAS[1], EPS, 0.0, step + 1)
        plain.lora_params = dropping.lora_params   # the same updates, trained with dropout


def test_finetune_with_dropout_resumes_bit_for_bit(base, tmp_path, capfd):
    """finetune.py --dropout: the run stopped after step 2's checkpoint and resumed (-y 1) ends
    with the uninterrupted run's adapter, bit for bit, which dropout changed; a resume with
    another --dropout is refused."""
    import finetune
    folder, _ = base
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": f"the {w} is number {i}"}) + "\n"
                            for i, w in enumerate(["sun", "moon", "tree", "cat", "dog", "sky"])))
    common = ["-e", folder, "-i", data, "-b", 2, "-t", 16, "-l", 1e-2, "-x", 4, "-r", 3]

    def run(out, *extra):
        finetune.run([str(a) for a in common + ["-o", tmp_path / out, *extra]])
        return capfd.readouterr().out
    assert "dropout=0.2 on" in run("whole", "--dropout", 0.2)
    run("plain")
    run("split", "--dropout", 0.2, "-n", 2)
    os.remove(os.path.join(finetune.step_dir(tmp_path / "split", 4), "DONE"))
    assert "resuming from the checkpoint at step 2" in run("split", "--dropout", 0.2, "-y", 1)
    with pytest.raises(SystemExit, match=r"dropout 0.1 \(the run's: 0.2\)"):
        run("split", "--dropout", 0.1, "-y", 1)
    read = {name: lora.read_adapter_file(tmp_path / name / "adapter", *settings_of(folder))
            for name in ("whole", "plain", "split")}
    assert read["whole"][0].dropout == 0.2 and read["plain"][0].dropout == 0.0
    for name, whole in read["whole"][1].items():
        np.testing.assert_array_equal(read["split"][1][name], whole)
        assert not np.array_equal(read["plain"][1][name], whole), name


def settings_of(folder):
    """(config, LORA_TARGETS, layers) of the model in folder: read_adapter_file's arguments."""
    family, _ = family_of_file(folder)
    config = family.read_model(folder)[0]
    return config, family.model_class.LORA_TARGETS, config.n_layers
