"""torch.save's file of named tensors (a state dict), read and written with NumPy and the standard library.

Such a file (tuned-lens's params.pt) is a zip archive whose entries are stored, not compressed, in a folder
named after the file (params.pt: params/), in the order torch writes them:

    params/data.pkl                 a pickle (protocol 2): an OrderedDict {name: tensor}, each tensor a call
                                    torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())
                                    whose storage is a persistent id ("storage", torch.FloatStorage, "0", "cpu", numel)
    params/.format_version          "1"
    params/.storage_alignment       "64"
    params/byteorder                "little"
    params/data/0, data/1, ...      each storage's raw bytes (little-endian float32), starting at a multiple of 64
    params/version                  "3\\n"
    params/.data/serialization_id   40 digits: a hash of the entries' names, then of their CRC-32s

The OrderedDict also carries `_metadata`, {module prefix: {"version": 1}}, which nn.Module's load_state_dict reads.

Reading: a pickle can call any function it names, so this one is read by an unpickler that knows four names
(the OrderedDict, the rebuild call, the float storages) and refuses every other in one line: it builds arrays,
and nothing else. Writing: the same bytes torch.save writes (zip records as its miniz writer lays them out, the
pickle opcode for opcode as Python's pickler emits it), so torch.load(..., weights_only=True) reads them.
"""
import io
import os
import pickle
import struct
import zipfile
import zlib
from collections import OrderedDict

import numpy as np

from plumbing.errors import UserError

ALIGNMENT = 64  # every entry's data starts at a multiple of this (torch's kFieldAlignment)
STORAGES = {"FloatStorage": "<f4", "HalfStorage": "<f2", "DoubleStorage": "<f8", "BFloat16Storage": "<u2"}
REBUILD = ("torch._utils", "_rebuild_tensor_v2")


class TorchArchiveError(UserError):
    """A file that is not a tensor archive torch.save wrote, or whose pickle asks for more than tensors."""


# ============================================================================
# Reading
# ============================================================================

class Storage:
    """A persistent id's storage: which entry holds it, its dtype and its length."""

    def __init__(self, dtype, key, numel):
        self.dtype, self.key, self.numel = dtype, key, numel


def as_float32(raw, dtype):
    """A storage's bytes as float32 (bfloat16 is float32's top half)."""
    if dtype == "<u2":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, dtype).astype(np.float32)


def read_state_dict(path):
    """-> ({name: float32 array}, {module prefix: its metadata}) from torch.save's file; a file that is not one,
    or whose pickle names anything but tensors, is a TorchArchiveError (one line)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise TorchArchiveError(f"is not a tensor archive (torch.save's zip): {e}", path=path) from None
    with archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise TorchArchiveError("is not a tensor archive (torch.save's zip): it has no data.pkl", path=path)
        folder = pickles[0][:-len("data.pkl")]

        def storage_bytes(storage):
            try:
                raw = archive.read(f"{folder}data/{storage.key}")
            except KeyError:
                raise TorchArchiveError(f"its pickle names storage {storage.key!r}, which it does not hold",
                                        path=path) from None
            if len(raw) != storage.numel * np.dtype(storage.dtype).itemsize:
                raise TorchArchiveError(f"storage {storage.key} holds {len(raw)} bytes, not {storage.numel} "
                                        "elements", path=path)
            return raw

        try:
            state = TensorUnpickler(io.BytesIO(archive.read(pickles[0])), storage_bytes, path).load()
        except TorchArchiveError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as e:
            raise TorchArchiveError(f"its pickle is not a state dict of tensors ({type(e).__name__}: {e})",
                                    path=path) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, np.ndarray)
                                              for k, v in state.items()):
        raise TorchArchiveError("its pickle is not a state dict: {name: tensor}", path=path)
    return dict(state), dict(getattr(state, "_metadata", None) or {})


class TensorUnpickler(pickle.Unpickler):
    """An unpickler that builds float32 arrays and ordered dicts, and refuses any other name a pickle asks for."""

    def __init__(self, file, storage_bytes, path):
        super().__init__(file)
        self.storage_bytes, self.path = storage_bytes, path

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == REBUILD:
            return self.rebuild_tensor
        if module == "torch" and name in STORAGES:
            return STORAGES[name]
        raise TorchArchiveError(f"its pickle asks for {module}.{name}, which is not a tensor: refused", path=self.path)

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and pid[1] in STORAGES.values()
                and isinstance(pid[2], str) and isinstance(pid[4], int) and pid[4] >= 0):
            raise TorchArchiveError(f"its pickle names a persistent object that is not a storage: {pid!r:.80}",
                                    path=self.path)
        return Storage(pid[1], pid[2], pid[4])

    def rebuild_tensor(self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
        """torch's _rebuild_tensor_v2: the tensor of `size` that reads the storage from `offset` with `stride`."""
        if not (isinstance(storage, Storage) and all(isinstance(n, int) and n >= 0 for n in (offset, *size, *stride))
                and len(size) == len(stride)):
            raise TorchArchiveError("its pickle rebuilds a tensor from arguments that are not a storage, an offset, a "
                                    "size and a stride", path=self.path)
        data = as_float32(self.storage_bytes(storage), storage.dtype)
        extent = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else offset
        if extent > storage.numel:
            raise TorchArchiveError(f"a tensor of size {tuple(size)} reads past its storage of {storage.numel}",
                                    path=self.path)
        view = np.lib.stride_tricks.as_strided(data[offset:], tuple(size), tuple(s * 4 for s in stride))
        return np.array(view)  # a copy of its own, C-ordered


# ============================================================================
# Writing: the pickle, as Python's pickler emits torch's
# ============================================================================

class Pickle:
    """Protocol 2's opcodes, with the pickler's memo: each object it puts is numbered, and met again it is got."""

    def __init__(self):
        self.out, self.memo = bytearray(b"\x80\x02"), {}  # PROTO 2

    def put(self, key=None):
        n = len(self.memo)
        self.memo[key if key is not None else ("anonymous", n)] = n
        self.out += b"q" + bytes([n]) if n < 256 else b"r" + struct.pack("<I", n)  # BINPUT, LONG_BINPUT

    def get(self, key):
        n = self.memo[key]
        self.out += b"h" + bytes([n]) if n < 256 else b"j" + struct.pack("<I", n)  # BINGET, LONG_BINGET

    def memoized(self, key, write):
        """An object the pickler meets more than once (a global, a repeated string): written once, then got."""
        if key in self.memo:
            self.get(key)
        else:
            write()
            self.put(key)

    def global_(self, module, name):
        self.memoized(("global", module, name), lambda: self.out.extend(f"c{module}\n{name}\n".encode()))

    def string(self, text, shared=False):
        """BINUNICODE; a `shared` string is one object wherever it appears ("storage", "cpu", "version")."""
        def write():
            raw = text.encode("utf-8")
            self.out.extend(b"X" + struct.pack("<I", len(raw)) + raw)

        if shared:
            self.memoized(("string", text), write)
        else:
            write()
            self.put()

    def int(self, n):
        if 0 <= n < 256:
            self.out += b"K" + bytes([n])  # BININT1
        elif 0 <= n < 65536:
            self.out += b"M" + struct.pack("<H", n)  # BININT2
        else:
            self.out += b"J" + struct.pack("<i", n)  # BININT

    def tuple(self, items, memo=True):
        """A tuple of what the calls in `items` write: TUPLE1-3, or MARK ... TUPLE."""
        if len(items) in (1, 2, 3):
            for write in items:
                write()
            self.out += {1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(items)]
        elif not items:
            self.out += b")"  # EMPTY_TUPLE: never memoized
            return
        else:
            self.out += b"("
            for write in items:
                write()
            self.out += b"t"
        if memo:
            self.put()

    def ordered_dict(self, items):
        """OrderedDict() by REDUCE, then its items: SETITEMS in batches of 1000, one item alone by SETITEM."""
        self.global_("collections", "OrderedDict")
        self.out += b")R"
        self.put()
        self.items(items)

    def items(self, items):
        for start in range(0, len(items), 1000):
            batch = items[start:start + 1000]
            if len(batch) > 1:
                self.out += b"("
            for write_key, write_value in batch:
                write_key()
                write_value()
            self.out += b"u" if len(batch) > 1 else b"s"


def tensor_pickle(names, shapes, metadata):
    """data.pkl for tensors named `names` of these shapes (C-ordered float32), storage i holding tensor i."""
    p = Pickle()

    def tensor(i, shape):
        def write():
            p.global_(*REBUILD)
            p.out += b"("
            p.tuple([lambda: p.string("storage", shared=True), lambda: p.global_("torch", "FloatStorage"),
                      lambda: p.string(str(i)), lambda: p.string("cpu", shared=True),
                      lambda: p.int(int(np.prod(shape)))])  # the persistent id
            p.out += b"Q"  # BINPERSID
            p.int(0)  # the offset
            strides = [int(np.prod(shape[k + 1:])) for k in range(len(shape))]
            p.tuple([lambda n=n: p.int(n) for n in shape])
            p.tuple([lambda n=n: p.int(n) for n in strides])
            p.out += b"\x89"  # NEWFALSE: requires_grad
            p.ordered_dict([])  # backward hooks
            p.out += b"t"
            p.put()
            p.out += b"R"
            p.put()
        return write

    p.ordered_dict([(lambda n=n: p.string(n), tensor(i, s)) for i, (n, s) in enumerate(zip(names, shapes))])
    def module_metadata(fields):
        def write():
            p.out += b"}"
            p.put()
            p.items([(lambda k=k: p.string(k, shared=True), lambda v=v: p.int(v)) for k, v in fields.items()])
        return write

    p.out += b"}"  # the OrderedDict's state: {"_metadata": OrderedDict(...)}, set by BUILD
    p.put()
    p.items([(lambda: p.string("_metadata"), lambda: p.ordered_dict(
        [(lambda k=k: p.string(k), module_metadata(v)) for k, v in metadata.items()]))])
    p.out += b"b."  # BUILD, STOP
    return bytes(p.out)


# ============================================================================
# Writing: the zip records, as torch's miniz writer lays them out
# ============================================================================

def padding(cursor, name):
    """The local header's extra field that starts an entry's data at a multiple of ALIGNMENT: "FB", the length
    of what follows, then that many Z's (torch always writes the field, its four bytes counted in the alignment)."""
    n = -(cursor + 30 + len(name) + 4) % ALIGNMENT
    return b"FB" + struct.pack("<H", n) + b"Z" * n


def hash_combine(seed, value):
    """c10::hash_combine, as torch folds each entry's CRC-32 into the serialization id (64-bit)."""
    mask = (1 << 64) - 1
    return (seed ^ ((value + 0x9E3779B9 + ((seed << 6) & mask) + (seed >> 2)) & mask)) & mask


def serialization_id(crcs, names_hash):
    """40 digits: the names' hash (torch's is of its C++ library's string hash over an unordered set: given here,
    or a hash of our own), then the entries' CRC-32s combined in the order they were written."""
    combined = 0
    for crc in crcs:
        combined = hash_combine(combined, crc)
    return f"{names_hash:020d}{combined:020d}"


def zip_bytes(folder, records, names_hash=None):
    """The archive: each record (name, bytes) stored after its aligned local header, with a data descriptor; the
    serialization id last; then the central directory and zip64's end records, as miniz writes them."""
    out, central = bytearray(), []
    crcs = []
    if names_hash is None:  # ours: the names' CRC-32s combined, for lack of the C++ library's string hash
        names_hash = 0
        for name, _ in records:
            names_hash = hash_combine(names_hash, zlib.crc32(name.encode()))
        names_hash %= 10 ** 20
    for name, data in records + [(".data/serialization_id", None)]:
        if data is None:
            data = serialization_id(crcs, names_hash).encode()
        full = f"{folder}/{name}".encode()
        crc, offset, extra = zlib.crc32(data), len(out), padding(len(out), full)
        crcs.append(crc)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, 0x0808, 0, 0, 0, 0, 0, 0, len(full), len(extra))
        out += full + extra + data
        out += struct.pack("<IIII", 0x08074B50, crc, len(data), len(data))
        central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, 0x0808, 0, 0, 0, crc, len(data), len(data),
                                   len(full), 0, 0, 0, 0, 0, offset) + full)
    start, directory = len(out), b"".join(central)
    out += directory
    end = len(out)
    n = len(central)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x002D, 0, 0, n, n, len(directory), start)
    out += struct.pack("<IIQI", 0x07064B50, 0, end, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(directory), start, 0)
    return bytes(out)


def archive_bytes(tensors, metadata, folder="archive", names_hash=None):
    """torch.save's bytes for {name: array} (written as float32) with its `_metadata`; folder: the archive's
    name (torch's is the file's name without its extension)."""
    arrays = [np.ascontiguousarray(a, dtype="<f4") for a in tensors.values()]
    records = [("data.pkl", tensor_pickle(list(tensors), [a.shape for a in arrays], metadata)),
               (".format_version", b"1"), (".storage_alignment", str(ALIGNMENT).encode()), ("byteorder", b"little")]
    records += [(f"data/{i}", a.tobytes()) for i, a in enumerate(arrays)]
    return zip_bytes(folder, records + [("version", b"3\n")], names_hash)


def write_state_dict(path, tensors, metadata):
    """torch.save(state_dict, path) without torch: {name: array}, {module prefix: {"version": 1}, ...}."""
    folder = os.path.splitext(os.path.basename(path))[0]
    with open(path, "wb") as f:
        f.write(archive_bytes(tensors, metadata, folder))
