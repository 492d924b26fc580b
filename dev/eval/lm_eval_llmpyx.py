"""
dev/eval/lm_eval_llmpyx.py: EleutherAI's lm-evaluation-harness on an llm.pyx model itself, no
export: its loglikelihoods scored as HellaSwag's are during training (llmc/evalloader.py), each
context run once however many continuations follow it and the head only where a
continuation's tokens are predicted, over the KV cache where the backend has one; greedy
generation (generate_until) with the cache.

    python dev/eval/lm_eval_llmpyx.py run --model llmpyx \\
        --model_args model=out/model_00040.bin --tasks hellaswag --num_fewshot 10 -o out/eval

It registers the model "llmpyx" and hands everything else to lm-eval's command line. Its
--model_args: model= a model file or run folder (as generate.py's), tokenizer= (generate.py's
--tokenizer; default: the model's own, as generate.py finds it), precision= fp32 or bf16.

The texts are tokenized as lm-eval's Hugging Face model tokenizes them (lm_eval.models.
huggingface.HFLM): no start token but before an empty context, a context's trailing spaces
moved onto its continuation, the continuation's tokens those of the whole after the
context's; a row longer than the model's context loses its oldest tokens. So on a model and
its export (dev/export.py --format hf) the two give the same loglikelihoods, within float32
rounding (tests/test_export.py).
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from lm_eval.api.model import LM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from llmc import evalloader  # noqa: E402
from llmc.checkpoint import model_tokenizer, newest_model_file  # noqa: E402
from llmc.families import family_of_file  # noqa: E402
from llmc.sampler import Sampler, continue_prompt  # noqa: E402
from llmc.tokenizer import load_tokenizer  # noqa: E402


@register_model("llmpyx")
class LlmPyx(LM):
    """An llm.pyx model as lm-eval's LM: loglikelihood, loglikelihood_rolling, generate_until."""

    def __init__(self, model, tokenizer=None, precision="fp32", **_lm_eval_options):
        super().__init__()
        path = newest_model_file(model)
        family, _ = family_of_file(path)
        self.model = family.model_class.from_checkpoint(path, precision=precision,
                                                        trainable=False)
        name, why = (tokenizer, "tokenizer=") if tokenizer else model_tokenizer(path)
        if name != "gpt2" and not os.path.exists(name):
            raise ValueError(f"tokenizer={name}: no such file (nor gpt2)")
        print(f"lm_eval_llmpyx.py: tokenizer {name} ({why})", file=sys.stderr)
        self.tokenizer = load_tokenizer(name)
        self.max_len = self.model.config.max_seq_len

    def encode(self, text):
        """text's ids without a start token (encode_prompt's, less the one it begins with)."""
        ids = list(self.tokenizer.encode_prompt(text))
        return ids[1:] if ids[:1] == [self.tokenizer.eot_token] else ids

    def pair(self, context, continuation):
        """(context ids, continuation ids) as HFLM's _encode_pair splits them."""
        if not context:
            return [self.tokenizer.eot_token], self.encode(continuation)
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, context_ids = self.encode(context + continuation), self.encode(context)
        return context_ids, whole[len(context_ids):]

    def score(self, pairs):
        """[(logprob, is_greedy)] of each (context ids, continuation ids)."""
        rows = [evalloader.scored_row(np.array(c, np.int32), np.array(x, np.int32), self.max_len)
                for c, x in pairs]
        if self.model.has_kv_cache:
            scores = evalloader.packed_scores(self.model, rows, greedy=True)
        else:   # one row a forward, the logits at every position
            scores = [self.whole_row(tokens, start) for tokens, start in rows]
        return [(-float(losses.sum(dtype=np.float64)), greedy) for losses, greedy in scores]

    def whole_row(self, tokens, start):
        """(losses, is_greedy) of a row's scored positions from one forward over it."""
        self.model.forward(tokens[None, :-1], tokens[None, 1:])
        targets = tokens[start + 1:]
        logits = self.model.activation("logits")[0, start:, :self.model.config.vocab_size]
        return (self.model.activation("losses")[0, start:],
                bool((logits.argmax(axis=-1) == targets).all()))

    def loglikelihood(self, requests, disable_tqdm=False):
        return self.score([self.pair(*request.args) for request in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """Each text's log-probability after the start token, in windows of the model's
        context (lm-eval's rolling windows, each token predicted once)."""
        windows, owner = [], []
        for i, request in enumerate(requests):
            (text,) = request.args
            for window in get_rolling_token_windows(self.encode(text), self.tokenizer.eot_token,
                                                    self.max_len, 1):
                windows.append(make_disjoint_window(window))
                owner.append(i)
        totals = np.zeros(len(requests))
        for i, (logprob, _) in zip(owner, self.score(windows)):
            totals[i] += logprob
        return [float(total) for total in totals]

    def generate_until(self, requests, disable_tqdm=False):
        """Greedy text after each context, up to max_gen_toks tokens, cut before the first of
        `until` (the start token stops it too)."""
        replies = []
        for request in requests:
            context, options = request.args
            until = options.get("until", [])
            until = [until] if isinstance(until, str) else list(until)
            steps = int(options.get("max_gen_toks", 256))
            ids = self.encode(context) or [self.tokenizer.eot_token]
            ids = ids[-max(self.max_len - steps, 1):]   # room for the reply, as HFLM leaves
            steps = min(steps, self.max_len + 1 - len(ids))
            reply = []
            for token in continue_prompt(self.model, ids, steps, Sampler(0),
                                         self.tokenizer.stop_tokens):
                reply.append(token)
                text = self.tokenizer.decode(reply)
                if any(stop in text for stop in until):
                    break
            text = self.tokenizer.decode(reply)
            for stop in until:
                text = text.split(stop)[0]
            replies.append(text)
        return replies


if __name__ == "__main__":
    from lm_eval.__main__ import cli_evaluate
    cli_evaluate()
