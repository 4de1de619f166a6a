"""Looking inside GPT-2: every activation by name, hooks that change them, the logit lens,
the next-token table, and the attention scores that find induction heads.

The model (gpt2_numpy.py) passes each activation it makes through `hook(name, x)`. Here
those activations get TransformerLens's names, so that material written for it (ARENA,
the induction-head and IOI papers' notebooks) translates line by line:

    ours (gpt2_numpy.py)   TransformerLens                       shape here
    wte, wpe               hook_embed, hook_pos_embed            [B, T, C], [1, T, C]
    h{i}.resid_pre         blocks.{i}.hook_resid_pre             [B, T, C]
    h{i}.ln_1              blocks.{i}.ln1.hook_normalized        [B, T, C]
    h{i}.attn.q / k / v    blocks.{i}.attn.hook_q / _k / _v      [B, T, H, D]  (ours: [B, H, T, D])
    h{i}.attn.scores       blocks.{i}.attn.hook_attn_scores      [B, H, T, T]  (masked: -inf)
    h{i}.attn.weights      blocks.{i}.attn.hook_pattern          [B, H, T, T]
    h{i}.attn.z            blocks.{i}.attn.hook_z                [B, T, H, D]  (ours: [B, H, T, D])
    h{i}.attn.out          blocks.{i}.hook_attn_out              [B, T, C]
    h{i}.resid_mid         blocks.{i}.hook_resid_mid             [B, T, C]
    h{i}.ln_2              blocks.{i}.ln2.hook_normalized        [B, T, C]
    h{i}.mlp.c_fc          blocks.{i}.mlp.hook_pre               [B, T, 4C]
    h{i}.mlp.gelu          blocks.{i}.mlp.hook_post              [B, T, 4C]
    h{i}.mlp.out           blocks.{i}.hook_mlp_out               [B, T, C]
    h{i}.resid_post        blocks.{i}.hook_resid_post            [B, T, C]
    ln_f                   ln_final.hook_normalized              [B, T, C]

These are the raw checkpoint's activations. TransformerLens's `from_pretrained` by
default folds each LayerNorm's gain into the next weights and centres the unembedding,
which changes these numbers; its `from_pretrained_no_processing` gives the raw ones.
"""
import re

import numpy as np

from gpt2_numpy import gpt2, layer_norm, layer_norm_eps, log_softmax, matmul, next_token_loss, softmax
from plumbing.device import host, on_device
from plumbing.errors import UserError
from plumbing.memory import available_memory, check_fits
from plumbing.shapes import block_index

BLOCK_STAGES = {  # inside block i: ours -> (TransformerLens's name, its shape as shown here)
    "resid_pre": ("hook_resid_pre", "BTC"), "ln_1": ("ln1.hook_normalized", "BTC"),
    "attn.q": ("attn.hook_q", "BTHD"), "attn.k": ("attn.hook_k", "BTHD"), "attn.v": ("attn.hook_v", "BTHD"),
    "attn.scores": ("attn.hook_attn_scores", "BHTT"), "attn.weights": ("attn.hook_pattern", "BHTT"),
    "attn.z": ("attn.hook_z", "BTHD"), "attn.out": ("hook_attn_out", "BTC"), "resid_mid": ("hook_resid_mid", "BTC"),
    "ln_2": ("ln2.hook_normalized", "BTC"), "mlp.c_fc": ("mlp.hook_pre", "BTF"), "mlp.gelu": ("mlp.hook_post", "BTF"),
    "mlp.out": ("hook_mlp_out", "BTC"), "resid_post": ("hook_resid_post", "BTC")}
OUTSIDE_NAMES = {"wte": "hook_embed", "wpe": "hook_pos_embed", "ln_f": "ln_final.hook_normalized"}
SAE_HOOKS = ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_error",
             "hook_sae_output")  # a spliced SAE's activations, under its hook point's name (SAELens's)
HEADS_SECOND = {s for s, (_, layout) in BLOCK_STAGES.items() if layout == "BTHD"}  # the model has them [B, H, T, D]


def transformer_lens_name(name):
    """The model's name for an activation -> TransformerLens's: h3.attn.weights -> blocks.3.attn.hook_pattern"""
    if name in OUTSIDE_NAMES:
        return OUTSIDE_NAMES[name]
    return f"blocks.{block_index(name)}.{BLOCK_STAGES[name.split('.', 1)[1]][0]}"


def shown(name, x):
    """An activation as TransformerLens shows it (a view: nothing is copied)."""
    stage = name.split(".", 1)[-1]
    if stage in HEADS_SECOND:
        return x.swapaxes(1, 2)
    return x[None] if name == "wpe" else x


def taken_back(name, x):
    """A hook's replacement, back in the model's layout; float32, as everything the model makes."""
    x = x.astype(np.float32, copy=False) if on_device(x) else np.asarray(x, dtype=np.float32)  # a GPU's stays there
    if name == "wpe" and x.ndim == 3 and len(x) == 1:  # shown as [1, T, C]: the model's is [T, C]
        return x[0]
    return x.swapaxes(1, 2) if name.split(".", 1)[-1] in HEADS_SECOND else x


def activation_shapes(hparams, batch, n_tokens):
    """{TransformerLens name: shape} of every activation of one forward pass, in order."""
    B, T, C, H = batch, n_tokens, hparams["n_embd"], hparams["n_head"]
    size = {"B": B, "T": T, "C": C, "H": H, "D": C // H, "F": hparams.get("n_inner") or 4 * C}  # F: the MLP's width
    per_stage = {stage: tuple(size[letter] for letter in layout) for stage, (_, layout) in BLOCK_STAGES.items()}
    shapes = {"hook_embed": (B, T, C), "hook_pos_embed": (1, T, C)}
    for i in range(hparams["n_layer"]):
        shapes.update({transformer_lens_name(f"h{i}.{stage}"): shape for stage, shape in per_stage.items()})
    shapes["ln_final.hook_normalized"] = (B, T, C)
    return shapes


def check_names(names, known):
    """Every name must be an activation's (known: activation_shapes'): one clear error for the first that is not."""
    unknown = [n for n in names if n not in known]
    block = unknown and re.fullmatch(r"blocks\.\d+\.(.+)", unknown[0])
    if block and f"blocks.0.{block[1]}" in known:  # a real hook point, in a block the model lacks
        n = sum(name.startswith("blocks.") and name.endswith(".hook_resid_pre") for name in known)
        raise UserError(f"no activation is called {unknown[0]!r}: the model has {n} blocks, blocks.0 to "
                        f"blocks.{n - 1}")
    if unknown:
        raise UserError(f"no activation is called {unknown[0]!r}: names look like blocks.0.attn.hook_pattern "
                        "(see look_inside.activation_shapes)")


def name_filter(names, known):
    """names: None (everything), a list of TransformerLens names, or a predicate on a name."""
    if names is None:
        return lambda name: True
    if callable(names):
        return names
    names = [names] if isinstance(names, str) else list(names)
    check_names(names, known)
    return set(names).__contains__


def run_with_cache(ids, params, hparams, names=None, memory=None, sae=None, hooks=None):
    """One forward pass that keeps activations: -> (logits [B, T, V], cache {name: array}).
    names: which to keep (a list of TransformerLens names, or a predicate; default all).
    sae: an SAE spliced in at its hook point, as sae.splice makes it: (the hook's name, fn(x, unhooked, original)
    -> (what goes on, {SAELens's names: arrays}), its backward, the hook it reads: a transcoder's is another);
    its latents are kept too
    (blocks.0.hook_resid_pre.hook_sae_acts_post, ...).
    hooks: run_with_hooks', applied first (what is kept is what they return; sae_hooks says where a hook on the
    SAE's input goes).
    Everything for B sequences of T tokens takes 4·B·T·(L·(19·C + 2·H·T) + 3·C) bytes: a request
    that would not fit in `memory`
    (default: what the OS has available) is refused before any work."""
    ids = np.atleast_2d(np.asarray(ids))
    shapes = activation_shapes(hparams, *ids.shape)
    site = sae[0] if sae else None
    sae_names = [f"{site}.{hook}" for hook in SAE_HOOKS] if sae else []
    wanted = name_filter(names, {**shapes, **dict.fromkeys(sae_names)})
    hooks = sae_hooks(hooks or {}, sae, shapes)
    need = 4 * sum(int(np.prod(shape)) for name, shape in shapes.items() if wanted(name))
    check_fits(need, available_memory() if memory is None else memory,
               f"caching these activations for {ids.shape[0]} x {ids.shape[1]} tokens",
               "keep fewer (names=...) or use fewer tokens")
    cache, changing = {}, model_hook(hooks)

    def record(name, x):
        tl = transformer_lens_name(name)
        if tl == site:  # the SAE's: the activation the model made there, and its latents
            out, latents = hooks[site](shown(name, x), tl, keep=True)
            cache.update({k: v for k, v in latents.items() if wanted(k)})
            return taken_back(name, out)
        x = changing(name, x)
        if wanted(tl):
            cache[tl] = shown(name, x)
        return x

    return gpt2(ids, params, hparams, hook=record), cache


def sae_hooks(hooks, sae, shapes):
    """run_with_hooks' hooks, checked, with the SAE spliced in at its hook point, after any hook at that name (the
    model's: what the SAE reads, and what its error term is taken from), and after a hook named
    {site}.hook_sae_input (SAELens's: it changes what the SAE encodes, not the error term). A transcoder (sae[3],
    the hook it reads, is not sae[0], the one it writes) takes its input where it reads, as the model goes on
    with it there, and writes where it writes: its error term is taken from the model's activation there.
    -> {name: hook}; the site's is fn(x, name, keep=False) -> what goes on (with keep, and {the site: the
    activation the model made there, and the SAE's latents})"""
    site = sae[0] if sae else None
    check_names([n for n in hooks if n != f"{site}.hook_sae_input"], shapes)
    if not sae:
        return hooks
    run, nothing = sae[1], lambda x, name: None
    reads = sae[3] if len(sae) > 3 else site
    check_names([reads], shapes)
    before, on_input = hooks.get(site) or nothing, hooks.get(f"{site}.hook_sae_input") or nothing
    captured = {}

    def capture(x, name):  # a transcoder's input
        changed = (hooks.get(reads) or nothing)(x, name)
        captured["x"] = x if changed is None else np.asarray(changed, np.float32)
        return changed

    def spliced(x, name, keep=False):
        changed = before(x, name)  # None: x as it is
        x = x if changed is None else np.asarray(changed, np.float32)
        sae_in = captured.pop("x") if reads != site else x
        changed = on_input(sae_in, f"{name}.hook_sae_input")
        out, latents = run(sae_in if changed is None else np.asarray(changed, np.float32), sae_in, x)
        return (out, {name: x, **latents}) if keep else out

    spliced_hooks = {n: h for n, h in hooks.items() if n != f"{site}.hook_sae_input"}
    return {**spliced_hooks, **({reads: capture} if reads != site else {}), site: spliced}


def model_hook(hooks):
    """{TransformerLens name: fn(activation, name)} -> the model's hook(name, x). fn returns a
    replacement (in TransformerLens's layout) or None to leave the activation as it is.
    Pass it to gpt2_numpy.gpt2 or .generate as hook=...; in generate, each step's hooks see
    only the new positions (the earlier ones are in the KV cache)."""
    unknown = [n for n in hooks if not callable(hooks[n])]
    if unknown:
        raise UserError(f"the hook for {unknown[0]!r} is not a function", arg="hooks")

    def hook(name, x):
        tl = transformer_lens_name(name)
        fn = hooks.get(tl)
        if fn is None:
            return x
        out = fn(shown(name, x), tl)
        return x if out is None else taken_back(name, out)

    return hook


def run_with_hooks(ids, params, hparams, hooks, sae=None):
    """The forward pass with activations changed by hooks ({name: fn(activation, name)}): -> logits.
    For ablation (fn returns zeros, or a mean) and patching (fn returns another run's activation).
    sae: an SAE spliced in (run_with_cache's), after any hook at the same name; a hook on its input is named
    as SAELens names it, {site}.hook_sae_input (sae_hooks)."""
    ids = np.atleast_2d(np.asarray(ids))
    return gpt2(ids, params, hparams, hook=model_hook(sae_hooks(hooks, sae, activation_shapes(hparams, *ids.shape))))


def trace(ids, params, hparams, blocks=None, sae=None, hooks=None):
    """One forward pass, every stage in order: [(name, array)], from the token ids to the
    logits. It is run_with_cache's cache (sae, hooks: its). blocks: the blocks whose stages to keep (default all)."""
    def wanted(name):  # blocks.3.attn.hook_z is in block 3; hook_embed is in none
        return blocks is None or not name.startswith("blocks.") or int(name.split(".")[1]) in blocks

    ids = np.atleast_2d(np.asarray(ids))
    logits, cache = run_with_cache(ids, params, hparams, names=wanted, sae=sae, hooks=hooks)
    return [("token ids", ids)] + list(cache.items()) + [("logits", logits)]


# ----------------------------------------------------------------------------
# The logit lens, and the next-token table
# ----------------------------------------------------------------------------

def lens_layers(n_layer):
    """The layers the logit lens reads, listed once: the residual stream as it leaves each one,
    the embedding, then each block's output. -> [(its label in tables and the page, its activation)]"""
    return [("embed", "blocks.0.hook_resid_pre")] + [(f"h{i}", f"blocks.{i}.hook_resid_post") for i in range(n_layer)]


def lens_activations(n_layer):
    """The activations the logit lens reads, one a layer: blocks.0.hook_resid_pre, blocks.0.hook_resid_post, ..."""
    return [name for _, name in lens_layers(n_layer)]


def lens_labels(n_layer):
    """The lens's rows, as the tables and the page show them: embed, h0, h1, ..."""
    return [label for label, _ in lens_layers(n_layer)]


def residual_stream(cache, n_layer):
    """The residual stream as it leaves each layer (lens_layers), from run_with_cache's cache.   -> [L + 1, B, T, C]"""
    return np.stack([cache[name] for name in lens_activations(n_layer)])


def logit_lens(ids, params, hparams, target=None, run=None):
    """What each layer would predict if the model stopped there: ln_f(resid) @ wteᵀ at the
    embedding and after each block, at every position.
    target [B, T] (default: the model's own final prediction at each position).
    run: (logits, cache) of run_with_cache on these ids, holding lens_activations(L), to read instead of
    running the model again.
    -> {"top" [L+1, B, T] ids, "top_prob", "target" [B, T], "target_prob", "target_rank" [L+1, B, T]}
    The last layer's lens is the model's logits."""
    logits, cache = run or run_with_cache(ids, params, hparams, names=lens_activations(hparams["n_layer"]))
    readings = (matmul(layer_norm(resid, **params["ln_f"], eps=layer_norm_eps(hparams)), params["wte"].T)
                for resid in residual_stream(cache, hparams["n_layer"]))  # [B, T, V] a layer
    return lens_table(readings, logits, target)


def lens_table(readings, logits, target=None):
    """Each layer's reading [B, T, V] (a lens's logits) summed up: its top token and that token's probability, the
    target's probability and rank. target [B, T] (default: the model's own final prediction, logits' argmax).
    -> {"top" [L+1, B, T] ids, "top_prob", "target" [B, T], "target_prob", "target_rank" [L+1, B, T]}"""
    target = logits.argmax(-1) if target is None else np.asarray(target).reshape(logits.shape[:2])
    out = {k: [] for k in ("top", "top_prob", "target_prob", "target_rank")}
    for lens in readings:
        top = lens.argmax(-1)  # [B, T]
        target_logit = np.take_along_axis(lens, target[..., None], -1)  # [B, T, 1]
        out["top"].append(top)
        probs = softmax(lens)  # once a layer: two of its columns are read
        out["top_prob"].append(np.take_along_axis(probs, top[..., None], -1)[..., 0])
        out["target_prob"].append(np.take_along_axis(probs, target[..., None], -1)[..., 0])
        out["target_rank"].append((lens > target_logit).sum(-1))  # 0: the target is the top token
    return {"target": target, **{k: np.stack(v) for k, v in out.items()}}


def next_token_table(logits, k):
    """The k most likely next tokens: (ids [k], probs [k], logprobs [k]), most likely first.
    logits [V] at one position (as TransformerLens's test_prompt shows them)."""
    logprobs = log_softmax(np.asarray(host(logits), dtype=np.float32))  # [V]: read on the host
    top = np.argsort(-logprobs, kind="stable")[:k]
    return top, np.exp(logprobs[top]), logprobs[top]


# ----------------------------------------------------------------------------
# Reading attention patterns: previous-token and induction heads
# ----------------------------------------------------------------------------

def previous_token_scores(pattern):
    """Each head's mean attention from a position to the one before it.
    pattern [..., H, T, T] (one sequence's weights) -> [..., H]; positions 1..T-1."""
    return np.diagonal(pattern, offset=-1, axis1=-2, axis2=-1).mean(-1)


def induction_targets(tokens):
    """For each position t: the position after the latest earlier occurrence of tokens[t],
    or -1 where the token has not occurred before.   tokens [T] -> [T]"""
    last_seen, targets = {}, []
    for t, token in enumerate(np.asarray(tokens).tolist()):
        targets.append(last_seen[token] + 1 if token in last_seen else -1)
        last_seen[token] = t
    return np.array(targets)


def induction_scores(pattern, tokens):
    """Each head's mean attention from a position to the position after the previous
    occurrence of its token (an induction head: "A B ... A" attends to B, to predict it).
    pattern [..., H, T, T], tokens [T] -> [..., H]; averaged over the positions whose token
    occurred before (NaN if none did)."""
    targets = induction_targets(tokens)
    rows = np.flatnonzero(targets >= 0)
    if not rows.size:
        return np.full(pattern.shape[:-2], np.nan, dtype=np.float32)
    return pattern[..., rows, targets[rows]].mean(-1)


# ----------------------------------------------------------------------------
# Ablation
# ----------------------------------------------------------------------------

def zero_ablate_head(head):
    """A hook for blocks.{i}.attn.hook_z that silences one head: its output z becomes 0 at
    every position, so c_proj adds nothing of it (only c_proj's bias remains)."""
    def hook(z, name):  # z [B, T, H, D]
        z = z.copy()
        z[:, :, head] = 0.0
        return z

    return hook


def loss(ids, params, hparams, hooks=None):
    """The mean next-token loss (nats) of ids [B, T] with these hooks (none: the plain model)."""
    ids = np.atleast_2d(np.asarray(ids))
    return next_token_loss(run_with_hooks(ids, params, hparams, hooks or {})[:, :-1], ids[:, 1:])
