"""The backward pass, by hand: gpt2_numpy.py's forward, mirrored section by section.

Each forward function has its backward here, with its derivative in one line and its shapes:

    forward (gpt2_numpy.py)          backward (here)
    1. gelu                          gelu_backward
       softmax                       softmax_backward
       layer_norm                    layer_norm_backward
       linear                        linear_backward
       linear with LoRA's update     lora_linear_backward (the weights frozen), layer_backward
       ffn                           ffn_backward
       (training only) dropout       apply_dropout, dropout_backward
    2. attention (with its mask)     attention_backward
       mha                           mha_backward
    3. the model, in the order loss_and_grads goes through it:
       gpt2_hidden, with a hook      training_forward (keeps what the backward reads)
       next_token_loss               cross_entropy, cross_entropy_backward
       the output layer + the loss   head_backward (with cross_entropy_fast)
       transformer_block             transformer_block_backward
       wte[ids] + wpe[positions]     embedding_backward
       gpt2_hidden                   model_backward (ln_f, the blocks from the last, the embeddings)
       gpt2 + its loss               loss_and_grads
       gpt2 + any metric             activation_grads (each activation's gradient, through a hook)

Circuit tracing (tracing.py) runs the same backward with stops (STOPS): the attention weights, each layer
norm's scale and the MLPs held constant, so that what is left is linear in the residual stream.

The training forward is gpt2_hidden() itself, run with a hook that keeps exactly the
activations the backward reads (KEPT), and that applies dropout where GPT-2 has it; nothing
of the forward pass is written again here. The backward has hooks too, the forward's mirror:
where the forward passes an activation through hook(name, x), the backward passes that
activation's gradient through hook(name, grad), with the same name and layout, and goes on
with what the hook returns (activation_grads; circuits.py's attribution patching reads them).
Where the hot path needs a cleverer form (gelu_backward_fast, cross_entropy_fast), the plain
one stays beside it and a test holds the two equal. The optimizer is optimizer.py's; the loop is train.py's.

On a GPU (gpt2_numpy.py's docstring: a CuPy array answers NumPy's calls) the same lines run there; what
knows it: the ids and targets moved where the weights are, dropout's draws made there, and the CPU's
chunks (in_chunks, cross_entropy_fast's rows) taken whole (docs/gpu.md).
"""
import numpy as np

from gpt2_numpy import (GELU_CUBIC, SQRT_2_OVER_PI, attention_scores, block_hook, checked_ids, gpt2_hidden,
                        layer_norm, layer_norm_eps, log_softmax, matmul, merge_heads, next_token_loss, no_hook, softmax,
                        split_heads)
from plumbing import device, shapes
from plumbing.shapes import LAYER_NORM_EPS
from plumbing.parallel import in_chunks, reused, rows_at_a_time, shared_among_cores

KEPT = ("resid_pre", "ln_1", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.z", "resid_mid", "ln_2",
        "mlp.c_fc", "mlp.gelu")  # per block; and the last block's output, ln_f's input
DROPPED = ("attn.weights", "attn.out", "mlp.out")  # per block, where GPT-2 has dropout; and the embeddings
STOPS = ("pattern", "scale", "mlp")  # what stops= may hold constant: the attention weights, the layer norms' 1/√(var
# + eps), the MLPs (no gradient crosses one): circuit tracing's replacement model (Ameisen et al., 2025)


# ============================================================================
# 1. Building blocks
# ============================================================================

def gelu_backward(x, dy):
    """d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t²) √(2/π) (1 + 3·0.044715 x²),  t = tanh(√(2/π)(x + 0.044715 x³))
    x, dy [...] -> dx [...]"""
    x2 = x * x  # not x ** 3: NumPy's float32 power is a general pow (docs/performance.md)
    t = np.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_CUBIC * x2))
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x2))


def gelu_backward_fast(x, dy):
    """gelu_backward(x, dy), for the hot path. GELU is x s with s = 1 / (1 + exp(-2y)), y = x (a + b x²)
    (as gelu_fast computes it), so its derivative is s + x s (1 - s) 2y':
        dx = (s + s (1 - s) u) dy,  u = x (2a + 6b x²),  a = √(2/π), b = 0.044715 a,
    one exp where gelu_backward has a tanh, in three new arrays updated in place."""
    a, b = SQRT_2_OVER_PI, GELU_CUBIC * SQRT_2_OVER_PI
    u = x * x
    s = u * (-2.0 * b)
    s -= 2.0 * a
    s *= x  # -2y
    with np.errstate(over="ignore"):  # a very negative x: exp(-2y) = inf, s = 0, and the derivative is 0
        np.exp(s, out=s)
    s += 1.0
    np.reciprocal(s, out=s)
    u *= 6.0 * b
    u += 2.0 * a
    u *= x
    d = np.subtract(1.0, s)
    d *= s
    d *= u
    d += s
    d *= dy
    return d


def softmax_backward(y, dy):
    """y = softmax(x): dx_i = y_i (dy_i - Σ_j dy_j y_j), over the last axis.   y, dy [..., N] -> dx [..., N]
    Where y is 0 (a masked score), dx is 0: nothing flows into the future."""
    return y * (dy - (dy * y).sum(axis=-1, keepdims=True))


def layer_norm_backward(x, g, dy, eps=LAYER_NORM_EPS):
    """y = x̂ g + b, x̂ = (x - mean) / √(var + eps):
    dg = Σ dy x̂,  db = Σ dy,  dx = (dx̂ - mean(dx̂) - x̂ mean(dx̂ x̂)) / √(var + eps),  dx̂ = dy g
    x, dy [..., C], g [C] -> dx [..., C], dg [C], db [C]"""
    xhat = layer_norm(x, 1.0, 0.0, eps)  # the forward's own x̂: layer_norm with g = 1, b = 0
    rstd = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    dxhat = dy * g
    dx = rstd * (dxhat - np.mean(dxhat, axis=-1, keepdims=True) - xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True))
    axes = tuple(range(dy.ndim - 1))
    return dx, (dy * xhat).sum(axis=axes), dy.sum(axis=axes)


def frozen_scale_backward(x, g, dy, eps=LAYER_NORM_EPS):
    """layer_norm_backward with 1/√(var + eps) held constant (circuit tracing's stop, "scale"): only the mean's
    subtraction and g stay,  dx = (dx̂ - mean(dx̂)) / √(var + eps),  dx̂ = dy g.  x [1 or B, T, C], dy [B, T, C]
    -> dx [B, T, C], and None, None (no dg, db: its weights are frozen)"""
    d = dy * g
    d -= d.mean(-1, keepdims=True)
    return d / np.sqrt(np.var(x, axis=-1, keepdims=True) + eps), None, None


def linear_backward(x, w, dy):
    """y = x w + b:  dx = dy wᵀ,  dw = Σ xᵀ dy (over every position),  db = Σ dy
    x [..., n_in], w [n_in, n_out], dy [..., n_out] -> dx [..., n_in], dw [n_in, n_out], db [n_out]"""
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])  # [B·T, n]: one product each
    return (dy2 @ w.T).reshape(x.shape), x2.T @ dy2, dy2.sum(axis=0)


def lora_linear_backward(x, w, lora, dy):
    """y = x w + b + s h B,  h = x A, with w and b frozen (a LoRA run trains A and B alone):
    dh = s dy Bᵀ,  dx = dy wᵀ + dh Aᵀ,  dA = Σ xᵀ dh,  dB = s Σ hᵀ dy  (Σ over every position)
    x [..., n_in], w [n_in, n_out], lora {"A" [n_in, R], "B" [R, n_out], "scale" s}, dy [..., n_out]
    -> dx [..., n_in], {"A": dA [n_in, R], "B": dB [R, n_out]}. No dw, no db: nothing n_in x n_out is made.
    The update is two linear layers without bias, h = x A and h (s B): two linear_backwards."""
    A, B, s = lora["A"], lora["B"], lora["scale"]
    dh, dsB, _ = linear_backward(matmul(x, A), s * B, dy)  # h [..., R] made again here: cheap beside x w
    dx, dA, _ = linear_backward(x, A, dh)
    dx += matmul(dy, w.T)  # the frozen w's share
    return dx, {"A": dA, "B": s * dsB}


def layer_backward(x, layer, dy, frozen=False):
    """A linear layer backwards: -> dx and the layer's gradients, {"w", "b"}; with its weights frozen
    (a LoRA run), only its adapter's, {"lora": {"A", "B"}}, or none ({}) where it has no adapter."""
    if not frozen:
        dx, dw, db = linear_backward(x, layer["w"], dy)
        return dx, {"w": dw, "b": db}
    if "lora" not in layer:  # dy's leading axes, not x's: x may be one sequence's for a batch of gradients
        return (dy.reshape(-1, dy.shape[-1]) @ layer["w"].T).reshape(*dy.shape[:-1], x.shape[-1]), {}
    dx, grads = lora_linear_backward(x, layer["w"], layer["lora"], dy)
    return dx, {"lora": grads}


def ffn_backward(x, h, a, c_fc, c_proj, dy, frozen=False, hook=no_hook):
    """c_proj(gelu(c_fc(x))) backwards: c_proj, then gelu, then c_fc. h = c_fc(x), a = gelu(h).
    x, dy [B, T, C], h, a [B, T, 4C] -> dx [B, T, C], grads {c_fc, c_proj} (frozen: layer_backward's)
    hook: the gradients of "mlp.gelu" and "mlp.c_fc" (see the top of the file)."""
    da, proj_grads = layer_backward(a, c_proj, dy, frozen)
    dh = hook("mlp.c_fc", in_chunks(gelu_backward_fast, h, hook("mlp.gelu", da)))
    dx, fc_grads = layer_backward(x, c_fc, dh, frozen)
    return dx, {"c_fc": fc_grads, "c_proj": proj_grads}


def apply_dropout(x, p_drop, rng):
    """Zero each element with probability p_drop and scale the rest by 1 / (1 - p_drop), so the mean is kept.
    x [...] -> (y [...], the mask [...] of bools: True where an element was kept)"""
    drop_mask = device.uniform(rng, x) >= p_drop  # drawn where x is: a GPU's masks are its own generator's
    y = x * drop_mask
    y *= 1.0 / (1.0 - p_drop)
    return y, drop_mask


def dropout_backward(drop_mask, p_drop, dy):
    """y = x · drop_mask / (1 - p_drop):  dx = dy · drop_mask / (1 - p_drop).   drop_mask, dy [...] -> dx [...]
    With no drop_mask (no dropout there), dx = dy."""
    if drop_mask is None:
        return dy
    dx = dy * drop_mask
    dx *= 1.0 / (1.0 - p_drop)
    return dx


# ============================================================================
# 2. Attention
# ============================================================================

def attention_backward(q, k, v, weights, dz, drop_mask=None, p_drop=0.0, hook=no_hook):
    """z = weights v, weights = softmax(q kᵀ/√D + the causal mask):
    dv = weightsᵀ dz,  dweights = dz vᵀ,  dscores = softmax_backward,  dq = dscores k/√D,  dk = dscoresᵀ q/√D
    q [B, H, T, D], weights [B, H, T, T], dz [B, H, T, D] -> dq, dk, dv [B, H, T, D]
    With dropout on the weights (its drop_mask, p_drop), z was made from the dropped weights instead.
    hook: the gradients of "attn.weights" (of the weights z was made from) and "attn.scores"."""
    scale = score_scale(q.shape[-1], q.dtype)
    used = weights if drop_mask is None else dropout_backward(drop_mask, p_drop, weights)  # the same mask and scale
    dv = used.swapaxes(-1, -2) @ dz
    dweights = hook("attn.weights", dz @ v.swapaxes(-1, -2))
    dscores = hook("attn.scores", in_chunks(softmax_backward, weights, dropout_backward(drop_mask, p_drop, dweights)))
    return dscores @ k * scale, dscores.swapaxes(-1, -2) @ q * scale, dv


def score_scale(D, dtype):
    """What attention_scores multiplies q·k by (1/√D), read from it: the score of a unit vector with itself."""
    unit = np.zeros((1, 1, 1, D), dtype)
    unit[..., 0] = 1.0
    return float(attention_scores(unit, unit)[0, 0, 0, 0])


def mha_backward(kept, c_attn, c_proj, n_head, dy, p_drop=0.0, frozen=False, hook=no_hook, pattern_frozen=False):
    """c_proj, merge heads, attention, split heads, c_attn, backwards.   dy [B, T, C] -> dx [B, T, C], grads
    (frozen: layer_backward's). hook: the gradients of attn.z, attn.weights, attn.scores, attn.q, .k and .v.
    pattern_frozen (with frozen; circuit tracing's stop): the weights a constant, so only v carries a gradient back:
    dv = weightsᵀ dz, dx = dv W_vᵀ (c_attn's v columns), and no hook but attn.z's and attn.v's."""
    dz_merged, proj_grads = layer_backward(merge_heads(kept["attn.z"]), c_proj, dy, frozen)
    if pattern_frozen:
        dv = hook("attn.v", kept["attn.weights"].swapaxes(-1, -2) @ hook("attn.z", split_heads(dz_merged, n_head)))
        C = dy.shape[-1]
        return matmul(merge_heads(dv), c_attn["w"][:, 2 * C:].T), {}
    dq, dk, dv = attention_backward(kept["attn.q"], kept["attn.k"], kept["attn.v"], kept["attn.weights"],
                                    hook("attn.z", split_heads(dz_merged, n_head)), kept.get("attn.weights.mask"),
                                    p_drop, hook)
    dqkv = np.concatenate([merge_heads(hook(f"attn.{name}", d)) for name, d in zip("qkv", (dq, dk, dv))],
                          axis=-1)  # [B, T, 3C], as c_attn made them
    dx, attn_grads = layer_backward(kept["ln_1"], c_attn, dqkv, frozen)
    return dx, {"c_attn": attn_grads, "c_proj": proj_grads}


# ============================================================================
# 3. The model
# ============================================================================

def training_forward(ids, params, hparams, p_drop=0.0, rng=None, hook=no_hook):
    """gpt2_hidden() with a hook that keeps what the backward needs, and with dropout (probability p_drop)
    where GPT-2 has it: the embeddings' sum, the attention weights and each branch's output.
    hook: a forward hook applied first (what is kept is what it returns: activation_grads').
    -> (kept per block, {"x": ln_f's input, "ln_f": its output [B, T, C]})"""
    blocks, top = [{} for _ in params["blocks"]], {}

    def keep_for_backward(name, x):
        x = hook(name, x)
        if name == "ln_f":
            top["ln_f"] = x
            return x
        i = shapes.block_index(name)
        if i is None:
            return x
        kept, stage = blocks[i], name.partition(".")[2]
        if stage == "attn.weights" and p_drop:
            kept[stage] = x  # the softmax's backward needs its own output, from before the dropout
        if p_drop and (stage in DROPPED or name == "h0.resid_pre"):
            x, kept[stage + ".mask"] = apply_dropout(x, p_drop, rng)
        if stage in KEPT and stage not in kept:
            kept[stage] = x  # otherwise, what the next layer saw
        if stage == "resid_post" and i == len(blocks) - 1:
            top["x"] = x
        return x

    gpt2_hidden(ids, params, hparams, hook=keep_for_backward)
    return blocks, top


IGNORE = -1  # a target that carries no loss and no gradient (torch's ignore_index): a prompt's, or padding


def cross_entropy(logits, targets):
    """The loss, -mean log softmax(logits)[target] over the counted positions (target != IGNORE:
    gpt2_numpy's next_token_loss over them), and log softmax(logits).   logits [B, T, V], targets [B, T]"""
    counted = targets != IGNORE
    return next_token_loss(logits[counted], targets[counted]), log_softmax(logits)


def cross_entropy_backward(logits, targets):
    """d loss / d logits = (softmax(logits) - onehot(target)) / N, over the N counted positions;
    0 where the target is IGNORE.   logits [B, T, V], targets [B, T] -> [B, T, V]"""
    counted = targets != IGNORE
    picked = np.where(counted, targets, 0)[..., None]
    d = softmax(logits)
    np.put_along_axis(d, picked, np.take_along_axis(d, picked, -1) - 1.0, -1)
    d /= max(np.count_nonzero(counted), 1)
    d[~counted] = 0.0
    return d


LOGIT_ROWS = 8  # logits rows at a time: 8 x 50257 floats (1.6 MB) stay in the cache through every step


def cross_entropy_fast(logits, targets):
    """cross_entropy and cross_entropy_backward in one pass, for the hot path: logits [N, V]
    is overwritten with d loss / d logits, LOGIT_ROWS rows at a time, each one's max, exp, sum and
    scale done while it is in the cache, and the rows shared among the cores (each pass over
    the whole [N, V] would be a trip through main memory). targets [N] -> the loss, the mean
    over the targets that are not IGNORE; an IGNORE row's gradient is 0."""
    targets = np.asarray(targets, like=logits)  # where the logits are (NEP 35: onto a GPU, if they are there)
    counted = targets != IGNORE
    n = max(int(np.count_nonzero(counted)), 1)
    masked = n < len(targets)  # instruction data; a window of text counts every position
    rows = rows_at_a_time(logits, LOGIT_ROWS)  # on a GPU, all at once: one launch each, not one a chunk

    totals = {}  # each chunk's, summed in the chunks' order below: the same loss whichever thread took which

    def work(starts):
        for i in starts:
            x, t = logits[i:i + rows], targets[i:i + rows]
            at = (np.arange(len(t), like=t), t)  # each row's target (like=: where the targets are)
            x -= x.max(axis=-1, keepdims=True)
            picked = x[at]  # logit - max, at each target (an IGNORE row's is dropped below)
            np.exp(x, out=x)
            sums = x.sum(axis=-1, keepdims=True)
            losses = np.log(sums[:, 0]) - picked  # -log softmax at each target
            x *= 1.0 / (n * sums)
            x[at] -= 1.0 / n
            if masked:
                x[~counted[i:i + rows]] = 0.0
                losses = losses[counted[i:i + rows]]
            totals[i] = float(losses.sum())

    shared_among_cores(work, list(range(0, len(targets), rows)))
    return sum(totals[i] for i in sorted(totals)) / n


def head_backward(xf, wte, targets, buffers=None, frozen=False):
    """The tied output layer and the loss, forward then backward:
    logits = x wteᵀ;  dlogits = (softmax - onehot) / N;  dx = dlogits wte;  dwte = dlogitsᵀ x (the head's part)
    xf [B, T, C], wte [V, C], targets [B, T] -> (loss, dx [B, T, C], dwte [V, C]). N counts the
    targets that are not IGNORE; an IGNORE position's dlogits, and so its dx, is exactly 0.
    The logits and dwte live in `buffers`, reused at the next call. frozen (a LoRA run): no dwte (None)."""
    x = xf.reshape(-1, xf.shape[-1])  # [N, C]
    logits = reused(buffers, "logits", (len(x), len(wte)), x.dtype, like=x)
    np.matmul(x, wte.T, out=logits)
    loss = cross_entropy_fast(logits, targets.reshape(-1))  # logits is now dlogits
    dwte = None if frozen else np.matmul(logits.T, x, out=reused(buffers, "dwte", wte.shape, x.dtype, like=x))
    return loss, (logits @ wte).reshape(xf.shape), dwte


def transformer_block_backward(kept, ln_1, attn, ln_2, mlp, hparams, dy, p_drop=0.0, frozen=False, hook=no_hook,
                               stops=()):
    """x + mha(ln_1(x)), then + ffn(ln_2(x)), backwards: each residual passes dy straight through
    and adds what flows back through its branch (and through its dropout, if any).
    dy [B, T, C] -> dx [B, T, C], grads (frozen, a LoRA run: the adapters' alone)
    hook: the gradient of each activation the block passes through its forward hook, by the same name.
    stops (with frozen): what is held constant (STOPS); with "mlp", hook("mlp.out") still sees its gradient."""
    eps = layer_norm_eps(hparams)
    dy = hook("resid_post", dy)
    if "mlp" in stops:  # the MLP's output a constant: nothing flows back through it
        hook("mlp.out", dy)
        dln2, mlp_grads = np.zeros_like(dy), {}
    else:
        dln2, mlp_grads = ffn_backward(kept["ln_2"], kept["mlp.c_fc"], kept["mlp.gelu"], mlp["c_fc"], mlp["c_proj"],
                                       dropout_backward(kept.get("mlp.out.mask"), p_drop, hook("mlp.out", dy)),
                                       frozen, hook)
    norm_backward = frozen_scale_backward if "scale" in stops else layer_norm_backward
    dmid, dg2, db2 = norm_backward(kept["resid_mid"], ln_2["g"], hook("ln_2", dln2), eps)
    dmid = hook("resid_mid", dmid + dy)
    dln1, attn_grads = mha_backward(kept, attn["c_attn"], attn["c_proj"], hparams["n_head"],
                                    dropout_backward(kept.get("attn.out.mask"), p_drop, hook("attn.out", dmid)),
                                    p_drop, frozen, hook, "pattern" in stops)
    dx, dg1, db1 = norm_backward(kept["resid_pre"], ln_1["g"], hook("ln_1", dln1), eps)
    dx = hook("resid_pre", dx + dmid)
    if frozen:
        return dx, {"attn": attn_grads, "mlp": mlp_grads}
    return dx, {"ln_1": {"g": dg1, "b": db1}, "attn": attn_grads, "ln_2": {"g": dg2, "b": db2},
                       "mlp": mlp_grads}


def embedding_backward(ids, dx, dwte, dwpe):
    """x = wte[ids] + wpe[positions] backwards, added into dwte [V, C] and dwpe [n_ctx, C]:
    dwte[v] += Σ dx over the positions holding token v,  dwpe[t] += Σ dx[:, t] over the batch.
    ids [B, T], dx [B, T, C]"""
    ids = np.asarray(ids, like=dwte)  # where the gradients are: the host's ids copied to a GPU, if they are there
    np.add.at(dwte, ids.reshape(-1), dx.reshape(-1, dx.shape[-1]))  # a token seen twice adds twice
    dwpe[:ids.shape[1]] += dx.sum(axis=0)


def loss_and_grads(ids, targets, params, hparams, p_drop=0.0, rng=None, buffers=None, frozen=False):
    """Mean cross-entropy of targets [B, T] given ids [B, T], and d loss / d every parameter.
    loss = -mean log softmax(logits)[target];  d loss / d logits = (softmax(logits) - onehot) / (B·T)
    A target IGNORE (a prompt's position, padding) counts for nothing: the mean is over the others.
    The head is wte again, so wte's gradient adds two parts: the logits' (dlogitsᵀ x) and the gather's.
    p_drop, rng: dropout. buffers: a dict kept between calls (the training loop's), whose arrays are
    reused; the returned grads["wte"] is one of them, good until the next call.
    frozen: a LoRA run, whose weights are all frozen: grads holds the adapters' A and B alone
    ({"blocks": [{"attn": {"c_attn": {"lora": {"A", "B"}}, ...}, ...}, ...]})."""
    ids, targets = checked_ids(ids, params), np.asarray(targets)
    checked_ids(np.where(targets == IGNORE, 0, targets), params)
    loss, grads, _ = forward_backward(ids, params, hparams, lambda xf: (
        *head_backward(xf, params["wte"], targets, buffers, frozen), None), p_drop, rng, frozen)
    return loss, grads


def forward_backward(ids, params, hparams, head, p_drop=0.0, rng=None, frozen=False):
    """What every objective's gradients go through (the language model's, a classifier's, DPO's): the training
    forward, the objective's head on ln_f's output, then the backward pass, wte's gradient being the head's
    part (where the head is wte itself) plus the gather's.   ids [B, T] (checked)
    head(ln_f's output [B, T, C]) -> (loss, its gradient [B, T, C], the head's part of wte's gradient [V, C],
    or a zero array where the head is not wte, or None when frozen; what else the head returns)
    -> (loss, grads, what else the head returned)"""
    kept, top = training_forward(ids, params, hparams, p_drop, rng)
    loss, dxf, dwte, more = head(top["ln_f"])
    return loss, model_backward(ids, kept, top, params, hparams, dxf, dwte, p_drop, frozen), more


def model_backward(ids, kept, top, params, hparams, dxf, dwte=None, p_drop=0.0, frozen=False, hook=no_hook, stops=(),
                   start=None):
    """gpt2_hidden backwards, from dxf [B, T, C], the gradient of ln_f's output: ln_f, the blocks from the
    last, the embeddings' gather (added into dwte, the head's part of wte's gradient). -> grads (frozen: the
    adapters' alone). hook: each activation's gradient, by gpt2_numpy's names (see the top of the file).
    stops (with frozen): what the backward holds constant (STOPS). start: dxf is block start's output's gradient
    instead, and the backward begins there (ln_f and the blocks above it are not run). kept, top may be one
    sequence's ([1, T, ...]) for a batch of gradients [B, T, C]: every step broadcasts."""
    eps, n_blocks = layer_norm_eps(hparams), len(params["blocks"]) if start is None else start + 1
    norm_backward = frozen_scale_backward if "scale" in stops else layer_norm_backward
    dx, dgf, dbf = (dxf, None, None) if start is not None else \
        norm_backward(top["x"], params["ln_f"]["g"], hook("ln_f", dxf), eps)
    grads = {"ln_f": {"g": dgf, "b": dbf}, "blocks": [None] * len(params["blocks"])}
    for i in reversed(range(n_blocks)):
        dx, grads["blocks"][i] = transformer_block_backward(kept[i], **params["blocks"][i], hparams=hparams, dy=dx,
                                                            p_drop=p_drop, frozen=frozen, hook=block_hook(hook, i),
                                                            stops=stops)
    dx = hook("wte", dropout_backward(kept[0].get("resid_pre.mask"), p_drop, dx))  # after the embeddings' dropout
    hook("wpe", dx.sum(axis=0))  # wpe[positions] is one row a position for the whole batch: its rows' sum
    if frozen:
        return {"blocks": grads["blocks"]}  # the adapters' alone: nothing else is trained
    grads["wte"], grads["wpe"] = dwte, np.zeros_like(params["wpe"])
    embedding_backward(ids, dx, grads["wte"], grads["wpe"])  # wte's second part: the gather's
    return grads


def activation_grads(ids, params, hparams, dlogits, hook, forward_hook=no_hook):
    """The backward pass from any metric of the logits, for the activations' gradients: dlogits [B, T, V],
    d metric / d logits, comes back through the tied head (logits = x wteᵀ, so dx = dlogits wte) and
    model_backward, and each activation's gradient goes through hook(name, grad), the forward hooks'
    mirror. No weight's gradient is made (as for a LoRA run's frozen weights). ids [B, T]
    forward_hook: the forward pass's own hook (an SAE spliced in, say), whose backward `hook` then holds."""
    ids = checked_ids(ids, params)
    kept, top = training_forward(ids, params, hparams, hook=forward_hook)
    model_backward(ids, kept, top, params, hparams, matmul(dlogits, params["wte"]), frozen=True, hook=hook)
