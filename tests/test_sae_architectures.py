"""Every architecture sae.py runs, against SAELens 6.54.12 (issue 46): TopK (OpenAI's layer_norm, the decoder-norm
rescale, a folder whose norms were folded at save), JumpReLU, a BatchTopK saved as a JumpReLU, and the transcoders,
on tests/data/hf/tiny (goldens by tests/data/make_sae_arch_golden.py, in tests/data/sae_arch_golden.npz and
tests/data/sae_arch/); their backward by finite differences; what save_sae writes, which SAELens read back."""
import json
import os

import numpy as np
import pytest
from conftest import DATA, numerical_grad

import circuits
import look_inside
import sae as S
from plumbing import hf_model, sae_files
from plumbing.errors import UserError
from plumbing.safetensors_reader import load_file

GOLDEN = np.load(os.path.join(DATA, "sae_arch_golden.npz"))
FOLDERS = os.path.join(DATA, "sae_arch")
MODEL = os.path.join(DATA, "hf", "tiny")
GOLDEN_TOKENS = np.load(os.path.join(DATA, "sae_golden.npz"))["tokens"]  # make_sae_golden.py's, the same windows
NAMES = ("topk", "topk_saved", "jumprelu", "batchtopk", "transcoder", "skip_transcoder", "jumprelu_transcoder",
         "jumprelu_skip_transcoder")


def close(ours, theirs, tol=1e-5):
    """Equal within tol of the largest value."""
    theirs = np.asarray(theirs)
    assert np.shape(ours) == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=tol * max(1.0, float(np.abs(theirs).max())))


def close_logits(logits, name):
    close(logits[..., ::1000], GOLDEN[f"{name}/every_1000th"])
    top = logits.max(-1, keepdims=True).astype(np.float64)
    close(np.log(np.exp(logits - top).sum(-1)) + top[..., 0], GOLDEN[f"{name}/logsumexp"])


@pytest.fixture(scope="module")
def tiny():
    hparams, params, _ = hf_model.load_hf_folder(os.path.join(DATA, "hf", "tiny"))
    return S.fold_layer_norms(params), hparams  # TransformerLens's ln2.hook_normalized, which the transcoders read


@pytest.fixture(scope="module")
def saes():
    return {name: sae_files.load_sae(os.path.join(FOLDERS, name)) for name in NAMES}


def test_each_folder_reads_as_saelens_reads_it(saes):
    assert {name: s["cfg"]["architecture"] for name, s in saes.items()} == {
        "topk": "topk", "topk_saved": "topk", "jumprelu": "jumprelu", "batchtopk": "jumprelu",
        "transcoder": "transcoder", "skip_transcoder": "skip_transcoder", "jumprelu_transcoder": "jumprelu_transcoder",
        "jumprelu_skip_transcoder": "jumprelu_skip_transcoder"}
    assert saes["topk"]["cfg"]["k"] == 4 and saes["topk"]["cfg"]["rescale_acts_by_decoder_norm"] is True
    close(S.decoder_norms(saes["topk_saved"]["W_dec"]), np.ones(32))  # folded at save
    assert np.ptp(S.decoder_norms(saes["topk"]["W_dec"])) > 0.1  # not folded: the rescale matters
    np.testing.assert_array_equal(saes["batchtopk"]["threshold"], np.full(32, 0.3, np.float32))
    assert S.hook_name_out(saes["skip_transcoder"]) == "blocks.1.hook_mlp_out" and "W_skip" in saes["skip_transcoder"]


@pytest.mark.parametrize("name", NAMES)
def test_encode_and_decode_equal_saelenss(saes, name):
    sae, x = saes[name], GOLDEN[f"{name}/x"]
    close(S.encode_pre(x, sae), GOLDEN[f"{name}/acts_pre"])
    f = S.encode(x, sae)
    close(f, GOLDEN[f"{name}/acts_post"])
    close(S.decode(f, sae), GOLDEN[f"{name}/recons"])
    close(S.forward(x, sae)[0], GOLDEN[f"{name}/out"])
    assert 0 < (f > 0).sum(-1).mean() < sae["cfg"]["d_sae"]  # some latents fire, not all


def test_topk_keeps_k_and_needs_no_sort():
    h = np.random.default_rng(0).standard_normal((5, 40)).astype(np.float32)
    h[0] = -np.abs(h[0])  # a row whose k largest are all negative: the ReLU after the top k makes them 0
    f = S.topk_relu(h, 6)
    assert ((f > 0).sum(-1) <= 6).all()
    expected = np.where(h >= np.sort(h, -1)[:, -6:-5], np.maximum(h, 0), 0)
    np.testing.assert_array_equal(f, expected)


@pytest.mark.parametrize("name", NAMES)
def test_run_with_saes_logits_equal_saelenss_with_and_without_the_error_term(tiny, saes, name):
    params, hparams = tiny
    ids, plain = GOLDEN_TOKENS, look_inside.run_with_hooks(GOLDEN_TOKENS, params, hparams, {})
    for use_error_term, key in ((False, "logits"), (True, "logits_error")):
        logits = S.run_with_sae(ids, params, hparams, saes[name], use_error_term)
        assert use_error_term or np.abs(logits - plain).max() > 1e-2  # spliced: the SAE's output went on
        if name.endswith("skip_transcoder"):  # SAELens's run_with_saes drops W_skip x; here the whole is spliced
            close_logits(logits, f"{name}/{key.replace('logits', 'logits_whole')}")
            assert use_error_term or np.abs(logits[..., ::1000] - GOLDEN[f"{name}/logits/every_1000th"]).max() > 1e-3
        else:
            close_logits(logits, f"{name}/{key}")


def test_without_fold_ln_a_transcoder_reads_another_activation(saes):
    """look_inside's ln2.hook_normalized is ln_2's output, after its gain and bias; TransformerLens's is x̂, before
    them: a transcoder trained there needs the model folded (--fold-ln)."""
    hparams, params, _ = hf_model.load_hf_folder(os.path.join(DATA, "hf", "tiny"))
    site = "blocks.1.ln2.hook_normalized"
    raw, folded = (S.gather(GOLDEN_TOKENS, p, hparams, site).reshape(-1, 8)
                   for p in (params, S.fold_layer_norms(params)))
    close(folded, GOLDEN["skip_transcoder/x"])
    assert np.abs(raw - GOLDEN["skip_transcoder/x"]).max() > 0.1
    close(look_inside.run_with_hooks(GOLDEN_TOKENS, S.fold_layer_norms(params), hparams, {}),
          look_inside.run_with_hooks(GOLDEN_TOKENS, params, hparams, {}))  # folding changes no logit


@pytest.mark.parametrize("name", NAMES)
def test_saelens_reads_back_what_save_sae_writes(saes, name, tmp_path):
    """tests/data/sae_arch/ours_NAME is what save_sae wrote when the golden was made, and SAELens's load_from_disk
    read it back then as the same SAE (make_sae_arch_golden.py asserts it): save_sae still writes it, and its
    cfg.json is the one SAELens wrote (save_model's, or save_inference_model's for topk_saved and batchtopk)."""
    sae_files.save_sae(str(tmp_path / "s"), saes[name])
    theirs = os.path.join(FOLDERS, f"ours_{name}")
    with open(tmp_path / "s" / "cfg.json") as a, open(os.path.join(theirs, "cfg.json")) as b, \
            open(os.path.join(FOLDERS, name, "cfg.json")) as c:
        written = json.load(a)
        assert written == json.load(b) == json.load(c)  # and what SAELens itself wrote (save_inference_model's)
    ours, _ = load_file(str(tmp_path / "s" / "sae_weights.safetensors"))
    kept, _ = load_file(os.path.join(theirs, "sae_weights.safetensors"))
    assert sorted(ours) == sorted(kept)
    for k in ours:
        np.testing.assert_array_equal(ours[k], kept[k])


# --- the backward of a splice, through the normalisation, the skip, the activation ----------------------

@pytest.mark.parametrize("name", ["topk", "jumprelu", "skip_transcoder", "jumprelu_transcoder",
                                  "jumprelu_skip_transcoder"])
def test_the_input_gradient_by_finite_differences(saes, name):
    """input_grad: d (g · forward(x)) / d x in float64, through layer_norm's μ and σ (topk, jumprelu_transcoder),
    constant_norm_rescale's ‖x‖ (jumprelu) and W_skip."""
    sae = {k: v.astype(np.float64) if isinstance(v, np.ndarray) else v for k, v in saes[name].items()}
    x = GOLDEN[f"{name}/x"][:6].astype(np.float64)
    g = np.random.default_rng(1).standard_normal((6, 8))
    numeric = numerical_grad(lambda: float((g * S.forward(x, sae)[0]).sum()), x)
    np.testing.assert_allclose(S.input_grad(x, g, sae), numeric, atol=1e-6)
    assert np.abs(numeric).max() > 0.01


def test_a_transcoder_spliced_patches_and_attributes_through_its_input(tiny, saes):
    """circuits with a transcoder: the fast patching sweep equals one run a cell, and attribution's gradient at
    resid_pre reaches the MLP's layer through the transcoder (the model's own MLP output gets none)."""
    params, hparams = tiny
    clean, corrupted = GOLDEN_TOKENS[:2, :8], GOLDEN_TOKENS[2:, :8]
    answer, wrong = np.array([11, 12]), np.array([13, 14])
    for error in (False, True):
        splice = ({}, S.splice(saes["skip_transcoder"], error))
        fast = circuits.patch(params, hparams, clean, corrupted, answer, wrong, "mlp_out", splice=splice)
        slow = circuits.patch(params, hparams, clean, corrupted, answer, wrong, "mlp_out", fast=False, splice=splice)
        close(fast, slow)
    splice = ({}, S.splice(saes["skip_transcoder"]))
    dlogits = circuits.logit_difference_grad(corrupted.shape, params["wte"].shape[0], answer, wrong)
    names = ["blocks.1.hook_resid_mid", "blocks.1.hook_mlp_out"]
    grads = circuits.gradients(corrupted, params, hparams, dlogits, names, splice)
    assert not grads["blocks.1.hook_mlp_out"].any()  # its output is replaced: nothing reads the model's own
    eps, where = 1e-2, (0, 3, 2)

    def metric(delta):
        def hook(a, name):
            a = a.copy()
            a[where] += delta
            return a
        return circuits.logit_difference(look_inside.run_with_hooks(corrupted, params, hparams, {
            "blocks.1.hook_resid_mid": hook}, sae=splice[1]), answer, wrong)

    numeric = (metric(eps) - metric(-eps)) / (2 * eps)
    assert abs(grads["blocks.1.hook_resid_mid"][where] - numeric) < 1e-2 * max(1.0, abs(numeric))


# --- refusals ----------------------------------------------------------------------------------------------

def test_a_transcoder_whose_hook_the_model_lacks_is_refused(tiny, saes, tmp_path, capsys):
    """SAELens only warns and splices nothing: one line, exit 2, here."""
    from conftest import in_process
    from interface import gpt2_cli

    params, hparams = tiny
    elsewhere = {**saes["transcoder"], "cfg": {**saes["transcoder"]["cfg"], "metadata": {
        **saes["transcoder"]["cfg"]["metadata"], "hook_name_out": "blocks.7.hook_mlp_out"}}}
    with pytest.raises(UserError, match="blocks.7.hook_mlp_out"):
        S.check_fits(elsewhere, hparams)
    S.check_fits(saes["transcoder"], hparams)
    sae_files.save_sae(str(tmp_path / "t"), elsewhere)
    r = in_process(gpt2_cli.main, capsys, "hi there", "--score", "--sae", tmp_path / "t", "--model", MODEL)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "blocks.7.hook_mlp_out" in r.stderr, r.stderr


# --- the commands, and OpenAI's TopK SAEs from the Hub -----------------------------------------------------

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 3


def test_the_commands_take_every_architecture(capsys, tmp_path, tiny, saes):
    """sae.py encode, eval and features, gpt2_numpy.py --score and circuits.py, with a TopK SAE and transcoders
    (--fold-ln: TransformerLens's ln2.hook_normalized, which they read)."""
    from conftest import in_process
    from interface import circuits_cli, gpt2_cli, sae_cli

    params, hparams = tiny
    sae_run = lambda *a: in_process(sae_cli.main, capsys, *a, "--model", MODEL, "--quiet", "--json")  # noqa: E731
    r = sae_run("encode", "--sae", os.path.join(FOLDERS, "topk"), "--text", "All:\nSpeak", "--k", "9")
    assert r.returncode == 0, r.stderr
    assert all(len(p["ids"]) == 4 for p in json.loads(r.stdout)["positions"])  # k = 4 fire, always
    transcoder = os.path.join(FOLDERS, "skip_transcoder")
    r = sae_run("encode", "--sae", transcoder, "--text", "All:\nSpeak", "--fold-ln")
    assert r.returncode == 0, r.stderr
    from interface.loading import load_model
    encoder = load_model(MODEL)[0]
    ids = np.array([[encoder.eot] + encoder.encode("All:\nSpeak")])
    x, target = S.gather(ids, params, hparams, ["blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"])
    error = ((S.forward(x[0], saes["skip_transcoder"])[0] - target[0]) ** 2).sum(-1)  # against its output hook's
    np.testing.assert_allclose([p["error"] for p in json.loads(r.stdout)["positions"]], error, rtol=1e-5)
    (tmp_path / "t.txt").write_text(TEXT)
    r = sae_run("eval", "--sae", transcoder, "--data", tmp_path / "t.txt", "--context", "16", "--fold-ln")
    assert r.returncode == 0, r.stderr
    metrics = json.loads(r.stdout)
    assert metrics["l0"] > 0 and np.isfinite(metrics["explained_variance"]) and np.isfinite(metrics["ce_loss_score"])
    r = sae_run("features", "--sae", os.path.join(FOLDERS, "jumprelu_transcoder"), "--data", tmp_path / "t.txt",
                "--context", "16", "--feature", "3", "--fold-ln")
    assert r.returncode == 0, r.stderr
    [feature] = json.loads(r.stdout)["features"]
    promoted = params["wte"] @ saes["jumprelu_transcoder"]["W_dec"][3]  # through what it writes
    assert feature["promotes"][0][1] == pytest.approx(float(promoted.max()), rel=1e-5)
    text = "First Citizen: we are accounted poor"
    r = in_process(gpt2_cli.main, capsys, text, "--score", "--json", "--sae", transcoder, "--fold-ln", "--model", MODEL)
    assert r.returncode == 0, r.stderr
    from gpt2_numpy import token_logprobs
    ids = encoder.encode(text)
    logits = S.run_with_sae([ids[:-1]], params, hparams, saes["skip_transcoder"])[0]
    np.testing.assert_allclose(json.loads(r.stdout)["logprobs"][1:], token_logprobs(logits, ids[1:]), atol=1e-5)
    r = in_process(circuits_cli.main, capsys, "attribution", "--clean", "When Mary and John went, John gave to",
                   "--corrupted", "When Mary and John went, Mary gave to", "--answer", " Mary", "--wrong", " John",
                   "--site", "mlp_out", "--sae", transcoder, "--fold-ln", "--use-error-term", "--json",
                   "--model", MODEL)
    assert r.returncode == 0, r.stderr


def test_openais_topk_sae_from_the_hub_in_its_published_layout(capsys, tmp_path, monkeypatch, tiny):
    """hf:jbloom/GPT2-Small-OAI-v5-32k-resid-post-SAEs/v5_32k_layer_L.pt, as SAELens's pretrained_saes.yaml finds
    OpenAI's TopK SAEs (a pre-6.0 cfg.json: activation_fn topk, k, layer_norm), from a Hub on 127.0.0.1."""
    import shutil

    from conftest import Mirror, in_process
    from interface import sae_cli

    repo = "jbloom/GPT2-Small-OAI-v5-32k-resid-post-SAEs"
    shutil.copytree(os.path.join(FOLDERS, "openai"), tmp_path / "hub" / repo / "resolve" / "main")
    m = Mirror(str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", m.url)
    try:
        r = in_process(sae_cli.main, capsys, "encode", "--sae", f"hf:{repo}/v5_32k_layer_1.pt", "--text", "All:",
                       "--models-dir", tmp_path / "models", "--model", MODEL, "--quiet", "--json")
    finally:
        m.close()
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "models" / "hf" / "jbloom" / "GPT2-Small-OAI-v5-32k-resid-post-SAEs" / "v5_32k_layer_1.pt"
    sae = sae_files.load_sae(str(folder))
    assert (sae["cfg"]["architecture"], sae["cfg"]["k"], sae["cfg"]["normalize_activations"]) == ("topk", 4,
                                                                                                    "layer_norm")
    close(S.encode(GOLDEN["openai/x"], sae), GOLDEN["openai/acts_post"])  # as SAELens reads the folder
    close(S.forward(GOLDEN["openai/x"], sae)[0], GOLDEN["openai/out"])


def test_dla_by_latent_counts_a_topks_rescale_and_its_layer_norm(tiny, saes):
    """Each latent's share is of what it writes, σ (f_i / ‖W_dec[i]‖) W_dec[i]: with b_dec's σ b_dec + μ, they add
    up to the share of the SAE's output."""
    params, hparams = tiny
    sae = saes["topk"]
    ids, answer, wrong = GOLDEN_TOKENS[:2, :9], np.array([11, 12]), np.array([13, 14])
    splice = ({}, S.splice(sae))
    latents = circuits.dla_latents(params, hparams, ids, answer, wrong, sae, splice)
    site = S.hook_name(sae)
    cache, scale, direction = circuits.dla_run(params, hparams, ids, answer, wrong, [f"{site}.hook_sae_input",
                                                                                     f"{site}.hook_sae_output"], splice)
    x = cache[f"{site}.hook_sae_input"]
    sigma, mu = S.normalize(x, sae)[1]
    rest = circuits.dla_component(sigma * sae["b_dec"] + mu, scale, direction).mean()
    whole = circuits.dla_component(cache[f"{site}.hook_sae_output"], scale, direction).mean()
    assert latents.sum() + rest == pytest.approx(whole, abs=1e-4)
    assert np.count_nonzero(latents) > 0


def test_features_of_an_sae_inside_the_mlp_have_no_logit_effects(tiny):
    """A latent that writes an MLP's hidden layer (4C wide) promotes no token directly: none are listed (they
    were a shape error)."""
    params, hparams = tiny
    sae = S.new_sae(32, 16, metadata={"hook_name": "blocks.0.mlp.hook_post"})
    acts = S.gather(GOLDEN_TOKENS[:1], params, hparams, "blocks.0.mlp.hook_post")
    [read] = S.read_features(GOLDEN_TOKENS[:1], acts, sae, params["wte"], [3])
    assert read["promotes"] == [] and read["suppresses"] == [] and read["density"] > 0
