"""Sparse autoencoders: a wide, sparse dictionary of one activation's directions, trained, read and
spliced into the model exactly as SAELens 6.54.12 does it, with the backward pass by hand.

    python sae.py train --site blocks.2.hook_resid_pre --data input.txt --d-sae 2048 --l1 5 --out sae/
    python sae.py eval --sae sae/ --data input.txt --json

An SAE reads one activation x (a residual stream, TransformerLens's name: blocks.L.hook_resid_pre) and
writes it as a sum of few directions out of many (d_sae of them, d_sae >> d_in):

  1. the SAE              encode: f = ReLU((x - b_dec) W_enc + b_enc),  decode: x̂ = f W_dec + b_dec; and every
                          architecture SAELens runs: TopK, JumpReLU (a BatchTopK saved), transcoders, run-time
                          normalisation (OpenAI's layer_norm)
  2. its loss             Σ_d (x̂ - x)², the mean over tokens, + C · Σ_i f_i ‖W_dec[i]‖, the mean over tokens
  3. its backward         by hand, beside the loss; Adam and clipping are optimizer.py's
  4. training             SAELens's initialisation, the L1 warm-up, one step; every architecture; transcoders
  5. activations          gathered through look_inside's hooks, the forward pass stopped after the hook's layer;
                          their normalisation, and the factor folded into the weights at save
  6. splicing             the hook point's output replaced by x̂ (or x̂ plus the error term, which changes nothing)
  7. SAELens's evals      L0, explained variance, CE loss recovered, KL
  8. reading a latent     its density, its top contexts, the tokens its decoder direction promotes

An SAE here is a dict: its four float32 arrays W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_out],
b_dec [d_out] (d_out = d_in but for a transcoder), threshold [d_sae] for a JumpReLU, W_skip [d_out, d_in] for a
skip transcoder, and "cfg", SAELens's cfg.json as a dict (d_in, d_sae, apply_b_dec_to_input,
normalize_activations, architecture, k..., metadata {hook_name, hook_name_out, model_name, ...}). Its folder is
plumbing/sae_files.py's.
Shapes: N tokens (a batch's positions, flattened), d_in the activation's width, d_sae the latents.
"""

if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("sae_cli")  # the command line (train, eval, encode, features): this file is the SAE

import math

import numpy as np

from gpt2_numpy import checked_ids, gpt2_hidden, log_softmax
from look_inside import activation_shapes, check_names, model_hook, run_with_hooks
from optimizer import adamw_update, clip_scale, grad_norm
from plumbing.errors import UserError, plural

PARAMS = ("W_enc", "b_enc", "W_dec", "b_dec")  # SAELens's tensor names, in sae_weights.safetensors
DECODER_INIT_NORM = 0.1  # SAELens's decoder_init_norm: each decoder row starts this long (Anthropic, 2024)
ARCHITECTURES = ("standard", "topk", "jumprelu", "transcoder", "skip_transcoder", "jumprelu_transcoder",
                 "jumprelu_skip_transcoder")  # SAELens's inference SAEs read here (a BatchTopK is saved as jumprelu)
NORMALIZATIONS = ("none", "expected_average_only_in", "covariance_whitening", "constant_norm_rescale", "layer_norm")
LAYER_NORM_EPS = 1e-5  # SAELens's run_time_activation_ln_in: σ + 1e-5, σ the unbiased standard deviation


# ============================================================================
# 1. The SAE, and its architectures
# ============================================================================
# Every architecture encodes h = (x' - b_dec) W_enc + b_enc and decodes x̂ = f W_dec + b_dec; they differ in
# how f, the latents that fire, is taken from h (activation):
#   standard, transcoder        f = ReLU(h)
#   topk                        f = ReLU of each token's k largest h·n (n_i = ‖W_dec[i]‖ with
#                               rescale_acts_by_decoder_norm), decoded as (f / n) W_dec
#   jumprelu (and a BatchTopK)  f = ReLU(h) · [h > θ_i], a threshold a latent
# x' is x normalised at run time (normalize_activations: layer_norm, constant_norm_rescale) and x̂ de-normalised.
# A transcoder reads one hook point and writes another (d_out wide): b_dec is never taken from its input, and a
# skip transcoder adds W_skip x. The sae dict's arrays: W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_out],
# b_dec [d_out], and threshold [d_sae] (jumprelu*), W_skip [d_out, d_in] (*skip_transcoder); d_out = d_in but for
# a transcoder.

def is_transcoder(sae):
    """A transcoder reads one activation and writes another (its cfg's metadata.hook_name_out)."""
    return sae["cfg"].get("architecture", "standard").endswith("transcoder")


def normalize(x, sae):
    """SAELens's run-time normalisation of the SAE's input (run_time_activation_norm_fn_in).
    layer_norm (OpenAI's):        x' = (x - μ) / (σ + 1e-5), σ the unbiased standard deviation over d_in
    constant_norm_rescale:        x' = x · √d_in / ‖x‖
    none, expected_average_only_in, covariance_whitening: x (their factors are folded into the weights at save)
    x [N, d_in] -> (x' [N, d_in], (scale, shift) [N, 1] each: what denormalize undoes, or None)"""
    how = sae["cfg"].get("normalize_activations", "none")
    if how == "layer_norm":
        mu = x.mean(-1, keepdims=True)
        x = x - mu
        sigma = x.std(-1, ddof=1, keepdims=True)  # torch's std: unbiased
        return x / (sigma + np.float32(LAYER_NORM_EPS)), (sigma, mu)
    if how == "constant_norm_rescale":
        coefficient = np.float32(math.sqrt(x.shape[-1])) / np.sqrt((x * x).sum(-1, keepdims=True))
        return x * coefficient, (1 / coefficient, None)
    return x, None


def denormalize(y, stats):
    """The SAE's output back in the input's units (run_time_activation_norm_fn_out): y · scale + shift.
    layer_norm: y σ + μ (σ, not σ + 1e-5: SAELens's); constant_norm_rescale: y ‖x‖ / √d_in."""
    if stats is None:
        return y
    scale, shift = stats
    return y * scale if shift is None else y * scale + shift


def encode_pre(x, sae):
    """The latents before they fire (SAELens's hook_sae_acts_pre): h = (x' - b_dec) W_enc + b_enc, x' the
    normalised input; without apply_b_dec_to_input (and always for a transcoder), x' W_enc + b_enc.
    [N, d_in] -> [N, d_sae]"""
    x, _ = normalize(x, sae)
    if sae["cfg"].get("apply_b_dec_to_input", True) and not is_transcoder(sae):
        x = x - sae["b_dec"]  # the decoder's bias is the dictionary's origin: encode from there
    return x @ sae["W_enc"] + sae["b_enc"]


def rescaled(sae):
    """A TopK SAE's rescale_acts_by_decoder_norm: it ranks h·‖W_dec[i]‖ and decodes f/‖W_dec[i]‖."""
    cfg = sae["cfg"]
    return cfg.get("architecture", "standard") == "topk" and cfg.get("rescale_acts_by_decoder_norm", False)


def topk_relu(h, k):
    """f = ReLU of each row's k largest values, 0 elsewhere (SAELens's TopK). np.argpartition finds them in
    linear time: no sort.   h [N, d_sae] -> [N, d_sae]"""
    top = np.argpartition(h, -k, axis=-1)[..., -k:]  # [N, k], in no order
    f = np.zeros_like(h)
    np.put_along_axis(f, top, np.maximum(np.take_along_axis(h, top, -1), 0.0), -1)
    return f


def jumprelu(h, threshold):
    """f = ReLU(h) · [h > θ]: a latent fires only above its own threshold, and then with its whole value.
    h [N, d_sae], threshold [d_sae] -> [N, d_sae]"""
    return np.where(h > threshold, np.maximum(h, 0.0), h.dtype.type(0))


def activation(h, sae):
    """Which latents fire, and how much: f from h by the SAE's architecture (the table above).
    h [N, d_sae] -> f [N, d_sae] (SAELens's hook_sae_acts_post)"""
    architecture = sae["cfg"].get("architecture", "standard")
    if architecture == "topk":
        return topk_relu(h * decoder_norms(sae["W_dec"]) if rescaled(sae) else h, sae["cfg"]["k"])
    if architecture.startswith("jumprelu"):
        return jumprelu(h, sae["threshold"])
    return np.maximum(h, 0.0)


def encode(x, sae):
    """f: how much of each direction x holds, most of them 0 (f = ReLU((x - b_dec) W_enc + b_enc) for the standard
    SAE; the others decide which fire otherwise: activation).   [N, d_in] -> [N, d_sae]"""
    return activation(encode_pre(x, sae), sae)


def decode(f, sae, x=None):
    """x̂ = f W_dec + b_dec: the activation rebuilt from the latents (a TopK SAE's rescaled: (f / n) W_dec + b_dec).
    x: the input, for a run-time normalisation to be undone (denormalize; without it, x̂ is in the normalised
    units, SAELens's hook_sae_recons). A transcoder's output is never de-normalised (SAELens's).
    [N, d_sae] -> [N, d_out]"""
    x_hat = unscaled(f, sae) @ sae["W_dec"] + sae["b_dec"]
    if x is None or is_transcoder(sae):
        return x_hat
    return denormalize(x_hat, normalize(x, sae)[1])


def unscaled(f, sae):
    """The latents as the decoder reads them: a TopK SAE that ranks by h ‖W_dec[i]‖ (rescaled) hands back
    f / ‖W_dec[i]‖, so that each latent's write is still its h times W_dec[i].   [N, d_sae] -> [N, d_sae]"""
    return f * (1 / decoder_norms(sae["W_dec"])) if rescaled(sae) else f


def forward(x, sae):
    """The SAE's whole output for its input: decode(encode(x)) de-normalised, plus W_skip x for a skip
    transcoder. -> (out [N, d_out], f [N, d_sae], h [N, d_sae])"""
    h = encode_pre(x, sae)
    f = activation(h, sae)
    out = decode(f, sae, x)
    if "W_skip" in sae:
        out = out + x @ sae["W_skip"].T
    return out, f, h


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


def trained(sae):
    """The tensors a step trains: the four, a JumpReLU's threshold and a skip transcoder's W_skip."""
    return [k for k in PARAMS + ("threshold", "W_skip") if k in sae]


def new_adam_state(sae):
    """Adam's two moments of each of the SAE's trained tensors, zero, and the step count."""
    return {"step": 0, "m": {k: np.zeros_like(sae[k]) for k in trained(sae)},
            "v": {k: np.zeros_like(sae[k]) for k in trained(sae)}}


def adam_step(sae, grads, state, lr, max_norm=1.0, beta1=0.9, beta2=0.999, norm=None):
    """SAELens's trainer's update: the gradients clipped to a global norm of max_norm (torch's clip_grad_norm_),
    then torch's Adam (optimizer.adamw_update without weight decay), in place. norm: the gradients' global norm,
    if already known (check_step's). -> the norm before clipping"""
    if norm is None:
        norm = grad_norm({"blocks": [grads]})  # optimizer's global norm, the SAE's tensors as one block's
    scale = clip_scale(norm, max_norm)
    state["step"] += 1
    for k in grads:
        grad = grads[k] * scale if scale != 1.0 else grads[k]
        adamw_update(sae[k], grad, state["m"][k], state["v"][k], state["step"], lr, 0.0, beta1, beta2)
    return norm


def train_step(x, sae, state, lr, l1):
    """One step of SAELens's trainer on a batch x [N, d_in]: the loss and its gradients, clipping, Adam.
    l1: this step's coefficient (l1_coefficient). -> losses {"loss", "mse_loss", "l1_loss", "l0"}"""
    losses, grads, _ = sae_backward(x, sae, l1)
    adam_step(sae, grads, state, lr)
    return losses


def training_memory(d_in, d_sae, batch_tokens, data_tokens=0, n_params=2):
    """Bytes a training run needs, about: 16 a parameter (weights, gradients, Adam's two moments) of W_enc and
    W_dec (n_params d_in d_sae numbers), six [N, d_sae] float32 arrays a step (h, f, dh and the temporaries of
    their products and masks), four [N, d_in], and 8 bytes a number of the activations gathered from a text
    (data_tokens of them, and their shuffled copy)."""
    return (16 * (n_params * d_in * d_sae + d_sae + d_in) + 4 * batch_tokens * (6 * d_sae + 4 * d_in)
            + 8 * data_tokens * d_in)


# ============================================================================
# 4b. TopK, BatchTopK and JumpReLU: how each trains
# ============================================================================
# SAELens 6.54.12's training SAEs (sae_lens/saes/{topk,batchtopk,jumprelu}_sae.py) and its trainer
# (training/sae_trainer.py), each backward by hand. The settings are SAELens's training config fields.

TRAINED_ARCHITECTURES = ("standard", "topk", "batchtopk", "jumprelu")
TRAINING_DEFAULTS = {  # SAELens 6.54.12's config fields for each architecture, and their defaults
    "standard": {"l1_coefficient": 1.0, "l1_warm_up_steps": 0},
    "topk": {"k": 100, "aux_loss_coefficient": 1.0, "rescale_acts_by_decoder_norm": True},
    "batchtopk": {"k": 100.0, "aux_loss_coefficient": 1.0, "rescale_acts_by_decoder_norm": True,
                  "topk_threshold_lr": 0.01},
    "jumprelu": {"l0_coefficient": 1.0, "l0_warm_up_steps": 0, "jumprelu_bandwidth": 0.05,
                 "jumprelu_init_threshold": 0.01, "jumprelu_sparsity_loss_mode": "step", "jumprelu_tanh_scale": 4.0,
                 "pre_act_loss_coefficient": None, "jumprelu_ste_to_input": False},
}
TRAINING_EXTRAS = {"standard": {"lp_norm": 1.0}, "topk": {"use_sparse_activations": False},  # fields not followed
                   "batchtopk": {"use_sparse_activations": False}, "jumprelu": {"target_l0": None}}
INFERENCE_FIELDS = {"topk": ("architecture", "dead_feature_window", "k", "rescale_acts_by_decoder_norm")}
INFERENCE_FIELDS = {a: INFERENCE_FIELDS.get(a, ("architecture", "dead_feature_window")) for a in TRAINED_ARCHITECTURES}
DEAD_FEATURE_WINDOW = 1000  # the trainer's: a latent that has not fired for more steps than this is dead


def topk_mask(h, k):
    """[h_ti is among row t's k largest], chosen with np.argpartition (no sort).   [N, d_sae] -> bool"""
    mask = np.zeros(h.shape, bool, like=h)
    if k >= h.shape[-1]:
        mask[:] = True
    elif k > 0:
        np.put_along_axis(mask, np.argpartition(-h, k - 1, axis=-1)[:, :k], True, -1)
    return mask


def batch_topk_mask(acts, k):
    """BatchTopK's choice: the ⌊k N⌋ largest of the whole batch's ReLU'd pre-activations, wherever they are,
    so that k latents fire a token on average.   acts [N, d_sae] -> bool"""
    n = int(k * acts.shape[0])
    flat = np.zeros(acts.size, bool)
    if n >= acts.size:
        flat[:] = True
    elif n > 0:
        flat[np.argpartition(-acts.ravel(), n - 1)[:n]] = True
    return flat.reshape(acts.shape)


def rectangle(u):
    """The kernel of JumpReLU's pseudo-derivatives: 1 on (-1/2, 1/2), else 0."""
    return ((u > -0.5) & (u < 0.5)).astype(np.float32)


def training_backward(x, sae, settings, coefficient=0.0, dead=None, target=None, choose=batch_topk_mask):
    """The training forward of any of the four architectures, its SAELens losses and every gradient, by hand.
    x [N, d_in] (scaled already, if expected_average_only_in); settings: the architecture's config fields
    ({"architecture", ...}, TRAINING_DEFAULTS'); coefficient: this step's l1 or l0 coefficient; dead [d_sae]
    bool: the latents that have not fired for dead_feature_window steps (the trainer's dead_neuron_mask).
    target [N, d_out]: a transcoder's (section 4c), what x̂ is to rebuild in x's place, never de-normalised.

      h  = (x' - b_dec) W_enc + b_enc, times n_i = ‖W_dec[i]‖ for TopK and BatchTopK with
           rescale_acts_by_decoder_norm (the decoder is then as if its rows had norm 1)
      f  standard ReLU(h); TopK ReLU of each row's k largest; BatchTopK the batch's ⌊k N⌋ largest of ReLU(h);
         JumpReLU h · [h > θ]
      x̂  = (f / n) W_dec + b_dec (f W_dec + b_dec without the rescaling), de-normalised (a transcoder's not), and
           + x W_skipᵀ for a skip transcoder
      mse_loss = mean_t Σ_d (x̂ - x)²  and the architecture's own: standard's l1_loss C mean_t Σ_i f_i n_i; TopK's
      auxiliary_reconstruction_loss (AuxK: the dead latents' top d_in/2 pre-activations rebuild the residual
      x - x̂, scaled by min(dead / (d_in/2), 1)); JumpReLU's l0_loss (step: C mean_t Σ_i [h > θ]; tanh:
      C mean_t Σ_i tanh(s f_i n_i)) and pre_act_loss (c mean_t Σ_i ReLU(θ_i - h_i) n_i over dead latents).

    JumpReLU's step has no derivative in θ (0, or infinite at h = θ): SAELens's straight-through estimator
    puts in its place the rectangle kernel of width ε (jumprelu_bandwidth):
    ∂[h > θ]/∂θ ≈ -(1/ε) rect((h - θ)/ε), so ∂f/∂θ ≈ -(θ/ε) rect((h - θ)/ε); to the input h, nothing more
    (or the same with its sign turned, with jumprelu_ste_to_input).
    choose: BatchTopK's choice (data_parallel.py's, over every rank's part of a batch).
    -> (losses {SAELens's names, "loss", "l0"}, grads {name: array}, f [N, d_sae])"""
    arch, cfg = settings["architecture"], sae["cfg"]
    N = x.shape[0]
    dead = np.zeros(sae["b_enc"].shape, bool) if dead is None else dead
    x_in, stats = normalize(x, sae)
    stats = stats if target is None else None  # a transcoder's output is not de-normalised (SAELens's)
    scale = stats[0] if stats else np.float32(1)  # denormalize multiplies the output by it
    applied = cfg.get("apply_b_dec_to_input", True)
    sae_in = x_in if not applied else x_in - sae["b_dec"]  # [N, d_in]: b_dec is the origin where applied
    h0 = sae_in @ sae["W_enc"] + sae["b_enc"]  # [N, d_sae]
    n = decoder_norms(sae["W_dec"])  # [d_sae]
    rescale = arch in ("topk", "batchtopk") and settings["rescale_acts_by_decoder_norm"]
    h = h0 * n if rescale else h0  # SAELens's hidden_pre
    if arch == "jumprelu":
        theta = sae["threshold"]
        passes = h > theta
    elif arch == "topk":
        passes = topk_mask(h, int(settings["k"])) & (h > 0)
    elif arch == "batchtopk":
        passes = choose(np.maximum(h, 0), settings["k"]) & (h > 0)
    else:
        passes = h > 0
    f = h * passes  # [N, d_sae]
    g = f / n if rescale else f  # what the decoder's rows are weighted by
    x_hat = denormalize(g @ sae["W_dec"] + sae["b_dec"], stats)  # [N, d_out]
    if "W_skip" in sae:
        x_hat = x_hat + x @ sae["W_skip"].T
    target = x if target is None else target
    err = x_hat - target
    losses = {"mse_loss": float((err * err).sum(-1).mean())}
    d_pre = err * (np.float32(2.0 / N) * scale)  # the gradient at the decoder's output, before de-normalising
    dW_dec = g.T @ d_pre
    db_dec = d_pre.sum(0)
    dg = d_pre @ sae["W_dec"].T  # [N, d_sae]
    dn = np.zeros_like(n)  # the gradient by the decoder norms, folded into dW_dec at the end
    if rescale:
        dn -= (dg * g).sum(0) / n  # g = f / n
        df = dg / n
    else:
        df = dg
    dh = None  # the sparsity losses' gradient to h, where there is one
    if arch == "standard":
        c = np.float32(coefficient / N)
        losses["l1_loss"] = float(coefficient * (f @ n).mean())
        df += c * n
        dn += c * f.sum(0)
    elif arch in ("topk", "batchtopk"):
        losses["auxiliary_reconstruction_loss"] = 0.0
        if dead.any() and settings["aux_loss_coefficient"]:  # (the loss is 0 without its coefficient)
            if stats is not None:
                raise NoAuxK(cfg["normalize_activations"], int(dead.sum()))
            aux, dW, dh_aux, dn_aux = auxk_backward(target - x_hat, h, dead, sae["W_dec"], n, rescale,
                                                    settings["aux_loss_coefficient"])
            losses["auxiliary_reconstruction_loss"] = aux
            dW_dec += dW
            dh = dh_aux
            dn += dn_aux
    else:  # the sparsity losses' gradients first: tanh's adds to df, which JumpReLU's backward then takes
        dh, dtheta = jumprelu_sparsity_backward(h, f, passes, theta, n, dn, df, dead, settings, coefficient, losses)
        d_act, d_theta = jumprelu_backward(h, theta, df, settings["jumprelu_bandwidth"],
                                           settings["jumprelu_ste_to_input"])
        dh += d_act
        dtheta += d_theta
    if arch != "jumprelu":  # through the activation: where a latent passed, its input's gradient is its own
        dh = df * passes if dh is None else dh + df * passes
    losses["loss"] = sum(v for k, v in losses.items() if k.endswith("_loss"))
    losses["l0"] = float((f != 0).sum(-1).mean())  # the latents that fire, a token's, on average
    if rescale:
        dn += (dh * h0).sum(0)
        dh *= n
    grads = {"W_enc": sae_in.T @ dh, "b_enc": dh.sum(0), "W_dec": dW_dec + (dn / n)[:, None] * sae["W_dec"],
             "b_dec": db_dec}
    if applied:
        grads["b_dec"] = grads["b_dec"] - grads["b_enc"] @ sae["W_enc"].T
    if arch == "jumprelu":
        grads["threshold"] = dtheta
    if "W_skip" in sae:
        grads["W_skip"] = d_pre.T @ x  # out += x W_skipᵀ
    return losses, grads, f


class NoAuxK(UserError):
    """SAELens 6.54.12 takes no AuxK loss where the SAE normalises its input at run time (layer_norm,
    constant_norm_rescale): the residual x - x̂ is in the input's units, the dead latents' rebuilding a W_dec in
    the normalised ones. It trains on while no latent is dead (the loss is then 0) and raises a ValueError at the
    first step that has one; here that step is refused as a UserError (the caller saves the steps before it)."""

    def __init__(self, how, n_dead):
        super().__init__(f"{plural(n_dead, 'latent')} dead (none has fired for dead_feature_window steps), and "
                         f"SAELens 6.54.12 takes no AuxK loss under normalize_activations {how} (its residual would "
                         "be in the other space): it stops here too")


def auxk_backward(residual, h, dead, W_dec, n, rescale, coefficient):
    """TopK's AuxK loss (Gao et al., 2024, appendix B.1, as SAELens takes it) and its gradients: the dead latents'
    k_aux = d_in // 2 largest pre-activations (not ReLU'd) rebuild the residual x - x̂, held constant, without b_dec.
    -> (the loss, dW_dec [d_sae, d_in], dh [N, d_sae], dn [d_sae])"""
    N = h.shape[0]
    k_aux = residual.shape[-1] // 2
    n_dead = int(dead.sum())
    weight = coefficient * min(n_dead / k_aux, 1.0)
    chosen = topk_mask(np.where(dead, h, -np.inf), min(k_aux, n_dead))
    a = h * chosen
    ga = a / n if rescale else a
    miss = ga @ W_dec - residual  # [N, d_in]
    loss = weight * float((miss * miss).sum(-1).mean())
    d_r = miss * np.float32(2.0 * weight / N)
    dga = d_r @ W_dec.T
    dn = -(dga * ga).sum(0) / n if rescale else np.zeros_like(n)
    return loss, ga.T @ d_r, (dga / n if rescale else dga) * chosen, dn


def jumprelu_backward(h, theta, df, bandwidth, ste_to_input=False):
    """The backward of f = h · [h > θ] (JumpReLU, in training), by SAELens's straight-through estimator. The step
    [h > θ] has no useful derivative in θ (0 everywhere but at h = θ), so the rectangle kernel of width ε stands
    in for its spike: ∂f/∂θ ≈ -(θ/ε) rect((h - θ)/ε), rect(u) = 1 on (-1/2, 1/2):
        dθ = -Σ_tokens (θ/ε) rect((h - θ)/ε) df;   dh = df [h > θ]  (+ (θ/ε) rect((h - θ)/ε) df, ste_to_input)
    h, df [N, d_sae], θ [d_sae] -> (dh [N, d_sae], dθ [d_sae])"""
    ste = (theta / np.float32(bandwidth)) * rectangle((h - theta) / np.float32(bandwidth)) * df
    dh = df * (h > theta)
    return (dh + ste if ste_to_input else dh), -ste.sum(0)


def jumprelu_sparsity_backward(h, f, passes, theta, n, dn, df, dead, settings, coefficient, losses):
    """JumpReLU's l0_loss and pre_act_loss, into losses, and their gradients: tanh's adds to df and dn in place;
    step's goes to θ through the Step function's pseudo-derivative, ∂[h > θ]/∂θ ≈ -(1/ε) rect((h - θ)/ε).
    -> (dh [N, d_sae], dθ [d_sae]) of these losses (JumpReLU's own backward, of df, is the caller's)"""
    N = h.shape[0]
    eps = np.float32(settings["jumprelu_bandwidth"])
    c = np.float32(coefficient / N)
    dh, dtheta = np.zeros_like(h), np.zeros_like(theta)
    if settings["jumprelu_sparsity_loss_mode"] == "tanh":
        s = np.float32(settings["jumprelu_tanh_scale"])
        t = np.tanh(s * f * n)
        losses["l0_loss"] = float(coefficient * t.sum(-1).mean())
        slope = c * s * (1 - t * t)
        df += slope * n
        dn += (slope * f).sum(0)
    else:  # step: the count of latents that fire
        losses["l0_loss"] = float(coefficient * passes.sum(-1).mean())
        ste = rectangle((h - theta) / eps) * (c / eps)  # Step's pseudo-derivative by (h - θ), times the loss's C/N
        dtheta -= ste.sum(0)
        if settings["jumprelu_ste_to_input"]:
            dh += ste
    coef = settings["pre_act_loss_coefficient"]
    if coef is not None:
        losses["pre_act_loss"] = 0.0
        if dead.any():
            below = np.maximum(theta - h, 0) * dead  # [N, d_sae]
            losses["pre_act_loss"] = float(coef * (below @ n).mean())
            w = (np.float32(coef / N) * n) * ((below > 0))
            dtheta += w.sum(0)
            dh -= w
            dn += np.float32(coef / N) * below.sum(0)
    return dh, dtheta


def new_training_sae(d_in, d_sae, settings, seed=0, metadata=None):
    """A new SAE of settings' architecture, as SAELens initialises it: new_sae's four tensors (the same for every
    architecture), and a JumpReLU's threshold, jumprelu_init_threshold for every latent."""
    sae = new_sae(d_in, d_sae, seed, metadata=metadata)
    sae["cfg"]["architecture"] = settings["architecture"]
    if settings["architecture"] == "jumprelu":
        sae["threshold"] = np.full(d_sae, settings["jumprelu_init_threshold"], np.float32)
    return sae


def new_training_state(sae):
    """The trainer's state: Adam's (new_adam_state), the steps since each latent last fired, BatchTopK's
    running threshold (float64, as SAELens keeps it)."""
    return {**new_adam_state(sae), "since_fired": np.zeros(sae["b_enc"].shape, np.float32), "topk_threshold": 0.0}


def alone(x):
    """One process's batch is the whole batch (training_step's default; data_parallel.sae_across is N ranks')."""
    return x


ALONE = {"choose": batch_topk_mask, "mean": lambda losses, grads: (losses, grads), "any": alone, "smallest": alone}


def training_step(x, sae, state, lr, settings, coefficient=0.0, target=None, across=ALONE):
    """One step of SAELens's trainer for any architecture, in place: a JumpReLU's threshold kept at 0 or
    more; the forward, its losses and gradients (the dead latents those that have not fired for more than
    dead_feature_window steps); the latents' firing counts; BatchTopK's threshold, moved a topk_threshold_lr
    of the way to the smallest positive activation; clipping and Adam. target: a transcoder's (training_backward).
    A step whose loss or gradient is not finite changes nothing: Diverged (check_step). across: what is decided
    from the whole batch when x is one process's part of it (data_parallel.sae_across): BatchTopK's choice, the
    losses' and gradients' means, the latents that fired, the smallest activation.
    -> losses (training_backward's, and BatchTopK's "topk_threshold" after the step)"""
    arch = settings["architecture"]
    if arch == "jumprelu":
        np.maximum(sae["threshold"], 0, out=sae["threshold"])
    dead = state["since_fired"] > settings.get("dead_feature_window", DEAD_FEATURE_WINDOW)
    if arch == "standard" and target is None and \
            sae["cfg"].get("normalize_activations", "none") in ("none", "expected_average_only_in"):
        losses, grads, f = sae_backward(x, sae, coefficient)
    else:
        losses, grads, f = training_backward(x, sae, settings, coefficient, dead, target, across["choose"])
    losses, grads = across["mean"](losses, grads)
    norm = check_step(state["step"] + 1, losses["loss"], grads)
    state["since_fired"] += 1
    state["since_fired"][across["any"]((f != 0).any(0))] = 0
    if arch == "batchtopk":
        smallest = across["smallest"](float(f[f > 0].min()) if (f > 0).any() else None)
        if smallest is not None:
            rate = settings["topk_threshold_lr"]
            state["topk_threshold"] = (1 - rate) * state["topk_threshold"] + rate * smallest
        losses["topk_threshold"] = state["topk_threshold"]
    adam_step(sae, grads, state, lr, norm=norm)
    return losses


class Diverged(UserError):
    """A step whose loss or gradient is not finite (NaN or infinite): no update is made from it (train.py's)."""

    def __init__(self, step, loss, norm):
        super().__init__(f"step {step}: the {'loss is' if not math.isfinite(loss) else 'gradient is'} "
                         f"{loss if not math.isfinite(loss) else norm}: the run diverged")


def check_step(step, loss, grads):
    """Before Adam: a loss or a gradient that is not finite would make every weight NaN, so the step is refused
    (Diverged), the weights left as the last good step made them. -> the gradients' global norm (adam_step's)"""
    norm = grad_norm({"blocks": [grads]})
    if not (math.isfinite(loss) and math.isfinite(norm)):
        raise Diverged(step, loss, norm)
    return norm


def inference_sae(sae, settings, topk_threshold=0.0, factor=None):
    """The trained SAE as SAELens's save_inference_model writes it (after fit's fold of the normalisation's
    factor, fold_scaling_factor): TopK and BatchTopK's decoder norms folded into the weights (W_enc n, b_enc n,
    W_dec / n, with rescale_acts_by_decoder_norm); BatchTopK as a JumpReLU whose threshold is the running one
    for every latent (divided by the factor, SAELens #763). The cfg names the inference architecture, and
    keeps the training's settings in its metadata (training_architecture_details)."""
    arch = settings["architecture"]
    out = {k: sae[k].copy() for k in trained(sae)}
    cfg = {**sae["cfg"]}
    if factor is not None:
        out = {**out, **{k: v for k, v in fold_scaling_factor({**out, "cfg": cfg}, factor).items() if k != "cfg"}}
        cfg["normalize_activations"] = "none"
        topk_threshold = topk_threshold / factor if arch == "batchtopk" and settings["rescale_acts_by_decoder_norm"] \
            else topk_threshold
    if arch in ("topk", "batchtopk") and settings["rescale_acts_by_decoder_norm"]:
        out = fold_decoder_norms(out)
    details = {"decoder_init_norm": DECODER_INIT_NORM, **TRAINING_EXTRAS[arch],
               **{k: v for k, v in settings.items() if k not in INFERENCE_FIELDS[arch]}}
    cfg["metadata"] = {**cfg.get("metadata", {}), "training_architecture": arch,
                       "training_architecture_details": details}
    cfg["architecture"] = "jumprelu" if arch == "batchtopk" else arch
    if cfg["metadata"].get("hook_name_out"):
        cfg["architecture"] = saved_transcoder(cfg["architecture"], "W_skip" in sae)
    if arch == "topk":
        cfg.update(k=int(settings["k"]), rescale_acts_by_decoder_norm=settings["rescale_acts_by_decoder_norm"])
    if arch == "batchtopk":
        out["threshold"] = np.full(out["b_enc"].shape, topk_threshold, np.float32)
    return {**out, "cfg": cfg}


# ============================================================================
# 4c. Transcoders: trained here, though SAELens trains none
# ============================================================================
# A transcoder reads x at one hook point (blocks.L.ln2.hook_normalized, the MLP's input) and rebuilds the
# activation y at another (blocks.L.hook_mlp_out, what the MLP writes): an SAE's encoder, latents and decoder,
# and its losses, but for what x̂ is compared with, y in x's place: Σ_d (x̂ - y)², the mean over tokens, plus the
# architecture's own terms (training_backward's target; AuxK's residual y - x̂). Its b_dec is the output's, never
# taken from x, and x̂ is not de-normalised; a skip transcoder adds x W_skipᵀ (W_skip [d_out, d_in], from 0).
# SAELens reads the folder back as its Transcoder, SkipTranscoder, JumpReLUTranscoder or JumpReLUSkipTranscoder
# (a BatchTopK's a JumpReLU's, as for SAEs); a TopK one as a topk SAE whose metadata names hook_name_out, which
# circuits.py's attribution graphs read as a transcoder (SAELens has no TopK transcoder, nor a TopK skip one).

SAVED_TRANSCODERS = {("standard", False): "transcoder", ("standard", True): "skip_transcoder",
                     ("jumprelu", False): "jumprelu_transcoder", ("jumprelu", True): "jumprelu_skip_transcoder",
                     ("topk", False): "topk"}  # (the inference architecture, W_skip) -> SAELens's architecture


def new_transcoder(d_in, d_out, d_sae, settings, seed=0, metadata=None, skip=False):
    """A transcoder to train: new_training_sae's tensors, W_dec and b_dec d_out wide (W_enc = W_decᵀ where
    d_out = d_in, as an SAE starts; else the encoder drawn as the decoder is, rows of norm 0.1), W_skip 0 with
    skip (SAELens's SkipTranscoder starts it so), b_dec never applied to the input. metadata: hook_name and
    hook_name_out."""
    sae = new_training_sae(d_in, d_sae, settings, seed, metadata)
    if d_out != d_in:
        sae["W_dec"] = new_sae(d_out, d_sae, seed + 1)["W_dec"]
        sae["b_dec"] = np.zeros(d_out, np.float32)
    if skip:
        sae["W_skip"] = np.zeros((d_out, d_in), np.float32)
    sae["cfg"].update(d_out=d_out, apply_b_dec_to_input=False)
    return sae


def saved_transcoder(architecture, skip):
    """The SAELens architecture a trained transcoder is saved as (SAVED_TRANSCODERS)."""
    if (architecture, skip) not in SAVED_TRANSCODERS:
        raise UserError(f"SAELens has no {architecture} {'skip ' if skip else ''}transcoder to read one back")
    return SAVED_TRANSCODERS[architecture, skip]


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
    if site.startswith("blocks.") and site.split(".")[1].isdigit() and int(site.split(".")[1]) >= hparams["n_layer"]:
        raise UserError(f"no activation is called {site!r}: the model has {hparams['n_layer']} blocks, "
                        f"blocks.0 to blocks.{hparams['n_layer'] - 1}")
    check_names([site], shapes)
    shape = shapes[site]
    if len(shape) != 3:
        raise UserError(f"{site} is [B, T, H, D] or [B, H, T, T]: an SAE here reads a [B, T, d] activation "
                        "(a residual stream, an attention or MLP output, hook_pre/hook_post)", arg="site")
    return shape[-1]


def gather(ids, params, hparams, site, hooks=None):
    """The activation at a hook point for a batch of windows: the forward pass of the blocks up to the
    hook's layer only (the later ones cannot change it), through look_inside's hooks (and `hooks`, such as
    centring_hooks, before it is read). site: a hook point, or a list of them (-> a list of arrays).
    ids [B, T] -> [B, T, d] float32"""
    ids = checked_ids(np.atleast_2d(ids), params)
    sites = [site] if isinstance(site, str) else list(site)
    for name in sites:
        check_site(name, hparams)
    hooks, kept = hooks or {}, {}

    def keeping(name):
        before = hooks.get(name) or (lambda x, name: None)

        def keep(x, name):
            changed = before(x, name)  # None: x as it is
            x = x if changed is None else changed
            kept[name] = x.astype(np.float32)  # a copy (where x is: a GPU's too): the forward pass goes on with x
            return x

        return keep

    last = max(site_layer(name, hparams["n_layer"]) for name in sites)
    first = {**params, "blocks": params["blocks"][:last + 1]}
    gpt2_hidden(ids, first, hparams, hook=model_hook({**hooks, **{name: keeping(name) for name in sites}}))
    return kept[site] if isinstance(site, str) else [kept[name] for name in sites]


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
    """gather() over windows [W, T], `batch` windows a forward pass. site: a hook point, or a list of them (a
    transcoder's input and target), their activations then side by side. -> [W, T, d] (d: their widths' sum)"""
    out = []
    for start in range(0, len(rows), batch):
        acts = gather(rows[start:start + batch], params, hparams, site, hooks)
        out.append(acts if isinstance(site, str) else np.concatenate(acts, -1))
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


def fold_decoder_norms(sae):
    """A TopK SAE trained with rescale_acts_by_decoder_norm as SAELens's save_inference_model writes it: each decoder
    row made unit length, its norm n_i moved into the encoder (W_enc · n, b_enc · n, W_dec / n). It ranks h·n and
    decodes (f / n) W_dec as before, now with n = 1."""
    n = np.maximum(decoder_norms(sae["W_dec"]), np.float32(1e-8))  # SAELens's get_W_dec_norm clamps
    return {**sae, "W_enc": sae["W_enc"] * n, "b_enc": sae["b_enc"] * n, "W_dec": sae["W_dec"] / n[:, None]}


# ============================================================================
# 6. Splicing the SAE into the model
# ============================================================================

def hook_name(sae):
    """The hook point an SAE reads (its metadata's hook_name)."""
    return sae["cfg"].get("metadata", {}).get("hook_name")


def hook_name_out(sae):
    """The hook point an SAE writes: a transcoder's metadata.hook_name_out, else the one it reads (SAELens's
    add_sae)."""
    return sae["cfg"].get("metadata", {}).get("hook_name_out") or hook_name(sae)


def check_fits(sae, hparams, site=None):
    """The SAE's d_in must be the width of its hook point's activation, and a transcoder's d_out the width of the
    one it writes (SAELens only warns, and splices nothing, where the model lacks one: refused here).
    -> the hook point it reads"""
    site = site or hook_name(sae)
    if not site:
        raise UserError("the SAE names no hook point (its cfg.json's metadata has no hook_name)")
    out = hook_name_out(sae) if site == hook_name(sae) else site
    for name, key, verb in ((site, "d_in", "reads"), (out, "d_out", "writes")):
        width = check_site(name, hparams)
        if sae["cfg"].get(key, sae["cfg"]["d_in"]) != width:
            raise UserError(f"the SAE {verb} {sae['cfg'].get(key, sae['cfg']['d_in'])} numbers a token but {name} has "
                            f"{width}: it was trained on another model or hook point")
    return site


def splice(sae, use_error_term=False, mask=None):
    """The SAE at its hook point, for look_inside's run_with_cache and run_with_hooks (sae=...): the activation
    there goes on as the SAE's output (forward: x̂, de-normalised, plus W_skip x for a skip transcoder), or with
    use_error_term as that plus the error term, so that the model's output is unchanged and the latents can be
    read. A transcoder reads its input at hook_name and writes at hook_name_out. mask [B, T]: where to splice
    (elsewhere the model's activation goes on: SAELens's evals leave <|endoftext|> alone).
    -> (the hook it writes, fn(x, unhooked=None, original=None) -> (what goes on, {SAELens's names: arrays}),
    fn's backward grad(x, g) -> dx, the hook it reads). x: what the SAE encodes; unhooked: that input before a
    hook on it (SAELens's hook_sae_input) changed it; original: the model's activation where the SAE writes
    (default unhooked). The error term is original - the SAE's output for unhooked, as SAELens takes it with the
    SAE's hooks off. (SAELens's run_with_saes drops a skip transcoder's W_skip x: here it is spliced whole.)"""
    site = hook_name_out(sae)

    def run(x, unhooked=None, original=None):
        unhooked = x if unhooked is None else unhooked
        original = unhooked if original is None else original
        out, f, h = forward(x, sae)
        if use_error_term:  # the error term: where the model made it, before any hook on the SAE's input
            error = original - (out if unhooked is x else forward(unhooked, sae)[0])
            out = out + error
        if mask is not None:
            out = np.where(mask[..., None], out, original)
        latents = {"hook_sae_input": x, "hook_sae_acts_pre": h, "hook_sae_acts_post": f,
                   "hook_sae_recons": decode(f, sae), "hook_sae_output": out}
        if use_error_term:
            latents["hook_sae_error"] = error
        return out, {f"{site}.{k}": v for k, v in latents.items()}

    def grad(x, g):
        dx = input_grad(x, g, sae)
        return dx if mask is None else np.where(mask[..., None], dx, g)

    return site, run, grad, hook_name(sae)


def normalize_backward(x, dx_n, stats_grads, sae):
    """normalize's backward, with what the de-normalisation's statistics got back (SAELens's autograd takes μ and σ,
    or ‖x‖, with their gradients, in and out). dx_n [..., d_in]: the gradient of x'; stats_grads: (dscale, dshift)
    [..., 1] from denormalize (or zeros). -> dx [..., d_in]"""
    how, d = sae["cfg"].get("normalize_activations", "none"), x.shape[-1]
    dscale, dshift = stats_grads
    if how == "layer_norm":  # x' = c / (σ + ε), c = x - μ, σ = √(Σ c² / (d - 1)); out = y σ + μ
        c = x - x.sum(-1, keepdims=True) / d
        sigma = np.sqrt((c * c).sum(-1, keepdims=True) / (d - 1))
        denominator = sigma + np.float32(LAYER_NORM_EPS)
        dsigma = dscale - (dx_n * c).sum(-1, keepdims=True) / denominator ** 2
        dc = dx_n / denominator + dsigma * c / ((d - 1) * sigma)
        return dc - dc.mean(-1, keepdims=True) + dshift / d
    if how == "constant_norm_rescale":  # x' = x / s, s = ‖x‖ / √d; out = y s
        s = np.sqrt((x * x).sum(-1, keepdims=True) / d)
        ds = dscale - (dx_n * x).sum(-1, keepdims=True) / s ** 2
        return dx_n / s + ds * x / (s * d)
    return dx_n


def input_grad(x, g, sae):
    """The backward of the spliced SAE for its input, as SAELens's autograd takes it: through its output alone,
    with or without the error term (SAELens computes it under torch.no_grad: a constant to the gradient).
    out = denormalize(act(h) W_dec + b_dec) + x W_skipᵀ:   dh = (dy W_decᵀ) ⊙ [f > 0] (a TopK's 1/n and n cancel),
    dx' = dh W_encᵀ, then through the normalisation (normalize_backward).
    x [..., d_in], g [..., d_out] (g: the gradient of what went on) -> dx [..., d_in]"""
    x_n, stats = normalize(x, sae)
    h = encode_pre(x, sae)
    f = activation(h, sae)
    dy, dstats = g, (0.0, 0.0)
    if stats is not None and not is_transcoder(sae):  # out = y · scale (+ shift): y's gradient, the stats'
        scale, shift = stats
        dy = g * scale
        y = decode(f, sae)
        dstats = ((g * y).sum(-1, keepdims=True), g.sum(-1, keepdims=True) if shift is not None else 0.0)
    dx = normalize_backward(x, ((dy @ sae["W_dec"].T) * (f > 0)) @ sae["W_enc"].T, dstats, sae)
    return dx + g @ sae["W_skip"] if "W_skip" in sae else dx


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


def fold_layer_norms(params):
    """The model as TransformerLens's fold_ln leaves its blocks: each ln_1's and ln_2's gain g and bias b moved into
    the weights that read them, c_attn and c_fc (w' = diag(g) w, b' = b_w + b w), so that each layer norm's output is
    x̂ = (x - μ) / σ, which TransformerLens names ln1/ln2.hook_normalized in every model, folded or not. The logits
    do not change (but for rounding); ln_f is left as it is, the unembedding being tied to wte. An SAE or transcoder
    trained on TransformerLens's blocks.L.ln2.hook_normalized reads here what it read there (--fold-ln)."""
    blocks = []
    for block in params["blocks"]:
        block = dict(block)
        for ln, layer, inside in (("ln_1", "c_attn", "attn"), ("ln_2", "c_fc", "mlp")):
            g, b = block[ln]["g"], block[ln]["b"]
            w = block[inside][layer]["w"]
            folded = {**block[inside][layer], "w": (g[:, None] * w).astype(np.float32),
                      "b": (block[inside][layer]["b"] + b @ w).astype(np.float32)}
            block[inside] = {**block[inside], layer: folded}
            block[ln] = {"g": np.ones_like(g), "b": np.zeros_like(b)}
        blocks.append(block)
    return {**params, "blocks": blocks}


def latent_writes(x, f, sae):
    """What each latent writes into the output, as coefficients of the decoder's rows: c W_dec is the latents' share
    of the SAE's output (b_dec's, μ's and W_skip x's are no latent's). c = f, over ‖W_dec[i]‖ for a TopK's rescale,
    times the token's σ (or ‖x‖ / √d_in) where the output is de-normalised.
    x [N, d_in] the SAE's input, f [N, d_sae] -> (c [N, d_sae], W_dec [d_sae, d_out])"""
    f = unscaled(f, sae)
    stats = None if is_transcoder(sae) else normalize(x, sae)[1]
    return (f if stats is None else f * stats[0]), sae["W_dec"]


# ============================================================================
# 7. SAELens's evals
# ============================================================================

def kl_divergence(clean, other):
    """KL(clean ‖ other) at each position, from log-probabilities: Σ_v p_clean (log p_clean - log p_other).
    [..., V] -> [...]"""
    return (np.exp(clean) * (clean - other)).sum(-1)


def evaluate_batch(rows, params, hparams, sae, special, hooks=None):
    """One batch of SAELens's evals, per token, over positions whose token is not in `special`
    (exclude_special_tokens): -> {name: the per-token values kept}, and the activations' sums. A transcoder's
    explained variance is its output's, of the activation where it writes (which the ablation zeroes)."""
    site, out, hooks = hook_name(sae), hook_name_out(sae), hooks or {}
    mask = ~np.isin(rows, list(special))  # [B, T]
    mask, next_ids = (np.asarray(a, like=params["wte"]) for a in (mask, rows[:, 1:, None]))  # where the model is
    x, target = (a[mask] for a in gather(rows, params, hparams, [site, out], hooks))  # [n, d_in], [n, d_out]
    x_hat, f, _ = forward(x, sae)
    x = target  # what the SAE is to rebuild: its input, or a transcoder's output activation
    runs = {"without_sae": run_with_hooks(rows, params, hparams, hooks),  # log-probabilities, once a run
            "with_sae": run_with_hooks(rows, params, hparams, hooks, sae=splice(sae, mask=mask)),
            "with_ablation": run_with_hooks(rows, params, hparams, {**hooks, out: lambda a, name: np.zeros_like(a)})}
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
    W_dec[i] · wteᵀ (a transcoder's W_dec[i] is what it writes at its output hook). -> (top ids [k], their values,
    bottom ids [k], their values)"""
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
    (window, position)s, and its logit effects (none where the SAE writes something not the residual stream's
    width, an MLP's hidden layer). acts [W, T, d] at its hook point."""
    f = encode(acts.reshape(-1, acts.shape[-1]), sae)[:, features].reshape(*acts.shape[:2], len(features))
    out, effects = [], sae["W_dec"].shape[1] == wte.shape[1]
    for j, i in enumerate(features):
        values, where = top_activations(f[..., j], k)
        up, up_v, down, down_v = logit_effects(sae, wte, i, k) if effects else (np.zeros(0),) * 4
        out.append({"feature": int(i), "density": float((f[..., j] > 0).mean()),
                    "top": [(float(v), w, t) for v, (w, t) in zip(values, where)],
                    "promotes": list(zip(up.tolist(), up_v.tolist())),
                    "suppresses": list(zip(down.tolist(), down_v.tolist())), "acts": f[..., j]})
    return out

