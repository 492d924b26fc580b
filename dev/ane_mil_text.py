"""
Writes every dynamic ANE program of a Llama preset's block as MIL text and its weight blob
(accel/ane/milt.py), for compiling on a Mac with the private ANE path:

    python dev/ane_mil_text.py stories110M out -t 256

gives out/<piece>/model.mil and out/<piece>/weights/weight.bin for each piece of
accel/ane/mil.py, and prints each model.mil's path.  The preset's sizes come from here (the
caller's side): accel/ builds programs from sizes and imports no model family or format.
"""
import argparse
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from train_llama2 import PRESETS  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python dev/ane_mil_text.py",
        description="Every dynamic ANE program of a Llama preset's block as "
                    "OUT/<piece>/model.mil (+ weights/weight.bin), for compiling on a Mac.")
    p.add_argument("preset", choices=sorted(PRESETS))
    p.add_argument("out")
    p.add_argument("-t", type=int, default=None, help="sequence length S (default: the preset's)")
    args = p.parse_args(argv)
    from accel.ane import mil, milt   # coremltools, imported quietly there
    d = mil.Dims.from_config(PRESETS[args.preset], args.t)
    for piece, program in mil.programs(d).items():
        milt.save(program, os.path.join(args.out, piece))
        print(f"{os.path.join(args.out, piece, 'model.mil')}")


if __name__ == "__main__":
    main()
