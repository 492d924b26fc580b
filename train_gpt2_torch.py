"""
The PyTorch reference for llm.pyx, in the role of llm.c's train_gpt2.py: GPT-2 in PyTorch
(float32, CPU) writing the files that the Cython trainer is checked against.

    python train_gpt2_torch.py -e d12 -b 4 -t 64 -o out        random init, llm.c's d12 sizes
    python train_gpt2_torch.py -e gpt2 -b 4 -t 64 -o .         OpenAI's GPT-2 124M weights
                                                               (needs transformers + internet)
    python train_gpt2_torch.py -e d12 --dtype bfloat16 -o out  the debug state and step losses
                                                               of bf16 autocast forwards

--dtype bfloat16 runs every forward under bf16 autocast on the CPU, as llm.c's train_gpt2.py
--dtype bfloat16 does on a GPU: the matmuls take bf16 operands (the parameters rounded to
nearest on each use) and give bf16 results, while the parameters, their gradients and AdamW
stay float32 (autocast takes the cross-entropy of the bf16 logits in float32, as our bf16 model
does).  llm.c's C tests compare their bf16 build with the float32 debug state only;
test_gpt2.py --precision bf16 compares ours with both.

writes to the output directory, for NAME (--name; default gpt2_dN or gpt2_124M):
    NAME.bin                      the model, llm.c checkpoint in fp32 (version 3)
    NAME_bf16.bin                 the same in bf16 (version 5)
    NAME_debug_state.bin          one batch (x, y), then the logits, mean loss and gradients
                                  of one forward + backward on it
    NAME_debug_state.losses.json  the losses of 10 AdamW steps on that same batch, as llm.c's
                                  test_gpt2.c runs them, with the optimizer's settings
    gpt2_tokenizer.bin            with --tokenizer: the GPT-2 tokenizer for decoding
(with --dtype bfloat16 the last two are NAME_debug_state_bf16.bin and
NAME_debug_state_bf16.losses.json, whose record says "dtype": "bfloat16")

Tests and test_gpt2.py import reference_forward_backward() and reference_losses(), which
start from a parameter vector in llm.c's layout (train_gpt2.GPT2Config.param_shapes) and take
dtype="float32" or "bfloat16" (autocast, as --dtype).
"""
import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import sys

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

from llmc.formats import atomic_write, param_views
from llmc.formats.llmc import write_checkpoint, write_debug_state, write_tokenizer
from train_gpt2 import GPT2Config, padded_vocab_size

# OpenAI's checkpoints on Hugging Face, and llm.c's names for them
PRETRAINED = {"gpt2": "124M", "gpt2-medium": "355M", "gpt2-large": "774M", "gpt2-xl": "1558M"}

# AdamW as llm.c's test_gpt2.c runs it: weight decay on every parameter
ADAMW = {"lr": 1e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
INIT_STD = 0.02

# the precisions the forward runs at (--dtype); see autocast
DTYPES = ("float32", "bfloat16")


def autocast(dtype):
    """The context a forward runs in at dtype: none at float32; at bfloat16, autocast on the
    CPU (llm.c's train_gpt2.py --dtype bfloat16): matmuls on bf16 operands with bf16 results,
    the parameters, the cross-entropy and what autocast leaves alone float32."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16)


# ----------------------------------------------------------------------------
# the model, nanoGPT-style

class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        C = config.channels
        self.num_heads = config.num_heads
        self.c_attn = nn.Linear(C, 3 * C)  # q, k, v of all heads in one matmul
        self.c_proj = nn.Linear(C, C)
        maxT = config.max_seq_len
        self.register_buffer("causal", torch.tril(torch.ones(maxT, maxT, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        NH = self.num_heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, NH, C // NH).transpose(1, 2)  # (B, NH, T, hs)
        k = k.view(B, T, NH, C // NH).transpose(1, 2)
        v = v.view(B, T, NH, C // NH).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // NH))  # (B, NH, T, T)
        att = att.masked_fill(~self.causal[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)  # heads side by side
        return self.c_proj(y)


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        C = config.channels
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.channels, eps=1e-5)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.channels, eps=1e-5)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 over the real vocab V; llm.c's padding of wte to Vp rows happens at export."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.channels),
            wpe=nn.Embedding(config.max_seq_len, config.channels),
            h=nn.ModuleList([Block(config) for _ in range(config.num_layers)]),
            ln_f=nn.LayerNorm(config.channels, eps=1e-5),
        ))
        self.lm_head = nn.Linear(config.channels, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx, targets):
        """logits (B,T,V) and the mean cross-entropy loss of idx (B,T) predicting targets, over
        the positions whose target is not -1 (llm.c's train_gpt2.py's ignore_index)."""
        T = idx.size(1)
        pos = torch.arange(T, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


# ----------------------------------------------------------------------------
# llm.c's parameter vector <-> the PyTorch module: the one place that maps them.
# Names with {} are per layer and stack to (L, ...). nn.Linear keeps its weight as (OC, C),
# llm.c's layout, so nothing is transposed; only wte gets zero rows from V up to Vp.

LLMC_TO_TORCH = [
    ("wte", "transformer.wte.weight"),
    ("wpe", "transformer.wpe.weight"),
    ("ln1w", "transformer.h.{}.ln_1.weight"),
    ("ln1b", "transformer.h.{}.ln_1.bias"),
    ("qkvw", "transformer.h.{}.attn.c_attn.weight"),
    ("qkvb", "transformer.h.{}.attn.c_attn.bias"),
    ("attprojw", "transformer.h.{}.attn.c_proj.weight"),
    ("attprojb", "transformer.h.{}.attn.c_proj.bias"),
    ("ln2w", "transformer.h.{}.ln_2.weight"),
    ("ln2b", "transformer.h.{}.ln_2.bias"),
    ("fcw", "transformer.h.{}.mlp.c_fc.weight"),
    ("fcb", "transformer.h.{}.mlp.c_fc.bias"),
    ("fcprojw", "transformer.h.{}.mlp.c_proj.weight"),
    ("fcprojb", "transformer.h.{}.mlp.c_proj.bias"),
    ("lnfw", "transformer.ln_f.weight"),
    ("lnfb", "transformer.ln_f.bias"),
]


def llmc_vector(model, grads=False):
    """The model's parameters (or, grads=True, their gradients) as llm.c's float32 vector."""
    config = model.config
    tensors = {name: (p.grad if grads else p) for name, p in model.named_parameters()}
    pieces = []
    for llmc_name, torch_name in LLMC_TO_TORCH:
        if "{}" in torch_name:
            tensor = torch.stack([tensors[torch_name.format(l)] for l in range(config.num_layers)])
        else:
            tensor = tensors[torch_name]
        if llmc_name == "wte":
            tensor = F.pad(tensor, (0, 0, 0, config.padded_vocab_size - config.vocab_size))
        pieces.append(tensor.detach().reshape(-1))
    return torch.cat(pieces).numpy().astype(np.float32, copy=False)


def build_model(config, params):
    """A GPT whose weights are llm.c's parameter vector params (wte's padding rows dropped)."""
    model = GPT(config)
    views = param_views(config, np.asarray(params, dtype=np.float32))
    tensors = dict(model.named_parameters())
    with torch.no_grad():
        for llmc_name, torch_name in LLMC_TO_TORCH:
            value = torch.from_numpy(np.array(views[llmc_name]))
            if llmc_name == "wte":
                value = value[:config.vocab_size]
            if "{}" in torch_name:
                for l in range(config.num_layers):
                    tensors[torch_name.format(l)].copy_(value[l])
            else:
                tensors[torch_name].copy_(value)
    return model


def init_params(config, seed):
    """GPT-2's random init as llm.c's train_gpt2.py does it, drawn from a generator seeded
    with seed: weights normal(0, 0.02), the residual projections (attprojw, fcprojw)
    normal(0, 0.02/sqrt(2L)), biases 0; LayerNorms keep their weight 1, bias 0. The draws
    come in llm.c's order: wte, wpe, then per layer qkvw, attprojw, fcw, fcprojw."""
    model = GPT(config)
    generator = torch.Generator().manual_seed(seed)
    residual_std = INIT_STD / math.sqrt(2 * config.num_layers)
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0.0, INIT_STD, generator=generator)
        model.transformer.wpe.weight.normal_(0.0, INIT_STD, generator=generator)
        for block in model.transformer.h:
            for linear, std in ((block.attn.c_attn, INIT_STD), (block.attn.c_proj, residual_std),
                                (block.mlp.c_fc, INIT_STD), (block.mlp.c_proj, residual_std)):
                linear.weight.normal_(0.0, std, generator=generator)
                linear.bias.zero_()
    return llmc_vector(model)


def pretrained_params(model_type):
    """(config, params) of OpenAI's GPT-2 from Hugging Face, in llm.c's layout."""
    need = f"-e {model_type} needs the transformers package and internet access to download it"
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        sys.exit(f"train_gpt2_torch.py: {need} (transformers is not installed)")
    try:
        hf = GPT2LMHeadModel.from_pretrained(model_type)
    except Exception as e:  # offline, no cache, ...: whatever the hub raised, on one line
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        sys.exit(f"train_gpt2_torch.py: {need} ({reason})")
    hf_config = hf.config
    config = GPT2Config(max_seq_len=hf_config.n_positions, vocab_size=hf_config.vocab_size,
                        padded_vocab_size=padded_vocab_size(hf_config.vocab_size),
                        num_layers=hf_config.n_layer, num_heads=hf_config.n_head,
                        channels=hf_config.n_embd)
    model = GPT(config)
    hf_tensors = hf.state_dict()
    # OpenAI's checkpoints use Conv1D, whose weights are (C, OC): transpose them to Linear's
    conv1d = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
              ".mlp.c_proj.weight")
    with torch.no_grad():
        for name, param in model.named_parameters():
            value = hf_tensors[name]
            param.copy_(value.t() if name.endswith(conv1d) else value)
    return config, llmc_vector(model)


# ----------------------------------------------------------------------------
# the reference computations

def as_tokens(a):
    return torch.from_numpy(np.asarray(a, dtype=np.int64))


def forward_backward(model, x, y, dtype="float32"):
    """One forward (at dtype, see autocast) + backward of model (any family's) on inputs x,
    targets y (B,T): (logits (B,T,V) float32, mean loss); the gradients are in the model."""
    with autocast(dtype):
        logits, loss = model(as_tokens(x), as_tokens(y))
    loss.backward()
    return logits.detach().float().numpy(), float(loss.item())


def reference_forward_backward(config, params, x, y, dtype="float32"):
    """One forward (at dtype: "float32", or "bfloat16" autocast) + backward of the model params
    (llm.c layout) on inputs x, targets y (B,T): (logits (B,T,V) float32, mean loss, gradients
    as llm.c's padded vector)."""
    model = build_model(config, params)
    logits, loss = forward_backward(model, x, y, dtype)
    return logits, loss, llmc_vector(model, grads=True)


def step_losses(model, x, y, steps=10, lr=ADAMW["lr"], beta1=ADAMW["beta1"],
                beta2=ADAMW["beta2"], eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
                dtype="float32"):
    """The losses of `steps` training steps of model (any family's) on the one batch (x, y),
    as test_gpt2.c runs them: forward (its loss is recorded; at dtype, see autocast),
    zero_grad, backward, AdamW update with weight decay on every parameter (in float32, the
    model's own precision, at every dtype)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(beta1, beta2), eps=eps,
                                  weight_decay=weight_decay)
    x, y = as_tokens(x), as_tokens(y)
    losses = []
    for _ in range(steps):
        with autocast(dtype):
            _, loss = model(x, y)
        losses.append(float(loss.item()))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return losses


def reference_losses(config, params, x, y, **options):
    """step_losses of the model params (llm.c layout); options as step_losses' (dtype too)."""
    return step_losses(build_model(config, params), x, y, **options)


def debug_state_name(name, dtype):
    """The debug state's file name for a model NAME at dtype (its losses: .losses.json)."""
    return f"{name}_debug_state.bin" if dtype == "float32" else f"{name}_debug_state_bf16.bin"


def write_reference_run(path, forward_backward_of, losses_of, config, params, x, y, steps,
                        dtype):
    """A family's debug state at path (forward_backward_of(config, params, x, y, dtype=)) and
    the losses of its `steps` AdamW steps (losses_of, likewise) beside it, .losses.json."""
    logits, loss, grads = forward_backward_of(config, params, x, y, dtype=dtype)
    write_debug_state(path, x, y, logits, loss, grads)
    print(f"wrote {path} (loss {loss:.6f}{', bf16 autocast' if dtype != 'float32' else ''})")
    losses = losses_of(config, params, x, y, steps=steps, dtype=dtype)
    for step, step_loss in enumerate(losses):
        print(f"step {step}: loss {step_loss:.6f}")
    record = {"losses": losses, **ADAMW, "decay": "all"}
    if dtype != "float32":
        record["dtype"] = dtype
    losses_path = os.path.splitext(path)[0] + ".losses.json"
    atomic_write(losses_path, [json.dumps(record, indent=2).encode() + b"\n"])
    print(f"wrote {losses_path}")


# ----------------------------------------------------------------------------
# the batch and the tokenizer

def _gpt2_encoding():
    """The GPT-2 BPE: the project's llmc/tokenizer.py, else tiktoken's (which may download)."""
    try:
        from llmc import tokenizer
        return tokenizer.gpt2_encoding()
    except Exception:
        pass
    try:
        import tiktoken
        return tiktoken.get_encoding("gpt2")
    except Exception:
        return None


def make_batch(config, B, T, seed, input_text=None):
    """tokens (B, T+1) -> x = tokens[:, :-1], y = tokens[:, 1:]; with a line saying where
    they came from: input_text tokenized with GPT-2's BPE, or random ids from the seed."""
    tokens, source = None, f"random token ids in [0, {config.vocab_size}) from seed {seed}"
    if input_text:
        encoding = _gpt2_encoding()
        if encoding is None:
            source += f" (no GPT-2 BPE available to tokenize {input_text})"
        else:
            with open(input_text, encoding="utf-8") as f:
                ids = getattr(encoding, "encode_ordinary", encoding.encode)(f.read())
            if len(ids) < B * (T + 1):
                sys.exit(f"train_gpt2_torch.py: {input_text}: {len(ids)} tokens, fewer than the "
                         f"B*(T+1)={B * (T + 1)} the batch needs")
            if max(ids[:B * (T + 1)]) >= config.vocab_size:
                sys.exit(f"train_gpt2_torch.py: {input_text}: GPT-2 token ids do not fit the "
                         f"model's vocab_size={config.vocab_size}")
            tokens = np.array(ids[:B * (T + 1)]).reshape(B, T + 1)
            source = f"the first {B * (T + 1)} GPT-2 tokens of {input_text}"
    if tokens is None:
        tokens = np.random.default_rng(seed).integers(0, config.vocab_size, size=(B, T + 1))
    tokens = tokens.astype(np.int32)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy(), source


def write_gpt2_tokenizer(path):
    """gpt2_tokenizer.bin from the project's llmc/tokenizer.py; on failure say so and go on."""
    try:
        from llmc import tokenizer
        encoding = tokenizer.gpt2_encoding()
        tokens = [encoding.decode_single_token_bytes(i) for i in range(encoding.n_vocab)]
        write_tokenizer(path, tokens, encoding.eot_token)
    except Exception as e:
        print(f"skipping {path}: no GPT-2 tokenizer ({type(e).__name__}: {e})".splitlines()[0])
        return
    print(f"wrote {path}")


# ----------------------------------------------------------------------------
# command line

def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="PyTorch reference for llm.pyx: writes an llm.c checkpoint (fp32, bf16), a "
                    "debug state and the losses of 10 AdamW steps on one batch.")
    parser.add_argument("-e", "--model", default="d12",
                        help="dN: random init of depth N (llm.c sizes for 6/12/24/36/48, else "
                             "C=64N NH=N); or gpt2, gpt2-medium, gpt2-large, gpt2-xl: OpenAI's "
                             "weights (needs transformers + internet) (default: d12)")
    parser.add_argument("-b", "--batch-size", type=int, default=4, help="B (default: 4)")
    parser.add_argument("-t", "--seq-len", type=int, default=64, help="T (default: 64)")
    parser.add_argument("-o", "--output-dir", default=".", help="where to write (default: .)")
    parser.add_argument("--name", help="file name stem (default: gpt2_dN, or gpt2_124M etc.)")
    parser.add_argument("--seed", type=int, default=0, help="init and batch seed (default: 0)")
    parser.add_argument("--steps", type=int, default=10, help="AdamW steps (default: 10)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="the forwards behind the debug state and the step losses: float32, "
                             "or bfloat16 autocast with float32 parameters and AdamW, as llm.c's "
                             "train_gpt2.py --dtype bfloat16; written as NAME_debug_state_bf16.* "
                             "(default: float32)")
    parser.add_argument("--input-text", metavar="FILE",
                        help="take the batch from this text (e.g. tinyshakespeare), tokenized with "
                             "GPT-2's BPE; default: random token ids")
    parser.add_argument("--tokenizer", action="store_true",
                        help="also write gpt2_tokenizer.bin (from tokenizer.py)")
    sizes = parser.add_argument_group("size overrides for -e dN (tiny test models)")
    sizes.add_argument("--vocab-size", type=int, help="V (default: 50257)")
    sizes.add_argument("--channels", type=int, help="C")
    sizes.add_argument("--heads", type=int, help="NH")
    sizes.add_argument("--max-seq-len", type=int, help="maxT (default: 1024)")
    args = parser.parse_args(argv)

    for name in ("batch_size", "seq_len", "vocab_size", "channels", "heads", "max_seq_len"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.steps < 0:
        parser.error(f"--steps must be >= 0, got {args.steps}")
    overrides = (args.vocab_size, args.channels, args.heads, args.max_seq_len)
    if args.model in PRETRAINED:
        if any(v is not None for v in overrides):
            parser.error(f"size overrides only apply to random init (-e dN), not {args.model}")
        args.config = None
    else:
        match = re.fullmatch(r"d(\d+)", args.model)
        if not match or int(match.group(1)) == 0:
            parser.error(f"-e must be dN (N >= 1) or one of {', '.join(PRETRAINED)}, "
                         f"got {args.model!r}")
        config = GPT2Config.from_depth(int(match.group(1)), max_seq_len=args.max_seq_len or 1024,
                                       vocab_size=args.vocab_size or 50257)
        try:
            args.config = dataclasses.replace(config, channels=args.channels or config.channels,
                                              num_heads=args.heads or config.num_heads)
        except ValueError as e:
            parser.error(str(e))
        if args.seq_len > args.config.max_seq_len:
            parser.error(f"-t {args.seq_len} exceeds max_seq_len {args.config.max_seq_len}")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.config is None:
        config, params = pretrained_params(args.model)
        if args.seq_len > config.max_seq_len:
            sys.exit(f"train_gpt2_torch.py: -t {args.seq_len} exceeds max_seq_len "
                     f"{config.max_seq_len}")
        name = args.name or f"gpt2_{PRETRAINED[args.model]}"
    else:
        config = args.config
        params = init_params(config, args.seed)
        name = args.name or f"gpt2_{args.model}"
    print(f"model: {args.model}, {config.describe()}, {config.num_parameters():,} parameters")
    B, T = args.batch_size, args.seq_len
    x, y, source = make_batch(config, B, T, args.seed, args.input_text)
    print(f"batch: B={B} T={T}, {source}")

    os.makedirs(args.output_dir, exist_ok=True)
    out = lambda filename: os.path.join(args.output_dir, filename)
    write_checkpoint(out(f"{name}.bin"), config, params, dtype="float32")
    write_checkpoint(out(f"{name}_bf16.bin"), config, params, dtype="bfloat16")
    print(f"wrote {out(name + '.bin')} and {out(name + '_bf16.bin')}")

    write_reference_run(out(debug_state_name(name, args.dtype)), reference_forward_backward,
                        reference_losses, config, params, x, y, args.steps, args.dtype)

    if args.tokenizer:
        write_gpt2_tokenizer(out("gpt2_tokenizer.bin"))


if __name__ == "__main__":
    main()
