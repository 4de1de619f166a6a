"""plumbing/safetensors_writer.py: the bytes the safetensors library writes, and back through our reader.

tests/data/safetensors_golden.safetensors was written by the safetensors library itself
(tests/data/make_safetensors_golden.py) from the tensors and metadata that script states."""
import importlib.util
import json
import os
import struct

import numpy as np
import pytest

from conftest import DATA
from plumbing import safetensors_reader as st
from plumbing.safetensors_writer import write_safetensors


def golden_script():
    spec = importlib.util.spec_from_file_location("make_safetensors_golden",
                                                  os.path.join(DATA, "make_safetensors_golden.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def test_our_file_is_the_safetensors_librarys_file_byte_for_byte(tmp_path):
    golden = golden_script()
    write_safetensors(tmp_path / "ours.safetensors", golden.golden_tensors(), metadata=golden.METADATA)
    ours, theirs = read_bytes(tmp_path / "ours.safetensors"), read_bytes(golden.GOLDEN)
    n = struct.unpack("<Q", theirs[:8])[0]
    assert ours[8:8 + n].decode() == theirs[8:8 + n].decode()  # the header first, readably
    assert ours == theirs


def test_the_header_is_padded_with_spaces_to_a_multiple_of_8(tmp_path):
    for name in ("w", "ww", "www", "wwww", "wwwww", "wwwwww", "wwwwwww", "wwwwwwww"):
        write_safetensors(tmp_path / "x.safetensors", {name: np.ones(1, np.float32)})
        raw = read_bytes(tmp_path / "x.safetensors")
        n = struct.unpack("<Q", raw[:8])[0]
        assert n % 8 == 0 and len(raw) == 8 + n + 4
        assert raw[8:8 + n].decode().endswith("}" + " " * (n - len(raw[8:8 + n].rstrip())))
        assert json.loads(raw[8:8 + n]) == {name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}


def test_a_round_trip_through_the_reader_gives_every_tensor_back(tmp_path):
    tensors = golden_script().golden_tensors()
    write_safetensors(tmp_path / "x.safetensors", tensors)
    back, converted = st.load_file(tmp_path / "x.safetensors")
    assert sorted(back) == sorted(tensors)
    for name, want in tensors.items():
        got = back[name]
        if want.dtype.kind == "f":
            want = want.astype(np.float32)  # the reader gives the model float32 (float16 exactly)
        assert got.shape == want.shape and got.dtype == want.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got, want)
    assert converted == {"F16", "F64"}


def test_metadata_is_in_the_header_and_none_is_no_entry(tmp_path):
    write_safetensors(tmp_path / "x.safetensors", {})
    assert read_bytes(tmp_path / "x.safetensors") == struct.pack("<Q", 8) + b"{}      "
    write_safetensors(tmp_path / "x.safetensors", {}, metadata={"format": "pt", "é": "✓"})
    raw = read_bytes(tmp_path / "x.safetensors")
    assert json.loads(raw[8:]) == {"__metadata__": {"format": "pt", "é": "✓"}}


def test_a_memory_mapped_tensor_is_streamed_in_pieces(tmp_path, monkeypatch):
    import plumbing.safetensors_writer as writer
    monkeypatch.setattr(writer, "CHUNK", 100)  # 3 rows of 32 bytes a piece
    big = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.float32, shape=(10, 8))
    big[:] = np.arange(80, dtype=np.float32).reshape(10, 8)
    big.flush()
    mapped = np.load(tmp_path / "big.npy", mmap_mode="r")
    pieces = list(writer.little_endian_pieces(mapped))
    assert [p.nbytes for p in pieces] == [96, 96, 96, 32]
    write_safetensors(tmp_path / "x.safetensors", {"big": mapped})
    np.testing.assert_array_equal(st.load_file(tmp_path / "x.safetensors")[0]["big"], big)


def test_ctrl_c_midway_leaves_the_old_file_and_nothing_else(tmp_path, monkeypatch):
    import plumbing.safetensors_writer as writer
    path = tmp_path / "x.safetensors"
    write_safetensors(path, {"w": np.ones(2, np.float32)})
    before = read_bytes(path)
    pieces = writer.little_endian_pieces

    def interrupted(array):  # the header and the first tensor are written, then Ctrl-C
        yield from pieces(array)
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "little_endian_pieces", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_safetensors(path, {"w": np.zeros(2, np.float32), "v": np.ones(3, np.float32)})
    assert read_bytes(path) == before and os.listdir(tmp_path) == ["x.safetensors"]


def test_what_the_format_cannot_hold_is_refused_as_a_bug(tmp_path):
    with pytest.raises(TypeError, match="not complex64"):
        write_safetensors(tmp_path / "x.safetensors", {"w": np.ones(2, np.complex64)})
    with pytest.raises(TypeError, match="str to str"):
        write_safetensors(tmp_path / "x.safetensors", {"w": np.ones(2, np.float32)}, metadata={"n": 1})
    assert os.listdir(tmp_path) == []


def test_an_unwritable_place_is_one_line_naming_the_file(tmp_path):
    with pytest.raises(st.SafetensorsError, match="cannot write the safetensors file") as e:
        write_safetensors(tmp_path / "no" / "x.safetensors", {"w": np.ones(2, np.float32)})
    assert e.value.path == tmp_path / "no" / "x.safetensors"
