"""The command line of circuits.py: each experiment's flags, its table, its JSON and its page.

    python circuits.py logit-diff  --clean T [--corrupted U] --answer A --wrong B
    python circuits.py patch       --clean T --corrupted U --answer A --wrong B --site SITE [--all-positions]
                                   [--normalized]
    python circuits.py dla         --clean T [--corrupted U] --answer A --wrong B [--by component|head|latent]
    python circuits.py attribution --clean T --corrupted U --answer A --wrong B --site SITE
    python circuits.py path        --clean T --corrupted U --answer A --wrong B --source L.H --component q|k|v
    python circuits.py heads       --text T|random:N --pattern previous|duplicate|induction [--seed S]
    python circuits.py graph|intervene PROMPT --transcoders TC0 TC1 ... (tracing.py's: interface/graph_cli.py)

Every command takes --model, --models-dir and --base-url, --json (one object on stdout), --html FILE
(the result as a heatmap, interface/circuits_page.py), and --sae SAE_DIR with --use-error-term and
--center-writing-weights (the experiment on the model with an SAE spliced in: docs/circuits.md). Each
text is read after <|endoftext|>; the answers are one token each. Exit status: 0 done, 2 a user's mistake
(one line on stderr, written before any work where it can be), 130 interrupted; nothing is written unless
the command ends well.
"""
import argparse
import json
import os
import sys

import numpy as np

import circuits
from interface import graph_cli, loading
from interface.options import array_module, at_least, check_output_file, device_flag, folded, model_flags, on_device, \
    sae_flags, sae_splice, spliced_line, threads_flag, user_message
from plumbing import device
from plumbing.errors import UserError, exit_status, fail, plural

RANDOM = "random:"  # --text random:N: N random ids said twice
TOP_LATENTS = 20  # dla --by latent: the rows of its table


def pair_flags(p, corrupted=True):
    """--clean, --corrupted (required, or with corrupted=False optional: its run's numbers beside the clean
    one's, so one set of flags serves every command), --answer, --wrong."""
    p.add_argument("--clean", required=True, metavar="TEXT", help="the prompt that gives the right answer")
    p.add_argument("--corrupted", required=corrupted, metavar="TEXT",
                   help="the prompt that does not: as many tokens as --clean, differing where the experiment asks" +
                        ("" if corrupted else " (optional here: its numbers beside the clean run's)"))
    p.add_argument("--answer", required=True, metavar="TOKEN", help="the right answer, one token (e.g. ' Mary')")
    p.add_argument("--wrong", required=True, metavar="TOKEN", help="the wrong answer, one token (e.g. ' John')")


def patch_flags(p):
    pair_flags(p)
    p.add_argument("--site", default="resid_pre", choices=list(circuits.SITES),
                   help="what one patched run replaces: a layer's resid_pre, resid_mid, attn_out or mlp_out at one "
                        "position; one head's z at one position (head); one head's q, k, v or pattern at every "
                        "position (default resid_pre)")
    p.add_argument("--all-positions", action="store_true", help="with --site head: a head's z at every position")
    p.add_argument("--normalized", action="store_true", help="(value - corrupted) / (clean - corrupted): 1 is the "
                                                             "whole clean answer back")


def dla_flags(p):
    pair_flags(p, corrupted=False)
    p.add_argument("--by", default="component", choices=("component", "head", "latent"),
                   help="the embeddings and each layer's attention and MLP (default), each head, or with --sae each "
                        f"of the SAE's latents (the {TOP_LATENTS} largest shown)")


def attribution_flags(p):
    pair_flags(p)
    p.add_argument("--site", default="resid_pre", choices=circuits.ATTRIBUTED,
                   help="resid_pre, attn_out or mlp_out at each position of each layer, or head: each head's z "
                        "(default resid_pre)")


def path_flags(p):
    pair_flags(p)
    p.add_argument("--source", required=True, type=source_head, metavar="L.H", help="the head whose change is patched "
                                                                                   "in, e.g. 9.9")
    p.add_argument("--component", default="q", choices=circuits.COMPONENTS,
                   help="which input of each later head receives it (default q)")


def heads_flags(p):
    p.add_argument("--text", required=True, help=f"the text to read, or {RANDOM}N: N random ids said twice "
                                                 "after <|endoftext|> (for induction heads)")
    p.add_argument("--pattern", required=True, choices=circuits.PATTERNS, help="the kind of head to look for")
    p.add_argument("--seed", type=at_least(0), default=0, help=f"the seed of {RANDOM}N's ids (default 0)")


COMMANDS = {  # name: (what it does, its flags)
    "logit-diff": ("the metric: logits[-1, answer] - logits[-1, wrong]", lambda p: pair_flags(p, corrupted=False)),
    "patch": ("activation patching: the corrupted run with one activation the clean run's", patch_flags),
    "dla": ("direct logit attribution: each part's share of the logit difference", dla_flags),
    "attribution": ("attribution patching: each patch's first-order estimate, from one backward pass",
                    attribution_flags),
    "path": ("direct path patching: one head's change into one later head's q, k or v alone", path_flags),
    "heads": ("head detectors: each head's share of attention on a pattern", heads_flags),
}


def source_head(text):
    """--source L.H as (layer, head); checked against the model once it is loaded."""
    layer, dot, head = text.partition(".")
    if not (dot and layer.isdigit() and head.isdigit()):
        raise argparse.ArgumentTypeError(f"must be a head, LAYER.HEAD (e.g. 9.9), got {text!r}")
    return int(layer), int(head)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="circuits.py", allow_abbrev=False,
                                description="Find the circuit behind a behaviour: TransformerLens's experiments on "
                                            "GPT-2, in NumPy (docs/circuits.md).")
    commands = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (text, add_flags) in COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text, allow_abbrev=False)
        add_flags(sub)
        model_flags(sub)
        sae_flags(sub)
        sub.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
        sub.add_argument("--html", metavar="FILE", help="also write the result as a heatmap, one self-contained page")
        sub.add_argument("--quiet", action="store_true", help="no progress bars while a model downloads")
        threads_flag(sub)
        device_flag(sub)
        sub.error = fail
    graph_cli.add_commands(commands)
    p.error = fail
    args = p.parse_args(argv)
    if args.command in graph_cli.COMMANDS:
        return graph_cli.checked(args)
    for flag in ("clean", "corrupted", "text"):
        if getattr(args, flag, None) == "":
            fail(f"--{flag} is empty: give a text")
    if getattr(args, "answer", "") and args.answer == args.wrong:
        fail(f"--answer and --wrong are the same token, {args.answer!r}: its logit difference with itself is always 0; "
             "give two different answers")
    if getattr(args, "all_positions", False) and args.site != "head":
        fail(f"--all-positions goes with --site head (--site {args.site} patches one cell at a time as it is)")
    if args.use_error_term and not args.sae:
        fail("--use-error-term goes with --sae")
    if getattr(args, "by", None) == "latent" and not args.sae:
        fail("--by latent goes with --sae: the latents are an SAE's")
    if args.html:
        check_output_file(args.html)
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return exit_status(lambda: (graph_cli.run if args.command in graph_cli.COMMANDS else run)(args), user_message)


def run(args):
    load = loading.load_body if args.command in ACTIVATIONS_ONLY else loading.load_model  # loading.py says why
    xp = array_module(args)  # numpy, or cupy once a GPU has answered: before the model is fetched
    encoder, hparams, params = load(args.model, args.models_dir, args.base_url, quiet=args.quiet)
    params, (hooks, sae) = on_device(xp, folded(args, params), args.model), sae_splice(args, hparams)  # ({}, None)
    args.splice = (hooks, sae) if hooks or sae else None
    outcome = EXPERIMENTS[args.command](args, encoder, params, hparams)
    if args.splice:
        outcome["header"].insert(0, spliced_line(args, sae))
        outcome["json"].update(sae=sae[0] if sae else None, use_error_term=args.use_error_term,
                               center_writing_weights=args.center_writing_weights)
    if args.html:
        from interface import circuits_page  # only --html needs it

        title = f"{args.command} on {os.path.basename(os.path.normpath(args.model))}"  # a size, or the folder's name
        title += f", {outcome['header'][0]}" if args.splice else ""  # "with the SAE ... at ..."
        size = circuits_page.write_page(args.html, title, outcome["what"], outcome["tokens"], *outcome["panel"])
        print(f"{args.html}: {size:,} bytes", file=sys.stderr)
    print(json.dumps(outcome["json"]) if args.json else "\n".join(table(outcome)))


# ----------------------------------------------------------------------------
# Texts and tokens
# ----------------------------------------------------------------------------

def prompt_ids(encoder, text, flag, hparams):
    """A text's ids after <|endoftext|>, as TransformerLens's to_tokens gives them."""
    if encoder.eot is None:
        raise UserError("this vocabulary has no <|endoftext|> to read a text after")
    ids = [encoder.eot] + encoder.encode(text)
    if len(ids) > hparams["n_ctx"]:
        raise UserError(f"{flag} is {len(ids)} tokens with <|endoftext|>; the model reads at most {hparams['n_ctx']}")
    return ids


def one_token(encoder, text, flag):
    """An answer's id: the text must be one token."""
    ids = encoder.encode(text)
    if len(ids) != 1:
        how = "no token" if not ids else f"{len(ids)} tokens ({', '.join(repr(encoder.decode([i])) for i in ids)})"
        raise UserError(f"{flag} {text!r} is {how}: an answer must be one token")
    return ids[0]


def pair(args, encoder, hparams):
    """(clean [1, T], corrupted [1, T] or None, answer, wrong) from the flags."""
    clean = prompt_ids(encoder, args.clean, "--clean", hparams)
    corrupted = getattr(args, "corrupted", None)
    if corrupted is not None:
        corrupted = prompt_ids(encoder, corrupted, "--corrupted", hparams)
        if len(corrupted) != len(clean):
            raise UserError(f"--clean is {len(clean)} tokens and --corrupted {len(corrupted)}: a pair must be one "
                            "length, so that its positions line up")
        corrupted = np.array([corrupted])
    return np.array([clean]), corrupted, one_token(encoder, args.answer, "--answer"), \
        one_token(encoder, args.wrong, "--wrong")


def token_texts(encoder, ids):
    return [encoder.decode([int(i)]) for i in ids]


def column_label(text, width=10):
    """A token for a table's column: control characters escaped, cut short."""
    text = repr(text)[1:-1]
    return text if len(text) <= width else text[:width - 1] + "…"


def number_cell(value, width=10):
    """A table's value to 3 decimals, and never -0.000 (what rounds to 0 is 0); a cell not measured (None) blank."""
    return " " * width if value is None else f"{round(value, 3) + 0.0:>{width}.3f}"


def grid(values, rows, columns, width=10):
    """A table: one row a label (its column as wide as the longest), one column a label, values to 3 decimals."""
    label = max(8, *(len(r) + 2 for r in rows))
    lines = [" " * label + "".join(f"{column_label(c, width - 1):>{width}}" for c in columns)]
    lines += [f"{r:<{label}}" + "".join(number_cell(v, width) for v in row) for r, row in zip(rows, values)]
    return lines


def layer_labels(hparams):
    return [f"layer {i}" for i in range(hparams["n_layer"])]


def head_labels(hparams):
    return [f"H{h}" for h in range(hparams["n_head"])]


# ----------------------------------------------------------------------------
# The experiments: each -> result(...)
# ----------------------------------------------------------------------------

def result(tokens, values, what, panel, header=(), footer=(), **json_keys):
    """What an experiment shows: the JSON object ("tokens", its metrics, "values", ...), and for the table and
    the page one line saying what the values are, the heatmap's panel (rows, columns, values, the value
    shown white), lines before it (the metrics) and after it."""
    return {"json": {"tokens": tokens, **json_keys, "values": values}, "what": what, "panel": panel,
            "header": list(header), "footer": list(footer), "tokens": tokens}


def table(outcome):
    """The lines the command prints without --json."""
    rows, columns, values, _ = outcome["panel"]
    return outcome["header"] + [outcome["what"] + ":"] + grid(values, rows, columns) + outcome["footer"]


def metrics_line(clean_metric, corrupted_metric):
    return f"the metric (the logit difference): clean {clean_metric:.4f}, corrupted {corrupted_metric:.4f}"


def run_logit_diff(args, encoder, params, hparams):
    clean, corrupted, answer, wrong = pair(args, encoder, hparams)
    value = circuits.metric(params, hparams, clean, answer, wrong, args.splice)
    tokens = token_texts(encoder, clean[0])
    what = f"logit difference {args.answer!r} - {args.wrong!r} at the last position"
    if corrupted is None:
        return result(tokens, value, what, (["clean"], ["metric"], [[value]], 0.0), clean=value)
    other = circuits.metric(params, hparams, corrupted, answer, wrong, args.splice)
    return result(tokens, value, what, (["clean", "corrupted"], ["metric"], [[value], [other]], 0.0), clean=value,
                  corrupted=other)


def sweep_table(values, tokens, hparams, by_position):
    """A patching or attribution result as a table: (rows, columns, values [rows, columns])."""
    if values.ndim == 3:  # [L, T, H]: a row a head
        rows = [f"L{i}H{h}" for i in range(hparams["n_layer"]) for h in range(hparams["n_head"])]
        return rows, tokens, values.transpose(0, 2, 1).reshape(len(rows), -1).tolist()
    return layer_labels(hparams), tokens if by_position else head_labels(hparams), values.tolist()


def run_patch(args, encoder, params, hparams):
    clean, corrupted, answer, wrong = pair(args, encoder, hparams)
    clean_metric, corrupted_metric = circuits.metrics(params, hparams, clean, corrupted, answer, wrong, args.splice)
    values = circuits.patch(params, hparams, clean, corrupted, answer, wrong, args.site, args.all_positions,
                            splice=args.splice)
    center, what = corrupted_metric, "the patched run's metric"
    if args.normalized:
        if clean_metric == corrupted_metric:
            raise UserError(f"the clean and corrupted prompts give the same metric, {clean_metric:.6g}: --normalized "
                            "would divide by 0")
        values, center = circuits.normalized(values, clean_metric, corrupted_metric), 0.0
        what = "normalized: 0 nothing back, 1 the whole clean answer"
    tokens = token_texts(encoder, clean[0])
    where = f"patching {args.site}" + (" at every position" if args.all_positions else "")
    return result(tokens, values.tolist(), f"{where} ({what})",
                  sweep_table(values, tokens, hparams, args.site in circuits.BY_POSITION) + (center,),
                  [metrics_line(clean_metric, corrupted_metric)], clean=clean_metric, corrupted=corrupted_metric)


def run_dla(args, encoder, params, hparams):
    """Each part's share of the clean run's logit difference; with --corrupted, the corrupted run's metric
    too, and by component its shares beside the clean ones (JSON "corrupted", "corrupted_values")."""
    clean, corrupted, answer, wrong = pair(args, encoder, hparams)
    tokens = token_texts(encoder, clean[0])
    clean_metric = circuits.metric(params, hparams, clean, answer, wrong, args.splice)
    header, extra = [f"the logit difference {args.answer!r} - {args.wrong!r}: {clean_metric:.4f}"], {}
    if corrupted is not None:
        corrupted_metric = circuits.metric(params, hparams, corrupted, answer, wrong, args.splice)
        header, extra = [metrics_line(clean_metric, corrupted_metric)], {"corrupted": corrupted_metric}
        if args.by == "component":
            labels, values = circuits.dla_components(params, hparams, clean, answer, wrong, args.splice)
            _, others = circuits.dla_components(params, hparams, corrupted, answer, wrong, args.splice)
            return result(tokens, values.tolist(), "each part's share of it, at the last position", (
                labels, ["clean", "corrupted"], np.stack([values, others], 1).tolist(), 0.0), header,
                [f"total {float(values.sum()):.4f} clean, {float(others.sum()):.4f} corrupted; the rest is ln_f's "
                 "bias term"], clean=clean_metric, corrupted=corrupted_metric, labels=labels,
                total=float(values.sum()), corrupted_values=others.tolist())
    if args.by == "head":
        labels, values = circuits.dla_heads(params, hparams, clean, answer, wrong, args.splice)
        panel = (layer_labels(hparams), head_labels(hparams),
                 values.reshape(hparams["n_layer"], hparams["n_head"]).tolist(), 0.0)
        return result(tokens, values.tolist(), "each head's share of it (z @ W_O at the last position)", panel,
                      header, clean=clean_metric, labels=labels, **extra)
    if args.by == "latent":
        outcome = latent_dla(args, params, hparams, clean, answer, wrong, tokens, header, clean_metric)
        outcome["json"].update(extra)
        return outcome
    labels, values = circuits.dla_components(params, hparams, clean, answer, wrong, args.splice)
    total = float(values.sum())
    return result(tokens, values.tolist(), "each part's share of it, at the last position",
                  (labels, ["share"], [[v] for v in values.tolist()], 0.0), header,
                  [f"total {total:.4f}; the rest, {clean_metric - total:.4f}, is ln_f's bias term"],
                  clean=clean_metric, labels=labels, total=total)


def latent_dla(args, params, hparams, clean, answer, wrong, tokens, header, clean_metric):
    """dla --by latent: every latent's share in the JSON ("values", [d_sae]; "top", the ids of the largest), the
    largest in the table."""
    chosen = device.to_device(loading.load_sae(args.sae, args.models_dir, args.quiet), array_module(args))
    values = circuits.dla_latents(params, hparams, clean, answer, wrong, chosen, args.splice)
    fired = np.flatnonzero(values)  # a latent that does not fire writes nothing: its share is 0 (a TopK's most)
    top = fired[np.argsort(-np.abs(values[fired]), kind="stable")][:TOP_LATENTS].tolist()
    which = f"the {TOP_LATENTS} latents of the largest share" if len(fired) >= TOP_LATENTS else \
        f"the {plural(len(fired), 'latent')} that fire{'s' if len(fired) == 1 else ''}, fewer than {TOP_LATENTS}"
    return result(tokens, values.tolist(), f"{which} (f_i W_dec[i] at the last position, read along the logit "
                                           "difference)",
                  ([f"latent {i}" for i in top], ["share"], [[float(values[i])] for i in top], 0.0), header,
                  clean=clean_metric, top=top)


def run_attribution(args, encoder, params, hparams):
    clean, corrupted, answer, wrong = pair(args, encoder, hparams)
    clean_metric, corrupted_metric = circuits.metrics(params, hparams, clean, corrupted, answer, wrong, args.splice)
    values = circuits.attribution(params, hparams, clean, corrupted, answer, wrong, args.site, args.splice)
    tokens = token_texts(encoder, clean[0])
    return result(tokens, values.tolist(), f"attribution patching {args.site} (the estimated change of the metric)",
                  sweep_table(values, tokens, hparams, by_position=True) + (0.0,),
                  [metrics_line(clean_metric, corrupted_metric)], clean=clean_metric, corrupted=corrupted_metric)


def run_path(args, encoder, params, hparams):
    layer, head = args.source
    if layer == hparams["n_layer"] - 1 and head < hparams["n_head"]:
        choose = f"choose a head in a layer before {layer}" if layer else "this model has no other"
        raise UserError(f"--source {layer}.{head} is in the last layer: no head comes after it for its change to "
                        f"reach; {choose}")
    clean, corrupted, answer, wrong = pair(args, encoder, hparams)
    clean_metric, corrupted_metric = circuits.metrics(params, hparams, clean, corrupted, answer, wrong, args.splice)
    values = circuits.path_patch(params, hparams, clean, corrupted, answer, wrong, args.source, args.component,
                                 splice=args.splice)
    # the layers up to the source's are never patched (path_patch's 0s): not measured, so None, not 0
    values = [[None] * hparams["n_head"] if i <= layer else row for i, row in enumerate(values.tolist())]
    return result(token_texts(encoder, clean[0]), values,
                  f"head {layer}.{head}'s change into each later head's {args.component} alone (the metric; blank "
                  f"up to layer {layer}, the source's: not measured)",
                  (layer_labels(hparams), head_labels(hparams), values, corrupted_metric),
                  [metrics_line(clean_metric, corrupted_metric)], clean=clean_metric, corrupted=corrupted_metric)


def heads_text(args, encoder, hparams):
    """--text's ids: the text after <|endoftext|>, or random:N."""
    if not args.text.startswith(RANDOM):
        return prompt_ids(encoder, args.text, "--text", hparams)
    n = args.text[len(RANDOM):]
    if not n.isdigit() or int(n) < 1:
        raise UserError(f"--text {args.text}: give {RANDOM}N, N a whole number >= 1")
    if 2 * int(n) + 1 > hparams["n_ctx"]:
        raise UserError(f"--text {args.text} is {2 * int(n) + 1} tokens; the model reads at most {hparams['n_ctx']}, "
                        f"so N is at most {(hparams['n_ctx'] - 1) // 2}")
    if encoder.eot is None:
        raise UserError("this vocabulary has no <|endoftext|> to start the random ids from")
    return circuits.repeated_random_tokens(int(n), hparams["n_vocab"], encoder.eot, args.seed).tolist()


def run_heads(args, encoder, params, hparams):
    ids = heads_text(args, encoder, hparams)
    values = circuits.head_scores(params, hparams, ids, args.pattern, args.splice)
    return result(token_texts(encoder, ids), values.tolist(),
                  f"{args.pattern} heads: each head's share of its attention on the pattern, over {len(ids)} tokens",
                  (layer_labels(hparams), head_labels(hparams), values.tolist(), 0.0))


ACTIVATIONS_ONLY = {"heads"}  # the others measure a logit difference: a language model's
EXPERIMENTS = {"logit-diff": run_logit_diff, "patch": run_patch, "dla": run_dla, "attribution": run_attribution,
               "path": run_path, "heads": run_heads}
