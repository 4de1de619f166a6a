"""optimizer.py: AdamW against torch.optim.AdamW's losses, the plain update against the fast one,
clipping and the schedule."""
import math

import numpy as np
import pytest

import backward
from conftest import GRAD_GOLDEN as GOLDEN
import optimizer
from train import writable_copy
from plumbing import shapes


@pytest.mark.parametrize("case, name", [("adamw_odd", "odd"), ("adamw_tiny", "tiny")])
def test_ten_adamw_steps_give_torchs_losses(models, case, name):
    """As llm.c's test_gpt2: one batch, ten steps (lr 1e-3, weight decay 0.1 on matrices and
    embeddings, gradients clipped to norm 1), every loss against torch.optim.AdamW's."""
    hp, params = models[name]
    params = writable_copy(params)
    state = optimizer.new_adamw_state(params)
    ids, targets = GOLDEN[f"{case}/ids"], GOLDEN[f"{case}/targets"]
    losses = []
    for _ in range(10):
        loss, grads = backward.loss_and_grads(ids, targets, params, hp)
        optimizer.clip_grad_norm(grads, 1.0)
        optimizer.adamw_step(params, grads, state, lr=1e-3, weight_decay=0.1)
        losses.append(loss)
    want = GOLDEN[f"{case}/losses"]
    assert np.abs(np.array(losses) - want).max() <= 1e-5, list(zip(losses, want))
    assert losses[-1] < losses[0] - 0.1  # it learns


def test_adamw_update_is_the_equations(monkeypatch):
    """One tensor, three steps, against the update written out in float64 as torch.optim.AdamW
    does it: decay first, then the moments, then the step with the bias corrections."""
    rng = np.random.default_rng(7)
    p64, m64, v64 = rng.standard_normal(50), np.zeros(50), np.zeros(50)
    p, m, v = p64.astype(np.float32), np.zeros(50, np.float32), np.zeros(50, np.float32)
    lr, wd, b1, b2, eps = 1e-2, 0.1, 0.9, 0.95, 1e-8
    for t in (1, 2, 3):
        grad = rng.standard_normal(50)
        p64 *= 1 - lr * wd
        m64 = b1 * m64 + (1 - b1) * grad
        v64 = b2 * v64 + (1 - b2) * grad ** 2
        p64 -= lr * (m64 / (1 - b1 ** t)) / (np.sqrt(v64 / (1 - b2 ** t)) + eps)
        optimizer.adamw_update(p, grad.astype(np.float32), m, v, t, lr, wd, b1, b2, eps)
        assert p.dtype == m.dtype == v.dtype == np.float32
        np.testing.assert_allclose(m, m64, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(v, v64, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(p, p64, rtol=1e-5, atol=1e-6)


def test_the_fast_adamw_is_the_plain_one(models, monkeypatch):
    """The same update in another order of operations: equal to float32's rounding."""
    monkeypatch.setattr(optimizer, "CHUNK", 1000)  # many chunks, some cut short, even on the small model
    hp, params = models["odd"]
    a, b = writable_copy(params), writable_copy(params)
    sa, sb = optimizer.new_adamw_state(a), optimizer.new_adamw_state(b)
    for step in range(3):
        _, grads = backward.loss_and_grads(GOLDEN["odd/ids"], GOLDEN["odd/targets"], a, hp)
        optimizer.adamw_step(a, grads, sa, 1e-3, weight_decay=0.1)
        optimizer.adamw_step_fast(b, grads, sb, 1e-3, weight_decay=0.1)
    fa, fb = shapes.flatten(a), shapes.flatten(b)
    assert sa["step"] == sb["step"] == 3
    for k in fa:
        assert not np.array_equal(fa[k], shapes.flatten(params)[k]), k  # every tensor moved
        np.testing.assert_allclose(fb[k], fa[k], rtol=1e-6, atol=1e-7, err_msg=k)
        np.testing.assert_array_equal(sb["m"][k], sa["m"][k], err_msg=k)
        np.testing.assert_allclose(sb["v"][k], sa["v"][k], rtol=1e-6, atol=0, err_msg=k)


def test_clipping_folded_into_the_fast_adamw_is_clip_then_adamw_bit_for_bit(models, monkeypatch):
    monkeypatch.setattr(optimizer, "CHUNK", 1000)
    hp, params = models["odd"]
    a, b = writable_copy(params), writable_copy(params)
    sa, sb = optimizer.new_adamw_state(a), optimizer.new_adamw_state(b)
    _, grads = backward.loss_and_grads(GOLDEN["odd/ids"], GOLDEN["odd/targets"], a, hp)
    scale = optimizer.clip_scale(optimizer.grad_norm(grads), 0.1)
    assert scale < 0.5  # it clips
    optimizer.adamw_step_fast(b, grads, sb, 1e-3, weight_decay=0.1, grad_scale=scale)
    optimizer.clip_grad_norm(grads, 0.1)
    optimizer.adamw_step_fast(a, grads, sa, 1e-3, weight_decay=0.1)
    fa, fb = shapes.flatten(a), shapes.flatten(b)
    assert all(np.array_equal(fa[k], fb[k]) and np.array_equal(sa["v"][k], sb["v"][k]) for k in fa)


def test_adamw_decays_matrices_and_embeddings_only():
    params = {"wte": np.ones((3, 2), np.float32), "wpe": np.ones((2, 2), np.float32), "blocks": [],
              "ln_f": {"g": np.ones(2, np.float32), "b": np.ones(2, np.float32)}}
    zero = {"wte": np.zeros((3, 2), np.float32), "wpe": np.zeros((2, 2), np.float32), "blocks": [],
            "ln_f": {"g": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)}}
    optimizer.adamw_step(params, zero, optimizer.new_adamw_state(params), lr=0.1, weight_decay=0.5)
    assert np.allclose(params["wte"], 0.95) and np.allclose(params["wpe"], 0.95)
    assert np.all(params["ln_f"]["g"] == 1) and np.all(params["ln_f"]["b"] == 1)


def test_clipping_by_the_global_norm():
    grads = {"wte": np.full((2, 2), 3.0, np.float32), "wpe": np.zeros((1, 2), np.float32), "blocks": [],
             "ln_f": {"g": np.full(1, 4.0, np.float32), "b": np.zeros(1, np.float32)}}
    assert optimizer.clip_grad_norm(grads, 100.0) == pytest.approx(math.sqrt(4 * 9 + 16))
    assert grads["wte"][0, 0] == 3.0  # under the bound: untouched
    assert optimizer.clip_grad_norm(grads, 1.0) == pytest.approx(math.sqrt(4 * 9 + 16))  # the norm before clipping
    assert math.sqrt(float((grads["wte"] ** 2).sum() + (grads["ln_f"]["g"] ** 2).sum())) == pytest.approx(1.0, rel=1e-5)


def test_warmup_then_cosine_decay():
    lr = [optimizer.learning_rate(s, 1.0, warmup=4, total=14, min_lr=0.1) for s in range(16)]
    assert lr[:4] == [0.25, 0.5, 0.75, 1.0] and lr[4] == 1.0
    assert lr[9] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert lr[14] == pytest.approx(0.1) and lr[15] == pytest.approx(0.1)
