"""
MIL text from a built Program: what the private ANE path compiles (the anchor writes this text by
hand; we print it from the Builder's checked program instead), e.g.

  program(1.0)
  [buildInfo = dict<string, string>({{"coremltools-version", "9.0"}})]
  {
      func main<ios17>(tensor<fp16, [1, 4, 1, 5]> x) {
          tensor<fp16, [3, 4, 1, 1]> w = const()[name = string("w"), val = tensor<fp16, [3, 4, 1, 1]>(BLOBFILE(path = string("@model_path/weights/weight.bin"), offset = uint64(64)))];
          tensor<fp16, [1, 3, 1, 5]> out = conv(weight = w, x = x)[name = string("out")];
      } -> (out);
  }

Constant fp16/fp32 tensors of more than INLINE_LIMIT elements (weights, the causal mask) go to
the weight blob (accel/ane/blob.py) and are referenced as BLOBFILE(path, offset); everything else
is written inline.  Arguments are printed sorted by name; fp values as C99 hex floats (exact).
"""
import argparse
import os

import numpy as np

from accel.ane import blob
from accel.ane.mil import ct, types   # coremltools, imported quietly there

INLINE_LIMIT = 10          # coremltools keeps consts of up to 10 elements in the program too
WEIGHTS_PATH = "@model_path/weights/weight.bin"
PROGRAM_VERSION = {"ios15": "1.0", "ios16": "1.0", "ios17": "1.0", "ios18": "1.3"}


def type_text(var):
    kind = types.builtin_to_string(var.dtype)
    if types.is_tensor(var.sym_type):
        return f"tensor<{kind}, [{', '.join(str(int(s)) for s in var.shape)}]>"
    return kind


def scalar_text(kind, value):
    if kind == "bool":
        return "true" if value else "false"
    if kind == "string":
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if kind.startswith("fp"):
        return hex_float(float(value))
    return str(int(value))


def hex_float(x):
    """A C99 hex float, shortest: 0x1p-1, -0x1.8p+1, 0x0p+0."""
    if x == 0:
        return "-0x0p+0" if np.signbit(x) else "0x0p+0"
    if not np.isfinite(x):
        return ("-" if x < 0 else "") + ("inf" if np.isinf(x) else "nan")
    mantissa, exponent = x.hex().split("p")
    whole, _, fraction = mantissa.partition(".")
    fraction = fraction.rstrip("0")
    return f"{whole}{'.' + fraction if fraction else ''}p{exponent}"


def literal(var, value):
    """The inline value of a const var: fp16(0x1p-1), tensor<int32, [2]>([1, 1]), ..."""
    kind = types.builtin_to_string(var.dtype)
    if types.is_tensor(var.sym_type):
        flat = np.asarray(value).ravel()
        return f"{type_text(var)}([{', '.join(scalar_text(kind, v) for v in flat)}])"
    return f"{kind}({scalar_text(kind, value)})"


def argument(value):
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(v.name for v in value) + ")"
    return value.name


def to_text(program, weights_path=WEIGHTS_PATH):
    """(MIL text of program's main function, [arrays for the blob file in offset order]);
    blob.write(path, arrays) writes the file the text points at."""
    function = program.functions["main"]
    target = ct.target(function.opset_version).name.lower()
    arrays, lines = [], []
    for op in function.operations:
        out = op.outputs[0]
        name = f'[name = string("{op.name}")]'
        if op.op_type == "const":
            value = out.val
            if (types.is_tensor(out.sym_type) and np.size(value) > INLINE_LIMIT
                    and np.asarray(value).dtype.kind == "f"):
                arrays.append(np.ascontiguousarray(value))
                offset = blob.offsets([a.nbytes for a in arrays])[-1]
                val = (f'{type_text(out)}(BLOBFILE(path = string("{weights_path}"), '
                       f'offset = uint64({offset})))')
            else:
                val = literal(out, value)
            lines.append(f"{type_text(out)} {out.name} = const()[name = string(\"{op.name}\"), "
                         f"val = {val}];")
            continue
        args = ", ".join(f"{key} = {argument(op.inputs[key])}" for key in sorted(op.inputs))
        if len(op.outputs) == 1:
            lhs = f"{type_text(out)} {out.name}"
        else:
            lhs = "(" + ", ".join(f"{type_text(o)} {o.name}" for o in op.outputs) + ")"
        lines.append(f"{lhs} = {op.op_type}({args}){name};")
    inputs = ", ".join(f"{type_text(v)} {n}" for n, v in function.inputs.items())
    outputs = ", ".join(v.name for v in function.outputs)
    text = [f"program({PROGRAM_VERSION[target]})",
            f'[buildInfo = dict<string, string>({{{{"coremltools-version", "{ct.__version__}"}}}})]',
            "{", f"    func main<{target}>({inputs}) {{"]
    text += ["        " + line for line in lines]
    text += [f"    }} -> ({outputs});", "}", ""]
    return "\n".join(text), arrays


def save(program, directory):
    """directory/model.mil and directory/weights/weight.bin, as the private path loads them."""
    text, arrays = to_text(program)
    os.makedirs(os.path.join(directory, "weights"), exist_ok=True)
    with open(os.path.join(directory, "model.mil"), "w") as f:
        f.write(text)
    blob.write(os.path.join(directory, "weights", "weight.bin"), arrays)
    return text


def main(argv=None):
    """python -m accel.ane.milt PRESET OUT [-t S]: every dynamic piece of PRESET's block as
    OUT/<piece>/model.mil (+ weights/weight.bin), for compiling on a Mac."""
    from accel.ane import mil
    from train_llama2 import PRESETS
    p = argparse.ArgumentParser(prog="python -m accel.ane.milt", description=main.__doc__)
    p.add_argument("preset", choices=sorted(PRESETS))
    p.add_argument("out")
    p.add_argument("-t", type=int, default=None, help="sequence length S (default: the preset's)")
    args = p.parse_args(argv)
    d = mil.Dims.from_config(PRESETS[args.preset], args.t)
    for piece, program in mil.programs(d).items():
        save(program, os.path.join(args.out, piece))
        print(f"{os.path.join(args.out, piece, 'model.mil')}")


if __name__ == "__main__":
    main()
