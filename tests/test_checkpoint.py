"""checkpoint.py: reading TensorFlow checkpoints without TensorFlow: format, integrity, and corrupt files."""
import io
import json
import os
import random
import shutil
import struct

import numpy as np
import pytest

from conftest import checkpoint_dir, expected_tensors
from plumbing import checkpoint, shapes
from plumbing.checkpoint import CheckpointError


# --- the format ---------------------------------------------------------------------------

@pytest.mark.parametrize("value, encoded", [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"),
                                            (300, b"\xac\x02"), (2**63, b"\x80" * 9 + b"\x01")])
def test_read_varint(value, encoded):
    assert checkpoint.read_varint(encoded + b"rest", 0) == (value, len(encoded))


def test_footer_has_the_magic_and_two_handles():
    with open(os.path.join(checkpoint_dir("tiny"), "model.ckpt.index"), "rb") as f:
        buf = f.read()
    (meta_offset, meta_size), (index_offset, index_size) = checkpoint.read_footer(buf)
    assert struct.unpack("<II", buf[-8:]) == (0x8B80FB57, 0xDB477524)
    assert list(checkpoint.block_entries(checkpoint.read_block(buf, (meta_offset, meta_size)))) == []  # empty metaindex
    assert index_offset + index_size + 5 + 48 == len(buf)


@pytest.mark.parametrize("name", ["tiny", "odd", "many"])
def test_load_checkpoint_reproduces_what_tensorflow_was_given(name):
    hp, params = checkpoint.load_checkpoint(checkpoint_dir(name))
    want = expected_tensors(name)
    got = {f"model/{name}": a[None] if name.endswith("/w") else a  # weights are stored [1, n_in, n_out]
           for name, a in shapes.flatten(params).items()}
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == np.float32 and np.array_equal(got[key], want[key]), key


def test_tensors_are_read_only_views_into_the_data_file():
    _, params = checkpoint.load_checkpoint(checkpoint_dir("tiny"))
    w = params["blocks"][0]["attn"]["c_attn"]["w"]
    assert isinstance(params["wte"], np.memmap) and isinstance(w, np.memmap)
    assert not params["wte"].flags.writeable and not w.flags.writeable
    assert w.shape == (8, 24) and w.flags.c_contiguous


def test_many_variables_span_several_index_data_blocks():
    with open(os.path.join(checkpoint_dir("many"), "model.ckpt.index"), "rb") as f:
        buf = f.read()
    _, index_handle = checkpoint.read_footer(buf)
    assert len(list(checkpoint.block_entries(checkpoint.read_block(buf, index_handle)))) >= 2
    hp, params = checkpoint.load_checkpoint(checkpoint_dir("many"))
    assert hp["n_layer"] == len(params["blocks"]) == 800


@pytest.mark.parametrize("name", ["tiny", "odd", "many"])
def test_verify_accepts_a_good_checkpoint(name):
    assert checkpoint.verify_checkpoint(checkpoint_dir(name)) == os.path.getsize(
        os.path.join(checkpoint_dir(name), "model.ckpt.data-00000-of-00001"))


# --- bad checkpoints --------------------------------------------------------------------

@pytest.fixture
def tiny_copy(tmp_path):
    folder = tmp_path / "tiny"
    shutil.copytree(checkpoint_dir("tiny"), folder)
    return folder


def test_a_flipped_byte_in_the_data_file_is_caught_by_verify(tiny_copy):
    path = tiny_copy / "model.ckpt.data-00000-of-00001"
    data = bytearray(path.read_bytes())
    data[123_457] ^= 0x10
    path.write_bytes(bytes(data))
    checkpoint.load_checkpoint(str(tiny_copy))  # loading does not read the data
    with pytest.raises(CheckpointError, match="checksum mismatch in model/"):
        checkpoint.verify_checkpoint(str(tiny_copy))


def test_a_truncated_data_file_is_named(tiny_copy):
    path = tiny_copy / "model.ckpt.data-00000-of-00001"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="data-00000-of-00001: too short"):
        checkpoint.load_checkpoint(str(tiny_copy))


def test_hparams_that_do_not_match_the_tensors(tiny_copy):
    (tiny_copy / "hparams.json").write_text('{"n_vocab": 50257, "n_ctx": 64, "n_embd": 8, "n_head": 2, "n_layer": 3}')
    with pytest.raises(CheckpointError, match="missing tensor model/h2/"):
        checkpoint.load_checkpoint(str(tiny_copy))
    (tiny_copy / "hparams.json").write_text('{"n_vocab": 50257, "n_ctx": 64, "n_embd": 8, "n_head": 2, "n_layer": 1}')
    with pytest.raises(CheckpointError, match="unexpected tensor model/h1/"):
        checkpoint.load_checkpoint(str(tiny_copy))
    (tiny_copy / "hparams.json").write_text('{"n_vocab": 50000, "n_ctx": 64, "n_embd": 8, "n_head": 2, "n_layer": 2}')
    with pytest.raises(CheckpointError, match=r"model/wte has shape \(50257, 8\), expected \(50000, 8\)"):
        checkpoint.load_checkpoint(str(tiny_copy))


@pytest.mark.parametrize("text, message", [
    ("{", "not valid JSON"),
    ('{"n_vocab": 10}', "positive integers"),
    ('{"n_vocab": 1, "n_ctx": 1, "n_embd": 5, "n_head": 2, "n_layer": 1}', "not a multiple"),
])
def test_bad_hparams(tiny_copy, text, message):
    (tiny_copy / "hparams.json").write_text(text)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load_checkpoint(str(tiny_copy))


def test_missing_files_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="hparams.json"):
        checkpoint.load_checkpoint(str(tmp_path))
    shutil.copy(os.path.join(checkpoint_dir("tiny"), "hparams.json"), tmp_path)
    with pytest.raises(CheckpointError, match="model.ckpt.index"):
        checkpoint.load_checkpoint(str(tmp_path))


def test_not_a_checkpoint(tiny_copy):
    (tiny_copy / "model.ckpt.index").write_text("<html>Not Found</html>" * 10)
    with pytest.raises(CheckpointError, match="model.ckpt.index: bad magic"):
        checkpoint.load_checkpoint(str(tiny_copy))


def test_1000_random_corruptions_of_the_index_load_identically_or_raise_checkpoint_error(tiny_copy):
    index_path = tiny_copy / "model.ckpt.index"
    original = index_path.read_bytes()
    want = checkpoint.open_tensors(checkpoint_dir("tiny"), checkpoint.read_hparams(checkpoint_dir("tiny")))[0]
    rng = random.Random(1234)
    outcomes = {"identical": 0, "error": 0}
    for trial in range(1000):
        data = bytearray(original)
        kind = trial % 3
        if kind == 0:  # flip 1-4 bits
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncate
            del data[rng.randrange(len(data)):]
        else:  # insert 1-8 random bytes
            at = rng.randrange(len(data) + 1)
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        index_path.write_bytes(bytes(data))
        try:
            got = checkpoint.open_tensors(str(tiny_copy), checkpoint.read_hparams(str(tiny_copy)))[0]
        except CheckpointError as e:
            assert str(e) and "\n" not in str(e)
            outcomes["error"] += 1
            continue
        assert got.keys() == want.keys(), trial
        assert all(np.array_equal(got[k], want[k]) for k in want), trial
        outcomes["identical"] += 1
    assert outcomes["error"] > 900  # nearly every corruption is caught, by the block checksums above all


# --- writing: the reader's mirror ---------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny", "odd", "many"])
def test_the_writer_gives_tensorflows_own_bytes_for_the_same_tensors(name):
    """make_checkpoints.py gave TensorFlow these arrays; we write the same index and data, byte for byte."""
    buf = io.BytesIO()
    index, data = checkpoint.write_data(buf, expected_tensors(name)), buf.getvalue()
    with open(os.path.join(checkpoint_dir(name), "model.ckpt.index"), "rb") as f:
        assert index == f.read()
    with open(os.path.join(checkpoint_dir(name), "model.ckpt.data-00000-of-00001"), "rb") as f:
        assert data == f.read()


def test_the_writer_streams_a_tensor_at_a_time():
    """write_data never joins the data in memory: each write is one tensor, so a 1558M save holds no second copy."""
    sizes = []

    class Recorder(io.BytesIO):
        def write(self, b):
            sizes.append(len(memoryview(b).cast("B")))
            return super().write(b)

    tensors = expected_tensors("many")
    f = Recorder()
    checkpoint.write_data(f, tensors)
    assert sorted(sizes) == sorted(a.astype("<f4").nbytes for a in tensors.values())
    with open(os.path.join(checkpoint_dir("many"), "model.ckpt.data-00000-of-00001"), "rb") as data:
        assert f.getvalue() == data.read()


def test_loading_what_was_written_gives_the_params_back(tmp_path):
    hp, params = checkpoint.load_checkpoint(checkpoint_dir("odd"))
    changed = shapes.nest({k: (a * 2 + 1).astype(np.float32) for k, a in shapes.flatten(params).items()}, hp["n_layer"])
    folder = checkpoint.write_checkpoint(str(tmp_path / "out"), changed, hp)
    hp2, again = checkpoint.load_checkpoint(folder)
    assert hp2 == hp
    want, got = shapes.flatten(changed), shapes.flatten(again)
    assert list(want) == list(got) and all(np.array_equal(want[k], got[k]) for k in want)
    assert checkpoint.verify_checkpoint(folder) == sum(a.nbytes for a in want.values())
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary folder left


def test_writing_over_a_checkpoint_replaces_it_whole_or_not_at_all(tmp_path):
    hp, params = checkpoint.load_checkpoint(checkpoint_dir("odd"))
    folder = checkpoint.write_checkpoint(str(tmp_path / "out"), params, hp)
    before = {f: open(os.path.join(folder, f), "rb").read() for f in os.listdir(folder)}
    with pytest.raises(CheckpointError, match="cannot write the checkpoint"):  # the vocabulary to copy is missing
        checkpoint.write_checkpoint(folder, params, hp, vocab_dir=str(tmp_path / "no such folder"))
    assert {f: open(os.path.join(folder, f), "rb").read() for f in os.listdir(folder)} == before
    assert sorted(os.listdir(tmp_path)) == ["out"]
    doubled = shapes.nest({k: a * 2 for k, a in shapes.flatten(params).items()}, hp["n_layer"])
    checkpoint.write_checkpoint(folder, doubled, hp)
    assert np.array_equal(checkpoint.load_checkpoint(folder)[1]["wte"], params["wte"] * 2)
    assert sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**35, 2**63])
def test_varint_is_read_varints_inverse(value):
    assert checkpoint.read_varint(checkpoint.varint(value), 0) == (value, len(checkpoint.varint(value)))


def test_one_rule_for_hparams_json_wherever_it_is_read(tmp_path):
    from plumbing import model_files
    from plumbing import shapes
    from plumbing.checkpoint import read_hparams
    good = {"n_vocab": 10, "n_ctx": 8, "n_embd": 6, "n_head": 2, "n_layer": 1}
    assert shapes.hparams_problem(good) is None
    for bad, problem in [({**good, "n_head": 4}, "has n_embd 6, not a multiple of n_head 4"),
                         ({**good, "n_ctx": 0}, "needs positive integers n_vocab, n_ctx, n_embd, n_head, n_layer"),
                         ({**good, "n_layer": True}, "needs positive integers"), ([1], "needs positive integers")]:
        assert shapes.hparams_problem(bad).startswith(problem)
        (tmp_path / "hparams.json").write_text(json.dumps(bad))
        with pytest.raises(CheckpointError, match=problem):
            read_hparams(str(tmp_path))
        with pytest.raises(model_files.BadFile, match="it " + problem):
            model_files.check_hparams(str(tmp_path / "hparams.json"), None)
