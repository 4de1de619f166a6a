"""gpt2_numpy.py, in its order. The building blocks, each against an independent reference written out
element by element in float64: conftest.py runs this file first, so a student who rewrites a block
meets its own test's failure before any test of the whole model. Then the whole model against Hugging
Face's GPT2LMHeadModel (tests/data/hf_golden.npz), stage by stage and at the logits, generation and
scoring. Last, the logit processors and stop strings: each against its rule written out here, then
generate id for id against Hugging Face's generate (tests/data/generate_golden.json, made by
tests/data/make_generate_golden.py): greedy with each processor and all of them, stop strings, and
the distributions sampling draws from with min-p and every warper at once."""
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from conftest import (DATA, GENERATE_GOLDEN, ROOT, checkpoint_dir, float32_rounding, generate_golden, golden_model,
                      golden_settings, rand)
import gpt2_numpy as g
import look_inside
from plumbing import shapes
from plumbing.checkpoint import load_checkpoint
from plumbing.errors import UserError

def assert_float32(y, name):
    """float32 in, float32 out; when not, say the usual reason."""
    assert y.dtype == np.float32, (
        f"{name} returned {y.dtype}, not float32: a NumPy float64 constant, such as np.sqrt(2 / np.pi) or "
        "np.float64(0.5), promotes every float32 array it touches to float64. Use a Python float "
        "(math.sqrt(2 / math.pi)) instead.")


def named(y, mistakes, rtol=1e-4, atol=1e-5):
    """A failure's message: the common mistake that y matches, if any (else nothing to add).
    mistakes: [(the mistake, said for a student, what a function with it returns)]."""
    for message, wrong in mistakes:
        with np.errstate(all="ignore"):
            if np.shape(wrong) == np.shape(y) and np.allclose(y, wrong, rtol=rtol, atol=atol, equal_nan=True):
                return message
    return ""


def gelu_mistakes(x):
    def tanh_form(a, cubic=0.044715):
        return np.tanh(a * (x + cubic * x ** 3))

    t = tanh_form(math.sqrt(2 / math.pi))
    return [("gelu is twice the answer: the 0.5 of 0.5 x (1 + tanh(...)) is missing", x * (1 + t)),
            ("the 1 of 0.5 x (1 + tanh(...)) is missing", 0.5 * x * t),
            ("the cubic term is missing: tanh(√(2/π) (x + 0.044715 x³))",
             0.5 * x * (1 + tanh_form(math.sqrt(2 / math.pi), 0))),
            ("√(2/π) is missing from the tanh: tanh(√(2/π) (x + 0.044715 x³))", 0.5 * x * (1 + tanh_form(1.0))),
            ("2/π where √(2/π) belongs: tanh(√(2/π) (x + 0.044715 x³))", 0.5 * x * (1 + tanh_form(2 / math.pi))),
            ("that is the exact GELU, 0.5 x (1 + erf(x/√2)); GPT-2 uses the tanh approximation",
             0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))))]


def layer_norm_mistakes(x, gain, bias, eps=1e-5):
    centred = x - x.mean(axis=-1, keepdims=True)
    var = (centred ** 2).mean(axis=-1, keepdims=True)
    xhat = centred / np.sqrt(var + eps)
    wrong_axes = [((x - x.mean(axis=a, keepdims=True)) / np.sqrt(x.var(axis=a, keepdims=True) + eps)) * gain + bias
                  for a in (None, 0, 1, (0, 1))]
    return [("not divided by √(var + eps)", centred * gain + bias),
            ("divided by var + eps: divide by its square root, √(var + eps)", centred / (var + eps) * gain + bias),
            ("the variance divides by C - 1 (ddof=1, torch.var's default): layer norm's is the mean of (x - mean)²",
             centred / np.sqrt(var * x.shape[-1] / (x.shape[-1] - 1) + eps) * gain + bias),
            ("the gain and the bias are swapped: x̂ · g + b", xhat * bias + gain)] + [
            ("the mean and the variance are taken over the wrong axis: each position is normalised over its own C "
             "features (axis=-1, keepdims=True)", wrong) for wrong in wrong_axes]


# --- 1. building blocks, each against a float64 reference written out element by element ---------

def test_gelu_is_the_tanh_approximation():
    x = rand(200, scale=4.0)
    ref = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in x.astype(float)]
    y = g.gelu(x)
    assert_float32(y, "gelu")
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6, err_msg=named(y, gelu_mistakes(x.astype(float))))
    assert g.gelu(np.float32([0.0]))[0] == 0 and abs(g.gelu(np.float32([10.0]))[0] - 10) < 1e-5


def test_the_hot_paths_gelu_equals_gelu():
    x = rand(64, 300, seed=40, scale=4.0)
    before = x.copy()
    y = g.gelu_fast(x)
    assert_float32(y, "gelu_fast")
    np.testing.assert_allclose(y, g.gelu(x), rtol=2e-6, atol=1e-6)
    assert np.array_equal(x, before)  # the input is not changed


def test_the_hot_paths_gelu_at_the_extremes_without_a_warning():
    x = np.float32([-1e4, -100.0, -10.0, -9.0, 0.0, 9.0, 100.0, 1e4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exp(-2y) overflows to inf for a very negative x: that is its limit
        y = g.gelu_fast(x)
    np.testing.assert_allclose(y, g.gelu(x), rtol=2e-6, atol=1e-6)
    assert y[0] == 0 and y[-1] == 1e4


def test_softmax_matches_the_definition_and_does_not_overflow():
    x = rand(4, 7, scale=3.0)
    ref = np.array([[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in x.reshape(-1, 7).astype(float)])
    y = g.softmax(x)
    assert_float32(y, "softmax")
    e = np.exp(x.astype(float))
    np.testing.assert_allclose(y.reshape(-1, 7), ref, rtol=1e-5, err_msg=named(y, [
        (f"the sum runs over {over}: each row is normalised by its own sum (axis=-1, keepdims=True)", e / total)
        for over, total in [("the whole array", e.sum()), ("axis 0", e.sum(axis=0))]]))
    big = g.softmax(np.array([1000.0, 1001.0, -np.inf], np.float32))
    np.testing.assert_allclose(big, [1 / (1 + math.e), math.e / (1 + math.e), 0], rtol=1e-6, err_msg=(
        "softmax([1000, 1001, -inf]) gives nan: exp(1000) overflows to inf, and inf / inf is nan. Subtract each "
        "row's max first: exp(x - max) / Σ exp(x - max) is the same softmax, and its largest exp is 1"
        if np.isnan(big).any() else ""))


@pytest.mark.parametrize("scale", [5.0, 1e-3])  # 1e-3: a variance below eps, where eps's place shows
def test_layer_norm_matches_the_definition(scale):
    x, gain, bias = rand(3, 5, 16, seed=1, scale=scale), rand(16, seed=2), rand(16, seed=3)
    ref = np.empty(x.shape)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx].astype(float)
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 for v in row) / len(row)
        ref[idx] = [(v - mean) / math.sqrt(var + 1e-5) * gg + bb for v, gg, bb in zip(row, gain, bias)]
    y = g.layer_norm(x, gain, bias)
    assert_float32(y, "layer_norm")
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5,
                               err_msg=named(y, layer_norm_mistakes(x.astype(float), gain.astype(float), bias)))


def test_layer_norm_of_a_constant_row_is_the_bias():
    b = rand(8, seed=4)
    y = g.layer_norm(np.full((2, 8), 3.0, np.float32), rand(8), b)
    np.testing.assert_allclose(y, np.broadcast_to(b, (2, 8)), err_msg=(
        "a constant row gives nan: its variance is 0, and (x - mean) / √var is 0 / 0. The eps in √(var + eps) "
        "keeps it finite (np.std and np.var have no eps)" if np.isnan(y).any() else ""))


def test_linear_matches_the_definition():
    x, w, b = rand(2, 3, 4, seed=5), rand(4, 6, seed=6), rand(6, seed=7)
    ref = np.array([[[sum(float(x[i, t, k]) * float(w[k, j]) for k in range(4)) + float(b[j]) for j in range(6)]
                     for t in range(3)] for i in range(2)])
    y = g.linear(x, w, b)
    assert_float32(y, "linear")
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6,
                               err_msg=named(y, [("the bias is missing: x @ w + b", ref - b.astype(float))]))


def test_ffn_is_c_proj_of_gelu_of_c_fc():
    x = rand(1, 2, 4, seed=8)
    c_fc, c_proj = {"w": rand(4, 16, seed=9), "b": rand(16, seed=10)}, {"w": rand(16, 4, seed=11), "b": rand(4, seed=12)}
    hidden = x.astype(float) @ c_fc["w"] + c_fc["b"]
    hidden = 0.5 * hidden * (1 + np.tanh(math.sqrt(2 / math.pi) * (hidden + 0.044715 * hidden ** 3)))
    np.testing.assert_allclose(g.ffn(x, c_fc, c_proj), hidden @ c_proj["w"] + c_proj["b"], rtol=1e-4, atol=1e-5)


# --- 2. attention ---------------------------------------------------------------------------

def reference_attention(q, k, v, scale=None, sees="causal"):
    """Loops: query i (at absolute position past + i) averages the values of keys 0..past+i.
    A common mistake's answer, for a failure's message: another scale than 1/√D, or a query that
    sees "all" the keys (no mask), or keys 0..i ("the first", a mask that forgets the past keys)."""
    B, H, Tq, D = q.shape
    past = k.shape[2] - Tq
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros(q.shape)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                last = {"causal": past + i, "all": k.shape[2] - 1, "the first": i}[sees]
                scores = [float(q[b, h, i] @ k[b, h, j]) * scale for j in range(last + 1)]
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
    assert_float32(y, "attention")
    np.testing.assert_allclose(y, reference_attention(q, k, v), rtol=1e-4, atol=1e-5, err_msg=named(y, [
        ("the scores are not divided by √D: softmax(q kᵀ/√D + mask) v", reference_attention(q, k, v, scale=1.0)),
        ("the scores are divided by D, not by √D", reference_attention(q, k, v, scale=1 / q.shape[-1])),
        ("no causal mask: query i may not see the keys after its own position",
         reference_attention(q, k, v, sees="all")),
        ("with earlier keys (the KV cache's), query i is at position past + i: the mask covers the last Tq keys, "
         "not the first", reference_attention(q, k, v, sees="the first"))]))


def test_attention_weights_rows_sum_to_one_and_never_look_ahead():
    w = g.attention_weights(rand(1, 2, 6, 4, seed=16), rand(1, 2, 6, 4, seed=17))
    np.testing.assert_allclose(w.sum(-1), 1, rtol=1e-5, err_msg=(
        "each query's weights must sum to one: the softmax runs over the last axis (the keys), after the mask's "
        "-inf is added to the scores (zeroing weights after the softmax leaves rows that do not sum to one)"))
    assert np.all(np.triu(w[0, 0], k=1) == 0), (
        "a query gives weight to a key after its own position: the causal mask (-inf above the diagonal, "
        "added to the scores before the softmax) is missing")


@pytest.mark.parametrize("past", [0, 50])
def test_blocked_attention_equals_attention(past):
    q, k, v = rand(1, 2, 300, 8, seed=18), rand(1, 2, 300 + past, 8, seed=19), rand(1, 2, 300 + past, 8, seed=20)
    np.testing.assert_allclose(g.blocked_attention(q, k, v, block=64), g.attention(q, k, v), rtol=1e-5, atol=1e-6,
                               err_msg="blocked_attention differs from attention: each block of queries sees every key "
                               "up to its own last position (past + its end), with the mask on its own rows")


@pytest.mark.parametrize("threads", [1, 2])
def test_the_fast_attention_and_layer_norm_are_the_plain_ones(threads, monkeypatch):
    """blocked_attention_fast (softmax folded into its product, heads on BLAS's threads) and layer_norm_fast (rows in
    chunks) against their plain forms: a long prompt, one cut short by the block, a KV cache's past, a decoded token."""
    from plumbing import parallel
    from plumbing.blas import set_threads
    monkeypatch.setattr(g, "CHUNK", 500)  # the long prompts take the heads one at a time, the others all at once
    monkeypatch.setattr(parallel, "CHUNK", 64)  # a few rows a chunk
    before = set_threads(threads)
    try:
        for n_queries, past, block in ((300, 0, 64), (300, 17, 128), (1, 40, 128), (5, 3, 2)):
            q, k, v = rand(2, 3, n_queries, 8, seed=31), rand(2, 3, n_queries + past, 8, seed=32), \
                rand(2, 3, n_queries + past, 8, seed=33)
            fast = g.blocked_attention_fast(q, k, v, block=block)
            assert fast.dtype == np.float32
            np.testing.assert_allclose(fast, g.blocked_attention(q, k, v, block=block), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{n_queries} queries after {past}, blocks of {block}")
        x, gain, bias = rand(3, 50, 16, seed=34), rand(16, seed=35), rand(16, seed=36)
        np.testing.assert_array_equal(g.layer_norm_fast(x, gain, bias), g.layer_norm(x, gain, bias))
    finally:
        set_threads(before)


def test_the_embeddings_are_each_tokens_row_plus_its_positions_row():
    """embed: x[b, t] = wte[ids[b, t]] + wpe[start + t], the positions counted after the tokens already cached;
    each part passes through the hook, wte's first."""
    wte, wpe, ids = rand(10, 4, seed=1), rand(6, 4, seed=2), np.array([[3, 3, 9], [0, 5, 2]])
    for start in (0, 2):
        x = g.embed(ids, wte, wpe, start)
        assert x.shape == (2, 3, 4) and x.dtype == np.float32
        for b, t in np.ndindex(ids.shape):
            np.testing.assert_array_equal(x[b, t], wte[ids[b, t]] + wpe[start + t], err_msg=(
                f"row {b}, position {t} with {start} tokens cached: wte[that token] + wpe[{start} + {t}]"))
    seen = []
    g.embed(ids, wte, wpe, 0, lambda name, a: seen.append(name) or a)
    assert seen == ["wte", "wpe"], "each part passes through hook: hook('wte', ...) then hook('wpe', ...)"


def test_split_and_merge_heads():
    x = rand(2, 5, 12, seed=21)
    heads = g.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4), f"split_heads gave {heads.shape}, not [B, H, T, D] = (2, 3, 5, 4)"
    assert np.array_equal(heads[1, 2, 4], x[1, 4, 8:12]), (  # head h holds columns h*D .. (h+1)*D
        "head h must hold columns h*D .. (h+1)*D of each position: reshape to [B, T, H, D], then swap T and H "
        "(a reshape straight to [B, H, T, D] mixes the positions)")
    assert np.array_equal(g.merge_heads(heads), x), (
        "merge_heads(split_heads(x)) is not x: each must undo the other (split: reshape to [B, T, H, D], then swap "
        "T and H; merge: swap them back, then reshape to [B, T, C])")


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
    np.testing.assert_allclose(g.mha(x, c_attn, c_proj, H), ref, rtol=1e-4, atol=1e-4, err_msg=(
        "mha differs from per-head loops: c_attn's output splits along its last axis into q, k and v, in that "
        "order; each splits into heads; attention; the heads merged; then c_proj"))


GOLDEN = np.load(os.path.join(DATA, "hf_golden.npz"))

CASES = {"tiny_turing": "tiny", "tiny_batch": "tiny", "odd_full_context": "odd", "odd_prompt": "odd",
         "odd_batch": "odd"}


@pytest.fixture(scope="module")
def models():
    return {name: load_checkpoint(checkpoint_dir(name)) for name in ("tiny", "odd")}


# --- 3. the model against Hugging Face ----------------------------------------------------

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
        if i < L - 1:  # from HF's own input: one block's four linear layers
            same(f"h{i} output", out, hidden[i + 1],
                 float32_rounding(4 * hp["n_embd"], 4, np.abs(hidden[i + 1]).max()))
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
    np.testing.assert_array_equal(one, g.gpt2(ids[1:2], params, hp)[0])  # the batch of one it stands for
    batched = g.gpt2(ids, params, hp)[1]  # in a batch: one product over its rows, summed in BLAS's own order
    np.testing.assert_allclose(one, batched, rtol=0, atol=1e-5 * np.abs(batched).max())


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
    bound = float32_rounding(4 * hp["n_embd"], 4 * hp["n_layer"] + 1, np.abs(full).max())  # the blocks, the head
    assert worst.max() <= bound, (
        f"with the KV cache, the logits first differ from a full recomputation at position {np.argmax(worst > bound)} "
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


# --- 4. generation ------------------------------------------------------------------------

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
    hot = np.sqrt(probs) / np.sqrt(probs).sum()  # temperature 2: softmax(logits / 2) ∝ √p
    draws = g.sample_next(logits, np.random.default_rng(0), temperature=2.0)
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / len(draws), hot, atol=0.015)


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
    with pytest.raises(ValueError, match=r"the prompt's 64 tokens plus 1 new one exceed the context of 64 tokens"):
        g.generate(list(range(64)), params, hp, 1)  # one new one, not "1 new ones"


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
    stand_ins = {"log_softmax", "gelu_backward", "topk_mask"}  # not twins: they would give softmax, gelu, topk_relu away
    for (file, twin), _ in handout.TWINS.items():
        with open(os.path.join(ROOT, file), encoding="utf-8") as f:
            defined = {n.name for n in ast.walk(ast.parse(f.read())) if isinstance(n, ast.FunctionDef)}
        if twin in stand_ins:
            assert twin in defined, f"{file}: {twin}"
            continue
        assert twin.endswith("_fast"), f"{file}: the fast twin {twin} should be named <plain name>_fast"
        assert twin in defined and twin[:-len("_fast")] in defined, f"{file}: {twin} and its plain form"


@pytest.mark.parametrize("request_, message", [
    (dict(ids=list(range(60)), n_tokens=5), "exceed the context of 64"),
    (dict(ids=[464], temperature=-1.0), r"must be 0 \(greedy\) or 1e-30 to 1e30"),
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
    import parameters
    hp = {"n_vocab": 257, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 1}
    params = parameters.init_params(hp, seed=0)
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


# --- 5. the logit processors, each against its rule ----------------------------------------------------

def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = rand(3, 20, seed=1)
    ids = np.array([[1, 2, 2, 5, 1], [0, 0, 0, 0, 0], [19, 3, 7, 11, 3]])
    for penalty in (1.5, 0.5):  # above 1 a seen token is made less likely; below 1, likelier
        want = logits.copy()
        for b, row in enumerate(ids.tolist()):
            for t in set(row):  # once a token, however often it came
                s = logits[b, t]
                want[b, t] = s / penalty if s > 0 else s * penalty
        got = g.penalize_repeats(logits, ids, penalty)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def banned_by_hand(row, n):
    """The tokens that would complete an n-gram already in `row`: every n-gram written out."""
    last = tuple(row[len(row) - n + 1:]) if n > 1 else ()
    return {row[i + n - 1] for i in range(len(row) - n + 1) if tuple(row[i:i + n - 1]) == last}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_no_repeat_mask_bans_each_token_that_would_complete_an_earlier_ngram(n):
    logits = rand(3, 12, seed=2)
    ids = np.array([[1, 2, 3, 1, 2, 4, 1, 2], [5, 5, 5, 5, 5, 5, 5, 5], [0, 1, 2, 3, 4, 5, 6, 7]])
    got = g.ban_repeated_ngrams(logits, ids, n)
    assert got.dtype == np.float32
    for b, row in enumerate(ids.tolist()):
        banned = banned_by_hand(row, n)
        assert set(np.flatnonzero(got[b] == -np.inf).tolist()) == banned, (n, row)
        kept = [t for t in range(12) if t not in banned]
        np.testing.assert_array_equal(got[b, kept], logits[b, kept])
    np.testing.assert_array_equal(g.ban_repeated_ngrams(logits, ids[:, :n - 1], n), logits)  # no n-gram yet


def test_the_penalties_apply_in_generates_order_and_only_when_on():
    logits, ids = rand(2, 9, seed=5), np.array([[1, 2, 1], [3, 3, 4]])
    want = g.ban_repeated_ngrams(g.penalize_repeats(logits, ids, 1.4), ids, 2)
    np.testing.assert_array_equal(g.penalized(logits, ids, 1.4, 2), want)
    assert g.penalized(logits, ids) is logits


def test_min_p_keeps_the_tokens_at_least_p_times_as_likely_as_the_most_likely():
    logits = rand(4, 30, seed=3, scale=2.0)
    for p in (0.0, 0.05, 0.3, 1.0):
        got = g.min_p_filter(logits, p)
        for b in range(4):
            probs = np.exp(logits[b].astype(np.float64) - logits[b].max())
            probs /= probs.sum()
            keep = probs >= p * probs.max()
            assert keep[logits[b].argmax()]
            np.testing.assert_array_equal(got[b][keep], logits[b][keep])
            assert np.all(got[b][~keep] == -np.inf)


def test_sampling_cuts_with_min_p_after_the_temperature_top_k_and_top_p():
    logits = rand(2, 40, seed=6, scale=3.0)
    want = g.softmax(g.min_p_filter(g.top_p_filter(g.top_k_filter(logits / 0.7, 20), 0.9), 0.1))
    np.testing.assert_array_equal(g.sampling_probs(logits, 0.7, 20, 0.9, 0.1), want)


@pytest.mark.parametrize("pieces, ends", [  # Hugging Face's StopStringCriteria's own examples, for "stop"
    (["st", "op"], True), (["stop"], True), (["st", "opera"], True), (["sto", "pper"], True),
    (["las", "topper"], True), (["s", "to", "pped"], True),
    (["stop", "at"], False), (["st", "op", "at"], False), (["st", "opera", "tion"], False)])
def test_a_stop_string_ends_at_the_token_that_completes_it(pieces, ends):
    text = "".join(pieces).encode()
    end = g.stop_string_end(text, len(pieces[-1]), [b"stop"])
    assert (end is not None) == ends
    if ends:
        assert text[:end].endswith(b"stop") and end > len(text) - len(pieces[-1])


def test_the_stop_string_that_ends_first_ends_the_text():
    assert g.stop_string_end(b"a cat sat", 4, [b"sat", b"cat", b"t s"]) == len(b"a cat s")
    assert g.stop_string_end(b"a cat sat", 4, [b"cat"]) is None  # it ended before the last token


# --- 6. id for id against Hugging Face's generate -------------------------------------------------

@pytest.mark.parametrize("case", generate_golden("greedy"), ids=lambda c: c["name"])
def test_greedy_with_the_processors_and_stop_strings_gives_generates_ids(case):
    hparams, params, token_bytes = golden_model(case["folder"])
    steps = g.generate(case["prompt_ids"], params, hparams, temperature=0, token_bytes=token_bytes,
                       **golden_settings(case))
    assert [int(step[0]) for step in steps] == case["sequences"][0]


@pytest.mark.parametrize("case", generate_golden("sampling"), ids=lambda c: c["name"])
def test_sampling_draws_from_generates_warped_distribution(case):
    """At each step of generate's own draw, the distribution we would draw from (the penalties, then the
    temperature, top-k, top-p and min-p) is generate's: the same tokens kept, the same probabilities."""
    hparams, params, _ = golden_model(case["folder"])
    kw, seq = case["generate"], list(case["prompt_ids"])
    for token, step in zip(case["sequences"][0], case["steps"]):
        logits = g.gpt2(np.array([seq]), params, hparams, last_only=True)[:, -1]
        logits = g.penalized(logits, np.array([seq]), kw.get("repetition_penalty", 1.0),
                             kw.get("no_repeat_ngram_size", 0))
        top_k = kw.get("top_k", 50) or None  # generate's own default top_k, 50; 0 turns it off
        probs = g.sampling_probs(logits, kw.get("temperature", 1.0), top_k, kw.get("top_p", 1.0), kw["min_p"])[0]
        assert np.flatnonzero(probs).tolist() == step["ids"]
        np.testing.assert_allclose(probs[step["ids"]], step["probs"], rtol=1e-4, atol=1e-6)
        seq.append(token)


def test_a_batch_stops_each_sample_at_its_stop_string_and_pads_it_with_the_stop_token():
    hparams, params, token_bytes = golden_model("shakespeare")
    steps = np.array(list(g.generate([49, 46, 44, 36, 46, 25, 198], params, hparams, n_tokens=30, n_samples=3, seed=4,
                                     stop=511, stop_strings=["e"], token_bytes=token_bytes)))  # [steps, 3]
    for sample in steps.T:
        text = b"".join(token_bytes[t] for t in sample)
        first = next(i for i in range(len(sample)) if b"e" in b"".join(token_bytes[t] for t in sample[:i + 1]))
        assert text.count(b"e") >= 1 and set(sample[first + 1:].tolist()) <= {511}, sample
    assert len(steps) < 30  # every sample ended, so the loop did


# --- 7. bad input: one error naming its argument, before any step ------------------------------------

@pytest.mark.parametrize("kwargs, arg", [
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"repetition_penalty": -1.2}, "repetition_penalty"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size"), ({"no_repeat_ngram_size": 2.0}, "no_repeat_ngram_size"),
    ({"min_p": 1.5}, "min_p"), ({"min_p": -0.1}, "min_p"),
    ({"stop_strings": [""]}, "stop_strings"), ({"stop_strings": "\n"}, "stop_strings"),
    ({"stop_strings": ["x"], "token_bytes": None}, "stop_strings")])
def test_processor_settings_that_make_no_sense_are_refused_by_name(kwargs, arg):
    hparams, params, token_bytes = golden_model("shakespeare")
    with pytest.raises(UserError) as e:
        g.generate([1, 2], params, hparams, n_tokens=3, **{"token_bytes": token_bytes, **kwargs})
    assert e.value.arg == arg


# --- 8. dev-only: transformers itself, live ------------------------------------------------------

DEV_PYTHON = os.environ.get("GPT2_DEV_PYTHON", "")


@pytest.mark.skipif(not DEV_PYTHON, reason="dev-only: needs a Python with torch and transformers 5.x: "
                                           "GPT2_DEV_PYTHON=/work/devvenv/bin/python python -m pytest -q "
                                           "tests/test_gpt2_numpy.py -k live")
def test_live_generate_gives_what_the_golden_holds_and_ours_agrees(tmp_path):
    """generate run again now (make_generate_golden.py --out), and every golden test run against its answers."""
    fresh = tmp_path / "generate_golden.json"
    r = subprocess.run([DEV_PYTHON, os.path.join(DATA, "make_generate_golden.py"), "--out", str(fresh)], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(fresh, encoding="utf-8") as f:
        assert [c["name"] for c in json.load(f)["cases"]] == [c["name"] for c in GENERATE_GOLDEN]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpt2_numpy.py",
                        "tests/test_decoding.py", "tests/test_gpt2_cli.py", "-k", "generate and not live"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "GPT2_GENERATE_GOLDEN": str(fresh)})
    assert r.returncode == 0 and " passed" in r.stdout.splitlines()[-1], r.stdout[-3000:]
