"""gpt2_numpy.py: each building block against an independent reference, then the whole model
against Hugging Face's GPT2LMHeadModel (tests/data/hf_golden.npz), then generation and scoring."""
import math

import numpy as np
import pytest

import download
import gpt2_numpy as g
from conftest import checkpoint_dir, DATA
import os

GOLDEN = np.load(os.path.join(DATA, "hf_golden.npz"))
CASES = {"tiny_turing": "tiny", "tiny_batch": "tiny", "odd_full_context": "odd", "odd_prompt": "odd",
         "odd_batch": "odd"}


@pytest.fixture(scope="module")
def models():
    return {name: download.load_checkpoint(checkpoint_dir(name)) for name in ("tiny", "odd")}


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# --- 1. building blocks, each against a float64 reference written out element by element ---------

def test_gelu_is_the_tanh_approximation():
    x = rand(200, scale=4.0)
    ref = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in x.astype(float)]
    y = g.gelu(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    assert g.gelu(np.float32([0.0]))[0] == 0 and abs(g.gelu(np.float32([10.0]))[0] - 10) < 1e-5


def test_softmax_matches_the_definition_and_does_not_overflow():
    x = rand(4, 7, scale=3.0)
    ref = np.array([[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in x.reshape(-1, 7).astype(float)])
    y = g.softmax(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.reshape(-1, 7), ref, rtol=1e-5)
    big = g.softmax(np.array([1000.0, 1001.0, -np.inf], np.float32))
    np.testing.assert_allclose(big, [1 / (1 + math.e), math.e / (1 + math.e), 0], rtol=1e-6)


def test_layer_norm_matches_the_definition():
    x, gain, bias = rand(3, 5, 16, seed=1, scale=5.0), rand(16, seed=2), rand(16, seed=3)
    ref = np.empty(x.shape)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx].astype(float)
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 for v in row) / len(row)
        ref[idx] = [(v - mean) / math.sqrt(var + 1e-5) * gg + bb for v, gg, bb in zip(row, gain, bias)]
    y = g.layer_norm(x, gain, bias)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_layer_norm_of_a_constant_row_is_the_bias():
    b = rand(8, seed=4)
    np.testing.assert_allclose(g.layer_norm(np.full((2, 8), 3.0, np.float32), rand(8), b), np.broadcast_to(b, (2, 8)))


def test_linear_matches_the_definition():
    x, w, b = rand(2, 3, 4, seed=5), rand(4, 6, seed=6), rand(6, seed=7)
    ref = np.array([[[sum(float(x[i, t, k]) * float(w[k, j]) for k in range(4)) + float(b[j]) for j in range(6)]
                     for t in range(3)] for i in range(2)])
    np.testing.assert_allclose(g.linear(x, w, b), ref, rtol=1e-5, atol=1e-6)


def test_ffn_is_c_proj_of_gelu_of_c_fc():
    x = rand(1, 2, 4, seed=8)
    c_fc, c_proj = {"w": rand(4, 16, seed=9), "b": rand(16, seed=10)}, {"w": rand(16, 4, seed=11), "b": rand(4, seed=12)}
    hidden = x.astype(float) @ c_fc["w"] + c_fc["b"]
    hidden = 0.5 * hidden * (1 + np.tanh(math.sqrt(2 / math.pi) * (hidden + 0.044715 * hidden ** 3)))
    np.testing.assert_allclose(g.ffn(x, c_fc, c_proj), hidden @ c_proj["w"] + c_proj["b"], rtol=1e-4, atol=1e-5)


# --- 2. attention ---------------------------------------------------------------------------

def reference_attention(q, k, v):
    """Loops: query i (at absolute position past + i) averages the values of keys 0..past+i."""
    B, H, Tq, D = q.shape
    past = k.shape[2] - Tq
    out = np.zeros(q.shape)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                scores = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(D) for j in range(past + i + 1)]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                out[b, h, i] = sum(w * v[b, h, j].astype(float) for j, w in enumerate(weights)) / sum(weights)
    return out


def test_causal_mask():
    m = g.causal_mask(3)
    assert m.dtype == np.float32
    assert np.array_equal(np.isinf(m), [[False, True, True], [False, False, True], [False, False, False]])
    assert np.all(m[~np.isinf(m)] == 0)


@pytest.mark.parametrize("past", [0, 3])
def test_attention_matches_the_loop(past):
    q, k, v = rand(2, 3, 5, 4, seed=13), rand(2, 3, 5 + past, 4, seed=14), rand(2, 3, 5 + past, 4, seed=15)
    y = g.attention(q, k, v)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, reference_attention(q, k, v), rtol=1e-4, atol=1e-5)


def test_attention_weights_rows_sum_to_one_and_never_look_ahead():
    w = g.attention_weights(rand(1, 2, 6, 4, seed=16), rand(1, 2, 6, 4, seed=17))
    np.testing.assert_allclose(w.sum(-1), 1, rtol=1e-5)
    assert np.all(np.triu(w[0, 0], k=1) == 0)


@pytest.mark.parametrize("past", [0, 50])
def test_blocked_attention_equals_attention(past):
    q, k, v = rand(1, 2, 300, 8, seed=18), rand(1, 2, 300 + past, 8, seed=19), rand(1, 2, 300 + past, 8, seed=20)
    np.testing.assert_allclose(g.blocked_attention(q, k, v, block=64), g.attention(q, k, v), rtol=1e-5, atol=1e-6)


def test_split_and_merge_heads():
    x = rand(2, 5, 12, seed=21)
    heads = g.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert np.array_equal(heads[1, 2, 4], x[1, 4, 8:12])  # head h holds columns h*D .. (h+1)*D
    assert np.array_equal(g.merge_heads(heads), x)


def test_mha_matches_per_head_loops():
    C, H = 12, 3
    x = rand(2, 5, C, seed=22)
    c_attn, c_proj = {"w": rand(C, 3 * C, seed=23), "b": rand(3 * C, seed=24)}, {"w": rand(C, C, seed=25), "b": rand(C, seed=26)}
    qkv = x.astype(float) @ c_attn["w"] + c_attn["b"]
    D = C // H
    heads = []
    for h in range(H):
        q, k, v = (qkv[..., part * C + h * D: part * C + (h + 1) * D] for part in range(3))
        heads.append(reference_attention(q[:, None], k[:, None], v[:, None])[:, 0])
    ref = np.concatenate(heads, axis=-1) @ c_proj["w"] + c_proj["b"]
    np.testing.assert_allclose(g.mha(x, c_attn, c_proj, H), ref, rtol=1e-4, atol=1e-4)


# --- 3. the model against Hugging Face -------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_logits_match_hugging_face(models, case):
    hp, params = models[CASES[case]]
    logits = g.gpt2(GOLDEN[f"{case}/ids"], params, hp["n_head"])
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
    np.testing.assert_array_equal(g.gpt2(ids[1], params, hp["n_head"]), g.gpt2(ids, params, hp["n_head"])[1])


def test_last_only_gives_the_last_position(models):
    hp, params = models["tiny"]
    ids = GOLDEN["tiny_batch/ids"]
    last = g.gpt2(ids, params, hp["n_head"], last_only=True)
    assert last.shape == (2, 1, 50257)
    np.testing.assert_allclose(last[:, 0], g.gpt2(ids, params, hp["n_head"])[:, -1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["tiny", "odd"])
def test_kv_cache_gives_the_logits_of_full_recomputation_at_every_step(models, name):
    hp, params = models[name]
    ids = np.random.default_rng(3).integers(0, hp["n_vocab"], 20)
    cache = g.new_kv_cache(hp, 1, 20)
    steps = [g.gpt2(ids[:5], params, hp["n_head"], cache)]  # a 5-token prompt, then one token at a time
    steps += [g.gpt2(ids[t:t + 1], params, hp["n_head"], cache) for t in range(5, 20)]
    incremental = np.concatenate(steps)
    assert cache[0]["n"] == 20
    assert np.abs(incremental - g.gpt2(ids, params, hp["n_head"])).max() <= 1e-5


@pytest.mark.parametrize("ids, error, message", [
    ([1, 50257], ValueError, "50257 is outside"),
    ([[3, -1]], ValueError, "-1 is outside"),
    ([1.0, 2.0], TypeError, "integers"),
    (list(range(65)), ValueError, "65 positions do not fit"),
])
def test_bad_ids_are_clear_errors(models, ids, error, message):
    hp, params = models["tiny"]
    with pytest.raises(error, match=message):
        g.gpt2(ids, params, hp["n_head"])


def test_no_float64_anywhere_in_a_forward_pass(models):
    hp, params = models["tiny"]
    for name, a in g.trace([1, 2, 3], params, hp["n_head"]):
        assert a.dtype in (np.float32, np.int64), name


# --- 4. generation ---------------------------------------------------------------------------

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
    first = next(g.generate([], params, hp, 1, temperature=0))
    assert first[0] == g.gpt2([g.ENDOFTEXT], params, hp["n_head"])[-1].argmax()


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
