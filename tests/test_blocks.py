"""gpt2_numpy.py's building blocks, each against an independent reference written out element by
element in float64. conftest.py runs this file first, so a student who rewrites a block meets its
own test's failure before any test of the whole model."""
import math
import warnings

import numpy as np
import pytest

from conftest import rand
import gpt2_numpy as g


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


def test_layer_norm_matches_the_definition():
    x, gain, bias = rand(3, 5, 16, seed=1, scale=5.0), rand(16, seed=2), rand(16, seed=3)
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


