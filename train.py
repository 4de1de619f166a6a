"""Fine-tuning GPT-2 in NumPy: the backward pass, written by hand in the forward's order.

gpt2_numpy.py is the forward textbook; this file is its mirror. Each forward function has a
backward here, with its derivative in one line and the shapes of its arrays:

    forward (gpt2_numpy.py)        backward (here)
    gelu                           gelu_backward
    softmax                        softmax_backward
    (dropout, training only)       dropout_backward
    layer_norm                     layer_norm_backward
    linear                         linear_backward
    ffn                            ffn_backward
    attention (with its mask)      attention_backward
    mha                            mha_backward
    transformer_block              block_backward
    the output layer + the loss    cross_entropy_backward, head_backward
    gpt2 + cross-entropy           loss_and_grads

The training forward is gpt2_hidden() itself, run with a hook that keeps exactly the
activations the backward reads (KEPT), and that applies dropout where GPT-2 has it;
nothing else of the forward pass is written again here.

Where the hot path needs a cleverer form (gelu_backward_no_temporaries, cross_entropy_in_place,
adamw_step_fast), the plain one stays beside it and a test holds the two equal.
"""
import argparse
import concurrent.futures
import io
import json
import math
import os
import sys
import time

import numpy as np

import gpt2_numpy as g
import shapes
from checkpoint import write_checkpoint
from errors import UserError, fail

KEPT = ("resid_pre", "ln_1", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.z", "resid_mid", "ln_2",
        "mlp.c_fc", "mlp.gelu")  # per block; and the last block's output, ln_f's input
DROPPED = ("attn.weights", "attn.out", "mlp.out")  # per block, where GPT-2 has dropout; and the embeddings


# ============================================================================
# 1. Building blocks
# ============================================================================

def gelu_backward(x, dy):
    """d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t²) √(2/π) (1 + 3·0.044715 x²),  t = tanh(√(2/π)(x + 0.044715 x³))
    x, dy [...] -> dx [...]"""
    x2 = x * x  # (x ** 3 would be ~30x slower: NumPy's float32 power is a general pow)
    t = np.tanh(g.SQRT_2_OVER_PI * x * (1.0 + g.GELU_CUBIC * x2))
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * g.SQRT_2_OVER_PI * (1.0 + 3.0 * g.GELU_CUBIC * x2))


def gelu_backward_no_temporaries(x, dy):
    """gelu_backward(x, dy), for the hot path: the same derivative written
    0.5 (1 + t + u (1 - t²)) dy,  t = tanh(x (a + b x²)),  u = x (a + 3b x²),  a = √(2/π), b = 0.044715 a,
    in three new arrays updated in place (~12 fewer trips through memory). A test holds it equal."""
    a, b = g.SQRT_2_OVER_PI, g.GELU_CUBIC * g.SQRT_2_OVER_PI
    u = x * x
    t = u * b
    t += a
    t *= x
    np.tanh(t, out=t)
    u *= 3.0 * b
    u += a
    u *= x
    s = t * t
    np.subtract(1.0, s, out=s)
    u *= s
    u += t
    u += 1.0
    u *= 0.5
    u *= dy
    return u


def dropout(x, p, rng):
    """Zero each element with probability p and scale the rest by 1 / (1 - p), so the mean is kept.
    x [...] -> (y [...], the kept elements' mask [...] of bools)"""
    keep = rng.random(x.shape, dtype=np.float32) >= p
    y = x * keep
    y *= 1.0 / (1.0 - p)
    return y, keep


def dropout_backward(keep, p, dy):
    """y = x · keep / (1 - p):  dx = dy · keep / (1 - p).   keep, dy [...] -> dx [...]
    With no mask (no dropout there), dx = dy."""
    if keep is None:
        return dy
    dx = dy * keep
    dx *= 1.0 / (1.0 - p)
    return dx


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
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])  # [B·T, n]: one product each
    return (dy2 @ w.T).reshape(x.shape), x2.T @ dy2, dy2.sum(axis=0)


def ffn_backward(x, h, a, c_fc, c_proj, dy):
    """c_proj(gelu(c_fc(x))) backwards: c_proj, then gelu, then c_fc. h = c_fc(x), a = gelu(h).
    x, dy [B, T, C], h, a [B, T, 4C] -> dx [B, T, C], grads {c_fc, c_proj}"""
    da, dw_proj, db_proj = linear_backward(a, c_proj["w"], dy)
    dx, dw_fc, db_fc = linear_backward(x, c_fc["w"], in_chunks(gelu_backward_no_temporaries, h, da))
    return dx, {"c_fc": {"w": dw_fc, "b": db_fc}, "c_proj": {"w": dw_proj, "b": db_proj}}


# ============================================================================
# 2. Attention
# ============================================================================

def attention_backward(q, k, v, weights, dz, keep=None, p=0.0):
    """z = weights v, weights = softmax(q kᵀ/√D + mask):
    dv = weightsᵀ dz,  dweights = dz vᵀ,  dscores = softmax_backward,  dq = dscores k/√D,  dk = dscoresᵀ q/√D
    q [B, H, T, D], weights [B, H, T, T], dz [B, H, T, D] -> dq, dk, dv [B, H, T, D]
    With dropout on the weights (keep, p), z was made from the dropped weights instead."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    used = weights if keep is None else dropout_backward(keep, p, weights)  # the same mask and scale
    dv = used.swapaxes(-1, -2) @ dz
    dscores = in_chunks(softmax_backward, weights, dropout_backward(keep, p, dz @ v.swapaxes(-1, -2)))
    return dscores @ k * scale, dscores.swapaxes(-1, -2) @ q * scale, dv


def mha_backward(kept, c_attn, c_proj, n_head, dy, p=0.0):
    """c_proj, merge heads, attention, split heads, c_attn, backwards.   dy [B, T, C] -> dx [B, T, C], grads"""
    dz_merged, dw, db = linear_backward(g.merge_heads(kept["attn.z"]), c_proj["w"], dy)
    dq, dk, dv = attention_backward(kept["attn.q"], kept["attn.k"], kept["attn.v"], kept["attn.weights"],
                                    g.split_heads(dz_merged, n_head), kept.get("attn.weights.keep"), p)
    dqkv = np.concatenate([g.merge_heads(d) for d in (dq, dk, dv)], axis=-1)  # [B, T, 3C], as c_attn made them
    dx, dw_attn, db_attn = linear_backward(kept["ln_1"], c_attn["w"], dqkv)
    return dx, {"c_attn": {"w": dw_attn, "b": db_attn}, "c_proj": {"w": dw, "b": db}}


# ============================================================================
# 3. The block and the model
# ============================================================================

def block_backward(kept, ln_1, attn, ln_2, mlp, n_head, dy, p=0.0):
    """x + mha(ln_1(x)), then + ffn(ln_2(x)), backwards: each residual passes dy straight through
    and adds what flows back through its branch (and through its dropout, if any).
    dy [B, T, C] -> dx [B, T, C], grads"""
    dln2, mlp_grads = ffn_backward(kept["ln_2"], kept["mlp.c_fc"], kept["mlp.gelu"], mlp["c_fc"], mlp["c_proj"],
                                   dropout_backward(kept.get("mlp.out.keep"), p, dy))
    dmid, dg2, db2 = layer_norm_backward(kept["resid_mid"], ln_2["g"], dln2, ln_2.get("eps", 1e-5))
    dmid = dmid + dy
    dln1, attn_grads = mha_backward(kept, attn["c_attn"], attn["c_proj"], n_head,
                                    dropout_backward(kept.get("attn.out.keep"), p, dmid), p)
    dx, dg1, db1 = layer_norm_backward(kept["resid_pre"], ln_1["g"], dln1, ln_1.get("eps", 1e-5))
    return dx + dmid, {"ln_1": {"g": dg1, "b": db1}, "attn": attn_grads, "ln_2": {"g": dg2, "b": db2},
                       "mlp": mlp_grads}


def training_forward(ids, params, n_head, p=0.0, rng=None):
    """gpt2_hidden() with a hook that keeps what the backward needs, and with dropout (probability p)
    where GPT-2 has it: the embeddings' sum, the attention weights and each branch's output.
    -> (kept per block, {"x": ln_f's input, "ln_f": its output [B, T, C]})"""
    blocks, top = [{} for _ in params["blocks"]], {}

    def keep(name, x):
        block, _, stage = name.partition(".")
        if block == "ln_f":
            top["ln_f"] = x
            return x
        if not (block[0] == "h" and block[1:].isdigit()):
            return x
        kept = blocks[int(block[1:])]
        if stage == "attn.weights" and p:
            kept[stage] = x  # the softmax's backward needs its own output, from before the dropout
        if p and (stage in DROPPED or name == "h0.resid_pre"):
            x, kept[stage + ".keep"] = dropout(x, p, rng)
        if stage in KEPT and stage not in kept:
            kept[stage] = x  # otherwise, what the next layer saw
        if stage == "resid_post" and int(block[1:]) == len(blocks) - 1:
            top["x"] = x
        return x

    g.gpt2_hidden(ids, params, n_head, hook=keep)
    return blocks, top


def cross_entropy(logits, targets):
    """-mean log softmax(logits)[target], and log softmax(logits).   logits [B, T, V], targets [B, T]"""
    logprobs = g.log_softmax(logits)
    return float(-np.take_along_axis(logprobs, targets[..., None], -1).mean()), logprobs


def cross_entropy_backward(logits, targets):
    """d loss / d logits = (softmax(logits) - onehot(target)) / N, over the N = B·T positions.
    logits [B, T, V], targets [B, T] -> [B, T, V]"""
    d = g.softmax(logits)
    np.put_along_axis(d, targets[..., None], np.take_along_axis(d, targets[..., None], -1) - 1.0, -1)
    d /= targets.size
    return d


ROWS = 8  # logits rows at a time: 8 x 50257 floats (1.6 MB) stay in the cache through every step


def cross_entropy_in_place(logits, targets):
    """cross_entropy and cross_entropy_backward in one pass, for the hot path: logits [N, V]
    is overwritten with d loss / d logits, ROWS rows at a time, each one's max, exp, sum and
    scale done while it is in the cache, and the rows shared among the cores (each pass over
    the whole [N, V] would be a trip through main memory). targets [N] -> the loss.
    A test holds it equal to the two plain functions."""
    n = len(targets)

    def work(starts):
        total = 0.0
        for i in starts:
            x, t = logits[i:i + ROWS], targets[i:i + ROWS]
            x -= x.max(axis=-1, keepdims=True)
            picked = x[np.arange(len(t)), t]  # logit - max, at each target
            np.exp(x, out=x)
            sums = x.sum(axis=-1, keepdims=True)
            total += float((np.log(sums[:, 0]) - picked).sum())  # -log softmax at each target
            x *= 1.0 / (n * sums)
            x[np.arange(len(t)), t] -= 1.0 / n
        return total

    return sum(shared_among_cores(work, list(range(0, n, ROWS)))) / n


def head_backward(xf, wte, targets, buffers=None):
    """The tied output layer and the loss, forward then backward:
    logits = x wteᵀ;  dlogits = (softmax - onehot) / N;  dx = dlogits wte;  dwte = dlogitsᵀ x (the head's part)
    xf [B, T, C], wte [V, C], targets [B, T] -> (loss, dx [B, T, C], dwte [V, C]).
    The logits and dwte live in `buffers`, reused at the next call."""
    x = xf.reshape(-1, xf.shape[-1])  # [N, C]
    logits = reused(buffers, "logits", (len(x), len(wte)), x.dtype)
    np.matmul(x, wte.T, out=logits)
    loss = cross_entropy_in_place(logits, targets.reshape(-1))  # logits is now dlogits
    dwte = np.matmul(logits.T, x, out=reused(buffers, "dwte", wte.shape, x.dtype))
    return loss, (logits @ wte).reshape(xf.shape), dwte


def loss_and_grads(ids, targets, params, n_head, p=0.0, rng=None, buffers=None):
    """Mean cross-entropy of targets [B, T] given ids [B, T], and d loss / d every parameter.
    loss = -mean log softmax(logits)[target];  d loss / d logits = (softmax(logits) - onehot) / (B·T)
    The head is wte again, so wte's gradient adds two parts: the logits' (dlogitsᵀ x) and the gather's.
    p, rng: dropout. buffers: a dict kept between calls (the training loop's), whose arrays are
    reused; the returned grads["wte"] is one of them, good until the next call."""
    ids, targets = np.asarray(ids), np.asarray(targets)
    kept, top = training_forward(ids, params, n_head, p, rng)
    loss, dxf, dwte = head_backward(top["ln_f"], params["wte"], targets, buffers)
    dx, dgf, dbf = layer_norm_backward(top["x"], params["ln_f"]["g"], dxf, params["ln_f"].get("eps", 1e-5))
    grads = {"ln_f": {"g": dgf, "b": dbf}, "blocks": [None] * len(params["blocks"])}
    for i in reversed(range(len(params["blocks"]))):
        dx, grads["blocks"][i] = block_backward(kept[i], **params["blocks"][i], n_head=n_head, dy=dx, p=p)
    dx = dropout_backward(kept[0].get("resid_pre.keep"), p, dx)  # the embeddings' dropout
    np.add.at(dwte, ids.reshape(-1), dx.reshape(-1, dx.shape[-1]))  # the gather's part: each row its tokens'
    grads["wte"] = dwte
    grads["wpe"] = np.zeros_like(params["wpe"])
    grads["wpe"][:ids.shape[1]] = dx.sum(axis=0)
    return loss, grads


# ============================================================================
# 4. The hot path's helpers: cache-sized chunks, all the cores, reused buffers
# ============================================================================

CHUNK = 1 << 16  # floats: a chunk's arrays (AdamW's p, g, m, v and two scratch) stay in the cache


def shared_among_cores(work, jobs):
    """work(share) for each core's share of the jobs, at once (NumPy lets go of the GIL inside
    each operation on large arrays). -> each share's result"""
    workers = min(os.cpu_count() or 1, len(jobs)) or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(work, [jobs[i::workers] for i in range(workers)]))


def in_chunks(rowwise, *arrays):
    """rowwise(*arrays) for arrays of one shape and a function that works on each row (the last
    axis) alone, elementwise ones included, computed a few rows (about CHUNK elements) at a time
    on all the cores: each chunk's temporaries stay in the cache (on [256, 3072] that is ~8x
    faster than one pass over the whole arrays per operation)."""
    n = arrays[0].shape[-1]
    rows = [a.reshape(-1, n) for a in arrays]
    out = np.empty_like(rows[0])
    step = max(1, CHUNK // n)

    def work(starts):
        for i in starts:
            out[i:i + step] = rowwise(*(a[i:i + step] for a in rows))

    shared_among_cores(work, list(range(0, len(out), step)))
    return out.reshape(arrays[0].shape)


def reused(buffers, name, shape, dtype):
    """buffers[name], made once and used again at every step: fresh memory is slow to touch
    (the [B·T, V] logits are 51 MB at B=4, T=64; wte's gradient is 154 MB)."""
    if buffers is None:
        return np.empty(shape, dtype)
    if name not in buffers or buffers[name].shape != shape or buffers[name].dtype != dtype:
        buffers[name] = np.empty(shape, dtype)
    return buffers[name]


# ============================================================================
# 5. The optimizer
# ============================================================================

def trainable(params):
    """A writable float32 copy of params (the loaded ones are read-only views into the file);
    anything that is not an array (a layer norm's eps) is kept as it is."""
    if isinstance(params, dict):
        return {k: trainable(v) for k, v in params.items()}
    if isinstance(params, list):
        return [trainable(v) for v in params]
    return np.array(params, dtype=np.float32) if hasattr(params, "shape") else params


def decays(name):
    """AdamW's weight decay applies to matrices and embeddings (w, wte, wpe), not to biases and gains."""
    return name.endswith("/w") or name in ("wte", "wpe")


def new_adamw_state(params):
    """The two moments of every parameter, zero, and the step count."""
    return {"step": 0, "m": {k: np.zeros_like(a) for k, a in shapes.flatten(params).items()},
            "v": {k: np.zeros_like(a) for k, a in shapes.flatten(params).items()}}


def grad_norm(grads):
    """‖all gradients‖, as one vector: √(Σ g²) over every element of every tensor."""
    return math.sqrt(sum(float(np.vdot(a, a)) for a in shapes.flatten(grads).values()))


def clip_scale(norm, max_norm):
    """What clipping multiplies every gradient by: max_norm / norm when the norm is larger, else 1."""
    return max_norm / (norm + 1e-6) if max_norm and norm > max_norm else 1.0


def clip_grad_norm(grads, max_norm):
    """Scale every gradient by max_norm / ‖all gradients‖ when that norm is larger. -> the norm before.
    (The training loop does not make this pass: adamw_step_fast scales each chunk as it reads it.)"""
    norm = grad_norm(grads)
    scale = clip_scale(norm, max_norm)
    if scale != 1.0:
        for a in shapes.flatten(grads).values():
            a *= scale
    return norm


def adamw_update(p, grad, m, v, tmp, lr, decay, beta1, beta2, eps, correction1, correction2):
    """AdamW on arrays of one shape, in place:  p ← p (1 - lr·λ) - lr · m̂ / (√v̂ + ε),
    m ← β1 m + (1 - β1) g,  v ← β2 v + (1 - β2) g²,  m̂ = m / (1 - β1ᵗ),  v̂ = v / (1 - β2ᵗ).
    tmp: scratch of the same shape; decay: lr·λ, or 0 for biases and gains."""
    if decay:
        p *= 1.0 - decay
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


def adamw_pieces(params, grads, state, lr, beta1, beta2, eps, weight_decay):
    """Each tensor's arrays and its settings, for one step (the step count goes up by one)."""
    state["step"] += 1
    t = state["step"]
    flat_g = shapes.flatten(grads)
    for name, p in shapes.flatten(params).items():
        decay = lr * weight_decay if decays(name) else 0.0
        yield (p, flat_g[name], state["m"][name], state["v"][name],
               (lr, decay, beta1, beta2, eps, 1.0 - beta1 ** t, 1.0 - beta2 ** t))


def adamw_step(params, grads, state, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One AdamW step over every tensor, in place (weight decay on matrices and embeddings only).
    Only one temporary, the size of the largest tensor, is made."""
    scratch = None
    for p, grad, m, v, settings in adamw_pieces(params, grads, state, lr, beta1, beta2, eps, weight_decay):
        if scratch is None or scratch.size < p.size:
            scratch = np.empty(p.size, np.float32)
        adamw_update(p, grad, m, v, scratch[:p.size].reshape(p.shape), *settings)


def adamw_step_fast(params, grads, state, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                    grad_scale=1.0):
    """adamw_step, the same arithmetic on the same numbers (a test holds them bit-identical), for
    the hot path: each tensor is cut into chunks that fit in the cache, so that the update's
    fourteen operations read memory once instead of fourteen times, and the chunks are shared
    among the cores. grad_scale (clipping's) multiplies each chunk of the gradients as it is
    read, instead of in a pass of its own: clip_grad_norm then adamw_step, bit for bit."""
    jobs = []
    for p, grad, m, v, settings in adamw_pieces(params, grads, state, lr, beta1, beta2, eps, weight_decay):
        p, grad, m, v = (a.reshape(-1) for a in (p, grad, m, v))  # views: every array is contiguous
        jobs += [(p[i:i + CHUNK], grad[i:i + CHUNK], m[i:i + CHUNK], v[i:i + CHUNK], settings)
                 for i in range(0, p.size, CHUNK)]

    def work(share):
        tmp, scaled = np.empty(CHUNK, np.float32), np.empty(CHUNK, np.float32)
        for p, grad, m, v, settings in share:
            if grad_scale != 1.0:
                grad = np.multiply(grad, grad_scale, out=scaled[:p.size])
            adamw_update(p, grad, m, v, tmp[:p.size], *settings)

    shared_among_cores(work, jobs)


def learning_rate(step, max_lr, warmup, total, min_lr=0.0):
    """Linear warm-up to max_lr over `warmup` steps, then cosine decay to min_lr at `total`."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


# ============================================================================
# 6. The training loop and its command line
# ============================================================================
#   python train.py --model 124M --data notes.txt --out models/notes-124M --steps 200
# then: python gpt2_numpy.py --model models/notes-124M "prompt"

STATE_FILE = "train_state.npz"  # the optimizer's moments and the step count, beside the checkpoint (no pickle)


def read_text(path):
    """A .txt file, or every .txt file in a folder (sorted), as one text."""
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".txt")) if os.path.isdir(path) \
        else [path]
    if not files:
        raise UserError("holds no .txt file", path=path)
    texts = []
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                texts.append(fh.read())
        except UnicodeDecodeError:
            raise UserError("is not UTF-8 text", path=f) from None
        except OSError as e:
            raise UserError(e.strerror, path=f) from None
    text = "\n\n".join(texts)
    if not text.strip():
        raise UserError("is empty", path=path)
    return text


def split_tokens(ids, context, val_fraction):
    """-> (train ids, validation ids); each must hold at least one context plus its next token."""
    ids = np.asarray(ids, dtype=np.int64)
    n_val = int(len(ids) * val_fraction)
    train_ids, val_ids = ids[:len(ids) - n_val], ids[len(ids) - n_val:]
    if len(train_ids) < context + 1 or (val_fraction and len(val_ids) < context + 1):
        raise UserError(f"the text has {len(ids):,} tokens: too short for a context of {context} in both the "
                        f"training and the validation part (--context, --val-fraction)")
    return train_ids, val_ids


def batch(ids, batch_size, context, rng):
    """batch_size random windows: inputs [B, T] and their next tokens [B, T]."""
    starts = rng.integers(0, len(ids) - context, batch_size)
    x = np.stack([ids[s:s + context] for s in starts])
    return x, np.stack([ids[s + 1:s + context + 1] for s in starts])


def memory_needed(hparams, batch_size, context):
    """About 16 bytes a parameter (weights, gradients, two moments) plus the kept activations
    and the logits with their gradient."""
    import parameters
    n = parameters.count_parameters(hparams, d_ff=hparams.get("n_inner"))["total"]
    C, H, L, V = hparams["n_embd"], hparams["n_head"], hparams["n_layer"], hparams["n_vocab"]
    per_token = 4 * (L * (16 * C + 2 * H * context) + 3 * V)
    return 16 * n + batch_size * context * per_token


def check_memory(hparams, args, free):
    """Refuse, before anything is allocated, a run that cannot fit (1558M cannot, in 24 GB)."""
    if args.context > hparams["n_ctx"]:
        raise UserError(f"--context {args.context} is longer than the model's {hparams['n_ctx']} positions")
    need = memory_needed(hparams, args.batch_size, args.context)
    if free is not None and need > free:
        raise UserError(f"fine-tuning this model at --batch-size {args.batch_size} --context {args.context} needs "
                        f"about {need / 1e9:.1f} GB (16 bytes a parameter, plus activations), but {free / 1e9:.1f} GB "
                        "are free: use a smaller model, batch or context")


def accumulate(total, grads):
    """total += grads, tensor by tensor (the first micro-batch's grads are copied: its wte
    gradient is a buffer that the next micro-batch writes over)."""
    if total is None:
        return trainable(grads)  # a float32 copy of every array
    into = shapes.flatten(total)
    for name, a in shapes.flatten(grads).items():
        into[name] += a
    return total


def train_step(params, hparams, state, train_ids, step, args, buffers=None):
    """One step: the gradients of args.accum micro-batches, clipping, AdamW. -> the mean loss.
    The batches and the dropout depend on the seed and the step only, so a resumed run is the
    same run. (A function of its own, so that a step's gradients are gone before the next.)"""
    rng = np.random.default_rng([args.seed, step])
    total, loss = None, 0.0
    for _ in range(args.accum):
        x, y = batch(train_ids, args.batch_size, args.context, rng)
        micro, grads = loss_and_grads(x, y, params, hparams["n_head"], args.dropout, rng, buffers)
        total = grads if args.accum == 1 else accumulate(total, grads)
        loss += micro / args.accum
    if args.accum > 1:
        for a in shapes.flatten(total).values():
            a /= args.accum
    scale = clip_scale(grad_norm(total), args.grad_clip)
    lr = learning_rate(step, args.lr, args.warmup, args.steps, args.lr * args.min_lr_ratio)
    adamw_step_fast(params, total, state, lr, weight_decay=args.weight_decay, grad_scale=scale)
    return loss


def train(params, hparams, train_ids, args, on_step=None):
    """The loop: train_step after train_step, from the saved step on. -> the last loss."""
    state = args.state or new_adamw_state(params)
    buffers = {}  # the big arrays of a step, made once
    loss = None
    for step in range(state["step"], args.steps):
        loss = train_step(params, hparams, state, train_ids, step, args, buffers)
        if on_step:
            on_step(step + 1, loss, state)
    return loss


def validation_loss(params, hparams, val_ids, context, batches=4, batch_size=4):
    """The loss on held-out windows: the forward pass only."""
    rng = np.random.default_rng(0)  # the same windows every time, so the numbers compare
    losses = []
    for _ in range(batches):
        x, y = batch(val_ids, batch_size, context, rng)
        losses.append(cross_entropy(g.gpt2(x, params, hparams["n_head"]), y)[0])
    return float(np.mean(losses))


def save(folder, params, hparams, state, vocab, args):
    moments = {f"m/{k}": a for k, a in state["m"].items()} | {f"v/{k}": a for k, a in state["v"].items()}
    buf = io.BytesIO()
    np.savez(buf, step=np.int64(state["step"]), **moments)
    config = json.dumps({k: v for k, v in vars(args).items() if k != "state"}, indent=1).encode()
    write_checkpoint(folder, params, hparams, vocab=vocab, extra={STATE_FILE: buf.getvalue(), "train_config.json": config})


def load_state(folder, params):
    with np.load(os.path.join(folder, STATE_FILE), allow_pickle=False) as z:
        names = shapes.flatten(params)
        return {"step": int(z["step"]), "m": {k: z[f"m/{k}"].copy() for k in names},
                "v": {k: z[f"v/{k}"].copy() for k in names}}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="train.py", description="Fine-tune GPT-2 in NumPy on a text file.")
    p.add_argument("--model", default="124M", help="124M, 355M, 774M, a model folder, or hf:owner/name")
    p.add_argument("--data", required=True, help="a UTF-8 .txt file, or a folder of them")
    p.add_argument("--out", required=True, help="the folder to write the fine-tuned model to")
    p.add_argument("--models-dir", help="where model sizes are downloaded")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--context", type=int, default=256, help="tokens a training window holds")
    p.add_argument("--accum", type=int, default=1, help="micro-batches a step accumulates (a larger batch in the "
                                                        "same memory)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="the cosine decays to lr times this")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="clip gradients to this global norm (0: never)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability (GPT-2 was trained with 0.1; "
                                                              "fine-tuning usually uses 0)")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=50, help="print the validation loss every N steps")
    p.add_argument("--sample-every", type=int, default=100, help="print a short sample every N steps")
    p.add_argument("--save-every", type=int, default=100, help="save a checkpoint every N steps (and at the end)")
    p.add_argument("--seed", type=int, default=0, help="the same seed gives the same run, bit for bit")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument("--quiet", action="store_true")
    p.error = fail
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "context", "accum", "eval_every", "sample_every", "save_every"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.val_fraction < 1:
        fail("--val-fraction must be in [0, 1)")
    if not 0 <= args.dropout < 1:
        fail("--dropout must be in [0, 1)")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.state = None
    try:
        return run(args)
    except UserError as e:
        fail(str(e))


def run(args):
    import bpe
    import loading
    import look_inside
    from tqdm import tqdm

    parent = os.path.dirname(os.path.abspath(args.out))
    if not (os.path.isdir(parent) and os.access(parent, os.W_OK)) or (os.path.exists(args.out) and not args.resume):
        raise UserError("cannot be written here (its folder must exist, and it must not, unless --resume)",
                        path=args.out)
    if args.model in shapes.SIZES and not args.resume:  # a released size: refuse before downloading it
        check_memory(shapes.hparams(args.model), args, look_inside.available_memory())
    text = read_text(args.data)
    folder = args.out if args.resume else loading.fetch_model(args.model, args.models_dir, quiet=args.quiet)
    hparams, params = loading.load_weights(folder)
    check_memory(hparams, args, look_inside.available_memory())
    encoder = bpe.get_encoder(folder)
    train_ids, val_ids = split_tokens(encoder.encode(text), args.context, args.val_fraction)
    params = trainable(params)
    if args.resume:
        args.state = load_state(folder, params)
    start = (args.state or {"step": 0})["step"]
    bar = tqdm(total=args.steps, initial=start, unit="step", disable=args.quiet)
    clock = {"t": time.perf_counter(), "state": None}

    def on_step(step, loss, state):
        clock["state"] = state
        rate = args.batch_size * args.accum * args.context / (time.perf_counter() - clock["t"])
        clock["t"] = time.perf_counter()
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{rate:.0f}")
        bar.update(1)
        if step % args.eval_every == 0 and len(val_ids):
            bar.write(f"step {step}: train loss {loss:.4f}, validation loss "
                      f"{validation_loss(params, hparams, val_ids, args.context):.4f}")
        if step % args.sample_every == 0:
            ids = np.concatenate(list(g.generate([], params, hparams, 30, seed=args.seed, top_k=40)))
            bar.write(f"step {step} sample: {encoder.decode(ids.tolist())!r}")
        if step % args.save_every == 0 or step == args.steps:
            save(args.out, params, hparams, state, folder, args)

    try:
        train(params, hparams, train_ids, args, on_step)
    except KeyboardInterrupt:
        bar.close()
        if clock["state"] is not None:
            save(args.out, params, hparams, clock["state"], folder, args)
            print(f"\ninterrupted: saved step {clock['state']['step']} in {args.out}; --resume continues",
                  file=sys.stderr)
        return 130
    bar.close()
    print(f"{args.out}: fine-tuned for {args.steps} steps; run it with python gpt2_numpy.py --model {args.out} "
          "\"prompt\"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
