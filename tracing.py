"""Attribution graphs: one prompt's computation traced through transcoders, exactly as circuit-tracer computes it,
on gpt2_numpy's forward pass and backward.py's gradients (Ameisen et al., "Circuit Tracing", 2025).

    python circuits.py graph "The cat sat on the" --transcoders tc/0 tc/1 ... --out graph.json --html graph.html
    python circuits.py intervene "The cat sat on the" --transcoders ... --set 1,3,42=0 --logits out.npy

Replace each MLP by a transcoder, a wide sparse layer that reads the MLP's input (ln_2's output) and writes its
output, and hold fixed what makes the model non-linear on this prompt: every attention pattern, every layer norm's
scale 1/√(var + ε), and each MLP's output (the transcoder's error, what it missed, is kept as a constant, an error
node). What is left is linear in the residual stream: from the tokens' embeddings through the features that fire to
the logits. Each edge A[t, s] is s's direct effect on t's pre-activation: a backward pass of that frozen model from
t (its encoder row injected as the gradient at its layer's MLP input), contracted with s's vector at s's layer's MLP
output (its activation times its decoder row; an error node's error; a token's embedding). docs/circuits.md's
"Attribution graphs" tells it with a worked example.

  1. transcoders           per layer (SAELens's folders), or one cross-layer (circuit-tracer's); activate
  2. the traced run        one forward pass: the active features, error and token vectors; the logit targets
  3. one row               a target's gradient contracted with its sources' vectors (adjacency_row, and its fast form)
  4. the graph             one backward pass a batch of rows (attribution_rows), --max-features' ranking
  5. pruning               influence (the Neumann series), the node and edge thresholds, the two scores
  6. interventions         features set to a value, the model run on (feature_intervention)

The nodes, in circuit-tracer's order (the adjacency's rows are targets, its columns sources): the active features
sorted by (layer, position, feature), the error nodes layer by layer (n_features + layer·T + position), one token a
position, the logits by descending probability. Positions count the <|endoftext|> put first as 0; features and
errors there are zeroed. Shapes: T positions, C = n_embd, L = n_layer, d a transcoder's width, n active features.
The commands are circuits.py's (graph, intervene: interface/graph_cli.py); this file is the method.
"""
import numpy as np

from backward import STOPS, model_backward, training_forward
from gpt2_numpy import gpt2, gpt2_hidden, layer_norm_eps, softmax
from plumbing.device import host
from plumbing.errors import UserError
from plumbing.shapes import block_index
from sae import topk_mask

HOOK_IN, HOOK_OUT = "blocks.{}.ln2.hook_normalized", "blocks.{}.hook_mlp_out"  # where layer l's transcoder reads, writes
BATCH = 512  # rows a backward pass (attribute()'s batch_size)
UPDATE_INTERVAL = 4  # with --max-features, the ranking is made again every UPDATE_INTERVAL batches of rows


# ============================================================================
# 1. Transcoders
# ============================================================================
# A transcoder set is a list, one dict a layer l: W_enc [C, d], b_enc [d], W_dec [d, n_out, C] (index j writes at
# layer l + j: n_out = 1 for a per-layer transcoder, L - l for a cross-layer one), b_dec [C] (layer l's output's
# bias), "activation" (relu, jumprelu with "threshold" [d], topk with "k"), and W_skip [C, C] for a skip transcoder
# (out += x W_skipᵀ).

def activate(pre, layer):
    """f from the pre-activations, as circuit-tracer's activation functions take it:
    relu max(pre, 0);  jumprelu pre · [pre > θ] (strict, and no ReLU);  topk: each row's k largest pre as they are
    (no ReLU), 0 elsewhere.   pre [..., d] -> [..., d]"""
    if layer["activation"] == "jumprelu":
        return pre * (pre > layer["threshold"])
    if layer["activation"] == "topk":
        return np.where(topk_mask(pre, layer["k"]), pre, np.float32(0))
    return np.maximum(pre, 0.0)


def encode(x, layer):
    """The pre-activations h = x W_enc + b_enc, and f = activate(h).   x [T, C] -> h, f [T, d]"""
    pre = x @ layer["W_enc"] + layer["b_enc"]
    return pre, activate(pre, layer)


def from_sae(sae, l, hparams, name=None):
    """Layer l's transcoder from a SAELens folder's SAE (sae.py's dict): a transcoder, skip_transcoder,
    jumprelu_transcoder or jumprelu_skip_transcoder, or a topk SAE whose metadata names hook_name_out too (SAELens has
    no TopK transcoder), reading blocks.l.ln2.hook_normalized and writing blocks.l.hook_mlp_out, C wide both.
    name: the folder, for the messages."""
    cfg, C = sae["cfg"], hparams["n_embd"]
    architecture, meta = cfg.get("architecture", "standard"), cfg.get("metadata") or {}
    if not (architecture.endswith("transcoder") or architecture == "topk" and meta.get("hook_name_out")):
        raise UserError(f"is a {architecture} SAE, not a transcoder (SAELens's *transcoder architectures, or a topk "
                        "SAE whose metadata names hook_name_out)", path=name)
    reads, writes = meta.get("hook_name"), meta.get("hook_name_out")
    if (reads, writes) != (HOOK_IN.format(l), HOOK_OUT.format(l)):
        raise UserError(f"reads {reads} and writes {writes}, but layer {l}'s transcoder reads {HOOK_IN.format(l)} and "
                        f"writes {HOOK_OUT.format(l)} (the L-th folder is layer L's)", path=name)
    if cfg["d_in"] != C or cfg.get("d_out", cfg["d_in"]) != C:
        raise UserError(f"reads {cfg['d_in']} and writes {cfg.get('d_out', cfg['d_in'])} numbers a token, but the "
                        f"model is {C} wide: it was trained on another model", path=name)
    if cfg.get("normalize_activations", "none") != "none" or cfg.get("rescale_acts_by_decoder_norm"):
        raise UserError("normalizes its input or rescales by its decoder's norms: circuit-tracer's transcoders do "
                        "neither", path=name)
    layer = {"W_enc": sae["W_enc"], "b_enc": sae["b_enc"], "W_dec": sae["W_dec"][:, None, :], "b_dec": sae["b_dec"],
             "activation": "topk" if architecture == "topk" else "jumprelu" if architecture.startswith("jumprelu")
             else "relu"}
    layer.update({k: sae[k] for k in ("threshold", "W_skip") if k in sae})
    return {**layer, "k": cfg["k"]} if architecture == "topk" else layer


def per_layer_transcoders(saes, hparams, names=None):
    """One SAELens transcoder a layer, the l-th for layer l, as a transcoder set. names: their folders."""
    names = names or [None] * len(saes)
    if len(saes) != hparams["n_layer"]:
        raise UserError(f"the model has {hparams['n_layer']} layers: give one transcoder for each, in order "
                        f"(got {len(saes)})")
    layers = [from_sae(sae, l, hparams, name) for l, (sae, name) in enumerate(zip(saes, names))]
    if len({"W_skip" in layer for layer in layers}) > 1:
        raise UserError("some transcoders have a skip connection (W_skip) and some not: circuit-tracer's set is one "
                        "or the other")
    return layers


def cross_layer_transcoder(clt, hparams, name=None):
    """A cross-layer transcoder (plumbing/clt_files.read_clt's layers, circuit-tracer's layouts) as a transcoder
    set: W_enc [d, C] turned to [C, d]; W_dec [d, L - l, C] as it is. It reads each layer's MLP input, as the
    per-layer ones (circuit-tracer's feature_input_hook is then mlp.hook_in)."""
    if len(clt) != hparams["n_layer"] or clt[0]["W_enc"].shape[1] != hparams["n_embd"]:
        raise UserError(f"is a cross-layer transcoder of {len(clt)} layers {clt[0]['W_enc'].shape[1]} wide; the model "
                        f"has {hparams['n_layer']} layers {hparams['n_embd']} wide", path=name)
    return [{"W_enc": layer["W_enc"].T, "b_enc": layer["b_enc"], "W_dec": layer["W_dec"], "b_dec": layer["b_dec"],
             "activation": "jumprelu" if "threshold" in layer else "relu",
             **({"threshold": layer["threshold"]} if "threshold" in layer else {})} for layer in clt]


def skip(x, layer):
    """A skip transcoder's linear term x W_skipᵀ (0 without one).   x [..., C] -> [..., C]"""
    return x @ layer["W_skip"].T if "W_skip" in layer else 0.0


# ============================================================================
# 2. The traced run: one forward pass, and what the graph is made of
# ============================================================================

def prompt_ids(ids, eot, n_ctx):
    """The prompt as the graph reads it: <|endoftext|> (eot) put first unless it is there.   -> [T]"""
    if eot is None:
        raise UserError("this vocabulary has no <|endoftext|> to put before the prompt")
    ids = [int(i) for i in ids]
    ids = ids if ids and ids[0] == eot else [eot] + ids
    if len(ids) > n_ctx:
        raise UserError(f"the prompt is {len(ids)} tokens with <|endoftext|>; the model reads at most {n_ctx}")
    return np.array(ids, np.int64)


def logit_targets(logits, wte, max_logits=10, desired_prob=0.95):
    """The logits the graph explains: the last position's most probable tokens, at most max_logits, cut to the
    shortest prefix whose probability (over the whole vocabulary) reaches desired_prob; each as its demeaned
    unembedding, wte[t] - the mean row of wte.   logits [V] -> (ids [k], probabilities [k], vectors [k, C])"""
    probs = host(softmax(logits[None]))[0]
    top = np.argsort(-probs, kind="stable")[:max_logits]
    reached = np.cumsum(probs[top], dtype=np.float64).astype(np.float32)
    top = top[:int(np.searchsorted(reached, np.float32(desired_prob))) + 1]
    mean = wte.mean(0, dtype=np.float64).astype(np.float32)
    return top, probs[top], wte[np.asarray(top, like=wte)] - mean


def traced_run(ids, params, hparams, transcoders):
    """One forward pass of the model on ids [T] (<|endoftext|> first), and everything the graph is made of:
    {"ids", "kept", "top": what the backward reads (backward.training_forward's, for one sequence),
     "logits" [V] (the last position's), "active" [n, 3] (layer, position, feature), "values" [n] (their
     activations), "encoders" [n, C] (their encoder rows), "writes": per layer, what writes at its MLP output:
     (the features' indices, their positions, ascending, their vectors a·W_dec [m, C]), "errors" [L, T, C] (the MLP's
     output less the transcoders' reconstruction: b_dec and the skip term included), "tokens" [T, C] (wte[ids])}"""
    mlp_in, mlp_out = {}, {}

    def keep(name, x):
        i, stage = block_index(name), name.partition(".")[2]
        if stage in ("ln_2", "mlp.out"):
            (mlp_in if stage == "ln_2" else mlp_out)[i] = x[0]
        return x

    kept, top = training_forward(ids[None], params, hparams, hook=keep)
    L, like = len(transcoders), params["wte"]
    active, values, encoders, acts = [], [], [], []
    for l, layer in enumerate(transcoders):
        f = encode(mlp_in[l], layer)[1]
        f[0] = 0.0  # <|endoftext|>'s position: no features
        on_host = host(f)
        pos, feat = np.nonzero(on_host)
        active.append(np.stack([np.full(len(pos), l), pos, feat], 1))
        values.append(on_host[pos, feat])
        encoders.append(layer["W_enc"].T[np.asarray(feat, like=like)])
        acts.append((f, feat))
    first = np.cumsum([0] + [len(a) for a in active])  # where each layer's features start
    writes, errors = [], []
    for target in range(L):  # what every feature that writes here wrote, and the reconstruction
        cols, pos, vecs = [], [], []
        recon = transcoders[target]["b_dec"] + skip(mlp_in[target], transcoders[target])
        for l in range(target + 1):
            if transcoders[l]["W_dec"].shape[1] <= target - l:
                continue  # a per-layer transcoder writes at its own layer alone
            W = transcoders[l]["W_dec"][:, target - l]  # [d, C]
            f, feat = acts[l]
            used = np.unique(feat)
            recon = recon + f[:, np.asarray(used, like=like)] @ W[np.asarray(used, like=like)]
            cols.append(np.arange(first[l], first[l + 1]))
            pos.append(active[l][:, 1])
            vecs.append(np.asarray(values[l], like=like)[:, None] * W[np.asarray(feat, like=like)])
        order = np.argsort(np.concatenate(pos), kind="stable")
        writes.append((np.concatenate(cols)[order], np.concatenate(pos)[order],
                       np.concatenate(vecs)[np.asarray(order, like=like)]))
        error = mlp_out[target] - recon
        error[0] = 0.0
        errors.append(error)
    return {"ids": ids, "kept": kept, "top": top, "logits": top["ln_f"][0, -1] @ params["wte"].T,
            "active": np.concatenate(active), "values": np.concatenate(values).astype(np.float32),
            "encoders": np.concatenate(encoders), "writes": writes, "errors": np.stack(errors),
            "tokens": params["wte"][np.asarray(ids, like=like)]}


# ============================================================================
# 3. One row of the adjacency
# ============================================================================
# The frozen model is linear, so a target t's pre-activation is Σ over every source s of (the gradient of t's
# pre-activation at the place s writes) · (what s writes there): A[t, s] is one such dot product. One backward pass
# from t gives that gradient at every layer's MLP output and at the embeddings at once; the row is then each
# source's vector contracted with the gradient at its own place.

def adjacency_row(grad, positions, vectors):
    """A[t, s] for the sources s that write at one place, from t's gradient there: grad[pos(s)] · v_s.
    grad [T, C] (the gradient of t's pre-activation at a layer's MLP output, or at the embeddings), positions [n],
    vectors [n, C] (what each source writes: a·W_dec, an error vector, a token's embedding) -> [n]"""
    return (grad[positions] * vectors).sum(-1)


def adjacency_rows(grads, positions, vectors):
    """adjacency_row for each of a batch of targets: grads [B, T, C] -> [B, n]."""
    return np.stack([adjacency_row(grad, positions, vectors) for grad in grads])


def adjacency_rows_fast(grads, positions, vectors):
    """adjacency_rows as matrix products: positions [n] ascending -> [B, n]. The sources
    of one position are one matrix product, grads[:, p] @ vectors[those]ᵀ (adjacency_row would gather n rows of C
    for every target)."""
    out = np.empty((len(grads), len(positions)), np.float32, like=grads)
    bounds = np.searchsorted(positions, np.arange(grads.shape[1] + 1))
    for p, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        if b > a:
            out[:, a:b] = grads[:, p] @ vectors[a:b].T
    return out


# ============================================================================
# 4. The graph: one backward pass a batch of rows
# ============================================================================

def attribution_rows(run, params, hparams, transcoders, layers, positions, vectors):
    """A batch of the adjacency's rows: one backward pass of the frozen model (backward.py's, with STOPS) for B
    targets at once, each injected as the gradient at its layer's MLP input at its position (a feature's encoder row;
    a logit, at layer L, at ln_f's output), then contracted (adjacency_rows_fast) at every layer's MLP output with the
    features' and errors' vectors, and at the embeddings with the tokens'. A skip transcoder's x W_skipᵀ carries the
    gradient from its MLP output back to its input. layers, positions [B] (host), vectors [B, C]
    -> [B, n + L·T + T], the columns in the nodes' order (the logits' own columns are all 0)"""
    L, (T, C), n = hparams["n_layer"], run["tokens"].shape, len(run["active"])
    like, B = params["wte"], len(layers)
    rows = np.zeros((B, n + (L + 1) * T), np.float32, like=like)
    start = int(layers.max())
    inject = {l: (np.flatnonzero(layers == l), positions[layers == l]) for l in np.unique(layers)}
    d = np.zeros((B, T, C), np.float32, like=like)
    if start == L:  # logits: the gradient of ln_f's output
        d[np.asarray(inject[L][0], like=like), np.asarray(inject[L][1], like=like)] = vectors[np.asarray(
            inject[L][0], like=like)]
    at_output = {}

    def hook(name, g):
        l, stage = block_index(name), name.partition(".")[2]
        if stage == "mlp.out":
            cols, pos, vecs = run["writes"][l]
            rows[:, np.asarray(cols, like=like)] += adjacency_rows_fast(g, pos, vecs)
            err = n + l * T  # each position's error node writes its error vector there
            rows[:, err:err + T] = adjacency_rows_fast(g, np.arange(T), run["errors"][l])
            if "W_skip" in transcoders[l]:
                at_output[l] = g
        elif stage == "ln_2":
            if "W_skip" in transcoders[l]:
                g = g + at_output.pop(l) @ transcoders[l]["W_skip"]
            if l in inject:
                b, p = (np.asarray(a, like=like) for a in inject[l])
                g = g.copy()
                g[b, p] += vectors[b]
        elif name == "wte":
            rows[:, n + L * T:] = adjacency_rows_fast(g, np.arange(T), run["tokens"])  # each token's embedding
        return g

    model_backward(run["ids"][None], run["kept"], run["top"], params, hparams, d, frozen=True, hook=hook, stops=STOPS,
                   start=None if start == L else start)
    return rows


def partial_influences(edges, probabilities, row_nodes, max_iter=128):
    """attribute()'s ranking of the features while the rows are still being made: each node's influence on the
    logits through the rows made so far, Σ_k p Âᵏ with Â the rows' |A| normalised (sums clamped at 1e-8),
    row r being node row_nodes[r]'s.   edges [R, N], probabilities [k] -> [N]"""
    A = np.abs(edges)
    A /= np.maximum(A.sum(1, keepdims=True), np.float32(1e-8))
    influence, prod = np.zeros(A.shape[1], np.float32), np.zeros(A.shape[1], np.float32)
    prod[-len(probabilities):] = probabilities
    for _ in range(max_iter):
        prod = prod[row_nodes] @ A
        if not prod.any():
            return influence
        influence += prod
    raise RuntimeError("the influence did not converge")  # a graph with a cycle: a bug


def attribution_graph(params, hparams, ids, transcoders, max_logits=10, desired_prob=0.95, max_features=None,
                      batch_size=BATCH, progress=None):
    """The attribution graph of the prompt ids [T] (<|endoftext|> first: prompt_ids), as circuit-tracer's attribute()
    makes it: the logits' rows first, then the features', a batch of batch_size rows a backward pass. With
    max_features N (fewer than the active features), only N features get rows and columns: those most influential
    on the logits through the rows so far, ranked again every UPDATE_INTERVAL batches (partial_influences).
    progress(n, total): told each batch's rows, and how many rows there are. -> {"input_tokens" [T], "active_features" [n, 3], "activation_values" [n],
    "selected_features" [N] (indices into active_features), "logit_tokens" [k], "logit_probabilities" [k],
    "adjacency_matrix" [N + L·T + T + k, same]: rows the targets, columns the sources}"""
    L, T = hparams["n_layer"], len(ids)
    run = traced_run(ids, params, hparams, transcoders)
    logit_ids, probs, logit_vectors = logit_targets(run["logits"], params["wte"], max_logits, desired_prob)
    n, k = len(run["active"]), len(logit_ids)
    logit_offset = n + (L + 1) * T
    max_features = n if max_features is None else min(max_features, n)
    edges = np.zeros((max_features + k, logit_offset + k), np.float32)
    row_nodes = np.zeros(max_features + k, np.int64)
    for i in range(0, k, batch_size):
        b = min(batch_size, k - i)
        edges[i:i + b, :logit_offset] = host(attribution_rows(run, params, hparams, transcoders, np.full(b, L),
                                                               np.full(b, T - 1), logit_vectors[i:i + b]))
        row_nodes[i:i + b] = logit_offset + np.arange(i, i + b)
        if progress:
            progress(b, max_features + k)
    visited, done = np.zeros(n, bool), k
    while done - k < max_features:
        if max_features == n:
            pending = np.arange(n)
        else:
            influence = partial_influences(edges[:done], probs, row_nodes[:done])
            rank = np.argsort(-influence[:n], kind="stable")
            pending = rank[~visited[rank]][:min(UPDATE_INTERVAL * batch_size, max_features - (done - k))]
        for i in range(0, len(pending), batch_size):
            chosen = pending[i:i + batch_size]
            edges[done:done + len(chosen), :logit_offset] = host(attribution_rows(
                run, params, hparams, transcoders, run["active"][chosen, 0], run["active"][chosen, 1],
                run["encoders"][np.asarray(chosen, like=params["wte"])]))
            row_nodes[done:done + len(chosen)] = chosen
            visited[chosen] = True
            done += len(chosen)
            if progress:
                progress(len(chosen), max_features + k)
    selected = np.flatnonzero(visited)
    if max_features < n:
        edges = edges[:, np.concatenate([selected, np.arange(n, logit_offset + k)])]
    edges = edges[np.argsort(row_nodes, kind="stable")]
    adjacency = np.zeros((edges.shape[1], edges.shape[1]), np.float32)
    adjacency[:max_features], adjacency[-k:] = edges[:max_features], edges[max_features:]
    return {"input_tokens": np.asarray(ids), "active_features": run["active"], "activation_values": run["values"],
            "selected_features": selected, "logit_tokens": logit_ids, "logit_probabilities": probs,
            "adjacency_matrix": adjacency}


# ============================================================================
# 5. Pruning, and the two scores
# ============================================================================
# A node's influence is how much of the logits, weighted by their probabilities w, flows through it along every
# path: with Â the adjacency's |A| normalised by row (each target's inputs summing to 1), w (Â + Â² + Â³ + ...),
# the Neumann series of (I - Â)⁻¹ - I. The graph has no cycle, so Âᵏ is exactly 0 past its depth.

def normalized(adjacency):
    """|A| with each row summed to 1 (sums clamped at 1e-10: a row with no input stays 0).   [N, N]"""
    A = np.abs(adjacency)
    A /= np.maximum(A.sum(1, keepdims=True), np.float32(1e-10))
    return A


def influence(A, weights, max_iter=1000):
    """w Â + w Â² + ... until a term is 0: each node's share of what flows to the weighted targets.
    A [N, N] (normalized), weights [N] -> [N]"""
    term = weights @ A
    total = term.copy()
    for _ in range(max_iter):
        if not term.any():
            return total
        term = term @ A
        total += term
    raise RuntimeError("the influence did not converge")  # a graph with a cycle: a bug


def threshold_at(scores, fraction):
    """The score at which the scores, largest first, first reach `fraction` of their sum: keeping every score at
    least this keeps that fraction of the total.   scores [...] (≥ 0) -> a float32
    Only the nonzero scores are sorted (an edge's N² scores are mostly 0): past them the sum no longer grows, so
    where they never reach the fraction the threshold is 0, as it would be among the zeros."""
    scores = scores.ravel()
    ranked = np.sort(scores[scores > 0])[::-1]
    reached = (np.cumsum(ranked, dtype=np.float64) / ranked.sum(dtype=np.float64)).astype(np.float32)
    at = int(np.searchsorted(reached, np.float32(fraction)))
    if at < len(ranked):
        return ranked[at]
    return np.float32(0) if len(ranked) < len(scores) else ranked[-1]


def logit_weights(graph):
    """w: each logit node's probability, 0 for every other node.   -> [N]"""
    w = np.zeros(len(graph["adjacency_matrix"]), np.float32)
    w[-len(graph["logit_tokens"]):] = graph["logit_probabilities"]
    return w


def prune_graph(graph, node_threshold=0.8, edge_threshold=0.98):
    """circuit-tracer's prune_graph: keep the nodes with the largest influence, node_threshold of the total (tokens and
    logits always), and among them the edges with the largest influence (the normalised edge times its target's
    influence plus its weight), edge_threshold of theirs; then, until nothing changes, drop each feature or error node
    with no kept edge out, and each feature with no kept edge in. -> (node_mask [N], edge_mask [N, N],
    cumulative_scores [N]: each node's cumulative share of the influence, the most influential first)"""
    A, w = graph["adjacency_matrix"], logit_weights(graph)
    n_fixed = len(graph["input_tokens"]) + len(graph["logit_tokens"])  # tokens and logits, at the end
    n_features = len(graph["selected_features"])
    scores = influence(normalized(A), w)
    nodes = scores >= threshold_at(scores, node_threshold)
    nodes[-n_fixed:] = True
    pruned = np.where(nodes[:, None] & nodes[None, :], A, np.float32(0))
    kept_A = normalized(pruned)
    edge_scores = kept_A * (influence(kept_A, w) + w)[:, None]
    edges = edge_scores >= threshold_at(edge_scores, edge_threshold)
    while True:
        before = nodes.copy()
        edges &= nodes[:, None] & nodes[None, :]
        nodes[:-n_fixed] &= edges[:, :-n_fixed].any(0)  # an edge out
        nodes[:n_features] &= edges[:n_features].any(1)  # an edge in
        if (nodes == before).all():
            break
    order = np.argsort(-scores, kind="stable")
    cumulative = np.empty_like(scores)
    cumulative[order] = (np.cumsum(scores[order], dtype=np.float64) / scores.sum(dtype=np.float64))
    return nodes, edges, cumulative


def graph_scores(graph):
    """circuit-tracer's two scores of the unpruned graph: replacement, the tokens' influence over the tokens' and
    the errors' (how much reaches the logits through features alone); completeness, Σ (1 - each node's error share
    of its inputs) (influence + w) / Σ (influence + w).   -> (replacement, completeness)"""
    A, w = normalized(graph["adjacency_matrix"]), logit_weights(graph)
    n, T = len(graph["selected_features"]), len(graph["input_tokens"])
    errors = slice(n, len(A) - len(graph["logit_tokens"]) - T)
    scores = influence(A, w)
    tokens, error = scores[errors.stop:errors.stop + T].sum(), scores[errors].sum()
    reached = scores + w
    return float(tokens / (tokens + error)), float(((1 - A[:, errors].sum(-1)) * reached).sum() / reached.sum())


# ============================================================================
# 6. Interventions
# ============================================================================
# Set features to values and run the real model on: by default with the attention patterns frozen to the clean
# run's (the layer norms and MLPs run as they do), each intervened layer's MLP output moved by (value - the
# feature's activation now)·W_dec[f]. constrained_layers: those layers' MLP outputs are the clean run's, the changes
# added there alone (a skip transcoder's frozen output gets the change of its x W_skipᵀ); covering every layer, the
# layer norms' scales are frozen too, and what is left is the linear model the graph describes.

def feature_intervention(params, hparams, ids, transcoders, interventions, freeze_attention=True,
                         constrained_layers=None, apply_activation=True):
    """circuit-tracer's feature_intervention. interventions: [(layer, position, feature, value)].
    -> (logits [T, V] at every position, the transcoders' activations [L, T, d] in this run (apply_activation=False:
    their pre-activations); position 0's are 0)"""
    L = hparams["n_layer"]
    constrained = set(constrained_layers or ())
    scaled = set(range(L)) <= constrained  # every layer constrained: the norms' scales frozen too
    clean = clean_run(params, hparams, ids, transcoders, scaled) \
        if (freeze_attention or constrained) and interventions else None
    wanted = {}
    for layer, pos, feature, value in interventions:
        wanted.setdefault(layer, []).append((pos, feature, value))
    deltas = np.zeros((L, len(ids), hparams["n_embd"]), np.float32, like=params["wte"])  # what each layer gets
    acts, norm_inputs, skip_change, norm_of = [None] * L, {}, {}, layer_norm_inputs(L)

    def hook(name, x):
        l, stage = block_index(name), name.partition(".")[2]
        if clean and scaled and name in norm_of:  # a layer norm's input, for its output with the clean scale
            norm_inputs[norm_of[name]] = x
        elif clean and scaled and name in norm_inputs:
            x = frozen_layer_norm(norm_inputs.pop(name), name, params, clean["scale"][name])
        if clean and stage == "attn.weights":
            return clean["weights"][l]
        if stage == "ln_2":  # the transcoder's activations now
            pre, f = encode(x[0], transcoders[l])
            acts[l] = (f if apply_activation else pre).copy()
            acts[l][0] = 0.0
            if l in constrained and "W_skip" in transcoders[l]:
                skip_change[l] = skip(x, transcoders[l]) - skip(clean["mlp_in"][l], transcoders[l])
        if stage != "mlp.out":
            return x
        if l in constrained:
            x = clean["mlp_out"][l] + skip_change.pop(l, 0.0)
        if l in wanted:  # (value - the activation now) W_dec[f], at this layer (and, cross-layer, the ones after)
            now = clean["acts"][l] if constrained else acts[l] if apply_activation else activate(acts[l],
                                                                                                transcoders[l])
            for pos, feature, value in wanted[l]:
                change = np.float32(value) - now[pos, feature]
                if change != 0:
                    W = transcoders[l]["W_dec"][feature]  # [n_out, C]
                    deltas[l:l + len(W), pos] += change * W
        out = x + deltas[l] if not constrained or l in constrained else x
        deltas[l] = 0.0
        return out

    logits = gpt2(np.asarray(ids)[None], params, hparams, hook=hook)[0]
    return logits, np.stack(acts)


def layer_norm_inputs(L):
    """{the name of each layer norm's input: its output's}: resid_pre -> ln_1, resid_mid -> ln_2, the last
    resid_post -> ln_f."""
    norm_of = {f"h{l}.{before}": f"h{l}.{ln}" for l in range(L) for before, ln in (("resid_pre", "ln_1"),
                                                                                   ("resid_mid", "ln_2"))}
    return {**norm_of, f"h{L - 1}.resid_post": "ln_f"}


def clean_run(params, hparams, ids, transcoders, scales):
    """What an intervention freezes, from one run of the model as it is: {"weights": each layer's attention
    weights, "mlp_in", "mlp_out" [T, C] a layer, "acts": the transcoders' activations (position 0's zeroed), and
    with scales, "scale": each layer norm's √(var + ε), by the name of its output}."""
    out = {"weights": {}, "mlp_in": {}, "mlp_out": {}, "acts": {}, "scale": {}}
    eps, norm_of = layer_norm_eps(hparams), layer_norm_inputs(hparams["n_layer"])

    def hook(name, x):
        l, stage = block_index(name), name.partition(".")[2]
        if stage == "attn.weights":
            out["weights"][l] = x
        elif stage == "ln_2":
            out["mlp_in"][l] = x
            f = encode(x[0], transcoders[l])[1]
            f[0] = 0.0
            out["acts"][l] = f
        elif stage == "mlp.out":
            out["mlp_out"][l] = x
        if scales and name in norm_of:
            out["scale"][norm_of[name]] = np.sqrt(x.var(-1, keepdims=True) + eps)
        return x

    gpt2_hidden(np.asarray(ids)[None], params, hparams, hook=hook)  # the hooks are what it is run for: no logits
    return out


def frozen_layer_norm(x, name, params, scale):
    """A layer norm's output from its input now, x [B, T, C], with the clean run's scale [B, T, 1]:
    (x - mean x) / scale · g + b."""
    weights = params["ln_f"] if name == "ln_f" else params["blocks"][block_index(name)][name.partition(".")[2]]
    return (x - x.mean(-1, keepdims=True)) / scale * weights["g"] + weights["b"]


def feature_logits(transcoders, wte, layer, feature, k=5):
    """The tokens a feature's writes promote and suppress most through the unembedding: Σ_j W_dec[f, j] · wteᵀ (every
    write of a cross-layer feature ends in the residual stream). -> (ids [k], values [k], ids [k], values [k])"""
    effect = host(wte @ transcoders[layer]["W_dec"][feature].sum(0))  # [V]
    order = np.argsort(-effect, kind="stable")
    return order[:k], effect[order[:k]], order[::-1][:k], effect[order[::-1][:k]]
