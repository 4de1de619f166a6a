"""gpt2_numpy.py: the whole model against Hugging Face's GPT2LMHeadModel (tests/data/hf_golden.npz),
stage by stage and at the logits, then generation and scoring. (The building blocks: test_blocks.py.)"""
import math
import os

import numpy as np
import pytest

from conftest import DATA, ROOT, checkpoint_dir, rand
import gpt2_numpy as g
import look_inside
from plumbing import shapes
from plumbing.checkpoint import load_checkpoint

GOLDEN = np.load(os.path.join(DATA, "hf_golden.npz"))
CASES = {"tiny_turing": "tiny", "tiny_batch": "tiny", "odd_full_context": "odd", "odd_prompt": "odd",
         "odd_batch": "odd"}


@pytest.fixture(scope="module")
def models():
    return {name: load_checkpoint(checkpoint_dir(name)) for name in ("tiny", "odd")}


# --- the model against Hugging Face -------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_every_stage_matches_hugging_face(models, case):
    """A wrong block fails here at the first stage where it goes wrong, not only at the logits.
    Each block gets HF's own input (its hidden state), so errors do not pile up from block to block."""
    hp, params = models[CASES[case]]
    ids, hidden, attentions = GOLDEN[f"{case}/ids"], GOLDEN[f"{case}/hidden"], GOLDEN[f"{case}/attentions"]

    def same(label, ours, theirs, bound):
        assert ours.shape == theirs.shape, f"first differs at {label}: shape {ours.shape}, HF's {theirs.shape}"
        worst = float(np.abs(ours - theirs).max())
        assert worst <= bound, f"first differs at {label}: max difference {worst:.3g} (bound {bound:g})"

    same("the embeddings (wte[ids] + wpe)", params["wte"][ids] + params["wpe"][:ids.shape[1]], hidden[0], 1e-6)
    L = hp["n_layer"]
    for i, block in enumerate(params["blocks"]):
        seen = {}
        out = g.transformer_block(hidden[i], **block, hparams=hp,
                                  hook=lambda name, x: seen.setdefault(name, x))
        assert out is not None, "transformer_block returned None: did you forget `return`?"
        assert "attn.weights" in seen, (f"h{i}: no 'attn.weights' came through the hook: transformer_block must pass "
                                        "hook on to mha (mha(..., hook=hook)), as its docstring says")
        same(f"h{i} attention weights", seen["attn.weights"], attentions[i], 1e-6)
        if i < L - 1:
            same(f"h{i} output", out, hidden[i + 1], 1e-5)
    same(f"h{L - 1} output, after ln_f", g.layer_norm(out, **params["ln_f"]), hidden[L], 1e-5)


BLOCK_HOOKS = {"transformer_block": ["resid_pre", "ln_1", "resid_mid", "ln_2", "resid_post"],
               "mha": ["attn.q", "attn.k", "attn.v", "attn.scores", "attn.weights", "attn.z", "attn.out"],
               "ffn": ["mlp.c_fc", "mlp.gelu", "mlp.out"]}
BLOCK_ORDER = ["resid_pre", "ln_1", *BLOCK_HOOKS["mha"], "resid_mid", "ln_2", *BLOCK_HOOKS["ffn"], "resid_post"]


def test_the_block_passes_each_activation_through_its_hook(models):
    """--trace, run_with_cache and training see a block only through its hook: a block with the right
    maths that skips a hook call shows no rows for it in --trace, and stops training with a KeyError."""
    hp, params = models["tiny"]
    seen = []
    out = g.transformer_block(rand(1, 3, hp["n_embd"], seed=50), **params["blocks"][0], hparams=hp,
                              hook=lambda name, x: seen.append(name) or x)
    assert out is not None, "transformer_block returned None: did you forget `return`?"
    missing = {f: [n for n in names if n not in seen] for f, names in BLOCK_HOOKS.items()}
    assert not missing["transformer_block"], (
        f"transformer_block never called hook on {missing['transformer_block']}: "
        "write x = hook(\"resid_pre\", x), hook(\"ln_1\", layer_norm(...)), and so on, as its docstring says")
    for f in ("mha", "ffn"):
        assert not missing[f], f"no {missing[f]} came through the hook: transformer_block must pass hook on to {f}"
    assert seen == BLOCK_ORDER, f"the hook saw {seen}, not once each in the order the data flows: {BLOCK_ORDER}"


@pytest.mark.parametrize("case", CASES)
def test_logits_match_hugging_face(models, case):
    hp, params = models[CASES[case]]
    logits = g.gpt2(GOLDEN[f"{case}/ids"], params, hp)
    assert logits.dtype == np.float32
    assert np.abs(logits[:, :, GOLDEN[f"{case}/cols"]] - GOLDEN[f"{case}/logits_cols"]).max() <= 1e-4
    assert np.abs(logits[:, -1] - GOLDEN[f"{case}/last_logits"]).max() <= 1e-4


@pytest.mark.parametrize("case", CASES)
def test_scores_match_hugging_face(models, case):
    hp, params = models[CASES[case]]
    for row, logprobs, loss in zip(GOLDEN[f"{case}/ids"], GOLDEN[f"{case}/logprobs"], GOLDEN[f"{case}/loss"]):
        ours, our_loss, perplexity = g.score(row, params, hp)
        assert np.abs(ours - logprobs).max() <= 1e-4
        assert abs(our_loss - loss) <= 1e-5
        assert perplexity == pytest.approx(math.exp(loss), rel=1e-5)


@pytest.mark.parametrize("case", [c for c in CASES if f"{c}/greedy" in GOLDEN.files])
def test_greedy_continuation_matches_hugging_face(models, case):
    hp, params = models[CASES[case]]
    assert GOLDEN[f"{case}/min_margin"] > 0.005  # the golden path is not decided by rounding
    for row, want in zip(GOLDEN[f"{case}/ids"], GOLDEN[f"{case}/greedy"]):
        got = np.concatenate(list(g.generate(row.tolist(), params, hp, 20, temperature=0, stop=None)))
        assert got.tolist() == want.tolist()


def test_a_1d_input_gives_2d_logits(models):
    hp, params = models["odd"]
    ids = GOLDEN["odd_batch/ids"]
    one = g.gpt2(ids[1], params, hp)
    assert one.shape == (ids.shape[1], hp["n_vocab"])
    np.testing.assert_array_equal(one, g.gpt2(ids, params, hp)[1])


def test_last_only_gives_the_last_position(models):
    hp, params = models["tiny"]
    ids = GOLDEN["tiny_batch/ids"]
    last = g.gpt2(ids, params, hp, last_only=True)
    assert last.shape == (2, 1, 50257)
    np.testing.assert_allclose(last[:, 0], g.gpt2(ids, params, hp)[:, -1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["tiny", "odd"])
def test_kv_cache_gives_the_logits_of_full_recomputation_at_every_step(models, name):
    hp, params = models[name]
    ids = np.random.default_rng(3).integers(0, hp["n_vocab"], 20)
    cache = g.new_kv_cache(hp, 1, 20)
    steps = [g.gpt2(ids[:5], params, hp, cache)]  # a 5-token prompt, then one token at a time
    steps += [g.gpt2(ids[t:t + 1], params, hp, cache) for t in range(5, 20)]
    incremental = np.concatenate(steps)
    full = g.gpt2(ids, params, hp)
    worst = np.abs(incremental - full).max(axis=-1)  # [20]
    assert worst.max() <= 1e-5, (
        f"with the KV cache, the logits first differ from a full recomputation at position {np.argmax(worst > 1e-5)} "
        f"(max difference {worst.max():.3g}): does kv_append keep the earlier keys and values, and count them?")
    assert cache[0]["n"] == 20


@pytest.mark.parametrize("ids, error, message", [
    ([1, 50257], ValueError, "50257 is outside"),
    ([[3, -1]], ValueError, "-1 is outside"),
    ([1.0, 2.0], TypeError, "integers"),
    (list(range(65)), ValueError, "65 positions do not fit"),
])
def test_bad_ids_are_clear_errors(models, ids, error, message):
    hp, params = models["tiny"]
    with pytest.raises(error, match=message):
        g.gpt2(ids, params, hp)


def test_no_float64_anywhere_in_a_forward_pass(models):
    hp, params = models["tiny"]
    for name, a in look_inside.trace([1, 2, 3], params, hp):
        assert a.dtype in (np.float32, np.int64), name


# --- generation ---------------------------------------------------------------------------

def test_top_k_keeps_the_k_largest():
    logits = rand(3, 50, seed=30)
    kept = g.top_k_filter(logits, 5)
    for row, krow in zip(logits, kept):
        top = set(np.argsort(row)[-5:])
        assert {i for i in range(50) if np.isfinite(krow[i])} == top
        assert np.all(krow[list(top)] == row[list(top)])


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([[0.05, 0.5, 0.15, 0.3]], np.float32))
    assert np.isfinite(g.top_p_filter(logits, 0.8)).tolist() == [[False, True, False, True]]
    assert np.isfinite(g.top_p_filter(logits, 0.81)).tolist() == [[False, True, True, True]]
    assert np.isfinite(g.top_p_filter(logits, 0.01)).tolist() == [[False, True, False, False]]  # never empty
    assert np.isfinite(g.top_p_filter(logits, 1.0)).all()


def test_sampling_follows_the_probabilities():
    probs = np.array([0.1, 0.6, 0.3, 0.0], np.float32)
    logits = np.tile(np.log(probs + 1e-30), (20000, 1)).astype(np.float32)
    draws = g.sample_next(logits, np.random.default_rng(0))
    freq = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(freq, probs, atol=0.015)


def test_temperature_sharpens_and_zero_is_greedy():
    logits = np.tile(np.array([[1.0, 2.0, 0.0]], np.float32), (20000, 1))
    cold = np.bincount(g.sample_next(logits, np.random.default_rng(1), temperature=0.5), minlength=3) / 20000
    want = np.exp(np.array([2.0, 4.0, 0.0])) / np.exp(np.array([2.0, 4.0, 0.0])).sum()
    np.testing.assert_allclose(cold, want, atol=0.015)
    assert np.all(g.sample_next(logits[:3], None, temperature=0) == 1)


def test_the_same_seed_gives_the_same_tokens(models):
    hp, params = models["tiny"]
    def run(seed):
        return np.concatenate(list(g.generate([464, 3290], params, hp, 15, seed=seed, top_k=40, stop=None)))

    assert run(7).tolist() == run(7).tolist()
    assert run(7).tolist() != run(8).tolist()


def test_samples_run_as_one_batch(models):
    hp, params = models["tiny"]
    steps = list(g.generate([464], params, hp, 6, seed=0, n_samples=4, stop=None))
    assert all(s.shape == (4,) for s in steps) and len(steps) == 6
    greedy = list(g.generate([464], params, hp, 6, temperature=0, n_samples=3, stop=None))
    assert all(len(set(s.tolist())) == 1 for s in greedy)  # greedy samples agree


def test_generation_stops_at_the_stop_token(models):
    hp, params = models["tiny"]
    path = np.concatenate(list(g.generate([464], params, hp, 10, temperature=0, stop=None)))
    stop = int(path[4])
    first = path.tolist().index(stop)
    got = np.concatenate(list(g.generate([464], params, hp, 10, temperature=0, stop=stop)))
    assert got.tolist() == path[:first + 1].tolist()


def test_an_empty_prompt_starts_from_endoftext(models):
    hp, params = models["tiny"]
    first = next(g.generate([], params, hp, 1, temperature=0, stop=shapes.ENDOFTEXT_ID))
    assert first[0] == g.gpt2([shapes.ENDOFTEXT_ID], params, hp)[-1].argmax()


def test_a_too_long_request_fails_before_any_work(models):
    hp, params = models["tiny"]
    with pytest.raises(ValueError, match="exceed the context of 64"):
        next(g.generate(list(range(60)), params, hp, 5))


@pytest.mark.parametrize("kw, message", [
    (dict(temperature=-1.0), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(n_tokens=-1), "n_tokens"), (dict(n_samples=0), "n_samples"),
])
def test_sampling_settings_are_validated(models, kw, message):
    hp, params = models["tiny"]
    args = dict(n_tokens=3) | kw
    with pytest.raises(ValueError, match=message):
        next(g.generate([1], params, hp, **args))


def test_score_needs_two_tokens(models):
    hp, params = models["tiny"]
    with pytest.raises(ValueError, match="at least 2 tokens"):
        g.score([5], params, hp)


def test_log_softmax_matches_log_of_softmax():
    x = rand(3, 9, seed=31, scale=5)
    np.testing.assert_allclose(g.log_softmax(x), np.log(g.softmax(x)), rtol=1e-5, atol=1e-6)


def test_every_fast_twin_is_its_plain_functions_name_with_fast():
    import ast
    import handout
    for (file, twin), _ in handout.TWINS.items():
        with open(os.path.join(ROOT, file), encoding="utf-8") as f:
            defined = {n.name for n in ast.walk(ast.parse(f.read())) if isinstance(n, ast.FunctionDef)}
        assert twin.endswith("_fast"), f"{file}: the fast twin {twin} should be named <plain name>_fast"
        assert twin in defined and twin[:-len("_fast")] in defined, f"{file}: {twin} and its plain form"


@pytest.mark.parametrize("request_, message", [
    (dict(ids=list(range(60)), n_tokens=5), "exceed the context of 64"),
    (dict(ids=[464], temperature=-1.0), "must be >= 0"),
    (dict(ids=[464, 50257]), "50257 is outside"),
    (dict(ids=[]), "an empty prompt starts from the stop token"),
    (dict(ids="Hello"), "not text"),
])
def test_generate_checks_its_arguments_when_it_is_called_not_at_the_first_step(models, request_, message):
    hp, params = models["tiny"]
    with pytest.raises((ValueError, TypeError), match=message):
        g.generate(request_.pop("ids"), params, hp, **{"n_tokens": 5, **request_})  # no next(): the call raises


def rigged_257_token_model():
    """A random 257-token model (bytes and <|endoftext|> at 256, as bpe.py's trainer makes them) whose
    every prediction is 256: ln_f gives wte[256] at every position, the row longest of all."""
    import initialise
    hp = {"n_vocab": 257, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 1}
    params = initialise.init_params(hp, seed=0)
    params["wte"][256] *= 2 * np.linalg.norm(params["wte"], axis=1).max() / np.linalg.norm(params["wte"][256])
    params["ln_f"] = {"g": np.zeros(8, np.float32), "b": params["wte"][256].copy()}
    return hp, params


def test_a_257_token_vocabulary_stops_at_its_own_endoftext_and_has_no_50256():
    hp, params = rigged_257_token_model()
    assert [s.tolist() for s in g.generate([5, 6], params, hp, 8, temperature=0, stop=256)] == [[256]]
    assert len(list(g.generate([5, 6], params, hp, 8, temperature=0, stop=None))) == 8
    first = next(g.generate([], params, hp, 3, temperature=0, stop=256))  # an empty prompt starts from 256
    assert first.tolist() == [256]
    with pytest.raises(ValueError, match="50256 is outside 0..256"):
        g.generate([], params, hp, 3, stop=shapes.ENDOFTEXT_ID)


def test_the_layer_norms_eps_comes_from_hparams_and_gives_hugging_faces_logits():
    """tests/data/hf/inner was made with layer_norm_epsilon = 1e-3: read from its config into hparams
    (never into params), it gives GPT2LMHeadModel's logits; GPT-2's 1e-5 would not."""
    import backward
    from plumbing import hf_model
    hp, params, _ = hf_model.load_hf_folder(os.path.join(DATA, "hf", "inner"))
    golden = np.load(os.path.join(DATA, "hf", "golden.npz"))
    ids, want = golden["inner/ids"], golden["inner/last_logits"]
    assert g.layer_norm_eps(hp) == 1e-3 and all(set(norm) == {"g", "b"} for norm in [params["ln_f"]] + [
        b[n] for b in params["blocks"] for n in ("ln_1", "ln_2")])
    gpt2s_eps = {k: v for k, v in hp.items() if k != "layer_norm_epsilon"}
    assert np.abs(g.gpt2(ids, params, hp)[:, -1] - want).max() <= 1e-4
    assert np.abs(g.gpt2(ids, params, gpt2s_eps)[:, -1] - want).max() > 1e-3  # the default eps is not this model's
    logits = look_inside.run_with_cache(ids, params, hp, names=[])[0]  # the callers that take hparams use it
    assert np.abs(logits[:, -1] - want).max() <= 1e-4
    loss, _ = backward.loss_and_grads(ids[:, :-1], ids[:, 1:], params, hp)
    assert loss == pytest.approx(g.next_token_loss(logits[:, :-1], ids[:, 1:]), rel=1e-5)
    assert g.score(ids[0], params, hp)[1] == pytest.approx(g.next_token_loss(logits[:1, :-1], ids[:1, 1:]), rel=1e-5)
