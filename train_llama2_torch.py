"""
The PyTorch reference for llm.pyx's Llama 2, in the role train_gpt2_torch.py plays for GPT-2:
Llama 2 as Meta's reference and llama2.c's model.py define it (float32, CPU), writing the
files that the Cython trainer will be checked against.

    python train_llama2_torch.py -e stories15M -b 4 -t 64 -o out     llama2.c's 15M sizes
    python train_llama2_torch.py -e d2 --vocab-size 61 -o out        a tiny test model
    python train_llama2_torch.py -e d2 --dtype bfloat16 -o out       its bf16 autocast state

The model, per layer:  x += wo(attention(rope(wq(rmsnorm(x))), rope(wk(..)), wv(..)))
                       x += w2(silu(w1(rmsnorm(x))) * w3(rmsnorm(x)))
token embedding first (no position table: RoPE), a final RMSNorm and the output head last
(the embedding itself with a shared classifier), no biases anywhere, grouped-query attention
where n_kv_heads < n_heads.  Every model starts from llama2.c's random init (there is no
pretrained-weight reader yet).

writes to the output directory, for NAME (--name; default llama2_<model>):
    NAME.bin                      the model, in llama2.c's version-1 float32 format
    NAME_debug_state.bin          one batch (x, y), then the logits, mean loss and gradients
                                  of one forward + backward on it (llm.c's debug state format)
    NAME_debug_state.losses.json  the losses of 10 AdamW steps on that same batch, as llm.c's
                                  test_gpt2.c runs them, with the optimizer's settings
(with --dtype bfloat16, as train_gpt2_torch.py's: every forward under bf16 autocast on the CPU,
float32 parameters and AdamW, written as NAME_debug_state_bf16.bin and .losses.json)

Tests import reference_forward_backward() and reference_losses(), which start from a flat
parameter vector in train_llama2.LlamaConfig.param_shapes() order and take dtype="float32" or
"bfloat16" (autocast).
"""
import argparse
import math
import os

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

from llmc.formats import param_views
from llmc.formats.llama2c import write_llama_model
from llmc.rope_tables import rope_tables
from train_llama2 import PRESETS, LlamaConfig, llama2c_hidden_dim
# test_gpt2.c's training loop and its files, the init's std and the dtypes, as for GPT-2
from train_gpt2_torch import (DTYPES, INIT_STD, debug_state_name, forward_backward,
                              step_losses, write_reference_run)


# ----------------------------------------------------------------------------
# the model, as llama2.c's model.py (Meta's reference without the KV cache)

class RMSNorm(nn.Module):

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rope(x, cos, sin):
    """x (B,T,H,hs): each adjacent pair (2i, 2i+1) rotated by the angle of (t, i)."""
    x0, x1 = x.reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(3)


class Attention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.head_size = config.head_size
        self.wq = nn.Linear(config.dim, config.n_heads * self.head_size, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * self.head_size, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * self.head_size, bias=False)
        self.wo = nn.Linear(config.n_heads * self.head_size, config.dim, bias=False)
        maxT = config.max_seq_len
        self.register_buffer("causal", torch.tril(torch.ones(maxT, maxT, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        NH, NKV, hs = self.n_heads, self.n_kv_heads, self.head_size
        q = apply_rope(self.wq(x).view(B, T, NH, hs), cos, sin)
        k = apply_rope(self.wk(x).view(B, T, NKV, hs), cos, sin)
        v = self.wv(x).view(B, T, NKV, hs)
        # grouped-query attention: kv head j serves query heads j*NH/NKV .. (j+1)*NH/NKV - 1
        k = k.repeat_interleave(NH // NKV, dim=2)
        v = v.repeat_interleave(NH // NKV, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, NH, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, NH, T, T)
        att = att.masked_fill(~self.causal[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * hs)  # heads side by side
        return self.wo(y)


class FeedForward(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.w2 = nn.Linear(config.hidden_dim, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList([TransformerBlock(config) for _ in range(config.n_layers)])
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.shared_classifier:
            self.output.weight = self.tok_embeddings.weight
        # the model's own tables (llmc/rope_tables.py: float64, rounded once; Meta's are float32,
        # ~2e-4 rad off at t = 4096), so the parity checks compare the layers, not the tables
        cos, sin = rope_tables(config.max_seq_len, config.head_size, config.rope_theta)
        self.register_buffer("rope_cos", torch.from_numpy(cos), persistent=False)
        self.register_buffer("rope_sin", torch.from_numpy(sin), persistent=False)

    def forward(self, idx, targets):
        """logits (B,T,V) and the mean cross-entropy loss of idx (B,T) predicting targets, over
        the positions whose target is not -1 (llm.c's train_gpt2.py's ignore_index)."""
        T = idx.size(1)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.output(self.norm(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


# ----------------------------------------------------------------------------
# the flat parameter vector <-> the PyTorch module: the one place that maps them.
# Names with {} are per layer and stack to (L, ...); nn.Linear's (out, in) weights are the
# vector's layout, so nothing is transposed.

FLAT_TO_TORCH = {
    "tok_embeddings": "tok_embeddings.weight",
    "attention_norm": "layers.{}.attention_norm.weight",
    "wq": "layers.{}.attention.wq.weight",
    "wk": "layers.{}.attention.wk.weight",
    "wv": "layers.{}.attention.wv.weight",
    "wo": "layers.{}.attention.wo.weight",
    "ffn_norm": "layers.{}.ffn_norm.weight",
    "w1": "layers.{}.feed_forward.w1.weight",
    "w2": "layers.{}.feed_forward.w2.weight",
    "w3": "layers.{}.feed_forward.w3.weight",
    "norm": "norm.weight",
    "output": "output.weight",
}


def flat_vector(model, grads=False):
    """The model's parameters (or, grads=True, their gradients) as one float32 vector."""
    config = model.config
    tensors = {name: (p.grad if grads else p) for name, p in model.named_parameters()}
    pieces = []
    for name, _ in config.param_shapes():
        torch_name = FLAT_TO_TORCH[name]
        if "{}" in torch_name:
            tensor = torch.stack([tensors[torch_name.format(l)] for l in range(config.n_layers)])
        else:
            tensor = tensors[torch_name]
        pieces.append(tensor.detach().reshape(-1))
    return torch.cat(pieces).numpy().astype(np.float32, copy=False)


def build_model(config, params):
    """A Transformer whose weights are the flat vector params."""
    model = Transformer(config)
    views = param_views(config, np.asarray(params, dtype=np.float32))
    tensors = dict(model.named_parameters())
    with torch.no_grad():
        for name, _ in config.param_shapes():
            torch_name, value = FLAT_TO_TORCH[name], torch.from_numpy(np.array(views[name]))
            if "{}" in torch_name:
                for l in range(config.n_layers):
                    tensors[torch_name.format(l)].copy_(value[l])
            else:
                tensors[torch_name].copy_(value)
    return model


def init_params(config, seed):
    """llama2.c's random init, drawn tensor by tensor in param_shapes() order from a
    generator seeded with seed: every matrix and the embedding normal(0, 0.02), but wo and
    w3 normal(0, 0.02/sqrt(2L)) (llama2.c scales w3, not w2); the RMSNorm weights 1."""
    generator = torch.Generator().manual_seed(seed)
    residual_std = INIT_STD / math.sqrt(2 * config.n_layers)
    pieces = []
    for name, shape in config.param_shapes():
        if name in ("attention_norm", "ffn_norm", "norm"):
            pieces.append(torch.ones(math.prod(shape)))
        else:
            std = residual_std if name in ("wo", "w3") else INIT_STD
            pieces.append(torch.empty(math.prod(shape)).normal_(0.0, std, generator=generator))
    return torch.cat(pieces).numpy()


# ----------------------------------------------------------------------------
# the reference computations

def reference_forward_backward(config, params, x, y, dtype="float32"):
    """One forward (at dtype: "float32", or "bfloat16" autocast) + backward of the model params
    (flat vector) on inputs x, targets y (B,T): (logits (B,T,V) float32, mean loss, gradients
    as a flat vector)."""
    model = build_model(config, params)
    logits, loss = forward_backward(model, x, y, dtype)
    return logits, loss, flat_vector(model, grads=True)


def reference_losses(config, params, x, y, **options):
    """step_losses (train_gpt2_torch's: test_gpt2.c's 10 AdamW steps on one batch) of the
    model params (flat vector); options as step_losses' (dtype too)."""
    return step_losses(build_model(config, params), x, y, **options)


def make_batch(config, B, T, seed):
    """Random token ids in [0, V): x (B,T), y (B,T) = the same sequences shifted by one.
    (No Llama tokenizer yet, so no --input-text as train_gpt2_torch.py has.)"""
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, size=(B, T + 1))
    tokens = tokens.astype(np.int32)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()


# ----------------------------------------------------------------------------
# command line

SIZE_FLAGS = {"dim": "dim", "layers": "n_layers", "heads": "n_heads", "kv_heads": "n_kv_heads",
              "vocab_size": "vocab_size", "hidden_dim": "hidden_dim", "max_seq_len": "max_seq_len"}


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="PyTorch reference for llm.pyx's Llama 2: writes a model (llama2.c "
                    "float32 format), a debug state and the losses of 10 AdamW steps on one "
                    "batch, from llama2.c's random init.")
    parser.add_argument("-e", "--model", default="stories15M",
                        help=f"a preset ({', '.join(PRESETS)}) or dN: a tiny model of depth N "
                             f"(dim 64N, N heads, N/2 kv heads for even N, else 1) "
                             f"(default: stories15M)")
    parser.add_argument("-b", "--batch-size", type=int, default=4, help="B (default: 4)")
    parser.add_argument("-t", "--seq-len", type=int, default=64, help="T (default: 64)")
    parser.add_argument("-o", "--output-dir", default=".", help="where to write (default: .)")
    parser.add_argument("--name", help="file name stem (default: llama2_<model>)")
    parser.add_argument("--seed", type=int, default=0, help="init and batch seed (default: 0)")
    parser.add_argument("--steps", type=int, default=10, help="AdamW steps (default: 10)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="the forwards behind the debug state and the step losses: float32, "
                             "or bfloat16 autocast with float32 parameters and AdamW (as "
                             "train_gpt2_torch.py's); written as NAME_debug_state_bf16.* "
                             "(default: float32)")
    sizes = parser.add_argument_group("size overrides (tiny test models)")
    sizes.add_argument("--dim", type=int, help="C")
    sizes.add_argument("--layers", type=int, help="L")
    sizes.add_argument("--heads", type=int, help="NH")
    sizes.add_argument("--kv-heads", type=int, help="NKV, a divisor of NH")
    sizes.add_argument("--vocab-size", type=int, help="V (default: 32000)")
    sizes.add_argument("--hidden-dim", type=int,
                       help="H (default: the preset's; with --dim, llama2.c's rule from dim)")
    sizes.add_argument("--max-seq-len", type=int, help="maxT")
    sizes.add_argument("--shared-classifier", action=argparse.BooleanOptionalAction,
                       help="tie the output head to the token embedding (default: the preset's)")
    args = parser.parse_args(argv)

    for name in ("batch_size", "seq_len", *SIZE_FLAGS):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.steps < 0:
        parser.error(f"--steps must be >= 0, got {args.steps}")
    overrides = {field: getattr(args, flag) for flag, field in SIZE_FLAGS.items()
                 if getattr(args, flag) is not None}
    if args.dim is not None and args.hidden_dim is None:
        overrides["hidden_dim"] = llama2c_hidden_dim(args.dim)
    if args.shared_classifier is not None:
        overrides["shared_classifier"] = args.shared_classifier
    try:
        args.config = LlamaConfig.from_name(args.model, **overrides)
    except ValueError as e:
        parser.error(str(e))
    if args.seq_len > args.config.max_seq_len:
        parser.error(f"-t {args.seq_len} exceeds max_seq_len {args.config.max_seq_len}")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    config = args.config
    name = args.name or f"llama2_{args.model}"
    print(f"model: {args.model}, {config.describe()}, {config.num_parameters():,} parameters")
    params = init_params(config, args.seed)
    B, T = args.batch_size, args.seq_len
    x, y = make_batch(config, B, T, args.seed)
    print(f"batch: B={B} T={T}, random token ids in [0, {config.vocab_size}) from seed {args.seed}")

    os.makedirs(args.output_dir, exist_ok=True)
    out = lambda filename: os.path.join(args.output_dir, filename)
    write_llama_model(out(f"{name}.bin"), config, params)
    print(f"wrote {out(name + '.bin')} (llama2.c version 1, float32)")

    write_reference_run(out(debug_state_name(name, args.dtype)), reference_forward_backward,
                        reference_losses, config, params, x, y, args.steps, args.dtype)


if __name__ == "__main__":
    main()
