"""
dev/ab.py: the kernel A/B lab.  For every staged variant of a kernel (dev/cpu/<kernel>_<N>.pyx,
1 = the straight llm.c port, higher = more elaborate) and for the promoted kernel
(kernels/<kernel>.pyx), on GPT-2 124M shapes:
  1. check it against the float64 NumPy reference, kernels/reference.py (forward outputs
     and, for backward, the gradients it adds into buffers that start non-zero): max abs
     error and that error relative to the largest reference value; a variant outside its
     tolerance makes the run exit non-zero, naming it;
  2. time it: warm-up, repeats, median and spread (min-max), and GFLOP/s (matmul, attention)
     or GB/s (the memory-bound rest) against this machine's sgemm peak and DRAM bandwidth,
     measured in the same run (a kernel whose data fits in cache can beat the latter).

    python dev/ab.py --list
    python dev/ab.py matmul [--threads 2] [--repeats 7] [--shapes gpt2|small|decode]
    python dev/ab.py all
    python dev/ab.py gelu --check-only

Build first (make dev).  The thread count is set for OpenMP (OMP_NUM_THREADS, before
any OpenMP library loads) and, before every variant, for every BLAS pool (threadpoolctl), as a
user's threadpool_limits(N) would: a kernel that needs OpenBLAS single-threaded (GEMMs called
from OpenMP threads) must say so itself on every call, as kernels.matmul does.
tests/test_dev_variants.py imports check() from here and runs the check part on small shapes.
"""
import argparse
import glob
import importlib
import os
import re
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from kernels import reference as R  # noqa: E402

# GPT-2 124M (d12): C channels, NH heads, V vocab, Vp padded vocab, maxT context, L layers
GPT2 = dict(C=768, NH=12, V=50257, Vp=50304, maxT=1024, L=12)
SHAPES = {
    "small": [dict(B=2, T=16, C=64, NH=4, V=500, Vp=512, maxT=32, L=2)],
    "gpt2": [dict(GPT2, B=4, T=64), dict(GPT2, B=4, T=1024)],
    # generation's decode step with a KV cache: one position (matrix-vector products)
    "decode": [dict(GPT2, B=1, T=1)],
}


def num_parameters(s):
    """Parameters of a GPT-2 with these sizes (llm.c's layout, padded vocab)."""
    C, L = s["C"], s["L"]
    per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C
    return s["Vp"] * C + s["maxT"] * C + L * per_layer + 2 * C


def shape_name(s):
    return f"B={s['B']} T={s['T']}"


# ----------------------------------------------------------------------------
# Kernels: inputs, the calls, the comparison with the float64 reference (kernels/reference.py,
# the tests' too), and the work done per call.
# For each case, make() builds a state dict of float32 inputs and outputs; one method per
# pass (forward, backward, ...) calls a module's wrappers on it; compare(st, pass) returns
# {tensor: (what the module wrote, the float64 reference)}.

class Kernel:
    name = ""
    passes = ("forward", "backward")
    tolerance = 1e-5          # max |out - ref| / max |ref|, per compared tensor
    metric = "GB/s"           # or GFLOP/s
    baseline = None           # a module timed first, the "vs 1" row, when not variant 1

    def cases(self, s):
        """[(case name, parameters)] for one shape."""
        return [("", {})]

    def work(self, st, pass_):
        """bytes (GB/s kernels) or flops (GFLOP/s kernels) of one call."""
        raise NotImplementedError

    def fresh_outputs(self, st, pass_):
        """Reset the buffers a call writes (backward: gradients start at a known non-zero)."""


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def f64(x):
    return np.asarray(x, dtype=np.float64)


class Matmul(Kernel):
    name = "matmul"
    metric = "GFLOP/s"
    tolerance = 1e-5
    SAMPLE = 256    # big cases are checked on this many sampled rows of each output

    def cases(self, s):
        C, Vp = s["C"], s["Vp"]
        return [("qkv", dict(C=C, OC=3 * C, bias=True)), ("attproj", dict(C=C, OC=C, bias=True)),
                ("fc", dict(C=C, OC=4 * C, bias=True)), ("fcproj", dict(C=4 * C, OC=C, bias=True)),
                ("lm_head", dict(C=C, OC=Vp, bias=False))]

    def make(self, s, case, rng):
        B, T, C, OC = s["B"], s["T"], case["C"], case["OC"]
        st = dict(B=B, T=T, C=C, OC=OC,
                  inp=rand(rng, B, T, C), weight=rand(rng, OC, C, scale=0.02),
                  bias=rand(rng, OC, scale=0.1) if case["bias"] else None,
                  dout=rand(rng, B, T, OC),
                  out=np.zeros((B, T, OC), np.float32),
                  dinp0=rand(rng, B, T, C), dweight0=rand(rng, OC, C, scale=0.1),
                  dbias0=rand(rng, OC) if case["bias"] else None)
        st["dinp"], st["dweight"] = st["dinp0"].copy(), st["dweight0"].copy()
        st["dbias"] = None if st["dbias0"] is None else st["dbias0"].copy()
        return st

    def forward(self, mod, st):
        mod.forward(st["out"], st["inp"], st["weight"], st["bias"])

    def backward(self, mod, st):
        mod.backward(st["dinp"], st["dweight"], st["dbias"], st["dout"], st["inp"], st["weight"])

    def fresh_outputs(self, st, pass_):
        if pass_ == "forward":
            st["out"].fill(np.nan)
        else:
            np.copyto(st["dinp"], st["dinp0"])
            np.copyto(st["dweight"], st["dweight0"])
            if st["dbias"] is not None:
                np.copyto(st["dbias"], st["dbias0"])

    def _rows(self, n, rng):
        # every row for small cases, a sorted sample (with the first and last) for big ones
        if n <= 2 * self.SAMPLE:
            return np.arange(n)
        pick = rng.choice(n - 2, self.SAMPLE - 2, replace=False) + 1
        return np.concatenate([[0], np.sort(pick), [n - 1]])

    def reference(self, st, pass_):
        """The sampled rows and their reference values, computed once per state: the float64
        GEMMs take seconds at lm_head's size, and every module gets the same inputs.
        forward: (rows of out, out);  backward: (rows of dinp, rows of dweight, dinp, dweight,
        dbias), from the rows of dout that each needs (dweight's rows are columns of dout)."""
        key = "reference " + pass_
        if key not in st:
            rng = np.random.default_rng(1)
            C, OC = st["C"], st["OC"]
            inp, dout = st["inp"].reshape(-1, C), st["dout"].reshape(-1, OC)
            bt = self._rows(inp.shape[0], rng)
            if pass_ == "forward":
                st[key] = bt, R.matmul_forward(inp[bt], st["weight"], st["bias"])
            else:
                o = self._rows(OC, rng)
                dinp = R.matmul_backward(st["dinp0"].reshape(-1, C)[bt], 0.0, None, dout[bt], inp[bt],
                                         st["weight"])[0]
                dbias0 = None if st["dbias0"] is None else st["dbias0"][o]
                _, dweight, dbias = R.matmul_backward(0.0, st["dweight0"][o], dbias0, dout[:, o], inp,
                                                      st["weight"][o])
                st[key] = bt, o, dinp, dweight, dbias
        return st[key]

    def compare(self, st, pass_):
        C, OC = st["C"], st["OC"]
        if pass_ == "forward":
            bt, out = self.reference(st, pass_)
            return {"out": (st["out"].reshape(-1, OC)[bt], out)}
        bt, o, dinp, dweight, dbias = self.reference(st, pass_)
        got = {"dinp": (st["dinp"].reshape(-1, C)[bt], dinp), "dweight": (st["dweight"][o], dweight)}
        if dbias is not None:
            got["dbias"] = (st["dbias"][o], dbias)
        return got

    def work(self, st, pass_):
        flops = 2.0 * st["B"] * st["T"] * st["C"] * st["OC"]
        return flops if pass_ == "forward" else 2 * flops


class Attention(Kernel):
    name = "attention"
    metric = "GFLOP/s"
    tolerance = 1e-5

    def make(self, s, case, rng):
        B, T, C, NH = s["B"], s["T"], s["C"], s["NH"]
        st = dict(B=B, T=T, C=C, NH=NH, inp=rand(rng, B, T, 3 * C), dout=rand(rng, B, T, C),
                  out=np.zeros((B, T, C), np.float32),
                  preatt=np.zeros((B, NH, T, T), np.float32), att=np.zeros((B, NH, T, T), np.float32),
                  dinp0=rand(rng, B, T, 3 * C), dpreatt0=rand(rng, B, NH, T, T, scale=0.1),
                  datt0=rand(rng, B, NH, T, T, scale=0.1))
        for k in ("dinp", "dpreatt", "datt"):
            st[k] = st[k + "0"].copy()
        return st

    def forward(self, mod, st):
        mod.forward(st["out"], st["preatt"], st["att"], st["inp"], st["NH"])

    def backward(self, mod, st):
        mod.backward(st["dinp"], st["dpreatt"], st["datt"], st["dout"], st["inp"], st["att"], st["NH"])

    def fresh_outputs(self, st, pass_):
        if pass_ == "forward":
            for k in ("out", "preatt", "att"):
                st[k].fill(np.nan)
        else:
            # gradients start non-zero (backward adds, even into its scratch), and att above
            # the diagonal is NaN: a backward that reads the masked future is wrong
            for k in ("dinp", "dpreatt", "datt"):
                np.copyto(st[k], st[k + "0"])
            T = st["T"]
            st["att"][:, :, ~np.tril(np.ones((T, T), bool))] = np.nan

    def compare(self, st, pass_):
        # one batch row at a time: the (NH,T,T) float64 scores of all B at T=1024 are 400 MB each.
        # preatt above the diagonal is not compared (llm.c's kernel leaves it as it was); the
        # backward reference reads this module's att, whose NaNs above the diagonal it must ignore
        B, T = st["B"], st["T"]
        lower = np.tril(np.ones((T, T), bool))
        names = ("out", "preatt", "att") if pass_ == "forward" else ("dinp", "dpreatt", "datt")
        pairs = {name: [] for name in names}
        for b in range(B):
            if pass_ == "forward":
                refs = R.attention_forward(st["inp"][b], st["NH"])
            else:
                refs = R.attention_backward(st["dinp0"][b], st["dpreatt0"][b], st["datt0"][b],
                                            st["dout"][b], st["inp"][b], st["att"][b], st["NH"])
            for name, ref in zip(names, refs):
                got = st[name][b]
                if name == "preatt":
                    got, ref = got[:, lower], ref[:, lower]
                pairs[name].append((got, ref))
        return pairs

    def work(self, st, pass_):
        # the causal half of q.k^T and of att @ v: 2 * (T(T+1)/2) * hs * 2 flops per (b, h)
        flops = 2.0 * st["B"] * st["NH"] * st["T"] * (st["T"] + 1) * (st["C"] // st["NH"])
        return flops if pass_ == "forward" else 2 * flops


class FlashAttention(Kernel):
    """Causal attention keeping only each row's log-sum-exp (B,NH,T); its first row is
    kernels.attention, the kernel with llm.c's (B,NH,T,T) buffers that it replaces ("vs 1")."""
    name = "flash_attention"
    baseline = "kernels.attention"
    metric = "GFLOP/s"
    tolerance = 1e-5

    def make(self, s, case, rng):
        B, T, C, NH = s["B"], s["T"], s["C"], s["NH"]
        st = dict(B=B, T=T, C=C, NH=NH, inp=rand(rng, B, T, 3 * C), dout=rand(rng, B, T, C),
                  out=np.zeros((B, T, C), np.float32), lse=np.zeros((B, NH, T), np.float32),
                  dinp0=rand(rng, B, T, 3 * C))
        st["dinp"] = st["dinp0"].copy()
        return st

    @staticmethod
    def _scores(st):
        # the baseline's (B,NH,T,T) buffers, made on first use only
        if "att" not in st:
            shape = (st["B"], st["NH"], st["T"], st["T"])
            st["preatt"], st["att"] = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            st["dpreatt"], st["datt"] = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        return st

    def forward(self, mod, st):
        if mod.__name__ == self.baseline:
            self._scores(st)
            mod.forward(st["out"], st["preatt"], st["att"], st["inp"], st["NH"])
        else:
            mod.forward(st["out"], st["lse"], st["inp"], st["NH"])

    def backward(self, mod, st):
        if mod.__name__ == self.baseline:
            self._scores(st)
            mod.backward(st["dinp"], st["dpreatt"], st["datt"], st["dout"], st["inp"], st["att"], st["NH"])
        else:
            mod.backward(st["dinp"], st["dout"], st["inp"], st["out"], st["lse"], st["NH"])

    def fresh_outputs(self, st, pass_):
        if pass_ == "forward":
            st["out"].fill(np.nan)
            st["lse"].fill(np.nan)
        else:
            np.copyto(st["dinp"], st["dinp0"])
            if "att" in st:   # the baseline's scratch gradients start at zero, as in a step
                st["dpreatt"].fill(0.0)
                st["datt"].fill(0.0)

    def compare(self, st, pass_):
        # one batch row at a time (the float64 reference builds (NH,T,T) scores); the baseline
        # writes no lse, so lse is compared when the module wrote one
        names = ("out", "lse") if pass_ == "forward" else ("dinp",)
        pairs = {name: [] for name in names}
        for b in range(st["B"]):
            if pass_ == "forward":
                refs = R.flash_attention_forward(st["inp"][b], st["NH"])
            else:
                refs = (R.flash_attention_backward(st["dinp0"][b], st["dout"][b], st["inp"][b],
                                                   st["out"][b], st["lse"][b], st["NH"]),)
            for name, ref in zip(names, refs):
                if not (name == "lse" and np.isnan(st["lse"]).all()):
                    pairs[name].append((st[name][b], ref))
        return pairs

    def work(self, st, pass_):
        # as Attention's: the causal half of q.k^T and att @ v, twice that backward (the flash
        # backward's recomputed q.k^T is not counted: the same work, done sooner)
        flops = 2.0 * st["B"] * st["NH"] * st["T"] * (st["T"] + 1) * (st["C"] // st["NH"])
        return flops if pass_ == "forward" else 2 * flops


class Layernorm(Kernel):
    name = "layernorm"
    tolerance = 1e-5

    def make(self, s, case, rng):
        B, T, C = s["B"], s["T"], s["C"]
        st = dict(B=B, T=T, C=C, inp=rand(rng, B, T, C, scale=2.0) + 0.5,
                  weight=1.0 + rand(rng, C, scale=0.1), bias=rand(rng, C, scale=0.1),
                  out=np.zeros((B, T, C), np.float32), mean=np.zeros((B, T), np.float32),
                  rstd=np.zeros((B, T), np.float32), dout=rand(rng, B, T, C),
                  dinp0=rand(rng, B, T, C), dweight0=rand(rng, C), dbias0=rand(rng, C))
        for k in ("dinp", "dweight", "dbias"):
            st[k] = st[k + "0"].copy()
        return st

    def forward(self, mod, st):
        mod.forward(st["out"], st["mean"], st["rstd"], st["inp"], st["weight"], st["bias"])

    def backward(self, mod, st):
        mod.backward(st["dinp"], st["dweight"], st["dbias"], st["dout"], st["inp"], st["weight"],
                     st["mean"], st["rstd"])

    def fresh_outputs(self, st, pass_):
        if pass_ == "forward":
            for k in ("out", "mean", "rstd"):
                st[k].fill(np.nan)
        else:
            for k in ("dinp", "dweight", "dbias"):
                np.copyto(st[k], st[k + "0"])

    def compare(self, st, pass_):
        if pass_ == "forward":
            names, refs = ("out", "mean", "rstd"), R.layernorm_forward(st["inp"], st["weight"], st["bias"])
        else:
            # from the mean and rstd this module's forward cached (checked by forward), as its
            # backward reads them
            names = ("dinp", "dweight", "dbias")
            refs = R.layernorm_backward(st["dinp0"], st["dweight0"], st["dbias0"], st["dout"], st["inp"],
                                        st["weight"], st["mean"], st["rstd"])
        return {name: (st[name], ref) for name, ref in zip(names, refs)}

    def work(self, st, pass_):
        n = st["B"] * st["T"] * st["C"] * 4
        return 2 * n if pass_ == "forward" else 4 * n   # fwd: read x, write out; bwd: x, dout, dinp r+w


class Gelu(Kernel):
    name = "gelu"
    tolerance = 1e-5

    def make(self, s, case, rng):
        N = s["B"] * s["T"] * 4 * s["C"]
        st = dict(N=N, inp=rand(rng, N, scale=2.0), dout=rand(rng, N), out=np.zeros(N, np.float32),
                  dinp0=rand(rng, N))
        st["inp"][:6] = [-100.0, -12.0, -3.0, 0.0, 3.0, 100.0]   # the far tails and zero
        st["dinp"] = st["dinp0"].copy()
        return st

    def forward(self, mod, st):
        mod.forward(st["out"], st["inp"])

    def backward(self, mod, st):
        mod.backward(st["dinp"], st["inp"], st["dout"])

    def fresh_outputs(self, st, pass_):
        if pass_ == "forward":
            st["out"].fill(np.nan)
        else:
            np.copyto(st["dinp"], st["dinp0"])

    def compare(self, st, pass_):
        if pass_ == "forward":
            return {"out": (st["out"], R.gelu_forward(st["inp"]))}
        return {"dinp": (st["dinp"], R.gelu_backward(st["dinp0"], st["inp"], st["dout"]))}

    def work(self, st, pass_):
        return st["N"] * 4 * (2 if pass_ == "forward" else 4)


class Residual(Kernel):
    name = "residual"
    tolerance = 1e-6

    def make(self, s, case, rng):
        N = s["B"] * s["T"] * s["C"]
        st = dict(N=N, inp1=rand(rng, N), inp2=rand(rng, N), dout=rand(rng, N),
                  out=np.zeros(N, np.float32), dinp10=rand(rng, N), dinp20=rand(rng, N))
        st["dinp1"], st["dinp2"] = st["dinp10"].copy(), st["dinp20"].copy()
        return st

    def forward(self, mod, st):
        mod.forward(st["out"], st["inp1"], st["inp2"])

    def backward(self, mod, st):
        mod.backward(st["dinp1"], st["dinp2"], st["dout"])

    def fresh_outputs(self, st, pass_):
        if pass_ == "forward":
            st["out"].fill(np.nan)
        else:
            np.copyto(st["dinp1"], st["dinp10"])
            np.copyto(st["dinp2"], st["dinp20"])

    def compare(self, st, pass_):
        if pass_ == "forward":
            return {"out": (st["out"], R.residual_forward(st["inp1"], st["inp2"]))}
        dinp1, dinp2 = R.residual_backward(st["dinp10"], st["dinp20"], st["dout"])
        return {"dinp1": (st["dinp1"], dinp1), "dinp2": (st["dinp2"], dinp2)}

    def work(self, st, pass_):
        return st["N"] * 4 * (3 if pass_ == "forward" else 5)


class Encoder(Kernel):
    name = "encoder"
    tolerance = 1e-6

    def make(self, s, case, rng):
        B, T, C, Vp, maxT = s["B"], s["T"], s["C"], s["Vp"], s["maxT"]
        ids = rng.integers(0, s["V"], (B, T)).astype(np.int32)
        ids[:, ::5] = 7                                       # a repeated token: gradients collide
        st = dict(B=B, T=T, C=C, inp=ids, wte=rand(rng, Vp, C, scale=0.02),
                  wpe=rand(rng, maxT, C, scale=0.01), dout=rand(rng, B, T, C),
                  out=np.zeros((B, T, C), np.float32),
                  dwte0=rand(rng, Vp, C, scale=0.01), dwpe0=rand(rng, maxT, C, scale=0.01))
        st["dwte"], st["dwpe"] = st["dwte0"].copy(), st["dwpe0"].copy()
        return st

    def forward(self, mod, st):
        mod.forward(st["out"], st["inp"], st["wte"], st["wpe"])

    def backward(self, mod, st):
        mod.backward(st["dwte"], st["dwpe"], st["dout"], st["inp"])

    def fresh_outputs(self, st, pass_):
        if pass_ == "forward":
            st["out"].fill(np.nan)
        else:
            np.copyto(st["dwte"], st["dwte0"])
            np.copyto(st["dwpe"], st["dwpe0"])

    def compare(self, st, pass_):
        if pass_ == "forward":
            return {"out": (st["out"], R.encoder_forward(st["inp"], st["wte"], st["wpe"]))}
        dwte, dwpe = R.encoder_backward(st["dwte0"], st["dwpe0"], st["dout"], st["inp"])
        rows = np.unique(st["inp"])   # the rows of wte read (the rest are 50k untouched rows)
        return {"dwte": (st["dwte"][rows], dwte[rows]), "dwpe": (st["dwpe"], dwpe)}

    def work(self, st, pass_):
        n = st["B"] * st["T"] * st["C"] * 4
        return 3 * n if pass_ == "forward" else 5 * n




class Crossentropy(Kernel):
    name = "crossentropy"
    passes = ("softmax_forward", "forward", "backward")
    # the softmax divides by a sum of V = 50257 float exponentials: llm.c's sequential float
    # sum is off by up to ~2e-4 of it (measured at B=4, T=1024); a wrong kernel is off by O(1)
    tolerance = 5e-4

    def make(self, s, case, rng):
        B, T, V, Vp = s["B"], s["T"], s["V"], s["Vp"]
        logits = rand(rng, B, T, Vp, scale=3.0)
        logits[..., V:] = 0.0
        targets = rng.integers(0, V, (B, T)).astype(np.int32)
        targets.reshape(-1)[::7] = -1   # positions not scored: their rows must be left alone
        st = dict(B=B, T=T, V=V, Vp=Vp, logits=logits, targets=targets,
                  probs=np.zeros((B, T, Vp), np.float32), losses=np.zeros((B, T), np.float32),
                  dlosses=np.full((B, T), 1.0 / (B * T), np.float32),
                  dlogits0=rand(rng, B, T, Vp, scale=1e-4))
        st["dlogits"] = st["dlogits0"].copy()
        return st

    def softmax_forward(self, mod, st):
        mod.softmax(st["probs"], st["logits"], st["V"])

    def forward(self, mod, st):
        mod.forward(st["losses"], st["probs"], st["targets"])

    def backward(self, mod, st):
        mod.backward(st["dlogits"], st["dlosses"], st["probs"], st["targets"], st["V"])

    def fresh_outputs(self, st, pass_):
        if pass_ == "softmax_forward":
            st["probs"].fill(np.nan)
        elif pass_ == "forward":
            st["losses"].fill(np.nan)
        else:
            np.copyto(st["dlogits"], st["dlogits0"])

    ROWS = 256   # positions per reference chunk: float64 copies of (B*T, Vp) would be GBs

    def compare(self, st, pass_):
        # forward and backward read the probs this module's softmax_forward wrote
        V, Vp = st["V"], st["Vp"]
        targets = st["targets"].reshape(-1)
        if pass_ == "forward":
            ref = R.crossentropy_forward(st["probs"].reshape(-1, Vp), targets)
            return {"losses": (st["losses"].reshape(-1), ref)}
        name = "probs" if pass_ == "softmax_forward" else "dlogits"
        pairs = []
        for r0 in range(0, len(targets), self.ROWS):
            rows = slice(r0, r0 + self.ROWS)
            if pass_ == "softmax_forward":
                ref = R.softmax_forward(st["logits"].reshape(-1, Vp)[rows], V)
            else:
                ref = R.crossentropy_softmax_backward(st["dlogits0"].reshape(-1, Vp)[rows],
                                                      st["dlosses"].reshape(-1)[rows],
                                                      st["probs"].reshape(-1, Vp)[rows], targets[rows], V)
            pairs.append((st[name].reshape(-1, Vp)[rows], ref))
        return {name: pairs}

    def work(self, st, pass_):
        n = st["B"] * st["T"] * st["Vp"] * 4
        return {"softmax_forward": 2 * n, "forward": st["B"] * st["T"] * 8, "backward": 3 * n}[pass_]


class Adamw(Kernel):
    name = "adamw"
    passes = ("update", "global_norm_squared")
    tolerance = 1e-5
    HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_scale=0.5, t=3)
    CHECK_N = 1 << 22      # the update is checked on the first CHECK_N parameters

    def cases(self, s):
        return [("", {})]

    def make(self, s, case, rng):
        n = num_parameters(s)
        st = dict(n=n)
        # random numbers for 124M parameters take seconds: tile a 1M block
        for k, scale in (("params", 0.02), ("grads", 1e-3)):
            block = rand(rng, 1 << 20, scale=scale)
            st[k] = np.resize(block, n)
        st["m"] = np.resize(rand(rng, 1 << 20, scale=1e-4), n)
        st["v"] = np.abs(np.resize(rand(rng, 1 << 20, scale=1e-6), n))
        k = min(n, self.CHECK_N)
        st["check"] = {key: st[key][:k].copy() for key in ("params", "m", "v")}
        return st

    def update(self, mod, st):
        h = self.HYPER
        mod.update(st["params"], st["m"], st["v"], st["grads"], h["lr"], h["beta1"], h["beta2"],
                   h["eps"], h["weight_decay"], h["grad_scale"], h["t"])

    def global_norm_squared(self, mod, st):
        st["norm2"] = mod.norm_squared(st["grads"])

    def fresh_outputs(self, st, pass_):
        if pass_ == "update":
            k = len(st["check"]["params"])
            for key in ("params", "m", "v"):
                st[key][:k] = st["check"][key]

    def compare(self, st, pass_):
        if pass_ == "global_norm_squared":
            return {"norm2": (np.array([st["norm2"]]), np.array([R.global_norm_squared(st["grads"])]))}
        k = len(st["check"]["params"])
        check = st["check"]
        refs = R.adamw_update(check["params"], check["m"], check["v"], st["grads"][:k], **self.HYPER)
        return {name: (st[name][:k], ref) for name, ref in zip(("params", "m", "v"), refs)}

    def work(self, st, pass_):
        return st["n"] * 4 * (7 if pass_ == "update" else 1)


class MatmulGelu(Kernel):
    """GPT-2's fc matmul and its GELU (the lab's fusion test; the model runs them apart)."""
    name = "matmul_gelu"
    passes = ("forward",)
    metric = "GFLOP/s"
    tolerance = 1e-5

    def make(self, s, case, rng):
        B, T, C = s["B"], s["T"], s["C"]
        return dict(B=B, T=T, C=C, OC=4 * C, inp=rand(rng, B, T, C),
                    weight=rand(rng, 4 * C, C, scale=0.02), bias=rand(rng, 4 * C, scale=0.1),
                    out=np.zeros((B, T, 4 * C), np.float32), out_gelu=np.zeros((B, T, 4 * C), np.float32))

    def forward(self, mod, st):
        mod.forward(st["out"], st["out_gelu"], st["inp"], st["weight"], st["bias"])

    def fresh_outputs(self, st, pass_):
        st["out"].fill(np.nan)
        st["out_gelu"].fill(np.nan)

    def compare(self, st, pass_):
        rows = st["inp"].reshape(-1, st["C"])[:256]   # the first 256 positions
        out = R.matmul_forward(rows, st["weight"], st["bias"])
        return {"out": (st["out"].reshape(-1, st["OC"])[:256], out),
                "out_gelu": (st["out_gelu"].reshape(-1, st["OC"])[:256], R.gelu_forward(out))}

    def work(self, st, pass_):
        return 2.0 * st["B"] * st["T"] * st["C"] * st["OC"]


class Zero(Kernel):
    name = "zero"
    passes = ("zero",)
    tolerance = 0.0

    def make(self, s, case, rng):
        # zero_grad's buffer: the parameter gradients
        return dict(x=np.ones(num_parameters(s), np.float32))

    def zero(self, mod, st):
        mod.zero(st["x"])

    def fresh_outputs(self, st, pass_):
        st["x"].fill(1.0)

    def compare(self, st, pass_):
        return {"x": (st["x"], R.zero(st["x"]))}

    def work(self, st, pass_):
        return st["x"].nbytes


KERNELS = {k.name: k for k in (Matmul(), Attention(), FlashAttention(), Layernorm(), Gelu(), Adamw(), Crossentropy(),
                               Encoder(), Residual(), Zero(), MatmulGelu())}


# ----------------------------------------------------------------------------
# Variants

def variant_names(kernel):
    """The staged variants of a kernel, by number, then the promoted kernel."""
    found = []
    for path in glob.glob(os.path.join(HERE, "cpu", f"{kernel}_*.pyx")):
        m = re.fullmatch(rf"{kernel}_(\d+)\.pyx", os.path.basename(path))
        if m:
            found.append((int(m.group(1)), f"dev.cpu.{kernel}_{m.group(1)}"))
    names = [name for _, name in sorted(found)]
    if os.path.exists(os.path.join(ROOT, "kernels", f"{kernel}.pyx")):
        names.append(f"kernels.{kernel}")
    return names


def short(module_name):
    return module_name.split(".")[-1] if module_name.startswith("dev.") else module_name


def load(module_name):
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise SystemExit(f"dev/ab.py: cannot import {module_name} ({e}); build it first: make dev")


def max_errors(pairs):
    """{tensor: (max abs error, max abs error / max |reference|)}; NaN counts as infinitely wrong.
    A tensor is a (got, reference) pair, or a list of such pairs (chunks of a big tensor)."""
    errs = {}
    for name, chunks in pairs.items():
        abs_err, scale = 0.0, 0.0
        for got, ref in (chunks if isinstance(chunks, list) else [chunks]):
            got, ref = f64(got), f64(ref)
            if not ref.size:
                continue
            diff = np.abs(got - ref)
            abs_err = max(abs_err, float(np.max(diff)) if np.all(np.isfinite(diff)) else float("inf"))
            scale = max(scale, float(np.max(np.abs(ref))))
        errs[name] = (abs_err, abs_err / scale if scale > 0 else abs_err)
    return errs


def run_pass(kernel, mod, st, pass_):
    getattr(kernel, pass_)(mod, st)


def check_case(kernel, mod, st):
    """Run each pass once on fresh outputs and compare; {pass: {tensor: (abs, rel)}}.
    Passes run in order (a backward reads what its forward wrote), as in a training step."""
    result = {}
    for pass_ in kernel.passes:
        kernel.fresh_outputs(st, pass_)
        run_pass(kernel, mod, st, pass_)
        result[pass_] = max_errors(kernel.compare(st, pass_))
    return result


def check(kernel_name, module_name, shape, seed=0):
    """Check one variant on one shape, every case: returns the worst relative error and a list
    of (case, pass, tensor, abs err, rel err) rows; the variant is correct when worst <= tolerance."""
    kernel = KERNELS[kernel_name]
    mod = load(module_name)
    rows, worst = [], 0.0
    for case_name, case in kernel.cases(shape):
        st = kernel.make(shape, case, np.random.default_rng(seed))
        for pass_, errs in check_case(kernel, mod, st).items():
            for tensor, (a, r) in errs.items():
                rows.append((case_name, pass_, tensor, a, r))
                worst = max(worst, r)
    return worst, rows


CLOCK = time.perf_counter   # --cpu-time: time.process_time


def time_call(fn, repeats, warmup=1, budget=None):
    """Median, min, max seconds of fn() over repeats after warm-up; fewer repeats when one call
    is slow (budget: seconds to spend on the repeats)."""
    for _ in range(warmup):
        t0 = CLOCK()
        fn()
        first = CLOCK() - t0
    if budget is not None and warmup and first * repeats > budget:
        repeats = max(1, int(budget / max(first, 1e-9)))
    times = []
    for _ in range(repeats):
        t0 = CLOCK()
        fn()
        times.append(CLOCK() - t0)
    return float(np.median(times)), min(times), max(times), len(times)


# ----------------------------------------------------------------------------
# The machine

def set_threads(n):
    """Thread count for OpenMP and every BLAS, before any of them runs: OMP_NUM_THREADS for
    libgomp (read once, when it loads) and threadpoolctl for pools already loaded."""
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["OPENBLAS_NUM_THREADS"] = str(n)


def limit_threads(n):
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=n)


def measure_machine(quick=False):
    """(sgemm GFLOP/s, DRAM GB/s) on the current thread settings, best of a few."""
    from llmc.dry_run import measure_gflops
    machine = load("dev.cpu.machine")
    gflops = measure_gflops(1024 if quick else 2048, 3)
    floats = 1 << (20 if quick else 26)    # 4 x 256 MiB: far past the 32 MiB L3
    gbs = 28.0 * floats / machine.bandwidth_seconds(floats, 3) / 1e9
    return gflops, gbs


# ----------------------------------------------------------------------------
# The table

def fmt_ms(seconds):
    return f"{seconds * 1e3:9.3f}"


def estimated_seconds(kernel, name, case_name, st, first_time):
    """A variant's predicted time for one call of every pass at this shape, from its time at
    the first shape scaled by the work; 0 when it has not been timed yet."""
    total = 0.0
    for pass_ in kernel.passes:
        if (name, case_name, pass_) in first_time:
            seconds, work = first_time[(name, case_name, pass_)]
            total += seconds * kernel.work(st, pass_) / work
    return total


def variant_lines(kernel, name, mod, s, case_name, st, repeats, peak_value, check_only, budget,
                  base, first_time, failed):
    """Check one variant on one case, then time each pass: one table line per pass."""
    errs = check_case(kernel, mod, st)
    lines = []
    for pass_ in kernel.passes:
        worst = max(errs[pass_].values(), key=lambda e: e[1])
        ok = worst[1] <= kernel.tolerance
        if not ok:
            failed.append(f"{short(name)} {shape_name(s)} {case_name} {pass_}: "
                          + ", ".join(f"{t} rel err {r:.2g}" for t, (a, r) in errs[pass_].items()))
        line = (f"{short(name):<20} {shape_name(s):<14} {case_name:<8} {pass_:<19} "
                f"{worst[0]:11.2e} {worst[1]:9.1e}")
        if not check_only:
            med, lo, hi, n = time_call(lambda: run_pass(kernel, mod, st, pass_), repeats, budget=budget)
            work = kernel.work(st, pass_)
            rate = work / med / 1e9
            if name == base["name"]:
                base[pass_] = med
            first_time.setdefault((name, case_name, pass_), (med, work))
            speedup = f"{base[pass_] / med:5.2f}x" if pass_ in base else "    -"
            line += (f" {fmt_ms(med)} {fmt_ms(lo)}–{fmt_ms(hi).strip():<9} {rate:8.1f} "
                     f"{100 * rate / peak_value:5.0f}% {speedup}")
            if n < repeats:
                line += f" ({n} runs)"
        if not ok:
            line += "  WRONG"
        lines.append(line)
    return lines


def run_kernel(kernel_name, shapes, repeats, threads, peak, check_only, budget, out):
    """Check and time every variant of one kernel; returns the failures (wrong variants)."""
    kernel = KERNELS[kernel_name]
    names = ([kernel.baseline] if kernel.baseline else []) + variant_names(kernel_name)
    mods = {name: load(name) for name in names}
    failed = []
    first_time = {}    # (variant, case, pass) -> (seconds, work) at the first shape
    header = f"\n== {kernel_name}   ({threads} threads; tolerance {kernel.tolerance:g} on max|err| / max|ref|"
    peak_value = peak[0] if kernel.metric == "GFLOP/s" else peak[1]
    if not check_only:
        peak_name = "sgemm peak" if kernel.metric == "GFLOP/s" else "DRAM bandwidth"
        header += f"; % of the {peak_name}, {peak_value:.1f} {kernel.metric}"
    out(header + ")")
    out(f"{'variant':<20} {'shape':<14} {'case':<8} {'pass':<19} {'max abs err':>11} {'rel err':>9}"
        + ("" if check_only else f" {'median ms':>9} {'min–max ms':>19} {kernel.metric:>8} {'% peak':>6}"
                                 f" {'vs 1':>6}"))
    for s in shapes:
        for case_name, case in kernel.cases(s):
            st = kernel.make(s, case, np.random.default_rng(0))
            base = dict(name=names[0])   # the straight port's median per pass ("vs 1")
            for name in names:
                est = estimated_seconds(kernel, name, case_name, st, first_time)
                if not check_only and s is not shapes[0] and est > 4 * budget:
                    # a straight port at T=1024: say so rather than wait minutes for it
                    out(f"{short(name):<20} {shape_name(s):<14} {case_name:<8} (skipped: about "
                        f"{est:.0f} s per call, from its time at {shape_name(shapes[0])})")
                    continue
                # a variant may change a process-wide BLAS setting (kernels.matmul sets OpenBLAS
                # to one thread): every variant starts from the same thread counts
                with limit_threads(threads):
                    lines = variant_lines(kernel, name, mods[name], s, case_name, st, repeats,
                                          peak_value, check_only, budget, base, first_time, failed)
                for line in lines:
                    out(line)
    return failed


def main(argv=None):
    p = argparse.ArgumentParser(description="Check and time the staged kernel variants in dev/cpu/.")
    p.add_argument("kernel", nargs="?", help="kernel name, or 'all'")
    p.add_argument("--list", action="store_true", help="list kernels and their variants")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="OpenMP and BLAS threads")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per row (after a warm-up)")
    p.add_argument("--shapes", choices=sorted(SHAPES), default="gpt2")
    p.add_argument("--check-only", action="store_true", help="check, do not time")
    p.add_argument("--cpu-time", action="store_true",
                   help="time with this process's CPU clock (needs --threads 1): on a shared "
                        "machine it leaves out the time other processes held the core")
    p.add_argument("--budget", type=float, default=5.0,
                   help="seconds to spend on one row's repeats (slow rows get fewer)")
    args = p.parse_args(argv)

    set_threads(args.threads)
    if args.cpu_time:
        if args.threads != 1:
            p.error("--cpu-time needs --threads 1 (the CPU clock adds up every thread's time)")
        global CLOCK
        CLOCK = time.process_time
    if args.list:
        for name in KERNELS:
            print(f"{name:<13} " + "  ".join(short(v) for v in variant_names(name)))
        return 0
    if not args.kernel:
        p.error("name a kernel (see --list) or 'all'")
    kernels = list(KERNELS) if args.kernel == "all" else [args.kernel]
    for k in kernels:
        if k not in KERNELS:
            p.error(f"unknown kernel {k!r}; one of: {', '.join(KERNELS)}, all")

    with limit_threads(args.threads):
        peak = (0.0, 0.0)
        if not args.check_only:
            peak = measure_machine(quick=args.shapes == "small")
            print(f"machine: sgemm {peak[0]:.1f} GFLOP/s (kernels.matmul 2048^3), DRAM "
                  f"{peak[1]:.1f} GB/s (4-read/3-write pass), {args.threads} threads")
        failed = []
        for k in kernels:
            failed += run_kernel(k, SHAPES[args.shapes], args.repeats, args.threads, peak,
                                 args.check_only, args.budget, lambda line: print(line, flush=True))
    if failed:
        print("\nWRONG (outside tolerance):", file=sys.stderr)
        for f in failed:
            print("  " + f, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
