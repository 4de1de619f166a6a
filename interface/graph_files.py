"""What `circuits.py graph` writes: GRAPH.json, circuit-tracer's create_graph_files file of the pruned graph (the one its
bundled frontend and Neuronpedia's graph viewer open), and GRAPH.npz, the whole graph as circuit-tracer's Graph holds
it, with the pruning.

GRAPH.json: {"metadata": {slug, scan, transcoder_list [], prompt_tokens, prompt, node_threshold, schema_version 1},
"qParams": {pinnedIds, supernodes, linkType "both", clickedId, sg_pos}, "nodes": [...], "links": [{source, target,
weight}]}: the kept nodes that a kept edge touches, and every token and logit. A node's fields, in create_graph_files'
order: node_id, feature, layer, ctx_idx, feature_type, token_prob, is_target_logit, run_idx, reverse_ctx_idx,
jsNodeId, clerp, influence (its cumulative score), activation; their values as it writes them:

    feature   "{layer}_{feature}_{pos}", feature: Cantor's pairing of (layer, feature), "cross layer transcoder"
    error     "0_{layer}_{pos}" (sic), feature -1, "mlp reconstruction error"
    token     "E_{id}_{pos}", feature: the position, layer "E", "embedding"
    logit     "{L + 1}_{id}_{T - 1}", feature: the id, "logit", token_prob, is_target_logit (the top one alone),
              clerp 'Output "{token}" (p=0.123)'
"""
import json

import numpy as np


NPZ_KEYS = ("input_tokens", "active_features", "activation_values", "selected_features", "logit_tokens",
            "logit_probabilities", "adjacency_matrix", "node_mask", "edge_mask", "cumulative_scores",
            "replacement_score", "completeness_score")


def cantor(x, y):
    """Cantor's pairing: one whole number for two, as the frontend keys a feature by (layer, feature)."""
    return (x + y) * (x + y + 1) // 2 + y


def node(node_id, feature, layer, pos, kind, js_id, influence=None, activation=None, token_prob=0.0, target=False,
         clerp=""):
    return {"node_id": node_id, "feature": int(feature), "layer": str(layer), "ctx_idx": int(pos), "feature_type": kind,
            "token_prob": token_prob, "is_target_logit": target, "run_idx": 0, "reverse_ctx_idx": 0,
            "jsNodeId": js_id, "clerp": clerp, "influence": influence, "activation": activation}


def graph_nodes(graph, node_mask, cumulative, token_texts, n_layer):
    """{node index: its JSON node} for every kept node, in the nodes' order. token_texts: each logit target's text."""
    n, T = len(graph["selected_features"]), len(graph["input_tokens"])
    errors_end, tokens_end = n + n_layer * T, n + (n_layer + 1) * T
    nodes = {}
    for i in map(int, np.flatnonzero(node_mask)):
        score = float(cumulative[i])
        if i < n:
            j = graph["selected_features"][i]
            layer, pos, feature = map(int, graph["active_features"][j])
            nodes[i] = node(f"{layer}_{feature}_{pos}", cantor(layer, feature), layer, pos, "cross layer transcoder",
                            f"{layer}_{feature}-0", score, float(graph["activation_values"][j]))
        elif i < errors_end:
            layer, pos = divmod(i - n, T)
            nodes[i] = node(f"0_{layer}_{pos}", -1, layer, pos, "mlp reconstruction error", f"{layer}_{pos}-0", score)
        elif i < tokens_end:
            pos, token = i - errors_end, int(graph["input_tokens"][i - errors_end])
            nodes[i] = node(f"E_{token}_{pos}", pos, "E", pos, "embedding", f"E_{token}-{pos}", score)
        else:
            k = i - tokens_end
            token, p = int(graph["logit_tokens"][k]), float(graph["logit_probabilities"][k])
            nodes[i] = node(f"{n_layer + 1}_{token}_{T - 1}", token, n_layer + 1, T - 1, "logit", f"L_{token}-{T - 1}",
                            token_prob=p, target=k == 0, clerp=f'Output "{token_texts[k]}" (p={p:.3f})')
    return nodes


def graph_json(graph, pruning, prompt, prompt_tokens, logit_texts, n_layer, slug, scan, node_threshold):
    """create_graph_files' JSON object of the pruned graph. pruning: prune_graph's (node_mask, edge_mask,
    cumulative_scores); prompt: the input tokens' text, <|endoftext|> first; prompt_tokens: each input token's text;
    logit_texts: each logit target's."""
    node_mask, edge_mask, cumulative = pruning
    nodes = graph_nodes(graph, node_mask, cumulative, logit_texts, n_layer)
    targets, sources = np.nonzero(edge_mask)
    weights = graph["adjacency_matrix"][targets, sources].tolist()
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w}
             for s, t, w in zip(sources.tolist(), targets.tolist(), weights) if s in nodes and t in nodes]
    linked = {link["source"] for link in links} | {link["target"] for link in links}
    used = [v for v in nodes.values() if v["node_id"] in linked or v["feature_type"] in ("embedding", "logit")]
    metadata = {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": prompt_tokens,
                "prompt": prompt, "node_threshold": node_threshold, "schema_version": 1}
    return {"metadata": metadata, "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "",
                                              "sg_pos": ""}, "nodes": used, "links": links}


def write_json_to(path, content):
    """The JSON file, UTF-8, indented as create_graph_files writes it (the caller writes it whole: whole_file)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2, ensure_ascii=False)


def npz_arrays(graph, pruning, scores):
    """GRAPH.npz's arrays: the graph, prune_graph's three, and the two scores."""
    return {**graph, "node_mask": pruning[0], "edge_mask": pruning[1], "cumulative_scores": pruning[2],
            "replacement_score": np.float32(scores[0]), "completeness_score": np.float32(scores[1])}


def write_npz_to(path, arrays):
    """GRAPH.npz's arrays, np.savez's file (the caller writes it whole: whole_file)."""
    with open(path, "wb") as f:
        np.savez(f, **{k: arrays[k] for k in NPZ_KEYS})
