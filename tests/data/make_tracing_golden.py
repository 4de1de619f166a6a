"""Write tests/data/tracing_golden.npz, tracing_golden.json and tests/data/tracing/: circuit-tracer 0.5.0's attribution
graphs (issue 53) on tests/data/hf/tiny (GPT-2's vocabulary, 2 blocks of 2 heads, 8 wide, random weights) with small
random transcoders of every kind tracing.py reads.

Dev-only, a venv of its own (circuit-tracer 0.5.0 needs transformers <= 4.57.3, so TransformerLens 3.x):

    python3 -m venv /work/venvs/graph-ct && /work/venvs/graph-ct/bin/pip install torch==2.13.0 circuit-tracer==0.5.0
    HF_HUB_OFFLINE=1 /work/venvs/graph-ct/bin/python tests/data/make_tracing_golden.py

The model is TransformerLens's HookedTransformer of tiny, unprocessed (no folding, no centring), as circuit-tracer's
TransformerLensReplacementModel (from_pretrained_and_transcoders) loads one, in float32. Every transcoder reads the
MLP's input (mlp.hook_in: after ln_2's gain and bias, the project's blocks.L.ln2.hook_normalized) and writes its
output (hook_mlp_out). The cases, each random (16 latents a layer, biases and thresholds not zero):

  relu      SingleLayerTranscoder with ReLU          tracing/relu/<l>: SAELens "transcoder" folders
  jumprelu  with JumpReLU (some thresholds < 0)      tracing/jumprelu/<l>: "jumprelu_transcoder"
  topk      with TopK, k 5 (no ReLU)                 tracing/topk/<l>: a SAELens "topk" folder with hook_name_out
  skip      ReLU with W_skip (skip_connection)       tracing/skip/<l>: "skip_transcoder"
  clt       CrossLayerTranscoder, JumpReLU           tracing/clt/: circuit-tracer's to_safetensors
The SAELens folders are written by the project's plumbing/sae_files.save_sae (SAELens's layout: W_enc [d_in, d_sae],
the transpose of circuit-tracer's; W_skip [d_out, d_in] in both).

Under "<case>/" in the npz: the attribute() graph of PROMPT (max_n_logits 10, desired_logit_prob 0.95, batch 512):
input_tokens, active_features, activation_values, selected_features, logit_tokens, logit_probabilities,
adjacency_matrix; prune_graph's node_mask, edge_mask, cumulative_scores (default thresholds, and at NODE_T, EDGE_T:
"…_t"); compute_graph_scores' replacement_score, completeness_score; "max/…" the graph with max_feature_nodes
MAX_FEATURES and batch_size 8 (re-ranked every 32 rows); "intervene/<setting>/logits" (the first 512 columns of the
logits at every position) and "…/acts" from feature_intervention with INTERVENTIONS: default (attention frozen),
nofreeze, constrained [1], constrained_all [0, 1], the last two with apply_activation_function=False.
tracing_golden.json: {case: the GRAPH.json create_graph_files wrote for the relu graph (slug "relu", scan "tiny")}.
The script asserts no score lies within 1e-4 (relative) of a threshold, so the masks are not ties.
"""
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from circuit_tracer import attribute  # noqa: E402
from circuit_tracer.graph import compute_graph_scores, compute_node_influence, prune_graph  # noqa: E402
from circuit_tracer.replacement_model.replacement_model_transformerlens import \
    TransformerLensReplacementModel  # noqa: E402
from circuit_tracer.transcoder import SingleLayerTranscoder, TranscoderSet  # noqa: E402
from circuit_tracer.transcoder.activation_functions import JumpReLU, TopK  # noqa: E402
from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder  # noqa: E402
from circuit_tracer.utils.create_graph_files import create_graph_files  # noqa: E402
from transformer_lens import HookedTransformerConfig  # noqa: E402
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights  # noqa: E402
from transformers import GPT2LMHeadModel, GPT2TokenizerFast  # noqa: E402

from plumbing.sae_files import save_sae  # noqa: E402

MODEL = os.path.join(HERE, "hf", "tiny")
OUT = os.path.join(HERE, "tracing")
PROMPT = "The cat sat on the mat, and the dog"
D_TC, K = 16, 5
MAX_FEATURES = 40
NODE_T, EDGE_T = 0.6, 0.9
INTERVENTIONS = [(0, 3, 2, 1.5), (1, 5, 7, -0.5), (0, 8, 11, 0.0)]
SETTINGS = {"default": {}, "nofreeze": {"freeze_attention": False},
            "constrained": {"constrained_layers": range(1, 2), "apply_activation_function": False},
            "constrained_all": {"constrained_layers": range(0, 2), "apply_activation_function": False}}


def tl_model(transcoders):
    hf = GPT2LMHeadModel.from_pretrained(MODEL)
    c = hf.config
    cfg = HookedTransformerConfig(d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head, d_head=c.n_embd // c.n_head,
                                  d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn="gelu_new",
                                  normalization_type="LN", eps=c.layer_norm_epsilon, default_prepend_bos=False,
                                  tokenizer_name=MODEL, model_name="tiny", dtype=torch.float32)
    model = TransformerLensReplacementModel(cfg, tokenizer=GPT2TokenizerFast.from_pretrained(MODEL))
    model.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=False)
    model._configure_replacement_model(transcoders)
    return model.eval()


def random_plt(layer, g, activation, skip=False):
    tc = SingleLayerTranscoder(8, D_TC, activation, layer, skip_connection=skip, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        tc.W_enc.copy_(torch.randn(D_TC, 8, generator=g) * 0.6)
        tc.b_enc.copy_(torch.randn(D_TC, generator=g) * 0.3 - 0.2)
        tc.W_dec.copy_(torch.randn(D_TC, 8, generator=g) * 0.4)
        tc.b_dec.copy_(torch.randn(8, generator=g) * 0.2)
        if skip:
            tc.W_skip.copy_(torch.randn(8, 8, generator=g) * 0.3)
    return tc


def activation_of(kind, g):
    if kind == "jumprelu":
        return JumpReLU(torch.randn(D_TC, generator=g) * 0.3 + 0.1)
    return TopK(K) if kind == "topk" else torch.nn.ReLU()


def plt_set(kind, seed):
    g = torch.Generator().manual_seed(seed)
    tcs = {l: random_plt(l, g, activation_of(kind, g), skip=kind == "skip") for l in range(2)}
    return TranscoderSet(tcs, feature_input_hook="mlp.hook_in", feature_output_hook="hook_mlp_out", scan="tiny")


def save_saelens(kind, transcoders):
    """Each layer's transcoder as a SAELens folder, OUT/<kind>/<l>."""
    architecture = {"relu": "transcoder", "jumprelu": "jumprelu_transcoder", "topk": "topk",
                    "skip": "skip_transcoder"}[kind]
    for l, tc in enumerate(transcoders):
        sae = {"W_enc": tc.W_enc.detach().numpy().T, "b_enc": tc.b_enc.detach().numpy(),
               "W_dec": tc.W_dec.detach().numpy(), "b_dec": tc.b_dec.detach().numpy(),
               "cfg": {"d_in": 8, "d_sae": D_TC, "d_out": 8, "architecture": architecture,
                       "apply_b_dec_to_input": False, "metadata": {
                           "hook_name": f"blocks.{l}.ln2.hook_normalized", "hook_name_out": f"blocks.{l}.hook_mlp_out",
                           "model_name": "tiny"}}}
        if kind == "jumprelu":
            sae["threshold"] = tc.activation_function.threshold.detach().numpy()
        if kind == "topk":
            sae["cfg"].update(k=K, rescale_acts_by_decoder_norm=False)
        if kind == "skip":
            sae["W_skip"] = tc.W_skip.detach().numpy()
        os.makedirs(os.path.join(OUT, kind), exist_ok=True)
        save_sae(os.path.join(OUT, kind, str(l)), sae)


def clt_set(seed):
    g = torch.Generator().manual_seed(seed)
    clt = CrossLayerTranscoder(2, D_TC, 8, activation_function="jump_relu", lazy_decoder=False,
                               feature_input_hook="mlp.hook_in", feature_output_hook="hook_mlp_out", scan="tiny",
                               dtype=torch.float32, device="cpu")
    with torch.no_grad():
        clt.W_enc.copy_(torch.randn(2, D_TC, 8, generator=g) * 0.6)
        clt.b_enc.copy_(torch.randn(2, D_TC, generator=g) * 0.3 - 0.2)
        clt.b_dec.copy_(torch.randn(2, 8, generator=g) * 0.2)
        for i, W in enumerate(clt.W_dec):
            W.copy_(torch.randn(D_TC, 2 - i, 8, generator=g) * 0.4)
        clt.activation_function.threshold.copy_(torch.randn(2, 1, D_TC, generator=g) * 0.3 + 0.1)
    if os.path.exists(os.path.join(OUT, "clt")):
        shutil.rmtree(os.path.join(OUT, "clt"))
    clt.to_safetensors(os.path.join(OUT, "clt"))
    return clt


def check_no_ties(scores, fraction, what):
    """No score within 1e-4 of the threshold but the threshold's own, and the cumulative fraction not within 1e-4 of
    `fraction` where it is crossed: our float32 sums cannot pick another node."""
    ranked = np.sort(scores.ravel())[::-1].astype(np.float64)
    ranked = ranked[ranked > 0]
    reached = np.cumsum(ranked) / ranked.sum()
    i = int(np.searchsorted(reached, fraction))
    assert i == len(ranked) or abs(reached[i] - fraction) > 1e-4 and (i == 0 or abs(reached[i - 1] - fraction) > 1e-4), \
        f"{what}: the cumulative share crosses {fraction} too close to it"
    if i < len(ranked) - 1:
        assert (ranked[i] - ranked[i + 1]) > 1e-4 * ranked[i], f"{what}: a tie at the threshold"


def graph_arrays(graph):
    return {"input_tokens": graph.input_tokens.numpy(), "active_features": graph.active_features.numpy(),
            "activation_values": graph.activation_values.numpy(), "selected_features": graph.selected_features.numpy(),
            "logit_tokens": graph.logit_token_ids.numpy(), "logit_probabilities": graph.logit_probabilities.numpy(),
            "adjacency_matrix": graph.adjacency_matrix.numpy()}


def case(name, transcoders, out, graph_json):
    model = tl_model(transcoders)
    tokens = model.ensure_tokenized(PROMPT)
    graph = attribute(tokens, model, max_n_logits=10, desired_logit_prob=0.95, batch_size=512)
    for key, value in graph_arrays(graph).items():
        out[f"{name}/{key}"] = value
    for suffix, thresholds in (("", (0.8, 0.98)), ("_t", (NODE_T, EDGE_T))):
        nodes, edges, cumulative = prune_graph(graph, *thresholds)
        out[f"{name}/node_mask{suffix}"], out[f"{name}/edge_mask{suffix}"] = nodes.numpy(), edges.numpy()
        out[f"{name}/cumulative_scores{suffix}"] = cumulative.numpy()
        weights = torch.zeros(len(graph.adjacency_matrix))
        weights[-len(graph.logit_targets):] = graph.logit_probabilities
        check_no_ties(compute_node_influence(graph.adjacency_matrix, weights).numpy(), thresholds[0], f"{name} nodes")
    out[f"{name}/replacement_score"], out[f"{name}/completeness_score"] = compute_graph_scores(graph)
    few = attribute(tokens, model, max_n_logits=10, desired_logit_prob=0.95, batch_size=8,
                    max_feature_nodes=MAX_FEATURES)
    for key, value in graph_arrays(few).items():
        out[f"{name}/max/{key}"] = value
    for setting, kwargs in SETTINGS.items():
        logits, acts = model.feature_intervention(tokens, INTERVENTIONS, **kwargs)
        out[f"{name}/intervene/{setting}/logits"] = logits[0, :, :512].numpy()
        out[f"{name}/intervene/{setting}/acts"] = acts.numpy()
    if graph_json is not None:
        with tempfile.TemporaryDirectory() as tmp:
            create_graph_files(graph, name, tmp, scan="tiny")
            with open(os.path.join(tmp, f"{name}.json")) as f:
                graph_json[name] = json.load(f)
    print(name, "features", len(graph.active_features), "logits", len(graph.logit_targets),
          "kept nodes", int(out[f"{name}/node_mask"].sum()), "scores", out[f"{name}/replacement_score"],
          out[f"{name}/completeness_score"])


def main():
    os.makedirs(OUT, exist_ok=True)
    out, graph_json = {"prompt_ids": None}, {}
    for seed, kind in enumerate(("relu", "jumprelu", "topk", "skip")):
        transcoders = plt_set(kind, seed)
        save_saelens(kind, transcoders)
        case(kind, transcoders, out, graph_json if kind == "relu" else None)
    case("clt", clt_set(9), out, None)
    out["prompt_ids"] = out["relu/input_tokens"]
    out["interventions"] = np.array(INTERVENTIONS, np.float32)
    np.savez_compressed(os.path.join(HERE, "tracing_golden.npz"), **out)
    with open(os.path.join(HERE, "tracing_golden.json"), "w") as f:
        json.dump(graph_json, f)


if __name__ == "__main__":
    torch.set_grad_enabled(True)
    main()
