"""python sae.py train|eval|encode|features on tests/data/hf/tiny: a few training steps equal SAELens's trainer,
eval prints SAELens's metrics, and every bad input is one line, exit 2, nothing written."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import DATA, ROOT

from plumbing import sae_files
from plumbing.errors import UserError

GOLDEN = np.load(os.path.join(DATA, "sae_golden.npz"))
MODEL = os.path.join(DATA, "hf", "tiny")
SAE_DIR = os.path.join(DATA, "sae_golden", "sae")
HOOK = "blocks.1.hook_resid_pre"
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 6


def run(*args, timeout=300):
    return subprocess.run([sys.executable, os.path.join(ROOT, "sae.py"), *args, "--model", MODEL], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sae")
    (folder / "text.txt").write_text(TEXT)
    batches = GOLDEN["train/batches"]
    np.save(folder / "acts.npy", batches.reshape(-1, 8))
    return folder


def test_train_from_a_saelens_folder_on_its_batches_equals_saelens_trainer(data, tmp_path):
    steps, n = GOLDEN["train/batches"].shape[:2]
    r = run("train", "--init", SAE_DIR, "--activations", str(data / "acts.npy"), "--l1", "0.3", "--l1-warm-up", "2",
            "--lr", "3e-3", "--batch-tokens", str(n), "--tokens", str(steps * n), "--out", str(tmp_path / "out"),
            "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"] == steps
    sae = sae_files.load_sae(str(tmp_path / "out"))
    for k in ("W_enc", "b_enc", "W_dec", "b_dec"):
        np.testing.assert_allclose(sae[k], GOLDEN[f"train/{k}"], rtol=1e-5, atol=1e-7)
    with open(tmp_path / "out" / "train_log.jsonl") as f:
        log = [json.loads(line) for line in f]
    assert [e["step"] for e in log] == list(range(steps))
    np.testing.assert_allclose([[e["mse_loss"], e["l1_loss"]] for e in log], GOLDEN["train/losses"], rtol=1e-5)
    assert sae["cfg"]["metadata"]["hook_name"] == HOOK


def test_train_on_text_then_eval_encode_and_features(data, tmp_path):
    out = tmp_path / "sae"
    r = run("train", "--site", HOOK, "--data", str(data / "text.txt"), "--d-sae", "16", "--l1", "1", "--tokens", "256",
            "--batch-tokens", "64", "--context", "16", "--out", str(out), "--normalize", "expected_average_only_in")
    assert r.returncode == 0, r.stderr
    assert "step 4/4" in r.stderr and "mse=" in r.stderr and "l0=" in r.stderr
    cfg = json.loads((out / "cfg.json").read_text())
    assert cfg["normalize_activations"] == "none" and cfg["d_sae"] == 16  # the factor is folded in
    r = run("eval", "--sae", str(out), "--data", str(data / "text.txt"), "--context", "16", "--json")
    assert r.returncode == 0, r.stderr
    metrics = json.loads(r.stdout)
    assert {"l0", "explained_variance", "ce_loss_score", "kl_div_score"} <= set(metrics) and metrics["l0"] > 0
    r = run("encode", "--sae", str(out), "--text", "All:\nSpeak", "--k", "3", "--json")
    assert r.returncode == 0, r.stderr
    encoded = json.loads(r.stdout)
    assert encoded["tokens"][0] == "<|endoftext|>" and len(encoded["positions"]) == len(encoded["tokens"])
    assert all(len(p["ids"]) <= 3 and p["error"] >= 0 for p in encoded["positions"])
    r = run("features", "--sae", str(out), "--data", str(data / "text.txt"), "--context", "16", "--feature", "2",
            "--json", "--html", str(tmp_path / "f.html"))
    assert r.returncode == 0, r.stderr
    [feature] = json.loads(r.stdout)["features"]
    assert feature["feature"] == 2 and 0 <= feature["density"] <= 1 and len(feature["promotes"]) == 10
    assert "latent 2" in (tmp_path / "f.html").read_text()


def bad_folder(tmp_path, cfg, weights=True):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "cfg.json").write_text(json.dumps(cfg))
    if weights:
        shutil.copy(os.path.join(SAE_DIR, "sae_weights.safetensors"), folder)
    return str(folder)


def wrong_npy(tmp_path, array):
    np.save(tmp_path / "wrong.npy", array)
    return str(tmp_path / "wrong.npy")


TRAIN = ["--l1", "1", "--tokens", "64", "--batch-tokens", "64"]


@pytest.mark.parametrize("case, words", [
    (lambda d, t: ["train", "--site", "blocks.7.hook_resid_pre", "--data", d, "--d-sae", "4", *TRAIN],
     "no activation is called 'blocks.7.hook_resid_pre'"),
    (lambda d, t: ["eval", "--sae", bad_folder(t, {"d_in": 16, "d_sae": 32, "architecture": "standard",
                                                   "metadata": {"hook_name": HOOK}}), "--data", d],
     "W_enc must be [16, 32]"),
    (lambda d, t: ["encode", "--sae", bad_folder(t, {"d_in": 8, "d_sae": 32, "architecture": "standard", "metadata": {
        "sae_lens_version": "6.54.12", "hook_name": "blocks.0.mlp.hook_pre"}}), "--text", "hi"],
     "reads 8 numbers a token but blocks.0.mlp.hook_pre has 32"),
    (lambda d, t: ["encode", "--sae", bad_folder(t, {"d_in": 8, "d_sae": 32, "metadata": {
        "sae_lens_version": "6.54.12", "hook_name": HOOK}}), "--text", "hi"], "no architecture"),
    (lambda d, t: ["encode", "--sae", bad_folder(t, {"d_in": 8, "d_sae": 32, "architecture": "jumprelu", "metadata": {
        "sae_lens_version": "6.54.12", "hook_name": HOOK}}), "--text", "hi"], "threshold must be"),
    (lambda d, t: ["encode", "--sae", bad_folder(t, {"d_in": 8, "d_sae": 32, "architecture": "standard"}, False),
                   "--text", "hi"], "no sae_weights.safetensors"),
    (lambda d, t: ["train", "--site", HOOK, "--data", d, "--d-sae", "0", *TRAIN], "--d-sae must be at least 1"),
    (lambda d, t: ["train", "--site", HOOK, "--data", d, "--d-sae", "4", "--l1", "-1", "--tokens", "64"],
     "--l1 must be a finite number 0 or more"),
    (lambda d, t: ["train", "--site", HOOK, "--data", d, "--d-sae", "4", "--l1", "1", "--tokens", "10"],
     "too few for one batch"),
    (lambda d, t: ["train", "--site", HOOK, "--activations", wrong_npy(t, np.zeros((70, 9), np.float32)),
                   "--d-sae", "4", *TRAIN], "must be [N, 8] float32"),
    (lambda d, t: ["train", "--site", HOOK, "--activations", wrong_npy(t, np.zeros((70, 8), np.float64)),
                   "--d-sae", "4", *TRAIN], "float64"),
    (lambda d, t: ["features", "--sae", SAE_DIR, "--data", d, "--feature", "32"], "--feature must be a latent, 0 to 31"),
    (lambda d, t: ["eval", "--sae", str(t / "nothing"), "--data", d], "no such folder"),
    (lambda d, t: ["train", "--init", SAE_DIR, "--d-sae", "64", "--data", d, *TRAIN], "has 32 latents, not --d-sae 64"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(data, tmp_path, case, words):
    args = case(str(data / "text.txt"), tmp_path)
    before = sorted(os.listdir(tmp_path))
    r = run(*args, "--out", str(tmp_path / "out")) if args[0] == "train" else run(*args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and words in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == before


def sae_cli_main(capsys, *args):
    from conftest import in_process
    from interface import sae_cli

    return in_process(sae_cli.main, capsys, *args, "--model", MODEL)


NEW = ["train", "--site", HOOK, "--d-sae", "16", "--batch-tokens", "64", "--context", "16"]


@pytest.mark.parametrize("flags, words", [
    (["--l1", "nan", "--tokens", "64"], "--l1 must be a finite number 0 or more, got nan"),
    (["--l1", "inf", "--tokens", "64"], "--l1 must be a finite number 0 or more, got inf"),
    (["--l1", "1", "--lr", "inf", "--tokens", "64"], "--lr must be a finite number above 0, got inf"),
    (["--l1", "1", "--lr", "nan", "--tokens", "64"], "--lr must be a finite number above 0, got nan"),
    (["--l1", "1", "--tokens", "99999999999999"], "no run finishes that many"),
    (["--l1", "1"], "train needs --tokens K"),
    (["--tokens", "64"], "--architecture standard needs --l1 C"),
    (["--architecture", "topk", "--l1", "1", "--tokens", "64"], "--l1 goes with --architecture standard, not topk"),
    (["--architecture", "jumprelu", "--k", "4", "--tokens", "64"], "--k goes with --architecture topk or batchtopk"),
    (["--architecture", "topk", "--topk-threshold-lr", "0.1", "--tokens", "64"],
     "--topk-threshold-lr goes with --architecture batchtopk, not topk"),
    (["--architecture", "topk", "--k", "17", "--tokens", "64"], "--k 17 is more than the --d-sae 16 latents"),
    (["--architecture", "topk", "--k", "2.5", "--tokens", "64"], "--k must be a whole number for topk"),
    (["--architecture", "batchtopk", "--k", "inf", "--tokens", "64"], "--k must be a finite number above 0"),
    (["--architecture", "batchtopk", "--topk-threshold-lr", "1.5", "--tokens", "64"],
     "must be a finite number in [0, 1]"),
    (["--architecture", "topk", "--aux-loss-coefficient", "-1", "--tokens", "64"], "--aux-loss-coefficient must be"),
    (["--architecture", "topk", "--rescale-acts-by-decoder-norm", "yes", "--tokens", "64"], "must be true or false"),
    (["--architecture", "jumprelu", "--jumprelu-bandwidth", "0", "--tokens", "64"], "--jumprelu-bandwidth must be"),
    (["--architecture", "jumprelu", "--jumprelu-init-threshold", "nan", "--tokens", "64"], "--jumprelu-init-threshold"),
    (["--architecture", "jumprelu", "--jumprelu-tanh-scale", "-inf", "--tokens", "64"], "--jumprelu-tanh-scale"),
    (["--architecture", "jumprelu", "--l0-coefficient", "inf", "--tokens", "64"], "--l0-coefficient must be"),
    (["--architecture", "jumprelu", "--pre-act-loss-coefficient", "-0.5", "--tokens", "64"], "--pre-act-loss"),
    (["--architecture", "jumprelu", "--jumprelu-sparsity-loss-mode", "quadratic", "--tokens", "64"], "invalid choice"),
    (["--architecture", "resnet", "--tokens", "64"], "invalid choice: 'resnet'"),
    (["--skip-transcoder", "--l1", "1", "--tokens", "64"], "--skip-transcoder goes with --site-out HOOK"),
    (["--site-out", HOOK, "--l1", "1", "--tokens", "64"], "--site-out is --site blocks.1.hook_resid_pre: an SAE"),
    (["--site-out", "blocks.9.hook_mlp_out", "--l1", "1", "--tokens", "64"], "no activation is called 'blocks.9."),
    (["--site-out", "blocks.1.hook_mlp_out", "--architecture", "topk", "--skip-transcoder", "--tokens", "64"],
     "SAELens has no TopK skip transcoder"),
    (["--site-out", "blocks.1.hook_mlp_out", "--l1", "1", "--normalize", "expected_average_only_in", "--tokens", "64"],
     "a transcoder trains with --normalize-activations none, layer_norm or constant_norm_rescale"),
    (["--site-out", "blocks.1.hook_mlp_out", "--architecture", "topk", "--normalize", "layer_norm", "--tokens", "64"],
     "a TopK transcoder is read back as SAELens's topk SAE, which de-normalises its output"),
    (["--site-out", "blocks.1.mlp.hook_pre", "--architecture", "topk", "--k", "3", "--tokens", "64"],
     "which writes as many numbers as it reads: blocks.1.hook_resid_pre has 8, --site-out blocks.1.mlp.hook_pre 32"),
    (["--normalize-activations", "whitening", "--l1", "1", "--tokens", "64"], "invalid choice"),
    (["--l1", "1", "--tokens", "64", "--d-sae", "99999999999"], "GB are free: choose a smaller --d-sae"),
    (["--l1", "1", "--tokens", "64", "--d-sae", "1000000000000"], "needs 1.8 PB, but"),  # not "1808000.0 GB"
])
def test_every_train_flag_is_checked_before_any_work(data, tmp_path, capsys, flags, words):
    r = sae_cli_main(capsys, *NEW, "--data", data / "text.txt", *flags, "--out", tmp_path / "out")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("site_out, array, words", [
    (None, np.where(np.arange(8) == 3, np.nan, 0.0), "acts.npy: row 37 holds nan: an SAE trains on finite numbers"),
    (None, np.where(np.arange(8) == 3, -np.inf, 0.0), "acts.npy: row 37 holds -inf"),
    ("blocks.1.hook_mlp_out", np.zeros(8), "must be [N, 16] float32 (blocks.1.hook_resid_pre's width and blocks.1."
                                           "hook_mlp_out's, each row the input then the target), is [100, 8]")])
def test_activations_with_a_nan_or_of_the_wrong_width_are_refused_before_a_step(tmp_path, capsys, site_out, array,
                                                                                 words):
    acts = np.zeros((100, len(array)), np.float32)
    acts[37] = array
    np.save(tmp_path / "acts.npy", acts)
    r = sae_cli_main(capsys, *NEW, "--activations", tmp_path / "acts.npy", "--l1", "1", "--tokens", "64",
                     *(["--site-out", site_out] if site_out else []), "--out", tmp_path / "out")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["acts.npy"]


@pytest.mark.parametrize("arch, saved", [("standard", True), ("topk", False), ("batchtopk", False),
                                         ("jumprelu", True)])
def test_a_diverged_run_is_one_line_exit_2_and_saves_no_nan(data, tmp_path, capsys, arch, saved):
    """--lr 1e30: step 1 makes weights of 1e30, and step 2's loss is nan. As train.py: no update from that step, the
    steps before it saved where the SAE they made is finite (a TopK's decoder norms overflow as they are folded in:
    nothing is saved then)."""
    flags = {"standard": ["--l1", "1"], "topk": ["--architecture", "topk", "--k", "3"],
             "batchtopk": ["--architecture", "batchtopk", "--k", "2"], "jumprelu": ["--architecture", "jumprelu"]}[arch]
    out = tmp_path / "out"
    r = sae_cli_main(capsys, *NEW, "--data", data / "text.txt", *flags, "--tokens", "640", "--lr", "1e30", "--quiet",
                     "--out", out)
    said = f"{out}; the likely cause: --lr 1e+30 too large\n"
    assert r.returncode == 2 and r.stderr == "error: step 2: the loss is nan: the run diverged; " + (
        f"saved step 1 in {said}" if saved else "nothing was saved; the likely cause: --lr 1e+30 too large\n"), r.stderr
    assert os.path.exists(out) == saved
    if saved:
        sae = sae_files.load_sae(str(out))
        assert all(np.isfinite(sae[k]).all() for k in sae_files.tensor_names(sae["cfg"]["architecture"]))
        assert len((out / "train_log.jsonl").read_text().splitlines()) == 1


def test_topk_under_layer_norm_trains_until_a_latent_is_dead_then_stops_as_saelens(data, tmp_path, capsys):
    """SAELens 6.54.12 trains a TopK SAE with AuxK under layer_norm while no latent is dead, and raises at the first
    step with one: here that step is one line, exit 2, the steps before it saved; --resume with
    --aux-loss-coefficient 0 goes on."""
    out = tmp_path / "out"
    r = sae_cli_main(capsys, *NEW, "--data", data / "text.txt", "--architecture", "topk", "--k", "2", "--normalize",
                     "layer_norm", "--dead-feature-window", "2", "--tokens", "640", "--quiet", "--out", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "takes no AuxK loss under normalize_activations layer_norm" in r.stderr and "saved step 3 in" in r.stderr
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [e["auxiliary_reconstruction_loss"] for e in log] == [0.0] * 3
    r = sae_cli_main(capsys, "train", "--out", out, "--resume", "--aux-loss-coefficient", "0", "--quiet")
    assert r.returncode == 0 and len((out / "train_log.jsonl").read_text().splitlines()) == 10, r.stderr


def test_init_from_a_transcoder_is_refused_not_trained_as_an_sae(data, tmp_path, capsys):
    """A TopK transcoder is a topk folder whose metadata names hook_name_out: --init would have trained it to
    rebuild its own input."""
    topk = sae_files.load_sae(os.path.join(DATA, "sae_arch", "topk"))
    topk["cfg"]["metadata"]["hook_name_out"] = "blocks.1.hook_mlp_out"
    sae_files.save_sae(str(tmp_path / "topk_tc"), topk)
    for folder in (str(tmp_path / "topk_tc"), os.path.join(DATA, "sae_arch", "transcoder")):
        r = sae_cli_main(capsys, "train", "--init", folder, "--data", data / "text.txt", "--tokens", "64",
                         "--batch-tokens", "64", "--out", tmp_path / "out")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is a transcoder (from blocks." in r.stderr, \
            r.stderr
    assert sorted(os.listdir(tmp_path)) == ["topk_tc"]


def test_out_a_file_is_said_to_be_a_file(data, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    r = sae_cli_main(capsys, *NEW, "--data", data / "text.txt", "--l1", "1", "--tokens", "64", "--out",
                     tmp_path / "file")
    said = f"error: {tmp_path / 'file'}: is a file, not a folder: choose a new one, or --resume the run saved there\n"
    assert r.returncode == 2 and r.stderr == said, r.stderr
    assert (tmp_path / "file").read_text() == "x"


def test_a_site_the_model_lacks_says_how_many_blocks_it_has(data, tmp_path, capsys):
    r = sae_cli_main(capsys, "train", "--site", "blocks.7.hook_resid_pre", "--d-sae", "4", "--l1", "1", "--tokens",
                     "64", "--batch-tokens", "64", "--data", data / "text.txt", "--out", tmp_path / "out")
    assert r.returncode == 2 and "the model has 2 blocks, blocks.0 to blocks.1" in r.stderr, r.stderr


ARCHITECTURE_RUNS = {
    "standard": ["--l1", "1", "--l1-warm-up", "3", "--normalize", "expected_average_only_in"],
    "topk": ["--architecture", "topk", "--k", "3", "--dead-feature-window", "2"],
    "batchtopk": ["--architecture", "batchtopk", "--k", "2.5", "--dead-feature-window", "2"],
    "jumprelu": ["--architecture", "jumprelu", "--pre-act-loss-coefficient", "0.3", "--dead-feature-window", "2",
                 "--l0-warm-up-steps", "2", "--normalize-activations", "layer_norm"],
}


@pytest.mark.parametrize("arch", list(ARCHITECTURE_RUNS))
def test_ctrl_c_saves_the_steps_done_and_resume_continues_bit_for_bit(data, tmp_path, capsys, monkeypatch, arch):
    import sae as S

    run_flags = [*NEW, "--data", data / "text.txt", "--tokens", "640", "--lr", "1e-2", *ARCHITECTURE_RUNS[arch]]
    assert sae_cli_main(capsys, *run_flags, "--out", tmp_path / "straight").returncode == 0
    step, calls = S.training_step, []

    def ctrl_c_in_step_4(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(S, "training_step", ctrl_c_in_step_4)
    r = sae_cli_main(capsys, *run_flags, "--out", tmp_path / "stopped")
    said = f"interrupted: saved step 3 in {tmp_path / 'stopped'}; --resume continues"
    assert r.returncode == 130 and said in r.stderr, r.stderr
    assert len((tmp_path / "stopped" / "train_log.jsonl").read_text().splitlines()) == 3
    monkeypatch.setattr(S, "training_step", step)
    r = sae_cli_main(capsys, "train", "--out", tmp_path / "stopped", "--resume", "--quiet")
    assert r.returncode == 0, r.stderr
    stopped, straight = tmp_path / "stopped", tmp_path / "straight"
    for name in ("sae_weights.safetensors", "cfg.json", "train_log.jsonl", "train_config.json"):
        assert (stopped / name).read_bytes() == (straight / name).read_bytes(), name
    with np.load(stopped / "train_state.npz") as a, np.load(straight / "train_state.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in a.files)  # factor: nan without one
    assert sorted(os.listdir(tmp_path)) == ["stopped", "straight"]


def test_ctrl_c_before_a_step_is_done_writes_nothing(data, tmp_path, capsys, monkeypatch):
    import sae as S

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(S, "training_step", ctrl_c)
    r = sae_cli_main(capsys, *NEW, "--data", data / "text.txt", "--tokens", "128", "--architecture", "topk", "--k",
                     "3", "--out", tmp_path / "out")
    assert r.returncode == 130 and "interrupted before a step was done: nothing was saved" in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


def test_resume_refuses_another_run_and_says_when_there_is_nothing_to_do(data, tmp_path, capsys):
    out = tmp_path / "out"
    assert sae_cli_main(capsys, *NEW, "--data", data / "text.txt", "--tokens", "128", "--l1", "1", "--out",
                        out).returncode == 0
    r = sae_cli_main(capsys, "train", "--out", out, "--resume", "--site", "blocks.0.hook_resid_pre")
    assert r.returncode == 2 and "whose --site is blocks.1.hook_resid_pre: leave out --site" in r.stderr, r.stderr
    r = sae_cli_main(capsys, "train", "--out", out, "--resume")
    assert r.returncode == 0 and "already trained for 2 steps, nothing to do" in r.stdout, r.stdout
    r = sae_cli_main(capsys, "train", "--out", out, "--resume", "--tokens", "256", "--l1", "2", "--quiet")
    assert r.returncode == 0 and "--l1 2.0 (the saved run had 1.0)" in r.stderr, r.stderr
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 4
    r = sae_cli_main(capsys, "train", "--out", tmp_path / "nothing", "--resume")
    assert r.returncode == 2 and "holds no saved run to --resume" in r.stderr, r.stderr


def test_a_bug_in_training_writes_nothing(data, tmp_path, capsys, monkeypatch):
    import sae as S

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a student's bug")

    monkeypatch.setattr(S, "training_step", broken)
    with pytest.raises(ZeroDivisionError):
        sae_cli_main(capsys, *NEW, "--data", data / "text.txt", "--tokens", "128", "--l1", "1", "--out",
                     tmp_path / "out")
    assert os.listdir(tmp_path) == []


def test_the_saved_cfg_says_the_context_used(data, tmp_path, capsys):
    r = sae_cli_main(capsys, *NEW[:-2], "--context", "1000", "--data", data / "text.txt", "--tokens", "128", "--l1",
                     "1", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "out" / "cfg.json").read_text())["metadata"]["context_size"] == 64  # tiny's n_ctx


def test_features_text_shows_contexts_and_both_token_lists_and_encode_says_what_its_error_is(data, capsys):
    r = sae_cli_main(capsys, "features", "--sae", SAE_DIR, "--data", data / "text.txt", "--context", "16",
                     "--feature", "2", "--k", "3", "--quiet")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("latent 2: firing density 0.")
    assert len(lines) == 1 + 3 + 2 and "[" in lines[1] and lines[4].split()[0] == "promotes"
    assert lines[5].split()[0] == "suppresses" and len(lines[5].split("' ")) >= 3
    r = sae_cli_main(capsys, "encode", "--sae", SAE_DIR, "--text", "All: speak", "--quiet")
    assert r.returncode == 0 and "the SAE's squared error at the position" in r.stdout.splitlines()[0], r.stdout


def test_sigterm_in_training_saves_the_steps_done_whole(data, tmp_path):
    big = tmp_path / "big.npy"
    np.save(big, np.random.default_rng(0).standard_normal((4096, 8)).astype(np.float32))
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "sae.py"), "train", "--model", MODEL, "--site", HOOK,
                          "--activations", str(big), "--d-sae", "2048", "--l1", "1", "--batch-tokens", "4096",
                          "--tokens", str(4096 * 10 ** 6), "--out", str(out)],
                         cwd=ROOT, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if line.startswith("training"):
            break
    time.sleep(2)  # some steps done
    p.send_signal(signal.SIGTERM)
    rest = p.stderr.read()
    assert p.wait(timeout=120) == 130, rest
    assert f"terminated: saved step" in rest and "--resume continues" in rest
    assert sorted(os.listdir(tmp_path)) == ["big.npy", "out"]  # nothing half-written beside it
    assert sorted(os.listdir(out)) == ["cfg.json", "sae_weights.safetensors", "train_config.json", "train_log.jsonl",
                                       "train_state.npz"]
    sae_files.load_sae(str(out))
    steps = [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert steps == list(range(len(steps)))  # every step done is logged, and none twice


def gpt2_numpy(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), *args, "--model", MODEL], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_readings_take_an_sae_spliced_in(tmp_path, capsys):
    import sae as S
    from gpt2_numpy import token_logprobs
    from interface.loading import load_model

    encoder, hparams, params = load_model(MODEL)
    text = "First Citizen: we are accounted poor"
    ids = encoder.encode(text)
    scores = {}
    for flags in ([], ["--sae", SAE_DIR], ["--sae", SAE_DIR, "--use-error-term"], ["--center-writing-weights"]):
        r = gpt2_numpy(text, "--score", "--json", *flags)
        assert r.returncode == 0, r.stderr
        scores[" ".join(flags)] = json.loads(r.stdout)
    logits = S.run_with_sae([ids[:-1]], params, hparams, sae_files.load_sae(SAE_DIR))[0]
    np.testing.assert_allclose(scores[f"--sae {SAE_DIR}"]["logprobs"][1:], token_logprobs(logits, ids[1:]), atol=1e-5)
    for same in (f"--sae {SAE_DIR} --use-error-term", "--center-writing-weights"):  # neither changes the output
        assert scores[same]["loss"] == pytest.approx(scores[""]["loss"], abs=1e-5)
    assert abs(scores[f"--sae {SAE_DIR}"]["loss"] - scores[""]["loss"]) > 1e-3
    assert scores[f"--sae {SAE_DIR}"]["sae"] == HOOK and "sae" not in scores[""]  # as circuits.py's JSON says it
    from conftest import in_process
    from interface import gpt2_cli

    r = in_process(gpt2_cli.main, capsys, text, "--score", "--sae", SAE_DIR, "--use-error-term", "--model", MODEL)
    assert r.stdout.startswith(f"with the SAE {SAE_DIR} at {HOOK} with its error term\ntoken "), r.stdout
    r = gpt2_numpy(text, "--trace", "--json", "--sae", SAE_DIR)
    names = [s["name"] for s in json.loads(r.stdout)["stages"]]
    assert names.index(f"{HOOK}.hook_sae_acts_post") == names.index(HOOK) + 3

    page = tmp_path / "page.html"
    r = in_process(gpt2_cli.main, capsys, text, "--html", page, "--sae", SAE_DIR, "--center-writing-weights",
                   "--model", MODEL)
    assert r.returncode == 0 and "the SAE at blocks.1.hook_resid_pre spliced in" in page.read_text(), r.stderr
    for flags, words in ((["--sae", SAE_DIR], "go with a reading"), (["--use-error-term", "--score"], "goes with --sae")):
        r = gpt2_numpy(text, *flags)
        assert r.returncode == 2 and words in r.stderr, r.stderr


def test_an_sae_from_the_hub_is_fetched_by_its_path_in_the_repository(tmp_path):
    from conftest import Mirror
    from plumbing import hub
    from plumbing.fetching import NotFound

    served = tmp_path / "mirror" / "jbloom" / "GPT2-Small-SAEs" / "resolve" / "main" / "blocks.1" / "sae"
    shutil.copytree(SAE_DIR, served)
    m = Mirror(str(tmp_path / "mirror"))
    try:
        folder = hub.download_hub_sae("jbloom/GPT2-Small-SAEs/blocks.1/sae", str(tmp_path / "models"), quiet=True,
                                      endpoint=m.url)
        assert sae_files.load_sae(folder)["cfg"]["d_sae"] == 32
        with pytest.raises(NotFound, match="no SAE at hf:jbloom/GPT2-Small-SAEs/nothing"):
            hub.download_hub_sae("jbloom/GPT2-Small-SAEs/nothing", str(tmp_path / "models"), quiet=True,
                                 endpoint=m.url)
        assert not os.path.exists(tmp_path / "models" / "hf" / "jbloom" / "GPT2-Small-SAEs" / "nothing")
    finally:
        m.close()
    with pytest.raises(UserError, match="hf:owner/name/PATH"):
        hub.download_hub_sae("jbloom/GPT2-Small-SAEs", str(tmp_path / "models"))


SAE_PYTHON = os.environ.get("GPT2_SAE_PYTHON", "")
LOAD_WITH_SAELENS = """import sys
from sae_lens import SAE
sae = SAE.load_from_disk(sys.argv[1])
print(sae.cfg.metadata.hook_name, sae.cfg.d_sae, float(sae.W_dec.sum()))
"""


@pytest.mark.skipif(not SAE_PYTHON, reason="needs sae-lens 6.54.12: set GPT2_SAE_PYTHON to a python that has it "
                                           "(GPT2_SAE_PYTHON=/work/saevenv/bin/python python -m pytest -q "
                                           "tests/test_sae_cli.py -k saelens_loads)")
@pytest.mark.parametrize("flags", [["--l1", "1"], ["--architecture", "topk", "--k", "3"],
                                   ["--architecture", "batchtopk", "--k", "2"], ["--architecture", "jumprelu"]])
def test_saelens_loads_what_sae_py_trains(data, tmp_path, flags):
    out = tmp_path / "sae"
    r = run("train", "--site", HOOK, "--data", str(data / "text.txt"), "--d-sae", "16", *flags, "--tokens", "128",
            "--batch-tokens", "64", "--context", "16", "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    r = subprocess.run([SAE_PYTHON, "-c", LOAD_WITH_SAELENS, str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    hook, d_sae, total = r.stdout.split()
    assert hook == HOOK and int(d_sae) == 16
    assert float(total) == pytest.approx(float(sae_files.load_sae(str(out))["W_dec"].sum()), rel=1e-5)


def test_dla_by_latent_on_a_topk_sae_lists_the_latents_that_fire_and_no_zeros(capsys):
    """A TopK SAE fires k latents a token: the table listed 16 more at 0.000 among "the 20 of the largest share"."""
    import sae as S
    from conftest import in_process
    from interface import circuits_cli
    from interface.loading import load_model

    folder, clean = os.path.join(DATA, "sae_arch", "topk"), "When Mary and John went to the store, John gave a drink to"
    encoder, hparams, params = load_model(MODEL)
    ids = [encoder.eot] + encoder.encode(clean)
    fired = np.flatnonzero(S.encode(S.gather(ids, params, hparams, HOOK)[0, -1:], sae_files.load_sae(folder))[0])
    assert len(fired) == 4  # k
    args = ("dla", "--clean", clean, "--answer", " Mary", "--wrong", " John", "--by", "latent", "--sae", folder,
            "--model", MODEL)
    r = in_process(circuits_cli.main, capsys, *args)
    assert "the 4 latents that fire, fewer than 20 (f_i W_dec[i]" in r.stdout, r.stdout
    assert sorted(int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("latent ")) == \
        fired.tolist()
    assert sorted(json.loads(in_process(circuits_cli.main, capsys, *args, "--json").stdout)["top"]) == fired.tolist()
