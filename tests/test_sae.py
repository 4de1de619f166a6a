"""sae.py against SAELens 6.54.12: the SAE, its loss and its backward, Adam with clipping, a few training
steps, splicing, the cache's latents and the evals, on tests/data/hf/tiny (goldens by
tests/data/make_sae_golden.py, in tests/data/sae_golden.npz and tests/data/sae_golden/)."""
import json
import os

import numpy as np
import pytest
from conftest import DATA, numerical_grad, r64

import look_inside
import sae as S
from plumbing import hf_model, sae_files
from plumbing.errors import UserError

GOLDEN = np.load(os.path.join(DATA, "sae_golden.npz"))
SAE_DIR = os.path.join(DATA, "sae_golden", "sae")
HOOK = "blocks.1.hook_resid_pre"
L1 = 0.3


def close(ours, theirs, tol=1e-5):
    """Equal within tol of the largest value."""
    theirs = np.asarray(theirs)
    assert np.shape(ours) == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=tol * max(1.0, float(np.abs(theirs).max())))


@pytest.fixture(scope="module")
def tiny():
    hparams, params, _ = hf_model.load_hf_folder(os.path.join(DATA, "hf", "tiny"))
    return params, hparams


@pytest.fixture(scope="module")
def golden_sae():
    return sae_files.load_sae(SAE_DIR)


def test_the_folder_saelens_wrote_loads_with_its_weights(golden_sae):
    for k in S.PARAMS:
        np.testing.assert_array_equal(golden_sae[k], GOLDEN[k])
    assert S.hook_name(golden_sae) == HOOK and golden_sae["cfg"]["d_sae"] == 32


def test_encode_decode_and_both_losses_equal_saelens(golden_sae):
    x = GOLDEN["x"]
    close(S.encode_pre(x, golden_sae), GOLDEN["acts_pre"])
    f = S.encode(x, golden_sae)
    close(f, GOLDEN["acts_post"])
    close(S.decode(f, golden_sae), GOLDEN["recons"])
    total, parts, _ = S.sae_loss(x, golden_sae, L1)
    close(parts["mse_loss"], GOLDEN["mse_loss"])
    close(parts["l1_loss"], GOLDEN["l1_loss"])
    assert total == pytest.approx(parts["mse_loss"] + parts["l1_loss"])


def test_encode_without_b_dec_on_the_input():
    sae = {**S.new_sae(3, 5), "b_dec": np.ones(3, np.float32)}
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    plain = {**sae, "cfg": {**sae["cfg"], "apply_b_dec_to_input": False}}
    np.testing.assert_allclose(S.encode_pre(x, plain), x @ sae["W_enc"], atol=1e-6)
    np.testing.assert_allclose(S.encode_pre(x, sae), (x - 1) @ sae["W_enc"], atol=1e-6)


def test_every_gradient_equals_saelens(golden_sae):
    losses, grads, _ = S.sae_backward(GOLDEN["x"], golden_sae, L1)
    close(losses["mse_loss"], GOLDEN["mse_loss"])
    for k in S.PARAMS:
        close(grads[k], GOLDEN[f"grad/{k}"])


@pytest.mark.parametrize("applied", [True, False])
def test_the_backward_matches_finite_differences(applied):
    sae = {k: r64(*v.shape, seed=i, scale=0.5) for i, (k, v) in enumerate(S.new_sae(4, 6).items()) if k != "cfg"}
    sae["cfg"] = {"apply_b_dec_to_input": applied}
    x = r64(5, 4, seed=9)
    _, grads, _ = S.sae_backward(x, sae, 0.7)
    for k in S.PARAMS:
        np.testing.assert_allclose(grads[k], numerical_grad(lambda: S.sae_loss(x, sae, 0.7)[0], sae[k]),
                                   rtol=1e-5, atol=1e-7, err_msg=k)


def test_the_initialisation_is_saelens(golden_sae):
    sae = S.new_sae(8, 4096, seed=3)
    np.testing.assert_allclose(S.decoder_norms(sae["W_dec"]), 0.1, rtol=1e-5)
    np.testing.assert_array_equal(sae["W_enc"], sae["W_dec"].T)
    assert not sae["b_enc"].any() and not sae["b_dec"].any()
    assert all(sae[k].dtype == np.float32 for k in S.PARAMS)
    np.testing.assert_array_equal(S.new_sae(8, 4096, seed=3)["W_dec"], sae["W_dec"])
    assert abs(sae["W_dec"].mean()) < 1e-3 and not np.array_equal(S.new_sae(8, 4096, seed=4)["W_dec"], sae["W_dec"])


def test_one_adam_step_with_clipping_equals_saelens(golden_sae):
    sae = {k: (v.copy() if k != "cfg" else v) for k, v in golden_sae.items()}
    _, grads, _ = S.sae_backward(GOLDEN["x"], sae, L1)
    state = S.new_adam_state(sae)
    norm = S.adam_step(sae, grads, state, lr=1e-2)
    assert norm > 1.0  # so clipping is at work
    for k in S.PARAMS:
        close(sae[k], GOLDEN[f"adam/{k}"])


def test_the_l1_warm_up_counts_as_saelens():
    assert [S.l1_coefficient(s, 2.0, 4) for s in range(6)] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]
    assert S.l1_coefficient(0, 2.0, 0) == 2.0


def test_a_few_training_steps_equal_saelens_trainer(golden_sae):
    sae = {k: (v.copy() if k != "cfg" else v) for k, v in golden_sae.items()}
    state = S.new_adam_state(sae)
    for step, batch in enumerate(GOLDEN["train/batches"]):
        losses = S.train_step(batch, sae, state, 3e-3, S.l1_coefficient(step, L1, 2))
        np.testing.assert_allclose([losses["mse_loss"], losses["l1_loss"]], GOLDEN["train/losses"][step], rtol=1e-5)
    for k in S.PARAMS:
        np.testing.assert_allclose(sae[k], GOLDEN[f"train/{k}"], rtol=1e-5, atol=1e-7)


def test_the_activations_are_the_hooks_and_the_forward_stops_at_its_layer(tiny, monkeypatch):
    params, hparams = tiny
    ids = GOLDEN["tokens"]
    close(S.gather(ids, params, hparams, HOOK).reshape(-1, 8), GOLDEN["x"])
    _, cache = look_inside.run_with_cache(ids, params, hparams, names=["blocks.0.hook_resid_post"])
    close(S.gather(ids, params, hparams, "blocks.0.hook_resid_post"), cache["blocks.0.hook_resid_post"])
    ran = []
    monkeypatch.setattr(S, "gpt2_hidden", lambda ids, p, h, hook: ran.append(len(p["blocks"])) or
                        __import__("gpt2_numpy").gpt2_hidden(ids, p, h, hook=hook))
    S.gather(ids, params, hparams, "blocks.0.hook_mlp_out")
    S.gather(ids, params, hparams, "hook_embed")
    assert ran == [1, 0]


def test_windows_start_with_endoftext():
    rows = S.windows(np.arange(10), 4, 99)
    np.testing.assert_array_equal(rows, [[99, 0, 1, 2], [99, 3, 4, 5], [99, 6, 7, 8]])
    np.testing.assert_array_equal(S.windows(np.arange(2), 8, 99), [[99, 0, 1]])


def test_normalisation_and_folding_equal_saelens():
    x = GOLDEN["x"]
    assert S.scaling_factor(x) == pytest.approx(float(GOLDEN["norm/factor"]), rel=1e-5)
    sae = {**{k: GOLDEN[f"adam/{k}"] for k in S.PARAMS}, "cfg": {"normalize_activations": "expected_average_only_in"}}
    # the golden folds the factor into the SAE before the Adam step: the same starting SAE as the other goldens
    before = {**{k: GOLDEN[k] for k in S.PARAMS}, "cfg": sae["cfg"]}
    folded = S.fold_scaling_factor(before, float(GOLDEN["norm/factor"]))
    assert folded["cfg"]["normalize_activations"] == "none"
    for k in S.PARAMS:
        close(folded[k], GOLDEN[f"norm/{k}"])
    f_scaled = S.encode(x * np.float32(GOLDEN["norm/factor"]), before)  # scaled in = folded on the raw activations
    close(S.encode(x, folded), f_scaled, 1e-4)


def close_logits(logits, name):
    """The golden keeps every 200th column and each position's logsumexp over all of them."""
    close(logits[..., ::200], GOLDEN[f"{name}/every_200th"])
    top = logits.max(-1, keepdims=True).astype(np.float64)
    close(np.log(np.exp(logits - top).sum(-1)) + top[..., 0], GOLDEN[f"{name}/logsumexp"])


def test_run_with_saes_logits_with_and_without_the_error_term(tiny, golden_sae):
    params, hparams = tiny
    ids = GOLDEN["tokens"]
    close_logits(S.run_with_sae(ids, params, hparams, golden_sae), "logits")
    close_logits(S.run_with_sae(ids, params, hparams, golden_sae, use_error_term=True), "logits_error")
    close_logits(look_inside.run_with_hooks(ids, params, hparams, {}), "logits_error")  # the error term: unchanged


def test_the_cache_holds_the_latents_under_saelens_names(tiny, golden_sae):
    params, hparams = tiny
    _, cache = look_inside.run_with_cache(GOLDEN["tokens"], params, hparams, sae=S.splice(golden_sae))
    for hook in ("hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons"):
        close(cache[f"{HOOK}.{hook}"], GOLDEN[f"cache/{HOOK}.{hook}"])
    _, some = look_inside.run_with_cache(GOLDEN["tokens"], params, hparams, names=[f"{HOOK}.hook_sae_acts_post"],
                                         sae=S.splice(golden_sae))
    assert list(some) == [f"{HOOK}.hook_sae_acts_post"]


def test_every_eval_metric_equals_saelens(tiny, golden_sae):
    params, hparams = tiny
    metrics = S.evaluate(GOLDEN["tokens"], params, hparams, golden_sae, special={50256})
    names = [k[5:] for k in GOLDEN.files if k.startswith("eval/")]
    assert set(names) == {"l0", "explained_variance", "ce_loss_with_sae", "ce_loss_without_sae",
                          "ce_loss_with_ablation", "ce_loss_score", "kl_div_with_sae", "kl_div_with_ablation",
                          "kl_div_score"}
    for name in names:
        assert metrics[name] == pytest.approx(float(GOLDEN[f"eval/{name}"]), rel=1e-5, abs=1e-6), name


def test_features_read_density_contexts_and_logit_effects(tiny, golden_sae):
    params, hparams = tiny
    acts = S.gather(GOLDEN["tokens"], params, hparams, HOOK)
    [read] = S.read_features(GOLDEN["tokens"], acts, golden_sae, params["wte"], [3], k=4)
    f = GOLDEN["acts_post"][:, 3].reshape(4, 16)
    assert read["density"] == pytest.approx((f > 0).mean())
    value, w, t = read["top"][0]
    assert value == pytest.approx(f.max(), rel=1e-5) and f[w, t] == f.max()
    effect = params["wte"] @ golden_sae["W_dec"][3]
    assert read["promotes"][0][0] == int(effect.argmax()) and read["suppresses"][0][0] == int(effect.argmin())


def test_what_sae_py_saves_loads_back_with_saelens_keys(tmp_path, golden_sae):
    sae_files.save_sae(str(tmp_path / "out"), golden_sae)
    with open(tmp_path / "out" / "cfg.json") as f:
        cfg = json.load(f)
    assert cfg["architecture"] == "standard" and cfg["metadata"]["sae_lens_version"] == "6.54.12"
    assert {"d_in", "d_sae", "dtype", "device", "apply_b_dec_to_input", "normalize_activations",
            "reshape_activations"} <= set(cfg)
    back = sae_files.load_sae(str(tmp_path / "out"))
    for k in S.PARAMS:
        np.testing.assert_array_equal(back[k], golden_sae[k])


def test_a_pre_6_cfg_reads_as_saelens_reads_it():
    sae = sae_files.load_sae(os.path.join(DATA, "sae_golden", "pre6"))
    assert S.hook_name(sae) == str(GOLDEN["loaded/pre6_hook_name"]) == HOOK
    assert sae["cfg"]["architecture"] == "standard" and sae["cfg"]["normalize_activations"] == "none"


def write_cfg(folder, cfg, weights=True):
    os.makedirs(folder)
    with open(os.path.join(folder, "cfg.json"), "w") as f:
        json.dump(cfg, f)
    if weights:
        import shutil
        shutil.copy(os.path.join(SAE_DIR, "sae_weights.safetensors"), folder)


@pytest.mark.parametrize("cfg, weights, words", [
    ({"d_in": 8, "d_sae": 32, "metadata": {"sae_lens_version": "6.54.12"}}, True, "no architecture"),
    ({"d_in": 8, "d_sae": 32, "architecture": "gated", "metadata": {"sae_lens_version": "6.1.0"}}, True, "'gated'"),
    ({"d_in": 8, "d_sae": 32, "architecture": "topk", "k": 33, "metadata": {"sae_lens_version": "6.1.0"}}, True,
     "k must be at most d_sae"),
    ({"d_in": 8, "d_sae": 32, "architecture": "standard", "normalize_activations": "whiten"}, True,
     "normalize_activations must be one of"),
    ({"d_in": 8, "d_sae": 32, "architecture": "jumprelu", "metadata": {"sae_lens_version": "6.1.0"}}, True,
     "threshold must be [32]"),
    ({"d_in": 8, "d_sae": 32, "architecture": "transcoder", "d_out": 8, "metadata": {"sae_lens_version": "6.1.0"}},
     True, "apply_b_dec_to_input true"),
    ({"d_in": 8, "d_sae": 32, "architecture": "standard"}, False, "no sae_weights.safetensors"),
    ({"d_in": 8, "d_sae": 16, "architecture": "standard"}, True, "W_enc must be [8, 16]")])
def test_a_folder_sae_py_cannot_read_is_one_clear_error(tmp_path, cfg, weights, words):
    write_cfg(str(tmp_path / "s"), cfg, weights)
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace("]", r"\]")):
        sae_files.load_sae(str(tmp_path / "s"))


def test_an_sae_that_does_not_fit_the_hook_point_is_refused(tiny, golden_sae):
    params, hparams = tiny
    with pytest.raises(UserError, match="reads 8 numbers a token but blocks.0.mlp.hook_pre has 32"):
        S.check_fits(golden_sae, hparams, "blocks.0.mlp.hook_pre")
    with pytest.raises(UserError, match="no activation is called"):
        S.check_site("blocks.9.hook_resid_pre", hparams)


def test_centring_the_writes_is_transformerlens_center_writing_weights(tiny):
    params, hparams = tiny
    ids = GOLDEN["tokens"]
    hooks = S.centring_hooks(hparams["n_layer"])
    names = [k[len("centred/"):] for k in GOLDEN.files if k.startswith("centred/")]
    logits, cache = {}, {}

    def keep(name):
        def hook(x, _):
            cache[name] = hooks.get(name, lambda a, n: a)(x, name)
            return cache[name]
        return hook

    logits = look_inside.run_with_hooks(ids, params, hparams, {**hooks, **{n: keep(n) for n in names}})
    for name in names:  # hook_pos_embed is [1, T, C] here, TransformerLens's [B, T, C]
        close(np.broadcast_to(cache[name], GOLDEN[f"centred/{name}"].shape), GOLDEN[f"centred/{name}"])
    close(S.gather(ids, params, hparams, HOOK, hooks), GOLDEN[f"centred/{HOOK}"])
    close_logits(logits, "centred_logits")
    assert abs(GOLDEN[f"centred/{HOOK}"].reshape(-1, 8) - GOLDEN["x"]).max() > 1e-3  # the stream did change


# --- splicing: the backward, and a hook on the SAE's input ----------------------------------------------

@pytest.mark.parametrize("applied", [True, False])
def test_the_sae_input_gradient_by_finite_differences(applied):
    """input_grad: d (g · x̂(x)) / d x, in float64, against central differences."""
    rng = np.random.default_rng(3)
    sae = S.new_sae(5, 12, seed=1, apply_b_dec_to_input=applied)
    sae.update(b_enc=rng.standard_normal(12) * 0.1, b_dec=rng.standard_normal(5) * 0.3,
               W_enc=sae["W_enc"] + rng.standard_normal((5, 12)) * 0.3)
    x, g = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 3, 5))
    numeric = numerical_grad(lambda: float((g * S.decode(S.encode(x, sae), sae)).sum()), x)
    np.testing.assert_allclose(S.input_grad(x, g, sae), numeric, atol=1e-7)
    assert np.abs(numeric).max() > 0.01  # some latent fired: the gradient is not 0 for nothing


def test_the_splices_backward_is_the_saes_and_the_identity_where_it_does_not_splice(golden_sae):
    x = GOLDEN["x"].reshape(4, 16, 8)
    g = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    mask = np.ones((4, 16), bool)
    mask[:, 0] = False
    for use_error_term in (False, True):  # SAELens's error term is a constant to the gradient
        close(S.splice(golden_sae, use_error_term)[2](x, g), S.input_grad(x, g, golden_sae))
    masked = S.splice(golden_sae, mask=mask)[2](x, g)
    close(masked[:, 1:], S.input_grad(x, g, golden_sae)[:, 1:])
    np.testing.assert_array_equal(masked[:, 0], g[:, 0])


def test_a_hook_on_the_saes_input_changes_what_it_encodes_and_not_its_error_term(tiny, golden_sae):
    """{site}.hook_sae_input is SAELens's: with the error term the output is x̂(h(x)) + x - x̂(x). A hook at the
    site itself is the model's activation: the SAE reads it, and the error term is its own (the output h(x))."""
    params, hparams = tiny
    ids = GOLDEN["tokens"][:2]
    _, cache = look_inside.run_with_cache(ids, params, hparams, names=[HOOK])
    x = cache[HOOK]

    def doubled(a, name):
        return 2 * a

    def recons(a):
        return S.decode(S.encode(a, golden_sae), golden_sae)

    on_input = {f"{HOOK}.hook_sae_input": doubled}
    _, spliced = look_inside.run_with_cache(ids, params, hparams, sae=S.splice(golden_sae, True), hooks=on_input)
    close(spliced[f"{HOOK}.hook_sae_input"], 2 * x)
    close(spliced[HOOK], x)
    close(spliced[f"{HOOK}.hook_sae_output"], recons(2 * x) + x - recons(x))
    logits = look_inside.run_with_hooks(ids, params, hparams, on_input, sae=S.splice(golden_sae, True))
    close(logits, look_inside.run_with_hooks(ids, params, hparams, {HOOK: lambda a, n: recons(2 * a) + a - recons(a)}))
    _, spliced = look_inside.run_with_cache(ids, params, hparams, sae=S.splice(golden_sae, True),
                                            hooks={HOOK: doubled})
    close(spliced[f"{HOOK}.hook_sae_output"], 2 * x)
    with pytest.raises(UserError, match="no activation is called"):  # without the SAE, the name is no hook's
        look_inside.run_with_hooks(ids, params, hparams, on_input)
