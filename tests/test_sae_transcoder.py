"""sae.py train's transcoders (issue 53 §7): from blocks.L.ln2.hook_normalized to blocks.L.hook_mlp_out, with every
architecture sae.py trains, with and without W_skip. SAELens trains no transcoder, so there is no golden of the
training: the backward is held to finite differences, the saved folder to the transcoder it was trained as, and to
what SAELens 6.54.12 reads back (opt-in, in its venv)."""
import json
import os
import subprocess

import numpy as np
import pytest
from conftest import DATA, in_process, numerical_grad

import sae as S
from interface.sae_cli import step_coefficient
from plumbing import sae_files

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


CASES = [("standard", True, "none", 6), ("standard", False, "layer_norm", 6), ("topk", False, "none", 8),
         ("batchtopk", True, "none", 6), ("jumprelu", True, "constant_norm_rescale", 6)]


@pytest.mark.parametrize("arch, skip, norm, d_out", CASES)
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
        assert losses["mse_loss"] == pytest.approx(float(((out - y) ** 2).sum(-1).mean()), rel=1e-9)


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


RUNS = {"skip_transcoder": ("standard", True, ["--l1", "0.3"]), "topk": ("topk", False, ["--architecture", "topk", "--k", "3"]),
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
                                           "tests/test_sae_transcoder.py -k saelens)")
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
