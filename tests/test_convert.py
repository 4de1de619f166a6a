"""convert.py: a model to Hugging Face's folder and back, held to what Hugging Face's own tools do.

tests/data/convert_golden.json and .npz are what transformers 5.24 made of the folders convert.py
writes (tests/data/make_convert_golden.py, dev-only): its logits, GPT2TokenizerFast's ids on held-out
multilingual text, and what save_pretrained writes back. Here the same folders are written again,
and must be those very bytes, so the golden is about what the project writes now.
tests/data/hf/tiny was written by transformers' save_pretrained itself."""
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import bpe
import convert
from conftest import DATA, ROOT, in_process, model_folder_copy, tiny_mirror
import gpt2_numpy as g
from interface import convert_cli
from interface.loading import load_model
from plumbing import hf_model, shapes
from plumbing.checkpoint import load_checkpoint, stored_shapes
from plumbing.errors import UserError
from plumbing.safetensors_reader import load_file

HF = os.path.join(DATA, "hf")
with open(os.path.join(DATA, "convert_golden.json"), encoding="utf-8") as f:
    GOLDEN = json.load(f)
GOLDEN_LOGITS = np.load(os.path.join(DATA, "convert_golden.npz"))


def golden_script():
    spec = importlib.util.spec_from_file_location("make_convert_golden", os.path.join(DATA, "make_convert_golden.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = golden_script()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{case: (source folder, its Hugging Face folder)}, for the golden's two cases."""
    root = tmp_path_factory.mktemp("converted")
    folders = {}
    for name in MAKE.CASES:
        source = MAKE.SOURCES[name](str(root / f"{name}-source"))
        folders[name] = source, convert.convert(source, str(root / f"{name}-hf"), "hf")
    return folders


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def logits_of(folder, ids):
    encoder, hp, params = load_model(folder)
    return g.gpt2([ids], params, hp)[0]


# --- the names: one table, read both ways --------------------------------------------------------

def test_the_names_are_the_ones_save_pretrained_writes():
    hp = hf_model.read_config(os.path.join(HF, "tiny"))  # tests/data/hf/tiny: transformers' own save_pretrained
    tensors, _ = load_file(os.path.join(HF, "tiny", "model.safetensors"))
    assert sorted(hf_model.hf_name(name) for name in shapes.tensor_shapes(hp)) == sorted(tensors)


@pytest.mark.parametrize("hp", [shapes.hparams(size) for size in shapes.SIZES] +
                         [{"n_vocab": 96, "n_ctx": 32, "n_embd": 12, "n_head": 3, "n_layer": 11, "n_inner": 24}])
def test_our_names_read_hf_name_backwards(hp):
    ours = hf_model.our_names(hp)
    assert sorted(ours.values()) == sorted(shapes.tensor_shapes(hp)) and len(ours) == len(shapes.tensor_shapes(hp))
    assert all(hf_model.hf_name(name) == theirs for theirs, name in ours.items())


def test_the_chapters_table_is_true():
    """Every row of convert.py's side-by-side table: the three names and two shapes the code gives."""
    hp = shapes.hparams("124M")
    rows = re.findall(r"^    (\S+)\s+model/(\S+)\s+(\[[\d, ]+\])\s+(\S+)\s+(\[[\d, ]+\])$", convert.__doc__, re.M)
    assert len(rows) == 7
    for ours, openai, openai_shape, theirs, theirs_shape in rows:
        assert ours == openai and hf_model.hf_name(ours) == theirs
        assert json.loads(openai_shape) == list(stored_shapes(hp)[f"model/{ours}"])
        assert json.loads(theirs_shape) == list(shapes.tensor_shapes(hp)[ours])


# --- both ways, bit for bit ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny", "scratch"])
def test_openai_to_hf_to_openai_gives_every_tensor_and_file_back_bit_for_bit(converted, tmp_path, name):
    source, hf = converted[name]
    back = convert.convert(hf, str(tmp_path / "back"), "openai")
    (hp, params), (hp_back, params_back) = load_checkpoint(source), load_checkpoint(back)
    a, b = shapes.flatten(params), shapes.flatten(params_back)
    assert hp == hp_back and list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype == np.float32 and np.array_equal(a[key].view(np.uint32),
                                                                               b[key].view(np.uint32)), key
    for f in ("hparams.json", "encoder.json", "vocab.bpe", "model.ckpt.index", "model.ckpt.data-00000-of-00001"):
        assert sha256(os.path.join(back, f)) == sha256(os.path.join(source, f)), f


def test_hf_to_openai_to_hf_gives_the_bytes_save_pretrained_wrote(tmp_path):
    openai = convert.convert(os.path.join(HF, "tiny"), str(tmp_path / "openai"), "openai")
    back = convert.convert(openai, str(tmp_path / "hf"), "hf")
    for f in ("model.safetensors", "vocab.json", "merges.txt"):
        assert sha256(os.path.join(back, f)) == sha256(os.path.join(HF, "tiny", f)), f


@pytest.mark.parametrize("name", ["tiny", "scratch"])
def test_the_hf_folder_loads_back_here_with_identical_logits(converted, name):
    source, hf = converted[name]
    ids = GOLDEN["cases"][name]["ids"]
    assert hf_model.is_hf_folder(hf)
    np.testing.assert_array_equal(logits_of(hf, ids), logits_of(source, ids))


# --- what Hugging Face's own tools make of it (the golden) ---------------------------------------

@pytest.mark.parametrize("name", ["tiny", "scratch"])
def test_convert_writes_the_very_bytes_transformers_was_given(converted, name):
    _, hf = converted[name]
    assert {f: sha256(os.path.join(hf, f)) for f in sorted(os.listdir(hf))} == GOLDEN["cases"][name]["files"]


@pytest.mark.parametrize("name", ["tiny", "scratch"])
def test_transformers_gives_our_logits(converted, name):
    """AutoModelForCausalLM.from_pretrained(OUT): within 1e-4 of ours (the golden tests' tolerance)."""
    source, _ = converted[name]
    ours = logits_of(source, GOLDEN["cases"][name]["ids"])
    assert np.abs(ours[-1] - GOLDEN_LOGITS[f"{name}/last_logits"]).max() <= 1e-4
    assert np.abs(ours[:, :256] - GOLDEN_LOGITS[f"{name}/logits_cols"]).max() <= 1e-4


@pytest.mark.parametrize("name", ["tiny", "scratch"])
def test_gpt2_tokenizer_fast_gives_our_ids_on_held_out_multilingual_text(converted, name):
    _, hf = converted[name]
    encoder = bpe.get_encoder(hf)  # from the converted folder's vocab.json and merges.txt
    assert GOLDEN["held_out"] == MAKE.HELD_OUT
    for text, want in zip(GOLDEN["held_out"], GOLDEN["cases"][name]["held_out_ids"]):
        assert encoder.encode(text) == want, text


@pytest.mark.parametrize("name", ["tiny", "scratch"])
def test_save_pretrained_writes_back_our_config_and_our_tensors(converted, name):
    _, hf = converted[name]
    resaved = GOLDEN["cases"][name]["resaved"]
    assert read_json(os.path.join(hf, "config.json")) == resaved["config.json"]
    assert read_json(os.path.join(hf, "generation_config.json")) == resaved["generation_config.json"]
    assert sha256(os.path.join(hf, "model.safetensors")) == resaved["model.safetensors"]


def test_a_vocabulary_from_scratch_converts_with_its_own_end_of_text(converted):
    for name, eot, n_ctx in (("tiny", 50256, 64), ("scratch", MAKE.SCRATCH_HP["n_vocab"] - 1, 48)):
        source, hf = converted[name]
        config = read_json(os.path.join(hf, "config.json"))
        assert config["bos_token_id"] == config["eos_token_id"] == eot == bpe.get_encoder(source).eot
        assert read_json(os.path.join(hf, "generation_config.json"))["eos_token_id"] == eot
        assert config["n_positions"] == config["n_ctx"] == n_ctx
        assert read_json(os.path.join(hf, "tokenizer_config.json")) == {"model_max_length": n_ctx}
        assert "lm_head.weight" not in load_file(os.path.join(hf, "model.safetensors"))[0]  # tied, not stored twice


def test_merges_txt_gets_the_line_hugging_face_skips():
    assert hf_model.merges_txt(b"a b\n") == b"#version: 0.2\na b\n"
    assert hf_model.merges_txt(b"#version: 0.2\na b\n") == b"#version: 0.2\na b\n"


def test_n_inner_and_eps_go_into_config_json_and_read_back(tmp_path):
    hp = hf_model.read_config(os.path.join(HF, "inner"))  # n_inner 24 and eps 1e-3, by save_pretrained
    config = hf_model.config(hp, 95)
    assert config["n_inner"] == 24 and config["layer_norm_epsilon"] == 1e-3
    (tmp_path / "config.json").write_bytes(hf_model.json_file(config))
    assert hf_model.read_config(str(tmp_path)) == hp
    assert hf_model.config(dict(hp, n_inner=4 * hp["n_embd"]), 95)["n_inner"] is None  # null means 4·d


# --- whole or not at all, and bad input ------------------------------------------------------------

def run(*args, script="convert.py", env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def assert_one_line_error(r, message):
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_command_writes_a_folder_and_says_so(tmp_path):
    source = model_folder_copy("tiny", str(tmp_path / "tiny"))
    r = run(source, str(tmp_path / "hf"), "--to", "hf")
    assert r.returncode == 0 and r.stdout == f"wrote {tmp_path / 'hf'}: {source} in Hugging Face's format\n", r.stderr
    assert sorted(os.listdir(tmp_path)) == ["hf", "tiny"]
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "generation_config.json", "merges.txt",
                                                   "model.safetensors", "tokenizer_config.json", "vocab.json"]


def test_out_in_a_models_folder_not_yet_made_makes_it(tmp_path):
    source = model_folder_copy("tiny", str(tmp_path / "tiny"))
    models = tmp_path / "models"
    r = run(source, str(models / "hf"), "--to", "hf", "--models-dir", str(models))
    assert r.returncode == 0 and os.listdir(models) == ["hf"], r.stderr
    r = run(source, str(tmp_path / "no" / "hf"), "--to", "hf", "--models-dir", str(models))
    assert_one_line_error(r, "no does not exist")
    assert not (tmp_path / "no").exists()


def test_a_size_is_downloaded_first_from_models_dir_and_base_url(tmp_path):
    mirror = tiny_mirror(str(tmp_path / "mirror"))
    try:
        r = run("convert.py", "124M", str(tmp_path / "out"), "--to", "hf", "--models-dir", str(tmp_path / "models"),
                "--base-url", mirror.url, "--quiet", script=os.path.join("tests", "tiny_as_124m.py"))
    finally:
        mirror.close()
    assert r.returncode == 0, r.stderr
    assert read_json(tmp_path / "out" / "config.json")["n_embd"] == 8
    assert os.path.exists(tmp_path / "models" / "124M" / "model.ckpt.index")


def test_an_existing_out_is_refused_before_any_work(tmp_path, capsys):
    source = model_folder_copy("tiny", str(tmp_path / "tiny"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for out in ("empty", "file", "tiny"):
        assert_one_line_error(in_process(convert_cli.main, capsys, source, tmp_path / out, "--to", "hf"),
                              "already exists: choose a new folder")
    assert sorted(os.listdir(tmp_path)) == ["empty", "file", "tiny"] and os.listdir(tmp_path / "empty") == []


def bad_model(tmp_path, kind):
    folder = tmp_path / kind
    if kind == "no model":
        folder.mkdir()
        (folder / "notes.txt").write_text("not a model")
    elif kind == "tokenizer only":
        shutil.copytree(os.path.join(ROOT, "data", "gpt2-vocab"), folder)
    elif kind == "adapter only":
        folder.mkdir()
        (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
        (folder / "adapter_model.safetensors").write_bytes(b"\x08" + bytes(7) + b"{}      ")
    elif kind == "wrong shape":
        model_folder_copy("tiny", str(folder))
        (folder / "hparams.json").write_text(json.dumps(dict(read_json(folder / "hparams.json"), n_ctx=32)))
    elif kind == "wrong shape in hf":
        shutil.copytree(os.path.join(HF, "tiny"), folder)
        (folder / "config.json").write_text(json.dumps(dict(read_json(folder / "config.json"), n_positions=32)))
    elif kind == "eps for openai":
        folder = tmp_path / "hf"
        convert.convert(model_folder_copy("tiny", str(tmp_path / "tiny")), str(folder), "hf")
        (folder / "config.json").write_text(json.dumps(dict(read_json(folder / "config.json"), layer_norm_epsilon=1e-3)))
    return str(folder)


@pytest.mark.parametrize("kind, to, message", [
    ("no model", "hf", "hparams.json is missing from this folder"),
    ("tokenizer only", "hf", "a tokenizer folder"),
    ("adapter only", "hf", "holds a LoRA adapter (adapter_config.json, adapter_model.safetensors) but no model"),
    ("wrong shape", "hf", "model/wpe has shape (64, 8), expected (32, 8)"),
    ("wrong shape in hf", "openai", "transformer.wpe.weight has shape (64, 8), config.json implies (32, 8)"),
    ("eps for openai", "openai", "OpenAI's format has no n_inner or layer_norm_epsilon"),
])
def test_bad_input_is_one_line_and_nothing_is_written(tmp_path, capsys, kind, to, message):
    model = bad_model(tmp_path, kind)
    before = sorted(os.listdir(tmp_path))
    assert_one_line_error(in_process(convert_cli.main, capsys, model, tmp_path / "out", "--to", to), message)
    assert sorted(os.listdir(tmp_path)) == before  # no OUT, no .writing-* left behind


@pytest.mark.parametrize("args, message", [
    (["nonsense", "out", "--to", "hf"], "unknown model 'nonsense'"),
    (["124M", "out"], "the following arguments are required: --to"),
    (["124M", "out", "--to", "onnx"], "invalid choice: 'onnx'"),
])
def test_bad_arguments_are_one_line(tmp_path, args, message):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "convert.py"), *args], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert_one_line_error(r, message)
    assert os.listdir(tmp_path) == []


def test_ctrl_c_while_writing_leaves_nothing(tmp_path, monkeypatch):
    import plumbing.safetensors_writer as writer
    source = model_folder_copy("tiny", str(tmp_path / "tiny"))
    pieces = writer.little_endian_pieces

    def interrupted(array):
        yield from pieces(array)
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "little_endian_pieces", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert.convert(source, str(tmp_path / "out"), "hf")
    assert sorted(os.listdir(tmp_path)) == ["tiny"]


WRITING_WAITS = """import os, runpy, sys, time
sys.path.insert(0, os.getcwd())
import plumbing.safetensors_writer as writer
pieces, started = writer.little_endian_pieces, sys.argv[1]

def slow(array):  # the first tensor's bytes, then a pause in which to be stopped
    yield from pieces(array)
    open(started, "w").close()
    time.sleep(60)

writer.little_endian_pieces = slow
sys.argv = ["convert.py"] + sys.argv[2:]
runpy.run_path("convert.py", run_name="__main__")
"""


def test_sigterm_while_writing_is_one_line_and_leaves_nothing(tmp_path):
    """A real SIGTERM (kill, timeout, a scheduler) in the middle of model.safetensors: as Ctrl-C, one
    line and exit 130, and neither OUT nor its hidden .writing-* folder is left."""
    source = model_folder_copy("tiny", str(tmp_path / "tiny"))
    started = tmp_path / "started"
    p = subprocess.Popen([sys.executable, "-c", WRITING_WAITS, str(started), source, str(tmp_path / "out"), "--to",
                          "hf"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not started.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == "terminated\n" and out == "", (p.returncode, err)
    assert sorted(os.listdir(tmp_path)) == ["started", "tiny"]


def test_a_params_tensor_of_the_wrong_shape_is_refused_by_the_writer(tmp_path):
    hp, params = load_checkpoint(os.path.join(DATA, "tiny"))
    params = dict(params, wpe=params["wpe"][:32])
    with pytest.raises(UserError, match=r"wpe has shape \(32, 8\), its hparams imply \(64, 8\)"):
        hf_model.write_hf_folder(str(tmp_path / "out"), params, hp, os.path.join(ROOT, "data", "gpt2-vocab"), 50256)
    assert os.listdir(tmp_path) == []


# --- dev-only: the real tools, live ----------------------------------------------------------------

DEV_PYTHON = os.environ.get("GPT2_DEV_PYTHON", "")


@pytest.mark.skipif(not DEV_PYTHON, reason="needs torch and transformers: set GPT2_DEV_PYTHON to a python that has "
                                           "them (GPT2_DEV_PYTHON=/work/devvenv/bin/python python -m pytest -q "
                                           "tests/test_convert.py -k live)")
def test_live_transformers_on_tiny_scratch_and_124m_shaped_folders():
    """make_convert_golden.py --check: convert, load in transformers, compare, with no golden in between;
    one case is a random model in 124M's shape (a released size's, 500 MB in a temporary folder)."""
    r = subprocess.run([DEV_PYTHON, os.path.join(DATA, "make_convert_golden.py"), "--check"], capture_output=True,
                       text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [line.split(":")[0] for line in r.stdout.splitlines() if line.startswith("ok ")] == [
        "ok tiny", "ok scratch", "ok 124M-random"], r.stdout
