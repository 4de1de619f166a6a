"""lens.py: the tuned lens as tuned-lens 0.2.0 reads and trains it, linear probes as scikit-learn's LogisticRegression
and Geometry of Truth's mass-mean probe fit them (the goldens: tests/data/make_lens_golden.py, on tests/data/hf's
random GPT-2s); the backward by finite differences; torch.save's archive read and written byte for byte without
torch; the command lines, and every bad input one line, exit 2, nothing written."""
import io
import json
import os
import pickle
import subprocess
import zipfile

import numpy as np
import pytest
from conftest import DATA, in_process, numerical_grad

import gpt2_numpy as g
import lens as LENS
from bpe import get_encoder
import look_inside
from interface import gpt2_cli, lens_cli, steer_cli
from plumbing import lens_files, torch_archive
from plumbing.errors import UserError
from plumbing.weights import load_weights

GOLDEN = np.load(os.path.join(DATA, "lens_golden.npz"))
TINY, INNER = os.path.join(DATA, "hf", "tiny"), os.path.join(DATA, "hf", "inner")
TINY_LENS = os.path.join(DATA, "lens", "tiny")
TRAINING = ("kl_zero", "ce_random", "kl_warmup")
PROBES = ("logistic_last", "logistic_mean_std", "logistic_strong", "mean_diff_last", "mean_diff_iid",
          "mean_diff_iid_std", "synthetic_iid", "synthetic_logistic")


def case(name):
    return {k.split("/", 1)[1]: GOLDEN[k] for k in GOLDEN.files if k.startswith(name + "/")}


def golden_lens(prefix="inner"):
    return [{"weight": w.copy(), "bias": b.copy()} for w, b in zip(GOLDEN[f"{prefix}/weight"], GOLDEN[f"{prefix}/bias"])]


@pytest.fixture(scope="module")
def inner():
    return load_weights(INNER)


@pytest.fixture(scope="module")
def tiny():
    return load_weights(TINY)


def close(ours, theirs, rel):
    """Within rel of the reference's largest magnitude."""
    return np.abs(np.asarray(ours, np.float64) - theirs).max() <= rel * np.abs(theirs).max()


# ----------------------------------------------------------------------------
# 1. The reading
# ----------------------------------------------------------------------------

def test_the_translators_reading_is_tuned_lenss(inner):
    """Exercise 51: ln_f(h + h Aᵀ + b) wteᵀ, each layer through its own translator, on hf/inner (its ln_f's eps is
    1e-3), within 1e-5 of the largest logit; a translator of zeros reads as the logit lens does."""
    hparams, params = inner
    lens = golden_lens()
    _, cache = look_inside.run_with_cache(GOLDEN["inner/ids"], params, hparams, names=LENS.lens_sites(3))
    eps = g.layer_norm_eps(hparams)
    for layer, site in enumerate(LENS.lens_sites(3)):
        reading = LENS.tuned_lens_logits(cache[site], lens[layer], params["ln_f"], params["wte"], eps)
        assert close(reading, GOLDEN["inner/reading"][layer], 1e-5), layer
    zero = LENS.new_lens(3, 12)[1]
    h = cache[LENS.lens_sites(3)[1]]  # block 1's input
    logit_lens = g.matmul(g.layer_norm(h, **params["ln_f"], eps=eps), params["wte"].T)
    assert np.array_equal(LENS.tuned_lens_logits(h, zero, params["ln_f"], params["wte"], eps), logit_lens)


def test_a_lens_tuned_lens_saved_reads_as_tuned_lens_reads_it(tiny):
    """tests/data/lens/tiny, written by TunedLens.save (torch.save), read without torch: the reading of a text at
    some columns and its logsumexp over all 50257; its unembed_hash is ours; tuned_lens's rows beside the logit
    lens's, the last the model's own."""
    hparams, params = tiny
    lens, config = lens_files.load_lens(TINY_LENS)
    assert config["unembed_hash"] == LENS.unembed_hash(params["wte"])
    ids = GOLDEN["tiny/ids"].tolist()
    run = look_inside.run_with_cache([ids], params, hparams, names=look_inside.lens_activations(2))
    reading = np.stack([x[0] for x in LENS.lens_readings(run[1], params, hparams, lens)])
    assert close(reading[..., GOLDEN["tiny/cols"]], GOLDEN["tiny/reading"], 1e-5)
    top = reading.max(-1, keepdims=True)
    assert close(top[..., 0] + np.log(np.exp(reading - top).sum(-1)), GOLDEN["tiny/logsumexp"], 1e-6)
    out = LENS.tuned_lens([ids], params, hparams, lens, run=run)
    assert np.array_equal(out["top"][:2, 0], reading.argmax(-1)) and np.array_equal(out["top"][2], run[0].argmax(-1))
    assert (out["target_rank"][2] == 0).all() and np.allclose(out["top_prob"][2], out["target_prob"][2])


def test_the_reading_runs_tuned_lens_logits_itself(tiny, monkeypatch):
    """lens.py read and gpt2_numpy.py --tuned-lens read each layer through tuned_lens_logits (exercise 51): in a
    handout, the student's function is the one that runs."""
    hparams, params = tiny
    lens, _ = lens_files.load_lens(TINY_LENS)
    calls, real = [], LENS.tuned_lens_logits
    monkeypatch.setattr(LENS, "tuned_lens_logits", lambda *args: calls.append(1) or real(*args))
    LENS.tuned_lens([GOLDEN["tiny/ids"].tolist()], params, hparams, lens)
    assert len(calls) == hparams["n_layer"]


def test_a_lens_for_another_width_or_depth_is_refused(tiny):
    with pytest.raises(UserError, match="the model needs 2 .one a block., 8 wide"):
        LENS.check_lens(LENS.new_lens(3, 8), tiny[0])
    with pytest.raises(UserError, match="12 wide"):
        LENS.check_lens(LENS.new_lens(2, 12), tiny[0])


# ----------------------------------------------------------------------------
# 2. The losses and the backward
# ----------------------------------------------------------------------------

def test_the_losses_gradients_by_finite_differences():
    """KL(p ‖ q) and the shifted cross-entropy, and d loss / d the lens's logits, in float64."""
    rng = np.random.default_rng(0)
    logits, final = rng.standard_normal((2, 3, 5)), g.log_softmax(rng.standard_normal((2, 3, 5)))
    ids = rng.integers(0, 5, (2, 3))
    for loss in (lambda: LENS.kl_loss(logits, final), lambda: LENS.ce_loss(logits, ids)):
        assert np.allclose(loss()[1], numerical_grad(lambda: loss()[0], logits), atol=1e-8)
    p, q = np.exp(final), g.softmax(logits)
    assert np.isclose(LENS.kl_loss(logits, final)[0], (p * np.log(p / q)).sum(-1).mean())
    assert not LENS.ce_loss(logits, ids)[1][:, -1].any()  # the last position predicts nothing here


def test_the_translators_backward_by_finite_differences():
    """d loss / dA and db back through wte, ln_f (its gain and eps) and the translator, in float64."""
    rng = np.random.default_rng(1)
    h, wte, dlogits = rng.standard_normal((2, 3, 4)), rng.standard_normal((6, 4)), rng.standard_normal((2, 3, 6))
    translator = {"weight": rng.standard_normal((4, 4)) * 0.5, "bias": rng.standard_normal(4)}
    ln_f = {"g": 1 + 0.3 * rng.standard_normal(4), "b": rng.standard_normal(4)}

    def loss():
        return float((LENS.tuned_lens_logits(h, translator, ln_f, wte, 1e-3) * dlogits).sum())

    grads = LENS.translator_backward(h, translator, ln_f, wte, dlogits, 1e-3)
    for name in ("weight", "bias"):
        assert np.allclose(grads[name], numerical_grad(loss, translator[name]), atol=1e-7), name


def test_each_translators_gradient_is_torchs(inner):
    """Step 0's gradients, each layer's loss backpropagated on its own, before clipping."""
    hparams, params = inner
    for name in TRAINING:
        c = case(name)
        lens = LENS.new_lens(3, 12) if str(c["init"]) == "zero" else golden_lens()
        _, grads = LENS.lens_losses_and_grads(c["windows"][:int(c["batch_size"])], params, hparams, lens, str(c["loss"]))
        assert close(np.stack([x["weight"] for x in grads]), c["grad_weight"], 1e-5), name
        assert close(np.stack([x["bias"] for x in grads]), c["grad_bias"], 1e-5), name


# ----------------------------------------------------------------------------
# 3. The optimizer and the schedule
# ----------------------------------------------------------------------------

def test_sgd_with_nesterov_momentum_is_torchs_equations():
    p, buf = np.array([1.0, -2.0]), np.zeros(2)
    LENS.sgd_nesterov_update(p, np.array([0.5, 0.5]), buf, lr=0.1, momentum=0.9, weight_decay=0.1, first=True)
    g0 = np.array([0.6, 0.3])  # grad + λ p
    assert np.allclose(buf, g0) and np.allclose(p, [1.0, -2.0] - 0.1 * (g0 + 0.9 * g0))
    q = p.copy()
    LENS.sgd_nesterov_update(p, np.zeros(2), buf, lr=0.1, momentum=0.9, weight_decay=0.0, first=False)
    assert np.allclose(buf, 0.9 * g0) and np.allclose(p, q - 0.1 * 0.9 * 0.9 * g0)


def test_the_schedule_is_tuned_lenss_with_its_k_minus_w():
    assert [LENS.lens_schedule(s, 4, 0) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert [LENS.lens_schedule(s, 6, 2) for s in range(6)] == [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]  # (K - W - s) / (K - 2W)
    assert LENS.lens_schedule(0, 1, 1) == 0.0


# ----------------------------------------------------------------------------
# 4. Training
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", TRAINING)
def test_training_steps_equal_tuned_lenss(inner, name):
    """K steps from zero or from a given lens, KL or CE, with and without warm-up, windows wrapping round: every
    translator within 1e-5 of its largest value, each layer's loss of each step within 1e-5."""
    hparams, params = inner
    c = case(name)
    lens = LENS.new_lens(3, 12) if str(c["init"]) == "zero" else golden_lens()
    losses = list(LENS.train_lens(c["windows"], params, hparams, lens, int(c["steps"]), int(c["batch_size"]),
                                  float(c["lr_scale"]), float(c["momentum"]), float(c["weight_decay"]), str(c["loss"]),
                                  int(c["warmup"])))
    assert np.abs(np.array(losses) - c["losses"]).max() <= 1e-5
    for layer, translator in enumerate(lens):
        assert close(translator["weight"], c["weight"][layer], 1e-5) and close(translator["bias"], c["bias"][layer], 1e-5)


# ----------------------------------------------------------------------------
# The archive, without torch
# ----------------------------------------------------------------------------

def test_our_params_pt_is_torchs_byte_for_byte():
    """torch.save's files (the lens, and 13 translators 20 wide: the memo past 255, counts past 255) read back and
    written again give the same bytes, given torch's serialization id (a hash of its C++ library's)."""
    for path, folder in ((os.path.join(TINY_LENS, "params.pt"), "tiny"), (os.path.join(DATA, "lens", "deep.pt"), "deep")):
        tensors, metadata = torch_archive.read_state_dict(path)
        names_hash = int(str(GOLDEN[f"{folder}/serialization_id"])[:20])
        name = os.path.splitext(os.path.basename(path))[0]
        with open(path, "rb") as f:
            assert torch_archive.archive_bytes(tensors, metadata, name, names_hash) == f.read(), path
    deep, metadata = torch_archive.read_state_dict(os.path.join(DATA, "lens", "deep.pt"))
    assert list(deep)[:3] == ["0.weight", "0.bias", "1.weight"] and len(deep) == 26
    assert np.array_equal(deep["12.bias"], np.arange(20, dtype=np.float32) + 25000)
    assert np.array_equal(deep["1.weight"], np.arange(400, dtype=np.float32).reshape(20, 20) + 2000)
    assert metadata == {"": {"version": 1}, **{str(i): {"version": 1} for i in range(13)}}


def test_the_archives_records_are_stored_aligned_and_little_endian(tmp_path):
    """The layout, read with zipfile and by hand: stored entries under the file's name, each record's data at a
    multiple of 64, float32 little-endian, the serialization id's second half torch's CRC-32s combined."""
    path = str(tmp_path / "params.pt")
    lens = LENS.new_lens(2, 3)
    lens[1]["bias"][:] = [1.5, -2.0, 3.25]
    lens_files.save_lens(str(tmp_path / "l"), lens, lens_files.lens_config("124M", 3, 2, "x"))
    os.replace(str(tmp_path / "l" / "params.pt"), path)
    raw = open(path, "rb").read()
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        assert [i.filename for i in infos] == ["params/" + n for n in (
            "data.pkl", ".format_version", ".storage_alignment", "byteorder", "data/0", "data/1", "data/2", "data/3",
            "version", ".data/serialization_id")]
        for info in infos:
            start = info.header_offset + 30 + len(info.filename) + int.from_bytes(raw[info.header_offset + 28:
                                                                                      info.header_offset + 30], "little")
            assert info.compress_type == zipfile.ZIP_STORED and start % 64 == 0, info.filename
        assert z.read("params/data/3") == np.array([1.5, -2.0, 3.25], "<f4").tobytes()
        assert z.read("params/byteorder") == b"little" and z.read("params/version") == b"3\n"
    with open(os.path.join(str(tmp_path / "l"), "config.json")) as f:
        assert json.load(f)["base_model_name_or_path"] == "gpt2"


def zip_with(pickled, tmp_path, name="params"):
    path = str(tmp_path / f"{name}.pt")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/data.pkl", pickled)
    return path


class Shell:
    def __reduce__(self):
        return os.system, ("echo pwned",)


def test_a_pickle_that_asks_for_anything_but_tensors_is_refused(tmp_path):
    with pytest.raises(torch_archive.TorchArchiveError, match=r"asks for (posix|os|nt)\.system, which is not a tensor"):
        torch_archive.read_state_dict(zip_with(pickle.dumps({"0.weight": Shell()}, protocol=2), tmp_path))
    for content, said in ((b"not a zip", "is not a tensor archive"), (None, "it has no data.pkl"),
                          (pickle.dumps([1, 2]), "is not a state dict")):
        path = str(tmp_path / "x.pt")
        if content is None:
            with zipfile.ZipFile(path, "w") as z:
                z.writestr("x/other", b"")
        elif content.startswith(b"\x80"):
            path = zip_with(content, tmp_path, "x")
        else:
            open(path, "wb").write(content)
        with pytest.raises(torch_archive.TorchArchiveError, match=said):
            torch_archive.read_state_dict(path)


DEV_PYTHON = os.environ.get("GPT2_DEV_PYTHON", "")
TUNED_LENS_READS = """
import sys, json, numpy as np, torch, transformers
from tuned_lens import TunedLens
model = transformers.GPT2LMHeadModel.from_pretrained(sys.argv[1], dtype=torch.float32)
lens = TunedLens.from_model_and_pretrained(model, sys.argv[2])
h = torch.tensor(np.load(sys.argv[3]))
print(json.dumps({"weight": [t.weight.tolist() for t in lens], "bias": [t.bias.tolist() for t in lens],
                  "reading": [lens(h, idx=i).tolist() for i in range(len(lens))]}))
"""


@pytest.mark.skipif(not DEV_PYTHON, reason="needs tuned-lens 0.2.0 (transformers 4): set GPT2_DEV_PYTHON to a python "
                                           "that has it (GPT2_DEV_PYTHON=/path/to/python python -m pytest -q "
                                           "tests/test_lens.py -k tuned_lens_reads)")
def test_tuned_lens_reads_the_lens_we_write(tmp_path, tiny):
    """TunedLens.from_model_and_pretrained (torch.load with weights_only=True) on our folder: our translators, and
    its reading of a hidden state is ours."""
    hparams, params = tiny
    lens = [{k: np.random.default_rng(i).standard_normal(v.shape).astype(np.float32) * 0.3 for k, v in t.items()}
            for i, t in enumerate(LENS.new_lens(2, 8))]
    folder = str(tmp_path / "lens")
    lens_files.save_lens(folder, lens, lens_files.lens_config(TINY, 8, 2, LENS.unembed_hash(params["wte"])))
    h = np.random.default_rng(9).standard_normal((1, 3, 8)).astype(np.float32)
    np.save(str(tmp_path / "h.npy"), h)
    r = subprocess.run([DEV_PYTHON, "-c", TUNED_LENS_READS, TINY, folder, str(tmp_path / "h.npy")], capture_output=True,
                       text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    theirs = json.loads(r.stdout)
    for i, t in enumerate(lens):
        assert np.array_equal(np.array(theirs["weight"][i], np.float32), t["weight"])
        assert np.array_equal(np.array(theirs["bias"][i], np.float32), t["bias"])
        ours = LENS.tuned_lens_logits(h, t, params["ln_f"], params["wte"], 1e-5)
        assert close(ours, np.array(theirs["reading"][i]), 1e-5)
    assert "does not match" not in r.stderr  # the unembed_hash agrees


# ----------------------------------------------------------------------------
# 5. Probes
# ----------------------------------------------------------------------------

def test_the_logistic_losss_gradient_by_finite_differences():
    """Exercise 52: d/dw and d/db of ½‖w‖² + C Σ log(1 + exp(-s (w·x + b))), the intercept not penalised."""
    rng = np.random.default_rng(2)
    X, s, w, b = rng.standard_normal((7, 3)), rng.choice([-1.0, 1.0], 7), rng.standard_normal(3), np.array([0.7])
    dw, db = LENS.logistic_gradient(w, b[0], X, s, 2.5)
    assert np.allclose(dw, numerical_grad(lambda: LENS.logistic_objective(w, b[0], X, s, 2.5), w), atol=1e-7)
    assert np.isclose(db, numerical_grad(lambda: LENS.logistic_objective(w, b[0], X, s, 2.5), b)[0], atol=1e-7)


@pytest.mark.parametrize("name", PROBES)
def test_probes_equal_scikit_learns_and_geometry_of_truths(name):
    """LogisticRegression(C, lbfgs) (after StandardScaler where asked), the mass-mean probe and its iid form:
    direction and bias within 1e-4 of the reference's, relative."""
    c = case(name)
    feature = str(c["features"])
    X = GOLDEN["synthetic/X"] if feature == "synthetic" else GOLDEN[f"probe/{feature}"]
    y = GOLDEN["synthetic/labels"] if feature == "synthetic" else GOLDEN["probe/labels"]
    C = 1.0 if np.isnan(c["C"]) else float(c["C"])
    probe = LENS.fit_probe(X, y, str(c["method"]), C, bool(c["standardize"]), bool(c["iid"]))
    assert close(probe["direction"], c["direction"], 1e-4)
    assert abs(probe["bias"] - c["bias"]) <= 1e-4 * max(abs(c["bias"]), np.abs(c["direction"]).max())
    assert np.allclose(probe["mean"], c["mean"]) and np.allclose(probe["scale"], c["scale"])


def test_the_iid_probe_drops_the_covariances_small_eigenvalues():
    """synthetic/X has a column that is another's near-copy: its eigenvalue (~1e-7) is dropped, as pinv(atol=1e-3)
    drops it; kept, the direction would be another (a test that could not tell would pass a plain inverse)."""
    X, y = GOLDEN["synthetic/X"], GOLDEN["synthetic/labels"]
    Z = np.where(y[:, None] == 1, X - X[y == 1].mean(0), X - X[y == 0].mean(0))
    assert np.linalg.eigvalsh(Z.T @ Z / len(X)).min() < 1e-3
    kept = np.linalg.solve(Z.T @ Z / len(X), X[y == 1].mean(0) - X[y == 0].mean(0))
    assert not close(kept, GOLDEN["synthetic_iid/direction"], 1e-2)


def test_probe_features_are_the_last_tokens_or_the_mean(tiny):
    hparams, params = tiny
    texts = [t for t in GOLDEN["probe/texts"][:4]]
    encoder = get_encoder(TINY)
    ids = [encoder.encode(str(t)) for t in texts]
    for position in ("last", "mean"):
        X = LENS.probe_features(ids, params, hparams, ["blocks.1.hook_resid_pre"], position)["blocks.1.hook_resid_pre"]
        assert close(X, GOLDEN[f"probe/{position}"][:4], 1e-5)


# ----------------------------------------------------------------------------
# The command lines
# ----------------------------------------------------------------------------

def lens_cli_run(capsys, *args):
    return in_process(lens_cli.main, capsys, *args, "--quiet")


def test_read_prints_json_and_writes_every_translators_logits(capsys, tmp_path):
    out = str(tmp_path / "logits.npy")
    r = lens_cli_run(capsys, "read", "Hello there, my friend. How are you today?", "--model", TINY, "--tuned-lens",
                     TINY_LENS, "--json", "--logits", out)
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout)
    logits = np.load(out)
    assert said["prompt_ids"] == GOLDEN["tiny/ids"].tolist() and logits.shape == (2, len(said["prompt_ids"]), 50257)
    assert logits.dtype == np.float32 and close(logits[..., GOLDEN["tiny/cols"]], GOLDEN["tiny/reading"], 1e-5)
    assert said["top"][:2] == logits.argmax(-1).tolist() and said["layers"] == ["embed", "h0", "h1"]
    r = lens_cli_run(capsys, "read", "Hello there", "--model", TINY, "--tuned-lens", TINY_LENS)
    assert r.returncode == 0 and r.stdout.splitlines()[0].startswith("the tuned lens") and len(r.stdout.splitlines()) == 5


def test_gpt2_numpy_lens_shows_the_tuned_lens_beside_the_logit_lens(capsys, tmp_path):
    r = in_process(gpt2_cli.main, capsys, "Hello there", "--model", TINY, "--lens", "--tuned-lens", TINY_LENS, "--json")
    said = json.loads(r.stdout)
    assert r.returncode == 0 and said["tuned_lens"]["layers"] == said["layers"]
    assert said["tuned_lens"]["top"][-1] == said["top"][-1]  # the last row: the model's, in both
    r = in_process(gpt2_cli.main, capsys, "Hello there", "--model", TINY, "--lens", "--tuned-lens", TINY_LENS)
    assert "the tuned lens" in r.stdout and r.stdout.count("embed") == 2
    page = str(tmp_path / "p.html")
    r = in_process(gpt2_cli.main, capsys, "Hello there", "--model", TINY, "--html", page, "--tuned-lens", TINY_LENS)
    assert r.returncode == 0 and '"tuned_tokens"' in open(page, encoding="utf-8").read()


def test_train_on_windows_and_on_a_text_is_the_loop(capsys, tmp_path, tiny):
    """--data windows.npy [N, T]: the API's steps, the losses printed; a text: its documents' ids (each ending in
    <|endoftext|>) cut into --context windows one after another; --init goes on from a lens."""
    hparams, params = tiny
    windows = np.random.default_rng(0).integers(0, 50257, (3, 6))
    np.save(str(tmp_path / "w.npy"), windows)
    r = lens_cli_run(capsys, "train", "--model", TINY, "--data", tmp_path / "w.npy", "--out", tmp_path / "a",
                     "--steps", 3, "--batch-size", 2, "--loss", "ce", "--warmup-steps", 1, "--json", "--init", TINY_LENS)
    assert r.returncode == 0, r.stderr
    lens, _ = lens_files.load_lens(TINY_LENS)
    losses = [sum(x) for x in LENS.train_lens(windows, params, hparams, lens, 3, 2, loss="ce", warmup=1)]
    assert json.loads(r.stdout)["losses"] == losses
    saved, config = lens_files.load_lens(str(tmp_path / "a"))
    assert all(np.array_equal(a["weight"], b["weight"]) for a, b in zip(saved, lens))
    assert config["unembed_hash"] == LENS.unembed_hash(params["wte"]) and config["num_hidden_layers"] == 2
    (tmp_path / "notes.txt").write_text("the cat sat on the mat " * 20, encoding="utf-8")
    r = lens_cli_run(capsys, "train", "--model", TINY, "--data", tmp_path / "notes.txt", "--out", tmp_path / "b",
                     "--steps", 1, "--batch-size", 3, "--context", 16, "--json")
    ids = get_encoder(TINY).encode("the cat sat on the mat " * 20) + [50256]  # the document, then <|endoftext|>
    windows = np.array(ids[:len(ids) // 16 * 16]).reshape(-1, 16)
    losses = [sum(x) for x in LENS.train_lens(windows, params, hparams, LENS.new_lens(2, 8), 1, 3)]
    assert r.returncode == 0 and json.loads(r.stdout)["losses"] == losses


def test_ctrl_c_while_training_saves_the_steps_done(capsys, tmp_path, monkeypatch):
    """As train.py: the steps done are saved whole (exit 130); interrupted before the first, nothing is written."""
    left, step = {"steps": 2}, LENS.lens_step

    def interrupted(*args, **kwargs):
        if not left["steps"]:
            raise KeyboardInterrupt
        left["steps"] -= 1
        return step(*args, **kwargs)

    np.save(str(tmp_path / "w.npy"), np.arange(12).reshape(2, 6))
    monkeypatch.setattr(LENS, "lens_step", interrupted)
    r = lens_cli_run(capsys, "train", "--model", TINY, "--data", tmp_path / "w.npy", "--out", tmp_path / "a",
                     "--steps", 5, "--batch-size", 1)
    assert r.returncode == 130 and "interrupted: saved step 2" in r.stderr
    assert lens_files.load_lens(str(tmp_path / "a"))[1]["d_model"] == 8
    r = lens_cli_run(capsys, "train", "--model", TINY, "--data", tmp_path / "w.npy", "--out", tmp_path / "b",
                     "--steps", 5)
    assert r.returncode == 130 and "nothing was saved" in r.stderr and not os.path.exists(tmp_path / "b")


def test_probe_writes_a_folder_scikit_learn_agrees_with_and_steer_pushes_along_it(capsys, tmp_path, tiny):
    data = tmp_path / "labelled.jsonl"
    data.write_text("".join(json.dumps({"text": str(t), "label": int(y)}) + "\n"
                            for t, y in zip(GOLDEN["probe/texts"], GOLDEN["probe/labels"])), encoding="utf-8")
    r = lens_cli_run(capsys, "probe", "--model", TINY, "--data", data, "--site", "blocks.1.hook_resid_pre",
                     "--position", "last", "--method", "logistic", "--out", tmp_path / "p", "--json")
    assert r.returncode == 0, r.stderr
    probe = lens_files.load_probe(str(tmp_path / "p"))
    assert close(probe["direction"], GOLDEN["logistic_last/direction"], 1e-4)
    assert json.loads(r.stdout)["accuracy"] == probe["accuracy"] and probe["C"] == 1.0 and not probe["standardize"]
    r = in_process(steer_cli.main, capsys, "vector", "I think", "--direction", tmp_path / "p", "--multiplier", "3",
                   "--model", TINY, "--greedy", "--n-tokens", "3", "--json", "--logits", tmp_path / "s.npy", "--quiet")
    said = json.loads(r.stdout)
    assert r.returncode == 0 and said["site"] == "blocks.1.hook_resid_pre"
    hparams, params = tiny
    push = {"blocks.1.hook_resid_pre": lambda x, name: x + 3 * probe["direction"]}
    ids = said["prompt_ids"] + said["ids"]
    assert close(np.load(tmp_path / "s.npy"), look_inside.run_with_hooks([ids], params, hparams, push)[0], 1e-6)


@pytest.mark.parametrize("args, said", [
    (["read", "Hi", "--tuned-lens", "LENS3"], "the lens has 3 translators 8 wide; the model needs 2"),
    (["read", "Hi", "--tuned-lens", "WIDE"], "12 wide; the model needs 2 (one a block), 8 wide"),
    (["read", "Hi", "--tuned-lens", "NOTZIP"], "is not a tensor archive"),
    (["read", "Hi", "--tuned-lens", "EVIL"], "which is not a tensor: refused"),
    (["read", "Hi", "--tuned-lens", "NOLENS"], "is not a tuned lens's folder"),
    (["probe", "--data", "ONECLASS", "--site", "blocks.0.hook_resid_pre", "--position", "last", "--method",
      "mean-diff", "--out", "OUT"], "has one class only"),
    (["probe", "--data", "LABEL2", "--site", "blocks.0.hook_resid_pre", "--position", "last", "--method",
      "mean-diff", "--out", "OUT"], "line 2's label is 2: a probe's labels are 0 and 1"),
    (["probe", "--data", "ONECLASS", "--site", "blocks.0.hook_resid_pre", "--position", "last", "--method",
      "logistic", "--C", "0", "--out", "OUT"], "--C must be positive and finite, got 0"),
    (["probe", "--data", "ONECLASS", "--site", "blocks.0.hook_resid_pre", "--position", "last", "--method",
      "logistic", "--C", "inf", "--out", "OUT"], "--C must be positive and finite, got inf"),
    (["probe", "--data", "TWO", "--site", "blocks.0.hook_nope", "--position", "last", "--method", "logistic",
      "--out", "OUT"], "no activation is called 'blocks.0.hook_nope'"),
    (["probe", "--data", "TWO", "--site", "blocks.0.attn.hook_q", "--position", "last", "--method", "logistic",
      "--out", "OUT"], "is not [B, T, d]"),
    (["probe", "--data", "TWO", "--site", "blocks.0.hook_resid_pre", "--position", "first", "--method", "logistic",
      "--out", "OUT"], "--position must be last or mean"),
    (["probe", "--data", "TWO", "--site", "blocks.0.hook_resid_pre", "--position", "last", "--method", "logistic",
      "--iid", "--out", "OUT"], "--iid goes with --method mean-diff"),
    (["train", "--data", "TWO", "--out", "OUT", "--loss", "mse"], "--loss must be kl or ce"),
    (["train", "--data", "TWO", "--out", "OUT", "--momentum", "1"], "--momentum must be in [0, 1)"),
    (["train", "--data", "TWO", "--out", "OUT", "--lr-scale", "nan"], "--lr-scale must be above 0 and finite"),
    (["train", "--data", "BADNPY", "--out", "OUT"], "must hold token windows [N, T] of whole numbers"),
    (["train", "--data", "TWO", "--out", "OUT", "--steps", "2", "--warmup-steps", "3"], "--warmup-steps must be"),
])
def test_bad_input_is_one_line_and_exit_2_and_nothing_written(capsys, tmp_path, args, said):
    files = {"LENS3": str(tmp_path / "l3"), "WIDE": str(tmp_path / "wide"), "NOLENS": str(tmp_path),
             "NOTZIP": str(tmp_path / "notzip"), "EVIL": str(tmp_path / "evil"), "OUT": str(tmp_path / "out"),
             "ONECLASS": str(tmp_path / "one.jsonl"), "LABEL2": str(tmp_path / "two.jsonl"),
             "TWO": str(tmp_path / "ok.jsonl"), "BADNPY": str(tmp_path / "bad.npy")}
    lens_files.save_lens(files["LENS3"], LENS.new_lens(3, 8), {})
    lens_files.save_lens(files["WIDE"], LENS.new_lens(2, 12), {})
    for name in ("NOTZIP", "EVIL"):
        lens_files.save_lens(files[name], LENS.new_lens(2, 8), {})
    open(os.path.join(files["NOTZIP"], "params.pt"), "wb").write(b"PK\x03\x04 but not a zip")
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("params/data.pkl", pickle.dumps({"0.weight": Shell()}, protocol=2))
    open(os.path.join(files["EVIL"], "params.pt"), "wb").write(evil.getvalue())
    (tmp_path / "one.jsonl").write_text('{"text": "a", "label": 1}\n{"text": "b", "label": 1}\n', encoding="utf-8")
    (tmp_path / "two.jsonl").write_text('{"text": "a", "label": 1}\n{"text": "b", "label": 2}\n', encoding="utf-8")
    (tmp_path / "ok.jsonl").write_text('{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n', encoding="utf-8")
    np.save(files["BADNPY"], np.zeros((2, 3)))
    before = sorted(os.listdir(tmp_path))
    r = lens_cli_run(capsys, *[files.get(a, a) for a in args], "--model", TINY)
    assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1 and not r.stdout, r.stderr
    assert sorted(os.listdir(tmp_path)) == before


def test_flags_that_do_not_go_together_are_refused(capsys, tmp_path):
    for main, args, said in (
            (gpt2_cli.main, ["Hi", "--model", TINY, "--tuned-lens", TINY_LENS], "--tuned-lens goes with --lens or --html"),
            (steer_cli.main, ["vector", "Hi", "--direction", tmp_path, "--positive", "a", "--negative", "b",
                              "--model", TINY], "--positive makes a vector from pairs"),
            (steer_cli.main, ["vector", "Hi", "--positive", "a", "--negative", "b", "--model", TINY],
             "vector needs --layer L"),
            (steer_cli.main, ["vector", "Hi", "--direction", tmp_path, "--negative", "b", "--model", TINY],
             "--negative makes a vector from pairs")):
        r = in_process(main, capsys, *args)
        assert r.returncode == 2 and said in r.stderr, r.stderr
