"""sae.py's training of TopK, BatchTopK and JumpReLU SAEs (and the standard one's with run-time normalisation)
against SAELens 6.54.12: every loss term, every gradient (the threshold's included), four steps of SAETrainer,
the folder save_inference_model writes; finite differences where a derivative exists. Goldens by
tests/data/make_sae_training_golden.py, in tests/data/sae_training_golden.npz."""
import json
import os

import numpy as np
import pytest
from conftest import DATA, numerical_grad

import sae as S

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
