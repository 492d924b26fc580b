"""
dev/eval/lm_eval_llmpyx.py, lm-eval's model "llmpyx" on an llm.pyx model itself (its
loglikelihoods against lm-eval's Hugging Face model on the export: tests/test_export.py): a
text longer than the model's context scores in lm-eval's rolling windows, each token once,
as a forward over each window gives it; generate_until is the greedy text generate.py's
sampler gives, cut before the first stop string; a context longer than the model's keeps its
newest tokens. lm-eval is a test oracle here: these skip without it.
"""
import os
from collections import namedtuple

import numpy as np
import pytest

import needs
from llmc.sampler import Sampler, continue_prompt
from train_gpt2 import GPT2, GPT2Config

Request = namedtuple("Request", "args")   # what lm-eval hands a model: an Instance's args
TEXT = ("First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. "
        "First Citizen: You are all resolved rather to die than to famish? All: Resolved. ")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    needs.package("lm_eval")
    needs.gpt2_encoding()
    from dev.eval.lm_eval_llmpyx import LlmPyx
    path = tmp_path_factory.mktemp("lm") / "d2.bin"
    model = GPT2.random(GPT2Config.from_depth(2, max_seq_len=32), seed=7)
    model.params = model.params * 6   # a greedy text that varies (tests/test_kv_cache.py)
    model.save(str(path))
    return LlmPyx(model=str(path), tokenizer="gpt2")


def log_probs(model, window):
    """float64 log-softmax of one forward over window's tokens."""
    model.forward(np.array([window], dtype=np.int32))
    logits = model.activation("logits")[0, :, :model.config.vocab_size].astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))


def test_a_long_text_scores_in_rolling_windows_each_token_once(lm):
    ids = lm.encode(TEXT * 3)
    assert len(ids) > 2 * lm.max_len
    # lm-eval's windows (BOS, then each a full context, the last scoring only its new tokens)
    # written out here: token i is predicted from the (at most) max_len tokens before it
    text = [lm.tokenizer.eot_token] + ids
    want = 0.0
    for start in range(0, len(ids), lm.max_len):
        end = min(start + lm.max_len, len(ids))
        first = max(end - lm.max_len, 0)
        logp = log_probs(lm.model, text[first:end])
        want += sum(logp[i - first, text[i + 1]] for i in range(start, end))
    (got,) = lm.loglikelihood_rolling([Request((TEXT * 3,))])
    assert abs(got - want) < 1e-4 * abs(want)


def test_generate_until_is_the_greedy_text_cut_at_a_stop(lm):
    context = "First Citizen:"
    ids = lm.encode(context)
    reply = lm.tokenizer.decode(continue_prompt(lm.model, ids, 12, Sampler(0),
                                                lm.tokenizer.stop_tokens))
    assert len(reply) > 8
    stop = reply[5:8]
    got = lm.generate_until([Request((context, {"until": [], "max_gen_toks": 12})),
                             Request((context, {"until": [stop], "max_gen_toks": 12}))])
    assert got == [reply, reply.split(stop)[0]]


def test_a_context_longer_than_the_model_keeps_its_newest_tokens(lm):
    context = (TEXT * 2).rstrip()   # no trailing space to move onto the continuation
    ids = lm.encode(context)[-(lm.max_len - 4):]
    reply = lm.tokenizer.decode(continue_prompt(lm.model, ids, 4, Sampler(0),
                                                lm.tokenizer.stop_tokens))
    assert lm.generate_until([Request((context, {"until": [], "max_gen_toks": 4}))]) == [reply]
    # and a loglikelihood: the row cut from the left, scored as the cut row alone
    (ll, _), = lm.loglikelihood([Request((context, " speak."))])
    tokens = lm.encode(context + " speak.")[-(lm.max_len + 1):]
    logp = log_probs(lm.model, tokens[:-1])
    n = len(lm.encode(context + " speak.")) - len(lm.encode(context))
    want = sum(logp[i, tokens[i + 1]] for i in range(len(tokens) - 1 - n, len(tokens) - 1))
    assert abs(ll - want) < 1e-4 * abs(want)
