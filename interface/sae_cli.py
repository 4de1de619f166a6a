"""The command line of sae.py: train an SAE, evaluate it as SAELens does, encode a text, read its features.

    python sae.py train    --site HOOK (--data FILE | --activations FILE.npy) --d-sae N --l1 C --tokens K --out DIR
                           [--lr 3e-4] [--batch-tokens 4096] [--context 128] [--l1-warm-up W] [--seed S]
                           [--init SAE_DIR] [--normalize none|expected_average_only_in]
    python sae.py eval     --sae SAE_DIR --data FILE [--json]
    python sae.py encode   --sae SAE_DIR --text T [--k 5] [--json]
    python sae.py features --sae SAE_DIR --data FILE [--feature I] [--json] [--html F]

Every command takes --model, --models-dir and --base-url; --sae is a folder or hf:owner/name/PATH from the
Hub. A text is read in windows of --context tokens, <|endoftext|> first. Exit status: 0 done, 2 a user's
mistake (one line on stderr, before any work where it can be), 130 interrupted: train then saves the steps
done first, whole; nothing else is written unless the command ends well.
"""
import argparse
import html
import json
import os
import sys

import numpy as np

import sae as S
from interface import loading
from interface.options import (CENTRED_HELP, array_module, at_least, check_page_folder, device_flag, model_flags,
                               on_device, threads_flag, user_message)
from plumbing import device, sae_files
from plumbing.errors import UserError, ctrl_c_waits, exit_status, fail, read_text
from plumbing.folders import check_new_folder, write_page
from plumbing.progress import progress

NORMALIZE = ("none", "expected_average_only_in")


def common(p, data=True):
    model_flags(p)
    threads_flag(p)
    device_flag(p)
    p.add_argument("--context", type=at_least(2), default=128, help="tokens a window, <|endoftext|> first "
                                                                    "(default 128)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.add_argument("--center-writing-weights", action="store_true", help=CENTRED_HELP)
    if data:
        p.add_argument("--data", required=True, metavar="FILE", help="a UTF-8 text")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="sae.py", allow_abbrev=False,
                                description="Sparse autoencoders on GPT-2, in NumPy, exactly as SAELens 6.54.12 "
                                            "(docs/sae.md).")
    commands = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    t = commands.add_parser("train", help="train an SAE on one hook point's activations", allow_abbrev=False)
    t.add_argument("--site", metavar="HOOK", help="the hook point, e.g. blocks.2.hook_resid_pre (with --init: its)")
    source = t.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="FILE", help="a UTF-8 text, read through the model")
    source.add_argument("--activations", metavar="FILE.npy", help="[N, d_in] float32 activations, in this order")
    t.add_argument("--d-sae", type=int, help="latents (with --init: its)")
    t.add_argument("--l1", type=float, required=True, help="the L1 coefficient, 0 or more")
    t.add_argument("--tokens", type=int, required=True, help="tokens to train on: tokens // batch-tokens steps")
    t.add_argument("--out", required=True, metavar="SAE_DIR", help="the SAE's folder, SAELens's format")
    t.add_argument("--lr", type=float, default=3e-4, help="Adam's learning rate (default 3e-4)")
    t.add_argument("--batch-tokens", type=at_least(1), default=4096, help="tokens a step (default 4096)")
    t.add_argument("--l1-warm-up", type=at_least(0), default=0, help="steps over which the L1 coefficient "
                                                                     "grows from 0 (default 0)")
    t.add_argument("--seed", type=int, default=0, help="the initialisation's and the shuffle's seed (default 0)")
    t.add_argument("--init", metavar="SAE_DIR", help="start from a saved SAE")
    t.add_argument("--normalize", choices=NORMALIZE, default="none",
                   help="expected_average_only_in: scale the activations to norm √d_in on average, the factor "
                        "folded into the weights at save (default none)")
    common(t, data=False)
    e = commands.add_parser("eval", help="SAELens's evals: L0, explained variance, CE loss recovered, KL",
                            allow_abbrev=False)
    n = commands.add_parser("encode", help="a text's top latents at each position", allow_abbrev=False)
    n.add_argument("--text", required=True, help="the text (read after <|endoftext|>)")
    n.add_argument("--k", type=at_least(1), default=5, help="latents a position (default 5)")
    f = commands.add_parser("features", help="each latent's density, top contexts and logit effects",
                            allow_abbrev=False)
    f.add_argument("--feature", type=int, action="append", metavar="I", help="this latent alone (again: several)")
    f.add_argument("--k", type=at_least(1), default=10, help="top contexts and tokens a latent (default 10)")
    f.add_argument("--html", metavar="FILE", help="also write a dashboard page, self-contained")
    for sub, data in ((e, True), (n, False), (f, True)):
        sub.add_argument("--sae", required=True, metavar="SAE_DIR", help="a folder, or hf:owner/name/PATH")
        common(sub, data=data)
    for sub in (p, t, e, n, f):
        sub.error = fail
    args = p.parse_args(argv)
    if args.command == "train":
        check_train_flags(args)
    if getattr(args, "html", None):
        check_page_folder(args.html)
    return args


def check_train_flags(args):
    if args.init is None and (args.site is None or args.d_sae is None):
        fail("train needs --site and --d-sae (or --init SAE_DIR, whose they are)")
    if args.d_sae is not None and args.d_sae < 1:
        fail(f"--d-sae must be at least 1, got {args.d_sae}")
    if args.l1 < 0:
        fail(f"--l1 must be 0 or more, got {args.l1}")
    if not args.lr > 0:
        fail(f"--lr must be above 0, got {args.lr}")
    if args.tokens < args.batch_tokens:
        fail(f"--tokens {args.tokens} is too few for one batch of --batch-tokens {args.batch_tokens}")
    try:
        check_new_folder(args.out, "choose a new one")
    except UserError as e:
        fail(str(e))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return exit_status(lambda: COMMANDS[args.command](args), user_message)


# ----------------------------------------------------------------------------
# What every command reads
# ----------------------------------------------------------------------------

ACTIVATIONS_ONLY = ("train", "encode")  # eval's CE and KL, and features' promoted tokens, are the next token's


def model(args):
    """-> (encoder, hparams, params, the hooks that run it as --center-writing-weights asks)"""
    load = loading.load_body if args.command in ACTIVATIONS_ONLY else loading.load_model  # loading.py says why
    xp = array_module(args)  # numpy, or cupy once a GPU has answered: before the model is fetched
    encoder, hparams, params = load(args.model, args.models_dir, args.base_url, quiet=args.quiet)
    params = on_device(xp, params, args.model)
    return encoder, hparams, params, S.centring_hooks(hparams["n_layer"]) if args.center_writing_weights else {}


def text_windows(encoder, path, context, params):
    ids = encoder.encode(read_text(path))
    return S.windows(ids, min(context, params["wpe"].shape[0]), encoder.eot)


def meter(args, total, unit):
    return progress(total, unit, quiet=args.quiet or args.json)


# ----------------------------------------------------------------------------
# train
# ----------------------------------------------------------------------------

def training_data(args, encoder, params, hparams, hooks, site, d_in, needed):
    """The activations to train on: [n, d_in] float32, --activations' in their order, or the text's through
    the model, shuffled (SAELens shuffles its activations' buffer) and no more than the run needs."""
    if args.activations:
        try:
            x = np.load(args.activations, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise UserError(f"is not a .npy array ({e})", path=args.activations) from None
        if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != d_in:
            raise UserError(f"must be [N, {d_in}] float32 ({site}'s width), is {list(x.shape)} {x.dtype}",
                            path=args.activations)
        return x
    rows = text_windows(encoder, args.data, args.context, params)
    rows = rows[:-(-needed // rows.shape[1])]
    with meter(args, len(rows), "window") as bar:
        acts = S.gather_all(rows, params, hparams, site, progress=bar.update, hooks=hooks)
    x = device.host(acts).reshape(-1, d_in)  # on the host, as --activations' are: a batch at a time goes over
    return x[np.random.default_rng(args.seed).permutation(len(x))]


def train(args):
    encoder, hparams, params, hooks = model(args)
    if args.init:
        sae = loading.load_sae(args.init, args.models_dir, args.quiet)
        site = S.check_fits(sae, hparams)
        if args.site and args.site != site:
            raise UserError(f"--init's SAE reads {site}, not --site {args.site}")
        if args.d_sae is not None and args.d_sae != sae["cfg"]["d_sae"]:
            raise UserError(f"--init's SAE has {sae['cfg']['d_sae']} latents, not --d-sae {args.d_sae}")
    else:
        site = args.site
        d_in = S.check_site(site, hparams)
        metadata = {"hook_name": site, "model_name": os.path.basename(os.path.normpath(args.model)),
                    "context_size": args.context, "prepend_bos": True}
        sae = S.new_sae(d_in, args.d_sae, seed=args.seed, metadata=metadata)
    steps = args.tokens // args.batch_tokens
    x = training_data(args, encoder, params, hparams, hooks, site, sae["cfg"]["d_in"], steps * args.batch_tokens)
    if len(x) < 1:
        raise UserError("gives no activations to train on", path=args.data or args.activations)
    factor = S.scaling_factor(np.asarray(x)) if args.normalize == "expected_average_only_in" else None
    sae = device.to_device(sae, array_module(args))
    state, log = S.new_adam_state(sae), []
    try:  # from here on, a stop saves the steps done (none yet: the SAE as it began)
        if not args.quiet:
            print(f"training {sae['cfg']['d_sae']:,} latents at {site} on {len(x):,} activations: {steps:,} steps "
                  f"of {args.batch_tokens:,}", file=sys.stderr, flush=True)
        with meter(args, steps, "step") as bar:
            for step in range(steps):
                at = (np.arange(args.batch_tokens) + step * args.batch_tokens) % len(x)  # round again if short
                batch = np.asarray(x[at], dtype=np.float32)
                if factor is not None:
                    batch *= np.float32(factor)
                batch = np.asarray(batch, like=sae["W_enc"])  # where the SAE is
                l1 = S.l1_coefficient(step, args.l1, args.l1_warm_up)
                with ctrl_c_waits():  # a step is done whole, and logged, or not begun
                    losses = S.train_step(batch, sae, state, args.lr, l1)
                    log.append({"step": step, **losses, "l1_coefficient": l1, "lr": args.lr})
                bar.set_postfix(mse=f"{losses['mse_loss']:.4g}", l1=f"{losses['l1_loss']:.4g}",
                                l0=f"{losses['l0']:.1f}")
                bar.update()
    finally:  # done, or stopped: what is done is saved, whole
        save(args.out, sae, factor, log)
    if args.json:
        print(json.dumps({"out": args.out, "steps": len(log), "tokens": len(log) * args.batch_tokens,
                          "last": log[-1] if log else None}))
    elif not args.quiet:
        print(f"{args.out}: {len(log)} steps, {len(log) * args.batch_tokens:,} tokens", file=sys.stderr)


def save(out, sae, factor, log):
    sae = device.to_host(sae)  # a file is written from the host
    if factor is not None:
        sae = S.fold_scaling_factor(sae, factor)
    lines = "".join(json.dumps(entry) + "\n" for entry in log)
    sae_files.save_sae(out, sae, {"train_log.jsonl": lines})


# ----------------------------------------------------------------------------
# eval, encode, features
# ----------------------------------------------------------------------------

def evaluate(args):
    encoder, hparams, params, hooks = model(args)
    sae = device.to_device(loading.load_sae(args.sae, args.models_dir, args.quiet), array_module(args))
    S.check_fits(sae, hparams)
    rows = text_windows(encoder, args.data, args.context, params)
    with meter(args, len(rows), "window") as bar:
        metrics = S.evaluate(rows, params, hparams, sae, special={encoder.eot}, progress=bar.update, hooks=hooks)
    if args.json:
        print(json.dumps(metrics))
    else:
        for name in EVAL_ORDER:
            print(f"{name:<24}{metrics[name]:.6g}")


EVAL_ORDER = ("l0", "explained_variance", "ce_loss_with_sae", "ce_loss_without_sae", "ce_loss_with_ablation",
              "ce_loss_score", "kl_div_with_sae", "kl_div_with_ablation", "kl_div_score")


def encode(args):
    encoder, hparams, params, hooks = model(args)
    sae = device.to_device(loading.load_sae(args.sae, args.models_dir, args.quiet), array_module(args))
    site = S.check_fits(sae, hparams)
    ids = np.array([encoder.eot] + encoder.encode(args.text))[None, :params["wpe"].shape[0]]
    x = S.gather(ids, params, hparams, site, hooks)[0]
    f = S.encode(x, sae)
    f, error = device.host(f), device.host(((S.decode(f, sae) - x) ** 2).sum(-1))  # read on the host
    tokens = [encoder.decode([int(t)]) for t in ids[0]]
    positions = []
    for row, err in zip(f, error):
        top = np.argsort(-row, kind="stable")[:args.k]
        top = top[row[top] > 0]
        positions.append({"ids": top.tolist(), "values": row[top].tolist(), "error": float(err)})
    if args.json:
        print(json.dumps({"tokens": tokens, "positions": positions}))
        return
    for token, p in zip(tokens, positions):
        latents = "  ".join(f"{i}:{v:.3g}" for i, v in zip(p["ids"], p["values"])) or "(none)"
        print(f"{token!r:<16} error {p['error']:<10.4g} {latents}")


def features(args):
    encoder, hparams, params, hooks = model(args)
    sae = device.to_device(loading.load_sae(args.sae, args.models_dir, args.quiet), array_module(args))
    site = S.check_fits(sae, hparams)
    d_sae = sae["cfg"]["d_sae"]
    for i in args.feature or ():
        if not 0 <= i < d_sae:
            raise UserError(f"--feature must be a latent, 0 to {d_sae - 1}, got {i}")
    chosen = args.feature or list(range(d_sae))
    rows = text_windows(encoder, args.data, args.context, params)
    with meter(args, len(rows), "window") as bar:
        acts = S.gather_all(rows, params, hparams, site, progress=bar.update, hooks=hooks)
    read = S.read_features(rows, device.host(acts), device.to_host(sae), device.host(params["wte"]), chosen,
                           k=args.k)  # read on the host: sorting and small arrays
    word = lambda i: encoder.decode([int(i)])  # noqa: E731
    shown = [described(r, rows, word) for r in read]
    if args.html:
        size = write_page(args.html, dashboard(shown, site))
        print(f"{args.html}: {size:,} bytes", file=sys.stderr)
    if args.json:
        print(json.dumps({"hook_name": site, "features": shown}))
        return
    for r in shown:
        top = r["contexts"][0]["token"] if r["contexts"] else "-"
        print(f"{r['feature']:>6}  density {r['density']:<9.4g} top {top!r:<14} promotes "
              f"{' '.join(repr(t) for t, _ in r['promotes'][:5])}")


def described(read, rows, word, before=8, after=3):
    """A latent's reading, in words: each top context as text around the firing token."""
    contexts = []
    for value, w, t in read["top"]:
        ids = rows[w]
        contexts.append({"value": value, "window": w, "position": t, "token": word(ids[t]),
                         "before": "".join(word(i) for i in ids[max(0, t - before):t]),
                         "after": "".join(word(i) for i in ids[t + 1:t + 1 + after])})
    return {"feature": read["feature"], "density": read["density"], "contexts": contexts,
            "promotes": [(word(i), v) for i, v in read["promotes"]],
            "suppresses": [(word(i), v) for i, v in read["suppresses"]]}


def dashboard(shown, site):
    """One self-contained page: a card a latent, in the spirit of SAE-Vis and Neuronpedia's."""
    e = html.escape
    cards = []
    for r in shown:
        top = max([c["value"] for c in r["contexts"]] or [1.0])
        contexts = "".join(
            f"<li><span class=v>{c['value']:.3g}</span> {e(c['before'])}<mark style='background:rgba(255,120,0,"
            f"{0.25 + 0.75 * c['value'] / top:.2f})'>{e(c['token'])}</mark>{e(c['after'])}</li>"
            for c in r["contexts"])
        lists = "".join(f"<td><b>{name}</b><br>" + "<br>".join(f"{e(repr(t))} {v:+.3f}" for t, v in r[key]) + "</td>"
                        for name, key in (("promotes", "promotes"), ("suppresses", "suppresses")))
        cards.append(f"<section><h2>latent {r['feature']}</h2><p>firing density {r['density']:.4%}</p>"
                     f"<ol>{contexts or '<li>never fires on this text</li>'}</ol><table><tr>{lists}</tr></table>"
                     "</section>")
    style = ("body{font-family:sans-serif;max-width:60em;margin:auto}section{border:1px solid #ccc;padding:.5em;"
             "margin:.5em 0}li{font-family:monospace;white-space:pre-wrap}.v{color:#888}td{vertical-align:top;"
             "padding-right:2em;font-family:monospace}")
    return (f"<!doctype html><meta charset=utf-8><title>SAE features at {e(site)}</title><style>{style}</style>"
            f"<h1>SAE features at {e(site)}</h1>" + "".join(cards))


COMMANDS = {"train": train, "eval": evaluate, "encode": encode, "features": features}
