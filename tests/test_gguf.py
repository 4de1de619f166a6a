"""GGUF, llama.cpp's file: Q8_0 against gguf-py, our files against the bytes of llama.cpp's own
converter, our reader against transformers' GGUF loader, and every command reading FILE.gguf.
The goldens come from tests/data/gguf/make_gguf_golden.py (llama.cpp's converter, gguf-py 0.19.0,
transformers 5.24), dev-only."""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import DATA, ROOT, VOCAB

import bpe
import convert
import gpt2_numpy as g
from plumbing import gguf, gguf_writer, shapes
from plumbing.gguf import GGUFError
from plumbing.weights import load_weights

GGUF_DATA = os.path.join(DATA, "gguf")
sys.path.insert(0, GGUF_DATA)
import fixture  # noqa: E402  the 12-layer fixture, made as make_gguf_golden.py made it

with open(os.path.join(GGUF_DATA, "gguf_golden.json"), encoding="utf-8") as f:
    GOLDEN, NAMES = (lambda golden: (golden["files"], golden["names"]))(json.load(f))
LOGITS = np.load(os.path.join(GGUF_DATA, "gguf_logits.npz"))
SHAKESPEARE = os.path.join(DATA, "shakespeare")
COLUMNS = 97  # the goldens keep every 97th logit


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """fixture -> (the model's folder, the name the converter saw it under)."""
    twelve = fixture.write(str(tmp_path_factory.mktemp("twelve") / fixture.NAME))
    return {"twelve": (twelve, fixture.NAME), "shakespeare": (SHAKESPEARE, "shakespeare")}


@pytest.fixture(scope="module")
def files(sources, tmp_path_factory):
    """(fixture, type) -> our GGUF file, written by convert.convert under the converter's name."""
    out = {}
    for name, (folder, stem) in sources.items():
        for t in convert.GGUF_TYPES:
            path = str(tmp_path_factory.mktemp(f"{name}-{t}") / f"{stem}.gguf")
            out[name, t] = convert.convert(folder, path, "gguf", t)
    return out


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# --- Q8_0 -----------------------------------------------------------------------------------------

def test_a_q8_0_block_is_its_definition():
    x = np.array([0.5, -1.27, 0.0, 0.3175] + [0.01] * 28, dtype=np.float32)
    d, q = gguf.quantize_block(x)
    assert d == np.float16(np.float32(1.27) / np.float32(127)) and q.dtype == np.int8
    assert q[1] == -127 and q[2] == 0 and q[0] == 50 and q[3] == 32  # 31.75 rounds away from zero
    assert np.all(np.abs(gguf.dequantize_block(d, q) - x) <= np.float32(d) / 2 * 1.01)
    assert gguf.round_half_away(np.float32([2.5, -2.5, 0.49999997, 1.5]).astype(np.float32)).tolist() == [3, -3, 0, 2]


def float32_ties(d, count):
    """Values x whose x·(1/d) is exactly k + 0.5 in float32 (1/d in float32, as quantize_block computes
    it), k even and odd, positive and negative: -> (x [count], k + 0.5 [count])."""
    inverse = np.float32(1) / d
    xs = [(x, k + 0.5) for k in range(-126, 126) if (x := np.float32((k + 0.5) * np.float64(d))) * inverse == k + 0.5]
    assert {int(np.floor(h)) % 2 for _, h in xs} == {0, 1} and min(h for _, h in xs) < 0 < max(h for _, h in xs)
    picks = np.linspace(0, len(xs) - 1, count).astype(int)
    return np.float32([xs[i][0] for i in picks]), np.float64([xs[i][1] for i in picks])


@pytest.mark.parametrize("largest", [127.0, 1.27, 3e-3])
def test_a_q8_0_tie_rounds_away_from_zero(largest):
    """ggml rounds with roundf: x·(1/d) = k + 0.5 goes to k + 1 above zero and k below, never to the even
    one as np.round does (2.5 -> 3, -2.5 -> -3). The block's d = largest / 127 (d = 1 when largest is 127)."""
    d = np.float32(largest) / np.float32(127)
    ties, halves = float32_ties(d, 31)
    _, q = gguf.quantize_block(np.r_[np.float32(largest), ties])
    assert q[1:].tolist() == [int(h + 0.5) if h > 0 else int(h - 0.5) for h in halves]


def test_a_q8_0_block_multiplies_by_float32_1_over_d():
    """ggml computes id = 1/d in float32 and rounds x·id: values (found here) where x / d would round the
    other way come out as x·id does. And a block comes back as q · d in float32 (q · d in float16 rounds)."""
    d = np.float32(1.27) / np.float32(127)
    inverse = np.float32(1) / d
    near = [x for k in range(-126, 126) for s in (-1, 0, 1)
            if (x := np.nextafter(np.float32((k + 0.5) * np.float64(d)), np.float32(s * np.inf)) if s else
                np.float32((k + 0.5) * np.float64(d))) and np.sign(x) * np.floor(abs(float(x * inverse)) + 0.5)
            != np.sign(x) * np.floor(abs(float(np.float32(x / d))) + 0.5)][:31]
    assert len(near) == 31
    x = np.r_[np.float32(1.27), np.float32(near)]
    d16, q = gguf.quantize_block(x)
    assert q.tolist() == [int(np.sign(v) * np.floor(abs(float(v * inverse)) + 0.5)) for v in x]
    q = np.int8([127, -127, 113, -101, 99, 1, -1, 0] * 4)
    d16 = np.uint16(0x1BFF).view(np.float16)  # 0.0039: every bit of the mantissa set, so q · d needs 18 bits
    assert gguf.dequantize_block(d16, q).tolist() == [float(v) * float(d16) for v in q.tolist()]


def test_q8_0_blocks_are_gguf_pys_on_awkward_rows():
    golden = np.load(os.path.join(GGUF_DATA, "q8_0_rows.npz"))
    rows, blocks = golden["rows"], golden["blocks"]
    with np.errstate(over="ignore", invalid="ignore"):  # a huge block's scale is infinity in float16, as in gguf-py
        assert np.array_equal(gguf.quantize_q8_0(rows), blocks)  # the plain form, block by block
        assert np.array_equal(gguf.quantize_q8_0_fast(rows), blocks)
        back = gguf.dequantize_q8_0(blocks, rows.shape[1])
        assert np.array_equal(gguf.dequantize_q8_0_fast(blocks, rows.shape[1]), back, equal_nan=True)


def test_the_fast_q8_0_equals_the_plain_one_on_random_rows():
    x = (np.random.default_rng(1).standard_normal((7, 96)) * np.logspace(-3, 3, 7)[:, None]).astype(np.float32)
    assert np.array_equal(gguf.quantize_q8_0_fast(x), gguf.quantize_q8_0(x))
    raw = gguf.quantize_q8_0(x)
    assert np.array_equal(gguf.dequantize_q8_0_fast(raw, 96), gguf.dequantize_q8_0(raw, 96))


# --- the converter's bytes --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["twelve", "shakespeare"])
@pytest.mark.parametrize("gguf_type", ["f32", "f16", "q8_0"])
def test_our_file_is_the_converters_byte_for_byte(files, name, gguf_type):
    path = files[name, gguf_type]
    assert os.path.getsize(path) == GOLDEN[f"{name}/{gguf_type}"]["bytes"]
    assert sha256(path) == GOLDEN[f"{name}/{gguf_type}"]["sha256"]


def test_the_converters_order_types_and_metadata(files):
    metadata, tensors, _ = gguf.open_gguf(files["twelve", "q8_0"])
    names = list(tensors)
    assert names.index("blk.10.attn_qkv.bias") < names.index("blk.2.attn_qkv.bias") and names[-1] == "token_embd.weight"
    types = {n: t for n, (_, t, _) in tensors.items()}
    assert types["blk.0.ffn_down.weight"] == gguf.Q8_0  # rows of 64: whole blocks
    assert types["blk.0.ffn_up.weight"] == types["token_embd.weight"] == gguf.F16  # rows of 16: float16
    assert types["position_embd.weight"] == types["blk.0.attn_norm.weight"] == gguf.F32
    assert (metadata["general.name"], metadata["general.basename"], metadata["general.version"]) == (
        "Twelve Layers v2", "twelve-layers", "v2")
    assert metadata["gpt2.feed_forward_length"] == 64 and metadata["tokenizer.ggml.pre"] == "gpt-2"
    assert metadata["tokenizer.ggml.token_type"][50256] == gguf.TOKEN_CONTROL
    assert metadata["tokenizer.ggml.bos_token_id"] == metadata["tokenizer.ggml.eos_token_id"] == 50256


# --- reading ---------------------------------------------------------------------------------------

def logits_of(model, ids):
    hparams, params = load_weights(model)
    return g.gpt2(ids, params, hparams)


@pytest.mark.parametrize("name", ["twelve", "shakespeare"])
def test_f32_reads_back_to_the_models_logits_bit_for_bit(files, sources, name):
    ids = LOGITS[f"ids {name}"].tolist()
    assert np.array_equal(logits_of(files[name, "f32"], ids), logits_of(sources[name][0], ids))


def test_f16_reads_back_as_the_model_rounded_to_float16(files, sources):
    hparams, params = load_weights(sources["twelve"][0])
    flat = shapes.flatten(params)
    rounded = {n: a.astype(np.float16).astype(np.float32) if a.ndim == 2 and n != "wpe" else a for n, a in flat.items()}
    ids = LOGITS["ids twelve"].tolist()
    want = g.gpt2(ids, shapes.nest(rounded, hparams["n_layer"]), hparams)
    assert np.array_equal(logits_of(files["twelve", "f16"], ids), want)


@pytest.mark.parametrize("name", ["twelve", "shakespeare"])
def test_transformers_gguf_loader_reads_our_f32_file_to_our_logits(files, name):
    ids = LOGITS[f"ids {name}"].tolist()
    ours = logits_of(files[name, "f32"], ids)[:, ::COLUMNS]
    np.testing.assert_allclose(ours, LOGITS[f"transformers reading our {name}/f32"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("gguf_type", ["f16", "q8_0"])
def test_our_reader_on_the_converters_files_gives_transformers_logits(gguf_type):
    ids = LOGITS["ids shakespeare"].tolist()
    ours = logits_of(os.path.join(GGUF_DATA, f"converter_shakespeare_{gguf_type}.gguf"), ids)
    theirs = LOGITS[f"transformers reading the converter's shakespeare/{gguf_type}"]
    np.testing.assert_allclose(ours[:, ::COLUMNS], theirs, atol=1e-5, rtol=0)


def test_f32_tensors_are_memory_mapped_and_read_only(files):
    _, params = load_weights(files["twelve", "f32"])
    for array in (params["wte"], params["blocks"][0]["ln_1"]["g"]):
        assert not array.flags.owndata and not array.flags.writeable


def test_the_files_tokenizer_gives_the_projects_ids(files):
    text = "Hello, world! It's 2026: naïve café, 東京, emoji 🚀 and\n\n  spaces<|endoftext|>"
    ours, theirs = bpe.get_encoder(VOCAB), bpe.get_encoder(files["twelve", "q8_0"])
    assert theirs.encode(text, allowed_special="all") == ours.encode(text, allowed_special="all")
    assert theirs.eot == 50256 and theirs.decode(ours.encode(text)) == text


def test_a_gguf_converts_back_to_the_same_gguf_and_to_both_folders(files, tmp_path):
    again = convert.convert(files["shakespeare", "q8_0"], str(tmp_path / "shakespeare.gguf"), "gguf", "f32")
    assert np.array_equal(logits_of(again, [1, 2, 3]), logits_of(files["shakespeare", "q8_0"], [1, 2, 3]))
    (tmp_path / "copy").mkdir()
    same = convert.convert(files["shakespeare", "f32"], str(tmp_path / "copy" / "shakespeare.gguf"), "gguf", "f32")
    assert sha256(same) == GOLDEN["shakespeare/f32"]["sha256"]
    for to in ("hf", "openai"):
        out = convert.convert(files["shakespeare", "f32"], str(tmp_path / to), to)
        assert np.array_equal(logits_of(out, [5, 6, 7]), logits_of(SHAKESPEARE, [5, 6, 7]))
        assert bpe.get_encoder(out).encode("ROMEO: what?") == bpe.get_encoder(SHAKESPEARE).encode("ROMEO: what?")


def test_a_hugging_face_folder_converts_to_the_same_bytes_named_after_the_folder(tmp_path):
    """llama.cpp's converter names the model after the folder it converts, whatever OUT is called."""
    hf = convert.convert(SHAKESPEARE, str(tmp_path / "shakespeare"), "hf")
    for gguf_type in convert.GGUF_TYPES:
        out = convert.convert(hf, str(tmp_path / f"any-name-{gguf_type}.gguf"), "gguf", gguf_type)
        assert sha256(out) == GOLDEN[f"shakespeare/{gguf_type}"]["sha256"]
    other = convert.convert(convert.convert(hf, str(tmp_path / "gpt2-44K-bard-v1"), "hf"), str(tmp_path / "o.gguf"),
                            "gguf")
    metadata = gguf.open_gguf(other)[0]
    assert [metadata.get(f"general.{k}") for k in ("name", "basename", "finetune", "version", "size_label")] == [
        "Gpt2 44K Bard v1", "gpt2", "bard", "v1", "44K"]


def test_to_gguf_out_must_end_in_gguf_and_a_file_given_as_model_is_told_of_gguf(tmp_path):
    r = run("convert.py", SHAKESPEARE, str(tmp_path / "model.bin"), "--to", "gguf")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "give OUT a name that ends in .gguf" in r.stderr
    assert not os.path.exists(tmp_path / "model.bin")
    (tmp_path / "model.bin").write_bytes(b"GGUF")
    r = run("gpt2_numpy.py", "--model", str(tmp_path / "model.bin"), "hi")
    assert r.returncode == 2 and "is not a folder" in r.stderr and "a GGUF file (FILE.gguf)" in r.stderr


@pytest.mark.parametrize("name", sorted(NAMES))
def test_the_name_and_its_parts_are_gguf_pys_reading_of_the_folders_name(name):
    total, title, basename, finetune, version, size_label = NAMES[name]
    keys = dict((k, v) for k, _, v in gguf_writer.general_metadata(name, total))
    assert [keys.get(f"general.{k}") for k in ("name", "basename", "finetune", "version", "size_label")] == [
        title, basename, finetune, version, size_label]


# --- every command takes FILE.gguf ------------------------------------------------------------------

def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_generate_evaluate_train_and_circuits_take_a_gguf(files, tmp_path):
    model = files["shakespeare", "q8_0"]
    text = tmp_path / "text.txt"
    text.write_text(open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8").read()[:3000])
    r = run("gpt2_numpy.py", "--model", model, "--greedy", "--n-tokens", "5", "ROMEO:")
    assert r.returncode == 0 and r.stdout.startswith("ROMEO:"), r.stderr
    r = run("evaluate.py", "perplexity", "--model", model, str(text), "--limit", "200", "--context", "32")
    assert r.returncode == 0 and "perplexity" in r.stdout.lower(), r.stderr
    r = run("train.py", "--model", model, "--data", str(text), "--out", str(tmp_path / "run"), "--steps", "2",
            "--batch-size", "2", "--context", "16", "--warmup", "1", "--eval-every", "2", "--sample-every", "2",
            "--save-every", "2", "--quiet")
    assert r.returncode == 0 and os.path.exists(tmp_path / "run" / "hparams.json"), r.stderr
    r = run("circuits.py", "logit-diff", "--clean", "ROMEO: I will", "--answer", " the", "--wrong", " a", "--model",
            model, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["tokens"][-1] == " will", r.stderr


# --- bad files and bad input ------------------------------------------------------------------------

def patched(tmp_path, source, at, new):
    raw = bytearray(open(source, "rb").read())
    raw[at:at + len(new)] = new
    path = tmp_path / f"bad-{at}.gguf"
    path.write_bytes(bytes(raw))
    return str(path)


def tensor_type_offset(path, name):
    """Where a tensor info's ggml type lies in the file."""
    raw = open(path, "rb").read()
    at = raw.index(struct.pack("<Q", len(name)) + name.encode()) + 8 + len(name)
    n_dims = struct.unpack_from("<I", raw, at)[0]
    return at + 4 + 8 * n_dims


def test_bad_files_are_one_line_errors(files, tmp_path):
    good = files["shakespeare", "q8_0"]
    size = os.path.getsize(good)
    arch = open(good, "rb").read().index(b"gpt2")
    cases = [(patched(tmp_path, good, 0, b"GGML"), "is not a GGUF file"),
             (patched(tmp_path, good, 4, struct.pack("<I", 4)), "is GGUF version 4"),
             (patched(tmp_path, good, arch, b"gptj"), "holds a 'gptj' model"),
             (patched(tmp_path, good, tensor_type_offset(good, "token_embd.weight"), struct.pack("<I", 2)),
              "tensor token_embd.weight is of ggml type 2"),
             (patched(tmp_path, good, 16, struct.pack("<Q", 1000)), "is truncated"),
             ]
    for path, message in cases:
        with pytest.raises(GGUFError, match=message):
            load_weights(path)
    version_2 = patched(tmp_path, good, 4, struct.pack("<I", 2))  # the same layout but for big-endian files
    assert np.array_equal(logits_of(version_2, [1, 2]), logits_of(good, [1, 2]))
    short = tmp_path / "short.gguf"
    short.write_bytes(open(good, "rb").read()[:size - 100])
    with pytest.raises(GGUFError, match="tensor token_embd.weight runs past the end of the file"):
        load_weights(str(short))
    short.write_bytes(open(good, "rb").read()[:200])
    with pytest.raises(GGUFError, match="is truncated: it ends inside"):
        load_weights(str(short))
    r = run("gpt2_numpy.py", "--model", str(short), "ROMEO:")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is truncated" in r.stderr, r.stderr
    r = run("gpt2_numpy.py", "--model", str(tmp_path / "missing.gguf"), "ROMEO:")
    assert r.returncode == 2 and "no such GGUF file" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_vocabulary_without_endoftext_is_refused_and_nothing_is_written(tmp_path):
    folder = shutil.copytree(SHAKESPEARE, tmp_path / "model")
    encoder = json.loads((folder / "encoder.json").read_text(encoding="utf-8"))
    del encoder["<|endoftext|>"]
    (folder / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
    r = run("convert.py", str(folder), str(tmp_path / "out.gguf"), "--to", "gguf")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "has no <|endoftext|>" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_gguf_type_needs_to_gguf_and_out_must_be_new(files, tmp_path):
    r = run("convert.py", SHAKESPEARE, str(tmp_path / "out"), "--to", "hf", "--gguf-type", "q8_0")
    assert r.returncode == 2 and "--gguf-type goes with --to gguf" in r.stderr, r.stderr
    r = run("convert.py", SHAKESPEARE, files["shakespeare", "f32"], "--to", "gguf")
    assert r.returncode == 2 and "already exists: choose a new file for OUT" in r.stderr, r.stderr


def test_ctrl_c_while_writing_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_writer, "tensor_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert.convert(SHAKESPEARE, str(tmp_path / "out.gguf"), "gguf", "q8_0")
    assert os.listdir(tmp_path) == []


DEV_PYTHON = os.environ.get("GPT2_DEV_PYTHON", "")
LLAMA_CPP = os.environ.get("LLAMA_CPP", "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp")


@pytest.mark.skipif(not DEV_PYTHON or not os.path.isdir(LLAMA_CPP),
                    reason="needs torch, transformers and llama.cpp's converter: set GPT2_DEV_PYTHON to a python that "
                           "has them and LLAMA_CPP to the converter's folder (tests/data/gguf/make_gguf_golden.py says "
                           "how), then python -m pytest -q tests/test_gguf.py -k live")
def test_live_converter_writes_the_goldens_bytes_again():
    """make_gguf_golden.py --check: the converter run again on both fixtures, every type, against our goldens."""
    r = subprocess.run([DEV_PYTHON, os.path.join(GGUF_DATA, "make_gguf_golden.py"), "--check"], capture_output=True,
                       text=True, timeout=1800,
                       env={**os.environ, "LLAMA_CPP": LLAMA_CPP, "PROJECT_PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr[-3000:]
    assert sum(line.startswith("ok ") for line in r.stdout.splitlines()) == 6, r.stdout


# --- llama.cpp itself (tests/data/gguf/make_llamacpp_golden.py) -------------------------------------

with open(os.path.join(GGUF_DATA, "llamacpp_golden.json"), encoding="utf-8") as f:
    LLAMA_RUNS = json.load(f)["runs"]
LLAMA_LOGITS = np.load(os.path.join(GGUF_DATA, "llamacpp_logits.npz"))
LLAMA_FILES = {"f32": None, "f16": "converter_shakespeare_f16.gguf", "q8_0": "converter_shakespeare_q8_0.gguf"}
# how far llama.cpp's logits are from ours, as a fraction of the largest (measured: 6.7e-4, 2.0e-4, 6.7e-4,
# 1.7e-2): it looks GELU up in a float16 table; flash attention, its default on a CPU, rounds K and V to
# float16 whatever the cache's type; and under Q8_0 it rounds the activations to 8 bits too
LLAMA_TOLERANCE = {"f32/default": 1e-3, "f32/f32-cache-no-flash": 3e-4, "f16/default": 1e-3, "q8_0/default": 2.5e-2}


@pytest.mark.parametrize("run", list(LLAMA_TOLERANCE))
def test_llama_cpp_tokenizes_and_computes_as_we_do_within_its_float16_rounding(files, run):
    kind = run.split("/")[0]
    path = files["shakespeare", "f32"] if LLAMA_FILES[kind] is None else os.path.join(GGUF_DATA, LLAMA_FILES[kind])
    hparams, params = load_weights(path)
    encoder = bpe.get_encoder(path)
    for n, (prompt, theirs) in enumerate(LLAMA_RUNS[run].items()):
        ids = encoder.encode(prompt, allowed_special="all")
        assert ids == theirs["ids"], prompt
        ours = g.gpt2(np.array(ids), params, hparams)[:, ::3]
        expected = LLAMA_LOGITS[f"{run}/{n}"]
        assert np.abs(ours - expected).max() <= LLAMA_TOLERANCE[run] * np.abs(expected).max(), (run, prompt)


@pytest.mark.parametrize("run", list(LLAMA_TOLERANCE))
def test_llama_cpps_greedy_ids_are_ours_until_a_near_tie(files, run):
    """Greedy, step by step: the same id, unless our two best are nearer than the tolerance allows
    (after which the texts may part: nothing more is compared). Only Q8_0 parts, at a margin of 0.04."""
    kind = run.split("/")[0]
    path = files["shakespeare", "f32"] if LLAMA_FILES[kind] is None else os.path.join(GGUF_DATA, LLAMA_FILES[kind])
    hparams, params = load_weights(path)
    parted = 0
    for theirs in LLAMA_RUNS[run].values():
        ids = list(theirs["ids"])
        for expected in theirs["greedy"]:
            logits = g.gpt2(np.array(ids), params, hparams)[-1]
            best, second = np.sort(logits)[-2:][::-1]
            if int(logits.argmax()) != expected:
                assert best - second <= 2 * LLAMA_TOLERANCE[run] * np.abs(logits).max(), (run, ids)
                parted += 1
                break
            ids.append(expected)
    assert parted <= (1 if kind == "q8_0" else 0)


LLAMA_CPP_LIB = os.environ.get("LLAMA_CPP_LIB_PATH", "")


@pytest.mark.skipif(not DEV_PYTHON or not LLAMA_CPP_LIB,
                    reason="needs llama.cpp built (tests/data/gguf/make_llamacpp_golden.py says how): set "
                           "GPT2_DEV_PYTHON to a python with NumPy and LLAMA_CPP_LIB_PATH to the build's bin folder, "
                           "then "
                           "python -m pytest -q tests/test_gguf.py -k live")
def test_live_llama_cpp_gives_the_goldens_again():
    r = subprocess.run([DEV_PYTHON, os.path.join(GGUF_DATA, "make_llamacpp_golden.py"), "--check"],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PROJECT_PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr[-3000:]
    assert sum(line.startswith("ok ") for line in r.stdout.splitlines()) == 12, r.stdout


def test_a_classifier_is_refused_for_gguf_and_nothing_is_written(tmp_path):
    """llama.cpp's GPT-2 GGUF holds a language model: a classifier's head would be dropped without a word."""
    out = tmp_path / "cls.gguf"
    r = run("convert.py", os.path.join(DATA, "hub_classifier", "named"), str(out), "--to", "gguf")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "is a classifier (labels comedy, history, tragedy)" in r.stderr and "--to hf" in r.stderr, r.stderr
    assert not out.exists() and os.listdir(tmp_path) == []
