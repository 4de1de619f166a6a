"""Sparse autoencoders: a wide, sparse dictionary of one activation's directions, trained, read and
spliced into the model exactly as SAELens 6.54.12 does it, with the backward pass by hand.

    python sae.py train --site blocks.2.hook_resid_pre --data input.txt --d-sae 2048 --l1 5 --out sae/
    python sae.py eval --sae sae/ --data input.txt --json

An SAE reads one activation x (a residual stream, TransformerLens's name: blocks.L.hook_resid_pre) and
writes it as a sum of few directions out of many (d_sae of them, d_sae >> d_in):

  1. the SAE              encode: f = ReLU((x - b_dec) W_enc + b_enc),  decode: x̂ = f W_dec + b_dec
  2. its loss             Σ_d (x̂ - x)², the mean over tokens, + C · Σ_i f_i ‖W_dec[i]‖, the mean over tokens
  3. its backward         by hand, beside the loss; Adam and clipping are optimizer.py's
  4. training             SAELens's initialisation, the L1 warm-up, one step
  5. activations          gathered through look_inside's hooks, the forward pass stopped after the hook's layer;
                          their normalisation, and the factor folded into the weights at save
  6. splicing             the hook point's output replaced by x̂ (or x̂ plus the error term, which changes nothing)
  7. SAELens's evals      L0, explained variance, CE loss recovered, KL
  8. reading a latent     its density, its top contexts, the tokens its decoder direction promotes

An SAE here is a dict: its four float32 arrays W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in],
b_dec [d_in], and "cfg", SAELens's cfg.json as a dict (d_in, d_sae, apply_b_dec_to_input,
normalize_activations, metadata {hook_name, model_name, ...}). Its folder is plumbing/sae_files.py's.
Shapes: N tokens (a batch's positions, flattened), d_in the activation's width, d_sae the latents.
"""

if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("sae_cli")  # the command line (train, eval, encode, features): this file is the SAE

import math

import numpy as np

from gpt2_numpy import checked_ids, gpt2_hidden, log_softmax
from look_inside import activation_shapes, check_names, model_hook, run_with_hooks
from optimizer import adamw_update, clip_scale
from plumbing.errors import UserError

PARAMS = ("W_enc", "b_enc", "W_dec", "b_dec")  # SAELens's tensor names, in sae_weights.safetensors
DECODER_INIT_NORM = 0.1  # SAELens's decoder_init_norm: each decoder row starts this long (Anthropic, 2024)


# ============================================================================
# 1. The SAE
# ============================================================================

def encode_pre(x, sae):
    """The latents before the ReLU (SAELens's hook_sae_acts_pre):
    h = (x - b_dec) W_enc + b_enc, or x W_enc + b_enc without apply_b_dec_to_input.   [N, d_in] -> [N, d_sae]"""
    if sae["cfg"].get("apply_b_dec_to_input", True):
        x = x - sae["b_dec"]  # the decoder's bias is the dictionary's origin: encode from there
    return x @ sae["W_enc"] + sae["b_enc"]


def encode(x, sae):
    """f = ReLU((x - b_dec) W_enc + b_enc): how much of each direction x holds, most of them 0.   [N, d_in] -> [N, d_sae]"""
    return np.maximum(encode_pre(x, sae), 0.0)


def decode(f, sae):
    """x̂ = f W_dec + b_dec: the activation rebuilt from the latents.   [N, d_sae] -> [N, d_in]"""
    return f @ sae["W_dec"] + sae["b_dec"]


# ============================================================================
# 2. Its loss
# ============================================================================

def mse_loss(x_hat, x):
    """Σ over d_in of (x̂ - x)², the mean over tokens (SAELens's: summed over the width, not averaged).
    x_hat, x [N, d_in] -> a float"""
    return float(((x_hat - x) ** 2).sum(-1).mean())


def decoder_norms(W_dec):
    """‖W_dec[i]‖₂, each latent's decoder row.   [d_sae, d_in] -> [d_sae]"""
    return np.sqrt((W_dec * W_dec).sum(-1))


def l1_loss(f, W_dec, l1_coefficient):
    """C · Σ_i f_i ‖W_dec[i]‖₂, the mean over tokens. Weighted by the decoder's norms, so that shrinking f
    while growing W_dec[i] does not buy sparsity for nothing.   f [N, d_sae] -> a float"""
    return float(l1_coefficient * (f @ decoder_norms(W_dec)).mean())


def l1_coefficient(step, final, warm_up):
    """The L1 coefficient at a step (from 0), as SAELens's CoefficientScheduler counts: C · min(step, W) / W,
    so the first step's is 0; C throughout without a warm-up."""
    return final * min(step, warm_up) / warm_up if warm_up > 0 else final


def sae_loss(x, sae, l1):
    """SAELens's StandardTrainingSAE loss: mse_loss + l1_loss. -> (total, {"mse_loss", "l1_loss"}, f [N, d_sae])"""
    f = encode(x, sae)
    parts = {"mse_loss": mse_loss(decode(f, sae), x), "l1_loss": l1_loss(f, sae["W_dec"], l1)}
    return parts["mse_loss"] + parts["l1_loss"], parts, f


# ============================================================================
# 3. Its backward
# ============================================================================

def sae_backward(x, sae, l1):
    """Every gradient of sae_loss, by hand. With n_i = ‖W_dec[i]‖, N tokens:
    dx̂ = 2 (x̂ - x) / N;   df = dx̂ W_decᵀ + (C/N) n;   dh = df · [h > 0]
    dW_dec = fᵀ dx̂ + (C/N) (Σ_tokens f_i) W_dec[i] / n_i;   db_dec = Σ dx̂ - a (Σ dh) W_encᵀ  (a: apply_b_dec_to_input)
    dW_enc = (x - a b_dec)ᵀ dh;   db_enc = Σ dh
    -> (losses {"loss", "mse_loss", "l1_loss", "l0"}, grads {name: array}, f [N, d_sae])"""
    N = x.shape[0]
    applied = sae["cfg"].get("apply_b_dec_to_input", True)
    f = np.maximum(encode_pre(x, sae), 0.0)  # [N, d_sae]
    x_hat = decode(f, sae)  # [N, d_in]
    losses = {"mse_loss": mse_loss(x_hat, x), "l1_loss": l1_loss(f, sae["W_dec"], l1)}
    losses["loss"] = losses["mse_loss"] + losses["l1_loss"]
    losses["l0"] = float(np.count_nonzero(f) / N)
    err = x_hat - x
    norms = decoder_norms(sae["W_dec"])  # [d_sae]
    d_x_hat = err * (2.0 / N)  # [N, d_in]
    dh = d_x_hat @ sae["W_dec"].T  # df, then dh in place   [N, d_sae]
    dh += (l1 / N) * norms
    dh *= f > 0  # ReLU passes the gradient where it passed the input
    x_in = x - sae["b_dec"] if applied else x
    grads = {"W_enc": x_in.T @ dh, "b_enc": dh.sum(0),
             "W_dec": f.T @ d_x_hat + ((l1 / N) * f.sum(0) / norms)[:, None] * sae["W_dec"],
             "b_dec": d_x_hat.sum(0)}
    if applied:
        grads["b_dec"] -= grads["b_enc"] @ sae["W_enc"].T
    return losses, grads, f


# ============================================================================
# 4. Training: the initialisation, Adam with clipping, one step
# ============================================================================

def new_sae(d_in, d_sae, seed=0, apply_b_dec_to_input=True, metadata=None):
    """An SAE as SAELens initialises its StandardTrainingSAE: W_dec Kaiming-uniform (bound √6 / √d_in), each
    row then scaled to ‖·‖ = 0.1 (decoder_init_norm); W_enc = W_decᵀ; b_enc = b_dec = 0."""
    if d_in < 1 or d_sae < 1:
        raise UserError(f"must be at least 1, got {min(d_in, d_sae)}", arg="d_sae")
    rng = np.random.default_rng(seed)
    bound = math.sqrt(6.0 / d_in)  # kaiming_uniform_'s: gain √2 times √(3 / fan_in)
    W_dec = rng.uniform(-bound, bound, (d_sae, d_in)).astype(np.float32)
    W_dec *= DECODER_INIT_NORM / decoder_norms(W_dec)[:, None]
    cfg = {"d_in": d_in, "d_sae": d_sae, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": apply_b_dec_to_input, "normalize_activations": "none",
           "reshape_activations": "none", "metadata": dict(metadata or {}), "architecture": "standard"}
    return {"W_enc": np.ascontiguousarray(W_dec.T), "b_enc": np.zeros(d_sae, np.float32), "W_dec": W_dec,
            "b_dec": np.zeros(d_in, np.float32), "cfg": cfg}


def new_adam_state(sae):
    """Adam's two moments of each of the SAE's tensors, zero, and the step count."""
    return {"step": 0, "m": {k: np.zeros_like(sae[k]) for k in PARAMS}, "v": {k: np.zeros_like(sae[k]) for k in PARAMS}}


def adam_step(sae, grads, state, lr, max_norm=1.0, beta1=0.9, beta2=0.999):
    """SAELens's trainer's update: the gradients clipped to a global norm of max_norm (torch's clip_grad_norm_),
    then torch's Adam (optimizer.adamw_update without weight decay), in place. -> the norm before clipping"""
    norm = math.sqrt(sum(float(np.vdot(grads[k], grads[k])) for k in PARAMS))
    scale = clip_scale(norm, max_norm)
    state["step"] += 1
    for k in PARAMS:
        grad = grads[k] * scale if scale != 1.0 else grads[k]
        adamw_update(sae[k], grad, state["m"][k], state["v"][k], state["step"], lr, 0.0, beta1, beta2)
    return norm


def train_step(x, sae, state, lr, l1):
    """One step of SAELens's trainer on a batch x [N, d_in]: the loss and its gradients, clipping, Adam.
    l1: this step's coefficient (l1_coefficient). -> losses {"loss", "mse_loss", "l1_loss", "l0"}"""
    losses, grads, _ = sae_backward(x, sae, l1)
    adam_step(sae, grads, state, lr)
    return losses


# ============================================================================
# 5. Activations, and their normalisation
# ============================================================================

def site_layer(site, n_layer):
    """The last block a hook point needs: blocks.3.hook_resid_post -> 3; the embeddings -> -1 (none);
    ln_final.hook_normalized -> the last."""
    if site.startswith("blocks."):
        return int(site.split(".")[1])
    return n_layer - 1 if site.startswith("ln_final") else -1


def check_site(site, hparams):
    """A hook point of look_inside's names whose activation is a [B, T, d] array; -> d."""
    shapes = activation_shapes(hparams, 1, 1)
    check_names([site], shapes)
    shape = shapes[site]
    if len(shape) != 3:
        raise UserError(f"{site} is [B, T, H, D] or [B, H, T, T]: an SAE here reads a [B, T, d] activation "
                        "(a residual stream, an attention or MLP output, hook_pre/hook_post)", arg="site")
    return shape[-1]


def gather(ids, params, hparams, site, hooks=None):
    """The activation at a hook point for a batch of windows: the forward pass of the blocks up to the
    hook's layer only (the later ones cannot change it), through look_inside's hooks (and `hooks`, such as
    centring_hooks, before it is read).   ids [B, T] -> [B, T, d] float32"""
    ids = checked_ids(np.atleast_2d(ids), params)
    check_site(site, hparams)
    kept, before = {}, (hooks or {}).get(site) or (lambda x, name: None)

    def keep(x, name):
        changed = before(x, name)  # None: x as it is
        x = x if changed is None else changed
        kept[name] = x.astype(np.float32)  # a copy (on the device x is on): the forward pass goes on with x
        return x

    first = {**params, "blocks": params["blocks"][:site_layer(site, hparams["n_layer"]) + 1]}
    gpt2_hidden(ids, first, hparams, hook=model_hook({**(hooks or {}), site: keep}))
    return kept[site]


def windows(ids, context, eot):
    """A text's ids cut into windows of `context` tokens, each <|endoftext|> and then context - 1 of the text's;
    the last, shorter part is dropped unless there is no whole window (then one row of what there is).
    ids [n] -> [W, context]"""
    ids = np.asarray(ids, dtype=np.int64)
    step = context - 1
    n = len(ids) // step
    if n == 0:
        return np.concatenate([[eot], ids])[None]
    body = ids[:n * step].reshape(n, step)
    return np.concatenate([np.full((n, 1), eot, np.int64), body], axis=1)


def gather_all(rows, params, hparams, site, batch=8, progress=None, hooks=None):
    """gather() over windows [W, T], `batch` windows a forward pass. -> [W, T, d]"""
    out = []
    for start in range(0, len(rows), batch):
        out.append(gather(rows[start:start + batch], params, hparams, site, hooks))
        if progress is not None:
            progress(len(out[-1]))
    return np.concatenate(out)


def scaling_factor(x):
    """SAELens's expected_average_only_in normalisation: √d_in / mean ‖x‖, so that a scaled activation's
    norm is √d_in on average (Anthropic's April 2024 update).   x [N, d_in] -> a float"""
    return math.sqrt(x.shape[-1]) / float(np.sqrt((x.astype(np.float64) ** 2).sum(-1)).mean())


def fold_scaling_factor(sae, factor):
    """An SAE trained on activations scaled by `factor`, as one that reads them unscaled (SAELens's
    fold_activation_norm_scaling_factor): W_enc · s, W_dec / s, b_dec / s; the cfg then says "none"."""
    folded = {**sae, "W_enc": sae["W_enc"] * np.float32(factor), "W_dec": sae["W_dec"] / np.float32(factor),
              "b_dec": sae["b_dec"] / np.float32(factor)}
    folded["cfg"] = {**sae["cfg"], "normalize_activations": "none"}
    return folded


# ============================================================================
# 6. Splicing the SAE into the model
# ============================================================================

def hook_name(sae):
    """The hook point an SAE reads (its metadata's hook_name)."""
    return sae["cfg"].get("metadata", {}).get("hook_name")


def check_fits(sae, hparams, site=None):
    """The SAE's d_in must be the width of its hook point's activation. -> the hook point"""
    site = site or hook_name(sae)
    if not site:
        raise UserError("the SAE names no hook point (its cfg.json's metadata has no hook_name)")
    width = check_site(site, hparams)
    if sae["cfg"]["d_in"] != width:
        raise UserError(f"the SAE reads {sae['cfg']['d_in']} numbers a token but {site} has {width}: "
                        "it was trained on another model or hook point")
    return site


def splice(sae, use_error_term=False, mask=None):
    """The SAE at its hook point, for look_inside's run_with_cache and run_with_hooks (sae=...): the
    activation x [B, T, d] goes on as x̂, or with use_error_term as x̂ + (x - x̂), so that the model's output
    is unchanged and the latents can be read. mask [B, T]: where to splice (elsewhere x goes on: SAELens's
    evals leave <|endoftext|> alone). -> (the hook's name, fn(x, unhooked=None) -> (what goes on, {SAELens's
    names: arrays}), fn's backward grad(x, g) -> dx). unhooked: the activation before a hook on the SAE's
    input (SAELens's hook_sae_input) changed it to x: the error term is its own, x - x̂ taken there, as SAELens
    takes it with the SAE's hooks off."""
    site = hook_name(sae)

    def run(x, unhooked=None):
        unhooked = x if unhooked is None else unhooked
        h = encode_pre(x, sae)
        f = np.maximum(h, 0.0)
        x_hat = decode(f, sae)
        if use_error_term:  # the error term: x - x̂ where the model made x, before any hook on the SAE's input
            error = unhooked - (x_hat if unhooked is x else decode(encode(unhooked, sae), sae))
        out = x_hat + error if use_error_term else x_hat
        if mask is not None:
            out = np.where(mask[..., None], out, unhooked)
        latents = {"hook_sae_input": x, "hook_sae_acts_pre": h, "hook_sae_acts_post": f,
                   "hook_sae_recons": x_hat, "hook_sae_output": out}
        if use_error_term:
            latents["hook_sae_error"] = error
        return out, {f"{site}.{k}": v for k, v in latents.items()}

    def grad(x, g):
        dx = input_grad(x, g, sae)
        return dx if mask is None else np.where(mask[..., None], dx, g)

    return site, run, grad


def input_grad(x, g, sae):
    """The backward of the spliced SAE for its input, as SAELens's autograd takes it: through x̂ alone, with
    or without the error term (SAELens computes x - x̂ under torch.no_grad: a constant to the gradient).
    x̂ = ReLU((x - a b_dec) W_enc + b_enc) W_dec + b_dec:   dx = ((g W_decᵀ) ⊙ [h > 0]) W_encᵀ
    x, g [..., d_in] (g: the gradient of what went on) -> dx [..., d_in]"""
    return ((g @ sae["W_dec"].T) * (encode_pre(x, sae) > 0)) @ sae["W_enc"].T


def run_with_sae(ids, params, hparams, sae, use_error_term=False, hooks=None):
    """SAELens's run_with_saes: the logits with the SAE spliced in at its hook point.   ids [B, T] -> [B, T, V]"""
    return run_with_hooks(ids, params, hparams, hooks or {}, sae=splice(sae, use_error_term))


def centre(x, name):
    """x - mean(x) over the residual stream's width: what a centred writing weight writes."""
    return x - x.mean(-1, keepdims=True)


def centring_hooks(n_layer):
    """The model as TransformerLens's center_writing_weights leaves it: every weight that writes to the
    residual stream (W_E, W_pos, each W_O and W_out, and their biases) has its mean over d_model taken
    away, so every write, and the stream, has mean 0. LayerNorm takes the mean away anyway, so nothing
    the model computes changes, but the residual stream's values do: the published GPT-2 small SAEs read
    those. As hooks on each write (the unembedding, which TransformerLens keeps apart from W_E, is not
    touched: the logits stay the same)."""
    writes = ["hook_embed", "hook_pos_embed"] + [f"blocks.{i}.{w}" for i in range(n_layer)
                                                 for w in ("hook_attn_out", "hook_mlp_out")]
    return dict.fromkeys(writes, centre)


# ============================================================================
# 7. SAELens's evals
# ============================================================================

def kl_divergence(clean, other):
    """KL(clean ‖ other) at each position, from log-probabilities: Σ_v p_clean (log p_clean - log p_other).
    [..., V] -> [...]"""
    return (np.exp(clean) * (clean - other)).sum(-1)


def evaluate_batch(rows, params, hparams, sae, special, hooks=None):
    """One batch of SAELens's evals, per token, over positions whose token is not in `special`
    (exclude_special_tokens): -> {name: the per-token values kept}, and the activations' sums."""
    site, hooks = hook_name(sae), hooks or {}
    mask = ~np.isin(rows, list(special))  # [B, T]
    mask, next_ids = (np.asarray(a, like=params["wte"]) for a in (mask, rows[:, 1:, None]))  # where the model is
    x = gather(rows, params, hparams, site, hooks)[mask]  # [n, d]
    f = encode(x, sae)
    x_hat = decode(f, sae)
    runs = {"without_sae": run_with_hooks(rows, params, hparams, hooks),  # log-probabilities, once a run
            "with_sae": run_with_hooks(rows, params, hparams, hooks, sae=splice(sae, mask=mask)),
            "with_ablation": run_with_hooks(rows, params, hparams, {**hooks, site: lambda a, name: np.zeros_like(a)})}
    runs = {k: log_softmax(v) for k, v in runs.items()}
    predicts = mask[:, :-1]  # CE: the positions that predict a next token, from a kept token
    per_token = {"l0": (f != 0).sum(-1).astype(np.float64)}
    for k, logprobs in runs.items():
        next_logprob = np.take_along_axis(logprobs[:, :-1], next_ids, -1)[..., 0]  # [B, T-1]
        per_token[f"ce_loss_{k}"] = -next_logprob[predicts]
        if k != "without_sae":
            per_token[f"kl_div_{k}"] = kl_divergence(runs["without_sae"], logprobs)[mask]
    x64 = x.astype(np.float64)
    sums = {"n": len(x), "x": x64.sum(0), "x2": float((x64 ** 2).sum()), "err2": float(((x64 - x_hat) ** 2).sum())}
    return per_token, sums


def evaluate(rows, params, hparams, sae, special, batch=8, progress=None, hooks=None):
    """SAELens's run_evals on windows [W, T]: l0, explained_variance, the three CE losses and ce_loss_score,
    the two KLs and kl_div_score, each the mean over the tokens not in `special`.
    explained_variance = 1 - E‖x - x̂‖² / (E‖x‖² - ‖E x‖²), over all of them at once."""
    values, totals = {}, {"n": 0, "x": 0.0, "x2": 0.0, "err2": 0.0}
    for start in range(0, len(rows), batch):
        per_token, sums = evaluate_batch(rows[start:start + batch], params, hparams, sae, special, hooks)
        for k, v in per_token.items():
            values.setdefault(k, []).append(v)
        totals = {k: totals[k] + sums[k] for k in totals}
        if progress is not None:
            progress(len(rows[start:start + batch]))
    if not totals["n"]:
        raise UserError("no token to evaluate on: every one is <|endoftext|>")
    m = {k: float(np.concatenate(v).mean()) for k, v in values.items()}
    variance = totals["x2"] / totals["n"] - float((totals["x"] / totals["n"]) @ (totals["x"] / totals["n"]))
    mse = totals["err2"] / totals["n"]
    m["explained_variance"] = (1.0 if mse < 1e-10 else 0.0) if variance < 1e-10 else 1.0 - mse / variance
    m["ce_loss_score"] = (m["ce_loss_with_ablation"] - m["ce_loss_with_sae"]) / (
        m["ce_loss_with_ablation"] - m["ce_loss_without_sae"])
    m["kl_div_score"] = (m["kl_div_with_ablation"] - m["kl_div_with_sae"]) / m["kl_div_with_ablation"]
    return m


# ============================================================================
# 8. Reading a latent
# ============================================================================

def logit_effects(sae, wte, i, k=10):
    """The tokens latent i's decoder direction promotes and suppresses through the unembedding:
    W_dec[i] · wteᵀ. -> (top ids [k], their values, bottom ids [k], their values)"""
    effect = wte @ sae["W_dec"][i]  # [V]
    order = np.argsort(-effect, kind="stable")
    return order[:k], effect[order[:k]], order[::-1][:k], effect[order[::-1][:k]]


def top_activations(f, k):
    """The k largest values of one latent over every position, largest first, and where they are.
    f [W, T] -> (values [≤k], (window, position) pairs)"""
    flat = f.reshape(-1)
    top = np.argsort(-flat, kind="stable")[:k]
    top = top[flat[top] > 0]
    return flat[top], [divmod(int(t), f.shape[1]) for t in top]


def read_features(rows, acts, sae, wte, features, k=10):
    """For each latent in `features`: its firing density (over every position), its top-activating
    (window, position)s, and its logit effects. acts [W, T, d] at its hook point."""
    f = encode(acts.reshape(-1, acts.shape[-1]), sae)[:, features].reshape(*acts.shape[:2], len(features))
    out = []
    for j, i in enumerate(features):
        values, where = top_activations(f[..., j], k)
        up, up_v, down, down_v = logit_effects(sae, wte, i, k)
        out.append({"feature": int(i), "density": float((f[..., j] > 0).mean()),
                    "top": [(float(v), w, t) for v, (w, t) in zip(values, where)],
                    "promotes": list(zip(up.tolist(), up_v.tolist())),
                    "suppresses": list(zip(down.tolist(), down_v.tolist())), "acts": f[..., j]})
    return out

