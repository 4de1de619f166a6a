"""train.py: each block's backward against float64 finite differences, then every parameter's
gradient against torch autograd on GPT2LMHeadModel (tests/data/grad_golden.npz)."""
import json
import math
import os

import numpy as np
import pytest

import gpt2_numpy as g
import shapes
import train
from checkpoint import load_checkpoint
from conftest import DATA, checkpoint_dir

GOLDEN = np.load(os.path.join(DATA, "grad_golden.npz"))
CASES = {"odd": "odd", "odd_full": "odd", "tiny": "tiny"}


def r64(*shape, seed=0, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


def numerical_grad(f, x, eps=1e-6):
    """d f / d x by central differences, one element at a time (float64)."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


def check(analytic, f, x, name):
    numeric = numerical_grad(f, x)
    worst = np.abs(analytic - numeric).max()
    assert worst <= 1e-6 * max(1.0, np.abs(numeric).max()), f"{name}: differs from finite differences by {worst:.3g}"


# --- each block, by finite differences (float64) ---------------------------------------------

def test_gelu_backward_by_finite_differences():
    x, w = r64(20, seed=1, scale=3), r64(20, seed=2)
    check(train.gelu_backward(x, w), lambda: (g.gelu(x) * w).sum(), x, "gelu_backward")


def test_gelu_backward_no_temporaries_is_gelu_backward():
    x = np.random.default_rng(1).standard_normal((4, 7, 30), dtype=np.float32) * 3
    dy = np.random.default_rng(2).standard_normal((4, 7, 30), dtype=np.float32)
    fast = train.gelu_backward_no_temporaries(x, dy)
    assert fast.dtype == np.float32
    np.testing.assert_allclose(fast, train.gelu_backward(x, dy), rtol=1e-5, atol=1e-6)


def test_in_chunks_on_all_the_cores_is_the_same_function(monkeypatch):
    monkeypatch.setattr(train, "CHUNK", 100)  # 28 rows of 30: three rows a chunk, the last chunk cut short
    x = np.random.default_rng(3).standard_normal((4, 7, 30), dtype=np.float32)
    dy = np.random.default_rng(4).standard_normal((4, 7, 30), dtype=np.float32)
    got = train.in_chunks(train.gelu_backward_no_temporaries, x, dy)
    assert got.shape == x.shape and np.array_equal(got, train.gelu_backward_no_temporaries(x, dy))
    y = g.softmax(x)  # and a function of whole rows
    assert np.array_equal(train.in_chunks(train.softmax_backward, y, dy), train.softmax_backward(y, dy))


def test_dropout_keeps_the_mean_and_zeroes_about_p():
    y, keep = train.dropout(np.ones(200_000, np.float32), 0.1, np.random.default_rng(0))
    assert y.dtype == np.float32 and abs(keep.mean() - 0.9) < 0.005
    assert set(np.unique(y).tolist()) == {0.0, np.float32(1 / 0.9)} and abs(y.mean() - 1) < 0.01


def test_dropout_backward_by_finite_differences():
    x, w = r64(3, 8, seed=40), r64(3, 8, seed=41)
    _, keep = train.dropout(x, 0.3, np.random.default_rng(42))
    f = lambda: (train.dropout(x, 0.3, np.random.default_rng(42))[0] * w).sum()  # noqa: E731
    assert 0 < keep.sum() < keep.size
    check(train.dropout_backward(keep, 0.3, w), f, x, "dropout_backward")


def test_softmax_backward_by_finite_differences():
    x, w = r64(3, 7, seed=3), r64(3, 7, seed=4)
    check(train.softmax_backward(g.softmax(x), w), lambda: (g.softmax(x) * w).sum(), x, "softmax_backward")


def test_layer_norm_backward_by_finite_differences():
    x, gain, bias, w = r64(2, 3, 10, seed=5, scale=2), r64(10, seed=6), r64(10, seed=7), r64(2, 3, 10, seed=8)
    dx, dg, db = train.layer_norm_backward(x, gain, w)
    f = lambda: (g.layer_norm(x, gain, bias) * w).sum()  # noqa: E731
    check(dx, f, x, "layer_norm_backward dx")
    check(dg, f, gain, "layer_norm_backward dg")
    check(db, f, bias, "layer_norm_backward db")


def test_linear_backward_by_finite_differences():
    x, w, b, dy = r64(2, 3, 4, seed=9), r64(4, 5, seed=10), r64(5, seed=11), r64(2, 3, 5, seed=12)
    dx, dw, db = train.linear_backward(x, w, dy)
    f = lambda: (g.linear(x, w, b) * dy).sum()  # noqa: E731
    check(dx, f, x, "dx")
    check(dw, f, w, "dw")
    check(db, f, b, "db")


def test_attention_backward_with_its_mask_by_finite_differences():
    q, k, v, dz = (r64(1, 2, 5, 3, seed=s) for s in (13, 14, 15, 16))
    weights = g.attention_weights(q, k)
    assert np.all(np.triu(weights[0, 0], 1) == 0)  # the mask: no weight on the future
    dq, dk, dv = train.attention_backward(q, k, v, weights, dz)
    f = lambda: (g.attention(q, k, v) * dz).sum()  # noqa: E731
    check(dq, f, q, "dq")
    check(dk, f, k, "dk")
    check(dv, f, v, "dv")


def test_attention_backward_with_dropped_weights_by_finite_differences():
    q, k, v, dz = (r64(1, 2, 5, 3, seed=s) for s in (43, 44, 45, 46))
    keep = np.random.default_rng(47).random((1, 2, 5, 5)) >= 0.3
    dq, dk, dv = train.attention_backward(q, k, v, g.attention_weights(q, k), dz, keep, 0.3)
    f = lambda: ((g.attention_weights(q, k) * keep / 0.7) @ v * dz).sum()  # noqa: E731
    check(dq, f, q, "dq")
    check(dk, f, k, "dk")
    check(dv, f, v, "dv")


def block_params(seed, C=6, F=24):
    def layer(n_in, n_out, s):
        return {"w": r64(n_in, n_out, seed=s, scale=0.5), "b": r64(n_out, seed=s + 1, scale=0.3)}

    return {"ln_1": {"g": 1 + r64(C, seed=seed), "b": r64(C, seed=seed + 1)},
            "attn": {"c_attn": layer(C, 3 * C, seed + 2), "c_proj": layer(C, C, seed + 4)},
            "ln_2": {"g": 1 + r64(C, seed=seed + 6), "b": r64(C, seed=seed + 7)},
            "mlp": {"c_fc": layer(C, F, seed + 8), "c_proj": layer(F, C, seed + 10)}}


def kept_of(x, block, n_head):
    kept = {}
    y = g.transformer_block(x, **block, n_head=n_head, hook=lambda name, a: kept.setdefault(name, a))
    return y, kept


def test_ffn_and_block_backward_by_finite_differences():
    x, dy, block = r64(2, 4, 6, seed=20), r64(2, 4, 6, seed=21), block_params(30)
    _, kept = kept_of(x, block, 2)
    dx, grads = train.block_backward(kept, **block, n_head=2, dy=dy)
    f = lambda: (g.transformer_block(x, **block, n_head=2) * dy).sum()  # noqa: E731
    check(dx, f, x, "block_backward dx")
    for name in ("ln_1/g", "attn/c_attn/w", "attn/c_attn/b", "attn/c_proj/w", "ln_2/b", "mlp/c_fc/w", "mlp/c_proj/b"):
        *path, last = name.split("/")
        node, grad = block, grads
        for p in path:
            node, grad = node[p], grad[p]
        check(grad[last], f, node[last], f"block_backward {name}")


# --- the whole model against torch autograd -----------------------------------------------

@pytest.fixture(scope="module")
def models():
    out = {}
    for name in ("tiny", "odd"):
        hp, params = load_checkpoint(checkpoint_dir(name))
        out[name] = hp, params
    return out


@pytest.mark.parametrize("case", CASES)
def test_every_gradient_matches_torch(models, case):
    hp, params = models[CASES[case]]
    loss, grads = train.loss_and_grads(GOLDEN[f"{case}/ids"], GOLDEN[f"{case}/targets"], params, hp["n_head"])
    assert abs(loss - float(GOLDEN[f"{case}/loss"])) <= 1e-5
    flat = shapes.flatten(grads)
    for name, grad in flat.items():
        if name == "wte":
            rows = GOLDEN[f"{case}/wte/rows"]
            want = GOLDEN[f"{case}/wte/grad_rows"]
            assert abs(np.linalg.norm(grad) - float(GOLDEN[f"{case}/wte/norm"])) <= 1e-5 * float(GOLDEN[f"{case}/wte/norm"])
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
    _, grads = train.loss_and_grads(ids, targets, params, hp["n_head"])
    kept, top = train.training_forward(ids, params, hp["n_head"])
    probs = g.softmax(top["ln_f"] @ params["wte"].T)
    np.put_along_axis(probs, targets[..., None], np.take_along_axis(probs, targets[..., None], -1) - 1, -1)
    head_only = (probs / ids.size).reshape(-1, 96).T @ g.layer_norm(top["x"], **params["ln_f"]).reshape(-1, 48)
    untouched = np.setdiff1d(np.arange(96), ids)
    np.testing.assert_allclose(grads["wte"][untouched], head_only[untouched], rtol=1e-5, atol=1e-7)
    touched = np.unique(ids)
    assert np.abs(grads["wte"][touched] - head_only[touched]).max() > 1e-4  # the gather adds to these rows


def as_float64(params):
    if isinstance(params, dict):
        return {k: as_float64(v) for k, v in params.items()}
    if isinstance(params, list):
        return [as_float64(v) for v in params]
    return np.array(params, np.float64) if hasattr(params, "shape") else params


def test_the_model_with_dropout_by_finite_differences(models):
    """Every dropout site (the embeddings, the attention weights, both branches) in the backward:
    the same seed gives the same masks, so the loss is a function of the weights alone."""
    hp, params = models["odd"]
    params = as_float64(params)
    ids, targets = GOLDEN["odd/ids"][:, :6], GOLDEN["odd/targets"][:, :6]

    def loss():
        return train.loss_and_grads(ids, targets, params, hp["n_head"], 0.2, np.random.default_rng(3))[0]

    assert abs(loss() - train.loss_and_grads(ids, targets, params, hp["n_head"])[0]) > 1e-3  # it drops something
    _, grads = train.loss_and_grads(ids, targets, params, hp["n_head"], 0.2, np.random.default_rng(3))
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
            assert abs(flat_grads[name][i] - numeric) <= 1e-6 * max(1.0, abs(numeric)), (name, i)


def test_cross_entropy_in_place_is_the_plain_loss_and_backward(monkeypatch):
    monkeypatch.setattr(train, "ROWS", 4)  # chunks cut short, shared among the cores
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((3, 7, 50), dtype=np.float32) * 4
    targets = rng.integers(0, 50, (3, 7))
    want_loss, _ = train.cross_entropy(logits, targets)
    want = train.cross_entropy_backward(logits, targets)
    work = logits.reshape(-1, 50).copy()
    loss = train.cross_entropy_in_place(work, targets.reshape(-1))
    assert loss == pytest.approx(want_loss, rel=1e-6)
    np.testing.assert_allclose(work.reshape(want.shape), want, rtol=1e-5, atol=1e-8)


def test_reused_buffers_give_the_same_gradients_and_accumulation_copies_them(models):
    hp, params = models["odd"]
    ids, targets = GOLDEN["odd/ids"], GOLDEN["odd/targets"]
    buffers = {}
    train.loss_and_grads(ids[::-1], targets[::-1], params, hp["n_head"], buffers=buffers)  # fills the buffers
    loss, grads = train.loss_and_grads(ids, targets, params, hp["n_head"], buffers=buffers)
    assert np.shares_memory(grads["wte"], buffers["dwte"])
    fresh_loss, fresh = train.loss_and_grads(ids, targets, params, hp["n_head"])
    assert loss == fresh_loss
    assert all(np.array_equal(a, shapes.flatten(fresh)[k]) for k, a in shapes.flatten(grads).items())
    total = train.accumulate(None, grads)
    assert not np.shares_memory(total["wte"], grads["wte"]) and np.array_equal(total["wte"], grads["wte"])


def test_a_step_accumulating_two_micro_batches_in_reused_buffers(models):
    """train_step with --accum 2: the mean of the two micro-batches' gradients, clipped, then
    AdamW, although both micro-batches write their wte gradient into the same buffer."""
    import argparse
    hp, params = models["odd"]
    args = argparse.Namespace(seed=3, accum=2, batch_size=2, context=8, dropout=0.0, grad_clip=0.5, lr=1e-3,
                              warmup=0, steps=10, min_lr_ratio=0.1, weight_decay=0.1)
    ids = np.random.default_rng(0).integers(0, hp["n_vocab"], 200)
    a, b = train.trainable(params), train.trainable(params)
    sa, sb = train.new_adamw_state(a), train.new_adamw_state(b)
    loss = train.train_step(a, hp, sa, ids, 4, args, buffers={})
    rng = np.random.default_rng([3, 4])
    runs = [train.loss_and_grads(*train.batch(ids, 2, 8, rng), b, hp["n_head"]) for _ in range(2)]
    mean = {k: (x + shapes.flatten(runs[1][1])[k]) / 2 for k, x in shapes.flatten(runs[0][1]).items()}
    grads = train.trainable(shapes.nest(mean, hp["n_layer"]))
    train.clip_grad_norm(grads, 0.5)
    train.adamw_step(b, grads, sb, train.learning_rate(4, 1e-3, 0, 10, 1e-4), weight_decay=0.1)
    assert loss == pytest.approx((runs[0][0] + runs[1][0]) / 2, rel=1e-6)
    fa, fb = shapes.flatten(a), shapes.flatten(b)
    assert all(np.allclose(fa[k], fb[k], rtol=0, atol=1e-7) for k in fa)
    assert not np.array_equal(fa["wte"], shapes.flatten(params)["wte"])


def test_the_training_forward_is_the_model(models):
    hp, params = models["odd"]
    ids = GOLDEN["odd/ids"]
    kept, top = train.training_forward(ids, params, hp["n_head"])
    assert np.abs(top["ln_f"] @ params["wte"].T - g.gpt2(ids, params, hp["n_head"])).max() <= 1e-5
    assert sorted(kept[0]) == sorted(train.KEPT)
    np.testing.assert_array_equal(top["ln_f"], g.layer_norm(top["x"], **params["ln_f"]))


# --- the optimizer ---------------------------------------------------------------------------

@pytest.mark.parametrize("case, name", [("adamw_odd", "odd"), ("adamw_tiny", "tiny")])
def test_ten_adamw_steps_give_torchs_losses(models, case, name):
    """As llm.c's test_gpt2: one batch, ten steps (lr 1e-3, weight decay 0.1 on matrices and
    embeddings, gradients clipped to norm 1), every loss against torch.optim.AdamW's."""
    hp, params = models[name]
    params = train.trainable(params)
    state = train.new_adamw_state(params)
    ids, targets = GOLDEN[f"{case}/ids"], GOLDEN[f"{case}/targets"]
    losses = []
    for _ in range(10):
        loss, grads = train.loss_and_grads(ids, targets, params, hp["n_head"])
        train.clip_grad_norm(grads, 1.0)
        train.adamw_step(params, grads, state, lr=1e-3, weight_decay=0.1)
        losses.append(loss)
    want = GOLDEN[f"{case}/losses"]
    assert np.abs(np.array(losses) - want).max() <= 1e-5, list(zip(losses, want))
    assert losses[-1] < losses[0] - 0.1  # it learns


def test_a_trainable_copy_is_writable_and_keeps_each_layer_norms_eps():
    import hf_model
    _, params, _ = hf_model.load_hf_folder(os.path.join(DATA, "hf", "inner"))
    copy = train.trainable(params)
    assert copy["ln_f"]["eps"] == 1e-3 and copy["blocks"][2]["ln_2"]["eps"] == 1e-3
    assert copy["wte"].flags.writeable and not np.shares_memory(copy["wte"], params["wte"])
    assert np.array_equal(copy["wte"], params["wte"])


def test_the_fast_adamw_is_the_plain_one_bit_for_bit(models, monkeypatch):
    monkeypatch.setattr(train, "CHUNK", 1000)  # many chunks, some cut short, even on the small model
    hp, params = models["odd"]
    a, b = train.trainable(params), train.trainable(params)
    sa, sb = train.new_adamw_state(a), train.new_adamw_state(b)
    for step in range(3):
        _, grads = train.loss_and_grads(GOLDEN["odd/ids"], GOLDEN["odd/targets"], a, hp["n_head"])
        train.adamw_step(a, grads, sa, 1e-3, weight_decay=0.1)
        train.adamw_step_fast(b, grads, sb, 1e-3, weight_decay=0.1)
    fa, fb = shapes.flatten(a), shapes.flatten(b)
    assert all(np.array_equal(fa[k], fb[k]) and np.array_equal(sa["m"][k], sb["m"][k]) and
               np.array_equal(sa["v"][k], sb["v"][k]) for k in fa) and sa["step"] == sb["step"] == 3


def test_clipping_folded_into_the_fast_adamw_is_clip_then_adamw_bit_for_bit(models, monkeypatch):
    monkeypatch.setattr(train, "CHUNK", 1000)
    hp, params = models["odd"]
    a, b = train.trainable(params), train.trainable(params)
    sa, sb = train.new_adamw_state(a), train.new_adamw_state(b)
    _, grads = train.loss_and_grads(GOLDEN["odd/ids"], GOLDEN["odd/targets"], a, hp["n_head"])
    scale = train.clip_scale(train.grad_norm(grads), 0.1)
    assert scale < 0.5  # it clips
    train.adamw_step_fast(b, grads, sb, 1e-3, weight_decay=0.1, grad_scale=scale)
    train.clip_grad_norm(grads, 0.1)
    train.adamw_step(a, grads, sa, 1e-3, weight_decay=0.1)
    fa, fb = shapes.flatten(a), shapes.flatten(b)
    assert all(np.array_equal(fa[k], fb[k]) and np.array_equal(sa["v"][k], sb["v"][k]) for k in fa)


def test_adamw_decays_matrices_and_embeddings_only():
    params = {"wte": np.ones((3, 2), np.float32), "wpe": np.ones((2, 2), np.float32), "blocks": [],
              "ln_f": {"g": np.ones(2, np.float32), "b": np.ones(2, np.float32)}}
    zero = {"wte": np.zeros((3, 2), np.float32), "wpe": np.zeros((2, 2), np.float32), "blocks": [],
            "ln_f": {"g": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)}}
    train.adamw_step(params, zero, train.new_adamw_state(params), lr=0.1, weight_decay=0.5)
    assert np.allclose(params["wte"], 0.95) and np.allclose(params["wpe"], 0.95)
    assert np.all(params["ln_f"]["g"] == 1) and np.all(params["ln_f"]["b"] == 1)


def test_clipping_by_the_global_norm():
    grads = {"wte": np.full((2, 2), 3.0, np.float32), "wpe": np.zeros((1, 2), np.float32), "blocks": [],
             "ln_f": {"g": np.full(1, 4.0, np.float32), "b": np.zeros(1, np.float32)}}
    assert train.clip_grad_norm(grads, 100.0) == pytest.approx(math.sqrt(4 * 9 + 16))
    assert grads["wte"][0, 0] == 3.0  # under the bound: untouched
    train.clip_grad_norm(grads, 1.0)
    assert math.sqrt(float((grads["wte"] ** 2).sum() + (grads["ln_f"]["g"] ** 2).sum())) == pytest.approx(1.0, rel=1e-5)


def test_warmup_then_cosine_decay():
    lr = [train.learning_rate(s, 1.0, warmup=4, total=14, min_lr=0.1) for s in range(16)]
    assert lr[:4] == [0.25, 0.5, 0.75, 1.0] and lr[4] == 1.0
    assert lr[9] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert lr[14] == pytest.approx(0.1) and lr[15] == pytest.approx(0.1)


# --- the command line ------------------------------------------------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402

from conftest import ROOT, model_folder_copy  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat and the dog ran to the park while birds sang in tall green trees".split()
    (folder / "notes.txt").write_text(" ".join(rng.choice(words, 2000)), encoding="utf-8")
    return folder / "notes.txt"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return model_folder_copy("tiny", str(tmp_path_factory.mktemp("m") / "tiny"))


def train_args(model, data, out, *more):
    return ["--model", model, "--data", str(data), "--out", str(out), "--steps", "12", "--batch-size", "2",
            "--context", "16", "--warmup", "3", "--lr", "3e-3", "--eval-every", "6", "--sample-every", "12",
            "--save-every", "6", "--quiet", *more]


def run_train(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], capture_output=True, text=True,
                          timeout=300)


def test_fine_tuning_end_to_end_then_generating_from_it(tiny_model, corpus, tmp_path):
    out = tmp_path / "notes-tiny"
    r = run_train(*train_args(tiny_model, corpus, out))
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if "validation loss" in line]
    assert len(lines) == 2 and "step 12 sample:" in r.stdout
    assert sorted(os.listdir(out)) == ["checkpoint", "encoder.json", "hparams.json", "model.ckpt.data-00000-of-00001",
                                       "model.ckpt.index", "train_config.json", "train_state.npz", "vocab.bpe"]
    g2 = subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), "--model", str(out), "the cat",
                         "--n-tokens", "5", "--quiet"], capture_output=True, text=True)
    assert g2.returncode == 0 and g2.stdout.startswith("the cat")
    _, before = load_checkpoint(tiny_model)
    _, after = load_checkpoint(str(out))
    assert not np.array_equal(before["wte"], after["wte"])  # it trained


@pytest.mark.parametrize("dropout", ["0", "0.1"])
def test_the_same_seed_gives_the_same_run_bit_for_bit(tiny_model, corpus, tmp_path, dropout):
    for name in ("a", "b"):
        assert run_train(*train_args(tiny_model, corpus, tmp_path / name, "--dropout", dropout)).returncode == 0
    for f in ("model.ckpt.data-00000-of-00001", "train_state.npz"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    config = json.loads((tmp_path / "a" / "train_config.json").read_text())
    assert config["dropout"] == float(dropout)


def test_bad_flags_are_one_line(tiny_model, corpus, tmp_path):
    for flag, message in [(("--dropout", "1"), "--dropout must be in [0, 1)"),
                          (("--val-fraction", "-0.1"), "--val-fraction must be in [0, 1)"),
                          (("--accum", "0"), "--accum must be at least 1")]:
        r = run_train(*train_args(tiny_model, corpus, tmp_path / "o", *flag))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
        assert not os.path.exists(tmp_path / "o")


def test_ctrl_c_saves_and_resume_continues_the_same_run(tiny_model, corpus, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    train.main(train_args(tiny_model, corpus, straight))
    calls = {"n": 0}
    norm = train.grad_norm

    def interrupted_at_step_8(grads):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return norm(grads)

    monkeypatch.setattr(train, "grad_norm", interrupted_at_step_8)
    stopped = tmp_path / "stopped"
    assert train.main(train_args(tiny_model, corpus, stopped)) == 130
    assert train.load_state(str(stopped), train.trainable(load_checkpoint(str(stopped))[1]))["step"] == 7
    monkeypatch.setattr(train, "grad_norm", norm)
    assert train.main(train_args(tiny_model, corpus, stopped, "--resume")) == 0
    for f in ("model.ckpt.data-00000-of-00001", "train_state.npz"):
        assert (stopped / f).read_bytes() == (straight / f).read_bytes(), f


def test_bad_input_is_one_line_and_nothing_is_written(tiny_model, tmp_path):
    empty, latin, short = tmp_path / "empty.txt", tmp_path / "latin.txt", tmp_path / "short.txt"
    empty.write_text("  \n")
    latin.write_bytes("café".encode("latin-1"))
    short.write_text("the cat sat")
    (tmp_path / "a file").write_text("x")
    for data, out, model, message in [
            (empty, tmp_path / "o1", tiny_model, "is empty"),
            (latin, tmp_path / "o2", tiny_model, "is not UTF-8 text"),
            (short, tmp_path / "o3", tiny_model, "too short for a context of 16"),
            (short, tmp_path / "a file" / "o4", tiny_model, "cannot be written here"),
            (short, tmp_path / "o5", "1558M", "are free: use a smaller model, batch or context")]:
        r = run_train(*train_args(model, data, out))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
        assert not os.path.exists(out)
    assert sorted(os.listdir(tmp_path)) == ["a file", "empty.txt", "latin.txt", "short.txt"]


def test_1558m_does_not_fit_in_24_gb():
    need = train.memory_needed(shapes.hparams("1558M"), 1, 64)
    assert need > 24e9 and train.memory_needed(shapes.hparams("124M"), 4, 64) < 2.5e9
