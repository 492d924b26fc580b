"""
LoRA adapters: their settings, their initialisation, and their files in PEFT's layout.

A model with LoRA attached (Model.attach_lora, llmc/model.pyx) keeps its parameters frozen and
trains, beside each adapted linear layer W (OC, C) of each adapted layer, A (R, C) and B (OC, R):
out = inp W^T + (alpha / R) (inp A^T) B^T, at training with a fraction `dropout` of the inp that
A reads dropped (PEFT's lora_dropout).  Here:

    LoraConfig                   rank, alpha, targets (the family's parameter names), layers,
                                 dropout (llmc/model.pyx's)
    attach(model, ...)           attach_lora with the targets and layers named as users name
                                 them (PEFT's module names: q_proj, ..., or ours: wq, ...),
                                 A initialised as PEFT does, B zero
    write_adapter(folder, model) adapter_config.json and adapter_model.safetensors, which
                                 peft.PeftModel.from_pretrained loads on transformers' model
    read_adapter(folder, model)  such a folder (PEFT's or ours) attached to a model, its
                                 settings and shapes checked against the model's
    merge(folder, config, params, ...)  the adapter added into a model's weights (W += scale B A):
                                 dev/export.py --merge writes it to every format

PEFT's file keeps what transformers' module holds: the q and k projections' rows in the
rotate-half order of Hugging Face's RoPE, where ours are adjacent pairs
(llmc/formats/huggingface.py), so B of wq and wk has its rows reordered both ways; A reads the
layer's input, which no order touches.  Only the Llama family's layers adapt today (its
LORA_TARGETS); GPT-2's are refused by name.
"""
import json
import math
import os

import numpy as np

from llmc.formats.common import FormatError, atomic_write, param_views
from llmc.formats.huggingface import (HF_LLAMA_NAMES, ROTATED, hf_adjacent_pair_rows,
                                      hf_rotate_half_rows, read_safetensors, rotated_heads,
                                      write_safetensors)
from llmc.model import LoraConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."   # PeftModel's prefix before transformers' module names


def module_of(name):
    """A target's transformers module name, {l} the layer: "model.layers.{l}.self_attn.q_proj"."""
    return HF_LLAMA_NAMES[name].rsplit(".", 1)[0]


def short_name(name):
    """PEFT's target_modules name of a target: "q_proj"."""
    return module_of(name).rsplit(".", 1)[1]


def peft_key(target, layer, matrix):
    """PEFT's name of a tensor: "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"."""
    return f"{PEFT_PREFIX}{module_of(target).format(l=layer)}.{matrix}.weight"


def target_names(targets, names):
    """Of a family's LORA_TARGETS (targets), those `names` names (PEFT's q_proj, ... or ours wq,
    ...; "all": every one), in LORA_TARGETS' order; an unknown name is a ValueError."""
    if not targets:
        raise ValueError("LoRA: this family has no layers LoRA adapts yet (the llama family's "
                         "do)")
    if names == "all":
        return targets
    by_name = {short_name(t): t for t in targets} | {t: t for t in targets}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"LoRA target {unknown[0]!r}: the model adapts "
                         f"{', '.join(short_name(t) for t in targets)} (or ours: "
                         f"{', '.join(targets)})")
    chosen = {by_name[n] for n in names}
    return tuple(t for t in targets if t in chosen)


def attach(model, rank, alpha, targets="all", layers=None, seed=0, dropout=0.0):
    """Attach LoRA to model: rank, alpha, targets (names, or "all"), layers (indices; None: all),
    dropout (p at training), A initialised as PEFT's default (Kaiming-uniform, a = sqrt(5):
    uniform in +-1/sqrt(C)) from seed, B zero, so that the model's output is unchanged until it
    trains; the dropout's masks are drawn from seed too."""
    layers = tuple(range(model.num_layers)) if layers is None else tuple(layers)
    model.attach_lora(rank, alpha, target_names(model.LORA_TARGETS, targets), layers, dropout,
                      seed)
    rng = np.random.default_rng(seed)
    values = np.zeros(model.lora_layout.size, dtype=np.float32)
    for name, view in model.lora_layout.views(values).items():
        if name.endswith(".lora_A"):
            bound = 1.0 / math.sqrt(view.shape[2])
            view[...] = rng.uniform(-bound, bound, view.shape)
    model.lora_params = values
    return model.lora


def peft_tensors(model, values=None):
    """PEFT's name -> (R, C) or (OC, R) array of each update of a model with LoRA attached, or of
    values laid out as its lora_params (their gradients: model.grads)."""
    tensors = {}
    stacks = model.lora_tensors() if values is None else model.lora_layout.views(values)
    for name, stack in stacks.items():
        target, matrix = name.split(".")
        for j, l in enumerate(model.lora.layers):
            tensor = stack[j]
            if matrix == "lora_B" and target in ROTATED:
                tensor = hf_rotate_half_rows(tensor, rotated_heads(model.config, target))
            tensors[peft_key(target, l, matrix)] = tensor
    return tensors


def write_adapter(folder, model, base_model=None):
    """The LoRA updates of model as PEFT's adapter folder: adapter_config.json and
    adapter_model.safetensors (float32); base_model: the base's path or hub name, for
    adapter_config.json's base_model_name_or_path."""
    lora = model.lora
    os.makedirs(folder, exist_ok=True)
    every_layer = lora.layers == tuple(range(model.num_layers))
    config = dict(peft_type="LORA", task_type="CAUSAL_LM", r=lora.rank, lora_alpha=lora.alpha,
                  target_modules=sorted(short_name(t) for t in lora.targets),
                  lora_dropout=lora.dropout,
                  bias="none", fan_in_fan_out=False, use_rslora=False, use_dora=False,
                  init_lora_weights=True, modules_to_save=None,
                  layers_to_transform=None if every_layer else list(lora.layers),
                  base_model_name_or_path=base_model, inference_mode=True)
    write_safetensors(os.path.join(folder, ADAPTER_WEIGHTS), peft_tensors(model))
    atomic_write(os.path.join(folder, ADAPTER_CONFIG),
                 [(json.dumps(config, indent=2) + "\n").encode()])


# adapter_config.json's settings implemented only at one value (absent or null: that value):
# key -> (value, what another asks for)
PEFT_FIXED = {
    "peft_type": ("LORA", "another adapter method"),
    "use_dora": (False, "DoRA"),
    "use_rslora": (False, "rank-stabilised scaling (alpha / sqrt(r))"),
    "fan_in_fan_out": (False, "Conv1D-layout weights"),
    "bias": ("none", "trained biases"),
    "modules_to_save": (None, "fully trained modules beside the adapters"),
    "rank_pattern": ({}, "a rank per module"),
    "alpha_pattern": ({}, "an alpha per module"),
    "layer_replication": (None, "replicated layers"),
    "lora_bias": (False, "a bias on lora_B"),
}


def read_adapter_file(folder, config, targets, num_layers):
    """(LoraConfig, {name: stack}) of the LoRA adapter in folder (PEFT's layout) for a model of
    this config whose family adapts `targets` (its LORA_TARGETS) in num_layers layers: the
    stacks as lora_layout names and shapes them ("wq.lora_A": (layers, R, C), ...), B's rows in
    our order.  Its settings and every tensor's shape (against the model's weights) are
    checked, each mismatch one FormatError naming it."""
    config_path = os.path.join(folder, ADAPTER_CONFIG)
    if not os.path.isfile(config_path):
        raise FormatError(folder, f"no {ADAPTER_CONFIG}: not a LoRA adapter folder (PEFT's "
                                  f"layout: {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    try:
        with open(config_path) as f:
            settings = json.load(f)
    except (OSError, ValueError) as e:
        raise FormatError(config_path, f"not readable as JSON: {e}") from None
    for key, (value, meaning) in PEFT_FIXED.items():
        if settings.get(key) not in (value, None):
            raise FormatError(config_path, f"{key} = {settings[key]!r} asks for {meaning}: "
                                           f"not implemented")
    modules = settings.get("target_modules")
    if modules == "all-linear":
        modules = "all"
    elif not isinstance(modules, list):   # PEFT's regular expression form
        raise FormatError(config_path, f"target_modules {modules!r}: give them as a list of "
                                       f"module names")
    try:
        chosen = target_names(targets, modules)
    except ValueError as e:
        raise FormatError(config_path, str(e)) from None
    layers = settings.get("layers_to_transform")
    layers = tuple(range(num_layers)) if layers is None else tuple(sorted(
        [layers] if isinstance(layers, int) else layers))
    if not all(0 <= l < num_layers for l in layers):
        raise FormatError(config_path, f"layers_to_transform {list(layers)}: the model has "
                                       f"{num_layers} layers")
    try:
        lora = LoraConfig(int(settings["r"]), float(settings["lora_alpha"]), chosen, layers,
                          float(settings.get("lora_dropout") or 0.0))
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(config_path, f"r, lora_alpha and lora_dropout must be numbers: "
                                       f"{e}") from None
    if not 0 <= lora.dropout < 1:
        raise FormatError(config_path, f"lora_dropout {lora.dropout:g}: must be at least 0 and "
                                       f"below 1")
    tensors = read_safetensors(os.path.join(folder, ADAPTER_WEIGHTS))
    weights = dict(config.param_shapes())   # each target's (L, OC, C)
    stacks, expected = {}, set()
    for target in lora.targets:
        _, OC, C = weights[target]
        for matrix, shape in (("lora_A", (lora.rank, C)), ("lora_B", (OC, lora.rank))):
            matrices = []
            for l in lora.layers:
                key = peft_key(target, l, matrix)
                expected.add(key)
                if key not in tensors:
                    raise FormatError(folder, f"no tensor {key}: the adapter is incomplete, or "
                                              f"not for this model")
                tensor = tensors[key]
                if tensor.shape != shape:
                    raise FormatError(folder, f"{key} has shape {tensor.shape}, the model's "
                                              f"r={lora.rank} update {shape}: an adapter of "
                                              f"another base model")
                if matrix == "lora_B" and target in ROTATED:
                    tensor = hf_adjacent_pair_rows(tensor, rotated_heads(config, target))
                matrices.append(tensor)
            stacks[f"{target}.{matrix}"] = np.stack(matrices)
    extra = sorted(set(tensors) - expected)
    if extra:
        raise FormatError(folder, f"tensor {extra[0]} ({len(extra)} in all) has no place in "
                                  f"the adapter {ADAPTER_CONFIG} describes")
    return lora, stacks


def read_adapter(folder, model, dropout=None, seed=0):
    """Attach the LoRA adapter in folder (PEFT's layout) to model and load it, with its
    lora_dropout unless dropout is given (a training run's own), masks drawn from seed; an
    adapter of another base (a shape that differs) is refused in one line.  Returns the
    LoraConfig."""
    lora, stacks = read_adapter_file(folder, model.config, model.LORA_TARGETS, model.num_layers)
    model.attach_lora(lora.rank, lora.alpha, lora.targets, lora.layers,
                      lora.dropout if dropout is None else dropout, seed)
    values = np.empty(model.lora_layout.size, dtype=np.float32)
    for name, view in model.lora_layout.views(values).items():
        view[...] = stacks[name]
    model.lora_params = values
    return model.lora


def merge(folder, config, params, targets, num_layers):
    """params (a float32 array of the model's layout, llmc.formats.param_views) with the LoRA
    adapter in folder added into its weights: W += (alpha / R) B A of each adapted layer."""
    lora, stacks = read_adapter_file(folder, config, targets, num_layers)
    params = np.array(params, dtype=np.float32, copy=not params.flags.writeable)
    views = param_views(config, params)
    for target in lora.targets:
        A, B = stacks[f"{target}.lora_A"], stacks[f"{target}.lora_B"]
        for j, l in enumerate(lora.layers):
            views[target][l] += np.float32(lora.alpha / lora.rank) * (B[j] @ A[j])
    return params
