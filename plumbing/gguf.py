"""GGUF, the file llama.cpp, Ollama and LM Studio load: read with NumPy, memory-mapped; and Q8_0,
its 8-bit weights. (plumbing/gguf_writer.py writes the file as llama.cpp's converter does.)

    header        b"GGUF", version (u32: 3), n_tensors (u64), n_kv (u64)
    metadata      n_kv times: key (string), value type (u32), value
    tensor infos  n_tensors times: name (string), n_dims (u32), ne[0..n_dims) (u64 each, the
                  fastest-varying first: numpy's shape reversed), ggml type (u32), offset (u64)
    padding       zeros up to a multiple of general.alignment (32 when the key is absent)
    data          each tensor at its offset from here, each padded to the alignment
    (a string is its length (u64) then its UTF-8 bytes; an array is its items' type (u32),
     its length (u64), then the items; all little-endian)

GPT-2's tensors in llama.cpp's names, as its converter writes them (c_attn, c_proj and c_fc
transposed to torch's nn.Linear layout, [n_out, n_in], so ne = [n_in, n_out]):

    token_embd.weight  [V, d]        blk.3.attn_qkv.weight   [3d, d] (c_attn)   blk.3.attn_norm (ln_1)
    position_embd.weight [T, d]      blk.3.attn_output.weight [d, d] (c_proj)   blk.3.ffn_norm (ln_2)
    output_norm (ln_f)               blk.3.ffn_up.weight     [4d, d] (c_fc)     blk.3.ffn_down [d, 4d]

Q8_0 keeps a row in blocks of 32 values, each block 34 bytes: its scale d as float16, then 32
int8s, x ~ d * q. d = max|x| / 127, so the largest value of the block is exactly +-127 d.
"""
import json
import mmap
import struct

import numpy as np

from plumbing import shapes
from plumbing.errors import UserError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # read; 3 is written (version 1 had 32-bit counts and is long gone)
ALIGNMENT = 32  # general.alignment's default
QK8_0 = 32  # values in a Q8_0 block
Q8_0_BLOCK_BYTES = 2 + QK8_0  # its float16 scale, then its 32 int8s

# ggml's tensor types that this project reads: {number: (name, values a block, bytes a block)}
F32, F16, Q8_0 = 0, 1, 8
TENSOR_TYPES = {F32: ("F32", 1, 4), F16: ("F16", 1, 2), Q8_0: ("Q8_0", QK8_0, Q8_0_BLOCK_BYTES)}
# GGUF's metadata value types: number -> struct format (STRING and ARRAY are read by hand)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
SCALARS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
           BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5  # tokenizer.ggml.token_type's values used here

# ours (shapes.py) -> llama.cpp's; a block's parts are blk.N.<part>.weight|bias
PARTS = {"ln_1": "attn_norm", "attn/c_attn": "attn_qkv", "attn/c_proj": "attn_output", "ln_2": "ffn_norm",
         "mlp/c_fc": "ffn_up", "mlp/c_proj": "ffn_down"}
SUFFIXES = {"w": "weight", "g": "weight", "b": "bias"}
TRANSPOSED = ("attn/c_attn/w", "attn/c_proj/w", "mlp/c_fc/w", "mlp/c_proj/w")  # Conv1D's [n_in, n_out]


class GGUFError(UserError):
    """A GGUF file that cannot be read here: one line, naming the file."""


# ----------------------------------------------------------------------------
# Q8_0: the plain form (one block), then the fast form (every block at once)
# ----------------------------------------------------------------------------

def round_half_away(y):
    """roundf: the nearest integer, halves away from zero (2.5 -> 3, -2.5 -> -3), exact in float32:
    a - floor(a) is exact, so no float32 sum pushes 0.49999997 up to 1."""
    a = np.abs(y)
    whole = np.floor(a)
    return np.sign(y) * (whole + (a - whole >= 0.5))


def quantize_block(x):
    """One Q8_0 block, ggml's quantize_row_q8_0_ref: x [32] float32 -> (d float16, q [32] int8).
    d = max|x| / 127 in float32;  q = round(x * (1/d)) with that float32 d;  then d is stored
    as float16 (which may round it to 0 or to infinity)."""
    d = np.max(np.abs(x)) / np.float32(127)
    inverse = np.float32(1) / d if d else np.float32(0)  # a block of zeros stays zeros
    q = round_half_away(x * inverse).astype(np.int8)
    return np.float16(d), q


def dequantize_block(d, q):
    """x ~ d * q: a block back to float32, [32]."""
    return q.astype(np.float32) * np.float32(d)


def quantize_q8_0(x):
    """quantize_block on every block of x [..., n] float32 (n a multiple of 32), one after another:
    -> uint8 [..., n // 32 * 34], each block its d's two bytes then its 32 int8s."""
    blocks = np.asarray(x, dtype=np.float32).reshape(-1, QK8_0)  # [blocks, 32]
    raw = [np.concatenate([np.array([d], "<f2").view(np.uint8), q.view(np.uint8)])
           for d, q in map(quantize_block, blocks)]
    return np.array(raw, dtype=np.uint8).reshape(*x.shape[:-1], x.shape[-1] // QK8_0 * Q8_0_BLOCK_BYTES)


def quantize_q8_0_fast(x):
    """quantize_q8_0, every block at once."""
    blocks = np.asarray(x, dtype=np.float32).reshape(-1, QK8_0)  # [blocks, 32]
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)  # [blocks, 1]
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d)
    q = round_half_away(blocks * inverse).astype(np.int8)
    out = np.concatenate([d.astype("<f2").view(np.uint8), q.view(np.uint8)], axis=1)  # [blocks, 34]
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK8_0 * Q8_0_BLOCK_BYTES)


def dequantize_q8_0(raw, n):
    """The blocks of quantize_q8_0 (uint8 [..., n // 32 * 34]) -> float32 [..., n], block by block."""
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, Q8_0_BLOCK_BYTES)
    x = [dequantize_block(b[:2].copy().view("<f2")[0], b[2:].view(np.int8)) for b in blocks]
    return np.array(x, dtype=np.float32).reshape(*raw.shape[:-1], n)


def dequantize_q8_0_fast(raw, n):
    """dequantize_q8_0, every block at once."""
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, Q8_0_BLOCK_BYTES)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)  # [blocks, 1]
    q = blocks[:, 2:].view(np.int8).astype(np.float32)  # [blocks, 32]
    return (q * d).reshape(*raw.shape[:-1], n)


# ----------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------

def gguf_name(name):
    """Ours -> llama.cpp's: wte -> token_embd.weight, h3/attn/c_attn/w -> blk.3.attn_qkv.weight."""
    if name in ("wte", "wpe"):
        return {"wte": "token_embd", "wpe": "position_embd"}[name] + ".weight"
    *layer, last = name.split("/")
    block = shapes.block_index(name)
    part = "output_norm" if layer == ["ln_f"] else f"blk.{block}.{PARTS['/'.join(layer[1:])]}"
    return f"{part}.{SUFFIXES[last]}"


def is_gguf(path):
    """A path that names a GGUF file (by its name: it is then read as one, and refused if it is not)."""
    return str(path).lower().endswith(".gguf")


class Reader:
    """A cursor over the file's bytes; running past the end is a one-line error, not an IndexError."""

    def __init__(self, data, path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, n, what):
        if self.pos + n > len(self.data):
            raise GGUFError(f"is truncated: it ends inside {what}", path=self.path)
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def scalar(self, vtype, what):
        fmt = SCALARS[vtype]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        return bytes(self.take(self.scalar(UINT64, what), what)).decode("utf-8", errors="replace")

    def value(self, vtype, what):
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY:
            item, n = self.scalar(UINT32, what), self.scalar(UINT64, what)
            if item in SCALARS:  # a table of numbers, read at once
                size = struct.calcsize(SCALARS[item])
                return np.frombuffer(self.take(n * size, what), dtype=SCALARS[item]).tolist()
            return [self.value(item, what) for _ in range(n)]
        if vtype not in SCALARS:
            raise GGUFError(f"has metadata {what} of unknown value type {vtype}", path=self.path)
        return self.scalar(vtype, what)


def read_header(data, path):
    """-> (metadata {key: value}, tensor infos [(name, numpy shape, ggml type, offset)], data start)."""
    r = Reader(memoryview(data), path)  # a memoryview: slicing it is cheap, 100,000 strings in a GPT-2
    magic = bytes(r.take(4, "the magic number"))
    if magic != MAGIC:
        raise GGUFError(f"is not a GGUF file (it begins {magic!r}, not {MAGIC!r})", path=path)
    version = r.scalar(UINT32, "the header")
    if version not in VERSIONS:
        raise GGUFError(f"is GGUF version {version}; this project reads versions 2 and 3", path=path)
    n_tensors, n_kv = r.scalar(UINT64, "the header"), r.scalar(UINT64, "the header")
    metadata = {}
    for _ in range(n_kv):
        key = r.string("the metadata")
        metadata[key] = r.value(r.scalar(UINT32, f"metadata {key}"), key)
    infos = []
    for _ in range(n_tensors):
        name = r.string("the tensor infos")
        ne = [r.scalar(UINT64, name) for _ in range(r.scalar(UINT32, name))]
        infos.append((name, tuple(reversed(ne)), r.scalar(UINT32, name), r.scalar(UINT64, name)))
    alignment = metadata.get("general.alignment", ALIGNMENT)
    return metadata, infos, -(-r.pos // alignment) * alignment


def tensor_nbytes(shape, ggml_type):
    _, per_block, block_bytes = TENSOR_TYPES[ggml_type]
    return int(np.prod(shape, dtype=np.int64)) // per_block * block_bytes


def as_float32(data, start, shape, ggml_type):
    """A tensor's bytes -> float32 [shape]: F32 a view into the map, F16 and Q8_0 dequantized."""
    raw = data[start:start + tensor_nbytes(shape, ggml_type)]
    if ggml_type == F32:
        return raw.view("<f4").reshape(shape)
    if ggml_type == F16:
        return raw.view("<f2").astype(np.float32).reshape(shape)
    return dequantize_q8_0_fast(raw.reshape(*shape[:-1], -1), shape[-1])


def map_file(path):
    """The file's bytes, memory-mapped read-only (uint8)."""
    try:
        with open(path, "rb") as f:
            if not f.seek(0, 2):
                raise GGUFError("is empty, not a GGUF file", path=path)
            return np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
    except OSError as e:
        raise GGUFError(f"cannot be read ({e.strerror or e})", path=path) from None


def open_gguf(path):
    """-> (metadata, {name: (numpy shape, ggml type, absolute offset)}, the mapped bytes), every
    tensor checked to be of a type read here and to lie inside the file."""
    data = map_file(path)
    metadata, infos, start = read_header(data, path)
    if metadata.get("general.architecture") != "gpt2":
        raise GGUFError(f"holds a {metadata.get('general.architecture')!r} model; this project runs GPT-2 "
                        "(general.architecture 'gpt2')", path=path)
    tensors = {}
    for name, shape, ggml_type, offset in infos:
        if ggml_type not in TENSOR_TYPES:
            raise GGUFError(f"tensor {name} is of ggml type {ggml_type}; this project reads F32, F16 and Q8_0",
                            path=path)
        if ggml_type == Q8_0 and shape[-1] % QK8_0:
            raise GGUFError(f"tensor {name} is Q8_0 with rows of {shape[-1]} values, not whole blocks", path=path)
        end = start + offset + tensor_nbytes(shape, ggml_type)
        if end > len(data):
            raise GGUFError(f"tensor {name} runs past the end of the file (to byte {end:,} of {len(data):,}): "
                            "the file is truncated", path=path)
        tensors[name] = (shape, ggml_type, start + offset)
    return metadata, tensors, data


def read_hparams(metadata, tensors, path):
    """hparams from gpt2.* and the tensors' shapes (n_vocab: token_embd's rows; the MLP's width:
    ffn_up's, since the converter writes feed_forward_length as 4d whatever the model's is)."""
    def need(key):
        if key not in metadata:
            raise GGUFError(f"lacks the metadata {key}", path=path)
        return metadata[key]

    for name in ("token_embd.weight", "blk.0.ffn_up.weight"):
        if name not in tensors:
            raise GGUFError(f"lacks the tensor {name}", path=path)
    hp = {"n_vocab": tensors["token_embd.weight"][0][0], "n_ctx": need("gpt2.context_length"),
          "n_embd": need("gpt2.embedding_length"), "n_head": need("gpt2.attention.head_count"),
          "n_layer": need("gpt2.block_count")}
    problem = shapes.hparams_problem(hp)
    if problem:
        raise GGUFError(f"metadata {problem}", path=path)
    hp["n_inner"] = tensors["blk.0.ffn_up.weight"][0][0]
    eps = np.float32(metadata.get("gpt2.attention.layer_norm_epsilon", shapes.LAYER_NORM_EPS))
    hp["layer_norm_epsilon"] = float(str(eps))  # float32's shortest decimal: 1e-05 is 1e-5 again
    return hp


def load_gguf(path):
    """-> (hparams, params): every tensor float32 in our names and layouts (an F32 tensor that
    needs no transposing is a read-only view into the file)."""
    file = open_gguf(path)
    hp = read_hparams(file[0], file[1], path)
    flat = {name: read_tensor(file, name, shape, path) for name, shape in shapes.tensor_shapes(hp).items()}
    return hp, shapes.nest(flat, hp["n_layer"])


def read_tensor(file, name, shape, path):
    """Our tensor `name` of the shape hparams give it, from open_gguf's (metadata, tensors, bytes):
    float32, transposed back to Conv1D's [n_in, n_out] where the converter had transposed it."""
    _, tensors, data = file
    theirs = gguf_name(name)
    if theirs not in tensors:
        raise GGUFError(f"lacks the tensor {theirs}", path=path)
    stored, ggml_type, offset = tensors[theirs]
    want = tuple(reversed(shape)) if name.endswith(TRANSPOSED) else tuple(shape)
    if stored != want:
        raise GGUFError(f"tensor {theirs} has shape {list(stored)}, its metadata implies {list(want)}", path=path)
    array = as_float32(data, offset, stored, ggml_type)
    # a copy, not a view of the file: BLAS multiplies a transposed view in another order, and the logits
    # would no longer be the checkpoint's bit for bit (a few ulps off); the untransposed stay mapped
    return np.ascontiguousarray(array.T) if name.endswith(TRANSPOSED) else array


def read_vocabulary(path):
    """-> (tokens, merges): tokenizer.ggml.tokens (id order, in GPT-2's printable spelling) and
    tokenizer.ggml.merges as (left, right) pairs, for bpe.Encoder."""
    metadata = read_header(map_file(path), path)[0]
    if metadata.get("tokenizer.ggml.model") != "gpt2":
        raise GGUFError(f"has tokenizer {metadata.get('tokenizer.ggml.model')!r}; this project reads GPT-2's "
                        "byte-level BPE (tokenizer.ggml.model 'gpt2')", path=path)
    merges = [tuple(m.split(" ")) for m in metadata.get("tokenizer.ggml.merges", [])]
    if any(len(m) != 2 for m in merges):
        raise GGUFError("has a merge that is not two tokens", path=path)
    return metadata.get("tokenizer.ggml.tokens", []), merges


def vocabulary_files(path):
    """OpenAI's two files, {"encoder.json": bytes, "vocab.bpe": bytes}, from a GGUF's tokens and
    merges: what a folder written from a GGUF model holds as its tokenizer."""
    tokens, merges = read_vocabulary(path)
    encoder = json.dumps({token: i for i, token in enumerate(tokens)}, ensure_ascii=False)
    return {"encoder.json": encoder.encode("utf-8"),
            "vocab.bpe": ("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)).encode("utf-8")}
