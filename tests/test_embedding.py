# kernels.embedding: Llama's token embedding (no position table) against NumPy.
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from kernels import embedding


def embedding_backward_ref(dwte_shape, dout, inp):
    """dwte (Vp,C): dout scattered to the rows inp read, repeated ids summed, in float64."""
    dwte = np.zeros(dwte_shape)
    np.add.at(dwte, inp.reshape(-1), dout.reshape(-1, dout.shape[-1]).astype(np.float64))
    return dwte


# the last above kernels.parallel's SERIAL_BELOW (threaded)
@pytest.mark.parametrize("B,T,C,Vp", [(3, 7, 37, 11), (1, 1, 8, 2), (2, 13, 70, 5), (3, 7, 49999, 5)])
def test_forward_backward(B, T, C, Vp):
    rng = np.random.default_rng(B * T)
    inp = rng.integers(0, Vp, size=(B, T), dtype=np.int32)   # few rows: ids repeat
    wte = rng.standard_normal((Vp, C)).astype(np.float32)
    out = np.full((B, T, C), np.nan, dtype=np.float32)
    embedding.forward(out, inp, wte)
    np.testing.assert_array_equal(out, wte[inp])

    dout = rng.standard_normal((B, T, C)).astype(np.float32)
    dwte_start = rng.standard_normal((Vp, C)).astype(np.float32)
    for num_threads in (1, 3):
        dwte = dwte_start.copy()
        with threadpool_limits(limits=num_threads, user_api="openmp"):
            embedding.backward(dwte, dout, inp)
        np.testing.assert_allclose(dwte, dwte_start + embedding_backward_ref(dwte.shape, dout, inp),
                                   rtol=1e-5, atol=1e-5)


def test_bad_arguments_raise():
    inp = np.array([[0, 1, 4]], dtype=np.int32)
    wte = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="inp\\[0, 2\\] = 4"):
        embedding.forward(np.zeros((1, 3, 8), np.float32), inp, wte)
    with pytest.raises(ValueError, match="out"):
        embedding.forward(np.zeros((1, 3, 7), np.float32), inp % 4, wte)
    with pytest.raises(ValueError, match="dout"):
        embedding.backward(wte, np.zeros((1, 2, 8), np.float32), inp % 4)
