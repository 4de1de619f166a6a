"""steer.py on tests/data/hf/tiny: ActAdd as the paper's code computes it in TransformerLens 4.3.0, steering vectors
as steering-vectors 0.12.2 trains and applies them, an SAE latent added at its hook point (the goldens:
tests/data/make_steer_golden.py, make_steer_vectors_golden.py); with and without the KV cache; every bad input
one line, exit 2, nothing written."""
import json
import os

import numpy as np
import pytest
from conftest import DATA, in_process

import gpt2_numpy as g
import look_inside
import steer as S
from interface import loading, steer_cli
from plumbing import sae_files
from plumbing.errors import UserError

MODEL = os.path.join(DATA, "hf", "tiny")
SAE_DIR = os.path.join(DATA, "sae_golden", "sae")
ACT_ADD = np.load(os.path.join(DATA, "steer_golden.npz"))
VECTORS = np.load(os.path.join(DATA, "steer_vectors_golden.npz"))
ACT_ADD_CASES = ("love_hate_0", "love_hate_1", "padded")
LATENT_CASES = ("latent_3", "latent_17")
VECTOR_CASES = ("mean_both", "mean_from_3", "pca_1")
N_NEW = 16


@pytest.fixture(scope="module")
def tiny():
    return loading.load_model(MODEL, quiet=True)


def assert_close(ours, theirs, what):
    """Within 1e-5 of the golden's largest value."""
    err = np.abs(np.asarray(ours) - theirs).max() / np.abs(theirs).max()
    assert err < 1e-5, f"{what}: {err:.2e} of the largest value"


def assert_logits(ours, gold, case):
    """[T, V] against the golden's columns, and every row's log-sum-exp over the whole vocabulary."""
    assert_close(ours[:, gold[f"{case}/cols"]], gold[f"{case}/logits"], f"{case}: the steered logits")
    lse = np.log(np.exp(ours - ours.max(-1, keepdims=True)).sum(-1)) + ours.max(-1)
    assert_close(lse, gold[f"{case}/logsumexp"], f"{case}: the logits' log-sum-exp")


def generated(prompt, tiny, make_hooks, kv_cache):
    encoder, hparams, params = tiny
    return [int(t[0]) for t in S.generate_steered(list(prompt), params, hparams, make_hooks, N_NEW, 0.0,
                                                  stop=encoder.eot, kv_cache=kv_cache)]


def pairs_of(case):
    lengths = VECTORS[f"{case}/pairs_lengths"]
    ends = np.cumsum(lengths, axis=0)
    return [(VECTORS[f"{case}/pairs_positive"][e[0] - n[0]:e[0]].tolist(),
             VECTORS[f"{case}/pairs_negative"][e[1] - n[1]:e[1]].tolist()) for e, n in zip(ends, lengths)]


# --- ActAdd -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ACT_ADD_CASES)
def test_act_add_is_the_papers_vector_logits_and_greedy_ids(tiny, case):
    _, hparams, params = tiny
    gold = lambda k: ACT_ADD[f"{case}/{k}"]  # noqa: E731
    layer = int(gold("layer"))
    v = S.act_add_vector(params, hparams, gold("add").tolist(), gold("sub").tolist(), layer, float(gold("coeff")))
    assert v.shape == gold("vector").shape and v.dtype == np.float32
    assert_close(v, gold("vector"), f"{case}: the vector")
    for kv_cache in (True, False):
        assert generated(gold("prompt"), tiny, lambda: S.act_add_hooks(v, layer), kv_cache) == gold("ids").tolist()
    ids = gold("prompt").tolist() + gold("ids").tolist()
    assert_logits(S.steered_logits(ids, params, hparams, S.act_add_hooks(v, layer)), ACT_ADD, case)


def test_act_add_hook_adds_to_the_front_and_leaves_a_one_position_pass():
    vector = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = np.ones((2, 4, 3), np.float32)
    out = S.act_add(x, vector)
    np.testing.assert_array_equal(out[:, :2], 1 + vector[None].repeat(2, 0))
    np.testing.assert_array_equal(out[:, 2:], 1)
    np.testing.assert_array_equal(x, 1)  # the activation the model made is not written over
    step = np.ones((2, 1, 3), np.float32)
    np.testing.assert_array_equal(S.act_add(step, vector), step)  # a KV-cached step: past the front
    with pytest.raises(UserError):  # in the student's words: exercise 48 states the type, not the message
        S.act_add(np.ones((1, 2, 3), np.float32), np.zeros((3, 3), np.float32))


def test_the_shorter_steering_prompt_is_padded_with_spaces_on_the_right(tiny):
    encoder, hparams, params = tiny
    add, sub = [encoder.eot, 40], [encoder.eot, 40, 1842, 345]
    name = "blocks.1.hook_resid_pre"
    padded = S.activations(add + [S.SPACE, S.SPACE], params, hparams, [name])[name]
    plain = S.activations(sub, params, hparams, [name])[name]
    np.testing.assert_allclose(S.act_add_vector(params, hparams, add, sub, 1, 2.0), 2 * (padded - plain), atol=1e-6)


# --- steering vectors from contrastive pairs -----------------------------------------------------

@pytest.mark.parametrize("case", VECTOR_CASES)
def test_steering_vectors_are_the_packages_vectors_logits_and_greedy_ids(tiny, case):
    _, hparams, params = tiny
    gold = lambda k: VECTORS[f"{case}/{k}"]  # noqa: E731
    layers = gold("layers").tolist()
    vectors = S.train_vector(params, hparams, pairs_of(case), layers, str(gold("aggregator")),
                             int(gold("read_token_index")))
    assert list(vectors) == layers
    assert_close(np.stack([vectors[layer] for layer in layers]), gold("vectors"), f"{case}: the vectors")
    m, k = float(gold("multiplier")), int(gold("min_token_index"))
    for kv_cache in (True, False):  # counted from the text's start in both: the package's use_cache=False ids
        assert generated(gold("prompt"), tiny, lambda: S.vector_hooks(vectors, m, k), kv_cache) == gold("ids").tolist()
    ids = gold("prompt").tolist() + gold("ids").tolist()
    assert_logits(S.steered_logits(ids, params, hparams, S.vector_hooks(vectors, m, k)), VECTORS, case)


def test_the_package_under_its_kv_cache_stops_steering_after_the_first_token_where_k_is_above_0():
    """What docs/steering.md says of steering-vectors under a KV cache, in its own numbers."""
    for case in VECTOR_CASES:
        same = VECTORS[f"{case}/ids_package_cached"].tolist() == VECTORS[f"{case}/ids"].tolist()
        assert same == (int(VECTORS[f"{case}/min_token_index"]) == 0), case


def test_pca_is_the_unit_top_direction_turned_toward_the_differences():
    deltas = np.array([[3, 1], [2, 0.5], [-0.5, 0.2]], np.float32)
    v = S.pca_direction(deltas)
    assert abs(np.linalg.norm(v) - 1) < 1e-6 and (deltas @ v).mean() > 0
    np.testing.assert_allclose(np.abs(v), np.abs(np.linalg.eigh(deltas.T @ deltas)[1][:, -1]), atol=1e-6)
    np.testing.assert_allclose(S.pca_direction(-deltas), -v, atol=1e-6)


def test_vector_hooks_count_positions_across_cached_passes():
    hooks = S.vector_hooks({0: np.ones(2, np.float32)}, multiplier=3.0, min_token_index=2)
    hook = hooks["blocks.0.hook_resid_post"]
    first = hook(np.zeros((1, 3, 2), np.float32), "blocks.0.hook_resid_post")  # positions 0, 1, 2
    np.testing.assert_array_equal(first[0, :, 0], [0, 0, 3])
    np.testing.assert_array_equal(hook(np.zeros((1, 1, 2), np.float32), "x")[0, :, 0], [3])  # position 3
    fresh = S.vector_hooks({0: np.ones(2, np.float32)}, 3.0, 2)["blocks.0.hook_resid_post"]
    np.testing.assert_array_equal(fresh(np.zeros((1, 1, 2), np.float32), "x")[0, :, 0], [0])  # a new text: 0


# --- an SAE latent ------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", LATENT_CASES)
def test_an_sae_latent_is_alpha_w_dec_at_its_hook_point(tiny, case):
    _, hparams, params = tiny
    sae = sae_files.load_sae(SAE_DIR)
    v = S.latent_vector(sae, int(ACT_ADD[f"{case}/latent"]), float(ACT_ADD[f"{case}/alpha"]))
    assert_close(v, ACT_ADD[f"{case}/vector"], f"{case}: the vector")
    site = sae["cfg"]["metadata"]["hook_name"]
    for kv_cache in (True, False):
        assert generated(ACT_ADD[f"{case}/prompt"], tiny, lambda: S.add_everywhere_hooks(v, site), kv_cache) == \
            ACT_ADD[f"{case}/ids"].tolist()
    ids = ACT_ADD[f"{case}/prompt"].tolist() + ACT_ADD[f"{case}/ids"].tolist()
    assert_logits(S.steered_logits(ids, params, hparams, S.add_everywhere_hooks(v, site)), ACT_ADD, case)


# --- every reading steered, from Python ----------------------------------------------------------------

def test_a_reading_is_steered_through_look_insides_hooks(tiny):
    """run_with_hooks (what --score and --top read) and run_with_cache (the logit lens) take the same hooks."""
    _, hparams, params = tiny
    case = "love_hate_1"
    ids = ACT_ADD[f"{case}/prompt"].tolist() + ACT_ADD[f"{case}/ids"].tolist()
    v = S.act_add_vector(params, hparams, ACT_ADD[f"{case}/add"].tolist(), ACT_ADD[f"{case}/sub"].tolist(), 1,
                         float(ACT_ADD[f"{case}/coeff"]))
    logits = look_inside.run_with_hooks([ids], params, hparams, S.act_add_hooks(v, 1))[0]
    assert_logits(logits, ACT_ADD, case)
    run = look_inside.run_with_cache([ids], params, hparams, names=look_inside.lens_activations(hparams["n_layer"]),
                                     hooks=S.act_add_hooks(v, 1))
    lens = look_inside.logit_lens([ids], params, hparams, run=run)
    np.testing.assert_array_equal(lens["top"][-1, 0], logits.argmax(-1))
    plain = g.gpt2(np.array(ids), params, hparams)
    assert not np.array_equal(plain.argmax(-1), logits.argmax(-1))


# --- the command line ------------------------------------------------------------------------------------

def cli(capsys, *args):
    return in_process(steer_cli.main, capsys, *args, "--model", MODEL, "--quiet")


def test_add_json_and_logits_are_the_papers(capsys, tmp_path):
    case = "love_hate_1"
    r = cli(capsys, "add", "I hate you because", "--add", "Love", "--sub", "Hate", "--layer", "1", "--coeff", "10",
            "--greedy", "--n-tokens", N_NEW, "--json", "--logits", tmp_path / "l.npy")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_ids"] == ACT_ADD[f"{case}/prompt"].tolist() and out["ids"] == ACT_ADD[f"{case}/ids"].tolist()
    assert_close(out["vector"], ACT_ADD[f"{case}/vector"], "--json's vector")
    logits = np.load(tmp_path / "l.npy")
    assert logits.dtype == np.float32 and logits.shape == (len(out["prompt_ids"]) + N_NEW, 50257)
    assert_logits(logits, ACT_ADD, case)


def test_vector_with_pairs_from_a_file_and_no_kv_cache(capsys, tmp_path):
    case = "mean_from_3"
    encoder = loading.load_model(MODEL, quiet=True)[0]
    texts = [(encoder.decode(p), encoder.decode(n)) for p, n in pairs_of(case)]  # the golden's texts
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps({"positive": p, "negative": n}) + "\n"
                                                  for p, n in texts[1:]))
    r = cli(capsys, "vector", encoder.decode(VECTORS[f"{case}/prompt"].tolist()), "--positive", texts[0][0],
            "--negative", texts[0][1], "--pairs", tmp_path / "pairs.jsonl", "--layer", "1", "--read-token-index", "-2",
            "--multiplier", "8", "--min-token-index", "3", "--greedy", "--n-tokens", N_NEW, "--json", "--no-kv-cache")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_ids"] == VECTORS[f"{case}/prompt"].tolist() and out["ids"] == VECTORS[f"{case}/ids"].tolist()
    assert_close(out["vectors"]["1"], VECTORS[f"{case}/vectors"][0], "--json's vector")


def test_latent_prints_the_steered_text_beside_the_unsteered(capsys):
    r = cli(capsys, "latent", "The weather today is", "--sae", SAE_DIR, "--latent", "3", "--alpha", "40", "--greedy",
            "--n-tokens", "4")
    assert r.returncode == 0, r.stderr
    steered, plain = r.stdout.split("\n\n")
    assert steered.startswith("++ steered: latent 3 at blocks.1.hook_resid_pre, alpha 40\nThe weather today is")
    assert plain.startswith("-- unsteered\nThe weather today is") and steered.split("\n")[1] != plain.split("\n")[1]


ADD = ["add", "I hate you because", "--add", "Love", "--sub", "Hate"]
VEC = ["vector", "I think", "--positive", "I love it", "--negative", "I hate it"]
LAT = ["latent", "The weather", "--sae", SAE_DIR]


@pytest.mark.parametrize("args, said", [
    (ADD + ["--layer", "2", "--coeff", "1"], "--layer must be a layer of the model, 0 to 1, got 2"),
    (VEC + ["--layer", "-1"], "--layer must be a layer of the model, 0 to 1, got -1"),
    (VEC + ["--positive", "x", "--layer", "0"], "2 --positives and 1 --negative: give them in pairs"),
    (ADD + ["--layer", "0", "--coeff", "nan"], "--coeff must be a finite number in float32, got nan"),
    (ADD + ["--layer", "0", "--coeff", "1e39"], "--coeff must be a finite number in float32, got 1e+39"),
    (VEC + ["--layer", "0", "--multiplier", "inf"], "--multiplier must be a finite number in float32, got inf"),
    (LAT + ["--latent", "0", "--alpha", "x"], "--alpha must be a number, got 'x'"),
    (LAT + ["--latent", "32", "--alpha", "1"], "--latent must be one of the SAE's latents, 0 to 31, got 32"),
    (["add", "", "--add", "Love and peace to all", "--sub", "Hate", "--layer", "0", "--coeff", "1"],
     "the prompt has 1 token with <|endoftext|>, fewer than the steering prompts' 6"),
    (VEC + ["--layer", "0", "--aggregator", "median"], "--aggregator must be mean or pca, got 'median'"),
    (VEC + ["--layer", "0", "--read-token-index", "3"], "--read-token-index 3 is outside a text of 3 tokens"),
    (VEC + ["--layer", "0", "--read-token-index", "-4"], "--read-token-index -4 is outside a text of 3 tokens"),
    (ADD + ["--layer", "0", "--coeff", "1", "--threads", "0"], "--threads must be at least 1, got 0"),
    (ADD + ["--layer", "1", "--coeff", "1e20"], "--coeff 1e+20 overflows float32: the steering vector would be"),
    (VEC + ["--layer", "0", "--multiplier=-1e38"], "--multiplier -1e+38 overflows float32"),
    (LAT + ["--latent", "0", "--alpha", "1e30"], "--alpha 1e+30 overflows float32"),
    (ADD + ["--layer", "0", "--coeff", "1", "--greedy", "--temperature", "0.5"], "--greedy is --temperature 0"),
    (ADD + ["--layer", "0", "--coeff", "1", "--top-p", "2"], "--top-p must be in (0, 1]"),
])
def test_bad_input_is_one_line_and_exit_2_and_nothing_written(capsys, tmp_path, args, said):
    r = cli(capsys, *args, "--logits", tmp_path / "l.npy")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


def test_an_sae_for_another_width_or_a_hook_the_model_lacks_is_refused(capsys, tmp_path):
    sae = sae_files.load_sae(SAE_DIR)
    wide = {k: np.zeros((v.shape[0], 16) if k == "W_dec" else (16, v.shape[1]) if k == "W_enc" else
                        (16,) if k == "b_dec" else v.shape, np.float32) for k, v in sae.items() if k != "cfg"}
    sae_files.save_sae(str(tmp_path / "wide"), {**wide, "cfg": {**sae["cfg"], "d_in": 16}})
    metadata = {**sae["cfg"]["metadata"], "hook_name": "blocks.5.hook_resid_pre"}
    nowhere = {**sae, "cfg": {**sae["cfg"], "metadata": metadata}}
    sae_files.save_sae(str(tmp_path / "nowhere"), nowhere)
    for folder, said in (("wide", "the SAE reads 16 numbers a token but blocks.1.hook_resid_pre has 8"),
                         ("nowhere", "no activation is called 'blocks.5.hook_resid_pre'")):
        r = cli(capsys, "latent", "The weather", "--sae", tmp_path / folder, "--latent", "0", "--alpha", "1",
                "--logits", tmp_path / "l.npy")
        assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert not (tmp_path / "l.npy").exists()


def test_a_pairs_file_with_a_bad_line_or_an_empty_text_is_refused(capsys, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    for lines, said in ((['{"positive": "a b"}'], 'line 1 must be {"positive": TEXT, "negative": TEXT}'),
                        (['{"positive": "a", "negative": "b"}', "nope"], "line 2 is not JSON"),
                        (['{"positive": "", "negative": "b"}'], "a pair's text is empty")):
        pairs.write_text("\n".join(lines) + "\n")
        r = cli(capsys, "vector", "I think", "--pairs", pairs, "--layer", "0", "--logits", tmp_path / "l.npy")
        assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert sorted(os.listdir(tmp_path)) == ["pairs.jsonl"]


def test_a_strength_just_under_the_overflow_steers_and_one_that_overflows_inside_the_model_is_refused(tiny, capsys):
    """check_overflow's bound is the strongest that runs (its logits finite, not the nan read as token 0); a
    steering that overflows further on (here ×1e30 before attention's scores) is refused by its logits."""
    encoder, hparams, params = tiny
    sae = sae_files.load_sae(SAE_DIR)
    bound = S.LONGEST / float(np.linalg.norm(sae["W_dec"][0].astype(np.float64)))
    with pytest.raises(UserError, match="overflows float32"):
        S.latent_vector(sae, 0, bound * 1.01)
    v = S.latent_vector(sae, 0, bound * 0.99)
    hooks = S.add_everywhere_hooks(v, "blocks.1.hook_resid_pre")
    logits = S.steered_logits([encoder.eot, 40, 892], params, hparams, hooks)
    assert np.isfinite(logits).all()
    huge = lambda: {"blocks.0.ln1.hook_normalized": lambda x, name: x * np.float32(1e30)}  # noqa: E731
    for kv_cache in (True, False):
        with np.errstate(over="ignore", invalid="ignore"), pytest.raises(UserError, match="logits are not finite"):
            generated([encoder.eot, 40], tiny, huge, kv_cache)
