"""The command line of tracing.py, as two of circuits.py's commands:

    python circuits.py graph PROMPT --model DIR --transcoders TC0 TC1 ... | --clt DIR
        [--max-logits 10] [--desired-prob 0.95] [--max-features N] [--batch-size 512]
        [--node-threshold 0.8] [--edge-threshold 0.98] --out GRAPH.json [--npz GRAPH.npz] [--html PAGE.html]
    python circuits.py intervene PROMPT --model DIR --transcoders ... --set LAYER,POS,FEATURE=VALUE [--set ...]
        [--no-freeze-attention] [--constrained-layers L ...] --logits OUT.npy

The prompt is read after <|endoftext|> (position 0), as circuit-tracer reads it. graph prints what it kept and the
two scores, and writes GRAPH.json (create_graph_files'), GRAPH.npz (the whole graph) and PAGE.html
(interface/graph_page.py); the rows' progress goes to stderr. intervene prints the last position's most likely
tokens before and after, and writes the logits at every position [T, V]. Both take --threads and --device.
Exit status: 0 done, 2 a user's mistake (one line, before any work where it can be, and nothing written), 130
interrupted (nothing written: every file is made whole first, then all are put in place).
"""
import argparse
import contextlib
import math
import os
import re
import sys

import numpy as np

import tracing
from gpt2_numpy import gpt2
from interface import loading
from interface.options import (array_module, at_least, check_output_file, device_flag, model_flags, number, on_device,
                               threads_flag)
from plumbing import clt_files, device
from plumbing.errors import UserError, fail
from plumbing.folders import whole_file
from plumbing.progress import progress

SET = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*=\s*(\S+)\s*$")  # LAYER,POS,FEATURE=VALUE
TOP = 5  # the rows of intervene's table, and the logits a page shows for each feature


def transcoder_flags(p):
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--transcoders", nargs="+", metavar="TC", help="one SAELens transcoder folder a layer, layer 0's "
                       "first (transcoder, skip_transcoder, jumprelu_*, or topk with hook_name_out; or hf:owner/name/PATH)")
    which.add_argument("--clt", metavar="DIR", help="a cross-layer transcoder, as circuit-tracer saves one "
                                                   "(W_enc_L.safetensors, W_dec_L.safetensors)")


def graph_flags(p):
    p.add_argument("prompt", metavar="PROMPT", help="the text to trace (<|endoftext|> is put first)")
    transcoder_flags(p)
    p.add_argument("--max-logits", type=at_least(1), default=10, metavar="N",
                   help="the most probable next tokens to explain, at most N (default 10)")
    p.add_argument("--desired-prob", type=number, default=0.95, metavar="P",
                   help="... cut where their probability reaches P (default 0.95)")
    p.add_argument("--max-features", type=at_least(1), metavar="N", help="rows and columns for the N most influential "
                   "features alone, chosen as circuit-tracer chooses them (default: every active feature)")
    p.add_argument("--batch-size", type=at_least(1), default=tracing.BATCH, metavar="N",
                   help=f"rows a backward pass (default {tracing.BATCH})")
    p.add_argument("--node-threshold", type=number, default=0.8, metavar="F",
                   help="keep the nodes that carry this share of the influence (default 0.8)")
    p.add_argument("--edge-threshold", type=number, default=0.98, metavar="F",
                   help="keep the edges that carry this share of the influence (default 0.98)")
    p.add_argument("--out", required=True, metavar="GRAPH.json", help="the pruned graph, as create_graph_files writes "
                   "it (circuit-tracer's frontend and Neuronpedia open it)")
    p.add_argument("--npz", metavar="GRAPH.npz", help="also the whole graph: the adjacency, the features, the pruning")
    p.add_argument("--html", metavar="PAGE.html", help="also the pruned graph as one self-contained page")
    p.add_argument("--slug", help="the graph's name in GRAPH.json (default: GRAPH's file name)")
    p.add_argument("--scan", help="the transcoders' name in GRAPH.json (default: their folder's name)")


def intervene_flags(p):
    p.add_argument("prompt", metavar="PROMPT", help="the text to run (<|endoftext|> is put first)")
    transcoder_flags(p)
    p.add_argument("--set", dest="settings", action="append", required=True, type=setting,
                   metavar="LAYER,POS,FEATURE=VALUE", help="set that feature at that position to VALUE (repeat it)")
    p.add_argument("--no-freeze-attention", action="store_true",
                   help="let the attention patterns change too (default: frozen to the clean run's)")
    p.add_argument("--constrained-layers", nargs="+", type=at_least(0), metavar="L",
                   help="freeze these layers' MLP outputs to the clean run's and add the changes there alone (all of "
                        "them: the layer norms' scales frozen too)")
    p.add_argument("--logits", required=True, metavar="OUT.npy", help="the logits at every position [T, V]")


COMMANDS = {"graph": ("an attribution graph of a prompt through transcoders (circuit-tracer's)", graph_flags),
            "intervene": ("set transcoder features and run the model on (circuit-tracer's feature_intervention)",
                          intervene_flags)}


def setting(text):
    """--set LAYER,POS,FEATURE=VALUE -> (layer, position, feature, value); checked against the model later."""
    m = SET.match(text)
    try:
        value = float(m[4]) if m else math.nan
    except ValueError:
        value = math.nan
    if not m or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be LAYER,POS,FEATURE=VALUE with a finite VALUE (e.g. 3,5,1234=0), "
                                         f"got {text!r}")
    return int(m[1]), int(m[2]), int(m[3]), value


def add_commands(commands):
    """graph and intervene as circuits.py's subcommands."""
    for name, (text, add_flags) in COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text, allow_abbrev=False)
        add_flags(sub)
        model_flags(sub)
        sub.add_argument("--quiet", action="store_true", help="no progress on stderr")
        threads_flag(sub)
        device_flag(sub)
        sub.error = fail


def checked(args):
    """The flags' values that argparse cannot check, before any work: one line and exit 2."""
    for flag in ("desired_prob", "node_threshold", "edge_threshold"):
        value = getattr(args, flag, 1.0)
        if not (math.isfinite(value) and 0 < value <= 1):
            fail(f"--{flag.replace('_', '-')} must be a number in (0, 1], got {value}")
    if args.prompt == "":
        fail("the prompt is empty: give a text")
    for flag, ending in (("out", None), ("npz", None), ("html", None), ("logits", ".npy")):
        if getattr(args, flag, None):
            check_output_file(getattr(args, flag), ending, f"--{flag}")
    return args


def load_transcoders(args, hparams, xp):
    """--transcoders or --clt as a transcoder set on xp's device, and its name (GRAPH.json's scan)."""
    if args.clt:
        layers = tracing.cross_layer_transcoder(clt_files.read_clt(args.clt), hparams, args.clt)
        name = os.path.basename(os.path.normpath(args.clt))
    else:
        saes = [loading.load_sae(folder, args.models_dir, args.quiet) for folder in args.transcoders]
        layers = tracing.per_layer_transcoders(saes, hparams, args.transcoders)
        name = os.path.basename(os.path.dirname(os.path.normpath(args.transcoders[0]))) or "transcoders"
    return device.to_device(layers, xp), name


def prepared(args):
    """The model on its device, the transcoders, and the prompt's ids (<|endoftext|> first)."""
    xp = array_module(args)
    encoder, hparams, params = loading.load_model(args.model, args.models_dir, args.base_url, quiet=args.quiet)
    params = on_device(xp, params, args.model)
    transcoders, name = load_transcoders(args, hparams, xp)
    eot = encoder.eot
    ids = tracing.prompt_ids(encoder.encode(args.prompt, allowed_special="all"), eot, hparams["n_ctx"])
    return encoder, hparams, params, transcoders, name, ids


def run(args):
    return (run_graph if args.command == "graph" else run_intervene)(args)


def run_graph(args):
    encoder, hparams, params, transcoders, name, ids = prepared(args)
    bar = {}

    def rows_done(n, total):  # the bar is made once the number of rows is known
        if "rows" not in bar:
            bar["rows"] = progress(total, "rows", quiet=args.quiet)
        bar["rows"].update(n)

    try:
        graph = tracing.attribution_graph(params, hparams, ids, transcoders, args.max_logits, args.desired_prob,
                                          args.max_features, args.batch_size, rows_done)
    finally:
        if "rows" in bar:
            bar["rows"].close()
    pruning = tracing.prune_graph(graph, args.node_threshold, args.edge_threshold)
    scores = tracing.graph_scores(graph)
    texts = [encoder.decode([int(i)]) for i in graph["input_tokens"]]
    logit_texts = [encoder.decode([int(i)]) for i in graph["logit_tokens"]]
    slug = args.slug or os.path.splitext(os.path.basename(args.out))[0]
    from interface import graph_files

    content = graph_files.graph_json(graph, pruning, encoder.decode([int(i) for i in ids]), texts, logit_texts,
                                     hparams["n_layer"], slug, args.scan or name, args.node_threshold)
    with contextlib.ExitStack() as files:  # every file made whole, then all put in place
        files.enter_context(json_written(args.out, content))
        if args.npz:
            files.enter_context(npz_written(args.npz, graph_files.npz_arrays(graph, pruning, scores)))
        if args.html:
            files.enter_context(page_written(args.html, content, graph, transcoders, params, encoder, hparams, args))
    n_kept = int(pruning[0][:len(graph["selected_features"])].sum())
    print(f"{len(graph['active_features']):,} active features ({len(graph['selected_features']):,} in the graph), "
          f"{len(graph['logit_tokens'])} logits ({float(graph['logit_probabilities'].sum()):.3f} of the probability), "
          f"{len(graph['adjacency_matrix']):,} nodes ({graph['adjacency_matrix'].nbytes / 1e6:,.1f} MB dense)")
    print(f"kept {n_kept} features and {len(content['links']):,} edges; replacement score {scores[0]:.4f}, "
          f"completeness {scores[1]:.4f}")
    print(f"wrote {', '.join(p for p in (args.out, args.npz, args.html) if p)}")


@contextlib.contextmanager
def json_written(path, content):
    from interface import graph_files

    with whole_file(path, "the graph") as tmp:
        graph_files.write_json_to(tmp, content)
        yield


@contextlib.contextmanager
def npz_written(path, arrays):
    from interface import graph_files

    with whole_file(path, "the graph's arrays") as tmp:
        graph_files.write_npz_to(tmp, arrays)
        yield


@contextlib.contextmanager
def page_written(path, content, graph, transcoders, params, encoder, hparams, args):
    from interface import graph_page

    top = {}
    for v in content["nodes"]:
        if v["feature_type"] == "cross layer transcoder":
            layer, feature, _ = map(int, v["node_id"].split("_"))
            up, up_v, down, down_v = tracing.feature_logits(transcoders, params["wte"], layer, feature, TOP)
            top[v["node_id"]] = ([(encoder.decode([int(i)]), float(x)) for i, x in zip(up, up_v)],
                                 [(encoder.decode([int(i)]), float(x)) for i, x in zip(down, down_v)])
    title = f"Attribution graph of {args.prompt!r} on {os.path.basename(os.path.normpath(args.model))}"
    with whole_file(path, "the page") as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(graph_page.render_page(graph_page.page_data(content, top, title, hparams["n_layer"])))
        yield


def run_intervene(args):
    encoder, hparams, params, transcoders, _, ids = prepared(args)
    L = hparams["n_layer"]
    for layer, pos, feature, _ in args.settings:
        width = transcoders[layer]["W_enc"].shape[1] if layer < L else 0
        if layer >= L or pos >= len(ids) or feature >= width:
            raise UserError(f"--set {layer},{pos},{feature} names no feature: layers 0..{L - 1}, positions "
                            f"0..{len(ids) - 1} (<|endoftext|> is 0), features 0..{width - 1}" if layer < L else
                            f"--set {layer},{pos},{feature} names no feature: the model has layers 0..{L - 1}")
    for layer in args.constrained_layers or ():
        if layer >= L:
            raise UserError(f"--constrained-layers {layer}: the model has layers 0..{L - 1}")
    before = device.host(gpt2(np.asarray(ids)[None], params, hparams, last_only=True)[0, -1])  # the model as it is
    logits = device.host(tracing.feature_intervention(params, hparams, ids, transcoders, args.settings,
                                                      not args.no_freeze_attention, args.constrained_layers)[0])
    with whole_file(args.logits, "the logits") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, logits)
    print(f"the next token after {encoder.decode([int(i) for i in ids])!r}, before and after:")
    for rank, (a, b) in enumerate(zip(np.argsort(-before)[:TOP], np.argsort(-logits[-1])[:TOP])):
        print(f"  {rank + 1}. {encoder.decode([int(a)])!r:>16} {before[a]:9.4f}    "
              f"{encoder.decode([int(b)])!r:>16} {logits[-1, b]:9.4f}")
    print(f"wrote {args.logits}", file=sys.stderr)
