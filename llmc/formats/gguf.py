"""
GGUF, llama.cpp's file, through its own Python package (gguf): a Llama-family model in float32,
or with its matrices in bf16 (llama.cpp's BF16: the vectors, norms and biases stay float32, as
its converter writes them), with its vocabulary (SentencePiece or byte-level BPE), so llama.cpp
runs what we trained, and read back; and a LoRA adapter as llama.cpp's --lora reads it
(write_gguf_lora).

llama.cpp runs the model as the architecture its config says (gguf_architecture): "qwen3" with
QK-norm (attn_q_norm, attn_k_norm), "qwen2" with the bias on q, k and v (attn_q.bias, ...),
else "llama" (Llama 2's block, Mistral's; Llama 3's RoPE scaling as the rope_freqs tensor, the
divisor of each of a head's frequencies, as llama.cpp's converter writes it).  A head size of
its own is attention.key_length and value_length.  "llama" rotates adjacent channel pairs, as
we do: q and k go in unpermuted, and so do the rows of their LoRA B, which are the rows of the
same outputs.  "qwen2" and "qwen3" rotate halves (llama.cpp's NEOX RoPE), as Hugging Face does:
their q and k rows, biases and norms go in Hugging Face's rotate-half order (common.py), as
llama.cpp's converter takes them from Hugging Face's files.  GPT-2's vocabulary has no merges
list in llm.c's tokenizer file: bpe_merges reconstructs it from the tokens' rank order.
"""
import os

import numpy as np

from llmc.formats.common import (ROTATED, FormatError, bfloat16_bits_to_float32,
                                 float32_to_bfloat16_bits, hf_adjacent_pair_rows, hf_rotate_half_rows,
                                 open_file, param_views, rotated_heads)
from llmc.formats.llama2c import read_llama2c_tokenizer
from llmc.formats.llmc import TOKENIZER_MAGIC, read_tokenizer
from llmc.rope_tables import llama3_scaled

GGUF_LLAMA_TENSORS = {  # ours -> llama.cpp's, {l} the layer
    "tok_embeddings": "token_embd.weight", "norm": "output_norm.weight", "output": "output.weight",
    "attention_norm": "blk.{l}.attn_norm.weight", "wq": "blk.{l}.attn_q.weight",
    "wk": "blk.{l}.attn_k.weight", "wv": "blk.{l}.attn_v.weight", "wo": "blk.{l}.attn_output.weight",
    "bq": "blk.{l}.attn_q.bias", "bk": "blk.{l}.attn_k.bias", "bv": "blk.{l}.attn_v.bias",
    "q_norm": "blk.{l}.attn_q_norm.weight", "k_norm": "blk.{l}.attn_k_norm.weight",
    "ffn_norm": "blk.{l}.ffn_norm.weight", "w1": "blk.{l}.ffn_gate.weight",
    "w2": "blk.{l}.ffn_down.weight", "w3": "blk.{l}.ffn_up.weight",
}
# the matrices, which a BF16 file holds in bf16 (the norms and biases stay float32, as llama.cpp's
# converter writes them)
GGUF_MATRICES = ("tok_embeddings", "output", "wq", "wk", "wv", "wo", "w1", "w2", "w3")
ROPE_FREQS = "rope_freqs.weight"   # (hs/2,) Llama 3's scaling: what each frequency is divided by
# llama.cpp's architectures written here -> the Hugging Face class of their models
# (LlamaConfig.architecture; "": Llama's) and the config's switches they have
GGUF_ARCHITECTURES = {"llama": ("", {}), "qwen2": ("Qwen2ForCausalLM", {"qkv_bias": True}),
                      "qwen3": ("Qwen3ForCausalLM", {"qk_norm": True})}
ROTATING_HALVES = ("qwen2", "qwen3")   # llama.cpp's NEOX RoPE: q/k rows in rotate-half order


class GGUFVocab:
    """A vocabulary as GGUF's tokenizer.ggml.* keys hold it: llama.cpp's tokenizer `model`
    ("llama": SentencePiece, "gpt2": byte-level BPE), each token's text and gguf TokenType, the
    SentencePiece scores or the BPE merges, the special ids, and whether a text gets BOS and
    EOS."""

    def __init__(self, model, tokens, types, scores=None, merges=None, pre=None,
                 bos=None, eos=None, unk=None, add_bos=False, add_eos=False):
        self.model, self.tokens, self.types, self.scores = model, tokens, types, scores
        self.merges, self.pre, self.bos, self.eos, self.unk = merges, pre, bos, eos, unk
        self.add_bos, self.add_eos = add_bos, add_eos

    def add_to(self, writer):
        writer.add_tokenizer_model(self.model)
        if self.pre is not None:
            writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.types)
        if self.scores is not None:
            writer.add_token_scores(self.scores)
        if self.merges is not None:
            writer.add_token_merges(self.merges)
        for add, token_id in ((writer.add_unk_token_id, self.unk), (writer.add_bos_token_id, self.bos),
                              (writer.add_eos_token_id, self.eos)):
            if token_id is not None:
                add(token_id)
        writer.add_add_bos_token(self.add_bos)
        writer.add_add_eos_token(self.add_eos)


def sentencepiece_gguf_vocab(pieces, scores):
    """The GGUF vocabulary of a llama2.c tokenizer.bin's pieces and scores: spaces back to
    U+2581 as SentencePiece spells them, BOS/EOS as <s> and </s>."""
    import gguf
    tokens, types = [], []
    for i, piece in enumerate(pieces):
        text = {b"\n<s>\n": "<s>", b"\n</s>\n": "</s>"}.get(piece) or \
            piece.decode("utf-8", errors="replace").replace(" ", "\u2581")
        tokens.append(text)
        if i == 0:
            types.append(gguf.TokenType.UNKNOWN)
        elif i in (1, 2):
            types.append(gguf.TokenType.CONTROL)
        elif len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    return GGUFVocab("llama", tokens, types, scores=[float(s) for s in scores],
                     unk=0, bos=1, eos=2, add_bos=True)


def gpt2_byte_text():
    """byte -> the printable character GPT-2's vocabulary files spell it with: printable
    Latin-1 bytes stand for themselves, the other 68 for U+0100 onwards in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    text, unprintable = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in text:
            text[b] = chr(0x100 + unprintable)
            unprintable += 1
    return text


def bpe_merges(token_bytes, special=()):
    """The merges of a byte-level BPE vocabulary listed in rank order (as tiktoken's and
    llm.c's GPT-2 files are): token r's pair is what BPE with the merges below r leaves of its
    bytes; one pair per multi-byte token, in the order of the tokens they make."""
    rank = {t: i for i, t in enumerate(token_bytes) if i not in special}
    merges = []
    for r, token in enumerate(token_bytes):
        if r in special or len(token) < 2:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            ranks = [rank.get(parts[j] + parts[j + 1], r) for j in range(len(parts) - 1)]
            best = min(range(len(ranks)), key=ranks.__getitem__)
            if ranks[best] >= r:
                raise ValueError(f"token {r} ({token!r}) is not made by merging earlier tokens: "
                                 f"not a BPE vocabulary in rank order")
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        if rank.get(parts[0], r) >= r or rank.get(parts[1], r) >= r:
            raise ValueError(f"token {r} ({token!r}) is not made by merging earlier tokens: "
                             f"not a BPE vocabulary in rank order")
        merges.append((parts[0], parts[1]))
    return merges


def gpt2_token_texts(token_bytes, special=()):
    """Each token's text as GPT-2's vocabulary files spell it, GGUF's and Hugging Face's alike
    (gpt2_byte_text; a special token its own UTF-8 text)."""
    byte_text = gpt2_byte_text()
    return [t.decode("utf-8") if i in special else "".join(byte_text[x] for x in t)
            for i, t in enumerate(token_bytes)]


def gpt2_spelled(token_bytes, special=()):
    """A byte-level BPE vocabulary (each token's bytes in rank order) as GPT-2's vocabulary
    files spell it: each token's text (gpt2_token_texts) and the merges "a b", rebuilt from
    the ranks."""
    merges = bpe_merges(token_bytes, special)
    spelled = gpt2_token_texts([part for pair in merges for part in pair])
    return (gpt2_token_texts(token_bytes, special),
            [f"{a} {b}" for a, b in zip(spelled[::2], spelled[1::2])])


def gpt2_gguf_vocab(token_bytes, eot_token, vocab_size):
    """The GGUF vocabulary ("gpt2" byte-level BPE, GPT-2's pre-tokenizer) of llm.c's
    tokenizer file (each token's bytes in rank order, the end-of-text id), padded to the
    model's vocab_size with unused tokens as llm.c pads GPT-2's 50257 to 50304."""
    import gguf
    if vocab_size < len(token_bytes):
        raise ValueError(f"the tokenizer has {len(token_bytes)} tokens, more than the model's "
                         f"vocabulary {vocab_size}")
    special = () if eot_token is None else (eot_token,)
    tokens, merges = gpt2_spelled(token_bytes, special)
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
             for i in range(len(token_bytes))]
    for i in range(len(token_bytes), vocab_size):
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
    return GGUFVocab("gpt2", tokens, types, merges=merges, pre="gpt-2", bos=eot_token,
                     eos=eot_token)


def gguf_vocab(tokenizer_path, vocab_size):
    """The GGUF vocabulary of a tokenizer file: llm.c's (GPT-2 BPE) or llama2.c's
    tokenizer.bin (SentencePiece), told apart by llm.c's magic number."""
    with open_file(tokenizer_path) as f:
        head = f.read(4)
    if int.from_bytes(head, "little", signed=True) == TOKENIZER_MAGIC:
        token_bytes, eot_token = read_tokenizer(tokenizer_path)
        return gpt2_gguf_vocab(token_bytes, eot_token, vocab_size)
    pieces, scores = read_llama2c_tokenizer(tokenizer_path)
    return sentencepiece_gguf_vocab(pieces, scores)


def write_through_gguf(path, architecture, add):
    """A GGUF file written by gguf's writer: add(writer, gguf) adds its keys and tensors (gguf
    the package); written beside path and renamed into it when whole, so that a failure leaves
    nothing there."""
    try:
        import gguf
    except ImportError:
        raise RuntimeError("GGUF export needs the gguf package (llama.cpp's writer): "
                           "pip install gguf") from None
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    writer = gguf.GGUFWriter(tmp, architecture)
    try:
        add(writer, gguf)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def unwritten_switch(config):
    """What of a Llama-family config none of llama.cpp's architectures written here runs, in
    words; None when it has nothing of the kind."""
    if config.qkv_bias and config.qk_norm:
        return "QK-norm beside a bias on q, k and v (llama.cpp's qwen3 has QK-norm alone)"
    if config.rope_scaling and (config.qkv_bias or config.qk_norm):
        return ("Llama 3's RoPE scaling on a Qwen block (llama.cpp's qwen2 and qwen3 read no "
                "rope_freqs)")
    return None


def gguf_architecture(config):
    """llama.cpp's architecture of a Llama-family config (one unwritten_switch passes): "qwen3"
    with QK-norm, "qwen2" with the qkv bias, else "llama"."""
    return "qwen3" if config.qk_norm else "qwen2" if config.qkv_bias else "llama"


def llama3_rope_divisors(config):
    """Llama 3's RoPE scaling as llama.cpp's rope_freqs holds it: what each of a head's hs/2
    frequencies is divided by (1 for the fast ones, the factor for the slow ones, a blend
    between), float32."""
    hs = config.head_size
    freqs = np.float64(config.rope_theta) ** (-np.arange(0, hs, 2, dtype=np.float64) / hs)
    return (freqs / llama3_scaled(freqs, *config.rope_scaling[1:])).astype(np.float32)


def write_gguf(path, config, params, vocab, name="llm.pyx llama", dtype="float32"):
    """A GGUF file of this Llama-family model with its vocabulary (a GGUFVocab, see gguf_vocab),
    as llama.cpp's architecture of it (gguf_architecture) reads it: dtype "float32", or
    "bfloat16" (its matrices rounded to the nearest bf16, ties to even; the rest float32)."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"write_gguf: dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    if len(vocab.tokens) != config.vocab_size:
        raise ValueError(f"write_gguf: the tokenizer has {len(vocab.tokens)} tokens, the model's "
                         f"vocabulary {config.vocab_size}")
    if unwritten_switch(config):
        raise ValueError(f"write_gguf: the model has {unwritten_switch(config)}, which GGUF "
                         f"export does not write")
    architecture = gguf_architecture(config)
    views = param_views(config, np.ascontiguousarray(params, dtype=np.float32))

    def add(writer, gguf):
        writer.add_name(name)
        writer.add_context_length(config.max_seq_len)
        writer.add_embedding_length(config.dim)
        writer.add_block_count(config.n_layers)
        writer.add_feed_forward_length(config.hidden_dim)
        writer.add_rope_dimension_count(config.head_size)
        writer.add_head_count(config.n_heads)
        writer.add_head_count_kv(config.n_kv_heads)
        if config.head_dim:   # a head size of its own (0: dim / n_heads, llama.cpp's default)
            writer.add_key_length(config.head_size)
            writer.add_value_length(config.head_size)
        writer.add_layer_norm_rms_eps(config.norm_eps)
        writer.add_rope_freq_base(config.rope_theta)
        writer.add_vocab_size(config.vocab_size)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "float32"
                             else gguf.LlamaFileType.MOSTLY_BF16)
        vocab.add_to(writer)
        for ours, theirs in GGUF_LLAMA_TENSORS.items():
            if ours not in views:
                continue
            per_layer = "{l}" in theirs
            for l in range(config.n_layers if per_layer else 1):
                tensor = views[ours][l] if per_layer else views[ours]
                if architecture in ROTATING_HALVES and ours in ROTATED:
                    tensor = hf_rotate_half_rows(tensor, rotated_heads(config, ours))
                if dtype == "bfloat16" and ours in GGUF_MATRICES:
                    writer.add_tensor(theirs.format(l=l), float32_to_bfloat16_bits(tensor),
                                      raw_dtype=gguf.GGMLQuantizationType.BF16)
                else:
                    writer.add_tensor(theirs.format(l=l), np.ascontiguousarray(tensor))
        if config.rope_scaling:
            writer.add_tensor(ROPE_FREQS, llama3_rope_divisors(config))
    write_through_gguf(path, architecture, add)


def gguf_as_stored(config, params, dtype):
    """params (float32) as a GGUF file of dtype holds them (write_gguf): at "bfloat16" each
    matrix rounded to bf16, the vectors as they are."""
    stored = np.array(params, dtype=np.float32)
    if dtype == "bfloat16":
        for ours, view in param_views(config, stored).items():
            if ours in GGUF_MATRICES:
                view[...] = bfloat16_bits_to_float32(float32_to_bfloat16_bits(view))
    return stored


def write_gguf_lora(path, lora, stacks, config, name="llm.pyx LoRA"):
    """llama.cpp's LoRA adapter file (its --lora, llama_adapter_lora_init) of the updates of a
    Llama-family model (config: the base's, whose GGUF write_gguf writes): lora a LoraConfig
    (rank, alpha, targets, layers), stacks its tensors as llmc.adapter.read_adapter_file gives
    them ("wq.lora_A" (layers, R, C), "wq.lora_B" (layers, OC, R), B's rows in our order).  The
    keys general.type "adapter", the base's architecture, adapter.type "lora" and
    adapter.lora.alpha (llama.cpp scales by alpha / R, R read off lora_a, as PEFT does); per
    adapted layer l and target, blk.l.attn_q.weight.lora_a (R, C) and .lora_b (OC, R) beside
    the base tensor they update (ggml's shapes [C, R] and [R, OC]), float32, B's q and k rows
    in the order of the base GGUF's."""
    if unwritten_switch(config):
        raise ValueError(f"write_gguf_lora: the base model has {unwritten_switch(config)}, "
                         f"which GGUF export does not write: its adapter would have no GGUF base")
    architecture = gguf_architecture(config)

    def add(writer, gguf):
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_name(name)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, lora.alpha)
        for j, l in enumerate(lora.layers):
            for target in lora.targets:
                base = GGUF_LLAMA_TENSORS[target].format(l=l)
                for matrix in ("lora_A", "lora_B"):
                    tensor = stacks[f"{target}.{matrix}"][j]
                    if matrix == "lora_B" and architecture in ROTATING_HALVES and target in ROTATED:
                        tensor = hf_rotate_half_rows(tensor, rotated_heads(config, target))
                    writer.add_tensor(f"{base}.{matrix.lower()}",
                                      np.ascontiguousarray(tensor, dtype=np.float32))
    write_through_gguf(path, architecture, add)


def read_gguf_vocab(path):
    """(llama.cpp's tokenizer model: "llama" or "gpt2", its tokens' texts, their scores or
    None) of a GGUF file, through gguf's reader."""
    import gguf
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise FormatError(path, f"not a GGUF file: {' '.join(str(e).split())}") from None
    fields = {key: reader.get_field(f"tokenizer.ggml.{key}") for key in ("model", "tokens",
                                                                           "scores")}
    if fields["model"] is None or fields["tokens"] is None:
        raise FormatError(path, "no tokenizer.ggml.model or tokens: a GGUF without its vocabulary")
    scores = fields["scores"]
    return (fields["model"].contents(), fields["tokens"].contents(),
            None if scores is None else [float(v) for v in scores.contents()])


def llama2c_pieces(tokens):
    """A SentencePiece GGUF vocabulary's tokens as llama2.c's tokenizer.bin spells its pieces
    (bytes, U+2581 as a space, <s> and </s> within newlines): sentencepiece_gguf_vocab undone."""
    return [{"<s>": b"\n<s>\n", "</s>": b"\n</s>\n"}.get(text) or
            text.replace("\u2581", " ").encode("utf-8") for text in tokens]


def read_gguf(path, config_class):
    """(config, params, tokens) of a float32 or BF16 GGUF file of llama.cpp's llama, qwen2 or qwen3
    architecture, as write_gguf writes them, through gguf's reader; the config a config_class
    (train_llama2.LlamaConfig).  Llama 3's RoPE scaling is refused in one line: rope_freqs
    holds its divisors, not the parameters (factor, frequency factors, original context) a
    config is made of."""
    import gguf
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise FormatError(path, f"not a GGUF file: {' '.join(str(e).split())}") from None
    required = object()

    def field(key, default=required):
        f = reader.get_field(key)
        if f is None and default is required:
            raise FormatError(path, f"no {key}: not a GGUF of a model as written here?")
        return default if f is None else f.contents()
    architecture = field("general.architecture")
    if architecture not in GGUF_ARCHITECTURES:
        raise FormatError(path, f"architecture {architecture!r}, not "
                                f"{', '.join(GGUF_ARCHITECTURES)}")
    hf_class, switches = GGUF_ARCHITECTURES[architecture]
    key = lambda name, *default: field(f"{architecture}.{name}", *default)   # noqa: E731
    tensors = {t.name: t for t in reader.tensors}
    if ROPE_FREQS in tensors:
        raise FormatError(path, f"{ROPE_FREQS} (Llama 3's RoPE scaling, as divisors of each "
                                f"frequency) is not read back here: it holds no scaling's "
                                f"parameters")
    head_dim = key("attention.key_length", 0)
    if key("attention.value_length", head_dim) != head_dim:
        raise FormatError(path, f"attention.value_length {key('attention.value_length')} is not "
                                f"key_length {head_dim}: not implemented")
    config = config_class(
        dim=key("embedding_length"), n_layers=key("block_count"),
        n_heads=key("attention.head_count"), n_kv_heads=key("attention.head_count_kv"),
        vocab_size=len(field("tokenizer.ggml.tokens")), hidden_dim=key("feed_forward_length"),
        max_seq_len=key("context_length"),
        # float32 there: the shortest decimal that rounds to it gives back what was written
        norm_eps=float(str(np.float32(key("attention.layer_norm_rms_epsilon")))),
        rope_theta=float(str(np.float32(key("rope.freq_base")))),
        shared_classifier="output.weight" not in tensors, head_dim=head_dim,
        architecture=hf_class, **switches)
    if key("rope.dimension_count", config.head_size) != config.head_size:
        raise FormatError(path, f"RoPE on {key('rope.dimension_count')} of a head's "
                                f"{config.head_size} channels is not implemented")
    params = np.empty(config.num_parameters(), dtype=np.float32)
    for ours, view in param_views(config, params).items():
        theirs = GGUF_LLAMA_TENSORS[ours]
        per_layer = "{l}" in theirs
        for l in range(config.n_layers if per_layer else 1):
            tensor = tensors.get(theirs.format(l=l))
            if tensor is None:
                raise FormatError(path, f"no tensor {theirs.format(l=l)}: not a {architecture} "
                                        f"model as written here")
            if tensor.tensor_type == gguf.GGMLQuantizationType.BF16:   # read as its bytes
                value = bfloat16_bits_to_float32(np.asarray(tensor.data).view(np.uint16))
            elif tensor.tensor_type == gguf.GGMLQuantizationType.F32:
                value = np.asarray(tensor.data)
            else:
                raise FormatError(path, f"{tensor.name} is {tensor.tensor_type.name}, not F32 "
                                        f"or BF16")
            value = value.reshape(view.shape[1:] if per_layer else view.shape)
            if architecture in ROTATING_HALVES and ours in ROTATED:
                value = hf_adjacent_pair_rows(value, rotated_heads(config, ours))
            (view[l] if per_layer else view)[...] = value
    return config, params, field("tokenizer.ggml.tokens")
