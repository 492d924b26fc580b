"""kernels.zero, the CPU backend's `zero`: every byte asked for is zero, none beyond it is touched,
on both sides of PARALLEL_MIN_BYTES (one memset, or a page-aligned block per OpenMP thread) and
from a start that is not page-aligned."""
import numpy as np
import pytest

from kernels import zero

MIB_FLOATS = (1 << 20) // 4


@pytest.mark.parametrize("n", [1, 1000, MIB_FLOATS - 3, MIB_FLOATS + 5, 3 * MIB_FLOATS + 7])
@pytest.mark.parametrize("offset", [0, 1])
def test_zero_clears_exactly_its_buffer(n, offset):
    buf = np.ones(n + offset + 16, np.float32)
    zero.zero(buf[offset:offset + n])
    assert not buf[offset:offset + n].any()
    assert (buf[:offset] == 1).all() and (buf[offset + n:] == 1).all()
