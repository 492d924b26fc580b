"""
Weight blobs in Core ML's BLOBFILE layout (the weights.bin a MIL program's consts point at with
BLOBFILE(path=..., offset=...)), as coremltools' MILBlob storage writes and reads it:

  file header, 64 bytes:   uint32 count (blobs in the file), uint32 version (2), zeros
  per blob, in order:
    metadata, 64 bytes:    uint32 sentinel 0xDEADBEEF, uint32 data type (BLOB_TYPES),
                           uint64 size of the data in bytes, uint64 offset of the data, zeros
    data:                  at the next 64-byte boundary after its metadata
  Each metadata header starts at a 64-byte boundary too; the file ends with the last data.

A const refers to its blob by the offset of the blob's metadata header (the first is 64).
All numbers little-endian.
"""
import struct

import numpy as np

ALIGNMENT = 64
VERSION = 2
SENTINEL = 0xDEADBEEF
BLOB_TYPES = {np.dtype(np.float16): 1, np.dtype(np.float32): 2, np.dtype(np.uint8): 3,
              np.dtype(np.int8): 4}
FILE_HEADER = struct.Struct("<II56x")
METADATA = struct.Struct("<IIQQ40x")


class BlobError(ValueError):
    pass


def aligned(n):
    return -(-n // ALIGNMENT) * ALIGNMENT


def offsets(sizes):
    """The metadata offsets of blobs of these sizes in bytes, in file order."""
    result, end = [], FILE_HEADER.size
    for nbytes in sizes:
        result.append(aligned(end))
        end = aligned(result[-1] + METADATA.size) + nbytes
    return result


def layout(arrays):
    """The file's bytes for these arrays and each one's metadata offset (what BLOBFILE names)."""
    arrays = [np.ascontiguousarray(array) for array in arrays]
    for array in arrays:
        if array.dtype not in BLOB_TYPES:
            raise BlobError(f"no blob data type for {array.dtype} (there are: "
                            f"{', '.join(str(t) for t in BLOB_TYPES)})")
    where = offsets([array.nbytes for array in arrays])
    out = bytearray(FILE_HEADER.pack(len(arrays), VERSION))
    for array, offset in zip(arrays, where):
        out.extend(bytes(offset - len(out)))
        data_offset = aligned(offset + METADATA.size)
        out.extend(METADATA.pack(SENTINEL, BLOB_TYPES[array.dtype], array.nbytes, data_offset))
        out.extend(bytes(data_offset - len(out)))
        out.extend(array.tobytes())
    return bytes(out), where


def write(path, arrays):
    """Write arrays to path as one BLOBFILE; returns each array's offset."""
    data, offsets = layout(arrays)
    with open(path, "wb") as f:
        f.write(data)
    return offsets


def read(path, offset, dtype=np.float16):
    """The array whose metadata header is at offset (flat), with every header checked."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < FILE_HEADER.size:
        raise BlobError(f"{path}: {len(data)} bytes, shorter than the 64-byte file header")
    count, version = FILE_HEADER.unpack_from(data)
    if version != VERSION:
        raise BlobError(f"{path}: blob file version {version}, expected {VERSION}")
    if offset % ALIGNMENT or offset + METADATA.size > len(data):
        raise BlobError(f"{path}: offset {offset} is not a blob header inside the file")
    sentinel, kind, nbytes, data_offset = METADATA.unpack_from(data, offset)
    if sentinel != SENTINEL:
        raise BlobError(f"{path}: no 0xDEADBEEF at offset {offset} (found {sentinel:#x})")
    if kind != BLOB_TYPES[np.dtype(dtype)]:
        raise BlobError(f"{path}: blob at {offset} has data type {kind}, not {np.dtype(dtype)}")
    if data_offset + nbytes > len(data):
        raise BlobError(f"{path}: blob at {offset} is truncated ({nbytes} bytes at {data_offset}, "
                        f"file of {len(data)})")
    return np.frombuffer(data, dtype, nbytes // np.dtype(dtype).itemsize, data_offset).copy()
