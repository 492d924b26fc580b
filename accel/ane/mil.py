"""
The Llama block's Apple Neural Engine kernels as MIL programs, built with coremltools' MIL
Builder (which type- and shape-checks every op as it is added, on Linux too).

Layout: every activation is [1, C, 1, S] fp16 - channels second, the sequence on the last
(spatial) axis - the layout the ANE's convolution engine wants.  A (B, T, C) row-major tensor
of the CPU side is (C, B*T) transposed; attention runs one sequence (S = T) at a time.

Two pipelines, the same arithmetic:
  dynamic  the weights are program inputs, packed next to the activations along the spatial
           axis of one input ([1, C, 1, S + ...]) and sliced apart inside the program, so one
           compile serves every training step (the anchor's way around the ANE compiler's
           budget of about 119 compiles per process).  A weight W (OC, Cin) travels as W^T,
           Cin channels by OC columns, when the packed input has Cin channels, or as W itself
           when it has OC channels (the dx programs and the FFN's down projection).
  static   the weights are constants (1x1 convolutions), baked into the program: it must be
           recompiled after every update.

Every program takes one input "x" and gives one output "out" (the anchor's finding: the ANE's
private path rejects a second dynamic input; several results are concatenated along the
channels, several activations stacked along the channels or packed along the spatial axis).

The pieces (forward, then the input gradients dx; the weight gradients stay on the CPU):
  qkv_forward        x -> q | k | v                  (x: the RMSNorm'd residual stream)
  attention_forward  q | k | v -> y | att            (explicit additive causal mask, GQA)
  linear_forward     x -> W x                        (the output projection wo, any linear)
  ffn_forward        x -> w2 g | h1 | h3 | g         (SwiGLU FFN: h1 = w1 x, h3 = w3 x,
                                                      g = silu(h1) * h3, kept for the CPU's dW)
  swiglu_forward     a; b -> silu(a) * b             (elementwise, for the backend table)
  ffn_backward       x, dout -> dx | dh1 | dh3 | dg  (h1 = w1 x, h3 = w3 x recomputed)
  linear_backward    dout -> W^T dout
  attention_backward q | k | v | dout -> dq | dk | dv (softmax recomputed from q and k)
  qkv_backward       dq | dk | dv -> dx
  swiglu_backward    a; b; dout -> da; db
feeds() builds a program's input from CPU-layout arrays, unpack() splits its output.
RoPE is applied on the CPU between qkv_forward and attention_forward, as the model's table does.

Dimension letters: C channels (dim), NH query heads, NKV key/value heads (NKV divides NH, query
head h reads kv head h // G, G = NH / NKV), hs head size, QD = NH*hs, KVD = NKV*hs, H the FFN's
hidden size, S positions (the spatial axis), N elements.
"""
import logging
import sys
from dataclasses import dataclass

import numpy as np

# coremltools probes at import for every framework it converts from and imports each one
# installed (PyTorch, transformers, scikit-learn, ...): 8 s of every process here, for converters
# the MIL Builder never uses. Those not imported yet are hidden while it loads (a None in
# sys.modules makes their import fail), then given back: coremltools takes them for absent.
_CONVERTED_FRAMEWORKS = ("torch", "torchvision", "torchaudio", "torchao", "executorch",
                         "transformers", "sklearn", "xgboost", "libsvm", "tensorflow")
_hidden = [name for name in _CONVERTED_FRAMEWORKS if name not in sys.modules]
# it also logs what this use does not need: that the Core ML runtime (macOS only) is missing
_logger = logging.getLogger("coremltools")
_level = _logger.level
_logger.setLevel(logging.ERROR)
sys.modules.update(dict.fromkeys(_hidden))
try:
    import coremltools as ct  # noqa: E402
    from coremltools.converters.mil import Builder as mb  # noqa: E402
    from coremltools.converters.mil.mil import Function, Program, types  # noqa: E402
finally:
    for _name in _hidden:
        if sys.modules.get(_name, False) is None:
            del sys.modules[_name]
    _logger.setLevel(_level)

OPSET = ct.target.iOS17
FP16 = np.float16
MASK_VALUE = -1e4   # the additive mask above the diagonal: exp() of it is 0 in fp16 and fp32,
                    # and unlike -inf or fp16's -65504 it cannot overflow when added to a score


@dataclass(frozen=True)
class Dims:
    """The sizes one set of programs is built for."""
    C: int
    NH: int
    NKV: int
    hs: int
    H: int
    S: int

    @property
    def QD(self):
        return self.NH * self.hs

    @property
    def KVD(self):
        return self.NKV * self.hs

    @classmethod
    def from_config(cls, config, S=None):
        """From a Llama config (its dim, n_heads, n_kv_heads, hidden_dim, max_seq_len: the
        caller's, e.g. a preset); S defaults to max_seq_len."""
        S = config.max_seq_len if S is None else S
        return cls(config.dim, config.n_heads, config.n_kv_heads, config.dim // config.n_heads,
                   config.hidden_dim, S)

    def check(self):
        for name in ("C", "NH", "NKV", "hs", "H", "S"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if self.NH % self.NKV:
            raise ValueError(f"n_kv_heads={self.NKV} does not divide n_heads={self.NH}")
        return self


# --- building blocks -------------------------------------------------------------------------

def build(inputs, body):
    """A one-function Program: inputs {name: shape} (fp16); body(**vars) returns the outputs,
    each already named by its op."""
    specs = {name: mb.TensorSpec(shape=shape, dtype=types.fp16) for name, shape in inputs.items()}
    mb.name_count.clear()   # the Builder numbers unnamed consts process-wide: per program instead,
                            # so a program's text does not depend on what was built before it
    with Function(specs, opset_version=OPSET) as function:
        outputs = body(**function.inputs)
        function.set_outputs(list(outputs) if isinstance(outputs, (list, tuple)) else [outputs])
    program = Program()
    program.add_function("main", function)
    return program


def columns(x, start, width, name):
    """x[:, :, :, start:start+width] of a [1, C, 1, W] tensor (a slice of the packed input)."""
    _, C, _, _ = x.shape
    return mb.slice_by_index(x=x, begin=[0, 0, 0, start], end=[1, C, 1, start + width],
                             name=name)


def rows(x, start, count, name):
    """x[:, start:start+count] of a [1, C, 1, W] tensor (a part stacked along the channels)."""
    _, _, _, W = x.shape
    return mb.slice_by_index(x=x, begin=[0, start, 0, 0], end=[1, start + count, 1, W], name=name)


def as_matrix(x, name):
    """[1, C, 1, S] -> (C, S)."""
    return mb.reshape(x=x, shape=[x.shape[1], x.shape[3]], name=name)


def as_ane(x, name):
    """(C, S) -> [1, C, 1, S]."""
    return mb.reshape(x=x, shape=[1, x.shape[0], 1, x.shape[1]], name=name)


def dynamic_linear(x, w, name, transpose_w):
    """W x for x (Cin, S): w is W^T (Cin, OC) with transpose_w, else W (OC, Cin) itself."""
    return mb.matmul(x=w, y=x, transpose_x=transpose_w, name=name)


def static_linear(x, weight, name):
    """W x for x [1, Cin, 1, S] and a constant W (OC, Cin): a 1x1 convolution."""
    OC, Cin = weight.shape
    w = mb.const(val=weight.astype(FP16).reshape(OC, Cin, 1, 1), name=name + "_weight")
    return mb.conv(x=x, weight=w, name=name)


def silu(x, name):
    return mb.mul(x=x, y=mb.sigmoid(x=x, name=name + "_sigmoid"), name=name)


def causal_mask(S, G):
    """The additive causal mask of G query heads' rows stacked: (G*S, S), row r at position
    r % S."""
    rows = np.arange(G * S) % S
    return np.where(np.arange(S)[None, :] > rows[:, None], MASK_VALUE, 0.0).astype(FP16)


def heads(x, n, hs, name):
    """(n*hs, S) channels of n heads -> (n, S, hs)."""
    S = x.shape[1]
    return mb.transpose(x=mb.reshape(x=x, shape=[n, hs, S], name=name + "_split"),
                        perm=[0, 2, 1], name=name)


def grouped(q, d, name):
    """Query heads (NH, S, hs) -> (NKV, G*S, hs): each kv head's G query heads in a row, so one
    batched matmul per kv head serves them all and sums their dk, dv."""
    return mb.reshape(x=q, shape=[d.NKV, d.NH // d.NKV * d.S, d.hs], name=name)


def ungrouped(x, d, name):
    """(NKV, G*S, hs) -> (QD, S) channels, the inverse of heads() after grouped()."""
    x = mb.reshape(x=x, shape=[d.NH, d.S, d.hs], name=name + "_heads")
    x = mb.transpose(x=x, perm=[0, 2, 1], name=name + "_t")
    return mb.reshape(x=x, shape=[d.QD, d.S], name=name)


def scores_softmax(q3, k3, d):
    """Probabilities (NKV, G*S, S) of the scaled, masked scores q k^T / sqrt(hs)."""
    G = d.NH // d.NKV
    qs = mb.mul(x=q3, y=FP16(1.0 / np.sqrt(d.hs)), name="q_scaled")
    scores = mb.matmul(x=qs, y=k3, transpose_y=True, name="scores")
    mask = mb.const(val=causal_mask(d.S, G), name="causal_mask")
    masked = mb.add(x=scores, y=mask, name="scores_masked")
    return mb.softmax(x=masked, axis=-1, name="probs")


# --- forward ---------------------------------------------------------------------------------

def qkv_forward(d, pipeline="dynamic", wq=None, wk=None, wv=None):
    """x [1,C,1,S] -> out [1,QD+2KVD,1,S] = q | k | v (channels), one matmul by the stacked
    wqkv = [wq; wk; wv] (QD+2KVD, C).  Dynamic input "x" [1, C, 1, S+QD+2KVD] = x | wqkv^T;
    static: x [1, C, 1, S], wqkv a constant."""
    d.check()
    N = d.QD + 2 * d.KVD
    if pipeline == "static":
        return build({"x": (1, d.C, 1, d.S)},
                     lambda x: static_linear(x, np.concatenate([wq, wk, wv]), "out"))

    def body(x):
        xs = as_matrix(columns(x, 0, d.S, "x_in"), "x2")
        w = as_matrix(columns(x, d.S, N, "wqkv"), "wqkv2")
        return as_ane(dynamic_linear(xs, w, "qkv2", True), "out")
    return build({"x": (1, d.C, 1, d.S + N)}, body)


def attention_forward(d):
    """x [1,QD+2KVD,1,S] = q | k | v (channels, RoPE applied) -> out [1,QD+NH*S,1,S] = y | att,
    y the heads' outputs (QD channels), att the probabilities (channel h*S+i, position j: head
    h, query i, key j).  No weights: the same program in both pipelines."""
    d.check()

    def body(x):
        q3 = grouped(heads(as_matrix(rows(x, 0, d.QD, "q"), "q2"), d.NH, d.hs, "qh"), d, "qg")
        k3 = heads(as_matrix(rows(x, d.QD, d.KVD, "k"), "k2"), d.NKV, d.hs, "kh")
        v3 = heads(as_matrix(rows(x, d.QD + d.KVD, d.KVD, "v"), "v2"), d.NKV, d.hs, "vh")
        probs = scores_softmax(q3, k3, d)
        y = as_ane(ungrouped(mb.matmul(x=probs, y=v3, name="y3"), d, "y2"), "y")
        att = mb.reshape(x=probs, shape=[1, d.NH * d.S, 1, d.S], name="att")
        return mb.concat(values=[y, att], axis=1, name="out")
    return build({"x": (1, d.QD + 2 * d.KVD, 1, d.S)}, body)


def linear_forward(Cin, OC, S, pipeline="dynamic", weight=None):
    """x [1,Cin,1,S] -> out = W x [1,OC,1,S] (the output projection wo, any bias-free linear).
    Dynamic input "x" [1, Cin, 1, S+OC] = x | W^T; static: W (OC, Cin) a constant."""
    if pipeline == "static":
        return build({"x": (1, Cin, 1, S)}, lambda x: static_linear(x, weight, "out"))

    def body(x):
        xs = as_matrix(columns(x, 0, S, "x_in"), "x2")
        w = as_matrix(columns(x, S, OC, "w"), "w2")
        return as_ane(dynamic_linear(xs, w, "out2", True), "out")
    return build({"x": (1, Cin, 1, S + OC)}, body)


def ffn_forward(d, pipeline="dynamic", w1=None, w3=None, w2=None):
    """x [1,C,1,S] -> out [1,C+3H,1,S] = w2 g | h1 | h3 | g, h1 = w1 x, h3 = w3 x,
    g = silu(h1) * h3 (the activations the CPU's weight gradients read); w1, w3 (H,C), w2 (C,H).
    Dynamic input "x" [1, C, 1, S+3H] = x | w1^T | w3^T | w2."""
    d.check()
    if pipeline == "static":
        def body(x):
            h1, h3 = static_linear(x, w1, "h1"), static_linear(x, w3, "h3")
            gated = mb.mul(x=silu(h1, "silu"), y=h3, name="gated")
            return mb.concat(values=[static_linear(gated, w2, "y"), h1, h3, gated], axis=1,
                             name="out")
        return build({"x": (1, d.C, 1, d.S)}, body)

    def body(x):
        xs = as_matrix(columns(x, 0, d.S, "x_in"), "x2")
        w1t = as_matrix(columns(x, d.S, d.H, "w1t"), "w1t2")
        w3t = as_matrix(columns(x, d.S + d.H, d.H, "w3t"), "w3t2")
        w2m = as_matrix(columns(x, d.S + 2 * d.H, d.H, "w2"), "w22")
        h1, h3 = dynamic_linear(xs, w1t, "h1", True), dynamic_linear(xs, w3t, "h3", True)
        gated = mb.mul(x=silu(h1, "silu"), y=h3, name="gated")
        y = as_ane(dynamic_linear(gated, w2m, "y2", False), "y")
        return mb.concat(values=[y, as_ane(h1, "h1a"), as_ane(h3, "h3a"), as_ane(gated, "ga")],
                         axis=1, name="out")
    return build({"x": (1, d.C, 1, d.S + 3 * d.H)}, body)


def swiglu_forward(N):
    """x [1,2,1,N] = a; b (channels) -> out [1,1,1,N] = silu(a) * b (elementwise)."""
    def body(x):
        a, b = rows(x, 0, 1, "a"), rows(x, 1, 1, "b")
        return mb.mul(x=silu(a, "silu"), y=b, name="out")
    return build({"x": (1, 2, 1, N)}, body)


# --- backward: the input gradients -----------------------------------------------------------

def linear_backward(Cin, OC, S, pipeline="dynamic", weight=None):
    """dout [1,OC,1,S] -> dx = W^T dout [1,Cin,1,S].  Dynamic input "x" [1, OC, 1, S+Cin] =
    dout | W; static: W^T (Cin, OC) a constant."""
    if pipeline == "static":
        return build({"x": (1, OC, 1, S)},
                     lambda x: static_linear(x, np.ascontiguousarray(weight.T), "out"))

    def body(x):
        g = as_matrix(columns(x, 0, S, "dout_in"), "dout2")
        w = as_matrix(columns(x, S, Cin, "w"), "w2")
        return as_ane(dynamic_linear(g, w, "dx2", True), "out")
    return build({"x": (1, OC, 1, S + Cin)}, body)


def silu_backward(h1, h3, dgated, name):
    """dh1, dh3 of gated = silu(h1) * h3: silu'(h) = sig(h) (1 + h (1 - sig(h)))."""
    sig = mb.sigmoid(x=h1, name=name + "_sigmoid")
    silu_h1 = mb.mul(x=h1, y=sig, name=name + "_silu")
    one_minus = mb.sub(x=FP16(1.0), y=sig, name=name + "_1msig")
    dsilu = mb.mul(x=sig, y=mb.add(x=FP16(1.0), y=mb.mul(x=h1, y=one_minus, name=name + "_h1ms"),
                                   name=name + "_1ph"), name=name + "_dsilu")
    dh3 = mb.mul(x=dgated, y=silu_h1, name=name + "_dh3")
    dh1 = mb.mul(x=mb.mul(x=dgated, y=h3, name=name + "_dgh3"), y=dsilu, name=name + "_dh1")
    return dh1, dh3


def ffn_backward(d, pipeline="dynamic", w1=None, w3=None, w2=None):
    """x, dout -> out [1,C+3H,1,S] = dx | dh1 | dh3 | dg (dh1, dh3 for the CPU's weight
    gradients, dg = w2^T dout the gated product's; h1 = w1 x, h3 = w3 x recomputed).  Dynamic input "x" [1, C, 1, 2S+3H] = x | dout | w1^T |
    w3^T | w2; static: [1, C, 1, 2S] = x | dout, the weights constants."""
    d.check()
    S, H = d.S, d.H

    def body(x):
        xs, g = columns(x, 0, S, "x_in"), columns(x, S, S, "dout_in")
        if pipeline == "static":
            h1, h3 = static_linear(xs, w1, "h1"), static_linear(xs, w3, "h3")
            dgated = static_linear(g, np.ascontiguousarray(w2.T), "dgated")
            dh1, dh3 = silu_backward(h1, h3, dgated, "g")
            dx = mb.add(x=static_linear(dh1, np.ascontiguousarray(w1.T), "dx1"),
                        y=static_linear(dh3, np.ascontiguousarray(w3.T), "dx3"), name="dx")
            return mb.concat(values=[dx, dh1, dh3, dgated], axis=1, name="out")
        xs, g = as_matrix(xs, "x2"), as_matrix(g, "dout2")
        w1t = as_matrix(columns(x, 2 * S, H, "w1t"), "w1t2")
        w3t = as_matrix(columns(x, 2 * S + H, H, "w3t"), "w3t2")
        w2m = as_matrix(columns(x, 2 * S + 2 * H, H, "w2"), "w22")
        h1, h3 = dynamic_linear(xs, w1t, "h1", True), dynamic_linear(xs, w3t, "h3", True)
        dgated = dynamic_linear(g, w2m, "dgated", True)
        dh1, dh3 = silu_backward(h1, h3, dgated, "g")
        dx = mb.add(x=dynamic_linear(dh1, w1t, "dx1", False),
                    y=dynamic_linear(dh3, w3t, "dx3", False), name="dx2")
        return mb.concat(values=[as_ane(dx, "dx"), as_ane(dh1, "dh1a"), as_ane(dh3, "dh3a"),
                                 as_ane(dgated, "dga")], axis=1, name="out")
    width = 2 * S + (3 * H if pipeline == "dynamic" else 0)
    return build({"x": (1, d.C, 1, width)}, body)


def attention_backward(d):
    """x [1,2QD+2KVD,1,S] = q | k | v | dout (channels) -> out [1,QD+2KVD,1,S] = dq | dk | dv.
    The softmax is recomputed from q and k (nothing of the forward is kept on the ANE)."""
    d.check()
    scale = FP16(1.0 / np.sqrt(d.hs))

    def body(x):
        q3 = grouped(heads(as_matrix(rows(x, 0, d.QD, "q"), "q2"), d.NH, d.hs, "qh"), d, "qg")
        k3 = heads(as_matrix(rows(x, d.QD, d.KVD, "k"), "k2"), d.NKV, d.hs, "kh")
        v3 = heads(as_matrix(rows(x, d.QD + d.KVD, d.KVD, "v"), "v2"), d.NKV, d.hs, "vh")
        g = as_matrix(rows(x, d.QD + 2 * d.KVD, d.QD, "dout"), "dout2")
        g3 = grouped(heads(g, d.NH, d.hs, "dh"), d, "dg")
        probs = scores_softmax(q3, k3, d)                                   # (NKV, G*S, S)
        dv3 = mb.matmul(x=probs, y=g3, transpose_x=True, name="dv3")        # (NKV, S, hs)
        dprobs = mb.matmul(x=g3, y=v3, transpose_y=True, name="dprobs")     # (NKV, G*S, S)
        row = mb.reduce_sum(x=mb.mul(x=dprobs, y=probs, name="dp_p"), axes=[-1], keep_dims=True,
                            name="row_dot")
        dscores = mb.mul(x=probs, y=mb.sub(x=dprobs, y=row, name="dp_centered"), name="dscores")
        dscaled = mb.mul(x=dscores, y=scale, name="dscores_scaled")
        dq3 = mb.matmul(x=dscaled, y=k3, name="dq3")                        # (NKV, G*S, hs)
        dk3 = mb.matmul(x=dscaled, y=q3, transpose_x=True, name="dk3")      # (NKV, S, hs)

        def kv_channels(x, name):
            x = mb.transpose(x=x, perm=[0, 2, 1], name=name + "_t")
            return as_ane(mb.reshape(x=x, shape=[d.KVD, d.S], name=name + "2"), name)
        return mb.concat(values=[as_ane(ungrouped(dq3, d, "dq2"), "dq"), kv_channels(dk3, "dk"),
                                 kv_channels(dv3, "dv")], axis=1, name="out")
    return build({"x": (1, 2 * d.QD + 2 * d.KVD, 1, d.S)}, body)


def qkv_backward(d, pipeline="dynamic", wq=None, wk=None, wv=None):
    """x [1,QD+2KVD,1,S] = dq | dk | dv (channels) -> dx = wqkv^T (dq|dk|dv) [1,C,1,S], one
    matmul by the stacked wqkv (QD+2KVD, C).  Dynamic input "x" [1, QD+2KVD, 1, S+C] =
    (dq|dk|dv) | wqkv; static: wqkv^T a constant."""
    d.check()
    N = d.QD + 2 * d.KVD
    if pipeline == "static":
        return build({"x": (1, N, 1, d.S)}, lambda x: static_linear(
            x, np.ascontiguousarray(np.concatenate([wq, wk, wv]).T), "out"))

    def body(x):
        g = as_matrix(columns(x, 0, d.S, "dqkv"), "dqkv2")
        w = as_matrix(columns(x, d.S, d.C, "wqkv"), "wqkv2")
        return as_ane(dynamic_linear(g, w, "dx2", True), "out")
    return build({"x": (1, N, 1, d.S + d.C)}, body)


def swiglu_backward(N):
    """x [1,3,1,N] = a; b; dout (channels) -> out [1,2,1,N] = da; db of silu(a) * b."""
    def body(x):
        a, b, g = rows(x, 0, 1, "a"), rows(x, 1, 1, "b"), rows(x, 2, 1, "dout")
        da, db = silu_backward(a, b, g, "g")
        return mb.concat(values=[da, db], axis=1, name="out")
    return build({"x": (1, 3, 1, N)}, body)


# --- packing inputs, unpacking outputs ------------------------------------------------------

def to_ane(x):
    """(S, C) rows (a (B, T, C) tensor flattened) -> [1, C, 1, S] fp16."""
    return np.ascontiguousarray(np.asarray(x, np.float32).T.astype(FP16)[None, :, None, :])


def from_ane(x):
    """[1, C, 1, S] -> (S, C) float32."""
    return np.ascontiguousarray(np.asarray(x, np.float32)[0, :, 0, :].T)


def pack(*parts):
    """Concatenate (C, W_i) matrices along the spatial axis into one [1, C, 1, sum W_i] fp16."""
    return np.concatenate([np.asarray(p, np.float32) for p in parts], axis=1).astype(FP16)[
        None, :, None, :]


def stack(*parts):
    """(S, C_i) row-major activations -> [1, sum C_i, 1, S] fp16, concatenated along channels."""
    return to_ane(np.concatenate([np.asarray(p, np.float32) for p in parts], axis=1))


def split(out, *channels):
    """A [1, sum C_i, 1, S] output -> [(S, C_i) float32], the parts along its channels."""
    full = from_ane(out)
    edges = np.cumsum((0,) + channels)
    assert edges[-1] == full.shape[1], (channels, full.shape)
    return [full[:, a:b] for a, b in zip(edges[:-1], edges[1:])]


def programs(d, pipeline="dynamic", weights=None):
    """Every piece of one block at dims d: {name: Program}.  Static needs weights {wq, wk, wv,
    wo, w1, w2, w3} (the CPU layout: (out, in) matrices)."""
    w = weights or {}
    return {
        "qkv_forward": qkv_forward(d, pipeline, w.get("wq"), w.get("wk"), w.get("wv")),
        "attention_forward": attention_forward(d),
        "wo_forward": linear_forward(d.QD, d.C, d.S, pipeline, w.get("wo")),
        "ffn_forward": ffn_forward(d, pipeline, w.get("w1"), w.get("w3"), w.get("w2")),
        "ffn_backward": ffn_backward(d, pipeline, w.get("w1"), w.get("w3"), w.get("w2")),
        "wo_backward": linear_backward(d.QD, d.C, d.S, pipeline, w.get("wo")),
        "attention_backward": attention_backward(d),
        "qkv_backward": qkv_backward(d, pipeline, w.get("wq"), w.get("wk"), w.get("wv")),
    }


def feeds(piece, pipeline, a, w=None):
    """The input "x" of piece's program from CPU-layout arrays: activations a {name: (S, channels)}
    (x, dout, q, k, v, dq, dk, dv), weights w {name: (out, in)}."""
    w = w or {}
    T = {name: np.asarray(value, np.float32).T for name, value in a.items()}
    dynamic = pipeline == "dynamic"
    if piece == "qkv_forward":
        wqkv = np.concatenate([w["wq"], w["wk"], w["wv"]]) if dynamic else None
        return pack(T["x"], wqkv.T) if dynamic else to_ane(a["x"])
    if piece == "attention_forward":
        return stack(a["q"], a["k"], a["v"])
    if piece == "attention_backward":
        return stack(a["q"], a["k"], a["v"], a["dout"])
    if piece == "wo_forward":
        return pack(T["x"], w["wo"].T) if dynamic else to_ane(a["x"])
    if piece == "ffn_forward":
        return pack(T["x"], w["w1"].T, w["w3"].T, w["w2"]) if dynamic else to_ane(a["x"])
    if piece == "ffn_backward":
        return (pack(T["x"], T["dout"], w["w1"].T, w["w3"].T, w["w2"]) if dynamic
                else pack(T["x"], T["dout"]))
    if piece == "wo_backward":
        return pack(T["dout"], w["wo"]) if dynamic else to_ane(a["dout"])
    if piece == "qkv_backward":
        dqkv = np.concatenate([T["dq"], T["dk"], T["dv"]])
        return pack(dqkv, np.concatenate([w["wq"], w["wk"], w["wv"]])) if dynamic else pack(dqkv)
    raise ValueError(f"no piece {piece!r}")


def unpack(piece, d, out):
    """piece's output [1, C, 1, S] -> its parts in CPU layout: [(S, channels) ...], attention's
    probabilities as (NH, S, S)."""
    if piece == "qkv_forward":
        return split(out, d.QD, d.KVD, d.KVD)
    if piece == "attention_forward":
        y, att = split(out, d.QD, d.NH * d.S)
        return [y, np.ascontiguousarray(att.T.reshape(d.NH, d.S, d.S))]
    if piece == "attention_backward":
        return split(out, d.QD, d.KVD, d.KVD)
    if piece in ("ffn_forward", "ffn_backward"):
        return split(out, d.C, d.H, d.H, d.H)
    return [from_ane(out)]
