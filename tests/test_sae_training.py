"""sae.py's training of TopK, BatchTopK and JumpReLU SAEs (and the standard one's with run-time normalisation)
against SAELens 6.54.12: every loss term, every gradient (the threshold's included), four steps of SAETrainer,
the folder save_inference_model writes; finite differences where a derivative exists. Goldens by
tests/data/make_sae_training_golden.py, in tests/data/sae_training_golden.npz. Then its transcoders (issue 53 §7),
which SAELens does not train: finite differences, and the folder SAELens reads back (opt-in)."""
import json
import os
import subprocess

import numpy as np
import pytest
from conftest import DATA, in_process, numerical_grad

import sae as S
from interface.sae_cli import step_coefficient
from plumbing import sae_files

GOLDEN = np.load(os.path.join(DATA, "sae_training_golden.npz"))
JUMP = {"jumprelu_bandwidth": 0.5, "jumprelu_init_threshold": 0.3}
CASES = {  # make_sae_training_golden.py's CASES: (architecture, settings, normalize_activations, coefficient)
    "topk": ("topk", {"k": 4, "aux_loss_coefficient": 0.5}, "none", 0.0),
    "topk_unscaled": ("topk", {"k": 4, "rescale_acts_by_decoder_norm": False}, "none", 0.0),
    "batchtopk": ("batchtopk", {"k": 2.5, "topk_threshold_lr": 0.1}, "none", 0.0),
    "jumprelu": ("jumprelu", {**JUMP, "l0_coefficient": 0.7, "pre_act_loss_coefficient": 0.3}, "none", 0.7),
    "jumprelu_ste": ("jumprelu", {**JUMP, "l0_coefficient": 0.7, "pre_act_loss_coefficient": 0.3,
                                  "jumprelu_ste_to_input": True}, "none", 0.7),
    "jumprelu_tanh": ("jumprelu", {**JUMP, "l0_coefficient": 0.7, "jumprelu_sparsity_loss_mode": "tanh",
                                   "jumprelu_tanh_scale": 2.0}, "none", 0.7),
    "jumprelu_tanh_ste_ln": ("jumprelu", {**JUMP, "l0_coefficient": 0.7, "jumprelu_sparsity_loss_mode": "tanh",
                                          "jumprelu_ste_to_input": True}, "layer_norm", 0.7),
    "standard_layer_norm": ("standard", {"l1_coefficient": 0.3}, "layer_norm", 0.3),
    "standard_constant_norm": ("standard", {"l1_coefficient": 0.3}, "constant_norm_rescale", 0.3),
    "topk_layer_norm": ("topk", {"k": 4, "aux_loss_coefficient": 0.5}, "layer_norm", 0.0),
    "batchtopk_constant_norm": ("batchtopk", {"k": 2.5, "topk_threshold_lr": 0.1}, "constant_norm_rescale", 0.0),
}
ALIVE = ("topk_layer_norm", "batchtopk_constant_norm")  # no latent dead: SAELens takes no AuxK under run-time norms


def close(ours, theirs, tol=1e-5):
    """Equal within tol of the largest value."""
    theirs = np.asarray(theirs)
    assert np.shape(ours) == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=tol * max(1.0, float(np.abs(theirs).max())))


def case(name, dtype=np.float32):
    """-> (the SAE at init, its settings, the coefficient)"""
    arch, own, norm, coefficient = CASES[name]
    settings = {"architecture": arch, **S.TRAINING_DEFAULTS[arch], **own,
                "dead_feature_window": 1000 if name in ALIVE else 1}
    sae = {k.split("/")[-1]: GOLDEN[k].astype(dtype) for k in GOLDEN.files if k.startswith(f"{name}/init/")}
    sae.pop("topk_threshold", None)
    sae["cfg"] = {"normalize_activations": norm, "apply_b_dec_to_input": True, "d_in": 8, "d_sae": 32}
    return sae, settings, coefficient


@pytest.mark.parametrize("name", list(CASES))
def test_every_loss_term_and_every_gradient_equal_saelens(name):
    sae, settings, coefficient = case(name)
    losses, grads, f = S.training_backward(GOLDEN[f"{name}/x"], sae, settings, coefficient, GOLDEN[f"{name}/dead"])
    close(f, GOLDEN[f"{name}/feature_acts"])
    theirs = {k.split("/")[-1]: float(GOLDEN[k]) for k in GOLDEN.files if k.startswith(f"{name}/loss/")}
    assert set(losses) - {"l0", "loss"} == set(theirs) - {"total"}
    for k, v in theirs.items():
        close(losses["loss" if k == "total" else k], v)
    assert sorted(grads) == sorted(k.split("/")[-1] for k in GOLDEN.files if k.startswith(f"{name}/grad/"))
    for k in grads:
        close(grads[k], GOLDEN[f"{name}/grad/{k}"])
    if settings["architecture"] == "jumprelu":
        assert np.count_nonzero(GOLDEN[f"{name}/grad/threshold"]) > 10  # the pseudo-derivatives are at work


@pytest.mark.parametrize("name", list(CASES))
def test_four_steps_equal_saelens_trainer_and_its_saved_folder(name):
    sae, settings, coefficient = case(name)
    state = S.new_training_state(sae)
    for i, batch in enumerate(GOLDEN[f"{name}/batches"]):
        losses = S.training_step(batch, sae, state, 1e-2, settings, coefficient)
        theirs = {k.split("/")[-1]: float(GOLDEN[k]) for k in GOLDEN.files if k.startswith(f"{name}/steps/{i}/")}
        for k, v in theirs.items():
            close(losses["loss" if k == "total" else k], v, 1e-5)
    for k in S.trained(sae):
        close(sae[k], GOLDEN[f"{name}/trained/{k}"], 1e-5)
    if settings["architecture"] == "batchtopk":
        assert state["topk_threshold"] == pytest.approx(float(GOLDEN[f"{name}/trained/topk_threshold"]), rel=1e-5)
    if name.startswith(("topk", "batchtopk")) and name not in ALIVE:
        assert any(GOLDEN[f"{name}/steps/{i}/auxiliary_reconstruction_loss"] > 0 for i in range(4))  # AuxK at work
    saved = S.inference_sae(sae, settings, state["topk_threshold"])
    inference = {k.split("/")[-1]: GOLDEN[k] for k in GOLDEN.files if k.startswith(f"{name}/inference/")}
    cfg = json.loads(str(inference.pop("cfg")))
    assert sorted(k for k in saved if k != "cfg") == sorted(inference)
    for k, v in inference.items():
        close(saved[k], v, 1e-5)
    assert saved["cfg"]["architecture"] == cfg["architecture"]
    assert {k: saved["cfg"].get(k) for k in ("k", "rescale_acts_by_decoder_norm") if k in cfg} == \
        {k: cfg[k] for k in ("k", "rescale_acts_by_decoder_norm") if k in cfg}
    for k in ("training_architecture", "training_architecture_details"):
        assert saved["cfg"]["metadata"][k] == cfg["metadata"][k]


@pytest.mark.parametrize("name", ALIVE)
def test_under_run_time_normalisation_auxk_stops_where_saelens_raises(name):
    """SAELens 6.54.12 trains TopK and BatchTopK under layer_norm and constant_norm_rescale while no latent is dead
    (the goldens above: AuxK 0) and raises at a step with one (its residual x - x̂ would be in the input's units,
    the dead latents' rebuilding in the normalised ones): the same step is NoAuxK here, a UserError; with the
    coefficient 0 the loss is 0 and the step goes on (SAELens raises all the same)."""
    assert "does not support activation normalization" in str(GOLDEN[f"{name}/raises"])
    sae, settings, coefficient = case(name)
    dead = GOLDEN["topk/dead"]  # half the latents
    with pytest.raises(S.NoAuxK, match=f"{int(dead.sum())} latents dead .* takes no AuxK loss under normalize_"
                                       f"activations {sae['cfg']['normalize_activations']}"):
        S.training_backward(GOLDEN[f"{name}/x"], sae, settings, coefficient, dead)
    losses, _, _ = S.training_backward(GOLDEN[f"{name}/x"], sae, {**settings, "aux_loss_coefficient": 0.0},
                                       coefficient, dead)
    assert losses["auxiliary_reconstruction_loss"] == 0.0


def as64(sae):
    return {k: (v.astype(np.float64) if k != "cfg" else v) for k, v in sae.items()}


@pytest.mark.parametrize("name", ["topk", "topk_unscaled", "batchtopk", "jumprelu", "jumprelu_tanh",
                                  "standard_layer_norm", "standard_constant_norm"])
def test_the_backward_matches_finite_differences_where_a_derivative_exists(name):
    """TopK's and BatchTopK's choice is constant near a point (ties aside): their losses have true derivatives
    (AuxK's residual is held constant, as SAELens detaches it: its own test follows). JumpReLU's have them in
    the weights (f = h [h > θ] is h's, or 0, away from h = θ), and without jumprelu_ste_to_input the input's
    gradient is that true one; in θ the step's derivative is 0 and
    the estimator is not a derivative of anything, so θ's is checked with ε so narrow that no rectangle holds a
    pre-activation: what is left is the pre-activation loss's true derivative."""
    sae, settings, coefficient = case(name, np.float64)
    x, dead = GOLDEN[f"{name}/x"].astype(np.float64)[:16], GOLDEN[f"{name}/dead"]
    if settings["architecture"] in ("topk", "batchtopk"):
        dead = None
    _, grads, _ = S.training_backward(x, sae, settings, coefficient, dead)
    for k in S.PARAMS:
        np.testing.assert_allclose(grads[k], numerical_grad(
            lambda: S.training_backward(x, sae, settings, coefficient, dead)[0]["loss"], sae[k]),
            rtol=1e-4, atol=1e-6, err_msg=k)
    if settings["architecture"] == "jumprelu":
        narrow = {**settings, "jumprelu_bandwidth": 1e-12}
        _, grads, _ = S.training_backward(x, sae, narrow, coefficient, dead)
        np.testing.assert_allclose(grads["threshold"], numerical_grad(
            lambda: S.training_backward(x, sae, narrow, coefficient, dead)[0]["loss"], sae["threshold"]),
            rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("ste_to_input", [False, True])
def test_jumprelu_backward_is_the_straight_through_estimator(ste_to_input):
    """By hand, ε = 0.2: latent 0 (θ 0.3, θ/ε 1.5) has h - θ = 0.05, -0.05, 0.15 (u = 0.25, -0.25, 0.75: the
    rectangle holds the first two); latent 1 (θ 0.5, θ/ε 2.5) has -0.4, 0.15, 0.05 (the last alone). The
    gradient to h passes where h > θ; the estimator's, -(θ/ε) rect df summed over tokens, goes to θ (and, with
    ste_to_input, its negative's opposite to h)."""
    h = np.array([[0.35, 0.1], [0.25, 0.65], [0.45, 0.55]], np.float32)
    theta = np.array([0.3, 0.5], np.float32)
    df = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    dh, dtheta = S.jumprelu_backward(h, theta, df, 0.2, ste_to_input)
    np.testing.assert_allclose(dtheta, [-(1.5 * 1 + 1.5 * 3), -2.5 * 6], rtol=1e-6)
    passed = [[1, 0], [0, 4], [5, 6]]
    ste = [[1.5, 0], [4.5, 0], [0, 15]]
    np.testing.assert_allclose(dh, np.add(passed, ste) if ste_to_input else passed, rtol=1e-6)


def test_topk_chooses_with_argpartition_as_torch_topk():
    h = np.random.default_rng(0).standard_normal((50, 40)).astype(np.float32)
    for k in (1, 7, 40):
        mask = S.topk_mask(h, k)
        assert (mask.sum(-1) == k).all()
        assert (np.where(mask, h, np.inf).min(-1) >= np.where(mask, -np.inf, h).max(-1)).all()
    acts = np.maximum(h, 0)
    mask = S.batch_topk_mask(acts, 2.5)
    assert mask.sum() == 125 and acts[mask].min() >= acts[~mask].max()


@pytest.mark.parametrize("rescale", [True, False])
def test_auxk_backward_matches_finite_differences_with_its_residual_held(rescale):
    rng = np.random.default_rng(3)
    residual, h, W_dec = rng.standard_normal((6, 8)), rng.standard_normal((6, 32)), rng.standard_normal((32, 8))
    dead = rng.random(32) < 0.5

    def aux():
        return S.auxk_backward(residual, h, dead, W_dec, S.decoder_norms(W_dec), rescale, 0.7)

    loss, dW, dh, dn = aux()
    n = S.decoder_norms(W_dec)
    assert loss > 0
    np.testing.assert_allclose(dh, numerical_grad(lambda: aux()[0], h), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(dW + (dn / n)[:, None] * W_dec, numerical_grad(lambda: aux()[0], W_dec), rtol=1e-5,
                               atol=1e-8)


CLI_FLAGS = {  # the goldens' settings as sae.py train's flags (k, and the normalisation, from the folder)
    "topk": ["--aux-loss-coefficient", "0.5"],
    "batchtopk": ["--topk-threshold-lr", "0.1"],
    "jumprelu": ["--jumprelu-bandwidth", "0.5", "--l0-coefficient", "0.7", "--pre-act-loss-coefficient", "0.3"],
    "jumprelu_tanh_ste_ln": ["--jumprelu-bandwidth", "0.5", "--l0-coefficient", "0.7", "--jumprelu-sparsity-loss-mode",
                             "tanh", "--jumprelu-ste-to-input", "true"],
    "topk_layer_norm": ["--aux-loss-coefficient", "0.5"],  # the pair sae.py train refused (issue 51 §5)
}


@pytest.mark.parametrize("name", list(CLI_FLAGS))
def test_sae_py_train_from_a_saelens_trainer_folder_equals_its_trainer(name, tmp_path, capsys):
    """python sae.py train --init DIR (SAELens's training SAE as save_model wrote it: for BatchTopK, a trainer's
    checkpoint, "batchtopk" with its topk_threshold) --activations FILE.npy: the four steps of SAETrainer, and the
    folder its save_inference_model writes."""
    from conftest import in_process

    from interface import sae_cli
    from plumbing import sae_files

    np.save(tmp_path / "acts.npy", GOLDEN[f"{name}/batches"].reshape(-1, 8))
    out = tmp_path / "out"
    r = in_process(sae_cli.main, capsys, "train", "--init", os.path.join(DATA, "sae_training_golden", name),
                   "--activations", tmp_path / "acts.npy", "--batch-tokens", "64", "--tokens", "256", "--lr", "1e-2",
                   "--dead-feature-window", "1000" if name in ALIVE else "1", *CLI_FLAGS[name], "--out", out, "--quiet",
                   "--model", os.path.join(DATA, "hf", "tiny"))
    assert r.returncode == 0, r.stderr
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    for i, entry in enumerate(log):
        for k in (k for k in GOLDEN.files if k.startswith(f"{name}/steps/{i}/")):
            close(entry["loss" if k.endswith("total") else k.split("/")[-1]], float(GOLDEN[k]))
    saved = sae_files.load_sae(str(out))
    for k in sae_files.tensor_names(saved["cfg"]["architecture"]):
        close(saved[k], GOLDEN[f"{name}/inference/{k}"])
    cfg = json.loads(str(GOLDEN[f"{name}/inference/cfg"]))
    assert saved["cfg"]["architecture"] == cfg["architecture"]
    assert saved["cfg"]["normalize_activations"] == cfg["normalize_activations"]


# --- transcoders: sae.py train --site-out ----------------------------------------------------------------------
# From blocks.L.ln2.hook_normalized to blocks.L.hook_mlp_out, every architecture sae.py trains, with and without
# W_skip. SAELens trains no transcoder, so there is no golden of the training: the backward is held to finite
# differences, the saved folder to the transcoder it was trained as, and to what SAELens 6.54.12 reads back.

MODEL = os.path.join(DATA, "hf", "tiny")
SITE, SITE_OUT = "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"
OWN = {"standard": {"l1_coefficient": 0.3}, "topk": {"k": 4}, "batchtopk": {"k": 2.5},
       "jumprelu": {"jumprelu_bandwidth": 0.5, "pre_act_loss_coefficient": 0.3}}
COEFFICIENT = {"standard": 0.3, "jumprelu": 0.7}


def transcoder(arch, skip, norm="none", d_in=8, d_out=6, d_sae=32, seed=0, dtype=np.float64):
    """A transcoder part-way through training: new_transcoder's, moved off its start (biases and W_skip not 0, the
    decoder's rows of unequal norms, a JumpReLU's thresholds among its pre-activations). -> (sae, settings)"""
    settings = {"architecture": arch, **S.TRAINING_DEFAULTS[arch], **OWN[arch], "dead_feature_window": 1}
    sae = S.new_transcoder(d_in, d_out, d_sae, settings, seed, {"hook_name": SITE, "hook_name_out": SITE_OUT}, skip)
    rng = np.random.default_rng(seed)
    sae["b_enc"] += rng.standard_normal(d_sae).astype(np.float32) * 0.1
    sae["b_dec"] += rng.standard_normal(d_out).astype(np.float32) * 0.1
    sae["W_enc"] += rng.standard_normal((d_in, d_sae)).astype(np.float32) * 0.3
    sae["W_dec"] *= rng.uniform(0.5, 1.5, (d_sae, 1)).astype(np.float32)
    if skip:
        sae["W_skip"] += rng.standard_normal((d_out, d_in)).astype(np.float32) * 0.1
    if arch == "jumprelu":
        sae["threshold"] = rng.uniform(0, 0.8, d_sae).astype(np.float32)
    sae["cfg"]["normalize_activations"] = norm
    return {k: v if k == "cfg" else v.astype(dtype) for k, v in sae.items()}, settings


def batch(d_in=8, d_out=6, n=16, seed=1, dtype=np.float64):
    """x [n, d_in] and its target [n, d_out], unrelated: only the gradients' algebra is tested."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d_in)).astype(dtype), rng.standard_normal((n, d_out)).astype(dtype)


TRANSCODERS = [("standard", True, "none", 6), ("standard", False, "layer_norm", 6), ("topk", False, "none", 8),
         ("batchtopk", True, "none", 6), ("jumprelu", True, "constant_norm_rescale", 6)]


@pytest.mark.parametrize("arch, skip, norm, d_out", TRANSCODERS)
def test_the_transcoders_backward_matches_finite_differences(arch, skip, norm, d_out):
    """The loss: Σ_d (x̂ - y)² over the target's width, the mean over tokens, plus the architecture's own terms
    (L1, JumpReLU's L0 and pre-activation loss; TopK's choice constant near the point); x̂ = the decoder's output
    (never de-normalised, though x is normalised at run time) + x W_skipᵀ. Every weight's gradient, W_skip's too."""
    sae, settings = transcoder(arch, skip, norm, d_out=d_out)
    x, y = batch(d_out=d_out)
    coefficient = COEFFICIENT.get(arch, 0.0)

    def loss():
        return S.training_backward(x, sae, settings, coefficient, target=y)[0]["loss"]

    losses, grads, _ = S.training_backward(x, sae, settings, coefficient, target=y)
    assert sorted(grads) == sorted(S.trained(sae)) and ("W_skip" in grads) == skip
    for k in S.PARAMS + (("W_skip",) if skip else ()):
        np.testing.assert_allclose(grads[k], numerical_grad(loss, sae[k]), rtol=1e-4, atol=1e-6, err_msg=k)
    out = S.forward(x, S.inference_sae(sae, settings))[0]  # the folder's transcoder: what was trained
    if arch != "batchtopk":  # (BatchTopK's inference threshold is the running one, not the batch's choice)
        assert losses["mse_loss"] == pytest.approx(np.linalg.norm(out - y) ** 2 / len(y), rel=1e-6)  # Σ over all / N


def test_a_topk_transcoders_auxk_rebuilds_the_targets_residual():
    """AuxK's residual is the target's, y - x̂ (x̂ with W_skip x), held constant as SAELens holds an SAE's."""
    sae, settings = transcoder("topk", False, d_out=8)
    settings["rescale_acts_by_decoder_norm"] = False
    x, y = batch(d_out=8)
    dead = np.arange(32) % 2 == 0
    losses, _, _ = S.training_backward(x, sae, settings, target=y, dead=dead)
    h = x @ sae["W_enc"] + sae["b_enc"]
    residual = y - (S.topk_relu(h, 4) @ sae["W_dec"] + sae["b_dec"])
    aux = S.auxk_backward(residual, h, dead, sae["W_dec"], S.decoder_norms(sae["W_dec"]), False, 1.0)[0]
    assert losses["auxiliary_reconstruction_loss"] == pytest.approx(aux, rel=1e-9) and aux > 0


def test_gather_all_of_two_sites_is_each_sites_side_by_side():
    from interface.loading import load_body

    _, hparams, params = load_body(MODEL, quiet=True)
    rows = np.array([[50256, 40, 892, 523], [50256, 11, 12, 13]])
    both = S.gather_all(rows, params, hparams, [SITE, SITE_OUT], batch=1)
    assert both.shape == (2, 4, 16)
    np.testing.assert_array_equal(both[..., :8], S.gather(rows, params, hparams, SITE))
    np.testing.assert_array_equal(both[..., 8:], S.gather(rows, params, hparams, SITE_OUT))


RUNS = {"skip_transcoder": ("standard", True, ["--l1", "0.3"]),
        "topk": ("topk", False, ["--architecture", "topk", "--k", "3"]),
        "jumprelu_skip_transcoder": ("batchtopk", True, ["--architecture", "batchtopk", "--k", "2.5"]),
        "jumprelu_transcoder": ("jumprelu", False, ["--architecture", "jumprelu"])}


def train_cli(capsys, tmp_path, skip, flags, *more, tokens=128, lr=1e-2):
    from interface import sae_cli

    out = tmp_path / "tc"
    r = in_process(sae_cli.main, capsys, "train", "--site", SITE, "--site-out", SITE_OUT, "--d-sae", "16", *flags,
                   *(["--skip-transcoder"] if skip else []), "--batch-tokens", "64", "--tokens", tokens, "--lr", lr,
                   "--out", out, "--quiet", "--model", MODEL, *more)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("saved", list(RUNS))
def test_sae_py_train_site_out_trains_the_transcoder_the_api_does_and_saves_saelens_folder(saved, tmp_path, capsys):
    """--activations [N, d_in + d_out] (input, then target): the steps of training_step with the target, and the
    folder SAELens's Transcoder classes read (a TopK one a topk SAE whose metadata names hook_name_out)."""
    arch, skip, flags = RUNS[saved]
    acts = np.random.default_rng(2).standard_normal((128, 16)).astype(np.float32)
    np.save(tmp_path / "acts.npy", acts)
    out = train_cli(capsys, tmp_path, skip, flags, "--activations", tmp_path / "acts.npy")
    settings = {"architecture": arch, **S.TRAINING_DEFAULTS[arch], "dead_feature_window": 1000,
                **{"standard": {"l1_coefficient": 0.3}, "topk": {"k": 3}, "batchtopk": {"k": 2.5}}.get(arch, {})}
    ours = S.new_transcoder(8, 8, 16, settings, 0, {"hook_name": SITE, "hook_name_out": SITE_OUT}, skip)
    state = S.new_training_state(ours)
    for step in range(2):
        S.training_step(acts[64 * step:64 * step + 64, :8], ours, state, 1e-2, settings,
                        step_coefficient(settings, step), target=acts[64 * step:64 * step + 64, 8:])
    ours = S.inference_sae(ours, settings, state["topk_threshold"])
    cfg = json.loads((out / "cfg.json").read_text())
    assert cfg["architecture"] == saved and cfg["apply_b_dec_to_input"] is False
    assert cfg["metadata"]["hook_name"] == SITE and cfg["metadata"]["hook_name_out"] == SITE_OUT
    assert cfg.get("d_out") == (None if arch == "topk" else 8)
    theirs = sae_files.load_sae(str(out))
    assert sorted(k for k in theirs if k != "cfg") == sorted(sae_files.tensor_names(saved))
    for k in sae_files.tensor_names(saved):
        np.testing.assert_allclose(theirs[k], ours[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_a_transcoder_trained_on_a_text_learns_its_target(tmp_path, capsys):
    (tmp_path / "text.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20)
    out = train_cli(capsys, tmp_path, True, ["--l1", "0.01", "--context", "16"], "--data", tmp_path / "text.txt",
                    tokens=1280, lr=3e-2)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 20 and log[-1]["mse_loss"] < 0.2 * log[0]["mse_loss"]  # 107 to 7 (explained variance 0.85)


SAE_PYTHON = os.environ.get("GPT2_SAE_PYTHON", "")
SAELENS_FORWARD = """import sys
import numpy as np, torch
from sae_lens import SAE
sae = SAE.load_from_disk(sys.argv[1])
x = torch.tensor(np.load(sys.argv[2]))
with torch.no_grad():
    out = sae(x)
np.save(sys.argv[3], out.numpy())
print(type(sae).__name__, sae.cfg.metadata.hook_name, sae.cfg.metadata.hook_name_out, hasattr(sae, "W_skip"))
"""
CLASSES = {"skip_transcoder": "SkipTranscoder", "topk": "TopKSAE", "jumprelu_skip_transcoder": "JumpReLUSkipTranscoder",
           "jumprelu_transcoder": "JumpReLUTranscoder"}


@pytest.mark.skipif(not SAE_PYTHON, reason="needs sae-lens 6.54.12: set GPT2_SAE_PYTHON to a python that has it "
                                           "(GPT2_SAE_PYTHON=/work/venvs/sae-saelens/bin/python python -m pytest -q "
                                           "tests/test_sae_training.py -k saelens)")
@pytest.mark.parametrize("saved", list(RUNS))
def test_saelens_reads_back_the_transcoder_sae_py_trains(saved, tmp_path, capsys):
    """SAE.load_from_disk gives SAELens's Transcoder class (a SkipTranscoder with W_skip), whose forward on x is
    sae.forward's on the folder."""
    arch, skip, flags = RUNS[saved]
    (tmp_path / "text.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 8)
    out = train_cli(capsys, tmp_path, skip, flags, "--data", tmp_path / "text.txt", "--context", "16")
    x = np.random.default_rng(3).standard_normal((20, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([SAE_PYTHON, "-c", SAELENS_FORWARD, str(out), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [CLASSES[saved], SITE, SITE_OUT, str(skip)]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), S.forward(x, sae_files.load_sae(str(out)))[0], rtol=1e-5,
                               atol=1e-6)
