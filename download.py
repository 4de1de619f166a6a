"""Fetch OpenAI's GPT-2 checkpoints, and read them with NumPy alone.

Two halves:

1. Downloading (`download_model`): each file is streamed to `<file>.part`,
   resumed with an HTTP Range request after an interruption, checked against
   its Content-Length, then renamed. So a file under its final name is always
   complete, and a complete file is never fetched again.

2. Reading (`load_checkpoint`): a TensorFlow checkpoint is two files. The
   `.data-00000-of-00001` file is every tensor's raw float32 bytes back to back;
   the `.index` file is a small LevelDB-style table saying where each one is:

       index file = data blocks | metaindex block | index block | footer (48 bytes)
       footer     = handle(metaindex) handle(index) padding magic
       handle     = varint offset, varint size   (of a block, in the index file)
       block      = entries, restart offsets, count | 1 byte compression, 4 bytes CRC
       entry      = key (a tensor name) -> BundleEntryProto (dtype, shape, offset, size, crc32c)

   We walk that table, then hand out each tensor as a read-only view into a
   memory map of the data file: nothing is copied, and pages are read from disk
   only when the model touches them.

Run `python download.py 124M` to fetch a model, `python download.py --verify 124M`
to check every tensor's checksum.
"""
import argparse
import functools
import json
import os
import struct
import sys
import time

import numpy as np
import requests
from tqdm import tqdm

MODEL_SIZES = ("124M", "355M", "774M", "1558M")
# model.ckpt.meta (the TensorFlow graph) is not fetched: nothing here reads it.
MODEL_FILES = ("checkpoint", "hparams.json", "encoder.json", "vocab.bpe",
               "model.ckpt.index", "model.ckpt.data-00000-of-00001")
DEFAULT_BASE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/models"
BASE_URL_ENV = "GPT2_BASE_URL"
MODELS_DIR_ENV = "GPT2_MODELS_DIR"


class DownloadError(Exception):
    """A model could not be found or fetched; the message is one line for the user."""


class CheckpointError(Exception):
    """A checkpoint file is missing, truncated, corrupt or not a GPT-2 checkpoint."""


# ----------------------------------------------------------------------------
# Where models live
# ----------------------------------------------------------------------------

def default_models_dir():
    """$GPT2_MODELS_DIR, else models/ beside this file (so any working directory works)."""
    return os.environ.get(MODELS_DIR_ENV) or os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


def model_folder(model, models_dir=None):
    """The folder for `model`: one of MODEL_SIZES under models_dir, or an existing folder as given."""
    if model in MODEL_SIZES:
        return os.path.join(models_dir or default_models_dir(), model)
    if os.path.isdir(model):
        return model
    raise DownloadError(f"unknown model {model!r}: choose one of {', '.join(MODEL_SIZES)}, "
                        "or give the path of a checkpoint folder")


# ----------------------------------------------------------------------------
# Downloading
# ----------------------------------------------------------------------------

class _Retryable(Exception):
    """A failure worth another try: a dropped connection, a short body, a 5xx."""


def download_model(model, models_dir=None, base_url=None, quiet=False, tries=5, backoff=0.5):
    """Make sure every file of `model` is on disk; returns its folder.

    Only the four released sizes are downloaded. A path to an existing folder is
    returned as it is. After fetching anything, the checkpoint is verified once."""
    folder = model_folder(model, models_dir)
    if model not in MODEL_SIZES:
        return folder
    base_url = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create {folder}: {e.strerror or e}") from None
    fetched = False
    for name in MODEL_FILES:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            fetch_file(f"{base_url}/{model}/{name}", path, quiet=quiet, tries=tries, backoff=backoff)
            fetched = True
    if fetched:
        _verify_fresh_download(folder, quiet)
    return folder


def fetch_file(url, path, quiet=False, tries=5, backoff=0.5):
    """Download url to path through path + '.part', resuming and retrying; rename when complete."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, got {tries}")
    part = path + ".part"
    for attempt in range(1, tries + 1):
        try:
            _fetch_into(url, part, quiet)
            os.replace(part, path)
            return
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                _Retryable) as e:
            reason = _one_line(e)
            if attempt < tries:
                time.sleep(backoff * 2 ** (attempt - 1))
    have = os.path.getsize(part) if os.path.exists(part) else 0
    raise DownloadError(f"could not download {url} after {tries} tries ({reason}); "
                        f"{have:,} bytes of it are in {part}: run again to resume")


def _fetch_into(url, part, quiet):
    """One try: append to `part` what the server still has to send."""
    have = os.path.getsize(part) if os.path.exists(part) else 0
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with requests.get(url, headers=headers, stream=True, timeout=(10, 60)) as r:
        if r.status_code == 404:
            raise DownloadError(f"unknown model size or wrong mirror: {url} answered HTTP 404")
        if r.status_code == 416:  # our .part does not fit what the server has: start again
            os.remove(part)
            raise _Retryable("HTTP 416")
        if r.status_code >= 500:
            raise _Retryable(f"HTTP {r.status_code}")
        if r.status_code == 206:
            start, total = _content_range(r.headers.get("Content-Range", ""))
            if start != have:
                raise _Retryable(f"server resumed at byte {start}, not {have}")
            mode = "ab"
        elif r.status_code == 200:
            have, mode = 0, "wb"
            total = int(r.headers["Content-Length"]) if "Content-Length" in r.headers else None
        else:
            raise DownloadError(f"HTTP {r.status_code} for {url}")
        bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=os.path.basename(part[:-5]), disable=quiet or not sys.stderr.isatty())
        try:
            with open(part, mode) as f:
                # small chunks: when a connection breaks, the chunk in flight is lost
                for chunk in r.iter_content(chunk_size=1 << 16):
                    f.write(chunk)
                    bar.update(len(chunk))
        except requests.RequestException:
            raise  # a network error (requests' errors are OSErrors too): retried by the caller
        except OSError as e:
            raise DownloadError(f"cannot write {part}: {e.strerror or e}; "
                                "what was written is kept there, run again to resume") from None
        finally:
            bar.close()
    size = os.path.getsize(part)
    if total is not None and size != total:
        raise _Retryable(f"got {size:,} of {total:,} bytes")


def _content_range(value):
    """'bytes 100-199/200' -> (100, 200)."""
    try:
        unit, rest = value.split(" ", 1)
        span, total = rest.split("/")
        return int(span.split("-")[0]), int(total)
    except ValueError:
        raise _Retryable(f"bad Content-Range {value!r}") from None


def _one_line(e):
    return " ".join(str(e).split()) or type(e).__name__


def _verify_fresh_download(folder, quiet):
    """A just-downloaded checkpoint must be whole: the file an error names is removed,
    so that the next run fetches it again (every CheckpointError begins with its file)."""
    try:
        verify_checkpoint(folder, quiet=quiet)
    except CheckpointError as e:
        bad = [name for name in MODEL_FILES if str(e).startswith(os.path.join(folder, name))]
        for name in bad:
            os.remove(os.path.join(folder, name))
        removed = f" (removed {bad[0]}: run again to fetch it again)" if bad else ""
        raise CheckpointError(f"{e}{removed}") from None


# ----------------------------------------------------------------------------
# CRC-32C, vectorised with NumPy
# ----------------------------------------------------------------------------
# TensorFlow checksums every block of the index and every tensor with CRC-32C
# (Castagnoli polynomial; Python's zlib.crc32 uses another one). A byte-at-a-time
# loop in Python manages ~11 MB/s. Instead we cut the data into many equal lanes,
# run the CRC over all lanes at once (4 bytes per step, two table look-ups of
# 16 bits each), and then fold the lanes' CRCs together. The fold works because
# a CRC is linear:
#   crc(state, A + B) = zeros(state, len(B)) ^ crc(0, B)
# where zeros(s, n) is the effect of n zero bytes on state s, a 32x32 bit matrix.

def _crc32c_byte_table():
    """T[i]: the CRC register after feeding byte i into state 0 (reflected 0x82F63B78)."""
    c = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        c = np.where(c & 1, (c >> 1) ^ np.uint32(0x82F63B78), c >> 1)
    return c


def _crc32c_word_tables(t):
    """LOW, HIGH such that feeding a 4-byte word w into state s gives
    LOW[x & 0xFFFF] ^ HIGH[x >> 16], x = s ^ w. Byte k of x is followed by 3 - k
    more bytes, hence the tables 'byte, then n zero bytes'."""
    after = [t]  # after[n][i]: byte i followed by n zero bytes
    for _ in range(3):
        after.append((after[-1] >> 8) ^ t[after[-1] & 0xFF])
    low = (after[3][None, :] ^ after[2][:, None]).ravel()  # index: byte1 * 256 + byte0
    high = (after[1][None, :] ^ after[0][:, None]).ravel()  # index: byte3 * 256 + byte2
    return low, high


CRC_TABLE = _crc32c_byte_table()
CRC_TABLE_LIST = CRC_TABLE.tolist()  # for the byte-at-a-time loop on short inputs
CRC_LOW, CRC_HIGH = _crc32c_word_tables(CRC_TABLE)


def _apply(op, x):
    """Apply a linear map on 32-bit states, given as the images of its 32 bits, to x (uint32 array)."""
    out = np.zeros_like(x)
    for bit in range(32):
        out ^= op[bit] * ((x >> np.uint32(bit)) & np.uint32(1))
    return out


@functools.lru_cache(maxsize=None)
def _zeros_operator(n):
    """The map state -> state after n zero bytes, as the images of the 32 bits."""
    if n == 1:
        bits = np.uint32(1) << np.arange(32, dtype=np.uint32)
        return CRC_TABLE[bits & 0xFF] ^ (bits >> 8)
    half = _zeros_operator(n // 2)
    op = _apply(half, half)
    return _apply(_zeros_operator(1), op) if n % 2 else op


def _crc32c_update(state, data):
    """Feed the bytes of data (a uint8 array) into the CRC register `state`."""
    lanes = 1
    while lanes < 1 << 16 and lanes * 2 * 1024 <= len(data):
        lanes *= 2
    if lanes < 8:
        table = CRC_TABLE_LIST
        for byte in data.tobytes():
            state = table[(state ^ byte) & 0xFF] ^ (state >> 8)
        return state
    length = len(data) // lanes // 4 * 4
    words = data[:lanes * length].view("<u4").reshape(lanes, length // 4)
    crc = np.zeros(lanes, np.uint32)
    for j in range(length // 4):
        crc ^= words[:, j]
        crc = CRC_LOW[crc & 0xFFFF] ^ CRC_HIGH[crc >> 16]
    while len(crc) > 1:  # fold neighbouring lanes: crc(A + B) = zeros(crc(A), len(B)) ^ crc(B)
        crc = _apply(_zeros_operator(length), crc[0::2]) ^ crc[1::2]
        length *= 2
    # now `length` covers all lanes; the few bytes after them go round again
    state = int(_apply(_zeros_operator(length), np.array([state], np.uint32))[0] ^ crc[0])
    return _crc32c_update(state, data[length:])


def crc32c(data):
    """CRC-32C of a bytes-like object or uint8 array."""
    data = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    return _crc32c_update(0xFFFFFFFF, data.reshape(-1).view(np.uint8)) ^ 0xFFFFFFFF


def masked_crc32c(data):
    """The form TensorFlow stores: rotate right by 15 bits, add a constant (mod 2^32)."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ----------------------------------------------------------------------------
# Reading the .index table
# ----------------------------------------------------------------------------

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48  # two block handles, zero padding to 40 bytes, 8-byte magic
TRAILER_SIZE = 5  # after each block: 1 byte compression type, 4 bytes masked CRC-32C


def read_varint(buf, pos, max_bits=64):
    """Protocol-buffer varint: 7 bits a byte, low bits first, high bit set on all but the last."""
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


def proto_fields(buf):
    """Yield (field number, value) of a protocol-buffer message: an int, or bytes for wire type 2."""
    pos = 0
    while pos < len(buf):
        tag, pos = read_varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 1 or wire == 5:
            width = 8 if wire == 1 else 4
            if pos + width > len(buf):
                raise CheckpointError("truncated field")
            value = int.from_bytes(buf[pos:pos + width], "little")
            pos += width
        elif wire == 2:
            length, pos = read_varint(buf, pos)
            if pos + length > len(buf):
                raise CheckpointError("truncated field")
            value = buf[pos:pos + length]
            pos += length
        else:
            raise CheckpointError(f"unsupported protobuf wire type {wire}")
        yield field, value


def parse_header(value):
    """BundleHeaderProto: num_shards=1, endianness=2 (0 little, 1 big), version=3."""
    fields = dict(proto_fields(value))
    if fields.get(1, 0) != 1:
        raise CheckpointError(f"checkpoints in {fields.get(1, 0)} shards are not supported")
    if fields.get(2, 0) != 0:
        raise CheckpointError("big-endian checkpoints are not supported")


def parse_entry(name, value):
    """BundleEntryProto -> (shape, offset, size, crc32c); zero-valued fields are absent."""
    entry = {"dtype": 0, "shape": (), "shard": 0, "offset": 0, "size": 0, "crc32c": None}
    for field, v in proto_fields(value):
        if field == 1:
            entry["dtype"] = v
        elif field == 2 and isinstance(v, bytes):
            entry["shape"] = parse_shape(v)
        elif field == 3:
            entry["shard"] = v
        elif field == 4:
            entry["offset"] = v
        elif field == 5:
            entry["size"] = v
        elif field == 6:
            entry["crc32c"] = v
        elif field == 7:
            raise CheckpointError(f"{name}: sliced tensors are not supported")
    if entry["dtype"] != 1:
        raise CheckpointError(f"{name}: dtype {entry['dtype']} is not float32")
    if entry["shard"] != 0:
        raise CheckpointError(f"{name}: lives in shard {entry['shard']}, but there is one data file")
    if entry["size"] != 4 * int(np.prod(entry["shape"], dtype=np.int64)):
        raise CheckpointError(f"{name}: {entry['size']} bytes do not hold shape {entry['shape']}")
    return entry["shape"], entry["offset"], entry["size"], entry["crc32c"]


def parse_shape(value):
    """TensorShapeProto: dim=2 (repeated Dim, whose size=1)."""
    dims = []
    for field, dim in proto_fields(value):
        if field == 2 and isinstance(dim, bytes):
            dims.append(dict(proto_fields(dim)).get(1, 0))
    if any(not isinstance(d, int) or d > 1 << 40 for d in dims):
        raise CheckpointError("bad tensor shape")
    return tuple(dims)


def read_index(path):
    """{tensor name: (shape, offset, size, crc32c)} from a .index file."""
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise CheckpointError(f"{path}: {e.strerror}") from None
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
        raise CheckpointError(f"{path}: {e}") from None
    return entries


# ----------------------------------------------------------------------------
# A GPT-2 checkpoint
# ----------------------------------------------------------------------------

def read_hparams(folder):
    """hparams.json: n_vocab, n_ctx, n_embd, n_head, n_layer."""
    path = os.path.join(folder, "hparams.json")
    try:
        with open(path, encoding="utf-8") as f:
            hparams = json.load(f)
    except OSError as e:
        raise CheckpointError(f"{path}: {e.strerror}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    keys = ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")
    if not isinstance(hparams, dict) or not all(
            isinstance(hparams.get(k), int) and not isinstance(hparams.get(k), bool) and hparams[k] > 0 for k in keys):
        raise CheckpointError(f"{path}: needs positive integers {', '.join(keys)}")
    if hparams["n_embd"] % hparams["n_head"]:
        raise CheckpointError(f"{path}: n_embd {hparams['n_embd']} is not a multiple of n_head {hparams['n_head']}")
    return {k: hparams[k] for k in keys}


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


def expected_shapes(hp):
    """Every tensor a GPT-2 of these hparams has, by checkpoint name, with its shape."""
    V, T, d = hp["n_vocab"], hp["n_ctx"], hp["n_embd"]
    shapes = {"model/wte": (V, d), "model/wpe": (T, d), "model/ln_f/g": (d,), "model/ln_f/b": (d,)}
    for i in range(hp["n_layer"]):
        shapes.update({
            f"model/h{i}/ln_1/g": (d,), f"model/h{i}/ln_1/b": (d,),
            f"model/h{i}/attn/c_attn/w": (1, d, 3 * d), f"model/h{i}/attn/c_attn/b": (3 * d,),
            f"model/h{i}/attn/c_proj/w": (1, d, d), f"model/h{i}/attn/c_proj/b": (d,),
            f"model/h{i}/ln_2/g": (d,), f"model/h{i}/ln_2/b": (d,),
            f"model/h{i}/mlp/c_fc/w": (1, d, 4 * d), f"model/h{i}/mlp/c_fc/b": (4 * d,),
            f"model/h{i}/mlp/c_proj/w": (1, 4 * d, d), f"model/h{i}/mlp/c_proj/b": (d,),
        })
    return shapes


def open_tensors(folder, hp):
    """{name: read-only float32 memmap view} for every tensor hp implies, checked against the index."""
    prefix = checkpoint_prefix(folder)
    index = read_index(prefix + ".index")
    data_path = prefix + ".data-00000-of-00001"
    want = expected_shapes(hp)
    missing = sorted(set(want) - set(index))
    extra = sorted(set(index) - set(want))
    if missing:
        raise CheckpointError(f"{prefix}.index: missing tensor {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    if extra:
        raise CheckpointError(f"{prefix}.index: unexpected tensor {extra[0]}" + (f" and {len(extra) - 1} more" if len(extra) > 1 else ""))
    for name, shape in want.items():
        if index[name][0] != shape:
            raise CheckpointError(f"{prefix}.index: {name} has shape {index[name][0]}, expected {shape}")
    try:
        size = os.path.getsize(data_path)
        data = np.memmap(data_path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
    except OSError as e:
        raise CheckpointError(f"{data_path}: {e.strerror}") from None
    tensors = {}
    for name, (shape, offset, nbytes, _) in index.items():
        if offset + nbytes > size:
            raise CheckpointError(f"{data_path}: too short for {name} ({size:,} bytes, needs {offset + nbytes:,})")
        tensors[name] = data[offset:offset + nbytes].view("<f4").reshape(shape)
    return tensors, index


def load_checkpoint(folder):
    """-> (hparams, params): params mirrors the checkpoint's names as nested dicts and lists.

    params = {wte [V, d], wpe [T, d], ln_f {g, b},
              blocks: [{ln_1 {g, b}, attn {c_attn {w, b}, c_proj {w, b}}, ln_2 {g, b},
                        mlp {c_fc {w, b}, c_proj {w, b}}}, ...]}
    Every array is a read-only view into the data file; the [1, nx, nf] conv
    weights become [nx, nf]."""
    hp = read_hparams(folder)
    tensors, _ = open_tensors(folder, hp)

    def layer(prefix):
        return {"w": tensors[prefix + "/w"][0], "b": tensors[prefix + "/b"]} if prefix + "/w" in tensors \
            else {"g": tensors[prefix + "/g"], "b": tensors[prefix + "/b"]}

    blocks = [{"ln_1": layer(f"model/h{i}/ln_1"),
               "attn": {"c_attn": layer(f"model/h{i}/attn/c_attn"), "c_proj": layer(f"model/h{i}/attn/c_proj")},
               "ln_2": layer(f"model/h{i}/ln_2"),
               "mlp": {"c_fc": layer(f"model/h{i}/mlp/c_fc"), "c_proj": layer(f"model/h{i}/mlp/c_proj")}}
              for i in range(hp["n_layer"])]
    params = {"wte": tensors["model/wte"], "wpe": tensors["model/wpe"],
              "blocks": blocks, "ln_f": layer("model/ln_f")}
    return hp, params


def verify_checkpoint(folder, quiet=True):
    """Check every tensor's bytes against the CRC-32C stored in the index; returns bytes checked."""
    hp = read_hparams(folder)
    tensors, index = open_tensors(folder, hp)
    checked = 0
    for name in tqdm(sorted(index, key=lambda n: index[n][1]), desc="verify", unit="tensor",
                     disable=quiet or not sys.stderr.isatty()):
        stored = index[name][3]
        if stored is None or masked_crc32c(tensors[name]) != stored:
            raise CheckpointError(f"{checkpoint_prefix(folder)}.data-00000-of-00001: "
                                  f"checksum mismatch in {name}: the file is corrupt")
        checked += tensors[name].nbytes
    return checked


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Download a GPT-2 checkpoint from OpenAI (or a mirror), or verify one on disk.",
        epilog=f"Models go to --models-dir, else ${MODELS_DIR_ENV}, else models/ beside this script. "
               f"Files are fetched from --base-url, else ${BASE_URL_ENV}, else {DEFAULT_BASE_URL}.")
    parser.add_argument("model", help=f"one of {', '.join(MODEL_SIZES)}, or a checkpoint folder (with --verify)")
    parser.add_argument("--models-dir", help="folder that holds one subfolder per model size")
    parser.add_argument("--base-url", help="where <size>/<file> is fetched from (a mirror)")
    parser.add_argument("--verify", action="store_true", help="check every tensor's CRC-32C instead of downloading")
    parser.add_argument("--retries", type=int, default=5, help="tries per file before giving up (default 5)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.error = _fail
    args = parser.parse_args(argv)
    if args.retries < 1:
        _fail("--retries must be at least 1")
    try:
        if args.verify:
            folder = model_folder(args.model, args.models_dir)
            start = time.perf_counter()
            nbytes = verify_checkpoint(folder, quiet=args.quiet)
            seconds = time.perf_counter() - start
            print(f"{folder}: all tensors match their checksums "
                  f"({nbytes / 1e6:,.1f} MB in {seconds:.2f} s, {nbytes / 1e6 / seconds:,.0f} MB/s)")
        else:
            folder = download_model(args.model, args.models_dir, args.base_url, args.quiet, tries=args.retries)
            print(folder)
    except (DownloadError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def _fail(message):
    """argparse's errors, as one line."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    sys.exit(main())
