"""
The backend table, declared once: every entry's name, group and arguments.  Everything that
is mechanical about the table is made from this list by accel/codegen.py (`make generate`) into
accel/generated/, committed and checked by the build:

    table.pxi           the struct BackendTable (accel/backend.pxd)
    call.pxi            Backend.call: one entry from Python (accel/backend.pyx)
    entry_enum.pxi      the entries' numbers, wrappers.pxi check:/profile:/guard:'s wrapper of
                        each entry (accel/instrument.pyx)
    cpu_table.pxi       the CPU backend's adapters, and cpu_bf16_table.pxi, cpu_fp16_table.pxi
                        its narrow precisions' tables, cpu_bf16_grads_table.pxi the bf16 table's
                        entries with bf16 gradients (accel/cpu.pyx)
    library.pxi         the types of what a GPU build exports beside its entries (LIBRARY below;
                        accel/loader.pxd)
    backend.h           the C declarations of a GPU build's exports, which its host side
                        compiles against (accel/hip/gpt2.hip, accel/metal/host.c)

and, read at run time: the table's validation and order (accel/backend.pyx), the entries a GPU
library's loader looks up (accel_<backend>_<entry>, accel/loader.pyx), check:'s tolerances
(below), and the tests' call of every entry (tests/entries.py).

An argument is one line: `<C type> <name>` for a number, and for a pointer

    <C type> <name>[<elements>] <role> [~<reduction>] [causal] [init=<kind>]

    C type     float (float32 always), floatX (the table's precision: float32 in an fp32 table,
               bf16 in a bf16 one; C sees float*, whatever it points to), floatG (a parameter
               gradient: float32, or bf16 in a table made with bf16 gradients, GRAD_PRECISIONS;
               C sees float*), int, void

    elements   the length the entry reads or writes, an expression in the call's numbers (an
               input's may use letters the call lacks, V, which the tests supply)
    role       in (read), out (written), grad (a gradient the entry adds into), inout (read and
               written: AdamW's state), host (host memory: copies, a communicator's id; from
               Python a NumPy array)
    ~K         the output's reduction length (summands per element): check:'s error model
    causal     (..., T, T) scores: only t2 <= t is compared (the rest is never written)
    optional   may be NULL (a matmul without bias, the classifier's loss without targets, a
               weight gradient not wanted: a frozen weight, whose GEMM the entry then skips)
    init       how tests fill an input: normal (default), tokens (ids below V), targets (ids
               below V, about a quarter of them -1, at least one of each), positive, small
               (normal / 10), rope (a cos or sin table), forward (what the entry's forward
               writes from the inputs the two share: a backward's saved activations)

A target of -1 (llm.c's; transformers' -100 is mapped to it) marks a position that is not
scored: the loss entries write its loss as 0 and add nothing to its row of dlogits (the row's
log-sum-exp is still written).

Dimension letters: B batch, T time, C channels, OC output channels, NH heads, NKV key/value
heads, hs head size, H the FFN's hidden size, V vocabulary, Vp padded vocabulary (row stride of
logits and wte), N or n elements, P positions cached before T (the KV cache), R a LoRA
update's rank.
"""
import math
import re

# Groups, by what their kernels are.  A model family names the groups it runs on (its
# ENTRY_GROUPS); a backend says which it fills.  core is every backend's.
GROUPS = {
    "core": "memory, the loss's mean, AdamW and the gradient norm",
    "linear": "matmul and the residual add, which every transformer here runs on",
    "gpt2": "GPT-2's layers: token+position encoder, LayerNorm, GELU, attention with its "
            "(B,NH,T,T) buffers, softmax and cross-entropy",
    "llama": "the Llama family's layers: embedding, RMSNorm, RoPE, SwiGLU, grouped-query "
             "attention, the classifier without a probability buffer",
    "classifier": "the loss and its gradient from the logits and each row's log-sum-exp, no "
                  "probability buffer; Llama needs it, GPT-2 uses it when the backend has it",
    "flash": "attention that keeps each row's log-sum-exp instead of (B,NH,T,T) buffers; a "
             "model uses it when the backend has it",
    "mixed": "mixed precision (bf16, fp16): the parameters the kernels read, rounded from the "
             "float32 master weights, alone or in AdamW's pass",
    "no_master": "training without float32 master weights (llm.c's -w 0, at bf16): AdamW on the "
                 "bf16 parameters themselves, each read widened and its new value rounded "
                 "stochastically",
    "collectives": "many processes, one device each (llmc/distributed.py): a communicator set "
                   "up from rank 0's id, and the sums and gathers of float32 buffers on the "
                   "device (NCCL, RCCL); the CPU does without (MPI on its memory)",
    "fused": "a Llama layer's weighted blocks as one entry each, forward and backward: the Q, K, "
             "V projections of the normalised input, the SwiGLU FFN; a model runs them where "
             "the backend prefers them (runs_fused: the ANE, one program per block)",
    "cache": "generation's KV cache: attention of T new positions over the P keys and values "
             "cached before them and their own, each written into the cache; a model generates "
             "with it where the backend has it (llmc/model.pyx's KVCache)",
    "lora": "LoRA's low-rank update beside a frozen linear layer, forward and backward, and "
            "the dropout on its input: fine-tuning runs on it (llmc/adapter.py)",
}

# The precisions a table can run at: the element type its floatX arguments point to.  A backend
# makes one table per precision it has; a model runs at its backend's.  What stays float32 at
# every precision is declared `float`: normalisation statistics, losses, log-sum-exps, AdamW's
# master weights and moments, LoRA's updates and their gradients.
PRECISIONS = {"fp32": ("float32", 4), "bf16": ("bfloat16", 2), "fp16": ("float16", 2)}
# The parameter gradients' (floatG's) element type: float32 (the GEMMs add into them in float32),
# or, in a bf16 table made so (the CPU's), bf16 as llm.c keeps them: each kernel sums its own
# contribution in float32 and adds it into the bf16 gradient rounded once (kernels/bf16.pxd)
GRAD_PRECISIONS = {"fp32": ("float32", 4), "bf16": ("bfloat16", 2)}


class Arg:
    """One argument of an entry (after ctx)."""
    __slots__ = ("ctype", "name", "elements", "role", "reduction", "causal", "init", "optional")

    def __init__(self, line):
        m = re.fullmatch(r"(const )?(\w+)(\*?) (\w+)(?:\[([^\]]+)\])?((?: \S+)*)", line.strip())
        if not m:
            raise ValueError(f"accel/spec.py: cannot read the argument {line!r}")
        const, base, star, self.name, self.elements, rest = m.groups()
        self.ctype = f"{const or ''}{base}{star}"
        self.role, self.reduction, self.causal, self.init = None, "1", False, "normal"
        self.optional = False
        words = rest.split()
        if star:
            self.role = words.pop(0) if words else None
            if self.role not in ("in", "out", "grad", "inout", "host"):
                raise ValueError(f"accel/spec.py: {line!r} needs a role")
            for word in words:
                if word.startswith("~"):
                    self.reduction = word[1:]
                elif word == "causal":
                    self.causal = True
                elif word == "optional":
                    self.optional = True
                elif word.startswith("init="):
                    self.init = word[5:]
                else:
                    raise ValueError(f"accel/spec.py: {word!r} in {line!r}")
        elif words:
            raise ValueError(f"accel/spec.py: a number has no attributes: {line!r}")

    @property
    def pointer(self):
        return self.ctype.endswith("*")

    @property
    def base_type(self):
        return self.ctype.replace("const ", "").rstrip("*")

    @property
    def floatx(self):
        """A pointer to elements of the table's precision."""
        return self.base_type == "floatX"

    @property
    def floatg(self):
        """A pointer to parameter gradients (of the table's gradient precision)."""
        return self.base_type == "floatG"

    def dtype(self, precision="fp32", grad_precision="fp32"):
        """The dtype a pointer's elements have at a precision ("float32", "bfloat16", "int32";
        None for void)."""
        if self.floatx:
            return PRECISIONS[precision][0]
        if self.floatg:
            return GRAD_PRECISIONS[grad_precision][0]
        return {"float": "float32", "int": "int32"}.get(self.base_type)

    @property
    def c_type(self):
        """The C type of the table's field: floatX and floatG are float, whatever they point to."""
        return self.ctype.replace("floatX", "float").replace("floatG", "float")

    @property
    def written(self):
        """Written by the entry, so compared by check:."""
        return self.role in ("out", "grad", "inout")

    @property
    def declaration(self):
        return f"{self.c_type} {self.name}"


class Entry:
    """One function pointer of the table: `returns name(void* ctx, args...)`."""

    def __init__(self, name, group, args, returns="void", cpu=None, wrap=True, reduction="1",
                 bf16="adapter"):
        self.name, self.group, self.returns = name, group, returns
        self.args = [Arg(a) for a in args]
        self.cpu = cpu              # "kernels.<module>": its function of this name, with the
        #                             same arguments; "kernels.<module>: call(...)": that call;
        #                             None: written by hand in accel/cpu.pyx
        self.wrap = wrap            # check:/profile:/guard: wrap it from the spec (memory: by hand)
        self.bf16 = bf16 if any(a.floatx for a in self.args) else "same"
        #                             the CPU's bf16 table (accel/codegen.py's cpu_bf16_pxi):
        #                             "kernel", cpu's kernel is written for floatX; "adapter",
        #                             the fp32 entry on widened copies; None, by hand in
        #                             accel/cpu.pyx; "same" (no floatX argument), the fp32 entry
        self.reduction = reduction  # a returned number's reduction length
        if group not in GROUPS:
            raise ValueError(f"accel/spec.py: {name}'s group {group!r} is not in GROUPS")

    @property
    def outputs(self):
        return [a for a in self.args if a.pointer and a.written]

    @property
    def declaration(self):
        """The C declaration of the table's field."""
        args = ", ".join(["void* ctx"] + [a.declaration for a in self.args])
        return f"{self.returns} (*{self.name})({args}) noexcept nogil"


def E(name, group, *args, **kw):
    return Entry(name, group, args, **kw)


ENTRIES = [
    # --- core: memory -------------------------------------------------------------------
    E("alloc", "core", "size_t nbytes", returns="void*", cpu=None, wrap=False),  # zeroed; NULL: no memory
    E("free", "core", "void* ptr[nbytes] in", "size_t nbytes", cpu=None, wrap=False),
    E("zero", "core", "void* ptr[nbytes] out", "size_t nbytes", cpu=None, wrap=False),
    E("copy_to_backend", "core", "void* dst[nbytes] out", "const void* host_src[nbytes] host",
      "size_t nbytes", cpu=None, wrap=False),
    E("copy_to_host", "core", "void* host_dst[nbytes] host", "const void* src[nbytes] in",
      "size_t nbytes", cpu=None, wrap=False),
    E("synchronize", "core", cpu=None, wrap=False),
    E("last_error", "core", returns="const char*", cpu=None, wrap=False),   # NULL: all went well
    E("mark", "core", "int step", "int layer", cpu=None, wrap=False),      # where the model is (-1: no layer)
    # --- core: the loss's bookkeeping and the optimizer -------------------------------------
    E("fill", "core", "float* out[n] out", "float value", "Py_ssize_t n", cpu=None),
    E("mean", "core", "const float* x[n] in", "Py_ssize_t n", returns="float", cpu=None,
      reduction="n"),                                                        # to the host
    E("adamw_update", "core", "float* params[n] inout ~2", "float* m[n] inout ~2",
      "float* v[n] inout ~2 init=positive", "const float* grads[n] in", "Py_ssize_t n",
      "float lr", "float beta1", "float beta2", "float eps", "float weight_decay",
      "float grad_scale", "int t", cpu="kernels.adamw"),
    E("global_norm_squared", "core", "const floatG* x[n] in", "Py_ssize_t n", returns="double",
      cpu="kernels.adamw", reduction="n"),                                   # to the host
    # --- linear -------------------------------------------------------------------------
    E("matmul_forward", "linear", "floatX* out[B*T*OC] out ~C", "const floatX* inp[B*T*C] in",
      "const floatX* weight[OC*C] in", "const floatX* bias[OC] in optional", "int B", "int T",
      "int C", "int OC", cpu="kernels.matmul", bf16=None),
    E("matmul_backward", "linear", "floatX* dinp[B*T*C] grad ~OC",
      "floatG* dweight[OC*C] grad ~B*T optional", "floatG* dbias[OC] grad ~B*T optional",
      "const floatX* dout[B*T*OC] in", "const floatX* inp[B*T*C] in",
      "const floatX* weight[OC*C] in", "int B", "int T", "int C", "int OC",
      cpu="kernels.matmul", bf16=None),
    E("residual_forward", "linear", "floatX* out[N] out", "const floatX* inp1[N] in",
      "const floatX* inp2[N] in", "Py_ssize_t N", cpu="kernels.residual", bf16="kernel"),
    E("residual_backward", "linear", "floatX* dinp1[N] grad", "floatX* dinp2[N] grad",
      "const floatX* dout[N] in", "Py_ssize_t N", cpu="kernels.residual", bf16="kernel"),
    # --- gpt2 ---------------------------------------------------------------------------
    E("encoder_forward", "gpt2", "floatX* out[B*T*C] out", "const int* inp[B*T] in init=tokens",
      "const floatX* wte[V*C] in", "const floatX* wpe[T*C] in", "int B", "int T", "int C",
      cpu="kernels.encoder", bf16="kernel"),
    E("encoder_backward", "gpt2", "floatG* dwte[Vp*C] grad ~B*T", "floatG* dwpe[T*C] grad ~B",
      "const floatX* dout[B*T*C] in", "const int* inp[B*T] in init=tokens", "int B", "int T",
      "int C", "int Vp",
      cpu="kernels.encoder: encoder_backward(dwte, dwpe, dout, inp, B, T, C)", bf16="kernel"),
    E("layernorm_forward", "gpt2", "floatX* out[B*T*C] out ~C", "float* mean[B*T] out ~C",
      "float* rstd[B*T] out ~C", "const floatX* inp[B*T*C] in", "const floatX* weight[C] in",
      "const floatX* bias[C] in", "int B", "int T", "int C", cpu="kernels.layernorm", bf16="kernel"),
    E("layernorm_backward", "gpt2", "floatX* dinp[B*T*C] grad ~C", "floatG* dweight[C] grad ~B*T",
      "floatG* dbias[C] grad ~B*T", "const floatX* dout[B*T*C] in", "const floatX* inp[B*T*C] in",
      "const floatX* weight[C] in", "const float* mean[B*T] in",
      "const float* rstd[B*T] in init=small", "int B", "int T", "int C",
      cpu="kernels.layernorm", bf16="kernel"),
    E("attention_forward", "gpt2", "floatX* out[B*T*C] out ~T", "floatX* preatt[B*NH*T*T] out ~C/NH causal",
      "floatX* att[B*NH*T*T] out ~T causal", "const floatX* inp[B*T*3*C] in", "int B", "int T",
      "int C", "int NH", cpu="kernels.attention"),
    E("attention_backward", "gpt2", "floatX* dinp[B*T*3*C] grad ~T", "floatX* dpreatt[B*NH*T*T] grad ~T causal",
      "floatX* datt[B*NH*T*T] grad ~C/NH causal", "const floatX* dout[B*T*C] in",
      "const floatX* inp[B*T*3*C] in", "const floatX* att[B*NH*T*T] in init=forward", "int B",
      "int T", "int C", "int NH", cpu="kernels.attention"),
    E("gelu_forward", "gpt2", "floatX* out[N] out", "const floatX* inp[N] in", "Py_ssize_t N",
      cpu="kernels.gelu", bf16="kernel"),
    E("gelu_backward", "gpt2", "floatX* dinp[N] grad", "const floatX* inp[N] in",
      "const floatX* dout[N] in", "Py_ssize_t N", cpu="kernels.gelu", bf16="kernel"),
    E("softmax_forward", "gpt2", "float* probs[B*T*Vp] out ~V", "const floatX* logits[B*T*Vp] in",
      "int B", "int T", "int V", "int Vp", cpu="kernels.crossentropy", bf16="kernel"),
    E("crossentropy_forward", "gpt2", "float* losses[B*T] out", "const float* probs[B*T*Vp] in init=positive",
      "const int* targets[B*T] in init=targets", "int B", "int T", "int Vp",
      cpu="kernels.crossentropy"),
    E("crossentropy_softmax_backward", "gpt2", "floatX* dlogits[B*T*Vp] grad",
      "const float* dlosses[B*T] in", "const float* probs[B*T*Vp] in init=positive",
      "const int* targets[B*T] in init=targets", "int B", "int T", "int V", "int Vp",
      cpu="kernels.crossentropy", bf16="kernel"),
    # --- llama (letters as above, plus NKV key/value heads and hs the head size) -------------
    E("embedding_forward", "llama", "floatX* out[B*T*C] out", "const int* inp[B*T] in init=tokens",
      "const floatX* wte[V*C] in", "int B", "int T", "int C", cpu="kernels.embedding", bf16="kernel"),
    E("embedding_backward", "llama", "floatG* dwte[V*C] grad ~B*T", "const floatX* dout[B*T*C] in",
      "const int* inp[B*T] in init=tokens", "int B", "int T", "int C", "int V",
      cpu="kernels.embedding: embedding_backward(dwte, dout, inp, B, T, C)", bf16="kernel"),
    E("rmsnorm_forward", "llama", "floatX* out[B*T*C] out ~C", "float* rstd[B*T] out ~C",
      "const floatX* inp[B*T*C] in", "const floatX* weight[C] in", "float eps", "int B", "int T",
      "int C", cpu="kernels.rmsnorm", bf16="kernel"),
    E("rmsnorm_backward", "llama", "floatX* dinp[B*T*C] grad ~C",
      "floatG* dweight[C] grad ~B*T optional", "const floatX* dout[B*T*C] in",
      "const floatX* inp[B*T*C] in", "const floatX* weight[C] in",
      "const float* rstd[B*T] in init=small", "int B", "int T", "int C", cpu="kernels.rmsnorm", bf16="kernel"),
    E("rope_forward", "llama", "floatX* out[B*T*NH*hs] out ~2", "const floatX* inp[B*T*NH*hs] in",
      "const float* freqs_cos[T*hs/2] in init=rope", "const float* freqs_sin[T*hs/2] in init=rope",
      "int B", "int T", "int NH", "int hs", cpu="kernels.rope", bf16="kernel"),
    E("rope_backward", "llama", "floatX* dinp[B*T*NH*hs] grad ~2", "const floatX* dout[B*T*NH*hs] in",
      "const float* freqs_cos[T*hs/2] in init=rope", "const float* freqs_sin[T*hs/2] in init=rope",
      "int B", "int T", "int NH", "int hs", cpu="kernels.rope", bf16="kernel"),
    E("swiglu_forward", "llama", "floatX* out[N] out", "const floatX* a[N] in",
      "const floatX* b[N] in", "Py_ssize_t N", cpu="kernels.swiglu", bf16="kernel"),
    E("swiglu_backward", "llama", "floatX* da[N] grad", "floatX* db[N] grad",
      "const floatX* dout[N] in", "const floatX* a[N] in", "const floatX* b[N] in",
      "Py_ssize_t N", cpu="kernels.swiglu", bf16="kernel"),
    E("attention_gqa_forward", "llama", "floatX* out[B*T*NH*hs] out ~T",
      "floatX* att[B*NH*T*T] out ~hs causal", "const floatX* q[B*T*NH*hs] in",
      "const floatX* k[B*T*NKV*hs] in", "const floatX* v[B*T*NKV*hs] in", "int B", "int T",
      "int NH", "int NKV", "int hs", cpu="kernels.attention_gqa"),
    E("attention_gqa_backward", "llama", "floatX* dq[B*T*NH*hs] grad ~T",
      "floatX* dk[B*T*NKV*hs] grad ~T*NH/NKV", "floatX* dv[B*T*NKV*hs] grad ~T*NH/NKV",
      "const floatX* dout[B*T*NH*hs] in", "const floatX* q[B*T*NH*hs] in",
      "const floatX* k[B*T*NKV*hs] in", "const floatX* v[B*T*NKV*hs] in",
      "const floatX* att[B*NH*T*T] in init=forward", "int B", "int T", "int NH", "int NKV",
      "int hs", cpu=None),   # reports running out of scratch memory through last_error
    # --- classifier (logits rows of Vp, the first V of them the vocabulary) -------------------
    E("classifier_forward", "classifier", "float* losses[B*T] out ~V optional",
      "float* logsum[B*T] out ~V", "const floatX* logits[B*T*Vp] in",
      "const int* targets[B*T] in init=targets optional", "int B", "int T", "int V", "int Vp",
      cpu="kernels.classifier", bf16="kernel"),
    E("classifier_backward", "classifier", "floatX* dlogits[B*T*Vp] grad",
      "const float* dlosses[B*T] in", "const floatX* logits[B*T*Vp] in",
      "const float* logsum[B*T] in", "const int* targets[B*T] in init=targets", "int B",
      "int T", "int V", "int Vp", cpu="kernels.classifier", bf16="kernel"),
    # --- flash --------------------------------------------------------------------------
    # (at bf16 the CPU's table runs kernels/flash_attention.pyx's bf16 kernel, set in accel/cpu.pyx;
    # the adapter written from here, the fp32 kernel on widened copies, is check:'s oracle)
    E("flash_attention_forward", "flash", "floatX* out[B*T*C] out ~T", "float* lse[B*NH*T] out ~T",
      "const floatX* inp[B*T*3*C] in", "int B", "int T", "int C", "int NH",
      cpu="kernels.flash_attention"),
    E("flash_attention_backward", "flash", "floatX* dinp[B*T*3*C] grad ~T", "const floatX* dout[B*T*C] in",
      "const floatX* inp[B*T*3*C] in", "const floatX* out[B*T*C] in init=forward",
      "const float* lse[B*NH*T] in init=forward",
      "int B", "int T", "int C", "int NH", cpu="kernels.flash_attention"),
    # Llama's form: separate q, k, v, grouped-query (query head h reads key/value head
    # h / (NH/NKV)); GPT-2's is this with NKV = NH and q, k, v side by side in inp
    E("flash_attention_gqa_forward", "flash", "floatX* out[B*T*NH*hs] out ~T",
      "float* lse[B*NH*T] out ~T", "const floatX* q[B*T*NH*hs] in",
      "const floatX* k[B*T*NKV*hs] in", "const floatX* v[B*T*NKV*hs] in", "int B", "int T",
      "int NH", "int NKV", "int hs", cpu="kernels.flash_attention"),
    E("flash_attention_gqa_backward", "flash", "floatX* dq[B*T*NH*hs] grad ~T",
      "floatX* dk[B*T*NKV*hs] grad ~T*NH/NKV", "floatX* dv[B*T*NKV*hs] grad ~T*NH/NKV",
      "const floatX* dout[B*T*NH*hs] in", "const floatX* q[B*T*NH*hs] in",
      "const floatX* k[B*T*NKV*hs] in", "const floatX* v[B*T*NKV*hs] in",
      "const floatX* out[B*T*NH*hs] in init=forward", "const float* lse[B*NH*T] in init=forward",
      "int B", "int T", "int NH", "int NKV", "int hs", cpu="kernels.flash_attention"),
    # --- mixed: at bf16 a seed >= 0 rounds stochastically (kernels/bf16.pxd), -1 to nearest;
    # at fp16 always to nearest even (the master weights keep what rounding drops) -------------
    E("narrow_params", "mixed", "floatX* params[n] out", "const float* master[n] in",
      "Py_ssize_t n", "Py_ssize_t first", "int seed", cpu=None, bf16=None),
    # AdamW on the master weights, each new one also rounded into params as narrow_params does
    # with seed t: one pass over memory (llm.c's update with master weights)
    E("adamw_update_rounded", "mixed", "floatX* params[n] out", "float* master[n] inout ~2",
      "float* m[n] inout ~2", "float* v[n] inout ~2 init=positive", "const floatG* grads[n] in",
      "Py_ssize_t n", "float lr", "float beta1", "float beta2", "float eps",
      "float weight_decay", "float grad_scale", "int t", "Py_ssize_t first", cpu=None,
      bf16=None),
    # --- no_master: AdamW on params (bf16) alone, each read widened, its new value rounded
    # stochastically as adamw_update_rounded rounds (its t the seed), with no master to keep
    # what the rounding drops (the stochastic rounding keeps it on average) ------------------
    E("adamw_update_narrow", "no_master", "floatX* params[n] inout ~2", "float* m[n] inout ~2",
      "float* v[n] inout ~2 init=positive", "const floatG* grads[n] in", "Py_ssize_t n",
      "float lr", "float beta1", "float beta2", "float eps", "float weight_decay",
      "float grad_scale", "int t", "Py_ssize_t first", cpu=None, bf16=None),
    # --- collectives (every process calls each, in the same order; in place, float32) ---------
    # Rank r's span of n elements is llmc/distributed.py's balanced one: n // N elements, one
    # more for the first n % N ranks, back to back.  The sums add the ranks' values in rank
    # order where the library lets the order be chosen (the emulator); NCCL's is its own.
    # the communicator's id (NCCL's 128 bytes), made by rank 0 and sent to the others (MPI)
    E("comm_unique_id", "collectives", "void* unique_id[128] host", cpu=None),
    # joins this process to the communicator of nranks, as rank; each must call it
    E("comm_init", "collectives", "const void* unique_id[128] host", "int rank", "int nranks",
      cpu=None),
    # x: the sum over the ranks of their x, on every rank
    E("all_reduce_sum", "collectives", "float* x[n] inout", "Py_ssize_t n", cpu=None),
    # x's span of this rank: the sum over the ranks of their x's span; the rest as it was
    E("reduce_scatter_sum", "collectives", "float* x[n] inout", "Py_ssize_t n", cpu=None),
    # each span of x: its rank's, on every rank
    E("all_gather", "collectives", "float* x[n] inout", "Py_ssize_t n", cpu=None),
    # --- fused (QD = NH*hs, KVD = NKV*hs, H the FFN's hidden size; the CPU's are the unfused
    # entries in the model's order, accel/cpu.pyx, check:'s oracle, at bf16 on float32 copies;
    # the weights small, as a layer's are: unit ones overflow an fp16 FFN at d12's widths) ----
    E("qkv_forward", "fused", "floatX* q[B*T*NH*hs] out ~C", "floatX* k[B*T*NKV*hs] out ~C",
      "floatX* v[B*T*NKV*hs] out ~C", "const floatX* inp[B*T*C] in",
      "const floatX* wq[NH*hs*C] in init=small", "const floatX* wk[NKV*hs*C] in init=small",
      "const floatX* wv[NKV*hs*C] in init=small", "int B", "int T", "int C", "int NH",
      "int NKV", "int hs", cpu=None),
    E("qkv_backward", "fused", "floatX* dinp[B*T*C] grad ~NH*hs+2*NKV*hs",
      "floatG* dwq[NH*hs*C] grad ~B*T", "floatG* dwk[NKV*hs*C] grad ~B*T",
      "floatG* dwv[NKV*hs*C] grad ~B*T", "const floatX* dq[B*T*NH*hs] in",
      "const floatX* dk[B*T*NKV*hs] in", "const floatX* dv[B*T*NKV*hs] in",
      "const floatX* inp[B*T*C] in", "const floatX* wq[NH*hs*C] in init=small",
      "const floatX* wk[NKV*hs*C] in init=small", "const floatX* wv[NKV*hs*C] in init=small",
      "int B", "int T", "int C", "int NH", "int NKV", "int hs", cpu=None),
    # out = w2 hgated, h1 = w1 inp, h3 = w3 inp, hgated = silu(h1) * h3
    E("ffn_forward", "fused", "floatX* out[B*T*C] out ~H", "floatX* h1[B*T*H] out ~C",
      "floatX* h3[B*T*H] out ~C", "floatX* hgated[B*T*H] out ~C", "const floatX* inp[B*T*C] in",
      "const floatX* w1[H*C] in init=small", "const floatX* w3[H*C] in init=small",
      "const floatX* w2[C*H] in init=small", "int B", "int T", "int C", "int H", cpu=None),
    # dh1, dh3, dhgated: written (the block's own intermediate gradients), the rest added into
    E("ffn_backward", "fused", "floatX* dinp[B*T*C] grad ~2*H", "floatG* dw1[H*C] grad ~B*T",
      "floatG* dw3[H*C] grad ~B*T", "floatG* dw2[C*H] grad ~B*T", "floatX* dh1[B*T*H] out ~C",
      "floatX* dh3[B*T*H] out ~C", "floatX* dhgated[B*T*H] out ~C",
      "const floatX* dout[B*T*C] in", "const floatX* inp[B*T*C] in",
      "const floatX* h1[B*T*H] in init=forward", "const floatX* h3[B*T*H] in init=forward",
      "const floatX* hgated[B*T*H] in init=forward", "const floatX* w1[H*C] in init=small",
      "const floatX* w3[H*C] in init=small", "const floatX* w2[C*H] in init=small", "int B",
      "int T", "int C", "int H", cpu=None),
    # --- cache: one sequence (B = 1) of T new positions after P cached ones; query t (position
    # P+t) attends over keys 0 .. P+t; att (NH,T,P+T) is the probabilities' scratch --------
    E("attention_cached_forward", "cache", "floatX* out[T*C] out ~P+T",
      "floatX* att[NH*T*(P+T)] out ~C/NH", "floatX* k_cache[(P+T)*C] inout",
      "floatX* v_cache[(P+T)*C] inout", "const floatX* inp[T*3*C] in", "int T", "int P",
      "int C", "int NH", cpu="kernels.attention_cached"),
    E("attention_gqa_cached_forward", "cache", "floatX* out[T*NH*hs] out ~P+T",
      "floatX* att[NH*T*(P+T)] out ~hs", "floatX* k_cache[(P+T)*NKV*hs] inout",
      "floatX* v_cache[(P+T)*NKV*hs] inout", "const floatX* q[T*NH*hs] in",
      "const floatX* k[T*NKV*hs] in", "const floatX* v[T*NKV*hs] in", "int T", "int P",
      "int NH", "int NKV", "int hs", cpu="kernels.attention_cached"),
    # --- lora: beside a frozen linear layer (inp (B,T,C), its output (B,T,OC)) a rank-R update,
    # out += scale * hidden @ Bm^T with hidden = inp @ A^T kept for backward; A (R,C) and
    # Bm (OC,R) float32 at every precision, and their gradients -------------------------------
    E("lora_forward", "lora", "floatX* out[B*T*OC] grad ~R", "float* hidden[B*T*R] out ~C",
      "const floatX* inp[B*T*C] in", "const float* A[R*C] in init=small",
      "const float* Bm[OC*R] in init=small", "float scale", "int B", "int T", "int C", "int OC",
      "int R", cpu="kernels.lora"),
    # dhidden (B,T,R) written (scratch), the rest added into
    E("lora_backward", "lora", "floatX* dinp[B*T*C] grad ~R", "float* dA[R*C] grad ~B*T",
      "float* dB[OC*R] grad ~B*T", "float* dhidden[B*T*R] out ~OC",
      "const floatX* dout[B*T*OC] in", "const floatX* inp[B*T*C] in",
      "const float* hidden[B*T*R] in init=forward", "const float* A[R*C] in init=small",
      "const float* Bm[OC*R] in init=small", "float scale", "int B", "int T", "int C",
      "int OC", "int R", cpu="kernels.lora"),
    # LoRA's dropout at training (PEFT's lora_dropout): inp of lora_forward, a fraction p
    # (0 <= p < 1) dropped and the rest scaled by 1/(1-p); the mask of element i a hash of (i,
    # seed, stream) (kernels/dropout.pxd), so that backward draws the same again.  Backward adds
    # dout through it into dinp
    E("dropout_forward", "lora", "floatX* out[N] out", "const floatX* inp[N] in", "float p",
      "int seed", "int stream", "Py_ssize_t N", cpu="kernels.dropout", bf16="kernel"),
    E("dropout_backward", "lora", "floatX* dinp[N] grad", "const floatX* dout[N] in", "float p",
      "int seed", "int stream", "Py_ssize_t N", cpu="kernels.dropout", bf16="kernel"),
]

# What a GPU build exports beside its entries, as accel_<backend>_<name>: {name: (returns, its
# arguments in C)}.  The loader looks them up (accel/loader.pyx, the backends' modules); create
# is not here, its arguments being each backend's own (accel/hip/device.pyx, accel/metal/metal.pyx).
LIBRARY = {
    "destroy": ("void", ("void* ctx",)),             # the context and all it holds, released
    "device_name": ("const char*", ("void* ctx",)),  # the device's name, for messages
    "precision": ("const char*", ()),                # what floatX is in the build: "fp32", "bf16", ...
}

BY_NAME = {e.name: e for e in ENTRIES}
# the table's order: entries grouped as GROUPS lists them (the struct's fields)
ENTRY_GROUPS = {g: tuple(e.name for e in ENTRIES if e.group == g) for g in GROUPS}
ORDER = tuple(name for names in ENTRY_GROUPS.values() for name in names)
assert [e.name for e in ENTRIES] == list(ORDER), "accel/spec.py: keep ENTRIES in GROUPS' order"


def entries_of(groups):
    """The names of the entries of these groups, in the table's order."""
    return tuple(name for name in ORDER if BY_NAME[name].group in groups)


# --- check:'s error model ------------------------------------------------------------------
#
# A backend and the CPU oracle add the same float32 numbers in different orders.  Summing K
# terms in float32 errs by at most about K*u times the sum of their magnitudes (u = 2^-24, the
# unit roundoff); in practice the errors of a random order add like a random walk, sqrt(K)*u,
# and the sum of magnitudes is near the largest result.  check: compares each output's largest
# error with its largest oracle magnitude, so an output of reduction length K is allowed
#
#     CHECK_UNITS * u * (1 + sqrt(K))   relative to max |oracle|
#
# A kernel that is wrong (a missing barrier, a wrong index, a dropped term, a store rounded to
# bf16) errs by far more: a term of its own size, or 2^-9 of the output at the least.
# CHECK_UNITS: the worst errors of hip-emu and metal-emu at d12's widths, under every schedule
# and warp size, came to 2.2 units (GELU's backward, K=1; matmul's, K=768..3072, to 0.7); 16
# leaves a factor of 7 above them and 100 below a bf16 store (tests/test_check_tolerance.py).
UNIT_ROUNDOFF = 2.0 ** -24
CHECK_UNITS = 16.0


def tolerance(reduction_length):
    """check:'s relative tolerance for an output whose elements each sum this many terms."""
    return CHECK_UNITS * UNIT_ROUNDOFF * (1.0 + math.sqrt(max(reduction_length, 1)))


def evaluate(expression, dims):
    """The value of a shape expression in the dimension letters, e.g. ("B*T*C", {...})."""
    return int(eval(expression, {"__builtins__": {}}, dict(dims)))
