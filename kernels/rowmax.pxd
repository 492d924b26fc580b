# The largest of n floats, vectorised.  GCC does not vectorise a float max reduction without
# -ffinite-math-only (NaNs make the order matter), so a plain loop is one dependent compare per
# element; LANES independent running maxima make it an elementwise vector max instead, folded
# at the end.  Every softmax of kernels/ takes its row maximum from here (classifier,
# crossentropy, attention.pxd's softmax_rows, flash_attention's online softmax).
from libc.math cimport INFINITY

from kernels.bf16 cimport floatX, load

cdef enum:
    LANES = 16   # running maxima: one per lane of a 64-byte vector


cdef inline float row_max(const floatX* row, Py_ssize_t n) noexcept nogil:
    cdef float lane_max[LANES]
    cdef Py_ssize_t i, j, body = n - n % LANES
    cdef const floatX* chunk
    cdef float maxval = -INFINITY
    for j in range(LANES):
        lane_max[j] = -INFINITY
    for i in range(body // LANES):
        chunk = row + i * LANES
        for j in range(LANES):
            lane_max[j] = max(lane_max[j], load(chunk, j))
    for j in range(LANES):
        maxval = max(maxval, lane_max[j])
    for i in range(body, n):
        maxval = max(maxval, load(row, i))
    return maxval
