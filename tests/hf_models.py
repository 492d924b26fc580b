"""
Small Hugging Face models of each architecture llm.pyx reads, made by transformers from a config
at test time with random weights (no hub is reachable): the shapes of today's small open models
at a few dozen channels, each with the switches of its family set.

    make_hf_model(name, folder)   saves the model there (transformers' save_pretrained) with a
                                  tokenizer of its kind (tests/hf_tokenizers.py) and returns the
                                  transformers model, float32, in eval mode
    checkpoint_path(kind, ...)    the saved model as each of PATH_KINDS gives it to a converter

Biases and norms are drawn away from their init (0 and 1), so that a switch read wrong shows in
the logits.  One model is saved in shards and one in bf16, as real checkpoints come.
"""
import numpy as np

from tests.hf_tokenizers import make_byte_level, make_sentencepiece_style

V = 512   # the test vocabulary (a model's own is 32,000 to 151,936 tokens)
LAYERS = dict(num_hidden_layers=2, max_position_embeddings=128)

# name -> (transformers' config and model classes' names, the config's sizes and switches)
ARCHITECTURES = {
    # Llama 3.2: grouped-query attention, a tied head, theta 500000, llama3 RoPE scaling
    # (a short original context, so that the scaling reaches the frequencies a test uses)
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=32))),
    # TinyLlama: Llama 2's block, one key/value head per four, a separate head
    "tinyllama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=1,
        rms_norm_eps=1e-5, tie_word_embeddings=False)),
    # SmolLM2: three query heads per key/value head, tied, theta 100000
    "smollm2": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=96, intermediate_size=128, num_attention_heads=3, num_key_value_heads=1,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=100000.0))),
    # Qwen2.5: a bias on q, k and v, theta 1e6, eps 1e-6, tied
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    # Qwen3: QK-norm, a head size of its own (4 heads of 32 on 64 channels), a separate head
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    # Mistral 7B v0.2 on: the Llama block, no sliding window
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        sliding_window=None, tie_word_embeddings=False)),
    # GPT-2 as GPT2LMHeadModel (Conv1D weights), without dropout
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(
        n_embd=64, n_layer=2, n_head=4, n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)),
}
SHARDED = "qwen3"      # saved in several files with their index
BFLOAT16 = "llama3"    # saved in bf16
SENTENCEPIECE_STYLE = ("tinyllama", "mistral")   # Llama 2's kind of vocabulary; the rest byte-level


def make_hf_config(name, **changes):
    import transformers
    config_class, _, sizes = ARCHITECTURES[name]
    sizes = dict(sizes, **({} if name == "gpt2" else LAYERS), **changes)
    return getattr(transformers, config_class)(vocab_size=V, **sizes)


def make_hf_model(name, folder, seed=0, **changes):
    """A random model of architecture name saved in folder; the transformers model (float32,
    as saved: rounded to bf16 first for BFLOAT16)."""
    import torch
    import transformers
    torch.manual_seed(seed)
    model = getattr(transformers, ARCHITECTURES[name][1])(make_hf_config(name, **changes))
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("bias") or "norm" in param_name or "ln_" in param_name:
                param.add_(torch.randn_like(param) * 0.1)
    if name == BFLOAT16:
        model = model.to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="40KB" if name == SHARDED else "1GB")
    (make_sentencepiece_style if name in SENTENCEPIECE_STYLE else make_byte_level)(folder, 400)
    return model.float().eval()


def hf_logits(model, tokens):
    """transformers' logits (B, T, V) of int tokens (B, T), float32 NumPy."""
    import torch
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()


# the kinds of paths a checkpoint is given as (dev/download_gpt2.py, dev/download_llama.py)
PATH_KINDS = ["folder", "sharded folder", "file beside config.json",
              "file with config.json in its metadata"]


def checkpoint_path(kind, folder, hf_model, tmp_path):
    """The model saved in folder (hf_model: its transformers model) as a path of this kind of
    PATH_KINDS, written under tmp_path where it is not folder's own."""
    import json
    from llmc.formats.huggingface import read_safetensors, write_hf_model_file
    if kind == "folder":
        return folder
    if kind == "sharded folder":
        hf_model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
        assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
        return tmp_path / "sharded"
    if kind == "file beside config.json":
        return folder / "model.safetensors"
    assert kind == "file with config.json in its metadata"
    hf_config = json.loads((folder / "config.json").read_text())
    tensors = dict(read_safetensors(folder / "model.safetensors"))
    write_hf_model_file(tmp_path / "model.safetensors", tensors, hf_config)
    return tmp_path / "model.safetensors"
