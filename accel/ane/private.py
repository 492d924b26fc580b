"""
ctypes over accel/ane/build/libane_private.dylib (accel/ane/ane_private.m, `make ane-private`):
the private in-memory ANE API, macOS only. UNRUN: written without a Mac. Inputs and outputs
cross as fp16 bytes in the program's shapes; accel/ane/runtime.py's PrivateANERuntime is the
interface, and checks each kernel against Core ML before trusting it.
"""
import ctypes
import os
import sys

import numpy as np

LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build", "libane_private.dylib")
ERR = 512


class Library:
    def __init__(self, path):
        lib = self.lib = ctypes.CDLL(path)
        size_p = ctypes.POINTER(ctypes.c_size_t)
        lib.ane_compile.restype = ctypes.c_void_p
        lib.ane_compile.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                    ctypes.c_size_t, ctypes.c_int, size_p, ctypes.c_int, size_p,
                                    ctypes.c_char_p, ctypes.c_size_t]
        lib.ane_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]
        lib.ane_free.argtypes = [ctypes.c_void_p]

    def compile(self, text, blob, inputs, outputs):
        """A loaded kernel of MIL text and its weight blob; inputs and outputs {name: shape}."""
        err = ctypes.create_string_buffer(ERR)
        sizes = lambda shapes: (ctypes.c_size_t * len(shapes))(  # noqa: E731
            *[2 * int(np.prod(s)) for s in shapes.values()])
        text = text.encode()
        handle = self.lib.ane_compile(text, len(text), blob, len(blob), len(inputs),
                                      sizes(inputs), len(outputs), sizes(outputs), err, ERR)
        if not handle:
            raise RuntimeError(f"ane-private: {err.value.decode()}")
        return handle, list(inputs)

    def run(self, kernel, inputs, output_shapes):
        handle, names = kernel
        ins = [np.ascontiguousarray(inputs[name], np.float16) for name in names]
        outs = {name: np.empty(shape, np.float16) for name, shape in output_shapes.items()}
        in_p = (ctypes.c_void_p * len(ins))(*[a.ctypes.data for a in ins])
        out_p = (ctypes.c_void_p * len(outs))(*[a.ctypes.data for a in outs.values()])
        err = ctypes.create_string_buffer(ERR)
        if not self.lib.ane_run(handle, in_p, out_p, err, ERR):
            raise RuntimeError(f"ane-private: {err.value.decode()}")
        return {name: a.astype(np.float32) for name, a in outs.items()}


def unavailable():
    """Why the library cannot be loaded here (not macOS, not built), or None."""
    if sys.platform != "darwin":
        return "ane-private: the private ANE API needs macOS"
    if not os.path.exists(LIBRARY):
        return "ane-private: not built: run `make ane-private`"
    return None
