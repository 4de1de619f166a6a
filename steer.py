"""Steering GPT-2: a vector added to the residual stream while the model writes, three ways, each exactly as
the field computes it.

    python steer.py add    "I hate you because" --add "Love" --sub "Hate" --layer 6 --coeff 5
    python steer.py vector "I think" --positive "I love it" --negative "I hate it" --layer 1
    python steer.py latent "The weather" --sae SAE_DIR --latent 12 --alpha 8

  1. ActAdd               Turner et al. (2023), as their code (montemac/activation_additions) computes it:
                          v = c · (resid_pre_L(<|endoftext|> A) - resid_pre_L(<|endoftext|> B)), [n, C], the
                          shorter prompt padded on the right with " "; added to the first n positions of the
                          prompt, never to a one-position (KV-cached) pass
  2. steering vectors     from contrastive pairs, as the steering-vectors package (0.12.2, CAA's) computes them:
                          v = mean_i (resid_post_L(p_i) - resid_post_L(n_i)) at one token of each text (or
                          the top principal direction of those differences); m · v added to block L's output at
                          every position from K on, counted from the start of the text
  3. an SAE latent        alpha · W_dec[i] added at the SAE's hook point, at every position
  4. generating, steered  through gpt2_numpy.generate's KV cache, or the whole text again each step

Each steering is a set of look_inside hooks, {TransformerLens name: fn(x, name)}: look_inside.model_hook
makes them the model's hook for gpt2_numpy.gpt2 and generate, and look_inside.run_with_hooks and
run_with_cache take them as they are, so every reading (the logits, a score, the logit lens, the next-token
table) can be steered from Python. The forward pass is the model's own: nothing here runs a block.

Shapes: T positions, C = n_embd, n the steering prompts' length. Ids are token ids (bpe.py's encoder).
"""
if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("steer_cli")  # the command line (add, vector, latent): this file is the steering

import numpy as np

import gpt2_numpy as g
from look_inside import model_hook
from plumbing.device import host
from plumbing.errors import UserError, plural
from sae import site_layer

SPACE = 220  # " " in GPT-2's vocabulary: what ActAdd pads the shorter steering prompt with
AGGREGATORS = ("mean", "pca")
FLOAT32_MAX = float(np.finfo(np.float32).max)


# ============================================================================
# Reading activations
# ============================================================================

def activations(ids, params, hparams, names):
    """One text's activations at some hook points, the blocks after the last one needed not run.
    ids [T] -> {TransformerLens name: [T, C]}"""
    ids = g.checked_ids(np.asarray(ids)[None], params)
    kept = {}

    def keep(x, name):
        kept[name] = np.array(host(x[0]), dtype=np.float32)  # a copy, on the host: the forward pass goes on with x

    last = max(site_layer(name, hparams["n_layer"]) for name in names)
    g.gpt2_hidden(ids, {**params, "blocks": params["blocks"][:last + 1]}, hparams,
                  hook=model_hook(dict.fromkeys(names, keep)))
    return kept


def check_layer(layer, hparams):
    """A block of the model: 0 to n_layer - 1."""
    if not (isinstance(layer, (int, np.integer)) and 0 <= layer < hparams["n_layer"]):
        raise UserError(f"must be a layer of the model, 0 to {hparams['n_layer'] - 1}, got {layer!r}", arg="layer")


def check_finite(value, arg):
    """A coefficient, multiplier or alpha: a number float32 holds, not inf or nan, nor 1e300 (inf once it is
    float32): each would make every logit nan."""
    if not (isinstance(value, (int, float, np.floating, np.integer)) and abs(value) <= FLOAT32_MAX):
        raise UserError(f"must be a finite number in float32, got {value!r}", arg=arg)


# A layer norm reads the steered stream by squaring it and summing the squares over the width: past float32's
# largest, 3.4e38, the sum is inf, and the layer norm's output 0 or nan (nan logits read as token 0). Half its
# square root leaves the model's own activation room beside the vector.
LONGEST = float(np.sqrt(FLOAT32_MAX)) / 2  # about 9.2e18


def check_overflow(direction, value, arg):
    """The strength `value` times the unscaled steering direction ([..., C]: a vector, or one a position) must stay
    under LONGEST in every row, or every layer norm after it overflows float32: refused in one line that says the
    strongest value that fits here."""
    norm = float(np.sqrt((np.asarray(host(direction), np.float64) ** 2).sum(-1)).max(initial=0.0))
    if norm and abs(value) > LONGEST / norm:
        raise UserError(f"{value:g} overflows float32: the steering vector would be {abs(value) * norm:.3g} long, and "
                        f"a layer norm squares it (float32 holds at most {FLOAT32_MAX:.3g}); at most about "
                        f"{LONGEST / norm:.2g} here", arg=arg)


# ============================================================================
# 1. ActAdd
# ============================================================================

def act_add_vector(params, hparams, add_ids, sub_ids, layer, coeff, pad_id=SPACE):
    """ActAdd's steering: coeff · (resid_pre of block `layer` on add_ids - on sub_ids).   -> [n, C]
    add_ids, sub_ids: each <|endoftext|> first, unpadded; the shorter is padded on the right with " " (pad_id:
    GPT-2's is SPACE; a vocabulary of one's own has its own), as the paper's code pads (pad_method="tokens_right",
    custom_pad_id the id of " "): position t of one lines up with position t of the other, and a space says
    next to nothing."""
    check_layer(layer, hparams)
    check_finite(coeff, "coeff")
    n = max(len(add_ids), len(sub_ids))
    name = f"blocks.{layer}.hook_resid_pre"
    add, sub = (activations(list(ids) + [pad_id] * (n - len(ids)), params, hparams, [name])[name]
                for ids in (add_ids, sub_ids))
    check_overflow(add - sub, coeff, "coeff")
    return np.float32(coeff) * (add - sub)


def act_add(x, vector):
    """Add ActAdd's vector [n, C] to the first n positions of x [B, T, C]; a one-position pass (a KV-cached
    step: its position is past the front) goes on as it is. -> [B, T, C]"""
    n = len(vector)
    if x.shape[1] == 1:
        return x
    if x.shape[1] < n:
        raise UserError(f"the prompt has {plural(x.shape[1], 'token')}, fewer than the steering prompts' {n}: "
                        "ActAdd adds to the prompt's first n positions")
    x = x.copy()
    x[:, :n] += np.asarray(vector, like=x)  # the vector where x is (a GPU's, or the host's)
    return x


def act_add_hooks(vector, layer):
    """ActAdd as look_inside hooks: act_add at blocks.{layer}.hook_resid_pre. A prompt of one token is never
    steered (its first pass is one position, as a cached step is, and act_add cannot tell them apart: nor can
    the paper's code); the command line refuses a prompt shorter than n before it starts."""
    return {f"blocks.{layer}.hook_resid_pre": lambda x, name: act_add(x, vector)}


# ============================================================================
# 2. Steering vectors from contrastive pairs
# ============================================================================

def read_position(n, read_token_index):
    """The position a read index names in a text of n tokens: from the start, or from the end if negative."""
    at = read_token_index + n if read_token_index < 0 else read_token_index
    if not 0 <= at < n:
        raise UserError(f"{read_token_index} is outside a text of {plural(n, 'token')}",
                        arg="read_token_index")
    return at


def pair_differences(params, hparams, pairs, layers, read_token_index=-1):
    """Each pair's positive - negative activation at the output of each block, read at one token of each text.
    pairs [(positive ids, negative ids)], no <|endoftext|>.   -> {layer: [N, C]}"""
    for layer in layers:
        check_layer(layer, hparams)
    at = [[read_position(len(ids), read_token_index) for ids in pair] for pair in pairs]  # every text's, first
    names = {layer: f"blocks.{layer}.hook_resid_post" for layer in layers}
    diffs = {layer: [] for layer in layers}
    for (positive, negative), (i, j) in zip(pairs, at):
        pos, neg = (activations(ids, params, hparams, list(names.values())) for ids in (positive, negative))
        for layer, name in names.items():
            diffs[layer].append(pos[name][i] - neg[name][j])
    return dict(zip(diffs, map(np.stack, diffs.values())))  # {layer: [n, C]}


def mean_direction(deltas):
    """steering-vectors' mean aggregator: the mean of the differences.   [N, C] -> [C]"""
    return deltas.mean(0)


def pca_direction(deltas):
    """steering-vectors' pca aggregator: the top principal direction of the differences and their negatives
    (so uncentred: the pairs' mean is kept, not taken away), unit norm, turned so that the differences
    project on it positively on average.   [N, C] -> [C]"""
    _, _, vt = np.linalg.svd(deltas.astype(np.float64), full_matrices=False)  # float64: a clean direction
    v = vt[0].astype(np.float32)
    return np.sign((deltas @ v).mean()) * v


def train_vector(params, hparams, pairs, layers, aggregator="mean", read_token_index=-1):
    """A steering vector for each layer from contrastive pairs, as steering-vectors' train_steering_vector:
    v_L = aggregate_i (h'_L(p_i)[r] - h'_L(n_i)[r]), h'_L block L's output (hook_resid_post), r the
    read_token_index (-1: each text's own last token). pairs: [(positive ids, negative ids)], each tokenized
    without <|endoftext|>.   -> {layer: [C]}"""
    if aggregator not in AGGREGATORS:
        raise UserError(f"is not an aggregator: {' or '.join(AGGREGATORS)}, got {aggregator!r}", arg="aggregator")
    if not pairs:
        raise UserError("no pairs to train on", arg="pairs")
    aggregate = mean_direction if aggregator == "mean" else pca_direction
    return {layer: aggregate(d) for layer, d in pair_differences(params, hparams, pairs, layers,
                                                                 read_token_index).items()}


def vector_hooks(vectors, multiplier=1.0, min_token_index=0):
    """multiplier · v added to the output of block L (hook_resid_post) at every position from min_token_index
    on, counted from the start of the text: {layer: v [C]} -> hooks for one text. Each counts the positions it
    has seen, as a KV cache does, so that a cached pass (a step of generate) goes on where the last ended:
    make new hooks for each text. (steering-vectors counts within each forward pass instead, so under its
    model's KV cache it never steers a generated token once min_token_index > 0.)"""
    check_finite(multiplier, "multiplier")
    for v in vectors.values():
        check_overflow(v, multiplier, "multiplier")

    def steer(v, seen):
        def hook(x, name):  # [B, T, C]
            start = seen["n"]
            seen["n"] += x.shape[1]
            at = np.arange(start, seen["n"], like=x) >= min_token_index  # [T], where x is
            return x + np.float32(multiplier) * np.asarray(v, like=x) * at[:, None].astype(np.float32)
        return hook

    return {f"blocks.{layer}.hook_resid_post": steer(np.asarray(v, np.float32), {"n": 0})
            for layer, v in vectors.items()}


def direction_hooks(direction, site, multiplier=1.0, min_token_index=0):
    """multiplier · direction added at hook point `site`, as vector_hooks adds a vector at a block's output: a
    probe's direction (lens.py's steering_direction), pushed where it was read. -> hooks for one text"""
    (hook,) = vector_hooks({0: direction}, multiplier, min_token_index).values()
    return {site: hook}


# ============================================================================
# 3. An SAE latent
# ============================================================================

def latent_vector(sae, latent, alpha):
    """alpha · W_dec[latent]: the direction the SAE writes for one latent, scaled.   -> [d_in]"""
    d_sae = sae["W_dec"].shape[0]
    if not (isinstance(latent, (int, np.integer)) and 0 <= latent < d_sae):
        raise UserError(f"must be one of the SAE's latents, 0 to {d_sae - 1}, got {latent!r}", arg="latent")
    check_finite(alpha, "alpha")
    check_overflow(sae["W_dec"][latent], alpha, "alpha")
    return np.float32(alpha) * sae["W_dec"][latent]


def add_everywhere_hooks(vector, name):
    """vector [d] added at hook point `name` at every position of every pass."""
    return {name: lambda x, _: x + np.asarray(vector, like=x)}  # the vector where x is


# ============================================================================
# 4. Generating, steered
# ============================================================================

def generate_steered(prompt, params, hparams, make_hooks, n_tokens=40, temperature=1.0, top_k=None, top_p=1.0,
                     min_p=0.0, seed=None, stop=None, kv_cache=True):
    """gpt2_numpy.generate with the hooks make_hooks() makes for a text: -> the steps, arrays [1].
    kv_cache=False: the whole text through the model at each step, each pass a new text to new hooks; the
    same rng draws, so the same ids."""
    if kv_cache:
        hooks = make_hooks()
        return g.generate(prompt, params, hparams, n_tokens, temperature, top_k, top_p, seed, 1, stop,
                          hook=model_hook(hooks) if hooks else g.no_hook, min_p=min_p, watch=check_logits)
    g.check_sampling(n_tokens, temperature, top_k, top_p, 1, min_p)
    ids = list(g.checked_prompt(prompt, params, hparams, n_tokens, stop))
    return recomputed_steps(ids, params, hparams, make_hooks, n_tokens, dict(temperature=temperature, top_k=top_k,
                            top_p=top_p, min_p=min_p), np.random.default_rng(seed), stop)


def recomputed_steps(ids, params, hparams, make_hooks, n_tokens, sampling, rng, stop):
    """generate_steered's loop without a cache, on a checked prompt."""
    for _ in range(n_tokens):
        hook = model_hook(make_hooks())
        logits = check_logits(host(g.gpt2(np.array(ids)[None], params, hparams, last_only=True, hook=hook)[:, -1]))
        next_id = g.sample_next(logits, rng, **sampling)  # [1]
        yield next_id
        ids.append(int(next_id[0]))
        if next_id[0] == stop:
            return


def steered_logits(ids, params, hparams, hooks):
    """One pass over a whole text with the steering hooks in it.   ids [T] -> [T, V]"""
    return check_logits(host(g.gpt2(np.asarray(ids)[None], params, hparams, hook=model_hook(hooks))[0]))  # on the host


def check_logits(logits):
    """Steered logits that are all numbers, or a UserError: a steering that passed check_overflow can still
    overflow float32 further on (at a hook point before a matrix product), and a nan logit would be read as
    token 0.   -> logits"""
    if not bool(np.isfinite(logits).all()):
        raise UserError("the steered model's logits are not finite: the steering overflowed float32 inside the "
                        "model; steer less strongly")
    return logits
