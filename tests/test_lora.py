"""
LoRA (llmc/adapter.py, Model.attach_lora, kernels/lora.pyx) against PEFT on transformers' model:
the same adapter (PEFT writes it, we read it), the same batches and AdamW settings, dropout 0:
each step's loss within 1e-5 relative of PyTorch + PEFT's for 20 steps, and the adapters after
them within fp32 rounding; PEFT loads our adapter back with the same logits.  The kernel against
float64 NumPy, the frozen parameters' gradients never allocated, bf16 within the bf16
tolerances, and each bad adapter refused in one line.  Planted faults (the scale alpha/r
dropped, B's rows left in PEFT's order) fail.
"""
import json
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


def our_model(folder, adapter, precision="fp32"):
    family, _ = family_of_file(folder)
    model = family.model_class.from_checkpoint(folder, precision=precision)
    lora.read_adapter(adapter, model)
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
