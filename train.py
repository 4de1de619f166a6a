"""Fine-tuning GPT-2 in NumPy: the backward pass, written by hand in the forward's order.

gpt2_numpy.py is the forward textbook; this file is its mirror. Each forward function has a
backward here, with its derivative in one line and the shapes of its arrays:

    forward (gpt2_numpy.py)        backward (here)
    gelu                           gelu_backward
    softmax                        softmax_backward
    layer_norm                     layer_norm_backward
    linear                         linear_backward
    ffn                            ffn_backward
    attention (with its mask)      attention_backward
    mha                            mha_backward
    transformer_block              block_backward
    gpt2 + cross-entropy           loss_and_grads

The training forward is gpt2() itself, run with a hook that keeps exactly the activations
the backward reads (KEPT); nothing else of the forward pass is written again here.
"""
import math

import numpy as np

import gpt2_numpy as g
import shapes

KEPT = ("resid_pre", "ln_1", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.z", "resid_mid", "ln_2",
        "mlp.c_fc", "mlp.gelu")  # per block; and the last block's output, ln_f's input


# ============================================================================
# 1. Building blocks
# ============================================================================

def gelu_backward(x, dy):
    """d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t²) √(2/π) (1 + 3·0.044715 x²),  t = tanh(√(2/π)(x + 0.044715 x³))
    x, dy [...] -> dx [...]"""
    t = np.tanh(g.SQRT_2_OVER_PI * (x + g.GELU_CUBIC * x ** 3))
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * g.SQRT_2_OVER_PI * (1.0 + 3.0 * g.GELU_CUBIC * x * x))


def softmax_backward(y, dy):
    """y = softmax(x): dx_i = y_i (dy_i - Σ_j dy_j y_j), over the last axis.   y, dy [..., N] -> dx [..., N]
    Where y is 0 (a masked score), dx is 0: nothing flows into the future."""
    return y * (dy - (dy * y).sum(axis=-1, keepdims=True))


def layer_norm_backward(x, g_, dy, eps=1e-5):
    """y = x̂ g + b, x̂ = (x - mean) / √(var + eps):
    dg = Σ dy x̂,  db = Σ dy,  dx = (dx̂ - mean(dx̂) - x̂ mean(dx̂ x̂)) / √(var + eps),  dx̂ = dy g
    x, dy [..., C], g [C] -> dx [..., C], dg [C], db [C]"""
    centred = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    xhat = centred * rstd
    dxhat = dy * g_
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    axes = tuple(range(dy.ndim - 1))
    return dx, (dy * xhat).sum(axis=axes), dy.sum(axis=axes)


def linear_backward(x, w, dy):
    """y = x w + b:  dx = dy wᵀ,  dw = Σ xᵀ dy (over every position),  db = Σ dy
    x [..., n_in], w [n_in, n_out], dy [..., n_out] -> dx [..., n_in], dw [n_in, n_out], db [n_out]"""
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return dy @ w.T, x2.T @ dy2, dy2.sum(axis=0)


def ffn_backward(x, h, a, c_fc, c_proj, dy):
    """c_proj(gelu(c_fc(x))) backwards: c_proj, then gelu, then c_fc. h = c_fc(x), a = gelu(h).
    x, dy [B, T, C], h, a [B, T, 4C] -> dx [B, T, C], grads {c_fc, c_proj}"""
    da, dw_proj, db_proj = linear_backward(a, c_proj["w"], dy)
    dx, dw_fc, db_fc = linear_backward(x, c_fc["w"], gelu_backward(h, da))
    return dx, {"c_fc": {"w": dw_fc, "b": db_fc}, "c_proj": {"w": dw_proj, "b": db_proj}}


# ============================================================================
# 2. Attention
# ============================================================================

def attention_backward(q, k, v, weights, dz):
    """z = weights v, weights = softmax(q kᵀ/√D + mask):
    dv = weightsᵀ dz,  dweights = dz vᵀ,  dscores = softmax_backward,  dq = dscores k/√D,  dk = dscoresᵀ q/√D
    q [B, H, T, D], weights [B, H, T, T], dz [B, H, T, D] -> dq, dk, dv [B, H, T, D]"""
    scale = 1.0 / math.sqrt(q.shape[-1])
    dv = weights.swapaxes(-1, -2) @ dz
    dscores = softmax_backward(weights, dz @ v.swapaxes(-1, -2))
    return dscores @ k * scale, dscores.swapaxes(-1, -2) @ q * scale, dv


def mha_backward(kept, c_attn, c_proj, n_head, dy):
    """c_proj, merge heads, attention, split heads, c_attn, backwards.   dy [B, T, C] -> dx [B, T, C], grads"""
    dz_merged, dw, db = linear_backward(g.merge_heads(kept["attn.z"]), c_proj["w"], dy)
    dq, dk, dv = attention_backward(kept["attn.q"], kept["attn.k"], kept["attn.v"], kept["attn.weights"],
                                    g.split_heads(dz_merged, n_head))
    dqkv = np.concatenate([g.merge_heads(d) for d in (dq, dk, dv)], axis=-1)  # [B, T, 3C], as c_attn made them
    dx, dw_attn, db_attn = linear_backward(kept["ln_1"], c_attn["w"], dqkv)
    return dx, {"c_attn": {"w": dw_attn, "b": db_attn}, "c_proj": {"w": dw, "b": db}}


# ============================================================================
# 3. The block and the model
# ============================================================================

def block_backward(kept, ln_1, attn, ln_2, mlp, n_head, dy):
    """x + mha(ln_1(x)), then + ffn(ln_2(x)), backwards: each residual passes dy straight through
    and adds what flows back through its branch.   dy [B, T, C] -> dx [B, T, C], grads"""
    dln2, mlp_grads = ffn_backward(kept["ln_2"], kept["mlp.c_fc"], kept["mlp.gelu"], mlp["c_fc"], mlp["c_proj"], dy)
    dmid, dg2, db2 = layer_norm_backward(kept["resid_mid"], ln_2["g"], dln2, ln_2.get("eps", 1e-5))
    dmid = dmid + dy
    dln1, attn_grads = mha_backward(kept, attn["c_attn"], attn["c_proj"], n_head, dmid)
    dx, dg1, db1 = layer_norm_backward(kept["resid_pre"], ln_1["g"], dln1, ln_1.get("eps", 1e-5))
    return dx + dmid, {"ln_1": {"g": dg1, "b": db1}, "attn": attn_grads, "ln_2": {"g": dg2, "b": db2},
                       "mlp": mlp_grads}


def training_forward(ids, params, n_head):
    """gpt2() with a hook that keeps what the backward needs. -> (logits [B, T, V], kept per block, ln_f's input)"""
    blocks = [{} for _ in params["blocks"]]
    last = {}

    def keep(name, x):
        block, _, stage = name.partition(".")
        if block[0] == "h" and block[1:].isdigit():
            if stage in KEPT:
                blocks[int(block[1:])][stage] = x
            if stage == "resid_post" and int(block[1:]) == len(blocks) - 1:
                last["x"] = x
        return x

    return g.gpt2(ids, params, n_head, hook=keep), blocks, last["x"]


def loss_and_grads(ids, targets, params, n_head):
    """Mean cross-entropy of targets [B, T] given ids [B, T], and d loss / d every parameter.
    loss = -mean log softmax(logits)[target];  d loss / d logits = (softmax(logits) - onehot) / (B·T)
    The head is wte again, so wte's gradient adds two parts: the logits' (dlogitsᵀ x) and the gather's."""
    ids, targets = np.asarray(ids), np.asarray(targets)
    logits, kept, x_last = training_forward(ids, params, n_head)
    B, T, V = logits.shape
    logprobs = g.log_softmax(logits)
    loss = float(-np.take_along_axis(logprobs, targets[..., None], -1).mean())
    dlogits = np.exp(logprobs)
    np.put_along_axis(dlogits, targets[..., None], np.take_along_axis(dlogits, targets[..., None], -1) - 1.0, -1)
    dlogits /= B * T
    xf = g.layer_norm(x_last, **params["ln_f"])
    dwte = dlogits.reshape(-1, V).T @ xf.reshape(-1, xf.shape[-1])  # [V, C]: the tied head's part
    dx, dgf, dbf = layer_norm_backward(x_last, params["ln_f"]["g"], dlogits @ params["wte"], params["ln_f"].get("eps", 1e-5))
    grads = {"ln_f": {"g": dgf, "b": dbf}, "blocks": [None] * len(params["blocks"])}
    for i in reversed(range(len(params["blocks"]))):
        dx, grads["blocks"][i] = block_backward(kept[i], **params["blocks"][i], n_head=n_head, dy=dx)
    np.add.at(dwte, ids.reshape(-1), dx.reshape(-1, dx.shape[-1]))  # the gather's part: each row its tokens'
    grads["wte"] = dwte
    grads["wpe"] = np.zeros_like(params["wpe"])
    grads["wpe"][:T] = dx.sum(axis=0)
    return loss, grads


# ============================================================================
# 4. The optimizer
# ============================================================================

def trainable(params):
    """A writable float32 copy of params (the loaded ones are read-only views into the file)."""
    return shapes.nest({k: np.array(a, dtype=np.float32) for k, a in shapes.flatten(params).items()},
                       len(params["blocks"]))


def decays(name):
    """AdamW's weight decay applies to matrices and embeddings (w, wte, wpe), not to biases and gains."""
    return name.endswith("/w") or name in ("wte", "wpe")


def new_adamw_state(params):
    """The two moments of every parameter, zero, and the step count."""
    return {"step": 0, "m": {k: np.zeros_like(a) for k, a in shapes.flatten(params).items()},
            "v": {k: np.zeros_like(a) for k, a in shapes.flatten(params).items()}}


def clip_grad_norm(grads, max_norm):
    """Scale every gradient by max_norm / ‖all gradients‖ when that norm is larger. -> the norm before."""
    flat = shapes.flatten(grads)
    norm = math.sqrt(sum(float(np.vdot(a, a)) for a in flat.values()))
    if max_norm and norm > max_norm:
        for a in flat.values():
            a *= max_norm / (norm + 1e-6)
    return norm


def adamw_step(params, grads, state, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One AdamW step, in place:  p ← p (1 - lr·λ) - lr · m̂ / (√v̂ + ε),
    m ← β1 m + (1 - β1) g,  v ← β2 v + (1 - β2) g²,  m̂ = m / (1 - β1ᵗ),  v̂ = v / (1 - β2ᵗ).
    Only one temporary, the size of the largest tensor, is made."""
    state["step"] += 1
    t = state["step"]
    correction1, correction2 = 1.0 - beta1 ** t, 1.0 - beta2 ** t
    flat_p, flat_g = shapes.flatten(params), shapes.flatten(grads)
    scratch = np.empty(max(a.size for a in flat_p.values()), np.float32)
    for name, p in flat_p.items():
        grad, m, v = flat_g[name], state["m"][name], state["v"][name]
        tmp = scratch[:p.size].reshape(p.shape)
        if weight_decay and decays(name):
            p *= 1.0 - lr * weight_decay
        m *= beta1
        np.multiply(grad, 1.0 - beta1, out=tmp)
        m += tmp
        v *= beta2
        np.multiply(grad, grad, out=tmp)
        tmp *= 1.0 - beta2
        v += tmp
        np.sqrt(v, out=tmp)
        tmp *= 1.0 / math.sqrt(correction2)
        tmp += eps
        np.divide(m, tmp, out=tmp)
        tmp *= lr / correction1
        p -= tmp


def learning_rate(step, max_lr, warmup, total, min_lr=0.0):
    """Linear warm-up to max_lr over `warmup` steps, then cosine decay to min_lr at `total`."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
