"""
Sampling from the model as llm.c's trainer does: its xorshift RNG (random_u32, random_f32) and
sample_mult, so a model and a seed give the tokens llm.c gives.

Sampler is generate.py's: greedy (temperature 0: the argmax of the logits), or a draw from the
softmax of logits / temperature, cut to the top_k most likely tokens and to the nucleus of
probability top_p (llama2.c's sample_topp), one coin from the xorshift RNG at seed per token,
as llama2.c's run.c draws them.
"""
import numpy as np

from llmc.formats.llmc import GPT2_EOT_TOKEN

SAMPLE_SEED = 1337  # llm.c's trainer samples from this seed every time
MASK64 = (1 << 64) - 1


class XorShift:
    """llm.c's random_u32 / random_f32: xorshift* on a 64-bit state."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def random_u32(self):
        s = self.state
        s ^= s >> 12
        s ^= (s << 25) & MASK64
        s ^= s >> 27
        self.state = s
        return ((s * 0x2545F4914F6CDD1D) & MASK64) >> 32

    def random_f32(self):
        """A float32 in [0, 1): the top 24 bits of random_u32 / 2^24 (exact in float32)."""
        return np.float32((self.random_u32() >> 8) / 16777216.0)


def sample_mult(probs, coin):
    """The first index whose running float32 sum of probs exceeds coin (llm.c's sample_mult):
    a draw from probs for a coin uniform in [0, 1); the last index if rounding leaves none."""
    cdf = np.cumsum(probs, dtype=np.float32)  # sequential float32 sums, as the C loop
    return min(int(np.searchsorted(cdf, np.float32(coin), side="right")), len(probs) - 1)


def sample_topp(probs, topp, coin):
    """llama2.c's nucleus sampling: a draw, for a coin uniform in [0, 1), from the most likely
    tokens whose probabilities' float32 running sum first exceeds topp (all of them if
    rounding keeps it below), renormalised.  Tokens below (1 - topp) / (n - 1) are dropped
    first, as llama2.c does: they cannot be in the nucleus."""
    cutoff = np.float32((1.0 - topp) / (len(probs) - 1))
    candidates = np.flatnonzero(probs >= cutoff)
    order = candidates[np.argsort(-probs[candidates], kind="stable")]   # most likely first
    cdf = np.cumsum(probs[order], dtype=np.float32)
    last = min(int(np.searchsorted(cdf, np.float32(topp), side="right")), len(order) - 1)
    return int(order[sample_mult(probs[order[:last + 1]], np.float32(coin * cdf[last]))])


def softmax(logits):
    """float32 probabilities of float32 logits."""
    exp = np.exp(logits - logits.max())
    return exp / exp.sum(dtype=np.float32)


class Sampler:
    """The next token from a position's logits: greedy at temperature 0, else drawn from
    softmax(logits / temperature), cut to the top_k most likely (0: all; ties go to the lower
    id, as the argmax) and then to the nucleus top_p (1: all), with the RNG at seed."""

    def __init__(self, temperature=1.0, top_k=0, top_p=1.0, seed=SAMPLE_SEED):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.rng = XorShift(seed)

    def __call__(self, logits):
        if self.temperature == 0:
            return int(np.argmax(logits))   # the first of equals, as run.c's sample_argmax
        logits = np.asarray(logits, dtype=np.float32)
        with np.errstate(over="ignore"):   # the largest taken away first: a tiny temperature
            logits = (logits - logits.max()) / np.float32(self.temperature)   # gives -inf
        if 0 < self.top_k < len(logits):
            top = np.argsort(-logits, kind="stable")[:self.top_k]
            kept = np.full_like(logits, -np.inf)
            kept[top] = logits[top]
            logits = kept
        probs = softmax(logits)
        coin = self.rng.random_f32()
        if 0 < self.top_p < 1:
            return sample_topp(probs, self.top_p, coin)
        return sample_mult(probs, coin)


def generate(model, tokenizer, gen_tokens, console):
    """Sample gen_tokens-1 tokens after <|endoftext|>, printing them as they come (as token ids
    when tokenizer is None). Each sample starts from seed 1337, as llm.c's trainer does, so it
    depends on the model only."""
    rng = XorShift(SAMPLE_SEED)
    eot = tokenizer.eot_token if tokenizer is not None else GPT2_EOT_TOKEN
    tokens = [eot]
    piece = tokenizer.stream_decoder(after=eot) if tokenizer is not None else (lambda t: f"{t} ")
    V = model.config.vocab_size
    console.print("generating:\n---")
    for t in range(1, gen_tokens):
        # the model is causal: position t-1 sees tokens[:t] only, so a (1, t) forward gives
        # what llm.c's (B, T) forward over the padded batch gives there
        model.forward(np.array([tokens], dtype=np.int32))
        coin = rng.random_f32()
        tokens.append(sample_mult(model.probs[0, t - 1, :V], coin))
        console.write(piece(tokens[-1]))
    console.print("\n---")
    return tokens


def continue_prompt(model, prompt, steps, sampler, stop_tokens, cache=True):
    """generate.py's text: yield up to steps tokens after the prompt's, each chosen by sampler
    from the logits at the last position so far; stop before any of stop_tokens (a
    tokenizer's: a Hugging Face model may have several). With a KV cache (cache, where the
    backend has one: llmc/model.pyx's forward_cached) the prompt is one forward and each new
    token one position; without, each token is a forward over the whole text so far."""
    if cache and model.has_kv_cache:
        model.start_cache(len(prompt) + steps - 1)   # the last token needs no position
        logits = model.forward_cached(prompt)
        for i in range(steps):
            token = sampler(logits)
            if token in stop_tokens:
                return
            yield token
            if i + 1 < steps:
                logits = model.forward_cached([token])
        return
    V = model.config.vocab_size
    tokens = np.zeros((1, len(prompt) + steps - 1), dtype=np.int32)   # padded with token 0
    tokens[0, :len(prompt)] = prompt
    for t in range(len(prompt), len(prompt) + steps):
        model.forward(tokens)
        token = sampler(model.logits[0, t - 1, :V])
        if token in stop_tokens:
            return
        yield token
        if t < tokens.shape[1]:
            tokens[0, t] = token
