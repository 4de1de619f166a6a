"""Hugging Face's safetensors files, read with NumPy alone.

A .safetensors file is three things, one after the other:

    8 bytes        N, the header's length (unsigned, little-endian)
    N bytes        a JSON header: {name: {"dtype": "F32", "shape": [768, 2304],
                                          "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
    the rest       the tensors' raw little-endian bytes; offsets count from the end of the header

So a memory map of the file, cut at each tensor's offsets, is the tensor: nothing is copied
for float32. float16 and bfloat16 are converted once to float32 (the model works in float32).
A sharded model has several such files and model.safetensors.index.json, whose "weight_map"
says which file holds which tensor.
"""
import json
import os
import struct

import numpy as np

from plumbing.errors import UserError

DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8"),
          "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "U8": np.dtype("u1"), "BOOL": np.dtype("?")}
MAX_HEADER = 100_000_000  # what the format allows


class SafetensorsError(UserError):
    """A safetensors file is truncated, inconsistent or not one; .path names it."""


def read_header(path):
    """-> (header without __metadata__, where the data starts, the file's size). Every tensor's
    offsets are checked: inside the file, matching its dtype and shape, none overlapping."""
    raw, start, size = read_raw_header(path)
    header = parse_header(raw, path)
    for name, info in header.items():
        check_tensor_entry(name, info, start, size, path)
    check_no_overlap(header, path)
    return header, start, size


def read_raw_header(path):
    """The header's bytes, read after their 8-byte length. -> (bytes, where the data starts, file size)"""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size < 8:
                raise SafetensorsError(f"too short for a safetensors file ({size} bytes)", path=path)
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER or 8 + n > size:
                raise SafetensorsError(f"its header says it is {n:,} bytes long, but the file has {size:,}: "
                                       "truncated, or not a safetensors file", path=path)
            return f.read(n), 8 + n, size
    except OSError as e:
        raise SafetensorsError(e.strerror, path=path) from None


def parse_header(raw, path):
    """The header's JSON object, without its __metadata__."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise SafetensorsError("its header is not JSON: not a safetensors file", path=path) from None
    if not isinstance(header, dict):
        raise SafetensorsError("its header is not a JSON object", path=path)
    header.pop("__metadata__", None)
    return header


def check_tensor_entry(name, info, start, size, path):
    """A tensor's dtype, shape and offsets: known, inside the file, and exactly dtype × shape bytes."""
    try:
        dtype, shape, (begin, end) = DTYPES[info["dtype"]], tuple(info["shape"]), info["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise SafetensorsError(f"{name}: a dtype, shape and data_offsets are needed (dtype F32, F16, BF16, ...)",
                               path=path) from None
    if not all(isinstance(d, int) and d >= 0 for d in (*shape, begin, end)) or begin > end:
        raise SafetensorsError(f"{name}: bad shape or offsets", path=path)
    if start + end > size:
        raise SafetensorsError(f"{name} runs past the end of the file (to byte {start + end:,} of {size:,}): "
                               "truncated?", path=path)
    if end - begin != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise SafetensorsError(f"{name}: {end - begin} bytes do not hold {info['dtype']} {list(shape)}", path=path)


def check_no_overlap(header, path):
    """No two tensors share a byte (their entries already checked)."""
    spans = sorted((*info["data_offsets"], name) for name, info in header.items())
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise SafetensorsError(f"{a} and {b} overlap", path=path)


def bfloat16_to_float32(bits):
    """bfloat16 is the top half of a float32: shift its 16 bits up."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def load_file(path):
    """{name: array}: float32 tensors as read-only memory-mapped views, other floats as float32 copies.
    -> (tensors, the dtypes that were converted)"""
    header, start, size = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r") if size > start else np.zeros(0, np.uint8)
    tensors, converted = {}, set()
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = data[start + begin:start + end]
        array = raw.view(DTYPES[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            array = bfloat16_to_float32(array)
        elif info["dtype"] != "F32" and array.dtype.kind == "f":
            array = array.astype(np.float32)
        if info["dtype"] in ("F16", "BF16", "F64"):
            array.flags.writeable = False
            converted.add(info["dtype"])
        tensors[name] = array
    return tensors, converted


def load_folder(folder):
    """All the tensors of model.safetensors, or of the shards model.safetensors.index.json names.
    -> (tensors, converted dtypes)"""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise SafetensorsError("not an index of shards (it needs a weight_map)", path=index) from None
        if any(os.path.basename(s) != s for s in shards):
            raise SafetensorsError("a shard's name leaves the folder", path=index)
    else:
        weight_map, shards = None, ["model.safetensors"]
    tensors, converted = {}, set()
    for shard in shards:
        got, dtypes = load_file(os.path.join(folder, shard))
        for name in got:
            if weight_map is not None and weight_map.get(name) != shard:
                raise SafetensorsError(f"{name} is in {shard}, but the index does not say so", path=index)
        tensors.update(got)
        converted |= dtypes
    missing = sorted(set(weight_map or ()) - set(tensors))
    if missing:
        raise SafetensorsError(f"the index names {missing[0]}, which no shard holds", path=index)
    return tensors, converted


def verify_folder(folder):
    """Check every file's header against its size (what can be checked without a hash). -> files checked"""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        load_folder(folder)  # reads every shard's header
        with open(index, encoding="utf-8") as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    read_header(os.path.join(folder, "model.safetensors"))
    return ["model.safetensors"]
