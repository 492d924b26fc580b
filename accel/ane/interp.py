"""
A NumPy interpreter for the MIL programs of accel/ane/mil.py: it runs the very Program object
the Builder made, op by op, in the order of its main block, with fp16 storage (every op reads
fp16 tensors, computes in float32 - as the ANE accumulates wider than it stores - and rounds its
result to fp16).  run(..., storage=np.float32) keeps every result in float32 instead: the data
flow of a program without the ANE's rounding (accel/ane/runtime.py's MockRuntime).

Elementwise binary ops use coremltools' own NumPy operator (op.get_operator()); the others that
our programs use are written here (coremltools infers values only for constant inputs).  Every
result is checked against the shape and type the Builder inferred for it, and slice_by_index
raises on a slice that leaves its tensor (the Builder accepts one, and NumPy would clamp it
silently).  An op this file does not know is refused by name.
"""
import numpy as np

FP16 = np.float16


class InterpreterError(ValueError):
    pass


class Values(dict):
    """The values of a program's variables by name, stored at one precision."""

    def __init__(self, storage):
        super().__init__()
        self.storage = np.dtype(storage)

    def store(self, x):
        """x computed in float32, rounded to the storage precision."""
        return np.asarray(x, np.float32).astype(self.storage)


def run(program, storage=FP16, **inputs):
    """Run program's main function on inputs {name: array} -> {output name: array}, every value
    stored at `storage` (fp16, as the ANE; float32 for the data flow alone)."""
    function = program.functions["main"]
    env = Values(storage)
    for name, var in function.inputs.items():
        if name not in inputs:
            raise InterpreterError(f"missing input {name!r} (the program takes "
                                   f"{', '.join(function.inputs)})")
        value = np.asarray(inputs[name])
        if value.shape != tuple(var.shape):
            raise InterpreterError(f"input {name!r} has shape {value.shape}, the program wants "
                                   f"{tuple(var.shape)}")
        env[name] = value.astype(env.storage)
    extra = set(inputs) - set(function.inputs)
    if extra:
        raise InterpreterError(f"unknown inputs {sorted(extra)}")
    for op in function.operations:
        results = evaluate(op, env)
        for var, value in zip(op.outputs, results):
            check_type(op, var, value, env.storage)
            env[var.name] = value
    return {var.name: env[var.name] for var in function.outputs}


def check_type(op, var, value, storage):
    want = tuple(var.shape) if hasattr(var, "shape") and var.shape is not None else ()
    if np.shape(value) != want:
        raise InterpreterError(f"{op.op_type} {op.name!r} gave shape {np.shape(value)}, the "
                               f"Builder inferred {want}")
    if np.asarray(value).dtype.kind == "f" and np.asarray(value).dtype != storage:
        raise InterpreterError(f"{op.op_type} {op.name!r} gave {np.asarray(value).dtype}, not "
                               f"{storage}")


def value_of(var, env):
    if var.name in env:
        return env[var.name]
    if var.val is None:
        raise InterpreterError(f"{var.name!r} has no value yet (ops out of order?)")
    value = np.asarray(var.val)
    return value.astype(env.storage) if value.dtype.kind == "f" else value


def param(op, name, env, default=None):
    var = op.inputs.get(name)
    return default if var is None else value_of(var, env)


def evaluate(op, env):
    """The op's outputs (a list) from its inputs' values in env."""
    kind = op.op_type
    if kind == "const":
        return [value_of(op.outputs[0], env)]
    if kind in ELEMENTWISE_BINARY:
        x = np.asarray(param(op, "x", env), np.float32)
        y = np.asarray(param(op, "y", env), np.float32)
        return [env.store(op.get_operator()(x, y))]
    if kind not in OPS:
        raise InterpreterError(f"op {kind} ({op.name!r}) is not supported by the interpreter")
    return [OPS[kind](op, env)]


ELEMENTWISE_BINARY = {"add", "sub", "mul", "real_div", "maximum", "minimum"}


def op_identity(op, env):
    return param(op, "x", env)


def op_cast(op, env):
    if op.inputs["dtype"].val != "fp16":
        raise InterpreterError(f"cast {op.name!r} to {op.inputs['dtype'].val}: only fp16 here")
    return env.store(np.asarray(param(op, "x", env), np.float32).astype(FP16))


def op_sigmoid(op, env):
    x = np.asarray(param(op, "x", env), np.float32)
    return env.store(1.0 / (1.0 + np.exp(-x)))


def op_silu(op, env):
    x = np.asarray(param(op, "x", env), np.float32)
    return env.store(x / (1.0 + np.exp(-x)))


def op_softmax(op, env):
    x = np.asarray(param(op, "x", env), np.float32)
    axis = int(param(op, "axis", env, -1))
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return env.store(e / e.sum(axis=axis, keepdims=True))


def op_reduce_sum(op, env):
    x = np.asarray(param(op, "x", env), np.float32)
    axes = param(op, "axes", env)
    axes = None if axes is None else tuple(int(a) for a in np.atleast_1d(axes))
    return env.store(x.sum(axis=axes, keepdims=bool(param(op, "keep_dims", env, False))))


def op_reshape(op, env):
    return np.reshape(param(op, "x", env), [int(s) for s in param(op, "shape", env)])


def op_transpose(op, env):
    return np.ascontiguousarray(np.transpose(param(op, "x", env),
                                             [int(p) for p in param(op, "perm", env)]))


def op_matmul(op, env):
    x = np.asarray(param(op, "x", env), np.float32)
    y = np.asarray(param(op, "y", env), np.float32)
    if bool(param(op, "transpose_x", env, False)):
        x = np.swapaxes(x, -1, -2)
    if bool(param(op, "transpose_y", env, False)):
        y = np.swapaxes(y, -1, -2)
    return env.store(np.matmul(x, y))


def op_conv(op, env):
    """1x1 convolutions only (the ANE's linear layer): stride 1, no padding, one group."""
    x = np.asarray(param(op, "x", env), np.float32)
    w = np.asarray(param(op, "weight", env), np.float32)
    strides = param(op, "strides", env, np.ones(2))
    dilations = param(op, "dilations", env, np.ones(2))
    pad = param(op, "pad", env, np.zeros(4))
    if (x.ndim != 4 or w.shape[2:] != (1, 1) or int(param(op, "groups", env, 1)) != 1
            or np.any(np.asarray(strides) != 1) or np.any(np.asarray(dilations) != 1)
            or np.any(np.asarray(pad) != 0)):
        raise InterpreterError(f"conv {op.name!r}: only 1x1, stride 1, unpadded, one group")
    out = np.einsum("oc,bchw->bohw", w[:, :, 0, 0], x)
    bias = param(op, "bias", env)
    if bias is not None:
        out = out + np.asarray(bias, np.float32)[None, :, None, None]
    return env.store(out)


def op_concat(op, env):
    if bool(param(op, "interleave", env, False)):
        raise InterpreterError(f"concat {op.name!r}: interleave is not supported")
    return np.concatenate([value_of(v, env) for v in op.inputs["values"]],
                          axis=int(param(op, "axis", env)))


def op_slice_by_index(op, env):
    """x[begin:end:stride] per axis, refusing any bound outside the tensor."""
    x = param(op, "x", env)
    rank = x.ndim
    begin = [int(b) for b in param(op, "begin", env)]
    end = [int(e) for e in param(op, "end", env)]
    stride = [int(s) for s in param(op, "stride", env, np.ones(rank, int))]
    begin_mask = list(param(op, "begin_mask", env, np.zeros(rank, bool)))
    end_mask = list(param(op, "end_mask", env, np.zeros(rank, bool)))
    squeeze_mask = list(param(op, "squeeze_mask", env, np.zeros(rank, bool)))
    index = []
    for axis in range(rank):
        n = x.shape[axis]
        if stride[axis] != 1:
            raise InterpreterError(f"slice_by_index {op.name!r}: stride {stride[axis]} (only 1)")
        b = 0 if begin_mask[axis] else begin[axis] + (n if begin[axis] < 0 else 0)
        e = n if end_mask[axis] else end[axis] + (n if end[axis] < 0 else 0)
        if squeeze_mask[axis]:
            e = b + 1
        if not 0 <= b < e <= n:
            raise InterpreterError(f"slice_by_index {op.name!r}: axis {axis} slice [{b}:{e}] "
                                   f"is outside its size {n}")
        index.append(b if squeeze_mask[axis] else slice(b, e))
    return np.ascontiguousarray(x[tuple(index)])


OPS = {
    "identity": op_identity, "cast": op_cast, "sigmoid": op_sigmoid, "silu": op_silu,
    "softmax": op_softmax, "reduce_sum": op_reduce_sum, "reshape": op_reshape,
    "transpose": op_transpose, "matmul": op_matmul, "conv": op_conv,
    "slice_by_index": op_slice_by_index, "concat": op_concat,
}
