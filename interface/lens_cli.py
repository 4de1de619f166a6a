"""The command line of lens.py: read a text through a tuned lens, train one, fit a linear probe.

    python lens.py read TEXT --model DIR --tuned-lens LENS_DIR [--logits OUT.npy] [--json]
    python lens.py train --model DIR --data FILE --out LENS_DIR [--init LENS_DIR] [--steps K] [--batch-size B]
                         [--context T] [--lr-scale X] [--momentum 0.9] [--weight-decay 1e-3] [--loss kl|ce]
                         [--warmup-steps W] [--seed S] [--json]
    python lens.py probe --model DIR --data LABELLED.jsonl --site HOOK --position last|mean
                         --method mean-diff|logistic [--C C] [--standardize] [--iid] --out PROBE_DIR [--json]

Each takes --model, --models-dir, --base-url, --threads, --device and --quiet. A text is read as the encoder's
ids, no <|endoftext|> added (as --lens reads it). train's --data is a text (its documents' ids, each followed by
<|endoftext|>, as train.py reads them, cut into windows of --context tokens, one after another) or an .npy of
token windows [N, T], taken --batch-size at a time in order (--seed S: the windows shuffled once first), from the
first again when they run out. Exit status: 0 done, 2 a user's mistake (one line on stderr, before any work),
130 interrupted: train then saves the steps done, as train.py does; nothing else is written unless the command
ends well. gpt2_numpy.py's --lens --tuned-lens prints this file's table beside the logit lens's.
"""
import argparse
import json
import os
import sys

import numpy as np

import lens as LENS
import look_inside
from interface import loading
from interface.bpe_cli import shown_token
from interface.options import (array_module, at_least, check_output_file, device_flag, model_flags, number, on_device,
                               threads_flag)
from plumbing import lens_files
from plumbing.corpus import jsonl_objects, read_documents
from plumbing.device import host, to_host
from plumbing.errors import Terminated, UserError, ctrl_c_waits, exit_status, fail, given_flags, plural
from plumbing.folders import check_new_folder, whole_file
from plumbing.progress import progress

FLAGS = {"steps": "--steps", "batch_size": "--batch-size", "lr_scale": "--lr-scale", "momentum": "--momentum",
         "weight_decay": "--weight-decay", "loss": "--loss", "warmup": "--warmup-steps", "C": "--C",
         "site": "--site", "position": "--position", "method": "--method", "labels": "--data's labels"}
CONTEXT = 256  # tokens a window from a text, unless --context or the model has fewer positions (train.py's)


def common(p):
    model_flags(p)
    threads_flag(p)
    device_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="lens.py", allow_abbrev=False,
                                description="What the residual stream knows: the tuned lens (tuned-lens 0.2.0's) "
                                            "and linear probes (docs/residual_stream.md).")
    commands = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    r = commands.add_parser("read", help="each layer's reading of a text through a tuned lens", allow_abbrev=False)
    r.add_argument("text", metavar="TEXT", help="the text (its ids, no <|endoftext|> added)")
    r.add_argument("--tuned-lens", required=True, metavar="LENS_DIR", help="a tuned lens's folder (tuned-lens's)")
    r.add_argument("--logits", metavar="OUT.npy", help="write every translator's logits, [n_layer, T, V] float32")
    t = commands.add_parser("train", help="train a tuned lens, as tuned-lens trains one", allow_abbrev=False)
    t.add_argument("--data", required=True, metavar="FILE", help="a text (.txt, a folder, .jsonl of {\"text\"}), or "
                                                                 "an .npy of token windows [N, T]")
    t.add_argument("--out", required=True, metavar="LENS_DIR", help="the lens's folder (tuned-lens's format)")
    t.add_argument("--init", metavar="LENS_DIR", help="start from this lens (default: zero, the logit lens)")
    t.add_argument("--steps", type=at_least(1), default=250, help="optimizer steps, one a batch (default 250)")
    t.add_argument("--batch-size", type=at_least(1), default=4, help="windows a step (default 4)")
    t.add_argument("--context", type=at_least(2), help=f"tokens a window cut from a text (default {CONTEXT}, or the "
                                                        "model's positions if fewer)")
    t.add_argument("--lr-scale", type=number, default=1.0, metavar="X", help="lr = X (1 - momentum) (default 1)")
    t.add_argument("--momentum", type=number, default=0.9, help="Nesterov momentum (default 0.9)")
    t.add_argument("--weight-decay", type=number, default=1e-3, help="SGD's weight decay (default 1e-3)")
    t.add_argument("--loss", default="kl", help="kl (to the model's final distribution, default) or ce (next token)")
    t.add_argument("--warmup-steps", type=at_least(0), default=0, metavar="W", help="linear warm-up (default 0)")
    t.add_argument("--seed", type=at_least(0), help="shuffle the windows once with this seed (default: in order)")
    b = commands.add_parser("probe", help="a linear probe: a direction that tells two classes of texts apart",
                            allow_abbrev=False)
    b.add_argument("--data", required=True, metavar="LABELLED.jsonl", help='{"text": ..., "label": 0 or 1} lines')
    b.add_argument("--site", required=True, metavar="HOOK", help="the hook point, e.g. blocks.2.hook_resid_post")
    b.add_argument("--position", required=True, help="last (the text's last token) or mean (over its tokens)")
    b.add_argument("--method", required=True, help="mean-diff (μ₁ - μ₀) or logistic (scikit-learn's)")
    b.add_argument("--C", type=number, metavar="C", help="logistic: the inverse of the L2 penalty (default 1)")
    b.add_argument("--standardize", action="store_true", help="scale each feature to mean 0, deviation 1 first")
    b.add_argument("--iid", action="store_true", help="mean-diff: Σ⁺ (μ₁ - μ₀), the classes' covariance undone")
    b.add_argument("--out", required=True, metavar="PROBE_DIR", help="the probe's folder")
    for sub in (p, r, t, b):
        sub.error = fail
    for sub in (r, t, b):
        common(sub)
    args = p.parse_args(argv)
    args.given = given_flags({"read": r, "train": t, "probe": b}[args.command], argv)
    check_flags(args)
    return args


def check_flags(args):
    """What the flags alone can tell, before any model loads."""
    if args.command == "read":
        if not args.text:
            fail("read needs a text")
        if args.logits:
            check_output_file(args.logits, ".npy", "--logits")
    if args.command == "train":
        try:
            LENS.check_training(args.steps, args.batch_size, args.lr_scale,
                                args.momentum, args.weight_decay, args.loss, args.warmup_steps)
        except UserError as e:
            fail(message(e))
    if args.command == "probe":
        for value, allowed, flag in ((args.position, LENS.POSITIONS, "--position"),
                                     (args.method, LENS.METHODS, "--method")):
            if value not in allowed:
                fail(f"{flag} must be {' or '.join(allowed)}, got {value!r}")
        if args.iid and args.method != "mean-diff":
            fail("--iid goes with --method mean-diff")
        if args.C is not None and args.method != "logistic":
            fail("--C goes with --method logistic")
        if args.C is not None and not (np.isfinite(args.C) and args.C > 0):
            fail(f"--C must be positive and finite, got {args.C:g}")
    if getattr(args, "out", None):
        try:
            check_new_folder(args.out, "choose a new folder")
        except UserError as e:
            fail(str(e))


def message(e):
    """A UserError in the flags' words."""
    return f"{FLAGS[e.arg]} {e.message}" if e.arg in FLAGS else str(e)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.stdout.reconfigure(errors="replace")
    return exit_status(lambda: {"read": read, "train": train, "probe": probe}[args.command](args), message)


def model(args, body=False):
    """--model on --device: (encoder, hparams, params); body: a classifier's too (its activations)."""
    xp = array_module(args)
    encoder, hparams, params = (loading.load_body if body else loading.load_model)(args.model, args.models_dir,
                                                                                   args.base_url, quiet=args.quiet)
    return encoder, hparams, on_device(xp, params, args.model)


def loaded_lens(folder, hparams, params):
    """A lens folder, checked against the model before any work; a note when its unembed_hash is another's."""
    lens, config = lens_files.load_lens(folder)
    try:
        LENS.check_lens(lens, hparams)
    except UserError as e:
        raise UserError(e.message, path=folder) from None
    if config.get("unembed_hash") and config["unembed_hash"] != LENS.unembed_hash(params["wte"]):
        print(f"note: {folder}'s unembed_hash is not this model's: it was trained on another unembedding "
              f"({config.get('base_model_name_or_path')})", file=sys.stderr)
    return on_model_device(lens, params)


def on_model_device(lens, params):
    """The translators where the model's weights are (a GPU's, or the host's)."""
    return [{k: np.asarray(v, like=params["wte"]) for k, v in t.items()} for t in lens]


# ----------------------------------------------------------------------------
# read
# ----------------------------------------------------------------------------

def text_ids(encoder, text, hparams):
    ids = encoder.encode(text)
    if len(ids) > hparams["n_ctx"]:
        raise UserError(f"the text has {len(ids)} tokens; the model reads at most {hparams['n_ctx']}")
    return ids


def read(args):
    encoder, hparams, params = model(args)
    lens = loaded_lens(args.tuned_lens, hparams, params)
    ids = text_ids(encoder, args.text, hparams)
    run = look_inside.run_with_cache([ids], params, hparams, names=look_inside.lens_activations(hparams["n_layer"]))
    reading = to_host(LENS.tuned_lens([ids], params, hparams, lens, run=run))
    if args.logits:  # once the reading is done: an interrupted command leaves no file
        logits = np.stack([host(x[0]) for x in LENS.lens_readings(run[1], params, hparams, lens)]).astype(np.float32)
        with whole_file(args.logits, "the logits") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, logits)
    if args.json:
        print(json.dumps({"prompt_ids": ids, **reading_json(encoder, ids, hparams, reading)}))
    else:
        print_table("the tuned lens: each translator's most likely next token at each position (the last row is the "
                    "model's)", encoder, ids, hparams, reading["top"][:, 0])


def reading_json(encoder, ids, hparams, reading):
    """A reading (tuned_lens's, or look_inside.logit_lens's) for --json: each layer's top tokens, their
    probabilities, and the model's final prediction's probability and rank."""
    return {"tokens": [encoder.decode([i]) for i in ids], "layers": look_inside.lens_labels(hparams["n_layer"]),
            "top": reading["top"][:, 0].tolist(),
            "top_token": [[encoder.decode([i]) for i in row] for row in reading["top"][:, 0].tolist()],
            "top_prob": np.round(reading["top_prob"][:, 0], 6).tolist(), "target": reading["target"][0].tolist(),
            "target_prob": np.round(reading["target_prob"][:, 0], 6).tolist(),
            "target_rank": reading["target_rank"][:, 0].tolist()}


def print_table(title, encoder, ids, hparams, top):
    """A lens's table: a row a layer (embed, h0, ...: the residual stream each reads), a column a position."""
    def cell(text, width=12):  # one column of the table: cut a long token short
        return (text if len(text) < width else text[:width - 2] + "…").ljust(width)

    print(title)
    print(f"{'':<7}" + "".join(cell(shown_token(encoder, i)) for i in ids))
    for name, row in zip(look_inside.lens_labels(hparams["n_layer"]), top):
        print(f"{name:<7}" + "".join(cell(shown_token(encoder, i)) for i in row))


# ----------------------------------------------------------------------------
# train
# ----------------------------------------------------------------------------

def windows(args, encoder, hparams, params):
    """--data as token windows [N, T], in the order they are taken."""
    if args.data.endswith(".npy") and not os.path.isdir(args.data):
        rows = npy_windows(args.data, hparams)
    else:
        import train  # the documents' ids as train.py makes them: each ends with <|endoftext|>

        context = args.context or min(CONTEXT, hparams["n_ctx"])
        if context > hparams["n_ctx"]:
            raise UserError(f"--context {context} is more than the model's {hparams['n_ctx']} positions")
        ids = train.document_ids(encoder, read_documents([args.data]))
        if len(ids) < context:
            raise UserError(f"gives {plural(len(ids), 'token')}, fewer than a window of {context} (--context)",
                            path=args.data)
        rows = ids[:len(ids) // context * context].reshape(-1, context)
    if args.seed is not None:
        rows = rows[np.random.default_rng(args.seed).permutation(len(rows))]
    return rows


def npy_windows(path, hparams):
    """An .npy of token windows [N, T]: whole numbers of the vocabulary, T within the model's positions."""
    try:
        rows = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UserError(f"is not an .npy array of token windows ({e})", path=path) from None
    if rows.ndim != 2 or not rows.size or not np.issubdtype(rows.dtype, np.integer):
        raise UserError(f"must hold token windows [N, T] of whole numbers, holds {rows.dtype} {list(rows.shape)}",
                        path=path)
    if rows.shape[1] > hparams["n_ctx"] or rows.min() < 0 or rows.max() >= hparams["n_vocab"]:
        raise UserError(f"its windows must be at most {hparams['n_ctx']} tokens of ids 0 .. {hparams['n_vocab'] - 1}",
                        path=path)
    return rows.astype(np.int64)


def train(args):
    encoder, hparams, params = model(args)
    lens = loaded_lens(args.init, hparams, params) if args.init else \
        on_model_device(LENS.new_lens(hparams["n_layer"], hparams["n_embd"]), params)
    rows = windows(args, encoder, hparams, params)
    if args.warmup_steps > args.steps:
        raise UserError(f"--warmup-steps {args.warmup_steps} is more than --steps {args.steps}")
    config = lens_files.lens_config(args.model, hparams["n_embd"], hparams["n_layer"], LENS.unembed_hash(params["wte"]))
    losses, done = [], 0
    steps = LENS.train_lens(rows, params, hparams, lens, args.steps, args.batch_size, args.lr_scale, args.momentum,
                            args.weight_decay, args.loss, args.warmup_steps)
    if not args.quiet and not args.json:
        print(f"training a tuned lens of {plural(hparams['n_layer'], 'translator')} on {plural(len(rows), 'window')} "
              f"of {rows.shape[1]} tokens: {plural(args.steps, 'step')} of {args.batch_size}", file=sys.stderr)
    bar = progress(args.steps, "step", quiet=args.quiet or args.json)
    try:
        while True:
            with ctrl_c_waits():  # a step is done whole, or not begun
                layer_losses = next(steps, None)
            if layer_losses is None:
                break
            losses.append(layer_losses)
            done += 1
            bar.set_postfix(loss=f"{sum(layer_losses):.4f}")
            bar.update(1)
    except KeyboardInterrupt as e:
        bar.close()
        what = "terminated" if isinstance(e, Terminated) else "interrupted"
        if not done:
            print(f"\n{what} before a step was done: nothing was saved", file=sys.stderr)
        else:
            lens_files.save_lens(args.out, to_host(lens), config)
            print(f"\n{what}: saved step {done} in {args.out}; --init {args.out} goes on from it (the momentum "
                  "starts again)", file=sys.stderr)
        return 130
    bar.close()
    lens_files.save_lens(args.out, to_host(lens), config)
    if args.json:
        print(json.dumps({"losses": [sum(step) for step in losses], "layer_losses": losses}))
    elif not args.quiet:
        print(f"{args.out}: {plural(done, 'step')}, the loss {sum(losses[0]):.4f} -> {sum(losses[-1]):.4f} (summed "
              f"over the translators); read with python lens.py read TEXT --model {args.model} --tuned-lens "
              f"{args.out}")
    return 0


# ----------------------------------------------------------------------------
# probe
# ----------------------------------------------------------------------------

def labelled_texts(path):
    """{"text", "label"} lines, the label 0 or 1: -> (texts, labels [N])."""
    texts, labels = [], []
    for n, item in jsonl_objects(path, {"text": str, "label": int}):
        if item["label"] not in (0, 1):
            raise UserError(f"line {n}'s label is {item['label']}: a probe's labels are 0 and 1", path=path)
        if not item["text"]:
            raise UserError(f"line {n}'s text is empty", path=path)
        texts.append(item["text"])
        labels.append(item["label"])
    if len(set(labels)) < 2:
        raise UserError(f"has one class only (every label is {labels[0]}): a probe tells two apart", path=path)
    return texts, np.array(labels)


def probe(args):
    texts, labels = labelled_texts(args.data)
    encoder, hparams, params = model(args, body=True)
    LENS.check_probe_site(args.site, hparams)
    ids = [encoder.encode(t)[:hparams["n_ctx"]] for t in texts]
    features = LENS.probe_features(ids, params, hparams, [args.site], args.position)[args.site]
    fitted = LENS.fit_probe(host(features), labels, args.method, 1.0 if args.C is None else args.C, args.standardize,
                            args.iid)
    settings = {"method": args.method, "site": args.site, "position": args.position, "standardize": args.standardize,
                "C": (args.C or 1.0) if args.method == "logistic" else None, "iid": args.iid if args.method == "mean-diff"
                else None, "model": args.model, "n": len(texts), "accuracy": fitted["accuracy"]}
    lens_files.save_probe(args.out, fitted, settings)
    if args.json:
        print(json.dumps({"accuracy": fitted["accuracy"], "n": len(texts), "site": args.site, "bias": fitted["bias"],
                          "direction_norm": float(np.linalg.norm(fitted["direction"])), "out": args.out}))
    else:
        print(f"{args.out}: a {args.method} probe at {args.site} ({args.position}), accuracy {fitted['accuracy']:.4f} "
              f"on the {plural(len(texts), 'text')} it was fit on; push along it with python steer.py vector PROMPT "
              f"--direction {args.out} --multiplier M")
