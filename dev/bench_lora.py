"""
dev/bench_lora.py: how fast and how lean is a LoRA fine-tuning step of llm.pyx, next to
PyTorch + PEFT on the same machine?

Times LoRA steps (forward with targets, backward, AdamW on the adapters) of a model of a
preset's shape at random init, rank r on all seven projections of every layer, B examples of T
tokens: llm.pyx (llmc/adapter.py, the parameters frozen: no gradient of theirs computed) against
transformers' model of the same shape with peft.get_peft_model and torch.optim.AdamW, at fp32
and with bf16 autocast (PyTorch's faster one is its figure).  Each side runs in its own process
(its own peak RSS), the same threads.

    python dev/bench_lora.py --model SmolLM2-135M -t 256
    python dev/bench_lora.py --model llama-1b -b 1 -t 1024 --rank 16 --steps 2   (TinyLlama's)

Prints each side's ms/step (median of --steps after one warm-up), peak RSS, the ratios
llm.pyx / PyTorch, the step's GEMM FLOPs against full fine-tuning's (a frozen weight skips its
dweight GEMM, a third of its layer's; LoRA's thin GEMMs are added), and each side against the
GEMM-only time (those FLOPs at this machine's sgemm rate: kernels.matmul at 2048^3, the same
threads), the floor of a step at fp32.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dev.bench_step import batch, peak_rss_bytes  # noqa: E402   (its random tokens, its RSS)

SIDES = ("ours", "torch-fp32", "torch-bf16-autocast")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="SmolLM2-135M", help="a Llama preset (train_llama2.PRESETS)")
    p.add_argument("-b", dest="B", type=int, default=1)
    p.add_argument("-t", dest="T", type=int, default=256)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=3, help="timed steps, after one warm-up")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--sides", default=",".join(SIDES),
                   help="the sides to run, comma-separated (bf16 autocast is some 25x slower "
                        "than fp32 on a CPU without bf16 instructions)")
    p.add_argument("--recompute", default="all", help="llm.pyx's activation checkpointing")
    p.add_argument("--side", choices=SIDES + ("peak",), help=argparse.SUPPRESS)   # one, here
    return p.parse_args(argv)


def config_of(name):
    from train_llama2 import PRESETS
    return PRESETS[name]


def timed(step, steps):
    step()   # warm-up: allocations, threads
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def ours(args):
    from llmc import adapter
    from train_llama2 import Llama2
    config = config_of(args.model)
    model = Llama2(config, recompute=args.recompute)
    rng = np.random.default_rng(0)

    def fill(flat, store):   # in place (float32: the model's own): no second copy
        for start in range(0, flat.size, 1 << 24):
            part = flat[start:start + (1 << 24)]
            rng.standard_normal(out=part, dtype=np.float32)
            part *= 0.02
    model.fill_params(fill)
    adapter.attach(model, args.rank, 2.0 * args.rank)
    inputs, targets = batch(config, args.B, args.T)
    t = [0]

    def step():
        t[0] += 1
        model.zero_grad()
        loss = model.forward(inputs, targets)
        model.backward()
        model.update(1e-4, 0.9, 0.999, 1e-8, 0.0, t[0])
        return loss
    return timed(step, args.steps), model.num_trained


def torch_side(args, autocast):
    import peft
    import torch
    import transformers
    torch.set_num_threads(args.threads)
    config = config_of(args.model)
    kind = "Qwen3" if config.qk_norm else "Qwen2" if config.qkv_bias else "Llama"
    hf_config = getattr(transformers, f"{kind}Config")(
        hidden_size=config.dim, num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads, num_key_value_heads=config.n_kv_heads,
        intermediate_size=config.hidden_dim, vocab_size=config.vocab_size,
        max_position_embeddings=max(args.T, 128), rms_norm_eps=config.norm_eps,
        head_dim=config.head_size, tie_word_embeddings=config.shared_classifier,
        rope_theta=config.rope_theta)
    model = getattr(transformers, f"{kind}ForCausalLM")(hf_config)
    model = peft.get_peft_model(model, peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                       lora_dropout=0.0, target_modules=TARGETS))
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-4, weight_decay=0.0)
    inputs, targets = (torch.tensor(x, dtype=torch.long) for x in batch(config, args.B, args.T))

    def step():
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                     targets.flatten())
        loss.backward()
        optimizer.step()
    return timed(step, args.steps), sum(p.numel() for p in trained)


def gemm_flops(config, N, rank, lora):
    """The GEMM FLOPs of one step over N positions: each linear layer 2*N*C*OC for its forward,
    its dinp and (full fine-tuning) its dweight; LoRA's four thin GEMMs on top; the head."""
    C, H, hs = config.dim, config.hidden_dim, config.head_size
    QD, KVD = config.n_heads * hs, config.n_kv_heads * hs
    linears = [(C, QD), (C, KVD), (C, KVD), (QD, C), (C, H), (C, H), (H, C)]
    per_layer = 0
    for c, oc in linears:
        per_layer += 2 * N * c * oc * (2 if lora else 3)
        if lora:   # hidden, out +=; dhidden, dB, dA, dinp
            per_layer += 2 * N * rank * (c + oc) * 3
    head = 2 * N * C * config.vocab_size * (2 if lora else 3)
    return config.n_layers * per_layer + head


def main():
    args = parse_args()
    if args.side == "peak":   # this machine's sgemm rate, the same threads
        from llmc.dry_run import measure_gflops
        print(json.dumps(dict(gflops=measure_gflops(2048, 5))))
        return
    if args.side:
        run = ours if args.side == "ours" else lambda a: torch_side(a, "autocast" in args.side)
        seconds, trained = run(args)
        print(json.dumps(dict(seconds=seconds, peak=peak_rss_bytes(), trained=trained)))
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    results = {}
    for side in ["peak"] + args.sides.split(","):
        command = [sys.executable, __file__, "--side", side] + sys.argv[1:]
        out = subprocess.run(command, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{side}: failed\n{out.stderr[-2000:]}")
            continue
        results[side] = json.loads(out.stdout.strip().splitlines()[-1])
    config = config_of(args.model)
    peak = results.pop("peak")["gflops"]
    print(f"{args.model}: LoRA r={args.rank} on {', '.join(TARGETS)}, B={args.B} T={args.T}, "
          f"{args.threads} threads, llm.pyx's recompute {args.recompute}")
    for side, r in results.items():
        print(f"  {side:20s} {r['seconds'] * 1000:9.0f} ms/step  peak RSS "
              f"{r['peak'] / 2 ** 30:6.2f} GiB  {r['trained']:,} trained")
    if "ours" in results:
        peers = [s for s in results if s != "ours"]
        if peers:
            best = min(peers, key=lambda s: results[s]["seconds"])
            print(f"  llm.pyx / PyTorch + PEFT ({best}): time "
                  f"{results['ours']['seconds'] / results[best]['seconds']:.2f}x, peak RSS "
                  f"{results['ours']['peak'] / results[best]['peak']:.2f}x")
    N = args.B * args.T
    flops = gemm_flops(config, N, args.rank, True)
    print(f"  GEMM FLOPs of the LoRA step / full fine-tuning's: "
          f"{flops / gemm_flops(config, N, args.rank, False):.2f}")
    print(f"  GEMM-only time (its GEMM FLOPs at this machine's sgemm rate, {peak:.0f} GFLOP/s): "
          f"{flops / peak / 1e6:.0f} ms" + "".join(
              f"; {side} is {r['seconds'] * 1e3 / (flops / peak / 1e6):.2f}x it"
              for side, r in results.items()))


if __name__ == "__main__":
    main()
