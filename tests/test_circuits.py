"""circuits.py: each experiment against a reference written here (a hook written out by hand, finite
differences for the gradients), and against TransformerLens 4.3.0 itself (tests/data/circuits_golden.npz,
made by tests/data/make_circuits_golden.py on tests/data/hf/tiny and inner and on circuits_model, a model
trained by train.py)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import DATA, ROOT, as_float64, float32_rounding
import backward
import circuits
import gpt2_numpy as g
import look_inside as li
from plumbing import hf_model
from plumbing.checkpoint import load_checkpoint
from plumbing.errors import UserError

GOLDEN = np.load(os.path.join(DATA, "circuits_golden.npz"))
CASES = ("ioi", "inner", "trained")


@pytest.fixture(scope="module")
def models():
    """{case: (hparams, params)}: the models the golden was made on."""
    return {"ioi": hf_model.load_hf_folder(os.path.join(DATA, "hf", "tiny"))[:2],
            "inner": hf_model.load_hf_folder(os.path.join(DATA, "hf", "inner"))[:2],
            "trained": load_checkpoint(os.path.join(DATA, "circuits_model"))}


def gold(case, name):
    return GOLDEN[f"{case}/{name}"]


def experiment(models, case):
    """(params, hparams, clean, corrupted, answer, wrong): the arguments every experiment takes."""
    hp, params = models[case]
    return params, hp, gold(case, "clean"), gold(case, "corrupted"), gold(case, "answer"), gold(case, "wrong")


def assert_close(ours, theirs, what, rel=1e-5, whose="TransformerLens's"):
    """Within rel of the largest value, as the issues ask of TransformerLens's (and circuit-tracer's) numbers."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape}, {whose} {theirs.shape}"
    worst = np.abs(ours - theirs).max()
    assert worst <= rel * np.abs(theirs).max(), f"{what}: {worst:.3g} from {whose} (largest " \
                                                f"{np.abs(theirs).max():.3g})"


# --- 1. the metric ---------------------------------------------------------------------------

def test_the_logit_difference_is_the_answers_logit_less_the_wrong_ones_averaged_over_the_pairs():
    logits = np.zeros((2, 3, 5), np.float32)
    logits[0, -1, [1, 4]] = 3.0, 1.0  # pair 0: answer 1, wrong 4 -> 2
    logits[1, -1, [2, 0]] = -1.0, 5.0  # pair 1: answer 2, wrong 0 -> -6
    logits[:, 0] = 100.0  # only the last position counts
    assert circuits.logit_difference(logits, np.array([1, 2]), np.array([4, 0])) == pytest.approx(-2.0)


@pytest.mark.parametrize("case", CASES)
def test_the_metric_of_each_run_is_transformer_lenss(models, case):
    clean, corrupted = circuits.metrics(*experiment(models, case))
    assert clean == pytest.approx(float(gold(case, "metric_clean")), abs=1e-5 * abs(float(gold(case, "metric_clean"))))
    assert corrupted == pytest.approx(float(gold(case, "metric_corrupted")),
                                      abs=1e-5 * abs(float(gold(case, "metric_clean"))))


def test_normalized_is_zero_at_the_corrupted_run_and_one_at_the_clean():
    np.testing.assert_allclose(circuits.normalized([0.5, 2.5, 1.5], clean=2.5, corrupted=0.5), [0.0, 1.0, 0.5])


# --- 2. activation patching ---------------------------------------------------------------------

def test_a_patch_hook_replaces_one_cell_with_the_clean_runs_and_leaves_the_rest():
    clean, corrupted = np.arange(24.0).reshape(2, 3, 4), -np.ones((2, 3, 4))
    out = circuits.patch_hook(clean, (slice(None), 1))(corrupted, "blocks.0.hook_resid_pre")
    np.testing.assert_array_equal(out[:, 1], clean[:, 1])
    np.testing.assert_array_equal(np.delete(out, 1, axis=1), -1.0)
    np.testing.assert_array_equal(corrupted, -1.0)  # a copy: the run's own activation is not changed


def test_one_cell_is_the_corrupted_run_with_that_activation_replaced_by_hand(models):
    """The reference written out: one hook, one run, for a cell of each kind of site."""
    params, hp, clean, corrupted, answer, wrong = experiment(models, "inner")
    _, cache = li.run_with_cache(clean, params, hp)

    def by_hand(name, part):
        def hook(act, _):
            act = act.copy()
            act[part] = cache[name][part]
            return act
        return circuits.logit_difference(li.run_with_hooks(corrupted, params, hp, {name: hook}), answer, wrong)

    cells = [("resid_pre", False, (1, 5), "blocks.1.hook_resid_pre", np.s_[:, 5]),
             ("mlp_out", False, (2, 2), "blocks.2.hook_mlp_out", np.s_[:, 2]),
             ("head", False, (0, 5, 1), "blocks.0.attn.hook_z", np.s_[:, 5, 1]),
             ("head", True, (1, 2), "blocks.1.attn.hook_z", np.s_[:, :, 2]),
             ("k", False, (1, 0), "blocks.1.attn.hook_k", np.s_[:, :, 0]),
             ("pattern", False, (2, 1), "blocks.2.attn.hook_pattern", np.s_[:, 1])]
    for site, all_positions, cell, name, part in cells:
        for fast in (True, False):
            got = circuits.patch(params, hp, clean, corrupted, answer, wrong, site, all_positions, fast=fast)[cell]
            assert got == pytest.approx(by_hand(name, part), abs=1e-5), (site, cell, fast)


def test_resid_mid_is_the_residual_stream_itself(models):
    """resid_mid = resid_pre + attn_out: patching it is patching attn_out to make it so (and the MLP and
    the skip connection both see it)."""
    params, hp, clean, corrupted, answer, wrong = experiment(models, "inner")
    _, c = li.run_with_cache(clean, params, hp)
    _, k = li.run_with_cache(corrupted, params, hp)

    def hook(act, _):
        act = act.copy()
        act[:, 4] = c["blocks.1.hook_resid_mid"][:, 4] - k["blocks.1.hook_resid_pre"][:, 4]
        return act

    want = circuits.logit_difference(li.run_with_hooks(corrupted, params, hp, {"blocks.1.hook_attn_out": hook}),
                                     answer, wrong)
    assert circuits.patch(params, hp, clean, corrupted, answer, wrong, "resid_mid")[1, 4] == pytest.approx(want,
                                                                                                          abs=1e-5)


PATCHED = [(site, False) for site in circuits.SITES] + [("head", True)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("site, all_positions", PATCHED)
def test_every_patching_sweep_is_transformer_lenss(models, case, site, all_positions):
    ours = circuits.patch(*experiment(models, case), site, all_positions)
    assert_close(ours, gold(case, "patch/head_all" if all_positions else f"patch/{site}"), f"{case} {site}")


def test_transformer_lens_4_3s_resid_mid_patch_reaches_the_mlps_input_alone(models):
    """Why the golden's resid_mid is made with a hook of its own: TL 4.3.0's bridge names ln2's input
    hook_resid_mid, so get_act_patch_resid_mid changes what the MLP reads, not the residual stream."""
    params, hp, clean, corrupted, answer, wrong = experiment(models, "inner")
    _, c = li.run_with_cache(clean, params, hp)
    L, T = hp["n_layer"], clean.shape[1]
    ours = np.zeros((L, T))
    for i in range(L):
        for p in range(T):
            def mlp_input(act, _, i=i, p=p):
                act = act.copy()
                act[:, p] = g.layer_norm(c[f"blocks.{i}.hook_resid_mid"][:, p], **params["blocks"][i]["ln_2"],
                                         eps=g.layer_norm_eps(hp))
                return act
            ours[i, p] = circuits.logit_difference(
                li.run_with_hooks(corrupted, params, hp, {f"blocks.{i}.ln2.hook_normalized": mlp_input}), answer, wrong)
    assert_close(ours, gold("inner", "patch/resid_mid_ln2"), "TL's resid_mid")
    assert np.abs(ours - gold("inner", "patch/resid_mid")).max() > 0.01  # and that is another experiment


def test_the_fast_sweep_is_the_plain_one_also_in_chunks(models, monkeypatch):
    args = experiment(models, "trained")
    plain = circuits.patch(*args, "head", fast=False)
    np.testing.assert_allclose(circuits.patch(*args, "head"), plain, rtol=0, atol=1e-5)
    monkeypatch.setattr(circuits, "ROWS", 100)  # a batch of a few copies at a time
    np.testing.assert_allclose(circuits.patch(*args, "head"), plain, rtol=0, atol=1e-5)


def test_a_patch_written_into_the_activation_is_refused_where_the_cells_share_it(models, monkeypatch):
    """Exercise 40's experiment: a patch_hook that writes into the activation it is handed gives the same
    table at attn_out; at resid_pre, with one pair, the fast sweep hands every cell of a layer one read-only
    array (the corrupted run's residual stream, computed once), and the write stops there."""
    params, hp, clean, corrupted, answer, wrong = experiment(models, "trained")
    one = (params, hp, clean[:1], corrupted[:1], answer[:1], wrong[:1])

    def in_place(clean, index):
        def hook(act, name):
            act[index] = clean[index]
            return act
        return hook

    right = circuits.patch(*one, "attn_out")
    monkeypatch.setattr(circuits, "patch_hook", in_place)
    np.testing.assert_array_equal(circuits.patch(*one, "attn_out"), right)
    with pytest.raises(ValueError, match="assignment destination is read-only"):
        circuits.patch(*one, "resid_pre")


def test_the_docs_offline_pair_lines_up_in_the_from_scratch_models_vocabulary():
    """docs/circuits.md's worked pair for the README's from-scratch model: in the vocabulary that recipe learns
    (1,024 ids from the training 90% of tiny Shakespeare), the prompts have the same length and differ in one
    token, each answer is one token, and random:31, the largest N its 64 positions hold, is what it runs."""
    import bpe
    import train
    from plumbing import corpus
    with open(os.path.join(ROOT, "docs", "circuits.md"), encoding="utf-8") as f:
        doc = f.read()
    pair = ["ROMEO:\nO Juliet, thou", "ROMEO:\nO Juliet, you", " art", " are"]
    assert "--clean $'ROMEO:\\nO Juliet, thou' --corrupted $'ROMEO:\\nO Juliet, you' --answer \" art\" --wrong \" are\"" in doc
    assert "--text random:31 " in doc and 2 * 31 + 1 <= 64 < 2 * 32 + 1
    documents, _ = train.split_documents(corpus.read_documents([os.path.join(ROOT, "data", "tinyshakespeare.txt")]), 0.1)
    encoder = bpe.parse_vocab(*bpe.vocab_files(bpe.train_vocab(documents, 1024)))
    clean, corrupted, answer, wrong = map(encoder.encode, pair)
    assert len(clean) == len(corrupted) == 10 and sum(a != b for a, b in zip(clean, corrupted)) == 1
    assert len(answer) == len(wrong) == 1


def test_patching_the_one_position_where_the_prompts_differ_brings_the_whole_answer_back(models):
    params, hp, clean, corrupted, answer, wrong = experiment(models, "ioi")
    differs = np.flatnonzero((clean != corrupted).any(0))
    assert len(differs) == 1  # the second name: "John gave" against "Mary gave"
    values = circuits.patch(params, hp, clean, corrupted, answer, wrong, "resid_pre")
    clean_metric, corrupted_metric = circuits.metrics(params, hp, clean, corrupted, answer, wrong)
    np.testing.assert_allclose(circuits.normalized(values[0], clean_metric, corrupted_metric)[differs], 1.0, atol=1e-5)
    np.testing.assert_allclose(np.delete(values[0], differs), corrupted_metric, atol=1e-5)  # the same token: no change


# --- 3. direct logit attribution ------------------------------------------------------------------

def test_one_components_share_is_its_centred_value_over_lnfs_scale_along_the_direction():
    rng = np.random.default_rng(0)
    c, direction, scale = rng.standard_normal((2, 6)), rng.standard_normal((2, 6)), np.array([[2.0], [0.5]])
    want = [sum((c[b, i] - c[b].mean()) / scale[b, 0] * direction[b, i] for i in range(6)) for b in range(2)]
    np.testing.assert_allclose(circuits.dla_component(c, scale, direction), want, rtol=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_direct_logit_attribution_is_transformer_lenss(models, case):
    params, hp, clean, _, answer, wrong = experiment(models, case)
    labels, values = circuits.dla_components(params, hp, clean, answer, wrong)
    assert labels == gold(case, "dla/labels").tolist()
    assert_close(values, gold(case, "dla/components"), f"{case} by component")
    labels, values = circuits.dla_heads(params, hp, clean, answer, wrong)
    assert labels == [f"L{i}H{h}" for i in range(hp["n_layer"]) for h in range(hp["n_head"])]
    assert_close(values, gold(case, "dla/heads"), f"{case} by head")


@pytest.mark.parametrize("case", CASES)
def test_the_components_add_up_to_the_logit_difference_but_ln_fs_bias_term(models, case):
    params, hp, clean, _, answer, wrong = experiment(models, case)
    _, values = circuits.dla_components(params, hp, clean, answer, wrong)
    metric = circuits.logit_difference(g.gpt2(clean, params, hp), answer, wrong)
    bias_term = (params["ln_f"]["b"] * (params["wte"][answer] - params["wte"][wrong])).sum(-1).mean()
    assert values.sum() == pytest.approx(metric - bias_term, abs=1e-5 * max(1.0, abs(metric)))


def test_the_heads_results_and_c_projs_bias_are_the_attention_output(models):
    params, hp, clean, _, _, _ = experiment(models, "trained")
    _, cache = li.run_with_cache(clean, params, hp)
    c_proj = params["blocks"][1]["attn"]["c_proj"]
    results = circuits.head_results(cache["blocks.1.attn.hook_z"], c_proj, hp["n_head"])  # [B, T, H, C]
    np.testing.assert_allclose(results.sum(-2) + c_proj["b"], cache["blocks.1.hook_attn_out"], atol=1e-5)


# --- 4. attribution patching, and the gradients it reads --------------------------------------------

def gradient_names(case, n_layer):
    """The activations whose gradients the golden holds, by TransformerLens's names."""
    return [k.split("/", 2)[2] for k in GOLDEN.files if k.startswith(f"{case}/grad/") and not k.endswith("hook_out")]


def torch_gradient(case, name):
    """TL's gradient at what our activation `name` is: the bridge calls the layer norms' output ln1.hook_out
    (its hook_normalized is before the gain), names ln2's input hook_resid_mid (the residual stream's gradient
    adds the skip connection's, hook_resid_post's), and gives hook_pos_embed one copy a pair (ours is shared)."""
    if name.endswith("hook_normalized"):
        return gold(case, f"grad/{name.replace('hook_normalized', 'hook_out')}")
    if name.endswith("hook_resid_mid"):
        return gold(case, f"grad/{name}") + gold(case, f"grad/{name.replace('mid', 'post')}")
    if name == "hook_pos_embed":
        return gold(case, f"grad/{name}").sum(0, keepdims=True)
    return gold(case, f"grad/{name}")


@pytest.mark.parametrize("case", CASES)
def test_every_activations_gradient_is_torchs(models, case):
    params, hp, _, corrupted, answer, wrong = experiment(models, case)
    names = gradient_names(case, hp["n_layer"])
    dlogits = circuits.logit_difference_grad(corrupted.shape, params["wte"].shape[0], answer, wrong)
    ours = circuits.gradients(corrupted, params, hp, dlogits, names)
    assert sorted(ours) == sorted(names)
    for name in names:
        want = torch_gradient(case, name)
        if name.endswith("hook_attn_scores"):  # torch's is 0 where the mask is; so is ours
            want = np.where(np.isfinite(want), want, 0.0)
        # the forward pass's linear layers and the backward's, each a chain of 4 a block and the head
        rel = float32_rounding(4 * hp["n_embd"], 2 * (4 * hp["n_layer"] + 1), 1.0)
        assert_close(ours[name], want, f"{case} d metric / d {name}", rel)


def test_every_activations_gradient_by_finite_differences(models):
    """backward.activation_grads in float64 against the metric moved by a nudge at one element of each
    activation (a raw model hook), for every activation the forward passes through its hook."""
    hp, params = models["inner"]
    params = as_float64(params)
    ids, answer, wrong = gold("inner", "corrupted")[:, :5], gold("inner", "answer"), gold("inner", "wrong")
    dlogits = circuits.logit_difference_grad(ids.shape, 96, answer, wrong).astype(np.float64)
    grads = {}
    backward.activation_grads(ids, params, hp, dlogits, lambda name, d: grads.setdefault(name, d))
    rng = np.random.default_rng(0)

    def metric(name, i, step):
        def nudge(n, x):
            if n != name:
                return x
            x = x.copy()
            x[i] += step
            return x
        return circuits.logit_difference(g.gpt2(ids, params, hp, hook=nudge), answer, wrong)

    for name, d in grads.items():
        for i in [tuple(rng.integers(0, n) for n in d.shape) for _ in range(3)] + [np.unravel_index(
                np.abs(d).argmax(), d.shape)]:
            if name.endswith("attn.scores") and i[-1] > i[-2]:
                continue  # a masked score: -inf, whatever the nudge
            numeric = (metric(name, i, 1e-6) - metric(name, i, -1e-6)) / 2e-6
            assert abs(d[i] - numeric) <= 1e-6 * max(1.0, abs(numeric)), (name, i, d[i], numeric)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("site", circuits.ATTRIBUTED)
def test_attribution_patching_is_transformer_lenss(models, case, site):
    ours = circuits.attribution(*experiment(models, case), site)
    assert_within(ours, gold(case, f"attribution/{site}"), attribution_bound(*experiment(models, case)[:2],
                                                                             experiment(models, case)[2:], site),
                  f"{case} {site}")


def test_attribution_is_attribution_patchs_node_scores(models):
    """TL's attribution_patch scores each pair with its own metric and averages: the same numbers."""
    for case in CASES:
        params, hp, clean, corrupted, answer, wrong = experiment(models, case)
        pairs = slice(0, 1) if case == "ioi" else slice(None)  # as the golden ran it
        for site in ("head", "mlp_out"):
            four = clean[pairs], corrupted[pairs], answer[pairs], wrong[pairs]
            assert_within(circuits.attribution(params, hp, *four, site), gold(case, f"attribution_patch/{site}"),
                          attribution_bound(params, hp, four, site), f"{case} {site}")


# --- 5. direct path patching ---------------------------------------------------------------------

def path_cases():
    """(case, "L.H"): the sources the golden holds."""
    return sorted({(k.split("/")[0], k.split("/")[2]) for k in GOLDEN.files if "/path/" in k})


@pytest.mark.parametrize("case, source", path_cases())
def test_direct_path_patching_is_transformer_lenss(models, case, source):
    layer, head = map(int, source.split("."))
    for component in circuits.COMPONENTS:
        ours = circuits.path_patch(*experiment(models, case), (layer, head), component)
        assert_close(ours, gold(case, f"path/{source}/{component}"), f"{case} {source} -> {component}")
        assert not ours[:layer + 1].any()


def test_a_path_reaches_one_heads_input_alone_by_hand(models):
    """The reference written out: head (0, 2)'s change added to the residual stream that head (1, 1)'s
    query reads, by recomputing ln_1 and its slice of c_attn in a hook, and nowhere else."""
    params, hp, clean, corrupted, answer, wrong = experiment(models, "inner")
    _, c = li.run_with_cache(clean, params, hp)
    _, k = li.run_with_cache(corrupted, params, hp)
    D = hp["n_embd"] // hp["n_head"]  # one head's width
    delta = (c["blocks.0.attn.hook_z"][:, :, 2] - k["blocks.0.attn.hook_z"][:, :, 2]) @ \
        params["blocks"][0]["attn"]["c_proj"]["w"][2 * D:3 * D]
    block = params["blocks"][1]
    x = g.layer_norm(k["blocks.1.hook_resid_pre"] + delta, **block["ln_1"], eps=g.layer_norm_eps(hp))
    q = x @ block["attn"]["c_attn"]["w"][:, D:2 * D] + block["attn"]["c_attn"]["b"][D:2 * D]

    def hook(act, _):
        act = act.copy()
        act[:, :, 1] = q
        return act

    want = circuits.logit_difference(li.run_with_hooks(corrupted, params, hp, {"blocks.1.attn.hook_q": hook}),
                                     answer, wrong)
    for fast in (True, False):
        got = circuits.path_patch(params, hp, clean, corrupted, answer, wrong, (0, 2), "q", fast=fast)[1, 1]
        assert got == pytest.approx(want, abs=1e-5)


# --- 6. head detectors -------------------------------------------------------------------------

def test_the_detection_patterns_by_hand():
    tokens = [9, 5, 7, 5, 7, 7]
    assert circuits.detection_pattern(tokens, "previous").tolist() == np.eye(6, k=-1).tolist()
    duplicate = np.zeros((6, 6))
    duplicate[3, 1] = duplicate[4, 2] = duplicate[5, 2] = duplicate[5, 4] = 1  # an earlier copy of my token
    assert circuits.detection_pattern(tokens, "duplicate").tolist() == duplicate.tolist()
    induction = np.zeros((6, 6))
    induction[3, 2] = induction[4, 3] = induction[5, 3] = induction[5, 5] = 1  # the token after that copy
    assert circuits.detection_pattern(tokens, "induction").tolist() == induction.tolist()


def head_cases():
    """(case, text, pattern): the scores the golden holds."""
    return sorted((case, text, pattern) for case, kind, text, pattern in
                  (k.split("/") for k in GOLDEN.files if "/heads/" in k and not k.endswith("/tokens")))


@pytest.mark.parametrize("case, text, pattern", head_cases())
def test_head_scores_are_detect_heads(models, case, text, pattern):
    hp, params = models[case]
    ours = circuits.head_scores(params, hp, gold(case, f"heads/{text}/tokens"), pattern)
    assert_close(ours, gold(case, f"heads/{text}/{pattern}"), f"{case} {text} {pattern}")


def test_repeated_random_tokens_are_said_twice_after_endoftext_and_never_hold_it():
    ids = circuits.repeated_random_tokens(200, 10, eot=9, seed=0)
    assert ids[0] == 9 and len(ids) == 401 and 9 not in ids[1:]
    np.testing.assert_array_equal(ids[1:201], ids[201:])
    np.testing.assert_array_equal(circuits.repeated_random_tokens(5, 50257, 50256, seed=3),
                                  circuits.repeated_random_tokens(5, 50257, 50256, seed=3))


def test_detect_heads_score_and_look_insides_induction_score_are_two_averages(models):
    """detect_head divides by every row (T); look_inside.induction_scores by the rows that have a target:
    on N random ids said twice, the second half's N rows of 2N + 1."""
    hp, params = models["trained"]
    ids = gold("trained", "heads/random/tokens")
    _, cache = li.run_with_cache(ids[None], params, hp)
    pattern = np.stack([cache[f"blocks.{i}.attn.hook_pattern"][0] for i in range(hp["n_layer"])])
    n = (len(ids) - 1) // 2
    if len(set(ids[1:n + 1].tolist())) == n:  # no id twice in a half: every second-half row has one target
        np.testing.assert_allclose(circuits.head_scores(params, hp, ids, "induction") * len(ids) / n,
                                   li.induction_scores(pattern, ids), rtol=1e-5)


def test_the_linear_estimate_is_close_for_a_small_change_and_wrong_for_a_large_one(models):
    """docs/circuits.md's two cases. Small: on the trained model, one head's z at the last position (the one
    position where its prompts differ). Large: on tiny's IOI pair, a whole token's embedding (the second
    name) into layer 0: the patch brings the whole clean answer back, the estimate has the wrong sign."""
    args = experiment(models, "trained")
    corrupted = circuits.metrics(*args)[1]
    moved = circuits.patch(*args, "head")[0, -1, 1] - corrupted
    estimate = circuits.attribution(*args, "head")[0, -1, 1]
    assert abs(moved) > 0.3 and abs(estimate - moved) < 0.1 * abs(moved), (moved, estimate)
    args = experiment(models, "ioi")
    clean, corrupted = circuits.metrics(*args)
    moved = circuits.patch(*args, "resid_pre")[0, 10] - corrupted
    estimate = circuits.attribution(*args, "resid_pre")[0, 10]
    assert moved == pytest.approx(clean - corrupted, abs=1e-5) and estimate * moved < 0, (moved, estimate)


# --- the command line ----------------------------------------------------------------------------

TINY = os.path.join(DATA, "hf", "tiny")
IOI = ["--clean", "When Mary and John went to the store, John gave a drink to",
       "--corrupted", "When Mary and John went to the store, Mary gave a drink to", "--answer", " Mary",
       "--wrong", " John"]
CLEAN_ONLY = IOI[:2] + IOI[4:]


@pytest.fixture(scope="module", autouse=True)
def loaded_once():
    """The command line's models, each read from its folder once for this file's tests (a tenth of a second a
    time, most of it the vocabulary); what is not found still raises as it did."""
    from interface import loading

    read, kept = loading.load_model, {}

    def load_model(*args, **kw):
        key = (args, tuple(sorted(kw.items())))
        if key not in kept:
            kept[key] = read(*args, **kw)
        return kept[key]

    with pytest.MonkeyPatch.context() as m:
        m.setattr(loading, "load_model", load_model)
        yield


def cli(capsys, *argv):
    """circuits.py's main in this process: -> (exit status, stdout, stderr)."""
    from interface import circuits_cli

    try:
        code = circuits_cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys, *argv):
    code, out, err = cli(capsys, *argv, "--json", "--model", TINY)
    assert code == 0, err
    return json.loads(out)


def test_each_command_gives_the_experiments_numbers(models, capsys):
    """The command line runs the API on the IOI pair, tokenized as TransformerLens's to_tokens does."""
    params, hp, clean, corrupted, answer, wrong = experiment(models, "ioi")
    clean, corrupted, answer, wrong = clean[:1], corrupted[:1], answer[:1], wrong[:1]  # the first pair
    out = cli_json(capsys, "patch", *IOI, "--site", "head")
    assert out["tokens"][0] == "<|endoftext|>" and len(out["tokens"]) == clean.shape[1]
    np.testing.assert_allclose(out["values"], circuits.patch(params, hp, clean, corrupted, answer, wrong, "head"))
    assert (out["clean"], out["corrupted"]) == pytest.approx(circuits.metrics(params, hp, clean, corrupted, answer,
                                                                              wrong))
    out = cli_json(capsys, "patch", *IOI, "--site", "resid_pre", "--normalized")
    raw = circuits.patch(params, hp, clean, corrupted, answer, wrong, "resid_pre")
    np.testing.assert_allclose(out["values"], circuits.normalized(raw, out["clean"], out["corrupted"]), rtol=1e-6)
    assert cli_json(capsys, "logit-diff", *CLEAN_ONLY)["values"] == pytest.approx(out["clean"])
    out = cli_json(capsys, "dla", *CLEAN_ONLY)
    assert out["labels"][:3] == ["embed", "pos_embed", "0_attn_out"]
    assert out["total"] == pytest.approx(sum(out["values"]))
    np.testing.assert_allclose(out["values"], circuits.dla_components(params, hp, clean, answer, wrong)[1])
    assert cli_json(capsys, "dla", *CLEAN_ONLY, "--by", "head")["labels"] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    np.testing.assert_allclose(cli_json(capsys, "attribution", *IOI, "--site", "mlp_out")["values"],
                               circuits.attribution(params, hp, clean, corrupted, answer, wrong, "mlp_out"))
    out = cli_json(capsys, "path", *IOI, "--source", "0.1", "--component", "v")["values"]
    assert out[0] == [None, None]  # layer 0, the source's, is not measured
    patched = circuits.path_patch(params, hp, clean, corrupted, answer, wrong, (0, 1), "v")
    np.testing.assert_allclose(out[1:], patched[1:])
    out = cli_json(capsys, "heads", "--text", "random:12", "--pattern", "induction", "--seed", "0")
    ids = circuits.repeated_random_tokens(12, 50257, 50256, seed=0)
    np.testing.assert_allclose(out["values"], circuits.head_scores(params, hp, ids, "induction"))


def test_the_command_line_reads_a_text_as_to_tokens_does(encoder):
    for row, text in zip(gold("ioi", "clean"), ["When Mary and John went to the store, John gave a drink to",
                                                "When Tom and James went to the park, James gave a ball to"]):
        assert [encoder.eot] + encoder.encode(text) == row.tolist()


def test_the_tables_name_the_layers_heads_and_tokens(capsys):
    code, out, _ = cli(capsys, "patch", *IOI, "--site", "head", "--model", TINY)
    assert code == 0 and "the metric (the logit difference): clean 2.3400, corrupted -0.3747" in out
    lines = out.splitlines()
    assert lines[2].split()[:3] == ["<|endoft…", "When", "Mary"] and lines[3].startswith("L0H0")
    assert lines[-1].startswith("L1H1") and len(lines) == 3 + 4
    code, out, _ = cli(capsys, "dla", *CLEAN_ONLY, "--model", TINY)
    assert code == 0 and "1_mlp_out" in out and "ln_f's bias term" in out


def test_a_model_trained_by_train_py_runs_every_command(capsys):
    model = os.path.join(DATA, "circuits_model")
    pair = ["--clean", "ROMEO:\nI will speak.\n\nJULIET:", "--corrupted", "ROMEO:\nI will speak.\n\nJULIET,",
            "--answer", "\n", "--wrong", " "]
    for argv in (["logit-diff"] + pair[:2] + pair[4:], ["patch"] + pair + ["--site", "pattern"],
                 ["dla"] + pair[:2] + pair[4:] + ["--by", "head"], ["attribution"] + pair + ["--site", "head"],
                 ["path"] + pair + ["--source", "1.3", "--component", "k"],
                 ["heads", "--text", "random:15", "--pattern", "previous"]):
        code, out, err = cli(capsys, *argv, "--model", model)
        assert code == 0 and out and not err, (argv, err)


def test_the_page_is_one_file_with_the_heatmap(capsys, tmp_path):
    page = tmp_path / "patch.html"
    code, _, err = cli(capsys, "patch", *IOI, "--site", "resid_pre", "--model", TINY, "--html", str(page))
    assert code == 0 and err == f"{page}: {page.stat().st_size:,} bytes\n"
    text = page.read_text(encoding="utf-8")
    assert text.count("<tr>") == 1 + 2 and "&lt;|endoftext|&gt;" in text and "http" not in text.replace(
        "http://www.w3.org", "")
    assert "layer 1, 10" not in text and 'title="layer 0, ' in text
    assert sorted(os.listdir(tmp_path)) == ["patch.html"]  # nothing else left beside it


def test_the_pages_colours_are_white_at_the_centre_and_full_at_the_largest_distance():
    from interface import circuits_page

    assert circuits_page.colour(2.0, center=2.0, scale=3.0) == "rgb(255,255,255)"
    assert circuits_page.colour(5.0, center=2.0, scale=3.0) == "rgb(49,101,196)"  # blue: above the centre
    assert circuits_page.colour(-1.0, center=2.0, scale=3.0) == "rgb(214,72,58)"  # red: below it
    assert circuits_page.colour(7.0, center=0.0, scale=0.0) == "rgb(255,255,255)"  # all values alike


def test_path_patchings_unmeasured_cells_are_null_blank_and_out_of_the_pages_scale(capsys, tmp_path):
    """The layers up to the source are never patched: null in --json, blank in the table, and on the page grey,
    with the colours' scale set by the measured cells alone (the largest of them full blue or red)."""
    from interface import circuits_page

    page = tmp_path / "path.html"
    code, out, err = cli(capsys, "path", *IOI, "--source", "0.1", "--model", TINY, "--html", str(page))
    lines = out.splitlines()
    assert code == 0 and "blank up to layer 0, the source's: not measured" in lines[1], out
    assert lines[3].strip() == "layer 0" and len(lines[4].split()) == 4, out  # blank; then layer 1's two values
    html = page.read_text(encoding="utf-8")
    assert html.count('class="none"') == 2 and ("rgb(49,101,196)" in html or "rgb(214,72,58)" in html), html
    values = [[None, None], [1.0, 3.0]]
    cells = circuits_page.render_page("t", "d", ["a"], ["layer 0", "layer 1"], ["H0", "H1"], values, 2.0)
    assert cells.count("rgb(214,72,58)") == 1 and cells.count("rgb(49,101,196)") == 1, cells  # scale 1, not 2
    assert cells.count('title="layer 0, H0: not measured"></td>') == 1


def test_a_tables_columns_line_up_and_it_shows_no_negative_zero(capsys):
    """DLA's labels (0_attn_out) are wider than the 8 a layer's take: the column widens. A normalized value that
    rounds to 0 is 0.000, not -0.000."""
    code, out, err = cli(capsys, "dla", *CLEAN_ONLY, "--model", TINY)
    rows = out.splitlines()[2:-1]  # the column's header, then a row a part
    assert code == 0 and rows[3].startswith("0_attn_out ") and len({len(row) for row in rows}) == 1, out
    code, out, err = cli(capsys, "patch", *IOI, "--normalized", "--model", TINY)
    assert code == 0 and "-0.000" not in out and "     0.000" in out, out


BAD = [  # argv (after the model) -> the one line it gets
    (["patch", *IOI[:5], " Mary Ann", "--wrong", " John"], "--answer ' Mary Ann' is 2 tokens (' Mary', ' Ann'): an "
                                                            "answer must be one token"),
    (["logit-diff", *CLEAN_ONLY[:2], "--answer", "", "--wrong", " John"], "--answer '' is no token"),
    (["patch", *IOI[:3], "When Mary and John went to the shop, Mary gave a drink to Tom", *IOI[4:]],
     "--clean is 15 tokens and --corrupted 16: a pair must be one length"),
    (["patch", *IOI, "--site", "resid_post"], "argument --site: invalid choice: 'resid_post'"),
    (["path", *IOI, "--source", "0.1", "--component", "o"], "argument --component: invalid choice: 'o'"),
    (["heads", "--text", "the cat", "--pattern", "copying"], "argument --pattern: invalid choice: 'copying'"),
    (["path", *IOI, "--source", "5.0"], "--source must be a head of the model, layer 0..1 and head 0..1, got 5.0"),
    (["path", *IOI, "--source", "1.0"], "error: --source 1.0 is in the last layer: no head comes after it for its "
                                        "change to reach; choose a head in a layer before 1"),
    (["path", *IOI, "--source", "nine"], "error: --source must be a head, LAYER.HEAD (e.g. 9.9), got 'nine'"),
    (["heads", "--text", "random:5", "--pattern", "induction", "--seed", "-1"], "error: --seed must be at least 0, "
                                                                                "got -1"),
    (["patch", *IOI, "--html", "/no/such/folder/page.html"], "its folder /no/such/folder does not exist"),
    (["patch", "--clean", "", *IOI[2:]], "--clean is empty: give a text"),
    (["heads", "--text", "random:40", "--pattern", "induction"], "--text random:40 is 81 tokens; the model reads at "
                                                                 "most 64, so N is at most 31"),
    (["logit-diff", "--clean", "word" * 70, *IOI[4:]], "--clean is 71 tokens with <|endoftext|>; the model reads "
                                                       "at most 64"),
    (["patch", *IOI[:2], "--corrupted", IOI[1], *IOI[4:], "--normalized"], "give the same metric"),
    (["patch", *IOI, "--all-positions"], "--all-positions goes with --site head"),
    (["dla", *CLEAN_ONLY[:-1], " Mary"], "error: --answer and --wrong are the same token, ' Mary': its logit "
                                         "difference with itself is always 0"),
    (["patch", *IOI[:-1], " Mary", "--normalized"], "--answer and --wrong are the same token"),
]


@pytest.mark.parametrize("argv, message", BAD)
def test_bad_input_is_one_line_and_exit_2_and_writes_nothing(capsys, tmp_path, argv, message):
    page = tmp_path / "page.html"
    code, out, err = cli(capsys, *argv, "--model", TINY, *([] if "--html" in argv else ["--html", str(page)]))
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert not os.listdir(tmp_path)


def test_a_model_that_cannot_be_found_is_one_line(capsys, tmp_path):
    code, out, err = cli(capsys, "logit-diff", *CLEAN_ONLY, "--model", str(tmp_path / "nothing"))
    assert code == 2 and out == "" and err.count("\n") == 1, err


def test_ctrl_c_is_one_line_and_exit_130_and_writes_no_page(capsys, monkeypatch, tmp_path):
    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(circuits, "copies_forward", interrupted)
    code, out, err = cli(capsys, "patch", *IOI, "--model", TINY, "--html", str(tmp_path / "page.html"))
    assert code == 130 and out == "" and err == "interrupted\n" and not os.listdir(tmp_path)


def test_python_circuits_py_runs_the_command_line():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "circuits.py"), "heads", "--text", "the cat sat",
                        "--pattern", "previous", "--model", TINY, "--json"], capture_output=True, text=True)
    assert r.returncode == 0 and len(json.loads(r.stdout)["values"]) == 2, r.stderr
    r = subprocess.run([sys.executable, os.path.join(ROOT, "circuits.py"), "dance"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "invalid choice: 'dance'" in r.stderr


# --- with an SAE spliced in ------------------------------------------------------------------------
# tests/data/sae_circuits_golden.npz: SAELens 6.54.12's HookedSAETransformer (tests/data/make_sae_golden.py) on tiny,
# the SAE tests/data/sae_golden/sae at blocks.1.hook_resid_pre, the two IOI pairs.

SAE_GOLDEN = np.load(os.path.join(DATA, "sae_circuits_golden.npz"))
SAE_DIR = os.path.join(DATA, "sae_golden", "sae")
SETTINGS = {"sae": (False, False), "sae_error": (False, True), "centred": (True, False), "centred_error": (True, True)}


def a_splice(hp, an_sae, centred=False, use_error_term=False):
    import sae as S

    return (S.centring_hooks(hp["n_layer"]) if centred else {}), S.splice(an_sae, use_error_term)


def random_sae(site, width, seed=0):
    """A random SAE at any hook point, its biases not 0 and about half its latents firing."""
    import sae as S

    rng = np.random.default_rng(seed)
    an_sae = S.new_sae(width, 16, seed, metadata={"hook_name": site})
    an_sae.update(W_enc=(an_sae["W_enc"] + rng.standard_normal((width, 16)) * 0.5).astype(np.float32),
                  W_dec=(an_sae["W_dec"] * 10).astype(np.float32),
                  b_dec=(rng.standard_normal(width) * 0.1).astype(np.float32))
    return an_sae


@pytest.fixture(scope="module")
def golden_sae():
    from plumbing import sae_files

    return sae_files.load_sae(SAE_DIR)


def attribution_bound(params, hp, pairs, site="resid_pre", splice=None, an_sae=None):
    """How far float32's rounding can move attribution at `site`, ours or torch's: [L, T] ([L, T, H] for head).
    attribution = Σ (a_clean - a_corrupted)·g, a difference of two activations times a gradient, with much
    cancellation: spliced, at the SAE's hook point the gradient went back through the SAE (((g W_decᵀ) ⊙ [h > 0])
    W_encᵀ), and at the swapped name the value is 0.13 where the terms' magnitudes sum to 48; torch's own float32
    answer is 1.7e-5 of the largest value from the float64 one. A product's forward error is at most γ_n |A||B|
    (γ_n = n·u, u = 2⁻²⁴: Higham, Accuracy and Stability, 3.5), so each side's rounding is within γ_n of the
    same sums taken over magnitudes: Σ (|a_clean| + |a_corrupted|)·(|g| + |g|'s magnitudes through the SAE,
    which reach the sites below it through the residual stream unchanged). n is the longest sum, the MLP's 4C
    or the SAE's width; two sides make 2γ_n. Measured against TransformerLens and SAELens on OpenBLAS's Haswell
    and SkylakeX kernels: at most 6.1 u times those sums (the SAE's resid_pre, Haswell), against 2n (64 there);
    a fixed 1e-5 of the largest value held on one kernel alone."""
    import sae as S

    hooks, through = {}, {}
    if splice:
        site_name, run, grad, reads = splice[1]  # the hook it writes, its run and backward, the hook it reads

        def keep_magnitudes(x, g):  # the SAE's backward (sae.input_grad) on magnitudes
            through["sae"] = ((np.abs(g) @ np.abs(an_sae["W_dec"]).T) * (S.encode_pre(x, an_sae) > 0)) @ \
                np.abs(an_sae["W_enc"]).T
            return grad(x, g)

        splice = (splice[0], (site_name, run, keep_magnitudes, reads))
        hooks = splice[0]
    clean, corrupted, answer, wrong = circuits.pairs(*pairs, params)
    names = [f"blocks.{i}.{circuits.SITES[site]}" for i in range(hp["n_layer"])]
    sae = splice[1] if splice else None
    acts = [circuits.run_with_cache(ids, params, hp, names=names, sae=sae, hooks=hooks)[1]
            for ids in (clean, corrupted)]
    dlogits = circuits.logit_difference_grad(corrupted.shape, params["wte"].shape[0], answer, wrong)
    grads = circuits.gradients(corrupted, params, hp, dlogits, names, splice)
    n = max(4 * hp["n_embd"], an_sae["W_enc"].shape[1] if an_sae else 0)
    return 2 * n * 2.0 ** -24 * np.stack([((np.abs(acts[0][m]) + np.abs(acts[1][m])) *
                                           (np.abs(grads[m]) + through.get("sae", 0))).sum(-1).sum(0) for m in names])


def assert_within(ours, theirs, bound, what):
    worst = np.abs(np.asarray(ours) - theirs)
    assert (worst <= bound).all(), f"{what}: {worst.max():.3g} from TransformerLens's, {(worst / bound).max():.2f} " \
                                   "times float32's bound"


@pytest.mark.parametrize("setting", SETTINGS)
def test_with_an_sae_spliced_the_experiments_are_saelenss(models, golden_sae, setting):
    """The metric, a resid_pre sweep (the SAE's own hook point patched at its input, fast and plain), attribution
    at resid_pre (the gradient back through the SAE and, centred, the centring) and the components, against
    HookedSAETransformer and torch's autograd."""
    hp, params = models["ioi"]
    splice = a_splice(hp, golden_sae, *SETTINGS[setting])
    args = params, hp, *(SAE_GOLDEN[k] for k in ("clean", "corrupted", "answer", "wrong"))
    want = {k.split("/", 1)[1]: SAE_GOLDEN[k] for k in SAE_GOLDEN.files if k.startswith(setting + "/")}
    clean, corrupted = circuits.metrics(*args, splice=splice)
    assert_close([clean, corrupted], [want["metric_clean"], want["metric_corrupted"]], f"{setting} metric")
    for fast in (True, False):
        assert_close(circuits.patch(*args, "resid_pre", fast=fast, splice=splice), want["patch/resid_pre"],
                     f"{setting} patch (fast {fast})")
    assert_within(circuits.attribution(*args, "resid_pre", splice=splice), want["attribution/resid_pre"],
                  attribution_bound(params, hp, args[2:], "resid_pre", splice, golden_sae), f"{setting} attribution")
    if "dla/components" in want:
        labels, values = circuits.dla_components(params, hp, args[2], args[4], args[5], splice)
        assert labels[4] == "1_sae_error"
        assert_close(values, want["dla/components"], f"{setting} dla")
        assert_close(circuits.dla_latents(params, hp, args[2], args[4], args[5], golden_sae["W_dec"], splice),
                     want["dla/latents"], f"{setting} dla by latent")


@pytest.mark.parametrize("use_error_term", [False, True])
def test_the_latents_shares_and_b_decs_and_the_error_terms_are_the_saes_outputs(models, golden_sae, use_error_term):
    hp, params = models["ioi"]
    _, _, clean, _, answer, wrong = experiment(models, "ioi")
    splice = a_splice(hp, golden_sae, use_error_term=use_error_term)
    latents = circuits.dla_latents(params, hp, clean, answer, wrong, golden_sae["W_dec"], splice)
    site = "blocks.1.hook_resid_pre"
    cache, scale, direction = circuits.dla_run(params, hp, clean, answer, wrong, [f"{site}.hook_sae_output"] + (
        [f"{site}.hook_sae_error"] if use_error_term else []), splice)
    rest = circuits.dla_component(np.broadcast_to(golden_sae["b_dec"], direction.shape), scale, direction)
    if use_error_term:
        rest = rest + circuits.dla_component(cache[f"{site}.hook_sae_error"], scale, direction)
    whole = circuits.dla_component(cache[f"{site}.hook_sae_output"], scale, direction).mean()
    assert latents.sum() + rest.mean() == pytest.approx(whole, abs=1e-5)
    assert np.count_nonzero(latents) > 3
    with pytest.raises(UserError, match="this one is at blocks.0.mlp.hook_post"):
        circuits.dla_latents(params, hp, clean, answer, wrong, np.zeros((16, 32), np.float32),
                             a_splice(hp, random_sae("blocks.0.mlp.hook_post", 32)))


SAE_SITES = ["blocks.1.hook_resid_pre", "blocks.0.hook_attn_out", "blocks.0.mlp.hook_post", "hook_embed",
             "blocks.1.hook_resid_post", "ln_final.hook_normalized"]


@pytest.mark.parametrize("site, centred, error", [(site, i % 2 == 0, i % 3 == 0) for i, site in enumerate(SAE_SITES)])
def test_with_an_sae_spliced_anywhere_the_fast_sweeps_are_the_plain_ones(models, site, centred, error):
    """run_patched_fast runs the SAE (and the centring) in its copies: each sweep and each path as run_patched."""
    hp, params = models["ioi"]
    an_sae = random_sae(site, 32 if "mlp" in site else 8)
    args = experiment(models, "ioi")
    splice = a_splice(hp, an_sae, centred, error)
    for sweep in ("resid_pre", "mlp_out", "v"):
        fast, plain = (circuits.patch(*args, sweep, fast=f, splice=splice) for f in (True, False))
        assert_close(fast, plain, f"{site} {sweep}")
    fast, plain = (circuits.path_patch(*args, (0, 1), "q", fast=f, splice=splice) for f in (True, False))
    assert_close(fast, plain, f"{site} path")
    assert np.abs(circuits.patch(*args, "resid_pre", splice=a_splice(hp, an_sae)) -
                  circuits.patch(*args, "resid_pre")).max() > 1e-3  # the SAE changed the numbers


@pytest.mark.parametrize("site, label", [("blocks.1.hook_resid_pre", ("0_mlp_out", "1_sae_error")),
                                         ("blocks.0.hook_attn_out", ("0_attn_out", "0_sae_error")),
                                         ("blocks.1.hook_resid_post", ("1_mlp_out", "1_sae_error")),
                                         ("hook_embed", ("embed", "sae_error")),
                                         ("blocks.0.mlp.hook_post", None)])
def test_with_an_sae_spliced_the_components_still_add_up_to_what_ln_f_reads(models, site, label):
    """What the SAE changed, x̂ - x, is a component of its own where it is written into the residual stream
    (its place: after `label`'s first); an SAE inside a branch changes that branch's output, which holds it."""
    hp, params = models["ioi"]
    _, _, clean, _, answer, wrong = experiment(models, "ioi")
    splice = a_splice(hp, random_sae(site, 32 if "mlp" in site else 8))
    written, final, _, _ = circuits.dla_written(params, hp, clean, answer, wrong, splice)
    close = np.abs(sum(written.values()) - final).max()
    assert close <= 1e-5 * np.abs(final).max(), close
    labels, values = circuits.dla_components(params, hp, clean, answer, wrong, splice)
    if label:
        assert labels[labels.index(label[0]) + 1] == label[1] and abs(values[labels.index(label[1])]) > 1e-3
    else:
        assert len(labels) == 2 + 2 * hp["n_layer"]
    bias = (params["ln_f"]["b"] * (params["wte"][answer] - params["wte"][wrong])).sum(-1).mean()
    assert values.sum() + bias == pytest.approx(circuits.metric(params, hp, clean, answer, wrong, splice), abs=1e-5)


def test_with_an_sae_and_the_centring_every_gradient_by_finite_differences(models):
    """The backward's mirror of the spliced forward: at an SAE on blocks.0.hook_attn_out (after the centring at the
    same name) and upstream of it, against the metric moved by a nudge (float32: a step of 1e-3)."""
    hp, params = models["ioi"]
    _, _, clean, _, answer, wrong = experiment(models, "ioi")
    an_sae = random_sae("blocks.0.hook_attn_out", 8, seed=2)
    splice = a_splice(hp, an_sae, centred=True)
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_attn_out", "blocks.0.ln1.hook_normalized"]
    dlogits = circuits.logit_difference_grad(clean.shape, params["wte"].shape[0], answer, wrong)
    grads = circuits.gradients(clean, params, hp, dlogits, names, splice)
    hooks, spliced = circuits.spliced(splice)
    rng = np.random.default_rng(0)

    def moved(name, i, step):
        def nudge(x, _):
            x = x.copy()
            x[i] += step
            return x

        nudged, sae = circuits.spliced(splice, {circuits.hooked_name(name, splice): nudge})
        return circuits.logit_difference(li.run_with_hooks(clean, params, hp, nudged, sae=sae), answer, wrong)

    for name in names:
        d = grads[name]
        for i in [tuple(rng.integers(0, n) for n in d.shape[:-1]) + (j,) for j in range(3)] + [
                np.unravel_index(np.abs(d).argmax(), d.shape)]:
            numeric = (moved(name, i, 1e-3) - moved(name, i, -1e-3)) / 2e-3
            assert abs(d[i] - numeric) <= 2e-3 * max(1.0, abs(numeric)), (name, i, d[i], numeric)
    assert np.abs(grads["blocks.0.hook_attn_out"].mean(-1)).max() > 1e-3  # the SAE's: the centring's backward counts


def sae_cli(capsys, *argv):
    return cli_json(capsys, *argv, "--sae", SAE_DIR)


def test_every_command_takes_an_sae_spliced_in(models, golden_sae, capsys, tmp_path):
    params, hp, clean, corrupted, answer, wrong = experiment(models, "ioi")
    clean, corrupted, answer, wrong = clean[:1], corrupted[:1], answer[:1], wrong[:1]
    splice = a_splice(hp, golden_sae, centred=True, use_error_term=True)
    out = sae_cli(capsys, "patch", *IOI, "--site", "resid_mid", "--use-error-term", "--center-writing-weights")
    assert (out["sae"], out["use_error_term"], out["center_writing_weights"]) == ("blocks.1.hook_resid_pre", True, True)
    np.testing.assert_allclose(out["values"], circuits.patch(params, hp, clean, corrupted, answer, wrong, "resid_mid",
                                                             splice=splice))
    splice = a_splice(hp, golden_sae)
    assert sae_cli(capsys, "logit-diff", *CLEAN_ONLY)["values"] == pytest.approx(
        circuits.metric(params, hp, clean, answer, wrong, splice))
    out = sae_cli(capsys, "dla", *CLEAN_ONLY)
    assert "1_sae_error" in out["labels"] and out["total"] == pytest.approx(sum(out["values"]))
    np.testing.assert_allclose(out["values"], circuits.dla_components(params, hp, clean, answer, wrong, splice)[1])
    np.testing.assert_allclose(sae_cli(capsys, "dla", *CLEAN_ONLY, "--by", "head")["values"],
                               circuits.dla_heads(params, hp, clean, answer, wrong, splice)[1])
    out = sae_cli(capsys, "dla", *CLEAN_ONLY, "--by", "latent")
    latents = circuits.dla_latents(params, hp, clean, answer, wrong, golden_sae["W_dec"], splice)
    np.testing.assert_allclose(out["values"], latents)
    assert out["top"][:3] == np.argsort(-np.abs(latents))[:3].tolist() and len(out["top"]) == 20
    np.testing.assert_allclose(sae_cli(capsys, "attribution", *IOI, "--site", "head")["values"],
                               circuits.attribution(params, hp, clean, corrupted, answer, wrong, "head", splice))
    np.testing.assert_allclose(sae_cli(capsys, "path", *IOI, "--source", "0.0")["values"][1:],
                               circuits.path_patch(params, hp, clean, corrupted, answer, wrong, (0, 0), "q",
                                                   splice=splice)[1:])
    ids = circuits.repeated_random_tokens(6, 50257, 50256, seed=0)
    heads = sae_cli(capsys, "heads", "--text", "random:6", "--pattern", "induction")["values"]
    np.testing.assert_allclose(heads, circuits.head_scores(params, hp, ids, "induction", splice))
    assert np.abs(np.array(heads)[1] - circuits.head_scores(params, hp, ids, "induction")[1]).max() > 1e-4  # later
    np.testing.assert_allclose(np.array(heads)[0], circuits.head_scores(params, hp, ids, "induction")[0])  # earlier
    code, out, _ = cli(capsys, "dla", *CLEAN_ONLY, "--model", TINY, "--sae", SAE_DIR)
    assert code == 0 and out.startswith(f"with the SAE {SAE_DIR} at blocks.1.hook_resid_pre\n") and "1_sae_error" in out
    code, _, _ = cli(capsys, "heads", "--text", "a b a b", "--pattern", "previous", "--model", TINY, "--sae", SAE_DIR,
                     "--center-writing-weights", "--html", str(tmp_path / "p.html"))
    assert code == 0 and f"heads on tiny, with the SAE {SAE_DIR} at blocks.1.hook_resid_pre and the writing weights " \
                         "centred" in (tmp_path / "p.html").read_text()


def test_an_sae_that_cannot_be_spliced_is_one_line_and_exit_2(capsys, tmp_path):
    from plumbing import sae_files

    sae_files.save_sae(str(tmp_path / "final"), random_sae("ln_final.hook_normalized", 8))
    page = tmp_path / "page.html"
    for argv, message in (
            (["logit-diff", *CLEAN_ONLY, "--use-error-term"], "error: --use-error-term goes with --sae"),
            (["dla", *CLEAN_ONLY, "--by", "latent"], "error: --by latent goes with --sae"),
            (["patch", *IOI, "--sae", SAE_DIR, "--model", os.path.join(DATA, "circuits_model")],
             "the SAE reads 8 numbers a token but blocks.1.hook_resid_pre has 32"),
            (["dla", *CLEAN_ONLY, "--sae", str(tmp_path / "final")], "an SAE at ln_final.hook_normalized changes the "
                                                                    "logits after ln_f"),
            (["heads", "--text", "x", "--pattern", "previous", "--sae", str(tmp_path / "nothing")], "no such folder")):
        code, out, err = cli(capsys, *argv, *([] if "--model" in argv else ["--model", TINY]), "--html", str(page))
        assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
        assert not page.exists()


def test_logit_diff_and_dla_take_corrupted_and_show_its_run_beside_the_clean_one(models, capsys):
    """docs/circuits.md's shared P=(...) flags work for logit-diff and dla too: the corrupted run's metric beside
    the clean one, and dla's shares for both runs."""
    params, hp, clean, corrupted, answer, wrong = experiment(models, "ioi")
    clean, corrupted, answer, wrong = clean[:1], corrupted[:1], answer[:1], wrong[:1]
    want = circuits.metrics(params, hp, clean, corrupted, answer, wrong)
    out = cli_json(capsys, "logit-diff", *IOI)
    assert (out["clean"], out["corrupted"]) == pytest.approx(want) and out["values"] == pytest.approx(want[0])
    out = cli_json(capsys, "dla", *IOI)
    assert (out["clean"], out["corrupted"]) == pytest.approx(want)
    np.testing.assert_allclose(out["values"], circuits.dla_components(params, hp, clean, answer, wrong)[1])
    np.testing.assert_allclose(out["corrupted_values"], circuits.dla_components(params, hp, corrupted, answer, wrong)[1])
    assert cli_json(capsys, "dla", *IOI, "--by", "head")["corrupted"] == pytest.approx(want[1])
    code, text, _ = cli(capsys, "logit-diff", *IOI, "--model", TINY)
    assert code == 0 and "corrupted" in text
