"""Finding the circuit behind a behaviour: TransformerLens's experiments, exactly, on look_inside's
cache and hooks and on backward.py's gradients.

    python circuits.py patch --clean "When Mary and John went to the store, John gave a drink to" \\
        --corrupted "When Mary and John went to the store, Mary gave a drink to" --answer " Mary" --wrong " John"

A behaviour is a metric: the logit difference between a right answer and a wrong one, on a clean
prompt (which gives the right answer) and a corrupted one (which does not). Six experiments ask
where the difference comes from, each with TransformerLens 4.3.0's definition (docs/circuits.md
has their equations, their pictures, and which TransformerLens setting gives the same numbers):

  1. the metric              logit_difference: logits[-1, A] - logits[-1, B], averaged over the pairs
  2. activation patching     patch: the corrupted run with one activation the clean run's
  3. direct logit attribution  dla_components, dla_heads (dla_latents, an SAE's): what each part wrote, read along A - B
  4. attribution patching    attribution: patching's first-order estimate, from one backward pass
                             (backward.py's, returning each activation's gradient)
  5. direct path patching    path_patch: one head's change, into one later head's q, k or v alone
  6. head detectors          head_scores: previous-token, duplicate-token and induction heads

Every function takes the model's (params, hparams) and token ids, and returns NumPy arrays. The
prompts come in pairs, [B, T] each: B pairs of the same length T, each pair with its own answer
and wrong answer ([B] ids). Shapes: L = n_layer, H = n_head, C = n_embd, D = C / H, V = n_vocab.
Each takes splice too: None (the model as it is), or (hooks, sae), the model with an SAE spliced in and
TransformerLens's centring, as interface/options.py's sae_splice makes them (hooks: sae.centring_hooks or
{}; sae: sae.splice's, or None). Every run, forward and backward, is then the spliced model's.

Nothing here runs the model but gpt2_numpy's forward pass: patched runs are its hooks
(look_inside.run_with_hooks); the fast sweeps run it too, from the patched layer on, over many
patched copies in one batch (run_patched_fast beside run_patched, which a test holds equal).
"""
if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("circuits_cli")  # the command line (flags, tables, pages): this file is the experiments


import numpy as np

from backward import activation_grads
from gpt2_numpy import gpt2_hidden, layer_norm, layer_norm_eps, linear
from look_inside import activation_shapes, model_hook, run_with_cache, run_with_hooks, sae_hooks, shown, taken_back, \
    transformer_lens_name
from plumbing.device import host
from plumbing.errors import UserError
from plumbing.shapes import block_index
from sae import latent_writes

SITES = {  # what `patch` can patch: the activation (TransformerLens's name within block l)
    "resid_pre": "hook_resid_pre", "resid_mid": "hook_resid_mid", "attn_out": "hook_attn_out",
    "mlp_out": "hook_mlp_out", "head": "attn.hook_z", "q": "attn.hook_q", "k": "attn.hook_k", "v": "attn.hook_v",
    "pattern": "attn.hook_pattern"}
BY_POSITION = ("resid_pre", "resid_mid", "attn_out", "mlp_out")  # one position of one layer at a time: [L, T]
ATTRIBUTED = ("resid_pre", "attn_out", "mlp_out", "head")  # attribution's sites: [L, T], and [L, T, H] for head
COMPONENTS = ("q", "k", "v")  # the inputs of a head that path patching can reach
PATTERNS = ("previous", "duplicate", "induction")  # the heads that head_scores detects
ROWS = 4096  # positions a fast sweep's batch holds at most: its copies x the pairs x T
RESIDUAL_SITES = ("hook_embed", "hook_pos_embed", "hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out",
                  "hook_resid_post")  # an SAE at one of these changes the residual stream itself (dla's "sae_error")


# ============================================================================
# 0. The model the experiments run: as it is, or with an SAE spliced in
# ============================================================================

def spliced(splice, hooks=None):
    """One run's (hooks, sae) for look_inside: splice's (None: the model as it is), with an experiment's
    `hooks` after splice's own at the same name (a patch of a centred activation patches it centred)."""
    base, sae = splice or ({}, None)
    both = {**base, **(hooks or {})}
    for name in base.keys() & (hooks or {}).keys():
        both[name] = chained(base[name], hooks[name])
    return both, sae


def chained(first, then):
    """Two hooks at one name, one after the other."""
    def hook(act, name):
        changed = first(act, name)
        act = act if changed is None else changed
        out = then(act, name)
        return act if out is None else out

    return hook


def sae_site(splice):
    """The hook point of splice's SAE, where it writes (None: none spliced)."""
    return splice[1][0] if splice and splice[1] else None


def sae_reads(splice):
    """The hook point splice's SAE reads: its site, or a transcoder's input hook."""
    return splice[1][3] if splice and splice[1] and len(splice[1]) > 3 else sae_site(splice)


def hooked_name(name, splice):
    """Where an experiment's hook on an activation goes: its name, or at the SAE's own hook point, the SAE's
    input (SAELens's {site}.hook_sae_input: the SAE encodes the patched activation; its error term, with
    use_error_term, stays the run's own). A transcoder's hooks are left alone: a patch where it writes patches
    the model's activation there, what its error term is taken from."""
    return f"{name}.hook_sae_input" if name == sae_site(splice) == sae_reads(splice) else name


def crosses_blocks(splice):
    """A transcoder that reads in one block and writes in another: the fast sweeps, which start at a block,
    would miss its input (run_patched is used instead)."""
    site, reads = sae_site(splice), sae_reads(splice)
    return site != reads and site.split(".")[:2] != reads.split(".")[:2]


# ============================================================================
# 1. The metric
# ============================================================================

def logit_difference(logits, answer, wrong):
    """mean over the pairs of logits[b, -1, answer[b]] - logits[b, -1, wrong[b]]: how much more the model
    believes the right answer than the wrong one, at the last position.
    logits [B, T, V], answer, wrong [B] -> a float"""
    rows, answer, wrong = (np.asarray(a, like=logits) for a in (np.arange(len(logits)), answer, wrong))  # on a GPU too
    last = logits[:, -1]
    return float((last[rows, answer] - last[rows, wrong]).mean())


def answer_logits(hidden, wte, answer, wrong):
    """The two columns of the last position's logits that the metric reads, as logits of a two-token
    vocabulary: [..., B, 1, 2], with the answer at 0 and the wrong answer at 1 (so logit_difference(.., 0, 1)
    is the metric). hidden [..., B, C]: ln_f's output at the last position; wte [V, C]; answer, wrong [B]."""
    answer, wrong = np.asarray(answer, like=wte), np.asarray(wrong, like=wte)  # where the weights are
    return np.stack([(hidden * wte[answer]).sum(-1), (hidden * wte[wrong]).sum(-1)], -1)[..., None, :]


def answers(ids, answer, wrong, params):
    """The prompts ids as [B, T], and each one's answer and wrong answer [B] (one id: the same for all)."""
    ids = np.atleast_2d(ids)
    answer, wrong = (np.broadcast_to(np.asarray(a), ids.shape[:1]) for a in (answer, wrong))
    n_vocab = params["wte"].shape[0]
    for name, chosen in (("answer", answer), ("wrong", wrong)):
        if not np.issubdtype(chosen.dtype, np.integer) or chosen.min() < 0 or chosen.max() >= n_vocab:
            raise UserError(f"must be token ids in 0..{n_vocab - 1}, got {chosen.tolist()}", arg=name)
    return ids, answer, wrong


def pairs(clean_ids, corrupted_ids, answer, wrong, params):
    """The prompt pairs as arrays: clean and corrupted [B, T] of the same shape, answer and wrong [B]."""
    clean_ids, answer, wrong = answers(clean_ids, answer, wrong, params)
    corrupted_ids = np.atleast_2d(corrupted_ids)
    if clean_ids.shape != corrupted_ids.shape:
        raise UserError(f"the clean and corrupted prompts must have the same number of tokens, got "
                        f"{clean_ids.shape[-1]} and {corrupted_ids.shape[-1]}")
    return clean_ids, corrupted_ids, answer, wrong


def metric(params, hparams, ids, answer, wrong, splice=None):
    """The metric of one run of the prompts ids [B, T] (no experiment's hook)."""
    ids, answer, wrong = answers(ids, answer, wrong, params)
    hooks, sae = spliced(splice)
    return logit_difference(run_with_hooks(ids, params, hparams, hooks, sae=sae), answer, wrong)


def metrics(params, hparams, clean_ids, corrupted_ids, answer, wrong, splice=None):
    """The metric of each run: (clean, corrupted)."""
    clean_ids, corrupted_ids, answer, wrong = pairs(clean_ids, corrupted_ids, answer, wrong, params)
    return (metric(params, hparams, clean_ids, answer, wrong, splice),
            metric(params, hparams, corrupted_ids, answer, wrong, splice))


def normalized(values, clean, corrupted):
    """(value - corrupted) / (clean - corrupted): 0 where a patch brings nothing back, 1 where it brings
    back the whole clean answer."""
    return (np.asarray(values) - corrupted) / (clean - corrupted)


# ============================================================================
# 2. Activation patching
# ============================================================================
# A cell is one patched run: {TransformerLens name: hook}, with the layer it starts changing.
# run_patched runs each cell as TransformerLens does, one forward pass a cell. run_patched_fast
# gives the same numbers: the cells of one layer are copies of the corrupted prompts in one batch,
# and since nothing before that layer changes, the model runs from that layer's residual stream
# (computed once, in the corrupted run) through the blocks after it, and reads the two columns of
# the logits that the metric needs.

def patch_hook(clean, index):
    """A hook that patches one cell: the activation with its part at `index` replaced by the clean
    run's, the rest left as it is (a copy: the model's own activation is not changed).
    clean [B, ...]: the clean run's activation, in TransformerLens's layout; index: a NumPy index."""
    def hook(act, name):
        act = act.copy()
        act[index] = clean[index]
        return act

    return hook


def patch_cells(site, all_positions, hparams, T):
    """Where `patch` patches: -> (the result's shape, [(its index in the result, the layer, the activation,
    the index into the activation)]), in TransformerLens's order (the last axis first)."""
    L, H = hparams["n_layer"], hparams["n_head"]
    if site not in SITES:
        raise UserError(f"no site {site!r}: choose from {', '.join(SITES)}", arg="site")
    if site in BY_POSITION:
        shape, index = (L, T), lambda p: (slice(None), p)
    elif site == "head" and not all_positions:
        shape, index = (L, T, H), lambda p, h: (slice(None), p, h)
    elif site == "pattern":  # [B, H, T, T]: the head is the second axis
        shape, index = (L, H), lambda h: (slice(None), h)
    else:  # q, k, v, z [B, T, H, D]: one head at every position
        shape, index = (L, H), lambda h: (slice(None), slice(None), h)
    return shape, [(cell, cell[0], f"blocks.{cell[0]}.{SITES[site]}", index(*cell[1:])) for cell in np.ndindex(shape)]


def patch(params, hparams, clean_ids, corrupted_ids, answer, wrong, site, all_positions=False, fast=True,
          splice=None):
    """Activation patching: the corrupted run, with one activation at a time replaced by the clean run's;
    each cell's value is that run's metric (TransformerLens's get_act_patch_*).
    site: resid_pre, resid_mid, attn_out, mlp_out -> [L, T] (one position of one layer); head -> [L, T, H] (one
    head's z at one position), or with all_positions [L, H]; q, k, v, pattern -> [L, H] (one head, every position).
    fast: run_patched_fast (False: run_patched, one forward pass a cell). At an SAE's hook point the patch is the
    SAE's input's (hooked_name)."""
    clean_ids, corrupted_ids, answer, wrong = pairs(clean_ids, corrupted_ids, answer, wrong, params)
    shape, where = patch_cells(site, all_positions, hparams, clean_ids.shape[1])
    hooks, sae = spliced(splice)
    _, clean = run_with_cache(clean_ids, params, hparams, names=sorted({name for _, _, name, _ in where}), sae=sae,
                              hooks=hooks)
    cells = [(layer, {hooked_name(name, splice): patch_hook(clean[name], index)}) for _, layer, name, index in where]
    run = run_patched_fast if fast and not crosses_blocks(splice) else run_patched
    return np.array(run(params, hparams, corrupted_ids, cells, answer, wrong, splice), np.float32).reshape(shape)


def run_patched(params, hparams, corrupted_ids, cells, answer, wrong, splice=None):
    """Each cell's metric, one forward pass of the corrupted prompts a cell, with its hooks (look_inside's).
    cells: [(the first layer its hooks change, {TransformerLens name: hook(act, name)})] -> [len(cells)]"""
    return [logit_difference(run_with_hooks(corrupted_ids, params, hparams, *spliced(splice, hooks)), answer, wrong)
            for _, hooks in cells]


def run_patched_fast(params, hparams, corrupted_ids, cells, answer, wrong, splice=None):
    """run_patched's numbers, many cells a pass: the cells that start at layer l run as copies of the
    corrupted prompts in one batch, through blocks l..L-1 only (from the corrupted run's residual stream at
    layer l, computed once), to ln_f at the last position and the metric's two logits. -> [len(cells)]
    With an SAE spliced, the copies run it too (copies_forward), so the numbers stay run_patched's."""
    B, T = corrupted_ids.shape
    layers = sorted({layer for layer, _ in cells})
    hooks, sae = spliced(splice)
    _, start = run_with_cache(corrupted_ids, params, hparams, names=[f"blocks.{l}.hook_resid_pre" for l in layers],
                              sae=sae, hooks=hooks)
    out = np.empty(len(cells), np.float32)
    per_batch = max(1, ROWS // (B * T))
    for layer in layers:
        todo = [i for i, (first, _) in enumerate(cells) if first == layer]
        for chunk in range(0, len(todo), per_batch):
            copies = todo[chunk:chunk + per_batch]
            hidden = copies_forward(params, hparams, corrupted_ids, start[f"blocks.{layer}.hook_resid_pre"], layer,
                                    [cells[i][1] for i in copies], splice)  # [n, B, C]
            logits = answer_logits(hidden, params["wte"], answer, wrong)  # [n, B, 1, 2]
            out[copies] = [logit_difference(copy, np.zeros(B, int), np.ones(B, int)) for copy in logits]
    return out


def copies_forward(params, hparams, ids, resid, layer, hooks, splice=None):
    """The model from block `layer` on, over len(hooks) copies of the prompts, copy j with hooks[j]:
    ln_f's output at the last position.   ids [B, T], resid [B, T, C] (the residual stream into block
    `layer`, before an SAE there), hooks [{TransformerLens name: hook(act, name)}] -> [n, B, C]
    splice: as every run's; its hooks and SAE act on all the copies at once (the SAE after the copies' own
    hooks, and after those on its input, {site}.hook_sae_input, as look_inside splices it)."""
    n, B = len(hooks), len(ids)
    later = dict(params, blocks=params["blocks"][layer:])  # the blocks before `layer` are done: resid is theirs
    base, sae = splice or ({}, None)
    site, reads, captured = sae_site(splice), sae_reads(splice), {}

    def each_copy(view, tl):  # the copies' own hooks at tl, copy by copy: -> view, or the patched copies
        if not any(tl in h for h in hooks):
            return view
        acts = view.reshape((n, B) + view.shape[1:])  # [n, B, ...]
        out = acts.copy()
        for j, h in enumerate(hooks):
            if tl in h:
                patched = h[tl](acts[j], tl)
                if patched is not None:
                    out[j] = patched
        return out.reshape(view.shape)

    def hook(name, x):
        if name in ("wte", "wpe"):  # the embeddings: made again, and replaced below
            return x
        i = block_index(name)
        full = name if i is None else f"h{i + layer}.{name.split('.', 1)[1]}"  # h0 of `later` is h{layer}
        if full == f"h{layer}.resid_pre":  # with one pair, every copy's is one array in memory, a read-only view:
            x = np.broadcast_to(resid, (n,) + resid.shape).reshape(x.shape)  # a hook writing in it would patch all
        tl = transformer_lens_name(full)
        view = original = shown(full, x)
        if tl in base:
            changed = base[tl](view, tl)
            view = view if changed is None else changed
        view = each_copy(view, tl)
        if tl == reads != site:  # a transcoder's input, as the copies go on with it
            captured["x"] = view
        elif tl == site:
            sae_in = captured.pop("x") if reads != site else view
            view = sae[1](each_copy(sae_in, f"{site}.hook_sae_input"), sae_in, view)[0]
        return x if view is original else taken_back(full, view)

    tiled = np.broadcast_to(ids, (n, B, ids.shape[1])).reshape(n * B, -1)
    hidden = gpt2_hidden(tiled, later, hparams, last_only=True, hook=hook)
    return hidden[:, -1].reshape(n, B, -1)


# ============================================================================
# 3. Direct logit attribution
# ============================================================================
# The last position's residual stream, before ln_f, is a sum: the embeddings and what each layer
# (each head) wrote. ln_f divides the whole sum by one scale σ, so each part's share of the logit
# difference is its own centred value over σ, read along ln_f's gain times wte[A] - wte[B]. What is
# left over is ln_f's bias term, b · (wte[A] - wte[B]), which no part wrote.

def logit_direction(params, answer, wrong):
    """g ⊙ (wte[A] - wte[B]): the direction in the normalised residual stream along which the logit
    difference grows, for each pair (g: ln_f's gain).   answer, wrong [B] -> [B, C]"""
    answer, wrong = np.asarray(answer, like=params["wte"]), np.asarray(wrong, like=params["wte"])  # where wte is
    return params["ln_f"]["g"] * (params["wte"][answer] - params["wte"][wrong])


def final_scale(resid, eps):
    """σ = √(var(resid) + eps): ln_f's scale, what it divides the residual stream by.   [..., C] -> [..., 1]"""
    return np.sqrt(resid.var(-1, keepdims=True) + eps)


def dla_component(component, scale, direction):
    """One part's share of the logit difference: ((c - mean c) / σ) · direction, each pair's.
    component [B, C] (what it wrote at the last position), scale [B, 1], direction [B, C] -> [B]"""
    centred = component - component.mean(-1, keepdims=True)
    return ((centred / scale) * direction).sum(-1)


def dla_run(params, hparams, ids, answer, wrong, names, splice=None):
    """One forward pass for direct logit attribution: (the cache of `names` at the last position, with
    "final", what ln_f reads; σ [B, 1], the direction [B, C])."""
    L = hparams["n_layer"]
    site = sae_site(splice)
    if site == "ln_final.hook_normalized":
        raise UserError("an SAE at ln_final.hook_normalized changes the logits after ln_f: direct logit attribution "
                        "reads the residual stream before it")
    last = f"blocks.{L - 1}.hook_resid_post"
    last = f"{last}.hook_sae_output" if site == last else last  # the SAE's output is what goes on into ln_f
    hooks, sae = spliced(splice)
    _, cache = run_with_cache(ids, params, hparams, names=names + [last], sae=sae, hooks=hooks)
    at_last = {name: np.broadcast_to(a, (len(ids),) + a.shape[1:])[:, -1] for name, a in cache.items()}
    at_last["final"] = at_last[last]
    return at_last, final_scale(at_last[last], layer_norm_eps(hparams)), logit_direction(params, answer, wrong)


def dla_parts(hparams, splice=None):
    """direct logit attribution's components, in the residual stream's order: {label: the activation}, and with an
    SAE spliced where it changes the residual stream itself (RESIDUAL_SITES), what it changed there: its label
    ("1_sae_error" at blocks.1's hook points, "sae_error" at the embeddings') -> None."""
    parts = {"embed": "hook_embed", "pos_embed": "hook_pos_embed"}
    for i in range(hparams["n_layer"]):
        parts.update({f"{i}_attn_out": f"blocks.{i}.hook_attn_out", f"{i}_mlp_out": f"blocks.{i}.hook_mlp_out"})
    site = sae_site(splice)
    if site is None or site.rsplit(".", 1)[-1] not in RESIDUAL_SITES:
        return parts
    layer, hook = int(site.split(".")[1]) if site.startswith("blocks.") else None, site.rsplit(".", 1)[-1]
    after = {"hook_embed": "embed", "hook_pos_embed": "pos_embed", "hook_attn_out": f"{layer}_attn_out",
             "hook_resid_mid": f"{layer}_attn_out", "hook_mlp_out": f"{layer}_mlp_out",
             "hook_resid_post": f"{layer}_mlp_out",
             "hook_resid_pre": f"{layer - 1}_mlp_out" if layer else "pos_embed"}[hook]
    labels = list(parts)
    labels.insert(labels.index(after) + 1, "sae_error" if layer is None else f"{layer}_sae_error")
    return {label: parts.get(label) for label in labels}


def dla_components(params, hparams, ids, answer, wrong, splice=None):
    """Direct logit attribution by component: the embeddings and each layer's attention and MLP
    outputs, as TransformerLens's decompose_resid + logit_attrs (ln_f folded), averaged over the prompts.
    ids [B, T], answer, wrong [B] -> (labels ["embed", "pos_embed", "0_attn_out", "0_mlp_out", ...], [2 + 2L])
    With an SAE spliced into the residual stream, what it changed (x̂ - x, its output less its input, at its hook
    point) is one more component (dla_parts), so that the components still add up to what ln_f reads."""
    ids, answer, wrong = answers(ids, answer, wrong, params)
    written, _, scale, direction = dla_written(params, hparams, ids, answer, wrong, splice)
    return list(written), np.array([float(dla_component(c, scale, direction).mean()) for c in written.values()],
                                 np.float32)  # float(): each read on the host (from a GPU too)


def dla_written(params, hparams, ids, answer, wrong, splice=None):
    """What each of dla_components' components wrote at the last position, and what ln_f read there:
    -> ({label: [B, C]}, [B, C], σ [B, 1], the direction [B, C]). The first add up to the second."""
    parts, site = dla_parts(hparams, splice), sae_site(splice)
    names = [n for n in parts.values() if n] + ([site, f"{site}.hook_sae_output"] if site else [])
    cache, scale, direction = dla_run(params, hparams, ids, answer, wrong, names, splice)
    written = {label: cache[name] if name else cache[f"{site}.hook_sae_output"] - cache[site]
               for label, name in parts.items()}
    return written, cache["final"], scale, direction


def output_weights(c_proj, n_head):
    """W_O: c_proj's weight as each head meets it, the D rows that head h's output multiplies.   -> [H, D, C]"""
    return c_proj["w"].reshape(n_head, -1, c_proj["w"].shape[-1])


def head_results(z, c_proj, n_head):
    """What each head wrote: z_h @ W_O[h] (no bias: c_proj's bias belongs to no head).   z [..., H, D] -> [..., H, C]"""
    return np.einsum("...hd,hdc->...hc", z, output_weights(c_proj, n_head))


def dla_heads(params, hparams, ids, answer, wrong, splice=None):
    """Direct logit attribution by head: each head's z @ W_O[h] at the last position, scaled and read as
    dla_components reads a component (TransformerLens's stack_head_results with fold_value_biases=False).
    ids [B, T], answer, wrong [B] -> (labels ["L0H0", "L0H1", ...], [L · H])"""
    ids, answer, wrong = answers(ids, answer, wrong, params)
    L, H = hparams["n_layer"], hparams["n_head"]
    z = [f"blocks.{i}.attn.hook_z" for i in range(L)]
    cache, scale, direction = dla_run(params, hparams, ids, answer, wrong, z, splice)
    results = [head_results(cache[z[i]], params["blocks"][i]["attn"]["c_proj"], H) for i in range(L)]  # [B, H, C]
    values = [float(dla_component(results[i][:, h], scale, direction).mean()) for i in range(L) for h in range(H)]
    return [f"L{i}H{h}" for i in range(L) for h in range(H)], np.array(values, np.float32)


def dla_latents(params, hparams, ids, answer, wrong, W_dec, splice):
    """Direct logit attribution by SAE latent (ARENA 1.3's): latent i wrote f_i W_dec[i] at the SAE's hook point,
    each read as dla_components reads a component, averaged over the prompts. With the decoder's bias's share
    (and the error term's, where it is spliced) they add up to the share of what the SAE wrote, its output.
    W_dec [d_sae, C]: the SAE's decoder, or the SAE itself, whose latents then write what sae.latent_writes says
    (a TopK's f_i / ‖W_dec[i]‖, times the token's σ where its output is de-normalised) -> [d_sae]"""
    site = sae_site(splice)
    if site is None or site.rsplit(".", 1)[-1] not in RESIDUAL_SITES:
        raise UserError("direct logit attribution by latent reads an SAE that writes into the residual stream "
                        f"({', '.join(RESIDUAL_SITES)}); " + (f"this one is at {site}" if site else "none is spliced"))
    ids, answer, wrong = answers(ids, answer, wrong, params)
    acts, read = f"{site}.hook_sae_acts_post", f"{site}.hook_sae_input"
    cache, scale, direction = dla_run(params, hparams, ids, answer, wrong, [acts, read], splice)
    coefficients = cache[acts]
    if isinstance(W_dec, dict):
        coefficients, W_dec = latent_writes(cache[read], coefficients, W_dec)
    # latent i wrote c_i W_dec[i], so its share is c_i times W_dec[i]'s share (dla_component), pair by pair
    per_row = np.stack([dla_component(W_dec, scale[b], direction[b]) for b in range(len(scale))])  # [B, d_sae]
    return (coefficients * per_row).mean(0).astype(np.float32)


# ============================================================================
# 4. Attribution patching
# ============================================================================
# Patching one activation a moves the metric by about (a_clean - a_corrupted) · ∂metric/∂a, the
# gradient taken on the corrupted run: one backward pass estimates every cell of a patching sweep
# (Nanda, 2023). backward.py gives the gradient of each activation, the mirror of its forward hooks.

def logit_difference_grad(ids_shape, n_vocab, answer, wrong):
    """∂ logit_difference / ∂ logits: +1/B at [b, -1, answer[b]], -1/B at [b, -1, wrong[b]], 0 elsewhere.
    -> [B, T, V]"""
    B, T = ids_shape
    d = np.zeros((B, T, n_vocab), np.float32)
    d[np.arange(B), -1, answer] += 1.0 / B
    d[np.arange(B), -1, wrong] -= 1.0 / B
    return d


def gradients(ids, params, hparams, dlogits, names, splice=None):
    """∂metric/∂a for the activations `names` (TransformerLens's names and layouts), from backward.py,
    given ∂metric/∂logits [B, T, V]: the backward pass's mirror of run_with_cache. -> {name: [B, ...]}
    With splice, the forward pass is the spliced model's and the backward mirrors it: at the SAE's hook point
    the gradient goes back through the SAE (sae.input_grad: SAELens's, through x̂ alone), and is the gradient of
    the SAE's input there (a transcoder's goes back to its input's hook, and where it writes, the model's own
    activation, read by nothing but the error term, a constant, gets 0); through each of splice's hooks, the
    centring (a projection, x - mean x), it goes back as the projection's own transpose, itself: g - mean g."""
    base, sae = splice or ({}, None)
    site, reads, grads, inputs = sae_site(splice), sae_reads(splice), {}, {}
    forward = sae_hooks(base, sae, activation_shapes(hparams, *np.shape(np.atleast_2d(ids))))
    if sae:
        splicing = forward[site]

        def keep_input(x, name):  # what the SAE read: its backward needs it
            out, latents = splicing(x, name, keep=True)
            inputs[site] = latents[f"{site}.hook_sae_input"]
            return out

        forward = {**forward, site: keep_input}

    def keep(name, d):
        tl = transformer_lens_name(name)
        if tl == site and reads != site:  # a transcoder: the gradient goes to its input; its site's own is 0
            inputs["grad"] = sae[2](inputs[site], shown(name, d))
            d = np.zeros_like(d)
        elif tl == site:
            d = taken_back(name, sae[2](inputs[site], shown(name, d)))
        elif tl == reads:
            d = d + taken_back(name, inputs.pop("grad"))
        if tl in names:
            grads[tl] = shown(name, d)
        if tl in base:
            d = taken_back(name, base[tl](shown(name, d), tl))
        return d

    activation_grads(np.atleast_2d(ids), params, hparams, dlogits, keep, model_hook(forward))
    return grads


def attribution(params, hparams, clean_ids, corrupted_ids, answer, wrong, site, splice=None):
    """Attribution patching: at each activation a, (a_clean - a_corrupted) · ∂metric/∂a, the gradient on
    the corrupted run, summed over a's last axis (and over the pairs, whose mean the metric is).
    site: resid_pre, attn_out, mlp_out -> [L, T]; head (z) -> [L, T, H]. TransformerLens's attribution_patch
    node scores (head, mlp_out), or its forward and backward hooks. At an SAE's hook point, a is the SAE's input."""
    if site not in ATTRIBUTED:
        raise UserError(f"no site {site!r} for attribution: choose from {', '.join(ATTRIBUTED)}", arg="site")
    clean_ids, corrupted_ids, answer, wrong = pairs(clean_ids, corrupted_ids, answer, wrong, params)
    names = [f"blocks.{i}.{SITES[site]}" for i in range(hparams["n_layer"])]
    hooks, sae = spliced(splice)
    _, clean = run_with_cache(clean_ids, params, hparams, names=names, sae=sae, hooks=hooks)
    _, corrupted = run_with_cache(corrupted_ids, params, hparams, names=names, sae=sae, hooks=hooks)
    dlogits = np.asarray(logit_difference_grad(corrupted_ids.shape, params["wte"].shape[0], answer, wrong),
                         like=params["wte"])  # where the model is
    grads = gradients(corrupted_ids, params, hparams, dlogits, names, splice)
    return host(np.stack([((clean[n] - corrupted[n]) * grads[n]).sum(-1).sum(0) for n in names]))  # on the host


# ============================================================================
# 5. Direct path patching
# ============================================================================

def path_hook(resid, delta, block, head, component, hparams):
    """A hook for blocks.l.attn.hook_q (or _k, _v) that gives head `head` the q (k, v) it would make if the
    residual stream it reads held delta more: c_attn's slice for that head on ln_1(resid + delta).
    resid, delta [B, T, C] (the run's residual stream into block l; the source head's change)."""
    C, H = hparams["n_embd"], hparams["n_head"]
    D = C // H
    first = COMPONENTS.index(component) * C + head * D  # c_attn's columns: q, k, v, each H heads of D
    cols = slice(first, first + D)
    x = layer_norm(resid + delta, **block["ln_1"], eps=layer_norm_eps(hparams))
    new = linear(x, block["attn"]["c_attn"]["w"][:, cols], block["attn"]["c_attn"]["b"][cols])  # [B, T, D]

    def hook(act, name):  # act [B, T, H, D]
        act = act.copy()
        act[:, :, head] = new
        return act

    return hook


def path_patch(params, hparams, clean_ids, corrupted_ids, answer, wrong, source, component, fast=True, splice=None):
    """Direct path patching (TransformerLens 4.3.0's get_act_patch_direct_path): head (L, H)'s change,
    (z_clean - z_corrupted) @ W_O[H], added at every position to the input of each later head's query,
    key or value (component) and to nothing else; the metric of each such run.
    source (layer, head) -> [L, H], 0 for the layers up to the source's. With an SAE spliced at a later
    resid_pre, the receiving head reads the SAE's output there, plus the change (which passes by the SAE)."""
    if component not in COMPONENTS:
        raise UserError(f"no component {component!r}: choose from q, k, v", arg="component")
    clean_ids, corrupted_ids, answer, wrong = pairs(clean_ids, corrupted_ids, answer, wrong, params)
    L, H = hparams["n_layer"], hparams["n_head"]
    layer, head = source
    if not (0 <= layer < L and 0 <= head < H):
        raise UserError(f"must be a head of the model, layer 0..{L - 1} and head 0..{H - 1}, got {layer}.{head}",
                        arg="source")
    z_name = f"blocks.{layer}.attn.hook_z"
    site = sae_site(splice)
    read = {i: f"blocks.{i}.hook_resid_pre" for i in range(layer + 1, L)}  # what block i's ln_1 reads
    read = {i: f"{name}.hook_sae_output" if name == site else name for i, name in read.items()}
    hooks, sae = spliced(splice)
    _, clean = run_with_cache(clean_ids, params, hparams, names=[z_name], sae=sae, hooks=hooks)
    _, corrupted = run_with_cache(corrupted_ids, params, hparams, names=[z_name] + list(read.values()), sae=sae,
                                  hooks=hooks)
    W_O = output_weights(params["blocks"][layer]["attn"]["c_proj"], H)[head]  # [D, C]
    delta = (clean[z_name][:, :, head] - corrupted[z_name][:, :, head]) @ W_O  # [B, T, C]
    cells = [(i, {f"blocks.{i}.attn.hook_{component}": path_hook(corrupted[read[i]], delta,
                                                                  params["blocks"][i], h, component, hparams)})
             for i in range(layer + 1, L) for h in range(H)]
    out = np.zeros((L, H), np.float32)
    run = run_patched_fast if fast and not crosses_blocks(splice) else run_patched
    if cells:
        out[layer + 1:] = np.reshape(run(params, hparams, corrupted_ids, cells, answer, wrong, splice),
                                     (L - layer - 1, H))
    return out


# ============================================================================
# 6. Head detectors
# ============================================================================

def detection_pattern(tokens, pattern):
    """Where a head of this kind would attend, as TransformerLens's detect_head defines it: 1 at
    (query i, key j), 0 elsewhere, lower triangular.   tokens [T] -> [T, T]
    previous: j = i - 1;  duplicate: j < i holds the same token as i;  induction: j - 1 is such a duplicate
    (the token after an earlier occurrence of i's token)."""
    tokens = np.asarray(tokens)
    T = len(tokens)
    if pattern == "previous":
        return np.eye(T, k=-1, dtype=np.float32)
    duplicate = np.tril(tokens[:, None] == tokens[None, :], k=-1).astype(np.float32)
    if pattern == "duplicate":
        return duplicate
    if pattern == "induction":
        induction = np.zeros_like(duplicate)
        induction[:, 1:] = duplicate[:, :-1]
        return np.tril(induction)
    raise UserError(f"no pattern {pattern!r}: choose from {', '.join(PATTERNS)}", arg="pattern")


def head_scores(params, hparams, ids, pattern, splice=None):
    """Each head's detection score (TransformerLens's detect_head, error_measure="mul"): the share of its
    attention on the detection pattern, Σ (attention ⊙ detection) / Σ attention (= / T, each row summing
    to 1), over every row. ids [T], one text -> [L, H]. (look_inside's induction_scores and
    previous_token_scores average over the rows that have a target instead.) With an SAE spliced, the layers
    after it attend as the spliced model does."""
    ids = np.asarray(ids)
    detection = detection_pattern(ids, pattern)
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(hparams["n_layer"])]
    hooks, sae = spliced(splice)
    _, cache = run_with_cache(ids[None], params, hparams, names=names, sae=sae, hooks=hooks)
    weights = host(np.stack([cache[n][0] for n in names]))  # [L, H, T, T], read on the host
    return ((weights * detection).sum((-1, -2)) / weights.sum((-1, -2))).astype(np.float32)


def repeated_random_tokens(n, n_vocab, eot, seed=None):
    """<|endoftext|>, then n random ids (any but <|endoftext|>), then the same n again: the text on which an
    induction head shows itself, since every token of the second half was seen before.   -> [2n + 1]"""
    half = np.random.default_rng(seed).integers(0, n_vocab - 1, n)
    half = half + (half >= eot)
    return np.concatenate([[eot], half, half]).astype(np.int64)

