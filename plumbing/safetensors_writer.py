"""Hugging Face's safetensors files, written with NumPy alone: the format safetensors_reader.py
reads, byte for byte as the safetensors library writes it.

    8 bytes        N, the header's length (unsigned, little-endian)
    N bytes        compact JSON: {"__metadata__": {str: str}, name: {"dtype", "shape",
                   "data_offsets": [begin, end]}, ...}, padded with spaces to a multiple of 8
    the rest       the tensors' raw little-endian bytes, one after another, in the header's order

The library puts the tensors in order of their dtype (8-byte items first, so every tensor starts
aligned to its item size), then of their names; so do we, and our file is the library's file.
(The library keeps __metadata__ in a hash map, so its order of several entries varies from run
to run; ours is the caller's.)
"""
import json
import struct

import numpy as np

from plumbing.folders import whole_file
from plumbing.safetensors_reader import DTYPES, SafetensorsError

# The library's order of dtypes, largest first. BF16 is left out: NumPy has no bfloat16, and
# its 16 bits (read as uint16) would be taken for integers.
WRITTEN = ["I64", "F64", "F32", "I32", "F16", "U8", "BOOL"]
DTYPE_NAMES = {DTYPES[name]: name for name in WRITTEN}
CHUNK = 1 << 26  # bytes converted at a time: a big tensor is streamed, never copied whole


def write_safetensors(path, tensors, metadata=None):
    """Write {name: array} to `path` as a .safetensors file, whole or not at all. `metadata`
    ({str: str}, e.g. {"format": "pt"}) goes into the header's __metadata__. A memory-mapped
    tensor is written straight from its map, a piece at a time."""
    arrays = {name: np.asarray(t) for name, t in tensors.items()}
    header = header_bytes(arrays, metadata)
    with whole_file(path, "the safetensors file", error=SafetensorsError) as tmp, open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for name in in_file_order(arrays):
            for piece in little_endian_pieces(arrays[name]):
                f.write(piece)


def dtype_name(array):
    """The safetensors name of an array's dtype ("F32", ...), whichever byte order it has."""
    name = DTYPE_NAMES.get(array.dtype.newbyteorder("<"))
    if name is None:
        raise TypeError(f"safetensors_writer writes {', '.join(WRITTEN)}; not {array.dtype}")
    return name


def in_file_order(arrays):
    """The names in the order the library writes them: by dtype (its order), then by name."""
    return sorted(arrays, key=lambda name: (WRITTEN.index(dtype_name(arrays[name])), name))


def header_bytes(arrays, metadata):
    """The JSON header as the library writes it: __metadata__ first, no spaces, UTF-8 unescaped,
    then spaces up to a multiple of 8 bytes."""
    header = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("safetensors metadata maps str to str")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in in_file_order(arrays):
        a = arrays[name]
        header[name] = {"dtype": dtype_name(a), "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return raw + b" " * (-len(raw) % 8)


def little_endian_pieces(array):
    """The array's bytes in C order and little-endian, a few rows at a time (views where it is
    already so: a float32 memory map is written without a copy)."""
    a = array.reshape(1, -1) if array.ndim == 0 else array
    le = a.dtype.newbyteorder("<")
    rows = max(1, CHUNK // max(1, a[0].nbytes)) if len(a) else 0
    for start in range(0, len(a), rows or 1):
        yield np.ascontiguousarray(a[start:start + rows], dtype=le).data
