"""backward.py: each block's backward against float64 finite differences, then every parameter's
gradient against torch autograd on GPT2LMHeadModel (tests/data/grad_golden.npz, made by
tests/data/make_grad_golden.py). The file follows backward.py: building blocks, attention, the model."""
import warnings

import numpy as np
import pytest

import backward
from conftest import GRAD_GOLDEN as GOLDEN, float32_rounding, numerical_grad, r64
import gpt2_numpy as g
from plumbing import shapes

CASES = {"odd": "odd", "odd_full": "odd", "tiny": "tiny"}


def check(analytic, f, x, name, mistakes=()):
    """analytic is d f / d x, within 1e-6 of finite differences. mistakes: [(a common mistake, said for a
    student, a function of the finite differences giving what a backward with that mistake returns)]:
    on a failure, the message names the one analytic matches."""
    numeric = numerical_grad(f, x)
    worst = np.abs(analytic - numeric).max()
    hint = "" if worst <= 1e-6 * max(1.0, np.abs(numeric).max()) else next(
        (f": {m}" for m, wrong in mistakes if np.allclose(analytic, wrong(numeric), rtol=1e-6, atol=1e-9)), "")
    assert worst <= 1e-6 * max(1.0, np.abs(numeric).max()), (
        f"{name}: differs from finite differences by {worst:.3g}{hint}")


# --- each block, by finite differences (float64) ---------------------------------------------

def test_gelu_backward_by_finite_differences():
    x, w = r64(20, seed=1, scale=3), r64(20, seed=2)
    check(backward.gelu_backward(x, w), lambda: (g.gelu(x) * w).sum(), x, "gelu_backward")


def test_gelu_backward_fast_is_gelu_backward():
    x = np.random.default_rng(1).standard_normal((4, 7, 30), dtype=np.float32) * 3
    dy = np.random.default_rng(2).standard_normal((4, 7, 30), dtype=np.float32)
    fast = backward.gelu_backward_fast(x, dy)
    assert fast.dtype == np.float32
    # against the plain form in float64: the two float32 forms round differently where the
    # derivative's terms cancel (|x| near 5), each within ~2e-6 of the exact value there
    exact = backward.gelu_backward(x.astype(np.float64), dy.astype(np.float64))
    np.testing.assert_allclose(fast, exact, rtol=1e-5, atol=3e-6)
    np.testing.assert_allclose(backward.gelu_backward(x, dy), exact, rtol=1e-5, atol=3e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning at the extremes; the limits are 0 and 1
        ends = backward.gelu_backward_fast(np.float32([-1e4, 1e4]), np.float32([1.0, 1.0]))
    assert ends[0] == 0 and ends[1] == 1


def test_dropout_keeps_the_mean_and_zeroes_about_p():
    y, keep = backward.apply_dropout(np.ones(200_000, np.float32), 0.1, np.random.default_rng(0))
    assert y.dtype == np.float32 and abs(keep.mean() - 0.9) < 0.005
    assert set(np.unique(y).tolist()) == {0.0, np.float32(1 / 0.9)} and abs(y.mean() - 1) < 0.01


def test_dropout_backward_by_finite_differences():
    x, w = r64(3, 8, seed=40), r64(3, 8, seed=41)
    _, keep = backward.apply_dropout(x, 0.3, np.random.default_rng(42))
    f = lambda: (backward.apply_dropout(x, 0.3, np.random.default_rng(42))[0] * w).sum()  # noqa: E731
    assert 0 < keep.sum() < keep.size
    check(backward.dropout_backward(keep, 0.3, w), f, x, "dropout_backward",
          [("dx = dy · keep / (1 - p_drop): the scale 1 / (1 - p_drop) is missing", lambda _: w * keep)])


def test_softmax_backward_by_finite_differences():
    x, w = r64(3, 7, seed=3), r64(3, 7, seed=4)
    y = g.softmax(x)
    check(backward.softmax_backward(y, w), lambda: (g.softmax(x) * w).sum(), x, "softmax_backward", [
        ("only the Jacobian's diagonal: each y_i depends on every x_j, so dx_i = y_i (dy_i - Σ_j dy_j y_j), "
         "not y_i (1 - y_i) dy_i", lambda _: y * (1 - y) * w)])


def test_layer_norm_backward_by_finite_differences():
    x, gain, bias, w = r64(2, 3, 10, seed=5, scale=2), r64(10, seed=6), r64(10, seed=7), r64(2, 3, 10, seed=8)
    dx, dg, db = backward.layer_norm_backward(x, gain, w)
    f = lambda: (g.layer_norm(x, gain, bias) * w).sum()  # noqa: E731
    xhat_over_x = 1 / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5)
    check(dx, f, x, "layer_norm_backward dx", [
        ("dx = dy · g leaves out x̂'s dependence on x: x̂ = (x - mean) / √(var + eps)", lambda _: w * gain),
        ("the mean and the variance depend on x too: dx = (dx̂ - mean(dx̂) - x̂ mean(dx̂ x̂)) / √(var + eps), "
         "not dx̂ / √(var + eps)", lambda _: w * gain * xhat_over_x)])
    check(dg, f, gain, "layer_norm_backward dg")
    check(db, f, bias, "layer_norm_backward db")


def test_linear_backward_by_finite_differences():
    x, w, b, dy = r64(2, 3, 4, seed=9), r64(4, 5, seed=10), r64(5, seed=11), r64(2, 3, 5, seed=12)
    dx, dw, db = backward.linear_backward(x, w, dy)
    f = lambda: (g.linear(x, w, b) * dy).sum()  # noqa: E731
    check(dx, f, x, "dx")
    check(dw, f, w, "dw")
    check(db, f, b, "db")


def test_attention_backward_with_its_mask_by_finite_differences():
    q, k, v, dz = (r64(1, 2, 5, 3, seed=s) for s in (13, 14, 15, 16))
    weights = g.attention_weights(q, k)
    assert np.all(np.triu(weights[0, 0], 1) == 0)  # the mask: no weight on the future
    dq, dk, dv = backward.attention_backward(q, k, v, weights, dz)
    f = lambda: (g.attention(q, k, v) * dz).sum()  # noqa: E731
    unscaled = [("dq and dk lack the 1/√D that the scores were scaled by", lambda numeric: numeric * np.sqrt(3))]
    check(dq, f, q, "dq", unscaled)
    check(dk, f, k, "dk", unscaled)
    check(dv, f, v, "dv")


def test_attention_backward_with_dropped_weights_by_finite_differences():
    q, k, v, dz = (r64(1, 2, 5, 3, seed=s) for s in (43, 44, 45, 46))
    keep = np.random.default_rng(47).random((1, 2, 5, 5)) >= 0.3
    dq, dk, dv = backward.attention_backward(q, k, v, g.attention_weights(q, k), dz, keep, 0.3)
    f = lambda: ((g.attention_weights(q, k) * keep / 0.7) @ v * dz).sum()  # noqa: E731

    def ignored(x):  # the gradient of attention without the dropout
        return ("keep and p_drop are ignored: with dropout, z was made from the dropped weights, "
                "keep · weights / (1 - p_drop), so their dropout is in each gradient",
                lambda _: numerical_grad(lambda: (g.attention(q, k, v) * dz).sum(), x))

    own = "the softmax's backward takes the softmax's own output, the weights from before the dropout"
    of_dropped = backward.softmax_backward(g.attention_weights(q, k) * keep / 0.7,
                                           (dz @ v.swapaxes(-1, -2)) * keep / 0.7)
    check(dq, f, q, "dq", [ignored(q), (own, lambda _: of_dropped @ k / np.sqrt(3))])
    check(dk, f, k, "dk", [ignored(k), (own, lambda _: of_dropped.swapaxes(-1, -2) @ q / np.sqrt(3))])
    check(dv, f, v, "dv", [ignored(v)])


def block_params(seed, C=6, F=24):
    def layer(n_in, n_out, s):
        return {"w": r64(n_in, n_out, seed=s, scale=0.5), "b": r64(n_out, seed=s + 1, scale=0.3)}

    return {"ln_1": {"g": 1 + r64(C, seed=seed), "b": r64(C, seed=seed + 1)},
            "attn": {"c_attn": layer(C, 3 * C, seed + 2), "c_proj": layer(C, C, seed + 4)},
            "ln_2": {"g": 1 + r64(C, seed=seed + 6), "b": r64(C, seed=seed + 7)},
            "mlp": {"c_fc": layer(C, F, seed + 8), "c_proj": layer(F, C, seed + 10)}}


def kept_of(x, block, hparams):
    kept = {}
    y = g.transformer_block(x, **block, hparams=hparams, hook=lambda name, a: kept.setdefault(name, a))
    return y, kept


def test_ffn_and_transformer_block_backward_by_finite_differences():
    x, dy, block = r64(2, 4, 6, seed=20), r64(2, 4, 6, seed=21), block_params(30)
    hp = {"n_head": 2}
    _, kept = kept_of(x, block, hp)
    dx, grads = backward.transformer_block_backward(kept, **block, hparams=hp, dy=dy)
    f = lambda: (g.transformer_block(x, **block, hparams=hp) * dy).sum()  # noqa: E731
    check(dx, f, x, "transformer_block_backward dx")
    for name in ("ln_1/g", "attn/c_attn/w", "attn/c_attn/b", "attn/c_proj/w", "ln_2/b", "mlp/c_fc/w", "mlp/c_proj/b"):
        *path, last = name.split("/")
        node, grad = block, grads
        for p in path:
            node, grad = node[p], grad[p]
        check(grad[last], f, node[last], f"transformer_block_backward {name}")


# --- the whole model against torch autograd -----------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_every_gradient_matches_torch(models, case):
    hp, params = models[CASES[case]]
    loss, grads = backward.loss_and_grads(GOLDEN[f"{case}/ids"], GOLDEN[f"{case}/targets"], params, hp)
    assert abs(loss - float(GOLDEN[f"{case}/loss"])) <= 1e-5
    flat = shapes.flatten(grads)
    for name, grad in flat.items():
        if name == "wte":
            rows = GOLDEN[f"{case}/wte/rows"]
            want = GOLDEN[f"{case}/wte/grad_rows"]
            norm = float(GOLDEN[f"{case}/wte/norm"])  # a sum of V·C squares, in torch's order and in NumPy's
            assert abs(np.linalg.norm(grad) - norm) <= float32_rounding(grad.size, 1, norm)
            grad = grad[rows]
        else:
            want = GOLDEN[f"{case}/{name}"]
        assert grad.dtype == np.float32 and grad.shape == want.shape, name
        worst = np.abs(grad - want).max()
        assert worst <= 1e-5 * np.abs(want).max(), f"{name}: {worst:.3g} from torch's (largest {np.abs(want).max():.3g})"


def test_the_tied_wte_gets_its_gradient_from_both_the_gather_and_the_logits(models):
    """Exercise: why two? Without the gather's rows the gradient is only the head's, and wrong."""
    hp, params = models["odd"]
    ids, targets = GOLDEN["odd/ids"], GOLDEN["odd/targets"]
    _, grads = backward.loss_and_grads(ids, targets, params, hp)
    kept, top = backward.training_forward(ids, params, hp)
    probs = g.softmax(top["ln_f"] @ params["wte"].T) - np.eye(96, dtype=np.float32)[targets]  # p - onehot
    head_only = (probs / ids.size).reshape(-1, 96).T @ g.layer_norm(top["x"], **params["ln_f"]).reshape(-1, 48)
    untouched = np.setdiff1d(np.arange(96), ids)
    np.testing.assert_allclose(grads["wte"][untouched], head_only[untouched], rtol=1e-5, atol=1e-7)
    touched = np.unique(ids)
    assert np.abs(grads["wte"][touched] - head_only[touched]).max() > 1e-4  # the gather adds to these rows


def test_the_model_with_dropout_by_finite_differences(models):
    """Every dropout site (the embeddings, the attention weights, both branches) in the backward:
    the same seed gives the same masks, so the loss is a function of the weights alone."""
    hp, params = models["odd"]
    params = shapes.map_tensors(lambda a: np.array(a, np.float64), params)
    ids, targets = GOLDEN["odd/ids"][:, :6], GOLDEN["odd/targets"][:, :6]

    def loss():
        return backward.loss_and_grads(ids, targets, params, hp, 0.2, np.random.default_rng(3))[0]

    assert abs(loss() - backward.loss_and_grads(ids, targets, params, hp)[0]) > 1e-3  # it drops something
    _, grads = backward.loss_and_grads(ids, targets, params, hp, 0.2, np.random.default_rng(3))
    flat, flat_grads = shapes.flatten(params), shapes.flatten(grads)
    rng = np.random.default_rng(4)
    for name in ("wte", "wpe", "h0/ln_1/g", "h0/attn/c_attn/w", "h1/attn/c_proj/b", "h2/mlp/c_fc/w",
                 "h2/mlp/c_proj/w", "ln_f/b"):
        x = flat[name]
        for i in [tuple(rng.integers(0, n) for n in x.shape) for _ in range(4)] + [np.unravel_index(
                np.abs(flat_grads[name]).argmax(), x.shape)]:
            old = x[i]
            x[i] = old + 1e-6
            up = loss()
            x[i] = old - 1e-6
            down = loss()
            x[i] = old
            numeric = (up - down) / 2e-6
            assert abs(flat_grads[name][i] - numeric) <= 1e-6 * max(1.0, abs(numeric)), (
                f"{name}{list(map(int, i))}: {flat_grads[name][i]:.6g}, finite differences {numeric:.6g}. Each "
                "dropout's backward takes its own mask, dy · keep / (1 - p): the embeddings', both branches', and "
                "the attention weights' (attention_backward's keep and p_drop)")


def test_cross_entropy_fast_is_the_plain_loss_and_backward(monkeypatch):
    monkeypatch.setattr(backward, "LOGIT_ROWS", 4)  # chunks cut short, shared among the cores
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((3, 7, 50), dtype=np.float32) * 4
    targets = rng.integers(0, 50, (3, 7))
    want_loss, _ = backward.cross_entropy(logits, targets)
    want = backward.cross_entropy_backward(logits, targets)
    work = logits.reshape(-1, 50).copy()
    loss = backward.cross_entropy_fast(work, targets.reshape(-1))
    assert loss == pytest.approx(want_loss, rel=1e-6)
    np.testing.assert_allclose(work.reshape(want.shape), want, rtol=1e-5, atol=1e-8)


def test_reused_buffers_give_the_same_gradients(models):
    hp, params = models["odd"]
    ids, targets = GOLDEN["odd/ids"], GOLDEN["odd/targets"]
    buffers = {}
    backward.loss_and_grads(ids[::-1], targets[::-1], params, hp, buffers=buffers)  # fills the buffers
    loss, grads = backward.loss_and_grads(ids, targets, params, hp, buffers=buffers)
    assert np.shares_memory(grads["wte"], buffers["dwte"])
    fresh_loss, fresh = backward.loss_and_grads(ids, targets, params, hp)
    assert loss == fresh_loss
    assert all(np.array_equal(a, shapes.flatten(fresh)[k]) for k, a in shapes.flatten(grads).items())


def test_the_training_forward_is_the_model(models):
    hp, params = models["odd"]
    ids = GOLDEN["odd/ids"]
    kept, top = backward.training_forward(ids, params, hp)
    assert np.abs(top["ln_f"] @ params["wte"].T - g.gpt2(ids, params, hp)).max() <= 1e-5
    assert sorted(kept[0]) == sorted(backward.KEPT)
    np.testing.assert_array_equal(top["ln_f"], g.layer_norm(top["x"], **params["ln_f"]))


def test_the_backward_passes_each_gradient_through_a_hook_as_the_forward_passes_each_activation(models):
    """The backward's hooks mirror the forward's: the same names, each gradient the shape of its activation;
    and what a hook returns goes on (a gradient stopped at block 1's input leaves block 0 and the embeddings
    none, and changes no gradient after it). (Their values: tests/test_circuits.py.)"""
    hp, params = models["odd"]
    ids = GOLDEN["odd/ids"][:, :5]
    forward = {}

    def record(name, x):
        forward[name] = x.shape
        return x

    g.gpt2_hidden(ids, params, hp, hook=record)
    dlogits = r64(*ids.shape, 96, seed=50).astype(np.float32)
    seen = {}
    backward.activation_grads(ids, params, hp, dlogits, lambda name, d: seen.setdefault(name, d))
    assert {n: d.shape for n, d in seen.items()} == forward
    stopped = {}

    def stop(name, d):
        stopped[name] = np.zeros_like(d) if name == "h1.resid_pre" else d
        return stopped[name]

    backward.activation_grads(ids, params, hp, dlogits, stop)
    for name, d in stopped.items():
        if shapes.block_index(name) in (None, 0) and name != "ln_f":
            assert not d.any(), name
        elif name != "h1.resid_pre":
            np.testing.assert_array_equal(d, seen[name], err_msg=name)
