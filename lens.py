"""What the residual stream knows: the tuned lens, and linear probes, each exactly as its reference computes it.

    python lens.py read  "The capital of France is" --model 124M --tuned-lens LENS_DIR
    python lens.py train --model 124M --data notes.txt --out LENS_DIR --steps 250
    python lens.py probe --model 124M --data labelled.jsonl --site blocks.6.hook_resid_post --position last \\
                         --method logistic --out PROBE_DIR
    python gpt2_numpy.py "text" --lens --tuned-lens LENS_DIR                 # beside the logit lens's table
    python steer.py vector "prompt" --direction PROBE_DIR --multiplier 8     # then push along what the probe found

  1. the tuned lens's reading   (Belrose et al., 2023; tuned-lens 0.2.0) the logit lens reads block l's input as if
                                it were the last block's output: ln_f(h) wteᵀ. The tuned lens first moves it by an
                                affine translator of its own, h + h Aᵀ + b (zero at the start: the logit lens)
  2. the losses, by hand        KL from the model's final distribution (the default) or next-token cross-entropy,
                                and their gradients back through wte, ln_f and the translator
  3. the optimizer              torch's SGD with Nesterov momentum, clipped by the global norm (optimizer.py's),
                                under tuned-lens's linear schedule
  4. training                   one step: every translator's loss and gradient, then one clipped SGD step; the loop
  5. linear probes              an activation at a hook point, then a direction: the difference of the classes'
                                means (Marks & Tegmark's mass-mean probe), or logistic regression as scikit-learn's
                                LogisticRegression(C, lbfgs) solves it, here by Newton's method to convergence

A lens is a list of translators, one a block, {"weight": A [C, C], "bias": b [C]} (torch's Linear: y = h Aᵀ + b);
lens l reads blocks.l.hook_resid_pre (l = 0: the embeddings), so the last block's output has none: the model's
own logits are its final reading. Everything is float32 (tuned-lens's command line autocasts to bfloat16; not
here), but a probe's fit, which is float64 until its direction is kept. The model's forward pass, its cache and
hooks are look_inside's; the files are plumbing/lens_files.py's; the command lines, interface/lens_cli.py's.

Shapes: B batch, T positions, C = n_embd, V = n_vocab, L = n_layer, N texts, d an activation's width.
"""
if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("lens_cli")  # the command line (read, train, probe): this file is the lens and the probes

import hashlib
import itertools
import math

import numpy as np

from backward import cross_entropy, cross_entropy_backward, layer_norm_backward, linear_backward
from gpt2_numpy import layer_norm, layer_norm_eps, linear, log_softmax, matmul
from look_inside import activation_shapes, check_names, lens_activations, lens_table, run_with_cache
from optimizer import clip_scale, grad_norm
from plumbing.device import host
from plumbing.errors import UserError, plural
from steer import activations

LOSSES = ("kl", "ce")
POSITIONS = ("last", "mean")
METHODS = ("mean-diff", "logistic")
CLIP = 1.0  # tuned-lens clips the translators' gradients to this global norm
PINV_ATOL = 1e-3  # the iid probe's pseudo-inverse drops eigenvalues this small (Geometry of Truth's atol)


# ============================================================================
# 1. The tuned lens's reading
# ============================================================================

def lens_sites(n_layer):
    """Where each translator reads, block l's input (tuned-lens's hidden_states[:-1]): look_inside's lens_activations
    but the last, as the cache names them: blocks.0.hook_resid_pre (the embeddings), then block l - 1's output,
    blocks.{l-1}.hook_resid_post, which is blocks.l.hook_resid_pre."""
    return lens_activations(n_layer)[:n_layer]


def new_lens(n_layer, n_embd):
    """L translators at zero, where tuned-lens starts them: the tuned lens is then the logit lens."""
    return [{"weight": np.zeros((n_embd, n_embd), np.float32), "bias": np.zeros(n_embd, np.float32)}
            for _ in range(n_layer)]


def translate(h, weight, bias):
    """h + (h Aᵀ + b): the translator's output added to the residual stream, so that weight decay pulls it toward
    the identity, not toward zero.   [..., C] -> [..., C]"""
    return h + linear(h, weight.T, bias)


def tuned_lens_logits(h, translator, ln_f, wte, eps):
    """One layer's reading: ln_f(h + h Aᵀ + b) wteᵀ, the model's own ln_f and tied unembedding after the
    translator.   h [..., C] -> [..., V]"""
    return matmul(layer_norm(translate(h, **translator), **ln_f, eps=eps), wte.T)


def check_lens(lens, hparams):
    """A lens for this model: one translator a block, each C x C. tuned-lens never checks; a lens of another
    width fails in a matrix product, and one of another depth reads the wrong layers without a word."""
    C, L = hparams["n_embd"], hparams["n_layer"]
    shapes = {(t["weight"].shape, t["bias"].shape) for t in lens}
    if len(lens) != L or shapes != {((C, C), (C,))}:
        width = next(iter(shapes))[1][0] if len(shapes) == 1 else "mixed"
        raise UserError(f"the lens has {plural(len(lens), 'translator')} {width} wide; the model needs {L} "
                        f"(one a block), {C} wide: it was trained for another model")


def tuned_lens(ids, params, hparams, lens, target=None, run=None):
    """look_inside.logit_lens through the tuned lens: each block's input read by its translator (tuned_lens_logits),
    the last block's output as it is (it has no translator: its row is the model's own logits, as the logit lens's
    last row is). ids [B, T]; target [B, T] (default: the model's final prediction at each position); run:
    run_with_cache's (logits, cache) holding look_inside's lens_activations(L), to read instead of running the model
    again.   -> {"top" [L+1, B, T], "top_prob", "target" [B, T], "target_prob", "target_rank" [L+1, B, T]}"""
    check_lens(lens, hparams)
    logits, cache = run or run_with_cache(ids, params, hparams, names=lens_sites(hparams["n_layer"]))
    return lens_table(itertools.chain(lens_readings(cache, params, hparams, lens), [logits]), logits, target)


def lens_readings(cache, params, hparams, lens):
    """Each translator's logits, from run_with_cache's cache of lens_sites: a generator of [B, T, V], layer 0 first."""
    eps = layer_norm_eps(hparams)
    for site, translator in zip(lens_sites(hparams["n_layer"]), lens):
        yield tuned_lens_logits(cache[site], translator, params["ln_f"], params["wte"], eps)


def unembed_hash(wte):
    """tuned-lens's fingerprint of the unembedding its lens was trained on: the SHA-256 of NumPy's printout of
    wte at one decimal (the corners of the matrix: NumPy abbreviates a large one), with NumPy's default
    print options, whatever the caller has set."""
    with np.printoptions(precision=8, threshold=1000, edgeitems=3, linewidth=75, suppress=False, nanstr="nan",
                         infstr="inf", sign="-", floatmode="maxprec", legacy=False):
        return hashlib.sha256(np.array_str(np.asarray(host(wte), np.float32), precision=1).encode()).hexdigest()


# ============================================================================
# 2. The losses, and their backward by hand
# ============================================================================
# Each translator is trained on its own loss, its gradient taken back alone (tuned-lens backpropagates each
# layer's loss in turn): the step's loss is their sum. The unembedding and ln_f are the model's, frozen.

def kl_loss(logits, final_logprobs, final_probs=None):
    """KL(p ‖ q): mean over B and T of Σ_v p_v (log p_v - log q_v), p the model's final distribution, q the lens's;
    and its gradient, dq_logits = (q - p) / (B T).   logits [B, T, V], final_logprobs [B, T, V] (and final_probs,
    their exp, when a caller has it already) -> (a float, [B, T, V])"""
    logq = log_softmax(logits)
    p = np.exp(final_logprobs) if final_probs is None else final_probs
    n = logits.shape[0] * logits.shape[1]
    loss = float((p * (final_logprobs - logq)).sum(-1).mean())
    return loss, (np.exp(logq) - p) / np.float32(n)


def ce_loss(logits, ids):
    """Next-token cross-entropy: the lens's logits at positions 0 .. T-2 against the tokens 1 .. T-1 (backward.py's
    cross_entropy), and its gradient, 0 at the last position.   logits [B, T, V], ids [B, T] -> (a float, [B, T, V])"""
    loss, _ = cross_entropy(logits[:, :-1], ids[:, 1:])
    dlogits = np.zeros_like(logits)
    dlogits[:, :-1] = cross_entropy_backward(logits[:, :-1], ids[:, 1:])
    return loss, dlogits


def translator_backward(h, translator, ln_f, wte, dlogits, eps):
    """d loss / d the translator, from d loss / d its logits, back through the frozen unembedding and ln_f:
    dy = dlogits wte,  dx = layer_norm_backward(x, dy),  dA = Σ dxᵀ h,  db = Σ dx   (x = h + h Aᵀ + b)
    h [B, T, C], dlogits [B, T, V] -> {"weight": [C, C], "bias": [C]}"""
    x = translate(h, **translator)
    dx, _, _ = layer_norm_backward(x, ln_f["g"], matmul(dlogits, wte), eps)
    _, dweight_t, dbias = linear_backward(h, translator["weight"].T, dx)  # y = h Aᵀ + b: its w is Aᵀ
    return {"weight": dweight_t.T, "bias": dbias}


# ============================================================================
# 3. The optimizer: SGD with Nesterov momentum, and tuned-lens's schedule
# ============================================================================

def sgd_nesterov_update(p, grad, buf, lr, momentum, weight_decay, first):
    """One step of torch's SGD (nesterov=True, dampening 0) on one tensor, in place:
    g = grad + λ p;  buf ← g (the first step) or μ buf + g;  p ← p - lr (g + μ buf)
    p, grad, buf [...] (p and buf are updated); first: no buffer yet."""
    g = grad + weight_decay * p
    if first:
        buf[...] = g
    else:
        buf *= momentum
        buf += g
    p -= lr * (g + momentum * buf)


def lens_schedule(step, steps, warmup):
    """tuned-lens's learning-rate factor at step s (0 .. K-1): transformers' get_linear_schedule_with_warmup(W,
    K - W), its second count K - W as tuned-lens passes it: s / W while s < W, then (K - W - s) / (K - 2W), at
    least 0. With W > 0 the first step's factor is 0 (its gradient still enters the momentum buffer)."""
    if step < warmup:
        return step / max(1, warmup)
    return max(0.0, (steps - warmup - step) / max(1, steps - 2 * warmup))


def new_momentum(lens):
    """SGD's state: a momentum buffer for each tensor, and the step count (no buffer before the first step)."""
    return {"step": 0, "buffers": [{k: np.zeros_like(a) for k, a in t.items()} for t in lens]}


# ============================================================================
# 4. Training
# ============================================================================

def lens_losses_and_grads(ids, params, hparams, lens, loss="kl"):
    """One batch through the model (run_with_cache, every lens site kept), then each translator's loss and its
    gradient, one layer at a time.   ids [B, T] -> ([L] losses, [L] gradients like the translators)"""
    logits, cache = run_with_cache(ids, params, hparams, names=lens_sites(hparams["n_layer"]))
    eps, target = layer_norm_eps(hparams), log_softmax(logits) if loss == "kl" else np.asarray(ids)
    p = np.exp(target) if loss == "kl" else None  # the final distribution, once for every layer's KL
    losses, grads = [], []
    for site, translator in zip(lens_sites(hparams["n_layer"]), lens):
        h = cache.pop(site)  # [B, T, C]; gone once read: one layer's activations at a time
        reading = tuned_lens_logits(h, translator, params["ln_f"], params["wte"], eps)
        value, dlogits = kl_loss(reading, target, p) if loss == "kl" else ce_loss(reading, target)
        losses.append(value)
        grads.append(translator_backward(h, translator, params["ln_f"], params["wte"], dlogits, eps))
    return losses, grads


def lens_step(ids, params, hparams, lens, state, lr, momentum=0.9, weight_decay=1e-3, loss="kl"):
    """One training step: every translator's loss and gradient, one global norm over all the gradients clipped to
    CLIP, then SGD with Nesterov momentum on every translator. lr: this step's, the schedule's factor applied.
    -> each translator's loss, before the step"""
    losses, grads = lens_losses_and_grads(ids, params, hparams, lens, loss)
    scale = clip_scale(grad_norm({"blocks": grads}), CLIP)
    first = state["step"] == 0
    for translator, grad, buffers in zip(lens, grads, state["buffers"]):
        for name, p in translator.items():
            sgd_nesterov_update(p, grad[name] * np.float32(scale), buffers[name], lr, momentum, weight_decay, first)
    state["step"] += 1
    return losses


def lens_batches(windows, batch_size, steps):
    """The batches of a run, in order: B windows [B, T] at a time from windows [N, T], from the first again when
    they run out."""
    for step in range(steps):
        yield windows[np.arange(step * batch_size, (step + 1) * batch_size) % len(windows)]


def train_lens(windows, params, hparams, lens, steps, batch_size, lr_scale=1.0, momentum=0.9, weight_decay=1e-3,
               loss="kl", warmup=0):
    """tuned-lens's training loop (its defaults): `steps` steps on windows [N, T] taken batch_size at a time in
    order, lr = lr_scale (1 - momentum) under lens_schedule. lens is trained in place. A generator: yields each
    step's losses, [L] floats, as it is done (the step's loss is their sum)."""
    check_lens(lens, hparams)
    check_training(steps, batch_size, lr_scale, momentum, weight_decay, loss, warmup)
    state, lr = new_momentum(lens), lr_scale * (1.0 - momentum)  # torch's SGD takes 1 / (1 - μ) larger steps
    for step, batch in enumerate(lens_batches(windows, batch_size, steps)):
        yield lens_step(batch, params, hparams, lens, state, lr * lens_schedule(step, steps, warmup), momentum,
                        weight_decay, loss)


def check_training(steps, batch_size, lr_scale, momentum, weight_decay, loss, warmup):
    """Settings that make a run: each names its argument."""
    for arg, value, ok, rule in (
            ("steps", steps, isinstance(steps, int) and steps >= 1, "a whole number >= 1"),
            ("batch_size", batch_size, isinstance(batch_size, int) and batch_size >= 1, "a whole number >= 1"),
            ("lr_scale", lr_scale, math.isfinite(lr_scale) and lr_scale > 0, "above 0 and finite"),
            ("momentum", momentum, 0 <= momentum < 1, "in [0, 1)"),
            ("weight_decay", weight_decay, math.isfinite(weight_decay) and weight_decay >= 0, "at least 0 and finite"),
            ("loss", loss, loss in LOSSES, " or ".join(LOSSES)),
            ("warmup", warmup, isinstance(warmup, int) and 0 <= warmup <= steps, "a whole number in 0 .. steps")):
        if not ok:
            raise UserError(f"must be {rule}, got {value!r}", arg=arg)


# ============================================================================
# 5. Linear probes
# ============================================================================
# A probe asks whether a linear direction of an activation separates two classes of texts. A high accuracy says
# the information is there to be read, not that the model uses it: steering along the direction is the test.

def check_probe_site(site, hparams):
    """A hook point whose activation is [B, T, d] (a residual stream, an attention or MLP output). -> d"""
    shapes = activation_shapes(hparams, 1, 1)
    check_names([site], shapes)
    if len(shapes[site]) != 3:
        raise UserError(f"{site} is not [B, T, d]: a probe reads one vector a text (a residual stream, an attention "
                        "or MLP output, mlp.hook_pre/hook_post)", arg="site")
    return shapes[site][-1]


def probe_features(texts_ids, params, hparams, sites, position="last"):
    """Each text's activation at each hook point: at its last token, or the mean over its tokens. Each text runs
    alone (no padding), through the blocks up to the last site.   [N] id lists -> {site: [N, d]} float32"""
    if position not in POSITIONS:
        raise UserError(f"must be {' or '.join(POSITIONS)}, got {position!r}", arg="position")
    for site in sites:
        check_probe_site(site, hparams)
    features = {site: [] for site in sites}
    for ids in texts_ids:
        acts = activations(ids, params, hparams, sites)  # {site: [T, d]}
        for site in sites:
            features[site].append(acts[site][-1] if position == "last" else acts[site].mean(0))
    return {site: np.stack(rows).astype(np.float32) for site, rows in features.items()}


def check_labels(labels):
    """Labels 0 and 1, both of them there."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.isin(labels, (0, 1)).all():
        raise UserError("a probe's labels are 0 and 1", arg="labels")
    if len(np.unique(labels)) < 2:
        raise UserError(f"a probe needs both classes: every label is {labels[0] if len(labels) else 'missing'}",
                        arg="labels")
    return labels.astype(np.int64)


def standardized(X):
    """StandardScaler's statistics: each feature's mean and population standard deviation (ddof 0; 1 where it
    is 0).   X [N, d] -> (mean [d], scale [d]), float64"""
    mean = X.mean(0)
    scale = X.std(0)
    return mean, np.where(scale == 0, 1.0, scale)


def mean_diff_probe(X, labels, iid=False):
    """The mass-mean probe: direction μ₁ - μ₀ (iid: Σ⁺ (μ₁ - μ₀), Σ the classes' pooled covariance ZᵀZ / N, each
    class centred on its own mean, Σ⁺ its pseudo-inverse without eigenvalues of magnitude <= 1e-3), and the bias
    that puts the boundary half-way between the means, -direction · (μ₀ + μ₁) / 2.   X [N, d] -> ([d], a float)"""
    X, labels = np.asarray(X, np.float64), check_labels(labels)
    mu0, mu1 = X[labels == 0].mean(0), X[labels == 1].mean(0)
    direction = mu1 - mu0
    if iid:
        Z = np.where(labels[:, None] == 1, X - mu1, X - mu0)
        values, vectors = np.linalg.eigh(Z.T @ Z / len(X))
        kept = np.abs(values) > PINV_ATOL
        direction = vectors[:, kept] @ ((vectors[:, kept].T @ direction) / values[kept])
    return direction, float(-direction @ (mu0 + mu1) / 2)


def logistic_gradient(w, b, X, s, C):
    """The gradient of the L2-penalised logistic loss, f = ½‖w‖² + C Σᵢ log(1 + exp(-sᵢ (w·xᵢ + b))), sᵢ = ±1, the
    intercept b not penalised:  df/dw = w - C Σᵢ sᵢ σ(-sᵢ zᵢ) xᵢ,  df/db = -C Σᵢ sᵢ σ(-sᵢ zᵢ),  zᵢ = w·xᵢ + b.
    w [d], X [N, d], s [N] -> ([d], a float)"""
    r = -C * s * sigmoid(-s * (X @ w + b))  # [N]: each sample's pull
    return w + X.T @ r, float(r.sum())


def sigmoid(z):
    """σ(z) = 1 / (1 + exp(-z)), without overflow for z of either sign."""
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0, e) / (1.0 + e)


def logistic_objective(w, b, X, s, C):
    """f = ½‖w‖² + C Σᵢ log(1 + exp(-sᵢ zᵢ)), log(1 + exp(m)) as logaddexp(0, m): no overflow."""
    return 0.5 * float(w @ w) + C * float(np.logaddexp(0.0, -s * (X @ w + b)).sum())


def logistic_probe(X, labels, C=1.0, tol=1e-10, max_steps=100):
    """scikit-learn's LogisticRegression(C=C, solver="lbfgs", fit_intercept=True), solved to convergence by Newton's
    method, in float64: each step solves H Δ = -∇f, H = [[I + C Xᵀ D X, C Xᵀ D 1], [C 1ᵀ D X, C 1ᵀ D 1]],
    D = σ(z) σ(-z), halving the step until f falls (f is strictly convex: one minimum).   X [N, d] -> ([d], a float)"""
    if not (isinstance(C, (int, float)) and math.isfinite(C) and C > 0):
        raise UserError(f"must be positive and finite, got {C!r}", arg="C")
    X, s = np.asarray(X, np.float64), 2.0 * check_labels(labels) - 1.0
    Xb = np.hstack([X, np.ones((len(X), 1))])  # the intercept as a last feature, not penalised
    theta = np.zeros(Xb.shape[1])
    penalty = np.ones(Xb.shape[1])
    penalty[-1] = 0.0
    f = logistic_objective(theta[:-1], theta[-1], X, s, C)
    for _ in range(max_steps):
        dw, db = logistic_gradient(theta[:-1], theta[-1], X, s, C)
        grad = np.append(dw, db)
        if np.abs(grad).max() <= tol * max(1.0, np.abs(theta).max()):
            break
        z = Xb @ theta
        hessian = (Xb.T * (C * sigmoid(z) * sigmoid(-z))) @ Xb + np.diag(penalty)
        step = np.linalg.solve(hessian, -grad)
        t = 1.0
        while t > 1e-12:
            new_f = logistic_objective(theta[:-1] + t * step[:-1], theta[-1] + t * step[-1], X, s, C)
            if new_f <= f:
                break
            t /= 2
        theta, f = theta + t * step, new_f
    return theta[:-1], float(theta[-1])


def fit_probe(X, labels, method="logistic", C=1.0, standardize=False, iid=False):
    """A probe on features X [N, d]: {"direction" [d], "bias", "mean" [d], "scale" [d] (standardize: the features
    are (x - mean) / scale first), "accuracy" (on X itself)}; decision: direction · x' + bias > 0 is class 1."""
    if method not in METHODS:
        raise UserError(f"must be {' or '.join(METHODS)}, got {method!r}", arg="method")
    X, labels = np.asarray(X, np.float64), check_labels(labels)
    mean, scale = standardized(X) if standardize else (np.zeros(X.shape[1]), np.ones(X.shape[1]))
    Xs = (X - mean) / scale
    direction, bias = logistic_probe(Xs, labels, C) if method == "logistic" else mean_diff_probe(Xs, labels, iid)
    probe = {"direction": direction, "bias": bias, "mean": mean, "scale": scale}
    return probe | {"accuracy": probe_accuracy(probe, X, labels)}


def probe_scores(probe, X):
    """Each sample's decision value, direction · (x - mean) / scale + bias.   [N, d] -> [N]"""
    return ((np.asarray(X, np.float64) - probe["mean"]) / probe["scale"]) @ probe["direction"] + probe["bias"]


def probe_accuracy(probe, X, labels):
    """The share of samples on their label's side of the boundary."""
    return float(np.mean((probe_scores(probe, X) > 0) == (np.asarray(labels) == 1)))


def steering_direction(probe):
    """The probe's direction in the activation's own space: the decision value's gradient with respect to x,
    direction / scale (standardized features divide each coordinate by its scale; otherwise the direction)."""
    return (np.asarray(probe["direction"], np.float64) / probe["scale"]).astype(np.float32)
