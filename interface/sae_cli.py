"""The command line of sae.py: train an SAE, evaluate it as SAELens does, encode a text, read its features.

    python sae.py train    --site HOOK (--data FILE | --activations FILE.npy) --d-sae N --tokens K --out DIR
                           [--architecture standard|topk|batchtopk|jumprelu] [its flags: --l1 C, --k K, ...]
                           [--lr 3e-4] [--batch-tokens 4096] [--context 128] [--seed S] [--init SAE_DIR]
                           [--normalize-activations none|expected_average_only_in|constant_norm_rescale|layer_norm]
                           [--site-out HOOK [--skip-transcoder]]   a transcoder: from --site's activation to this one's
    python sae.py train    --out DIR --resume                   go on with a run stopped by Ctrl-C, bit for bit
    python sae.py eval     --sae SAE_DIR --data FILE [--json]
    python sae.py encode   --sae SAE_DIR --text T [--k 5] [--json]
    python sae.py features --sae SAE_DIR --data FILE [--feature I] [--json] [--html F]

Every command takes --model, --models-dir and --base-url, --center-writing-weights and --fold-ln (the model as
TransformerLens's fold_ln leaves its blocks: for a transcoder trained on TransformerLens's ln2.hook_normalized);
--sae is a folder or hf:owner/name/PATH from the Hub, of any architecture SAELens runs (docs/sae.md). A text is read in windows of --context tokens, <|endoftext|> first. Exit status: 0 done, 2 a user's
mistake (one line on stderr, before any work where it can be), 130 interrupted: train then saves the steps
done first, whole; nothing else is written unless the command ends well.
"""
import argparse
import contextlib
import html
import io
import json
import math
import os
import sys

import numpy as np

import data_parallel
import sae as S
from interface import loading
from interface.options import (CENTRED_HELP, FOLD_LN_HELP, array_module, at_least, check_output_file, device_flag,
                               folded, model_flags, number, on_device, restore_flags, threads_flag, user_message)
from plumbing import device, mpi, sae_files
from plumbing.errors import (Terminated, UserError, ctrl_c_waits, exit_status, fail, given_flags, plural, read_json,
                             read_text)
from plumbing.folders import check_new_folder, write_page
from plumbing.memory import available_memory, check_fits
from plumbing.progress import progress
from plumbing.safetensors_reader import load_file

NORMALIZE = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")


def common(p, data=True):
    model_flags(p)
    threads_flag(p)
    device_flag(p)
    p.add_argument("--context", type=at_least(2), default=128, help="tokens a window, <|endoftext|> first "
                                                                    "(default 128)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.add_argument("--center-writing-weights", action="store_true", help=CENTRED_HELP)
    p.add_argument("--fold-ln", action="store_true", help=FOLD_LN_HELP)
    if data:
        p.add_argument("--data", required=True, metavar="FILE", help="a UTF-8 text")


NOT_SAVED = ("command", "out", "resume", "quiet", "json", "threads", "base_url", "models_dir", "given", "comm")
FIXED = ("architecture", "site", "site_out", "skip_transcoder", "d_sae", "init", "data", "activations", "seed",
         "context", "batch_tokens", "normalize_activations", "model", "center_writing_weights")  # a resumed run is the same run: these stay
MOST_STEPS = 10 ** 9  # train.py's most micro-batches: no run finishes more
BOOLEAN = {"true": True, "false": False}
ARCH_FLAGS = {  # each architecture's flags, SAELens's config fields with dashes (standard's keep their names)
    "l1": ("standard",), "l1_warm_up": ("standard",),
    "k": ("topk", "batchtopk"), "aux_loss_coefficient": ("topk", "batchtopk"),
    "rescale_acts_by_decoder_norm": ("topk", "batchtopk"), "topk_threshold_lr": ("batchtopk",),
    "dead_feature_window": ("topk", "batchtopk", "jumprelu"),
    **dict.fromkeys(("l0_coefficient", "l0_warm_up_steps", "jumprelu_bandwidth", "jumprelu_init_threshold",
                     "jumprelu_sparsity_loss_mode", "jumprelu_tanh_scale", "pre_act_loss_coefficient",
                     "jumprelu_ste_to_input"), ("jumprelu",)),
}
SETTING = {"l1": "l1_coefficient", "l1_warm_up": "l1_warm_up_steps"}  # a flag's SAELens field, where it differs


def true_or_false(text):
    if text.lower() not in BOOLEAN:
        raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")
    return BOOLEAN[text.lower()]


def train_parser(commands):
    t = commands.add_parser("train", help="train an SAE on one hook point's activations", allow_abbrev=False)
    t.add_argument("--site", metavar="HOOK", help="the hook point, e.g. blocks.2.hook_resid_pre (with --init: its)")
    t.add_argument("--site-out", metavar="HOOK", help="train a transcoder: it reads --site and rebuilds this hook "
                                                      "point's activation, e.g. --site blocks.L.ln2.hook_normalized "
                                                      "--site-out blocks.L.hook_mlp_out (an MLP's input and output); "
                                                      "saved as SAELens's Transcoder (docs/sae.md)")
    t.add_argument("--skip-transcoder", action="store_true", help="with --site-out: and a skip connection, + x W_skipᵀ "
                                                                  "(SAELens's SkipTranscoder; not with topk)")
    t.add_argument("--data", metavar="FILE", help="a UTF-8 text, read through the model")
    t.add_argument("--activations", metavar="FILE.npy", help="[N, d_in] float32 activations, in this order (a "
                                                             "transcoder's [N, d_in + d_out]: input, then target)")
    t.add_argument("--d-sae", type=int, help="latents (with --init: its)")
    t.add_argument("--tokens", type=int, help="tokens to train on: tokens // batch-tokens steps")
    t.add_argument("--out", required=True, metavar="SAE_DIR", help="the SAE's folder, SAELens's format")
    t.add_argument("--resume", action="store_true", help="continue the run saved in --out, with its flags")
    t.add_argument("--architecture", choices=S.TRAINED_ARCHITECTURES, help="which latents fire (default standard; with "
                                                                     "--init: its)")
    t.add_argument("--lr", type=number, default=3e-4, help="Adam's learning rate (default 3e-4)")
    t.add_argument("--batch-tokens", type=at_least(1), default=4096, help="tokens a step (default 4096)")
    t.add_argument("--seed", type=at_least(0), default=0, help="the initialisation's and the shuffle's seed "
                                                                "(default 0)")
    t.add_argument("--init", metavar="SAE_DIR", help="start from a saved SAE (of any architecture, or a SAELens "
                                                     "trainer's checkpoint)")
    t.add_argument("--normalize-activations", "--normalize", choices=NORMALIZE, default="none",
                   help="expected_average_only_in: scale the activations to norm √d_in on average, the factor "
                        "folded into the weights at save; layer_norm, constant_norm_rescale: at run time, "
                        "saved in cfg.json (default none)")
    a = t.add_argument_group("standard")
    a.add_argument("--l1", type=number, help="the L1 coefficient, 0 or more (needed)")
    a.add_argument("--l1-warm-up", type=at_least(0), help="steps over which it grows from 0 (default 0)")
    a = t.add_argument_group("topk and batchtopk")
    a.add_argument("--k", type=number, help="latents a token (batchtopk: on average over the batch; default 100)")
    a.add_argument("--aux-loss-coefficient", type=number, help="AuxK's weight (default 1.0; SAELens takes no AuxK "
                                                               "under layer_norm or constant_norm_rescale: such a run "
                                                               "stops at the first dead latent)")
    a.add_argument("--rescale-acts-by-decoder-norm", type=true_or_false, metavar="true|false",
                   help="choose by h_i ‖W_dec[i]‖ (default true)")
    a.add_argument("--topk-threshold-lr", type=number, help="batchtopk: the running threshold's rate (default 0.01)")
    a = t.add_argument_group("jumprelu")
    a.add_argument("--l0-coefficient", type=number, help="the sparsity loss's coefficient (default 1.0)")
    a.add_argument("--l0-warm-up-steps", type=at_least(0), help="steps over which it grows from 0 (default 0)")
    a.add_argument("--jumprelu-bandwidth", type=number, help="ε, the pseudo-derivatives' width (default 0.05)")
    a.add_argument("--jumprelu-init-threshold", type=number, help="θ to begin with (default 0.01)")
    a.add_argument("--jumprelu-sparsity-loss-mode", choices=("step", "tanh"), help="the L0 counted "
                                                                                     "(step, default) or tanh's")
    a.add_argument("--jumprelu-tanh-scale", type=number, help="tanh's scale (default 4.0)")
    a.add_argument("--pre-act-loss-coefficient", type=number, help="the pre-activation loss on dead latents "
                                                                   "(default: none)")
    a.add_argument("--jumprelu-ste-to-input", type=true_or_false, metavar="true|false",
                   help="the pseudo-derivative to h too (default false)")
    t.add_argument("--dead-feature-window", type=at_least(0),
                   help="steps without firing that make a latent dead, for AuxK and the pre-activation loss "
                        "(default 1000)")
    common(t, data=False)
    return t


def parse_args(argv):
    p = argparse.ArgumentParser(prog="sae.py", allow_abbrev=False,
                                description="Sparse autoencoders on GPT-2, in NumPy, exactly as SAELens 6.54.12 "
                                            "(docs/sae.md).")
    commands = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    t = train_parser(commands)
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
        args.given = given_flags(t, argv)
        try:
            check_train_flags(args)
        except UserError as e:
            fail(str(e))
    if getattr(args, "html", None):
        check_output_file(args.html)
    return args


def flag(name):
    return f"--{name.replace('_', '-')}"


def check_architecture_flags(args, arch):
    """Each architecture's flags with it alone; standard's --l1 needed."""
    for name in sorted(args.given & set(ARCH_FLAGS)):
        if arch not in ARCH_FLAGS[name]:
            raise UserError(f"{flag(name)} goes with --architecture {' or '.join(ARCH_FLAGS[name])}, not {arch}")
    if arch == "standard" and args.l1 is None:
        raise UserError("--architecture standard needs --l1 C, the L1 coefficient")


def check_train_flags(args):
    """Every flag of train, before any work: with --resume, the saved run's flags first (resumed_flags)."""
    args.data_tokens, args.resumed_note = None, None
    if args.resume:
        resumed_flags(args)
    else:
        check_new_folder(args.out, "choose a new one, or --resume the run saved there")
        if (args.data is None) == (args.activations is None):
            fail("train needs one of --data FILE and --activations FILE.npy")
        if args.tokens is None:
            fail("train needs --tokens K, the tokens to train on")
        if args.init is None and (args.site is None or args.d_sae is None):
            fail("train needs --site and --d-sae (or --init SAE_DIR, whose they are)")
    if args.architecture or not args.init:  # else --init's folder says which, once read (starting_sae)
        check_architecture_flags(args, args.architecture or "standard")
    check_transcoder_flags(args)
    if args.d_sae is not None and args.d_sae < 1:
        fail(f"--d-sae must be at least 1, got {args.d_sae}")
    for name, ok, rule in (("lr", lambda v: v > 0, "above 0"), ("l1", lambda v: v >= 0, "0 or more"),
                           ("aux_loss_coefficient", lambda v: v >= 0, "0 or more"),
                           ("topk_threshold_lr", lambda v: 0 <= v <= 1, "in [0, 1]"),
                           ("l0_coefficient", lambda v: v >= 0, "0 or more"),
                           ("jumprelu_bandwidth", lambda v: v > 0, "above 0"),
                           ("jumprelu_init_threshold", lambda v: v >= 0, "0 or more"),
                           ("jumprelu_tanh_scale", lambda v: v > 0, "above 0"),
                           ("pre_act_loss_coefficient", lambda v: v >= 0, "0 or more"),
                           ("k", lambda v: v > 0, "above 0")):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and ok(value)):
            fail(f"{flag(name)} must be a finite number {rule}, got {value}")
    if args.architecture == "topk" and args.k is not None and args.k != int(args.k):
        fail(f"--k must be a whole number for topk (batchtopk's may be a fraction), got {args.k}")
    if args.k is not None and args.d_sae is not None and args.k > args.d_sae:
        fail(f"--k {args.k:g} is more than the --d-sae {args.d_sae} latents")
    if args.tokens < args.batch_tokens:
        fail(f"--tokens {args.tokens} is too few for one batch of --batch-tokens {args.batch_tokens}")
    if args.tokens // args.batch_tokens > MOST_STEPS:
        fail(f"--tokens {args.tokens:,} makes {args.tokens // args.batch_tokens:,} steps of --batch-tokens "
             f"{args.batch_tokens:,}: no run finishes that many; at most {MOST_STEPS:,}")


def check_transcoder_flags(args):
    """--site-out (a transcoder) and --skip-transcoder: what SAELens can read back, and what sae.py trains."""
    if args.skip_transcoder and not args.site_out:
        fail("--skip-transcoder goes with --site-out HOOK: a transcoder's skip connection")
    if not args.site_out:
        return
    if args.init:
        fail("--site-out trains a new transcoder: leave out --init (--resume continues a run)")
    if args.site_out == args.site:
        fail(f"--site-out is --site {args.site}: an SAE rebuilds what it reads, so leave out --site-out")
    if args.architecture == "topk" and args.skip_transcoder:
        fail("SAELens has no TopK skip transcoder to read one back: leave out --skip-transcoder, or choose another "
             "--architecture")
    if args.normalize_activations == "expected_average_only_in":
        fail("a transcoder trains with --normalize-activations none, layer_norm or constant_norm_rescale: "
             "expected_average_only_in's factor is folded into an SAE's decoder, and a transcoder's output is not "
             "scaled")
    if args.architecture == "topk" and args.normalize_activations != "none":
        fail(f"a TopK transcoder is read back as SAELens's topk SAE, which de-normalises its output: train it with "
             f"--normalize-activations none, not {args.normalize_activations}")


def resumed_flags(args):
    """--resume: the flags saved in OUT's train_config.json, except those given now, which may change the
    run's length (--tokens) and its coefficients, not what makes it the same run (FIXED)."""
    path = os.path.join(args.out, CONFIG_FILE)
    if not os.path.isfile(path):
        fail(f"{args.out}: holds no saved run to --resume (no {CONFIG_FILE})")
    saved = read_json(path)
    changed = restore_flags(args, saved, NOT_SAVED, FIXED)
    args.data_tokens = saved.get("data_tokens")
    args.resumed_note = f"resuming with {', '.join(changed)}" if changed else None


def main(argv=None):
    comm = mpi.world() if argv is None else None  # MPI's, when mpiexec started several processes: train shares
    args = parse_args(sys.argv[1:] if argv is None else argv)  # each batch among them (data_parallel.py)
    args.comm = comm
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
    hooks = S.centring_hooks(hparams["n_layer"]) if args.center_writing_weights else {}
    return encoder, hparams, on_device(xp, folded(args, params), args.model), hooks


def text_windows(encoder, path, context, params):
    ids = encoder.encode(read_text(path))
    return S.windows(ids, min(context, params["wpe"].shape[0]), encoder.eot)


def meter(args, total, unit, initial=0):
    return progress(total, unit, quiet=args.quiet or args.json, initial=initial)


# ----------------------------------------------------------------------------
# train
# ----------------------------------------------------------------------------

CONFIG_FILE, STATE_FILE, LOG_FILE = "train_config.json", "train_state.npz", "train_log.jsonl"  # as train.py's


def training_data(args, encoder, params, hparams, hooks, site, d_in, needed, site_out=None, d_out=0):
    """The activations to train on: [n, d_in] float32, --activations' in their order, or the text's through
    the model, shuffled (SAELens shuffles its activations' buffer) and no more than the run needs. A transcoder's
    (site_out) are [n, d_in + d_out], each row its input and then its target. Every one a number (finite_rows)."""
    width = d_in + d_out
    if args.activations:
        try:
            x = np.load(args.activations, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise UserError(f"is not a .npy array ({e})", path=args.activations) from None
        if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != width:
            widths = f"{site}'s width" + (f" and {site_out}'s, each row the input then the target" if d_out else "")
            raise UserError(f"must be [N, {width}] float32 ({widths}), is {list(x.shape)} {x.dtype}",
                            path=args.activations)
        return finite_rows(x, args.activations)
    rows = text_windows(encoder, args.data, args.context, params)
    rows = rows[:-(-needed // rows.shape[1])]
    with meter(args, len(rows), "window") as bar:
        acts = S.gather_all(rows, params, hparams, [site, site_out] if d_out else site, progress=bar.update,
                            hooks=hooks)
    x = device.host(acts).reshape(-1, width)  # on the host, as --activations' are: a batch at a time goes over
    return finite_rows(x[np.random.default_rng(args.seed).permutation(len(x))], f"the model's activations at {site}")


def finite_rows(x, where, rows=1 << 16):
    """x, once every number in it is finite: a NaN or an infinity would make the SAE's every weight NaN at the
    step that reads it, so it is refused before any (a file read a block of rows at a time). where: the file, or
    what the activations are, as the message's start. -> x"""
    for start in range(0, len(x), rows):
        bad = ~np.isfinite(x[start:start + rows]).all(-1)
        if bad.any():
            i = start + int(np.argmax(bad))
            raise UserError(f"row {i} holds {x[i][~np.isfinite(x[i])][0]}: an SAE trains on finite numbers alone",
                            path=where)
    return x


def settings_of(args, arch):
    """The architecture's SAELens config fields: the flags given (or saved), else SAELens's defaults."""
    settings = {"architecture": arch, **S.TRAINING_DEFAULTS[arch]}
    for name, archs in ARCH_FLAGS.items():
        if arch in archs and getattr(args, name) is not None:
            settings[SETTING.get(name, name)] = getattr(args, name)
    if arch == "topk":
        settings["k"] = int(settings["k"])
    if arch != "standard":
        settings["dead_feature_window"] = (args.dead_feature_window if args.dead_feature_window is not None
                                           else S.DEAD_FEATURE_WINDOW)
    return settings


def trainer_checkpoint(folder):
    """A SAELens BatchTopK trainer's checkpoint (its training SAE's save_model): cfg.json says "batchtopk", and
    sae_weights.safetensors holds the weights unfolded and the running topk_threshold. -> (sae, topk_threshold)"""
    cfg = read_json(os.path.join(folder, sae_files.CFG))
    path = os.path.join(folder, sae_files.WEIGHTS)
    if not os.path.isfile(path):
        raise UserError(f"is not a whole SAE folder: it has {sae_files.CFG} but no {sae_files.WEIGHTS}", path=folder)
    tensors, _ = load_file(path)
    sae = {"cfg": {**{k: cfg.get(k) for k in ("d_in", "d_sae", "apply_b_dec_to_input", "normalize_activations",
                                               "k", "rescale_acts_by_decoder_norm")},
                   "metadata": dict(cfg.get("metadata") or {}), "architecture": "batchtopk"}}
    for name, dims in ((k, sae_files.TENSORS[k]) for k in S.PARAMS):
        want = tuple(cfg.get("d_in" if d == "d_out" else d) for d in dims)
        if name not in tensors or tuple(tensors[name].shape) != want:
            raise UserError(f"{name} must be {list(want)}", path=path)
        sae[name] = np.array(tensors[name], dtype=np.float32)
    if "topk_threshold" not in tensors or tensors["topk_threshold"].size != 1:
        raise UserError("is a batchtopk trainer's checkpoint without its topk_threshold", path=path)
    return sae, float(np.asarray(tensors["topk_threshold"], np.float64))


def initial_sae(args):
    """--init's SAE: a folder of any architecture, or a SAELens BatchTopK trainer's checkpoint.
    -> (sae, BatchTopK's running threshold to start from)"""
    cfg_path = os.path.join(args.init, sae_files.CFG)
    if os.path.isfile(cfg_path) and (read_json(cfg_path) or {}).get("architecture") == "batchtopk":
        return trainer_checkpoint(args.init)
    return loading.load_sae(args.init, args.models_dir, args.quiet), 0.0


def starting_sae(args, hparams):
    """The SAE a run starts from: --init's, or a new one of --architecture. -> (sae, settings, BatchTopK's
    running threshold)"""
    topk_threshold = 0.0
    if args.init:
        sae, topk_threshold = initial_sae(args)
        site = S.check_fits(sae, hparams)
        arch = sae["cfg"].get("architecture", "standard")
        if arch.endswith("transcoder") or S.hook_name_out(sae) != site:
            raise UserError(f"is a transcoder (from {site} to {S.hook_name_out(sae)}): --init continues an SAE; "
                            "--site-out trains a new transcoder, and --resume continues a run", path=args.init)
        if arch not in S.TRAINED_ARCHITECTURES:
            raise UserError(f"is a {arch} SAE: sae.py trains {', '.join(S.TRAINED_ARCHITECTURES)}", path=args.init)
        if args.architecture and args.architecture != arch:
            raise UserError(f"--init's SAE is a {arch} one: leave out --architecture {args.architecture}")
        if args.site and args.site != site:
            raise UserError(f"--init's SAE reads {site}, not --site {args.site}")
        if args.d_sae is not None and args.d_sae != sae["cfg"]["d_sae"]:
            raise UserError(f"--init's SAE has {sae['cfg']['d_sae']} latents, not --d-sae {args.d_sae}")
        if arch == "jumprelu" and "threshold" not in sae:
            raise UserError("is a jumprelu SAE without its threshold", path=args.init)
        check_architecture_flags(args, arch)
        for name in ("k", "rescale_acts_by_decoder_norm"):  # a TopK's own, unless given
            if sae["cfg"].get(name) is not None and arch in ARCH_FLAGS[name] and name not in args.given:
                setattr(args, name, sae["cfg"][name])
        if "normalize_activations" not in args.given:
            args.normalize_activations = sae["cfg"].get("normalize_activations", "none")
        settings = settings_of(args, arch)
    else:
        d_in = S.check_site(args.site, hparams)
        metadata = {"hook_name": args.site, "model_name": os.path.basename(os.path.normpath(args.model)),
                    "context_size": min(args.context, hparams["n_ctx"]), "prepend_bos": True}
        settings = settings_of(args, args.architecture or "standard")
        if args.site_out:
            sae = new_transcoder(args, hparams, d_in, settings, metadata)
        else:
            check_memory(args, d_in, args.d_sae)
            sae = S.new_training_sae(d_in, args.d_sae, settings, seed=args.seed, metadata=metadata)
    sae["cfg"]["normalize_activations"] = args.normalize_activations
    if "k" in settings and settings["k"] > sae["cfg"]["d_sae"]:
        raise UserError(f"--k {settings['k']:g} is more than the SAE's {sae['cfg']['d_sae']} latents")
    return sae, settings, topk_threshold


def new_transcoder(args, hparams, d_in, settings, metadata):
    """A new transcoder from --site to --site-out (SAELens's TopK SAE, which a TopK one is saved as, decodes d_in
    wide)."""
    d_out = S.check_site(args.site_out, hparams)
    if settings["architecture"] == "topk" and d_out != d_in:
        raise UserError(f"a TopK transcoder is read back as SAELens's topk SAE, which writes as many numbers as it "
                        f"reads: {args.site} has {d_in}, --site-out {args.site_out} {d_out}")
    check_memory(args, d_in, args.d_sae, d_out)
    return S.new_transcoder(d_in, d_out, args.d_sae, settings, args.seed, {**metadata, "hook_name_out": args.site_out},
                            args.skip_transcoder)


def check_memory(args, d_in, d_sae, d_out=0):
    """A transcoder's as an SAE's of its wider side, its activations' pairs as that many more numbers."""
    data = 0 if args.activations else (args.data_tokens or args.tokens) * (d_in + d_out) // d_in
    check_fits(S.training_memory(max(d_in, d_out), d_sae, args.batch_tokens, data), available_memory(),
               f"training {d_sae:,} latents of {d_in} at --batch-tokens {args.batch_tokens:,}",
               "choose a smaller --d-sae, --batch-tokens or --tokens")


def train(args):
    comm = getattr(args, "comm", None)  # several processes: each a part of every batch (data_parallel.py)
    with data_parallel.agreed(comm):
        if comm and args.batch_tokens % comm.Get_size():
            raise UserError(f"{comm.Get_size()} processes cannot share --batch-tokens {args.batch_tokens}: choose a "
                            "number of processes that divides it")
        encoder, hparams, params, hooks = model(args)
        if comm and device.on_device(params["wte"]):
            raise UserError("--device gpu on several processes is not written yet (docs/parallel.md): train on the "
                            "CPUs, or on one GPU without mpiexec")
        if args.resume and args.resumed_note:
            print(args.resumed_note, file=sys.stderr)
        sae, settings, topk_threshold = starting_sae(args, hparams)
        site, d_in, d_sae = S.hook_name(sae), sae["cfg"]["d_in"], sae["cfg"]["d_sae"]
        site_out = sae["cfg"]["metadata"].get("hook_name_out")  # a transcoder's
        d_out = sae["cfg"]["d_out"] if site_out else 0
        check_memory(args, d_in, d_sae, d_out)
        steps = args.tokens // args.batch_tokens
        data_tokens = args.data_tokens or steps * args.batch_tokens  # a resumed run reads the first run's data
        x = training_data(args, encoder, params, hparams, hooks, site, d_in, data_tokens, site_out, d_out)
        if len(x) < 1:
            raise UserError("gives no activations to train on", path=args.data or args.activations)
        state, log = S.new_training_state(sae), []
        state["topk_threshold"] = topk_threshold
        factor = S.scaling_factor(np.asarray(x)) if args.normalize_activations == "expected_average_only_in" else None
        if args.resume:
            factor, log = resumed_state(args.out, sae, state)
    if state["step"] >= steps:
        print(f"{args.out}: already trained for {plural(state['step'], 'step')}, nothing to do (a larger --tokens "
              "goes on)")
        return 0
    config = {k: v for k, v in vars(args).items() if k not in NOT_SAVED + ("data_tokens", "resumed_note")}
    config |= {"architecture": settings["architecture"], "site": site, "d_sae": d_sae, "data_tokens": data_tokens}
    first = state["step"]
    try:
        if not args.quiet:
            where = f"of a transcoder from {site} to {site_out}" if site_out else f"at {site}"
            print(f"training {d_sae:,} {settings['architecture']} latents {where} on {len(x):,} activations: "
                  f"{steps:,} steps of {args.batch_tokens:,}" + (f", from step {first:,}" if first else ""),
                  file=sys.stderr, flush=True)
        with meter(args, steps, "step", initial=first) as bar:
            for step in range(first, steps) if comm is None else data_parallel.steps_together(comm, first, steps):
                at = (np.arange(args.batch_tokens) + step * args.batch_tokens) % len(x)  # round again if short
                if comm is not None:  # this rank's contiguous part of the batch
                    at = at[slice(*data_parallel.share(len(at), comm.Get_size(), comm.Get_rank()))]
                batch = np.asarray(x[at], dtype=np.float32)
                if factor is not None:
                    batch *= np.float32(factor)
                coefficient = step_coefficient(settings, step)
                # a step is done whole, and logged, or not begun (several processes: data_parallel's steps); an
                # overflow is Diverged's to say, in one line
                target = batch[:, d_in:] if d_out else None
                with ctrl_c_waits() if comm is None else contextlib.nullcontext(), \
                        np.errstate(over="ignore", invalid="ignore"):
                    losses = (S.training_step(batch[:, :d_in], sae, state, args.lr, settings, coefficient, target)
                              if comm is None else data_parallel.sae_step(comm, batch[:, :d_in], sae, state, args.lr,
                                                                          settings, coefficient, target))
                    log.append({"step": step, **losses, "coefficient": coefficient, "lr": args.lr}
                               | ({"ranks": comm.Get_size()} if comm else {}))
                bar.set_postfix(mse=f"{losses['mse_loss']:.4g}", loss=f"{losses['loss']:.4g}",
                                l0=f"{losses['l0']:.1f}")
                bar.update()
    except KeyboardInterrupt as e:
        what = "terminated" if isinstance(e, Terminated) else "interrupted"
        if state["step"] == first:
            print(f"\n{what} before a step was done: nothing {'new ' if first else ''}was saved", file=sys.stderr)
        else:
            data_parallel.said_once(comm, lambda: save(args.out, sae, settings, state, factor, log, config))
            print(f"\n{what}: saved step {state['step']} in {args.out}; --resume continues", file=sys.stderr)
        return 130
    except (S.Diverged, S.NoAuxK) as e:
        raise refused_step(e, args, first, state,
                           lambda: S.inference_sae(sae, settings, state["topk_threshold"], factor),
                           lambda: data_parallel.said_once(comm, lambda: save(args.out, sae, settings, state, factor,
                                                                              log, config))) from None
    data_parallel.said_once(comm, lambda: save(args.out, sae, settings, state, factor, log, config))
    if args.json:
        print(json.dumps({"out": args.out, "steps": len(log), "tokens": len(log) * args.batch_tokens,
                          "last": log[-1] if log else None}))
    elif not args.quiet:
        print(f"{args.out}: {len(log)} steps, {len(log) * args.batch_tokens:,} tokens", file=sys.stderr)
    return 0


def refused_step(e, args, first, state, inference, save_run):
    """A step that could not be taken (S.Diverged: its loss or gradient not finite; S.NoAuxK): the steps before
    it saved (save_run), as train.py saves a diverged run's, unless there are none or the SAE they made
    (inference(): as it would be saved, a TopK's decoder norms folded in) is not finite. -> the UserError that
    says so, in one line, with what to change."""
    with np.errstate(over="ignore", invalid="ignore"):  # weights of 1e30 overflow as they are folded: said here
        good = state["step"] > first and all(np.isfinite(v).all() for k, v in inference().items() if k != "cfg")
        if good:
            save_run()
    saved = f"saved step {state['step']} in {args.out}" if good else f"nothing {'new ' if first else ''}was saved"
    if isinstance(e, S.Diverged):
        return UserError(f"{e}; {saved}; the likely cause: --lr {args.lr:g} too large")
    return UserError(f"step {state['step'] + 1}: {e}; {saved}; --resume goes on with --aux-loss-coefficient 0 or a "
                     "larger --dead-feature-window")


def step_coefficient(settings, step):
    """This step's l1 (standard) or l0 (JumpReLU) coefficient, warmed up as SAELens's CoefficientScheduler."""
    for value, warm_up in (("l1_coefficient", "l1_warm_up_steps"), ("l0_coefficient", "l0_warm_up_steps")):
        if value in settings:
            return S.l1_coefficient(step, settings[value], settings[warm_up] or 0)
    return 0.0


def save(out, sae, settings, state, factor, log, config):
    """OUT, whole: the inference SAE as SAELens's save_inference_model writes it, train_log.jsonl, and what
    --resume reads back: the run's flags (train_config.json) and the trainer's state as it is (train_state.npz:
    the weights unfolded, Adam's moments, the firing counts, BatchTopK's threshold, the normalisation's factor)."""
    inference = S.inference_sae(sae, settings, state["topk_threshold"], factor)
    arrays = {f"param/{k}": sae[k] for k in S.trained(sae)}
    arrays |= {f"m/{k}": a for k, a in state["m"].items()} | {f"v/{k}": a for k, a in state["v"].items()}
    buffer = io.BytesIO()
    np.savez(buffer, step=np.int64(state["step"]), since_fired=state["since_fired"],
             topk_threshold=np.float64(state["topk_threshold"]),
             factor=np.float64(np.nan if factor is None else factor), **arrays)
    lines = "".join(json.dumps(entry) + "\n" for entry in log)
    sae_files.save_sae(out, inference, {LOG_FILE: lines, CONFIG_FILE: json.dumps(config, indent=1),
                                        STATE_FILE: buffer.getvalue()})


def resumed_state(out, sae, state):
    """The trainer's state saved in OUT, into sae and state. -> (the normalisation's factor, the log so far)"""
    path = os.path.join(out, STATE_FILE)
    try:
        with np.load(path, allow_pickle=False) as z:
            for k in S.trained(sae):
                if z[f"param/{k}"].shape != sae[k].shape:
                    raise UserError(f"holds a {k} of {list(z[f'param/{k}'].shape)}, not {list(sae[k].shape)}",
                                    path=path)
                sae[k] = z[f"param/{k}"].copy()
                state["m"][k], state["v"][k] = z[f"m/{k}"].copy(), z[f"v/{k}"].copy()
            state["step"], state["since_fired"] = int(z["step"]), z["since_fired"].copy()
            state["topk_threshold"], factor = float(z["topk_threshold"]), float(z["factor"])
    except (OSError, KeyError, ValueError) as e:
        raise UserError(f"is not a whole saved run ({e})", path=path) from None
    with open(os.path.join(out, LOG_FILE), encoding="utf-8") as f:
        log = [json.loads(line) for line in f if line.strip()][:state["step"]]
    return (None if math.isnan(factor) else factor), log


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
    x, target = (a[0] for a in S.gather(ids, params, hparams, [site, S.hook_name_out(sae)], hooks))
    x_hat, f, _ = S.forward(x, sae)
    error = ((x_hat - target) ** 2).sum(-1)  # a transcoder's: against the activation where it writes
    tokens = [encoder.decode([int(t)]) for t in ids[0]]
    positions = []
    for row, err in zip(f, error):
        top = np.argsort(-row, kind="stable")[:args.k]
        top = top[row[top] > 0]
        positions.append({"ids": top.tolist(), "values": row[top].tolist(), "error": float(err)})
    if args.json:
        print(json.dumps({"tokens": tokens, "positions": positions}))
        return
    print(f"{'token':<16} {'‖x - x̂‖²':<10} the largest latents, index:value  (‖x - x̂‖²: the SAE's squared "
          "error at the position, summed over d_in)")
    for token, p in zip(tokens, positions):
        latents = "  ".join(f"{i}:{v:.3g}" for i, v in zip(p["ids"], p["values"])) or "(none)"
        print(f"{token!r:<16} {p['error']:<10.4g} {latents}")


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
    if args.feature:  # the latents asked for, whole: their contexts and both lists of tokens
        for r in shown:
            print(f"latent {r['feature']}: firing density {r['density']:.4g}")
            for c in r["contexts"] or [None]:
                print(f"  {c['value']:>9.4g}  {c['before']!r} [{c['token']!r}] {c['after']!r}" if c else
                      "  never fires on this text")
            for name in ("promotes", "suppresses"):
                print(f"  {name:<10} " + " ".join(f"{t!r} {v:+.3g}" for t, v in r[name]))
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
