"""
Hugging Face models in (llmc/formats/huggingface.py, the Llama family's switches): for each
architecture of tests/hf_models.py, a model transformers made at test time and saved is read
as train.py -e reads it, and its logits, loss and every gradient equal transformers' own
(test_gpt2.py's tolerances: logits within 1e-5 of the largest, gradients within GRAD_TOL of
each tensor's largest; at bf16 its narrow tolerances).  Each switch has a planted fault that the
same comparison catches, and config.json's keys are read strictly.
"""
import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

import generate
from dev import export
from kernels import bf16
from llmc.families import family_of_file, get_family
from llmc.formats import FormatError, describe_model_file, param_views
from llmc.formats.huggingface import HF_WRITERS, hf_config_of, llama_config_from_hf, llama_from_hf
from llmc.sampler import Sampler, continue_prompt
from llmc.tokenizer import Tokenizer
from test_gpt2 import BF16_LOSS_TOL, GRAD_TOL, narrow_tolerance
from tests import needs
from tests.hf_models import ARCHITECTURES, BFLOAT16, SHARDED, V, hf_logits, make_hf_model

torch = needs.package("torch")
transformers = needs.package("transformers")

LOGITS_TOL = 1e-5   # of the largest logit
B, T = 2, 24


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (folder, the transformers model) of every architecture, made once."""
    root = tmp_path_factory.mktemp("hf")
    return {name: (root / name, make_hf_model(name, root / name)) for name in ARCHITECTURES}


def batch(seed=1):
    tokens = np.random.default_rng(seed).integers(0, V, (B, T + 1)).astype(np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def ours(folder, precision="fp32", change=None):
    """Our model of the folder, read as train.py -e reads it (change: (config, params) ->
    (config, params), a planted fault)."""
    family, _ = family_of_file(folder)
    config, params = family.read_model(folder)
    if change is not None:
        config, params = change(config, params)
    model = family.model_class(config, precision=precision)
    model.params = params
    return model


def logits_error(model, hf_model, x):
    """max |ours - transformers'| / max |transformers'| of the logits."""
    model.forward(x)
    ref = hf_logits(hf_model, x)
    return np.abs(model.logits[..., :V] - ref).max() / np.abs(ref).max()


def hf_gradients(hf_model, folder, x, y):
    """(loss, every gradient in our layout) of transformers' model on the batch."""
    hf_model.zero_grad()
    logits = hf_model(torch.tensor(x, dtype=torch.long)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V),
                                             torch.tensor(y.reshape(-1), dtype=torch.long))
    loss.backward()
    grads = {name: p.grad.numpy() for name, p in hf_model.named_parameters()}
    family, _ = family_of_file(folder)
    if family.name == "gpt2":
        from llmc.formats.huggingface import gpt2_from_hf
        return float(loss.detach()), gpt2_from_hf(grads, family.config_class, hf_model.config.n_head)[1]
    return float(loss.detach()), llama_from_hf(grads, hf_config_of(folder), family.config_class)[1]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_logits_loss_and_gradients_equal_transformers(saved, name):
    folder, hf_model = saved[name]
    x, y = batch()
    model = ours(folder)
    assert logits_error(model, hf_model, x) <= LOGITS_TOL
    ref_loss, ref_grads = hf_gradients(hf_model, folder, x, y)
    model.zero_grad()
    loss = model.forward(x, y)
    model.backward()
    assert abs(loss - ref_loss) <= 1e-5
    views, ref_views = (param_views(model.config, g) for g in (model.grads, ref_grads))
    for tensor, grad in views.items():
        scale = np.abs(ref_views[tensor]).max()
        assert np.abs(grad - ref_views[tensor]).max() <= GRAD_TOL * scale, tensor


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_bf16_within_the_bf16_tolerances(saved, name):
    folder, hf_model = saved[name]
    x, y = batch()
    model = ours(folder, precision="bf16")
    model.forward(x)
    ref = hf_logits(hf_model, x)
    assert (np.abs(model.logits[..., :V] - ref) <= narrow_tolerance(ref)).all()
    ref_loss, ref_grads = hf_gradients(hf_model, folder, x, y)
    model.zero_grad()
    loss = model.forward(x, y)
    model.backward()
    assert abs(loss - ref_loss) <= BF16_LOSS_TOL
    views = param_views(model.config, model.grads / model.loss_scale)
    for tensor, grad in views.items():
        expected = param_views(model.config, ref_grads)[tensor]
        assert (np.abs(grad - expected) <= narrow_tolerance(expected)).all(), tensor


EMULATED = [("check:hip-emu", "fp32"), ("check:hip-emu", "bf16"), ("check:metal-emu", "fp32"),
            ("check:ane-emu", "fp32")]


@pytest.mark.parametrize("backend, precision", EMULATED)
def test_every_switch_runs_on_the_emulated_gpus(saved, backend, precision):
    """The switches go through the table's own entries (matmul's bias, rmsnorm over each head),
    so every backend fills them: check: compares each entry's outputs with the CPU's."""
    needs.emulated(backend, precision)
    x, y = batch()
    for name, (folder, _) in saved.items():
        family, _ = family_of_file(folder)
        config, params = family.read_model(folder)
        model = family.model_class(config, backend=backend, precision=precision)
        model.params = params
        model.zero_grad()
        model.forward(x, y)
        model.backward()
        assert model.backend.report()["mismatches"] == 0, (name, model.backend.summary())


def without(config, params, switch, names):
    """The model without a switch: its tensors names dropped from params."""
    fewer = dataclasses.replace(config, **{switch: False})
    views = param_views(config, params)
    return fewer, np.concatenate([views[n].ravel() for n, _ in fewer.param_shapes()])


FAULTS = {   # a switch read wrong, and the architecture that shows it
    "qkv bias dropped": ("qwen2", lambda c, p: without(c, p, "qkv_bias", ("bq", "bk", "bv"))),
    "QK-norm skipped": ("qwen3", lambda c, p: without(c, p, "qk_norm", ("q_norm", "k_norm"))),
    "RoPE scaling off": ("llama3", lambda c, p: (dataclasses.replace(c, rope_scaling=()), p)),
    "theta from the wrong key": ("qwen2", lambda c, p: (dataclasses.replace(c, rope_theta=10000.0), p)),
    "eps from the wrong key": ("qwen3", lambda c, p: (dataclasses.replace(c, norm_eps=1e-1), p)),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_switch_read_wrong_fails_the_comparison(saved, fault):
    name, change = FAULTS[fault]
    folder, hf_model = saved[name]
    x, _ = batch()
    assert logits_error(ours(folder, change=change), hf_model, x) > 100 * LOGITS_TOL


def test_theta_is_read_where_transformers_5_keeps_it(saved, tmp_path):
    """rope_parameters' theta wins over a stale top-level rope_theta (transformers 5 reads
    rope_parameters; readers that took the other key fell back to 10000 silently)."""
    folder, hf_model = saved["qwen2"]
    shutil.copytree(folder, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == 1e6
    config["rope_theta"] = 10000.0
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    x, _ = batch()
    assert logits_error(ours(tmp_path / "m"), hf_model, x) <= LOGITS_TOL


def test_the_checkpoints_as_they_come(saved):
    """One architecture in shards with their index, one in bf16; each said in one line."""
    assert len(list(saved[SHARDED][0].glob("*.safetensors"))) > 1
    assert (saved[SHARDED][0] / "model.safetensors.index.json").exists()
    assert describe_model_file(saved[SHARDED][0]) == \
        "a Hugging Face Qwen3ForCausalLM folder (f32 weights, 2 layers, 64 channels, 512 tokens)"
    assert describe_model_file(saved[BFLOAT16][0]) == \
        "a Hugging Face LlamaForCausalLM folder (bf16 weights, 2 layers, 64 channels, 512 tokens)"
    config = get_family("llama").read_model(saved["qwen3"][0])[0]
    assert config.describe().endswith("separate classifier, rms eps 1e-06, rope theta 1e+06, "
                                      "head_dim 32, QK-norm")


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_greedy_generation_equals_transformers(saved, name, capsys):
    """32 tokens after a prompt, as transformers' generate chooses them, and generate.py prints
    them as its tokenizer decodes them."""
    folder, hf_model = saved[name]
    tokenizer = Tokenizer.from_hf(folder)
    prompt = tokenizer.encode_prompt("the quick brown fox")
    model = ours(folder)
    tokens = list(continue_prompt(model, prompt, 32, Sampler(0.0, 0, 1.0, 1), tokenizer.stop_tokens))
    with torch.no_grad():
        theirs = hf_model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                                   eos_token_id=list(tokenizer.stop_tokens),
                                   pad_token_id=tokenizer.stop_tokens[0])[0, len(prompt):].tolist()
    assert tokens == [t for t in theirs if t not in tokenizer.stop_tokens] and len(theirs) > 8
    generate.main([str(folder), "-p", "the quick brown fox", "-n", "32", "--temperature", "0"])
    started = prompt[0] == tokenizer.eot_token
    text = "".join(c for c in tokenizer.decode(prompt[started:] + tokens)   # printable (as
                   if c.isprintable() or c in "\n\t")                       # llm.c prints)
    # a character cut off at the end is not printed
    assert capsys.readouterr().out[:-1] in (text, text.rstrip("\ufffd"))


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_exported_back_transformers_loads_the_same_class_and_weights(saved, name, tmp_path):
    """dev/export.py --format hf on the folder: the architecture it came as, every weight bit
    for bit, its tokenizer and chat template."""
    folder, hf_model = saved[name]
    export.main([str(folder), "--format", "hf", "-o", str(tmp_path / "out"), "--check"])
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(back) is type(hf_model)
    theirs, again = hf_model.state_dict(), back.state_dict()
    assert theirs.keys() == again.keys()
    for key in theirs:
        assert torch.equal(theirs[key], again[key]), key
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    original = transformers.AutoTokenizer.from_pretrained(folder)
    chat = [{"role": "user", "content": "hello"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == \
        original.apply_chat_template(chat, tokenize=False)


HF_PRESETS = ("SmolLM2-135M", "SmolLM2-360M", "SmolLM2-1.7B", "llama-1b", "Llama-3.2-1B",
              "Llama-3.2-3B", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen3-0.6B", "Qwen3-1.7B",
              "Mistral-7B-v0.3")


@pytest.mark.parametrize("preset", HF_PRESETS)
def test_each_presets_config_json_builds_its_model_in_transformers(preset):
    """At the real sizes (on PyTorch's meta device: no memory): the config.json we would write
    for the preset makes transformers' model of that class, with our parameters' count and
    shapes, and reads back as the preset."""
    config = get_family("llama").presets[preset]
    no_memory = np.broadcast_to(np.float32(0), (config.num_parameters(),))   # every stride 0
    tensors, hf_config = HF_WRITERS["llama"](config, no_memory)
    built = transformers.AutoConfig.for_model(hf_config["model_type"], **{
        k: v for k, v in hf_config.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(built)
    assert type(model).__name__ == hf_config["architectures"][0]
    assert sum(p.numel() for p in model.parameters()) == config.num_parameters()
    ours = {name: tensor.shape for name, tensor in tensors.items()}
    assert ours == {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert llama_config_from_hf(built.to_dict() | dict(architectures=hf_config["architectures"]),
                                type(config)) == config


MEASURE_LOAD = """
import sys
from llmc.families import family_of_file
def status(key):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(key)).split()[1]) * 1024
precision, trainable = sys.argv[2], sys.argv[3] == "trainable"
family, _ = family_of_file(sys.argv[1])   # the modules imported, the backend made
family.model_class(family.config_class.from_name("d1", vocab_size=8), precision=precision)
with open("/proc/self/clear_refs", "w") as f:   # the peak (VmHWM) from here on
    f.write("5")
baseline = status("VmRSS")
model = family.model_class.from_checkpoint(sys.argv[1], precision=precision, trainable=trainable)
print(status("VmHWM") - baseline)
"""


# (precision, trainable) -> the load's peak, as a multiple of the bf16 file: the model's float32
# weights and one tensor; at bf16 for inference or a LoRA base (no float32 master weights), its
# bf16 weights and one tensor (the widest, the embedding, is an eighth of the model here)
LOAD_PEAKS = {("fp32", "trainable"): (1.9, 2.25), ("bf16", "frozen"): (0.9, 1.3)}


@pytest.mark.parametrize("precision, trainable", LOAD_PEAKS)
def test_loading_reads_each_tensor_into_place(tmp_path, precision, trainable):
    """A bf16 checkpoint loads with a peak of the model's own weights and one tensor: no second
    full copy, and not the file's pages either; with trainable=False at bf16 the weights are
    the file's bf16 values, and only LoRA trains the model."""
    import subprocess
    import sys
    from llmc.formats.huggingface import llama_to_hf, write_safetensors
    config = get_family("llama").config_class.from_name("d8", vocab_size=4096)
    params = np.random.default_rng(0).standard_normal(config.num_parameters(), np.float32) * 0.02
    tensors, hf_config = llama_to_hf(config, params)
    (tmp_path / "m").mkdir()
    write_safetensors(tmp_path / "m" / "model.safetensors", tensors, "bfloat16")
    (tmp_path / "m" / "config.json").write_text(json.dumps(hf_config))
    run = subprocess.run([sys.executable, "-c", MEASURE_LOAD, str(tmp_path / "m"), precision,
                          trainable], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr
    peak = int(run.stdout) / (tmp_path / "m" / "model.safetensors").stat().st_size
    low, high = LOAD_PEAKS[precision, trainable]
    assert low < peak < high, peak
    if trainable == "frozen":
        family = get_family("llama")
        model = family.model_class.from_checkpoint(tmp_path / "m", precision=precision,
                                                   trainable=False)
        np.testing.assert_array_equal(model.params, bf16.to_float32(bf16.to_bf16(params)))
        assert model.memory()["params"] == 2 * config.num_parameters()
        with pytest.raises(RuntimeError, match="made with trainable=False"):
            model.update(1e-3, 0.9, 0.95, 1e-8, 0.0, 1)


def test_a_run_from_a_folder_trains_checkpoints_and_resumes_bit_for_bit(saved, tmp_path):
    """text_to_shards.py --tokenizer, then train.py -e FOLDER at bf16: its checkpoints (a
    safetensors file with the config inside: llama2.c's cannot hold QK-norm) resume to the
    losses of the run without a stop."""
    import subprocess
    import sys
    from tests.hf_tokenizers import corpus
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = saved["qwen3"][0]
    (tmp_path / "text.txt").write_text("\n".join(corpus(2000)))

    def run(script, *args):
        done = subprocess.run([sys.executable, os.path.join(repo, script), *map(str, args)],
                              capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout
    run("dev/data/text_to_shards.py", tmp_path / "text.txt", "--tokenizer", folder, "-o",
        tmp_path / "data", "--name", "t")
    data = ["-i", tmp_path / "data" / "t_train_*.bin", "-j", tmp_path / "data" / "t_val_*.bin",
            "-b", 2, "-t", 32, "-n", 2, "--precision", "bf16", "-e", folder]

    def losses(out):
        return [line.split("|")[1] for line in out.splitlines() if line.startswith("step")]
    straight = losses(run("train.py", *data, "-x", 4, "-o", tmp_path / "a"))
    first = losses(run("train.py", *data, "-x", 2, "-o", tmp_path / "b"))
    assert (tmp_path / "b" / "model_00000002.bin").read_bytes()[8:10] == b'{"'   # safetensors
    resumed = losses(run("train.py", *data, "-x", 4, "-o", tmp_path / "b", "-y", 1))
    assert first + resumed == straight and len(straight) == 4


@pytest.mark.parametrize("name, said", [("qwen2", "Qwen2ForCausalLM with rms eps 1e-06, rope "
                                                 "theta 1e+06, qkv bias"),
                                        ("llama3", "llama3 RoPE scaling x8")])
def test_llama2c_files_refuse_what_they_cannot_hold(saved, tmp_path, name, said):
    """dev/download_llama.py converted a Qwen2 config with llama3 scaling without a word."""
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, os.path.join(repo, "dev", "download_llama.py"),
                          "--from-safetensors", str(saved[name][0]), "-o", str(tmp_path / "m.bin")],
                         capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and said in run.stderr
    assert "export to hf instead" in run.stderr and not (tmp_path / "m.bin").exists()


def edited(folder, tmp_path, **changes):
    """A copy of the model folder with config.json's keys changed (None: removed)."""
    shutil.copytree(folder, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    return tmp_path / "m"


@pytest.mark.parametrize("name, changes, message", [
    ("qwen2", dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe"),
     "architecture Qwen2MoeForCausalLM (model_type 'qwen2_moe') is not implemented"),
    ("llama3", dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0)),
     "RoPE scaling 'yarn' is not implemented"),
    ("llama3", dict(rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                         partial_rotary_factor=0.5)),
     "RoPE's partial_rotary_factor=0.5 is not implemented"),
    ("mistral", dict(sliding_window=16),
     "sliding_window=16 (Mistral v0.1's sliding-window attention) is not implemented"),
    ("qwen2", dict(use_sliding_window=True), "use_sliding_window=True (sliding-window attention)"),
    ("tinyllama", dict(hidden_act="gelu"), "hidden_act='gelu' (another activation in the FFN)"),
    ("tinyllama", dict(attention_bias=True), "attention_bias=true is not implemented"),
    ("qwen3", dict(some_new_switch=3), "some_new_switch=3 is not implemented (for Qwen3ForCausalLM)"),
    ("gpt2", dict(activation_function="relu"), "activation_function='relu' is not implemented"),
])
def test_what_is_not_implemented_is_refused_by_name(saved, tmp_path, name, changes, message):
    folder = edited(saved[name][0], tmp_path, **changes)
    with pytest.raises(FormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        family_of_file(folder)[0].read_model(folder)


def test_a_missing_shard_is_named(saved, tmp_path):
    shutil.copytree(saved[SHARDED][0], tmp_path / "m")
    shard = sorted((tmp_path / "m").glob("*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(FormatError, match=f"shard {shard.name} of model.safetensors.index.json "
                                          f"is missing"):
        get_family("llama").read_model(tmp_path / "m")


def test_a_tensor_without_a_place_is_refused(saved, tmp_path):
    """A Llama config over a Qwen2 checkpoint: the biases would be dropped silently."""
    folder = edited(saved["qwen2"][0], tmp_path, architectures=["LlamaForCausalLM"],
                    model_type="llama", use_sliding_window=None, sliding_window=None,
                    max_window_layers=None, layer_types=None)
    with pytest.raises(FormatError, match="self_attn.[qkv]_proj.bias .* has no place in "
                                          "LlamaForCausalLM"):
        get_family("llama").read_model(folder)
