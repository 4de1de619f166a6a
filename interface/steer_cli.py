"""The command line of steer.py: the steered text beside the unsteered one, or one JSON object.

    python steer.py add    PROMPT --add TEXT --sub TEXT --layer L --coeff C
    python steer.py vector PROMPT (--positive TEXT --negative TEXT)... | --pairs FILE.jsonl  --layer L [--layer L2]
                           [--aggregator mean|pca] [--read-token-index I] [--multiplier M] [--min-token-index K]
    python steer.py latent PROMPT --sae SAE_DIR --latent I --alpha A

Each takes --model, --models-dir, --base-url, --n-tokens, --greedy, --temperature, --top-k, --top-p, --min-p,
--seed, --json, --no-kv-cache (the whole text again each step: the same ids), --logits FILE.npy (the steered
logits of one pass over prompt_ids + ids, [T, V] float32), --threads and --quiet. add and latent read the
prompt after <|endoftext|>, as ActAdd's and SAELens's models do; vector reads it as steering-vectors'
Hugging Face model does, without. Exit status: 0 done, 2 a user's mistake (one line on stderr, before any
work), 130 interrupted; nothing is written unless the command ends well.
"""
import argparse
import json
import sys

import numpy as np

import gpt2_numpy as g
import steer as S
from interface import loading
from interface.options import (array_module, at_least, check_output_file, device_flag, model_flags, number, on_device,
                               threads_flag)
from plumbing.errors import UserError, exit_status, fail, plural, read_text
from plumbing.folders import whole_file

FLAGS = {"coeff": "--coeff", "multiplier": "--multiplier", "alpha": "--alpha", "latent": "--latent",
         "layer": "--layer", "aggregator": "--aggregator", "read_token_index": "--read-token-index",
         "n_tokens": "--n-tokens", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
         "min_p": "--min-p", "pairs": "--pairs"}


def common(p):
    p.add_argument("prompt", metavar="PROMPT", help="the text to continue")
    model_flags(p)
    threads_flag(p)
    device_flag(p)
    p.add_argument("--n-tokens", type=at_least(0), default=40, help="tokens to generate (default 40)")
    p.add_argument("--greedy", action="store_true", help="always the most likely token (temperature 0)")
    p.add_argument("--temperature", type=number, default=1.0, help="softmax temperature (default 1)")
    p.add_argument("--top-k", type=at_least(1), help="sample from the k most likely tokens alone")
    p.add_argument("--top-p", type=number, default=1.0, help="nucleus sampling: the smallest set with this mass")
    p.add_argument("--min-p", type=number, default=0.0, metavar="P", help="drop every token less likely than P "
                                                                         "times the most likely (default 0)")
    p.add_argument("--seed", type=at_least(0), help="random seed: both texts are drawn with it")
    p.add_argument("--json", action="store_true", help="print one object: prompt_ids, ids, the vector(s)")
    p.add_argument("--no-kv-cache", action="store_true", help="the whole text through the model at each step "
                                                              "(slower; the same ids)")
    p.add_argument("--logits", metavar="FILE.npy", help="write the steered logits of one pass over the prompt "
                                                         "and the new ids, [T, V] float32")
    p.add_argument("--quiet", action="store_true", help="no download progress")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="steer.py", allow_abbrev=False,
                                description="Steer GPT-2 while it writes: ActAdd, steering vectors from contrastive "
                                            "pairs, or an SAE latent (docs/steering.md).")
    commands = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    a = commands.add_parser("add", help="ActAdd: the difference of two prompts' activations, at the front",
                            allow_abbrev=False)
    a.add_argument("--add", required=True, metavar="TEXT", help='the prompt steered toward, e.g. "Love"')
    a.add_argument("--sub", required=True, metavar="TEXT", help='the prompt steered away from, e.g. "Hate"')
    a.add_argument("--layer", required=True, type=int, metavar="L", help="the block whose resid_pre is steered")
    a.add_argument("--coeff", required=True, type=number, metavar="C", help="the difference's coefficient")
    v = commands.add_parser("vector", help="a steering vector from contrastive pairs (steering-vectors')",
                            allow_abbrev=False)
    v.add_argument("--positive", action="append", default=[], metavar="TEXT", help="a pair's positive text (again: "
                                                                                   "another pair)")
    v.add_argument("--negative", action="append", default=[], metavar="TEXT", help="its negative text")
    v.add_argument("--pairs", metavar="FILE.jsonl", help='more pairs, a {"positive", "negative"} object a line')
    v.add_argument("--layer", type=int, action="append", metavar="L",
                   help="the block whose output is steered (again: several); with --direction, the probe's block")
    v.add_argument("--direction", metavar="PROBE_DIR", help="push along a probe's direction (lens.py probe) at its "
                                                            "hook point, instead of pairs' differences")
    v.add_argument("--aggregator", default="mean", help="mean (of the differences) or pca (their top direction, "
                                                        "unit norm) (default mean)")
    v.add_argument("--read-token-index", type=int, default=-1, metavar="I",
                   help="the token each text is read at; negative counts from its end (default -1: the last)")
    v.add_argument("--multiplier", type=number, default=1.0, metavar="M", help="the vector's multiplier (default 1)")
    v.add_argument("--min-token-index", type=at_least(0), default=0, metavar="K",
                   help="steer the positions from K on, counted from the start of the text (default 0: all)")
    s = commands.add_parser("latent", help="an SAE latent's decoder direction, at the SAE's hook point",
                            allow_abbrev=False)
    s.add_argument("--sae", required=True, metavar="SAE_DIR", help="a folder, or hf:owner/name/PATH")
    s.add_argument("--latent", required=True, type=int, metavar="I", help="the latent")
    s.add_argument("--alpha", required=True, type=number, metavar="A", help="its decoder row's multiplier")
    for sub in (p, a, v, s):
        sub.error = fail
    for sub in (a, v, s):
        common(sub)
    args = p.parse_args(argv)
    check_flags(args, argv)
    return args


def check_flags(args, argv):
    """What the flags alone can tell, before any model loads."""
    if args.greedy:
        if "--temperature" in argv:
            fail("--greedy is --temperature 0: give one of them")
        args.temperature = 0.0
    try:
        for dest in ("coeff", "multiplier", "alpha"):
            if getattr(args, dest, None) is not None:
                S.check_finite(getattr(args, dest), dest)
        g.check_sampling(args.n_tokens, args.temperature, args.top_k, args.top_p, 1, args.min_p)
    except UserError as e:
        fail(message(e))
    if args.command == "vector" and args.direction:
        pairs = [f for f, given in (("--positive", args.positive), ("--negative", args.negative),
                                    ("--pairs", args.pairs),
                                    ("--aggregator", "--aggregator" in argv),
                                    ("--read-token-index", "--read-token-index" in argv)) if given]
        if pairs:
            fail(f"{pairs[0]} makes a vector from pairs; --direction takes the probe's: give one of them")
    elif args.command == "vector":
        if not args.layer:
            fail("vector needs --layer L (the block whose output is steered), or --direction PROBE_DIR")
        if len(args.positive) != len(args.negative):
            fail(f"{plural(len(args.positive), '--positive')} and {plural(len(args.negative), '--negative')}: give "
                 "them in pairs")
        if not args.positive and not args.pairs:
            fail("vector needs pairs: --positive TEXT --negative TEXT, or --pairs FILE.jsonl")
        if args.aggregator not in S.AGGREGATORS:
            fail(f"--aggregator must be {' or '.join(S.AGGREGATORS)}, got {args.aggregator!r}")
    if args.logits:
        check_output_file(args.logits, ".npy", "--logits")


def message(e):
    """A UserError in the flags' words."""
    return f"{FLAGS[e.arg]} {e.message}" if e.arg in FLAGS else str(e)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.stdout.reconfigure(errors="replace")
    return exit_status(lambda: run(args), message)


# ----------------------------------------------------------------------------
# The steering each command asks for: (prompt ids, a maker of hooks, what --json shows of it, a title)
# ----------------------------------------------------------------------------

def act_add(args, encoder, hparams, params):
    prompt = [encoder.eot] + encoder.encode(args.prompt)
    add, sub = ([encoder.eot] + encoder.encode(text) for text in (args.add, args.sub))
    n = max(len(add), len(sub))
    S.check_layer(args.layer, hparams)
    if len(prompt) < n:
        raise UserError(f"the prompt has {plural(len(prompt), 'token')} with <|endoftext|>, fewer than the steering "
                        f"prompts' {n}: ActAdd adds to the prompt's first {n} positions")
    vector = S.act_add_vector(params, hparams, add, sub, args.layer, args.coeff, pad_id=encoder.encode(" ")[0])
    return prompt, lambda: S.act_add_hooks(vector, args.layer), {"vector": vector.tolist()}, \
        f"{args.add!r} - {args.sub!r} at layer {args.layer}, coefficient {args.coeff:g}"


def read_pairs(args, encoder):
    """The pairs of the flags, then the file's, as ids; none of the texts empty."""
    texts = list(zip(args.positive, args.negative))
    if args.pairs:
        for i, line in enumerate(read_text(args.pairs).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                pair = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"line {i} is not JSON ({e.msg})", path=args.pairs) from None
            if not (isinstance(pair, dict) and isinstance(pair.get("positive"), str)
                    and isinstance(pair.get("negative"), str)):
                raise UserError(f'line {i} must be {{"positive": TEXT, "negative": TEXT}}', path=args.pairs)
            texts.append((pair["positive"], pair["negative"]))
    if not texts:
        raise UserError("has no pairs", path=args.pairs)
    if any(text == "" for pair in texts for text in pair):  # the only text of no tokens
        raise UserError("a pair's text is empty: each is read at one of its tokens")
    return [(encoder.encode(p), encoder.encode(n)) for p, n in texts]


def vector(args, encoder, hparams, params):
    prompt = encoder.encode(args.prompt) or [encoder.eot]
    if args.direction:
        return probe_direction(args, hparams, prompt)
    pairs = read_pairs(args, encoder)
    vectors = S.train_vector(params, hparams, pairs, args.layer, args.aggregator, args.read_token_index)
    return prompt, lambda: S.vector_hooks(vectors, args.multiplier, args.min_token_index), \
        {"vectors": {str(layer): v.tolist() for layer, v in vectors.items()}}, \
        f"{plural(len(pairs), 'pair')}' {args.aggregator} at layer {', '.join(map(str, args.layer))}, " \
        f"multiplier {args.multiplier:g}"


def probe_direction(args, hparams, prompt):
    """--direction PROBE_DIR: the probe's direction in the activation's space, pushed at its hook point."""
    import lens
    from plumbing import lens_files
    from sae import site_layer

    probe = lens_files.load_probe(args.direction)
    site = probe["site"]
    if lens.check_probe_site(site, hparams) != len(probe["direction"]):
        raise UserError(f"the probe reads {len(probe['direction'])} numbers at {site}; this model's are "
                        f"{lens.check_probe_site(site, hparams)}: it was fit on another model", path=args.direction)
    if args.layer and args.layer != [site_layer(site, hparams["n_layer"])]:
        raise UserError(f"--layer {' '.join(map(str, args.layer))}: the probe reads {site}; leave out --layer, or "
                        "fit a probe at the layer to steer")
    v = lens.steering_direction(probe)
    return prompt, lambda: S.direction_hooks(v, site, args.multiplier, args.min_token_index), \
        {"direction": v.tolist(), "site": site}, f"the probe {args.direction} at {site}, multiplier {args.multiplier:g}"


def latent(args, encoder, hparams, params):
    import sae as SAE

    sae = loading.load_sae(args.sae, args.models_dir, args.quiet)
    site = SAE.check_fits(sae, hparams)
    v = S.latent_vector(sae, args.latent, args.alpha)
    prompt = [encoder.eot] + encoder.encode(args.prompt)
    return prompt, lambda: S.add_everywhere_hooks(v, site), {"vector": v.tolist()}, \
        f"latent {args.latent} at {site}, alpha {args.alpha:g}"


def run(args):
    xp = array_module(args)  # numpy, or cupy once a GPU has answered: before the model is fetched
    encoder, hparams, params = loading.load_model(args.model, args.models_dir, args.base_url, quiet=args.quiet)
    params = on_device(xp, params, args.model)
    prompt, make_hooks, shown, title = {"add": act_add, "vector": vector, "latent": latent}[args.command](
        args, encoder, hparams, params)

    def write(make_hooks):
        return [int(t[0]) for t in S.generate_steered(
            prompt, params, hparams, make_hooks, args.n_tokens, args.temperature, args.top_k, args.top_p, args.min_p,
            args.seed, encoder.eot, kv_cache=not args.no_kv_cache)]

    with np.errstate(over="ignore", invalid="ignore"):  # an overflow further on is check_logits' to say, in one line
        ids = write(make_hooks)
    plain = None if args.json else write(dict)  # unsteered: no hooks, the same seed
    if args.logits:  # once all the generating is done: an interrupted command leaves no file
        logits = S.steered_logits(prompt + ids, params, hparams, make_hooks())
        with whole_file(args.logits, "the logits") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, logits.astype(np.float32))
    if args.json:
        print(json.dumps({"prompt_ids": prompt, "ids": ids, "text": encoder.decode(ids), **shown}))
        return
    print(f"++ steered: {title}\n{args.prompt}{encoder.decode(ids)}\n\n-- unsteered\n{args.prompt}"
          f"{encoder.decode(plain)}")
