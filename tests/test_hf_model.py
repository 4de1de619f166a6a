"""Hugging Face folders (safetensors, config.json, vocab.json, merges.txt) and the Hub, with NumPy alone.

The folders in tests/data/hf were written by transformers' save_pretrained and safetensors'
save_file (tests/data/hf/make_hf_folders.py); golden.npz is what GPT2LMHeadModel computes on them."""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

import bpe
from conftest import DATA, ROOT, VOCAB, Mirror, closed_port
import gpt2_numpy as g
from plumbing import hf_model, hub, shapes
from plumbing.fetching import DownloadError
from plumbing import safetensors_reader as st

HF = os.path.join(DATA, "hf")
GOLDEN = np.load(os.path.join(HF, "golden.npz"))
with open(os.path.join(HF, "safetensors.json"), encoding="utf-8") as f:
    DIGESTS = json.load(f)
FOLDERS = ["tiny", "inner", "sharded", "bare", "bf16"]


def golden_of(name):
    return "tiny" if name == "bare" else name  # bare holds tiny's weights


# --- the reader -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", FOLDERS)
def test_the_reader_gives_the_bytes_safetensors_numpy_gives(name):
    folder = os.path.join(HF, name)
    for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
        tensors, _ = st.load_file(os.path.join(folder, file))
        want = {k: v for k, v in DIGESTS[name].items() if v["file"] == file}
        assert sorted(tensors) == sorted(want)
        for key, array in tensors.items():
            if want[key]["dtype"] == "bfloat16":  # numpy has no bfloat16: safetensors.numpy gives its 16 bits
                stored = (array.view(np.uint32) >> 16).astype(np.uint16)
            else:
                stored = array.astype(want[key]["dtype"])  # float16 back from float32: exact
            assert list(array.shape) == want[key]["shape"]
            assert hashlib.sha256(np.ascontiguousarray(stored).tobytes()).hexdigest() == want[key]["sha256"], key


def test_float32_tensors_are_read_only_views_into_the_file():
    tensors, converted = st.load_file(os.path.join(HF, "tiny", "model.safetensors"))
    wte = tensors["transformer.wte.weight"]
    assert isinstance(wte.base, np.memmap) or isinstance(wte, np.memmap)
    assert not wte.flags.writeable and wte.dtype == np.float32 and converted == set()


def test_bfloat16_is_the_top_half_of_a_float32():
    x = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(st.bfloat16_to_float32(bits), x)


# --- the model on them, against Hugging Face -------------------------------------------------

@pytest.mark.parametrize("name", FOLDERS)
def test_logits_and_greedy_ids_match_hugging_face(name):
    hp, params, converted = hf_model.load_hf_folder(os.path.join(HF, name))
    key = golden_of(name)
    ids = GOLDEN[f"{key}/ids"]
    logits = g.gpt2(ids, params, hp)  # inner's and sharded's eps is 1e-3
    assert logits.dtype == np.float32
    assert np.abs(logits[:, -1] - GOLDEN[f"{key}/last_logits"]).max() <= 1e-4
    assert np.abs(logits[:, :, :96] - GOLDEN[f"{key}/logits_cols"]).max() <= 1e-4
    for row, want in zip(ids, GOLDEN[f"{key}/greedy"]):
        got = np.concatenate(list(g.generate(row.tolist(), params, hp, 12, temperature=0, stop=None)))
        assert got.tolist() == want.tolist()
    assert converted == {"sharded": {"F16"}, "bf16": {"BF16"}}.get(name, set())


def test_n_inner_and_layer_norm_epsilon_are_read():
    hp, params, _ = hf_model.load_hf_folder(os.path.join(HF, "inner"))
    assert hp["n_inner"] == 24 and hp["layer_norm_epsilon"] == 1e-3
    assert params["blocks"][0]["mlp"]["c_fc"]["w"].shape == (12, 24) and set(params["ln_f"]) == {"g", "b"}  # eps: hp's


def test_names_with_and_without_the_transformer_prefix_give_the_same_params():
    _, a, _ = hf_model.load_hf_folder(os.path.join(HF, "tiny"))
    _, b, _ = hf_model.load_hf_folder(os.path.join(HF, "bare"))  # also has mask buffers and lm_head.weight
    fa, fb = shapes.flatten(a), shapes.flatten(b)
    assert list(fa) == list(fb) and all(np.array_equal(fa[k], fb[k]) for k in fa)


def test_the_tokenizer_comes_from_vocab_json_and_merges_txt(encoder):
    hf = bpe.get_encoder(os.path.join(HF, "tiny"))
    text = "Hello, world! Ünïcödé and 123 numbers."
    assert hf.encode(text) == encoder.encode(text)


# --- bad folders and files: one line, exit 2 ----------------------------------------------------

def copy(name, tmp_path):
    return shutil.copytree(os.path.join(HF, name), tmp_path / name)


def write_safetensors(path, header, data):
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def assert_one_line_error(r, message):
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def bad_folder(tmp_path, kind):
    folder = copy("inner", tmp_path)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    if kind == "truncated":
        path.write_bytes(data[:-100])
    elif kind == "long header":
        path.write_bytes(struct.pack("<Q", len(data) * 2) + data[8:])
    elif kind == "overlap":
        names = [k for k in header if k != "__metadata__"]
        a, b = names[0], names[1]
        size = header[b]["data_offsets"][1] - header[b]["data_offsets"][0]
        header[b]["data_offsets"] = [header[a]["data_offsets"][0], header[a]["data_offsets"][0] + size]
        write_safetensors(path, header, body)
    elif kind == "past the end":
        last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
        header[last]["data_offsets"][1] += 4
        header[last]["shape"] = [int(np.prod(header[last]["shape"])) + 1]
        write_safetensors(path, header, body)
    elif kind == "config option":
        config = json.loads((folder / "config.json").read_text())
        config["scale_attn_by_inverse_layer_idx"] = True
        (folder / "config.json").write_text(json.dumps(config))
    elif kind == "pickle only":
        path.unlink()
        (folder / "pytorch_model.bin").write_bytes(b"PK\x03\x04 a zip of pickles")
    elif kind == "untied head":
        header["lm_head.weight"] = dict(header["transformer.wte.weight"])
        begin, end = header["lm_head.weight"]["data_offsets"]
        header["lm_head.weight"]["data_offsets"] = [len(body), len(body) + end - begin]
        write_safetensors(path, header, body + bytes(end - begin))
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(HF, "tiny", f), folder)
    return folder


@pytest.mark.parametrize("kind, message", [
    ("truncated", "runs past the end of the file"),
    ("long header", "its header says it is"),
    ("overlap", "overlap"),
    ("past the end", "runs past the end of the file"),
    ("config option", "scale_attn_by_inverse_layer_idx = True changes GPT-2's architecture"),
    ("pickle only", "never unpickles"),
    ("untied head", "lm_head.weight differs from wte"),
])
def test_bad_hugging_face_folders_are_one_line_errors(tmp_path, kind, message):
    folder = bad_folder(tmp_path, kind)
    assert_one_line_error(run_cli("hi", "--model", str(folder)), message)


def test_verify_checks_the_header_against_the_file(tmp_path):
    ok = subprocess.run([sys.executable, os.path.join(ROOT, "download.py"), "--verify", os.path.join(HF, "sharded")],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "fit its file" in ok.stdout
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "download.py"), "--verify",
                          str(bad_folder(tmp_path, "truncated"))], capture_output=True, text=True)
    assert_one_line_error(bad, "runs past the end of the file")


def test_params_counts_a_hugging_face_folders_tensors():
    r = run_cli("--params", os.path.join(HF, "inner"))
    assert r.returncode == 0 and "counting the checkpoint's tensors gives the same 5,412" in r.stdout


@pytest.mark.parametrize("name", ["../etc/passwd", "owner/../x", "owner//x", "/owner/x", "owner/x/y", "owner",
                                  "owner/x@../main", "ow ner/x", ".hidden/x"])
def test_bad_hub_names_are_refused_before_anything_is_written(tmp_path, name):
    r = run_cli("hi", "--model", f"hf:{name}", "--models-dir", str(tmp_path))
    assert_one_line_error(r, "is not a Hub model name")
    assert os.listdir(tmp_path) == []


# --- hf: from a mirror in the Hub's layout ------------------------------------------------------

@pytest.fixture
def hub_mirror(tmp_path):
    """{root}/test-org/tiny-gpt2/resolve/main/<file>, as the Hub lays files out."""
    root = tmp_path / "hub"
    files = root / "test-org" / "tiny-gpt2" / "resolve" / "main"
    files.mkdir(parents=True)
    for f in ("config.json", "model.safetensors", "vocab.json", "merges.txt"):
        shutil.copy(os.path.join(HF, "tiny", f), files)
    sharded = root / "test-org" / "sharded" / "resolve" / "main"
    shutil.copytree(os.path.join(HF, "sharded"), sharded)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(HF, "tiny", f), sharded)
    m = Mirror(str(root))
    m.etags["model.safetensors"] = hashlib.sha256((files / "model.safetensors").read_bytes()).hexdigest()
    yield m
    m.close()


def test_hf_downloads_and_runs_what_hugging_face_computes(hub_mirror, tmp_path):
    models = tmp_path / "models"
    ids = GOLDEN["tiny/ids"][0]
    r = run_cli("--model", "hf:test-org/tiny-gpt2", "--models-dir", str(models), "--greedy", "--n-tokens", "12",
                "--no-stop", "--json", bpe.get_encoder(VOCAB).decode(ids.tolist()), env={"HF_ENDPOINT": hub_mirror.url})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_ids"] == ids.tolist() and out["samples"][0]["ids"] == GOLDEN["tiny/greedy"][0].tolist()
    folder = models / "hf" / "test-org" / "tiny-gpt2"
    assert sorted(f for f in os.listdir(folder) if not f.startswith(".")) == [
        "config.json", "merges.txt", "model.safetensors", "vocab.json"]
    hub_mirror.requests.clear()
    assert run_cli("--model", "hf:test-org/tiny-gpt2", "--models-dir", str(models), "--n-tokens", "1", "hi",
                   env={"HF_ENDPOINT": hub_mirror.url}).returncode == 0
    assert hub_mirror.requests == []  # a warm run fetches nothing


def test_hf_sharded_and_a_revision(hub_mirror, tmp_path):
    revision = tmp_path / "hub" / "test-org" / "sharded" / "resolve" / "v1"
    shutil.copytree(tmp_path / "hub" / "test-org" / "sharded" / "resolve" / "main", revision)
    folder = hub.download_hub_model("test-org/sharded@v1", str(tmp_path / "models"), quiet=True,
                                    endpoint=hub_mirror.url)
    assert folder.endswith(os.path.join("hf", "test-org", "sharded@v1"))
    assert all(p.startswith("/test-org/sharded/resolve/v1/") for p, _ in hub_mirror.requests)
    hp, params, converted = hf_model.load_hf_folder(folder)
    logits = g.gpt2(GOLDEN["sharded/ids"], params, hp)
    assert np.abs(logits[:, -1] - GOLDEN["sharded/last_logits"]).max() <= 1e-4


def test_hf_resumes_after_a_drop(hub_mirror, tmp_path):
    hub_mirror.faults["model.safetensors"] = ["drop:300000"]
    folder = hub.download_hub_model("test-org/tiny-gpt2", str(tmp_path / "models"), quiet=True,
                                    endpoint=hub_mirror.url, backoff=0)
    ranges = [r for p, r in hub_mirror.requests if p.endswith("model.safetensors")]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and len(ranges) == 2
    assert open(os.path.join(folder, "model.safetensors"), "rb").read() == open(
        os.path.join(HF, "tiny", "model.safetensors"), "rb").read()


def test_hf_follows_redirects(hub_mirror, tmp_path):
    folder = hub.download_hub_model("test-org/tiny-gpt2", str(tmp_path / "models"), quiet=True,
                                    endpoint=hub_mirror.url + "/moved")
    assert os.path.exists(os.path.join(folder, "model.safetensors"))


def test_hf_404_is_no_such_model(hub_mirror, tmp_path):
    r = run_cli("hi", "--model", "hf:test-org/nothing-here", "--models-dir", str(tmp_path),
                env={"HF_ENDPOINT": hub_mirror.url})
    assert_one_line_error(r, "no such model on the Hub or mirror: hf:test-org/nothing-here")


def test_hf_a_sha256_mismatch_is_not_kept(hub_mirror, tmp_path):
    hub_mirror.etags["model.safetensors"] = "0" * 64
    with pytest.raises(DownloadError, match="sent a bad model.safetensors: its SHA-256 is not 0000"):
        hub.download_hub_model("test-org/tiny-gpt2", str(tmp_path / "models"), quiet=True, endpoint=hub_mirror.url)
    folder = tmp_path / "models" / "hf" / "test-org" / "tiny-gpt2"
    assert not (folder / "model.safetensors").exists() and not (folder / "model.safetensors.part").exists()


def test_hf_a_pickle_only_repository(hub_mirror, tmp_path):
    files = tmp_path / "hub" / "test-org" / "tiny-gpt2" / "resolve" / "main"
    (files / "model.safetensors").unlink()
    (files / "pytorch_model.bin").write_bytes(b"PK")
    with pytest.raises(DownloadError, match="has no model.safetensors: if it has only pytorch_model.bin"):
        hub.download_hub_model("test-org/tiny-gpt2", str(tmp_path / "models"), quiet=True, endpoint=hub_mirror.url)


# --- a repository that is not there, or is unusable, leaves nothing behind (issue 23, §6.11) ---

def test_hf_404_leaves_no_models_folder_behind(hub_mirror, tmp_path):
    r = run_cli("hi", "--model", "hf:test-org/nothing-here", "--models-dir", str(tmp_path / "models"),
                env={"HF_ENDPOINT": hub_mirror.url})
    assert_one_line_error(r, "no such model on the Hub or mirror")
    assert os.listdir(tmp_path) == ["hub"]  # the mirror's files only: no models/, no hf/, no .lock


def test_hf_with_no_network_leaves_no_models_folder_behind(tmp_path):
    """Nothing was saved, and a Hub download has no .part file to resume: not even the .lock stays."""
    models = tmp_path / "models"
    with pytest.raises(DownloadError, match="could not download"):
        hub.download_hub_model("test-org/tiny-gpt2", str(models), quiet=True, tries=1,
                               endpoint=f"http://127.0.0.1:{closed_port()}")
    assert not models.exists()


@pytest.mark.parametrize("missing, message", [("model.safetensors", "has no model.safetensors"),
                                              ("merges.txt", "has no merges.txt")])
def test_hf_an_unusable_repository_leaves_nothing_it_fetched(hub_mirror, tmp_path, missing, message):
    (tmp_path / "hub" / "test-org" / "tiny-gpt2" / "resolve" / "main" / missing).unlink()
    models = tmp_path / "models"
    (models / "hf" / "test-org").mkdir(parents=True)  # made before: it stays
    with pytest.raises(DownloadError, match=message):
        hub.download_hub_model("test-org/tiny-gpt2", str(models), quiet=True, endpoint=hub_mirror.url)
    assert os.listdir(models / "hf" / "test-org") == []  # config.json, the weights, .lock and the folder: gone
