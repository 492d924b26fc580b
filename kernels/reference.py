"""
kernels/reference.py: every layer of GPT-2, forward and backward, in float64 NumPy.  The one
oracle that tests/test_<kernel>.py and dev/ab.py check the Cython kernels (and their dev/cpu
variants) against; the tests check it in turn against PyTorch autograd where that is installed.

One function per kernel of kernels/backend.pxd, under the same name.  The arguments are the
kernel's inputs in the order of its Python wrapper (kernels/<kernel>_wrappers.pxi), as any
arrays; a gradient buffer that backward adds into is passed with its starting value (or 0).
Each returns new float64 arrays: what the kernel leaves in its output buffers.  B batch, T time,
C channels, NH heads, V vocabulary, Vp padded vocabulary; the leading (B,T) may be any leading
dimensions, so that a caller can check a few rows of a large tensor at a time.
"""
import numpy as np

GELU_SCALING_FACTOR = np.sqrt(2.0 / np.pi)
GELU_CUBIC = 0.044715
LAYERNORM_EPS = 1e-5


def f64(x):
    return np.asarray(x, dtype=np.float64)


# ----------------------------------------------------------------------------
# encoder: token + position embedding

def encoder_forward(inp, wte, wpe):
    """out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) token ids, wte (Vp,C), wpe (maxT,C)."""
    inp = np.asarray(inp)
    return f64(wte)[inp] + f64(wpe)[:inp.shape[-1]]


def encoder_backward(dwte, dwpe, dout, inp):
    """(dwte, dwpe) after adding dout (B,T,C) into the wte rows inp (B,T) and the wpe rows t."""
    inp, dout = np.asarray(inp), f64(dout)
    T, C = dout.shape[-2:]
    dwte, dwpe = np.array(dwte, dtype=np.float64), np.array(dwpe, dtype=np.float64)
    np.add.at(dwte, inp.reshape(-1), dout.reshape(-1, C))   # repeated ids add up
    dwpe[:T] += dout.reshape(-1, T, C).sum(0)
    return dwte, dwpe


# ----------------------------------------------------------------------------
# layernorm over the channels

def layernorm_forward(inp, weight, bias):
    """(out (B,T,C), mean (B,T), rstd (B,T)): inp normalised over C, scaled and shifted."""
    x = f64(inp)
    mean = x.mean(-1)
    centred = x - mean[..., None]
    rstd = 1.0 / np.sqrt((centred ** 2).mean(-1) + LAYERNORM_EPS)
    return centred * rstd[..., None] * f64(weight) + f64(bias), mean, rstd


def layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd):
    """(dinp, dweight, dbias) after adding the gradients from dout (B,T,C), with the mean and
    rstd (B,T) that forward cached."""
    dout, rstd = f64(dout), f64(rstd)[..., None]
    norm = (f64(inp) - f64(mean)[..., None]) * rstd
    dnorm = dout * f64(weight)
    dx = rstd * (dnorm - dnorm.mean(-1, keepdims=True) - norm * (dnorm * norm).mean(-1, keepdims=True))
    positions = tuple(range(dout.ndim - 1))
    return f64(dinp) + dx, f64(dweight) + (dout * norm).sum(positions), f64(dbias) + dout.sum(positions)


# ----------------------------------------------------------------------------
# matmul: the linear layer, out = inp @ weight^T + bias

def matmul_forward(inp, weight, bias=None):
    """out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,) (bias may be None)."""
    out = f64(inp) @ f64(weight).T
    return out if bias is None else out + f64(bias)


def matmul_backward(dinp, dweight, dbias, dout, inp, weight):
    """(dinp (B,T,C), dweight (OC,C), dbias (OC,) or None) after adding the gradients from
    dout (B,T,OC)."""
    OC, C = np.shape(weight)
    dout, inp = f64(dout), f64(inp)
    rows = dout.reshape(-1, OC)
    dbias = None if dbias is None else f64(dbias) + rows.sum(0)
    return f64(dinp) + dout @ f64(weight), f64(dweight) + rows.T @ inp.reshape(-1, C), dbias


# ----------------------------------------------------------------------------
# attention: causal multi-head self-attention, llm.c's buffers

def heads(x, NH):
    """(..., T, NH*hs) -> (..., NH, T, hs)."""
    *lead, T, C = x.shape
    return x.reshape(*lead, T, NH, C // NH).swapaxes(-2, -3)


def merge_heads(x):
    """(..., NH, T, hs) -> (..., T, NH*hs)."""
    x = x.swapaxes(-2, -3)
    return x.reshape(*x.shape[:-2], -1)


def attention_forward(inp, NH):
    """(out (B,T,C), preatt, att (B,NH,T,T)): causal self-attention of inp (B,T,3C) = q, k, v;
    preatt = q.k / sqrt(hs) and att its softmax over t2 <= t, both 0 above the diagonal."""
    q, k, v = (heads(x, NH) for x in np.split(f64(inp), 3, axis=-1))
    T, hs = q.shape[-2:]
    lower = np.tril(np.ones((T, T), bool))
    preatt = np.where(lower, q @ k.swapaxes(-1, -2) / np.sqrt(hs), 0.0)
    masked = np.where(lower, preatt, -np.inf)
    att = np.exp(masked - masked.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    return merge_heads(att @ v), preatt, att


def attention_backward(dinp, dpreatt, datt, dout, inp, att, NH):
    """(dinp (B,T,3C), dpreatt, datt (B,NH,T,T)) after llm.c's backward from dout (B,T,C): it
    reads att, datt and dpreatt on and below the diagonal only (above it they may hold
    anything), adds into all three there, and the softmax and q.k gradients use the
    accumulated scratch values."""
    q, k, v = (heads(x, NH) for x in np.split(f64(inp), 3, axis=-1))
    T, hs = q.shape[-2:]
    lower = np.tril(np.ones((T, T), bool))
    att = np.where(lower, f64(att), 0.0)
    dout = heads(f64(dout), NH)
    # out = att v
    datt = f64(datt) + np.where(lower, dout @ v.swapaxes(-1, -2), 0.0)
    dv = att.swapaxes(-1, -2) @ dout
    # att = softmax(preatt):  dpreatt[t2] += att[t2] (datt[t2] - sum_t3 att[t3] datt[t3])
    rowdot = np.where(lower, att * datt, 0.0).sum(-1, keepdims=True)
    dpreatt = f64(dpreatt) + np.where(lower, att * (datt - rowdot), 0.0)
    # preatt = q k^T / sqrt(hs)
    dscores = np.where(lower, dpreatt, 0.0) / np.sqrt(hs)
    dq, dk = dscores @ k, dscores.swapaxes(-1, -2) @ q
    dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
    return f64(dinp) + dqkv, dpreatt, datt


def flash_attention_forward(inp, NH):
    """(out (B,T,C), lse (B,NH,T)): causal self-attention of inp (B,T,3C) = q, k, v, and each
    row's log-sum-exp of its scores q.k / sqrt(hs) over t2 <= t, all the flash backward keeps."""
    out, preatt, _ = attention_forward(inp, NH)
    T = preatt.shape[-1]
    masked = np.where(np.tril(np.ones((T, T), bool)), preatt, -np.inf)
    rowmax = masked.max(-1)
    lse = rowmax + np.log(np.exp(masked - rowmax[..., None]).sum(-1))
    return out, lse


def flash_attention_backward(dinp, dout, inp, out, lse, NH):
    """dinp (B,T,3C) + the gradient of causal self-attention of inp from dout (B,T,C): the same
    as attention_backward's dinp.  out and lse are the forward's, which the kernel rebuilds the
    softmax from; the reference recomputes everything from inp in float64 instead."""
    _, _, att = attention_forward(inp, NH)
    zeros = np.zeros(att.shape)
    return attention_backward(dinp, zeros, zeros, dout, inp, att, NH)[0]


# ----------------------------------------------------------------------------
# gelu, tanh approximation, and the residual connection

def gelu_forward(inp):
    """out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = f64(inp)
    return 0.5 * x * (1.0 + np.tanh(GELU_SCALING_FACTOR * (x + GELU_CUBIC * x ** 3)))


def gelu_backward(dinp, inp, dout):
    """dinp after adding gelu'(inp) * dout."""
    x = f64(inp)
    th = np.tanh(GELU_SCALING_FACTOR * (x + GELU_CUBIC * x ** 3))
    dtanh = (1.0 - th * th) * GELU_SCALING_FACTOR * (1.0 + 3.0 * GELU_CUBIC * x * x)
    grad = 0.5 * (1.0 + th) + 0.5 * x * dtanh
    return f64(dinp) + grad * f64(dout)


def residual_forward(inp1, inp2):
    """out = inp1 + inp2."""
    return f64(inp1) + f64(inp2)


def residual_backward(dinp1, dinp2, dout):
    """(dinp1, dinp2) after adding dout to both."""
    return f64(dinp1) + f64(dout), f64(dinp2) + f64(dout)


# ----------------------------------------------------------------------------
# softmax over the vocabulary and the cross-entropy loss

def softmax_forward(logits, V):
    """probs (B,T,Vp): softmax of logits (B,T,Vp) over the first V entries, 0 in the padding."""
    z = f64(logits)[..., :V]
    e = np.exp(z - z.max(-1, keepdims=True))
    probs = np.zeros(np.shape(logits))
    probs[..., :V] = e / e.sum(-1, keepdims=True)
    return probs


def crossentropy_forward(probs, targets):
    """losses (B,T) = -log probs[b, t, targets[b, t]], 0 where the target is -1 (not scored)."""
    scored = np.asarray(targets) >= 0
    picked = np.take_along_axis(np.asarray(probs), np.where(scored, targets, 0)[..., None], axis=-1)
    return np.where(scored, -np.log(f64(picked[..., 0])), 0.0)


def crossentropy_softmax_backward(dlogits, dlosses, probs, targets, V):
    """dlogits (B,T,Vp) after adding (probs - onehot(targets)) * dlosses (B,T) over the first
    V entries; the padding is left as it was (probs there are never read), and so is each row
    whose target is -1 (not scored)."""
    scored = (np.asarray(targets) >= 0)[..., None]
    targets = np.where(scored, np.asarray(targets)[..., None], 0)
    grad = np.array(probs, dtype=np.float64)
    grad[..., V:] = 0.0
    np.put_along_axis(grad, targets, np.take_along_axis(grad, targets, axis=-1) - 1.0, axis=-1)
    return f64(dlogits) + np.where(scored, grad * f64(dlosses)[..., None], 0.0)


# ----------------------------------------------------------------------------
# AdamW and the gradient norm

def adamw_update(params, m, v, grads, lr, beta1, beta2, eps, weight_decay, grad_scale, t):
    """(params, m, v) after AdamW step t >= 1 (llm.c's gpt2_update), grads scaled by grad_scale."""
    g = f64(grads) * grad_scale
    m = beta1 * f64(m) + (1.0 - beta1) * g
    v = beta2 * f64(v) + (1.0 - beta2) * g * g
    m_hat = m / (1.0 - beta1 ** t)
    v_hat = v / (1.0 - beta2 ** t)
    params = f64(params)
    return params - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * params), m, v


def global_norm_squared(x):
    """The sum of x^2: the square of the gradient norm that clipping uses."""
    x = f64(x).reshape(-1)
    return float(x @ x)


# ----------------------------------------------------------------------------
# zero: the backend's memory clear (zero_grad)

def zero(x):
    """What zero leaves in x: zeros."""
    return np.zeros_like(f64(x))
