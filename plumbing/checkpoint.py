"""OpenAI's GPT-2 checkpoints, read with NumPy alone (TensorFlow's "tensor bundle" format).

A checkpoint is two files. `model.ckpt.data-00000-of-00001` is every tensor's raw
float32 bytes, back to back. `model.ckpt.index` says where each one is: a small
LevelDB-style table whose keys are tensor names and whose values are protocol
buffers. The file reads in the order we walk it:

    index file = data blocks | metaindex block | index block | footer (48 bytes)
    footer     = handle(metaindex) handle(index) padding magic
    handle     = varint offset, varint size   (of a block, in the index file)
    block      = entries, restart offsets, count | 1 byte compression, 4 bytes masked CRC-32C
    entry      = key (a tensor name) -> BundleEntryProto (dtype, shape, offset, size, crc32c)

`load_checkpoint` hands out each tensor as a read-only view into a memory map of the
data file: nothing is copied, and pages are read from disk only when the model uses
them. `verify_checkpoint` checks every tensor's CRC-32C (crc32c.py).
"""
import json
import os
import shutil
import struct
import sys

import numpy as np
from tqdm import tqdm

from plumbing import gguf, hf_model, shapes
from plumbing.crc32c import masked_crc32c
from plumbing.errors import UserError, read_json
from plumbing.folders import whole_folder
from plumbing.shapes import LAYER_NORM_EPS, TOKENIZER_FILES

DATA_SUFFIX = ".data-00000-of-00001"


class CheckpointError(UserError):
    """A checkpoint file is missing, truncated, corrupt or not a GPT-2 checkpoint; .path names it."""


# ----------------------------------------------------------------------------
# The .index table
# ----------------------------------------------------------------------------

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48  # two block handles, zero padding to 40 bytes, 8-byte magic
TRAILER_SIZE = 5  # after each block: 1 byte compression type, 4 bytes masked CRC-32C


def read_varint(buf, pos, max_bits=64):
    """Protocol-buffer varint: 7 bits a byte, low bits first, high bit set on all but the last.
    -> (value, position after it)"""
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise CheckpointError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= max_bits:
            raise CheckpointError("varint too long")


def read_footer(buf):
    """-> (metaindex handle, index handle), each (offset, size)."""
    if len(buf) < FOOTER_SIZE:
        raise CheckpointError(f"too short for a table ({len(buf)} bytes)")
    footer = buf[-FOOTER_SIZE:]
    low, high = struct.unpack("<II", footer[40:])
    if (high << 32 | low) != TABLE_MAGIC:
        raise CheckpointError("bad magic number: not a TensorFlow checkpoint index")
    pos, handles = 0, []
    for _ in range(2):
        offset, pos = read_varint(footer, pos)
        size, pos = read_varint(footer, pos)
        handles.append((offset, size))
    if pos > 40:
        raise CheckpointError("bad footer")
    return handles


def read_block(buf, handle):
    """The contents of the block at handle, after checking its trailer."""
    offset, size = handle
    if offset + size + TRAILER_SIZE > len(buf) - FOOTER_SIZE:
        raise CheckpointError(f"block at offset {offset} runs past the end of the file")
    block = buf[offset:offset + size + 1]
    (stored,) = struct.unpack("<I", buf[offset + size + 1:offset + size + TRAILER_SIZE])
    if masked_crc32c(block) != stored:
        raise CheckpointError(f"checksum mismatch in the block at offset {offset}")
    if block[-1] == 1:
        raise CheckpointError("Snappy-compressed blocks are not supported")
    if block[-1] != 0:
        raise CheckpointError(f"unknown block compression type {block[-1]}")
    return block[:-1]


def block_entries(block):
    """Yield (key, value) from a block. Each key shares a prefix with the one before it."""
    if len(block) < 4:
        raise CheckpointError("block too short")
    (n_restarts,) = struct.unpack("<I", block[-4:])
    end = len(block) - 4 - 4 * n_restarts
    if end < 0:
        raise CheckpointError("bad restart count in block")
    pos, key = 0, b""
    while pos < end:
        shared, pos = read_varint(block, pos, 32)
        unshared, pos = read_varint(block, pos, 32)
        value_len, pos = read_varint(block, pos, 32)
        if shared > len(key) or pos + unshared + value_len > end:
            raise CheckpointError("bad entry in block")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + value_len]
        pos += value_len


def table_entries(buf):
    """Yield every (key, value) of the table: index block -> data blocks -> entries.

    The index block's keys only separate the data blocks, so names come from the data blocks."""
    _, index_handle = read_footer(buf)
    for _, handle in block_entries(read_block(buf, index_handle)):
        offset, pos = read_varint(handle, 0)
        size, pos = read_varint(handle, pos)
        yield from block_entries(read_block(buf, (offset, size)))


# ----------------------------------------------------------------------------
# The protocol buffers in the table's values
# ----------------------------------------------------------------------------

def proto_fields(buf):
    """Yield (field number, value) of a protocol-buffer message: an int, or bytes for wire type 2."""
    pos = 0
    while pos < len(buf):
        tag, pos = read_varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:  # varint
            value, pos = read_varint(buf, pos)
        elif wire == 1 or wire == 5:  # fixed 64 or 32 bits
            width = 8 if wire == 1 else 4
            if pos + width > len(buf):
                raise CheckpointError("truncated field")
            value = int.from_bytes(buf[pos:pos + width], "little")
            pos += width
        elif wire == 2:  # length-delimited: bytes, a string or a nested message
            length, pos = read_varint(buf, pos)
            if pos + length > len(buf):
                raise CheckpointError("truncated field")
            value = buf[pos:pos + length]
            pos += length
        else:
            raise CheckpointError(f"unsupported protobuf wire type {wire}")
        yield field, value


# Field numbers -> names, from TensorFlow's tensor_bundle.proto and tensor_shape.proto.
BUNDLE_HEADER = {1: "num_shards", 2: "endianness", 3: "version"}
BUNDLE_ENTRY = {1: "dtype", 2: "shape", 3: "shard_id", 4: "offset", 5: "size", 6: "crc32c", 7: "slices"}
TENSOR_SHAPE = {2: "dim"}  # repeated
SHAPE_DIM = {1: "size"}
DT_FLOAT = 1


def read_message(buf, fields, repeated=()):
    """A protobuf message as a dict of field names. Fields left at zero are absent in the
    encoding (proto3), so the caller supplies the defaults; unknown fields are skipped."""
    message = {name: [] for name in repeated}
    for number, value in proto_fields(buf):
        name = fields.get(number)
        if name in repeated:
            message[name].append(value)
        elif name:
            message[name] = value
    return message


def parse_header(value):
    """The entry under the empty key: one shard, little-endian."""
    header = {"num_shards": 0, "endianness": 0, **read_message(value, BUNDLE_HEADER)}
    if header["num_shards"] != 1:
        raise CheckpointError(f"checkpoints in {header['num_shards']} shards are not supported")
    if header["endianness"] != 0:
        raise CheckpointError("big-endian checkpoints are not supported")


def parse_shape(value):
    """TensorShapeProto -> a tuple of sizes."""
    dims = tuple(read_message(d, SHAPE_DIM).get("size", 0) if isinstance(d, bytes) else None
                 for d in read_message(value, TENSOR_SHAPE, repeated=("dim",))["dim"])
    if any(not isinstance(d, int) or d > 1 << 40 for d in dims):
        raise CheckpointError("bad tensor shape")
    return dims


def parse_entry(name, value):
    """BundleEntryProto -> (shape, offset, size, crc32c)."""
    entry = {"dtype": 0, "shape": b"", "shard_id": 0, "offset": 0, "size": 0, "crc32c": None,
             **read_message(value, BUNDLE_ENTRY)}
    if "slices" in entry:
        raise CheckpointError(f"{name}: sliced tensors are not supported")
    shape = parse_shape(entry["shape"]) if isinstance(entry["shape"], bytes) else ()
    if entry["dtype"] != DT_FLOAT:
        raise CheckpointError(f"{name}: dtype {entry['dtype']} is not float32")
    if entry["shard_id"] != 0:
        raise CheckpointError(f"{name}: lives in shard {entry['shard_id']}, but there is one data file")
    if entry["size"] != 4 * int(np.prod(shape, dtype=np.int64)):
        raise CheckpointError(f"{name}: {entry['size']} bytes do not hold shape {shape}")
    return shape, entry["offset"], entry["size"], entry["crc32c"]


def read_index(path):
    """{tensor name: (shape, offset, size, crc32c)} from a .index file."""
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise CheckpointError(e.strerror, path=path) from None
    entries = {}
    try:
        for key, value in table_entries(buf):
            if key == b"":
                parse_header(value)
                continue
            name = key.decode("utf-8", errors="replace")
            if name in entries:
                raise CheckpointError(f"{name} appears twice")
            entries[name] = parse_entry(name, value)
    except CheckpointError as e:
        raise CheckpointError(e.message, path=path) from None
    return entries


# ----------------------------------------------------------------------------
# A GPT-2 checkpoint folder
# ----------------------------------------------------------------------------

def read_hparams(folder):
    """hparams.json: n_vocab, n_ctx, n_embd, n_head, n_layer."""
    path = os.path.join(folder, "hparams.json")
    hparams = read_json(path, CheckpointError)
    problem = shapes.hparams_problem(hparams)
    if problem:
        raise CheckpointError(problem, path=path)
    return {k: hparams[k] for k in shapes.HPARAM_KEYS}


def checkpoint_prefix(folder):
    """The checkpoint's path prefix, from the `checkpoint` file when there is one."""
    name = "model.ckpt"
    try:
        with open(os.path.join(folder, "checkpoint"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model_checkpoint_path:"):
                    name = line.split(":", 1)[1].strip().strip('"')
                    break
    except OSError:
        pass
    return os.path.join(folder, os.path.basename(name))  # never leave the folder


def stored_shapes(hp):
    """{checkpoint name: shape on disk}: shapes.py's names under "model/"; OpenAI's
    weights were 1x1 convolutions, so each is stored as [1, n_in, n_out]."""
    return {f"model/{name}": (1, *shape) if name.endswith("/w") else shape
            for name, shape in shapes.tensor_shapes(hp).items()}


def read_gpt2_index(index_path, hp):
    """read_index, checked to list exactly the tensors hp implies, in their shapes."""
    index = read_index(index_path)
    want = stored_shapes(hp)
    for problem, names in (("missing", sorted(set(want) - set(index))), ("unexpected", sorted(set(index) - set(want)))):
        if names:
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            raise CheckpointError(f"{problem} tensor {names[0]}{more}", path=index_path)
    for name, shape in want.items():
        if index[name][0] != shape:
            raise CheckpointError(f"{name} has shape {index[name][0]}, expected {shape}", path=index_path)
    return index


def data_size(index):
    """How many bytes the data file holds: up to the end of its last tensor."""
    return max((offset + nbytes for _, offset, nbytes, _ in index.values()), default=0)


def open_tensors(folder, hp):
    """{checkpoint name: read-only float32 memmap view} for every tensor hp implies, checked
    against the index; and the index."""
    prefix = checkpoint_prefix(folder)
    index_path, data_path = prefix + ".index", prefix + DATA_SUFFIX
    index = read_gpt2_index(index_path, hp)
    try:
        size = os.path.getsize(data_path)
        data = np.memmap(data_path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
    except OSError as e:
        raise CheckpointError(e.strerror, path=data_path) from None
    tensors = {}
    for name, (shape, offset, nbytes, _) in index.items():
        if offset + nbytes > size:
            raise CheckpointError(f"too short for {name} ({size:,} bytes, needs {offset + nbytes:,})", path=data_path)
        tensors[name] = data[offset:offset + nbytes].view("<f4").reshape(shape)
    return tensors, index


def load_checkpoint(folder):
    """-> (hparams, params): the tensors nested by name (shapes.nest), [1, n_in, n_out]
    weights as [n_in, n_out]. Every array is a read-only view into the data file."""
    hp = read_hparams(folder)
    tensors, _ = open_tensors(folder, hp)
    flat = {name[len("model/"):]: a[0] if name.endswith("/w") else a for name, a in tensors.items()}
    return hp, shapes.nest(flat, hp["n_layer"])


def verify_checkpoint(folder, quiet=True):
    """Check every tensor's bytes against the CRC-32C stored in the index; returns bytes checked."""
    hp = read_hparams(folder)
    tensors, index = open_tensors(folder, hp)
    checked = 0
    for name in tqdm(sorted(index, key=lambda n: index[n][1]), desc="verify", unit="tensor",
                     disable=quiet or not sys.stderr.isatty()):
        stored = index[name][3]
        if stored is None or masked_crc32c(tensors[name]) != stored:
            raise CheckpointError(f"checksum mismatch in {name}: the file is corrupt",
                                  path=checkpoint_prefix(folder) + DATA_SUFFIX)
        checked += tensors[name].nbytes
    return checked


# ----------------------------------------------------------------------------
# Writing a checkpoint: the reader's mirror, in TensorFlow's own layout
# ----------------------------------------------------------------------------
# TensorFlow writes the table with LevelDB's defaults: data blocks flushed once they reach
# 256 KiB, a restart point every 16 keys (every key in the index block), the index block's
# keys shortened to separators. We do the same, so a test can hold our index to TensorFlow's
# byte for byte for the same tensors.

BLOCK_SIZE = 256 * 1024
RESTART_INTERVAL = 16


def varint(value):
    """The protocol-buffer varint of a non-negative int (read_varint's inverse)."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def proto_field(number, value):
    """One field: an int as a varint (wire type 0), bytes length-delimited (wire type 2)."""
    if isinstance(value, bytes):
        return varint(number << 3 | 2) + varint(len(value)) + value
    return varint(number << 3) + varint(value)


def fields(*pairs):
    """A message from (number, value) pairs; zero ints are left out, as proto3 does."""
    return b"".join(proto_field(n, v) for n, v in pairs if v != 0)


def entry_proto(shape, offset, size, crc):
    """BundleEntryProto: dtype, shape, offset, size, then the masked CRC-32C as fixed32 (wire type 5)."""
    dims = b"".join(proto_field(2, fields((1, d))) for d in shape)
    return fields((1, DT_FLOAT), (2, dims), (4, offset), (5, size)) + varint(6 << 3 | 5) + struct.pack("<I", crc)


class BlockBuilder:
    """Entries with shared key prefixes, a restart point every `interval` keys, then the restart array."""

    def __init__(self, interval):
        self.interval, self.buf, self.restarts, self.count, self.last = interval, bytearray(), [0], 0, b""

    def add(self, key, value):
        if self.count == self.interval:
            self.restarts.append(len(self.buf))
            self.count, self.last = 0, b""
        shared = 0
        while shared < min(len(key), len(self.last)) and key[shared] == self.last[shared]:
            shared += 1
        self.buf += varint(shared) + varint(len(key) - shared) + varint(len(value)) + key[shared:] + value
        self.count, self.last = self.count + 1, key

    def size(self):
        return len(self.buf) + 4 * len(self.restarts) + 4

    def finish(self):
        return bytes(self.buf) + b"".join(struct.pack("<I", r) for r in self.restarts) + struct.pack(
            "<I", len(self.restarts))


def separator(start, limit):
    """A short key >= start and < limit (LevelDB's FindShortestSeparator)."""
    i = 0
    while i < min(len(start), len(limit)) and start[i] == limit[i]:
        i += 1
    if i < min(len(start), len(limit)) and start[i] < 0xFF and start[i] + 1 < limit[i]:
        return start[:i] + bytes([start[i] + 1])
    return start


def successor(key):
    """A short key >= key (LevelDB's FindShortSuccessor)."""
    for i, byte in enumerate(key):
        if byte != 0xFF:
            return key[:i] + bytes([byte + 1])
    return key


def table(entries):
    """The .index file's bytes for sorted (key, value) pairs: data blocks, metaindex, index, footer."""
    out, index = bytearray(), BlockBuilder(1)

    def write_block(contents):
        handle = varint(len(out)) + varint(len(contents))
        out.extend(contents + b"\x00" + struct.pack("<I", masked_crc32c(contents + b"\x00")))
        return handle

    block, pending, last = BlockBuilder(RESTART_INTERVAL), None, b""
    for key, value in entries:
        if pending is not None:
            index.add(separator(last, key), pending)
            pending = None
        block.add(key, value)
        last = key
        if block.size() >= BLOCK_SIZE:
            pending, block = write_block(block.finish()), BlockBuilder(RESTART_INTERVAL)
    if block.count or block.buf:
        pending = write_block(block.finish())
    if pending is not None:
        index.add(successor(last), pending)
    meta = write_block(BlockBuilder(RESTART_INTERVAL).finish())
    footer = meta + write_block(index.finish())
    return bytes(out) + footer + bytes(40 - len(footer)) + struct.pack("<II", TABLE_MAGIC & 0xFFFFFFFF,
                                                                       TABLE_MAGIC >> 32)


def write_data(f, tensors):
    """Write {checkpoint name: float32 array} to the open file f, a tensor at a time in name order, and
    return the index's bytes. Only one tensor is ever copied (into little-endian float32, if it is not
    already), so writing a 1558M model needs no second copy of it in memory."""
    header = fields((1, 1), (3, fields((1, 1))))  # num_shards 1, little-endian (0), version {producer 1}
    entries, offset = [(b"", header)], 0
    for name in sorted(tensors):
        raw = np.ascontiguousarray(tensors[name], dtype="<f4")
        entries.append((name.encode(), entry_proto(raw.shape, offset, raw.nbytes, masked_crc32c(raw))))
        f.write(raw.reshape(-1).view(np.uint8).data)
        offset += raw.nbytes
    return table(entries)


def check_writable(hparams, folder):
    """OpenAI's hparams.json has no n_inner nor layer_norm_epsilon: a model whose MLP is not 4·C
    wide, or whose layer norms' eps is not 1e-5 (some Hugging Face models), cannot be written in it."""
    if hparams.get("n_inner", 4 * hparams["n_embd"]) != 4 * hparams["n_embd"] or \
            hparams.get("layer_norm_epsilon", LAYER_NORM_EPS) != LAYER_NORM_EPS:
        raise CheckpointError("OpenAI's format has no n_inner or layer_norm_epsilon: this model cannot be written "
                              "in it", path=folder)


def write_checkpoint(folder, params, hparams, vocab_dir=None, extra=None):
    """Write params as OpenAI's files (checkpoint, hparams.json, model.ckpt.index and .data, and
    encoder.json and vocab.bpe copied from the folder `vocab_dir`; extra: {file name: its bytes, or a
    function that writes them to an open file} beside them), whole or not at all (plumbing/folders.py):
    a crash or Ctrl-C never leaves half a checkpoint."""
    check_writable(hparams, folder)
    tensors = {f"model/{name}": a[None] if name.endswith("/w") else a for name, a in shapes.flatten(params).items()}
    files = {"checkpoint": b'model_checkpoint_path: "model.ckpt"\nall_model_checkpoint_paths: "model.ckpt"\n',
             "hparams.json": json.dumps({k: hparams[k] for k in shapes.HPARAM_KEYS}, indent=2).encode(),
             **(extra or {})}
    if vocab_dir and gguf.is_gguf(vocab_dir):  # a model read from a GGUF keeps its tokenizer in the file
        files.update(gguf.vocabulary_files(vocab_dir))
        vocab_dir = None
    elif vocab_dir and hf_model.has_tokenizer_json_only(vocab_dir):  # its two tables, in tokenizer.json
        files.update(hf_model.tokenizer_json_files(vocab_dir))
        vocab_dir = None
    with whole_folder(folder, "the checkpoint", CheckpointError) as tmp:
        with open(os.path.join(tmp, "model.ckpt" + DATA_SUFFIX), "wb") as f:
            index = write_data(f, tensors)
        files["model.ckpt.index"] = index
        for name, content in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                if callable(content):
                    content(f)
                else:
                    f.write(content)
        for name, hf_name in TOKENIZER_FILES.items() if vocab_dir else ():
            # Hugging Face's vocab.json and merges.txt are the same two tables under other names
            source = os.path.join(vocab_dir, name if os.path.exists(os.path.join(vocab_dir, name)) else hf_name)
            shutil.copy(source, os.path.join(tmp, name))
    return folder
