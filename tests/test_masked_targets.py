"""
Targets of -1, positions not scored (llm.c's mask; transformers' labels of -100, which
fine-tuning puts on a prompt): a model's loss is the mean over the scored positions alone and
its gradients are that mean's, as PyTorch's references compute them (train_llama2_torch.py,
train_gpt2_torch.py: llm.c's ignore_index=-1) and as transformers does from labels of -100
(which it shifts by one itself), within the tolerances of the unmasked comparisons; GPT-2 on
both of its heads (the classifier, and llm.c's softmax and cross-entropy), and on the emulated
GPUs through check:.  A batch with nothing scored has a loss of 0.0 and adds no gradient, and
one given its step's count of scored targets (finetune.py's gradient accumulation) divides its
summed loss by that; targets below -1 are refused in one line, and inputs of -1 still are.
"""
import numpy as np
import pytest

import needs
from accel.backend import get_backend
from llmc.formats import param_views
from test_gpt2 import GRAD_TOL
from test_llama_model import TINY_GQA, TINY_MQA
from train_gpt2 import GPT2, GPT2Config
from train_llama2 import Llama2

# a d2 with odd sizes: V=61 padded to Vp=128, C=12, NH=3 (tests/test_reference.py's)
TINY_GPT2 = GPT2Config(max_seq_len=9, vocab_size=61, padded_vocab_size=128, num_layers=2,
                       num_heads=3, channels=12)
B, T = 3, 7


def masked_batch(vocab_size, seed=0):
    """x, y (B,T): the tokens and the next ones, about a third of y -1: the first always, the
    second 0 (the id that a mask off by one would drop too)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab_size, (B, T + 1)).astype(np.int32)
    x, y = tokens[:, :-1].copy(), tokens[:, 1:].copy()
    y[rng.random((B, T)) < 1 / 3] = -1
    y.flat[0], y.flat[1] = -1, 0
    return x, y


def step(model, x, y):
    """(loss, the gradients) of one forward and backward from zero gradients."""
    model.zero_grad()
    loss = model.forward(x, y)
    model.backward()
    return loss, model.grads.copy()


def assert_gradients_close(config, grads, expected, tolerance):
    """Each tensor's gradient within tolerance of its reference's largest magnitude."""
    views, ref_views = param_views(config, grads), param_views(config, expected)
    for tensor, grad in views.items():
        scale = np.abs(ref_views[tensor]).max()
        assert np.abs(grad - ref_views[tensor]).max() <= tolerance * scale, tensor


def without_classifier():
    """The CPU backend without the classifier group: GPT-2 then runs llm.c's softmax and
    cross-entropy entries."""
    cpu = get_backend("cpu")
    return cpu._with_groups(tuple(g for g in cpu.groups if g != "classifier"))


# --- against PyTorch's references (ignore_index=-1) ----------------------------------------------

@pytest.mark.parametrize("config", [TINY_GQA, TINY_MQA], ids=["gqa-separate", "mqa-tied"])
def test_llama_matches_its_pytorch_reference(config):
    torch = needs.package("torch")
    import train_llama2_torch as ref
    torch.set_num_threads(1)
    params = ref.init_params(config, seed=3)
    x, y = masked_batch(config.vocab_size)
    _, ref_loss, ref_grads = ref.reference_forward_backward(config, params, x, y)
    model = Llama2(config)
    model.params = params
    loss, grads = step(model, x, y)
    assert abs(loss - ref_loss) < 1e-5   # tests/test_llama_model.py's tolerances
    assert_gradients_close(config, grads, ref_grads, 1e-4)
    # not the mean over all B*T positions: the masked ones count for nothing
    assert abs(loss - ref_loss * (y >= 0).sum() / y.size) > 1e-2


@pytest.mark.parametrize("head", ["classifier", "softmax"])
def test_gpt2_matches_its_pytorch_reference(head):
    torch = needs.package("torch")
    import train_gpt2_torch as ref
    torch.set_num_threads(1)
    params = ref.init_params(TINY_GPT2, seed=7)
    x, y = masked_batch(TINY_GPT2.vocab_size, seed=1)
    _, ref_loss, ref_grads = ref.reference_forward_backward(TINY_GPT2, params, x, y)
    model = GPT2(TINY_GPT2, backend="cpu" if head == "classifier" else without_classifier())
    assert model.classifier == (head == "classifier")
    model.params = params
    loss, grads = step(model, x, y)
    assert abs(loss - ref_loss) < 1e-5
    assert_gradients_close(TINY_GPT2, grads, ref_grads, GRAD_TOL)


# --- against transformers, labels of -100 --------------------------------------------------------

@pytest.mark.parametrize("name", ["tinyllama", "qwen3", "gpt2"])
def test_transformers_labels_of_minus_100_are_our_minus_1(tmp_path, name):
    """transformers scores logits[t] against labels[t + 1]: our targets (B,T) are its labels
    (B,T) shifted left by one, its -100 our -1, our last position never scored."""
    torch = needs.package("torch")
    needs.package("transformers")
    from llmc.families import family_of_file
    from llmc.formats.huggingface import gpt2_from_hf, hf_config_of, llama_from_hf
    from tests.hf_models import V, make_hf_model
    hf_model = make_hf_model(name, tmp_path)
    x, y = masked_batch(V, seed=2)
    y[:, -1] = -1
    labels = np.concatenate([np.full((B, 1), -100), np.where(y[:, :-1] < 0, -100, y[:, :-1])], 1)
    hf_model.zero_grad()
    ref_loss = hf_model(torch.tensor(x, dtype=torch.long),
                        labels=torch.tensor(labels, dtype=torch.long)).loss
    ref_loss.backward()
    hf_grads = {n: p.grad.numpy() for n, p in hf_model.named_parameters()}
    family, _ = family_of_file(tmp_path)
    config, params = family.read_model(tmp_path)
    ref_grads = (gpt2_from_hf(hf_grads, family.config_class, hf_model.config.n_head)[1]
                 if family.name == "gpt2" else
                 llama_from_hf(hf_grads, hf_config_of(tmp_path), family.config_class)[1])
    model = family.model_class(config)
    model.params = params
    loss, grads = step(model, x, y)
    assert abs(loss - float(ref_loss.detach())) <= 1e-5   # tests/test_hf_models.py's
    assert_gradients_close(config, grads, ref_grads, GRAD_TOL)


# --- the emulated GPUs ---------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["check:hip-emu", "check:metal-emu", "check:ane-emu"])
def test_masked_steps_on_the_emulated_gpus_match_the_cpu(backend):
    """Each entry of a step with masked targets is compared with the CPU's by check:, and the
    loss is the CPU's."""
    needs.emulated(backend)
    x, y = masked_batch(TINY_GQA.vocab_size)
    for model_class, config in ((Llama2, TINY_GQA), (GPT2, TINY_GPT2)):
        cpu_loss, _ = step(model_class.random(config, seed=1), x, y)
        model = model_class.random(config, seed=1, backend=backend)
        loss, _ = step(model, x, y)
        assert model.backend.report()["mismatches"] == 0, model.backend.summary()
        # (the ANE's matmuls are fp16: within their own tolerance of the CPU's)
        assert abs(loss - cpu_loss) <= (1e-2 if "ane" in backend else 1e-5) * abs(cpu_loss)


# --- nothing scored, and what is refused ---------------------------------------------------------

@pytest.mark.parametrize("model_class, config", [(Llama2, TINY_GQA), (GPT2, TINY_GPT2)])
def test_a_batch_with_nothing_scored_has_loss_0_and_adds_nothing(model_class, config):
    model = model_class.random(config, seed=1)
    x, y = masked_batch(config.vocab_size)
    _, grads = step(model, x, y)
    assert model.forward(x, np.full_like(y, -1)) == 0.0
    model.backward()
    np.testing.assert_array_equal(model.grads, grads)   # nothing added to the last step's


@pytest.mark.parametrize("model_class, config", [(Llama2, TINY_GQA), (GPT2, TINY_GPT2)])
def test_the_steps_count_of_scored_targets_divides_the_loss(model_class, config):
    """backward(scored_in_step), gradient accumulation's weighting: the batch's summed loss over
    that count, so twice the batch's own count gives exactly half its mean's gradient (a power
    of two commutes with rounding); fewer than the batch scores is refused in one line."""
    model = model_class.random(config, seed=1)
    x, y = masked_batch(config.vocab_size)
    _, grads = step(model, x, y)
    scored = int(np.count_nonzero(y >= 0))
    model.zero_grad()
    model.forward(x, y)
    model.backward(2 * scored)
    np.testing.assert_array_equal(model.grads, grads / 2)
    with pytest.raises(ValueError, match=rf"^scored_in_step {scored - 1}: fewer than the "
                                         rf"{scored} positions this batch scores$"):
        model.backward(scored - 1)


@pytest.mark.parametrize("targets, message", [
    (np.array([[1, -2, 3]]), r"targets: token ids must be in \[0, 37\) or -1 \(not scored\), "
                             r"got \[-2, 3\]"),
    (np.array([[1, 2, 37]]), r"targets: token ids must be in \[0, 37\) or -1 \(not scored\), "
                             r"got \[1, 37\]"),
])
def test_bad_targets_are_one_line_errors(targets, message):
    model = Llama2(TINY_GQA)
    with pytest.raises(ValueError, match=message) as e:
        model.forward(np.zeros((1, 3), np.int32), targets)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"inputs: token ids must be in \[0, 37\), got \[-1, 3\]"):
        model.forward(np.array([[1, -1, 3]]), np.zeros((1, 3), np.int32))
