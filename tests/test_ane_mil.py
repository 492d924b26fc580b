"""
accel/ane: the Llama block's ANE kernels built as MIL programs by coremltools' Builder, run by
our NumPy interpreter (fp16 storage) and compared with the CPU kernels (kernels/: matmul,
swiglu, attention_gqa) in both pipelines, at odd sizes and with grouped-query heads; the
interpreter's bounds checks; the MIL text emitter's golden files; the BLOBFILE weight blobs.
"""
import os
import sys

import numpy as np
import pytest

if __name__ == "__main__":   # --regenerate-golden, run from anywhere
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import needs  # noqa: E402

needs.package("coremltools", "accel.ane.mil")

from accel.ane import blob, interp, mil, milt  # noqa: E402
from kernels import attention_gqa, matmul, swiglu  # noqa: E402

# fp16 keeps 11 significant bits (unit roundoff 2^-11 = 4.9e-4); each piece rounds a handful of
# intermediates, so its outputs are within a few units of the largest magnitude
TOLERANCE = 4e-3

# odd sizes: C = QD as in Llama, S and H prime, NH = 3 NKV
SIZES = [mil.Dims(C=24, NH=6, NKV=2, hs=4, H=13, S=7), mil.Dims(C=12, NH=2, NKV=2, hs=6, H=11, S=5)]


def rel_error(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def fp16_rounded(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def block_data(d, seed=0):
    """Activations (S, channels) and weights (out, in), all exactly representable in fp16."""
    rng = np.random.default_rng(seed)

    def r(*shape, scale=1.0):
        return fp16_rounded(rng.standard_normal(shape) * scale)
    a = dict(x=r(d.S, d.C), dout=r(d.S, d.C), q=r(d.S, d.QD), k=r(d.S, d.KVD), v=r(d.S, d.KVD),
             dq=r(d.S, d.QD), dk=r(d.S, d.KVD), dv=r(d.S, d.KVD), datt=r(d.S, d.QD))
    w = dict(wq=r(d.QD, d.C, scale=d.C ** -0.5), wk=r(d.KVD, d.C, scale=d.C ** -0.5),
             wv=r(d.KVD, d.C, scale=d.C ** -0.5), wo=r(d.C, d.QD, scale=d.QD ** -0.5),
             w1=r(d.H, d.C, scale=d.C ** -0.5), w3=r(d.H, d.C, scale=d.C ** -0.5),
             w2=r(d.C, d.H, scale=d.H ** -0.5))
    return a, w


# --- the CPU kernels' answers, (S, channels) ---------------------------------------------------

def linear(x, weight):
    out = np.zeros((1, x.shape[0], weight.shape[0]), np.float32)
    matmul.forward(out, np.ascontiguousarray(x[None]), weight)
    return out[0]


def linear_dx(dout, weight):
    dinp = np.zeros((1, dout.shape[0], weight.shape[1]), np.float32)
    dweight = np.zeros_like(weight)
    matmul.backward(dinp, dweight, None, np.ascontiguousarray(dout[None]),
                    np.zeros_like(dinp), weight)
    return dinp[0]


def cpu_attention(d, q, k, v):
    out = np.zeros((1, d.S, d.NH, d.hs), np.float32)
    att = np.zeros((1, d.NH, d.S, d.S), np.float32)
    attention_gqa.forward(out, att, q.reshape(1, d.S, d.NH, d.hs),
                          k.reshape(1, d.S, d.NKV, d.hs), v.reshape(1, d.S, d.NKV, d.hs))
    return out.reshape(d.S, d.QD), att


def cpu_pieces(d, a, w):
    """{piece: [outputs in the program's output order]} from the CPU kernels."""
    x, dout = a["x"], a["dout"]
    h1, h3 = linear(x, w["w1"]), linear(x, w["w3"])
    gated = np.zeros(h1.size, np.float32)
    swiglu.forward(gated, h1.ravel(), h3.ravel())
    dgated = linear_dx(dout, w["w2"])
    dh1, dh3 = np.zeros(h1.size, np.float32), np.zeros(h1.size, np.float32)
    swiglu.backward(dh1, dh3, dgated.ravel(), h1.ravel(), h3.ravel())
    dh1, dh3 = dh1.reshape(h1.shape), dh3.reshape(h1.shape)
    out, att = cpu_attention(d, a["q"], a["k"], a["v"])
    dq = np.zeros((1, d.S, d.NH, d.hs), np.float32)
    dk, dv = (np.zeros((1, d.S, d.NKV, d.hs), np.float32) for _ in range(2))
    attention_gqa.backward(dq, dk, dv, a["datt"].reshape(1, d.S, d.NH, d.hs),
                           a["q"].reshape(1, d.S, d.NH, d.hs), a["k"].reshape(1, d.S, d.NKV, d.hs),
                           a["v"].reshape(1, d.S, d.NKV, d.hs), att)
    return {
        "qkv_forward": [linear(x, w["wq"]), linear(x, w["wk"]), linear(x, w["wv"])],
        "attention_forward": [out, att[0]],
        "wo_forward": [linear(a["q"], w["wo"])],
        "ffn_forward": [linear(gated.reshape(h1.shape), w["w2"]), h1, h3, gated.reshape(h1.shape)],
        "ffn_backward": [linear_dx(dh1, w["w1"]) + linear_dx(dh3, w["w3"]), dh1, dh3, dgated],
        "wo_backward": [linear_dx(dout, w["wo"])],
        "attention_backward": [dq.reshape(d.S, d.QD), dk.reshape(d.S, d.KVD),
                               dv.reshape(d.S, d.KVD)],
        "qkv_backward": [linear_dx(a["dq"], w["wq"]) + linear_dx(a["dk"], w["wk"])
                         + linear_dx(a["dv"], w["wv"])],
    }


def ane_input(piece, pipeline, a, w):
    acts = dict(a)
    if piece == "wo_forward":
        acts["x"] = a["q"]                       # wo reads the attention's output, QD channels
    if piece == "attention_backward":
        acts["dout"] = a["datt"]
    return mil.feeds(piece, pipeline, acts, w)


@pytest.mark.parametrize("pipeline", ["dynamic", "static"])
@pytest.mark.parametrize("d", SIZES, ids=lambda d: f"NH{d.NH}-NKV{d.NKV}")
def test_every_piece_matches_the_cpu_kernels(d, pipeline):
    a, w = block_data(d)
    want = cpu_pieces(d, a, w)
    programs = mil.programs(d, pipeline, w)
    assert set(programs) == set(want)
    for piece, program in programs.items():
        function = program.functions["main"]
        assert list(function.inputs) == ["x"] and [v.name for v in function.outputs] == ["out"]
        out = interp.run(program, x=ane_input(piece, pipeline, a, w))["out"]
        outputs = mil.unpack(piece, d, out)
        assert len(outputs) == len(want[piece]), piece
        for got, expected in zip(outputs, want[piece]):
            assert got.shape == expected.shape, (piece, got.shape, expected.shape)
            assert rel_error(got, expected) < TOLERANCE, (piece, rel_error(got, expected))


def test_the_elementwise_swiglu_programs():
    rng = np.random.default_rng(3)
    N = 29
    a, b, dout = (fp16_rounded(rng.standard_normal(N) * 2) for _ in range(3))
    out, da, db = np.zeros(N, np.float32), np.zeros(N, np.float32), np.zeros(N, np.float32)
    swiglu.forward(out, a, b)
    swiglu.backward(da, db, dout, a, b)
    got = interp.run(mil.swiglu_forward(N), x=np.stack([a, b])[None, :, None, :])["out"]
    assert rel_error(got.ravel(), out) < TOLERANCE
    got = interp.run(mil.swiglu_backward(N), x=np.stack([a, b, dout])[None, :, None, :])["out"]
    assert rel_error(got[0, 0, 0], da) < TOLERANCE and rel_error(got[0, 1, 0], db) < TOLERANCE


def test_every_preset_builds_and_type_checks():
    """The Builder checks every op's types and shapes at the presets' real sizes (stories15M to
    llama-7b, GQA in llama-1b), in the dynamic pipeline (the static one needs the weights)."""
    from train_llama2 import PRESETS
    for name, config in PRESETS.items():
        d = mil.Dims.from_config(config, S=64)
        for piece, program in mil.programs(d).items():
            out = program.functions["main"].outputs[0]
            assert out.shape[0] == 1 and out.shape[2] == 1 and out.shape[3] == 64, (name, piece)


def test_dims_from_a_llama_preset():
    from train_llama2 import PRESETS
    d = mil.Dims.from_config(PRESETS["llama-1b"], S=64)
    assert (d.C, d.NH, d.NKV, d.hs, d.H, d.S, d.KVD) == (2048, 32, 4, 64, 5632, 64, 256)
    program = mil.qkv_forward(mil.Dims.from_config(PRESETS["stories15M"]))
    assert tuple(program.functions["main"].inputs["x"].shape) == (1, 288, 1, 256 + 3 * 288)
    program = mil.qkv_backward(mil.Dims.from_config(PRESETS["llama-1b"], S=64))
    assert tuple(program.functions["main"].inputs["x"].shape) == (1, 2048 + 2 * 256, 1, 64 + 2048)
    with pytest.raises(ValueError, match="does not divide"):
        mil.attention_forward(mil.Dims(C=12, NH=3, NKV=2, hs=4, H=5, S=3))


# --- the interpreter refuses what it cannot run faithfully -------------------------------------

def test_out_of_range_slice_is_accepted_by_the_builder_but_raises_in_the_interpreter():
    from coremltools.converters.mil import Builder as mb
    # a dynamic linear whose weight slice runs 3 columns past the packed input
    program = mil.build({"x": (1, 4, 1, 6)}, lambda x: mb.identity(
        x=mil.columns(x, 2, 7, "w"), name="out"))
    with pytest.raises(interp.InterpreterError, match=r"axis 3 slice \[2:9\] is outside its size 6"):
        interp.run(program, x=np.zeros((1, 4, 1, 6)))
    inside = mil.build({"x": (1, 4, 1, 6)}, lambda x: mb.identity(
        x=mil.columns(x, 2, 4, "w"), name="out"))
    assert interp.run(inside, x=np.arange(24.0).reshape(1, 4, 1, 6))["out"][0, 1, 0, 0] == 8


def test_bad_inputs_are_one_line_errors():
    program = mil.linear_forward(4, 3, 5)
    with pytest.raises(interp.InterpreterError, match=r"input 'x' has shape \(1, 4, 1, 5\), the "
                                                      r"program wants \(1, 4, 1, 8\)"):
        interp.run(program, x=np.zeros((1, 4, 1, 5)))
    with pytest.raises(interp.InterpreterError, match="missing input 'x'"):
        interp.run(program)


# --- MIL text: golden files ---------------------------------------------------------------------

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "ane")


def golden_programs():
    """Small programs of each kind: {file name: Program}."""
    d = mil.Dims(C=4, NH=2, NKV=1, hs=2, H=3, S=3)
    weight = (np.arange(12.0).reshape(3, 4) - 6) / 8
    return {"linear_dynamic.mil": mil.linear_forward(4, 3, 5),
            "linear_static.mil": mil.linear_forward(4, 3, 5, "static", weight),
            "attention_gqa.mil": mil.attention_forward(d)}


def regenerate_golden():
    """Rewrite the golden files (python tests/test_ane_mil.py --regenerate-golden): only when the
    emitter or the programs change on purpose; review the diff."""
    os.makedirs(GOLDEN, exist_ok=True)
    for name, program in golden_programs().items():
        with open(os.path.join(GOLDEN, name), "w") as f:
            f.write(milt.to_text(program)[0])
        print("wrote", os.path.join(GOLDEN, name))


@pytest.mark.parametrize("name", sorted(golden_programs()))
def test_mil_text_matches_its_golden_file(name):
    with open(os.path.join(GOLDEN, name)) as f:
        want = f.read()
    assert milt.to_text(golden_programs()[name])[0] == want, (
        f"{name} changed; if on purpose: python tests/test_ane_mil.py --regenerate-golden")


def test_mil_text_points_at_its_blobs(tmp_path):
    program = golden_programs()["linear_static.mil"]
    text = milt.save(program, tmp_path)
    assert 'BLOBFILE(path = string("@model_path/weights/weight.bin"), offset = uint64(64))' in text
    weight = blob.read(tmp_path / "weights" / "weight.bin", 64)
    np.testing.assert_array_equal(weight, ((np.arange(12.0) - 6) / 8).astype(np.float16))
    assert (tmp_path / "model.mil").read_text() == text
    assert milt.hex_float(0.5) == "0x1p-1" and milt.hex_float(-3.0) == "-0x1.8p+1"


def test_mil_text_of_every_piece_of_a_preset(tmp_path, capsys):
    from dev import ane_mil_text
    ane_mil_text.main(["stories15M", str(tmp_path), "-t", "32"])
    pieces = sorted(p.name for p in tmp_path.iterdir())
    assert pieces == sorted(mil.programs(mil.Dims(C=8, NH=2, NKV=1, hs=4, H=8, S=3)))
    text = (tmp_path / "qkv_forward" / "model.mil").read_text()
    assert "func main<ios17>(tensor<fp16, [1, 288, 1, 896]> x)" in text   # 32 + 3 * 288
    assert len(capsys.readouterr().out.splitlines()) == len(pieces)


# --- weight blobs ----------------------------------------------------------------------------

def blob_arrays():
    rng = np.random.default_rng(7)
    return [rng.standard_normal(n).astype(np.float16) for n in (5, 40, 1, 64)]


def test_blob_file_is_byte_identical_to_coremltools_writer(tmp_path):
    from coremltools import libmilstoragepython as milstorage
    ours = tmp_path / "ours.bin"
    offsets = blob.write(ours, blob_arrays())
    writer = milstorage._BlobStorageWriter(str(tmp_path / "theirs.bin"))
    theirs = [writer.write_fp16_data(a.view(np.uint16)) for a in blob_arrays()]
    del writer   # flushes and closes
    assert offsets == theirs == [64, 192, 384, 512]
    assert ours.read_bytes() == (tmp_path / "theirs.bin").read_bytes()


def test_blob_file_round_trips_through_coremltools_reader(tmp_path):
    from coremltools import libmilstoragepython as milstorage
    path = tmp_path / "w.bin"
    offsets = blob.write(path, blob_arrays())
    reader = milstorage._BlobStorageReader(str(path))
    for array, offset in zip(blob_arrays(), offsets):
        np.testing.assert_array_equal(reader.read_fp16_data(offset).view(np.float16), array)
        np.testing.assert_array_equal(blob.read(path, offset), array)


def test_blob_headers_byte_by_byte_and_bad_files(tmp_path):
    data, offsets = blob.layout([np.ones(3, np.float16), np.zeros(2, np.float32)])
    assert data[:8] == bytes([2, 0, 0, 0, 2, 0, 0, 0]) and data[8:64] == bytes(56)
    assert data[64:68] == bytes.fromhex("efbeadde") and data[68:72] == bytes([1, 0, 0, 0])
    assert data[72:80] == (6).to_bytes(8, "little") and data[80:88] == (128).to_bytes(8, "little")
    assert data[128:134] == np.ones(3, np.float16).tobytes()
    assert offsets == [64, 192] and data[196:200] == bytes([2, 0, 0, 0]) and len(data) == 264
    path = tmp_path / "w.bin"
    path.write_bytes(data)
    with pytest.raises(blob.BlobError, match="no 0xDEADBEEF at offset 128"):
        blob.read(path, 128)
    with pytest.raises(blob.BlobError, match="has data type 2, not float16"):
        blob.read(path, 192)
    path.write_bytes(data[:-4])
    with pytest.raises(blob.BlobError, match="truncated"):
        blob.read(path, 192, np.float32)


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate-golden"]:
        regenerate_golden()
    else:
        sys.exit("usage: python tests/test_ane_mil.py --regenerate-golden")
