"""The command line of train.py: flags, which model, messages and exit codes.

    python train.py --model 124M --data notes.txt --out models/notes-124M    fine-tune a model
    python train.py --from-scratch --out models/baby                         a new one, on Shakespeare
    python train.py --out models/notes-124M --resume --steps 400             go on with a saved run
    python train.py --model 1558M --data notes.txt --out models/n --lora-rank 8  LoRA: adapters on frozen weights
    python train.py --model 124M --data prefs.jsonl --out models/d --beta 0.1    DPO on preference pairs
    mpiexec -n 2 python train.py ... [--zero 1]       the same run on two processes (data_parallel.py)

Most flags are train.py's tables (RECIPE, NEW_MODEL, LORA), their defaults and help with them. The
command line checks them, finds the model by name (a released size, a folder, hf:owner/name: fetched
here, and a released size checked against the run before its download), then hands over to
train.set_up, which says where the weights and state come from, and train.train, the loop.
Exit status: 0 done, 2 a user's mistake (one line on stderr), 130 interrupted (Ctrl-C or
SIGTERM: in the loop, it first saves the steps done). Under mpiexec, rank 0 says the line, and a
mistake any rank finds during the set-up stops every rank (data_parallel.agreed).
"""
import argparse
import os
import sys
import tempfile

import numpy as np

import data_parallel
import dpo
import train
from interface import loading
from interface.options import array_module, at_least, device_flag, model_flags, number, restore_flags, threads_flag
from plumbing import corpus, mpi, shapes
from plumbing.errors import UserError, exit_status, fail, given_flags, plural, read_json
from plumbing.folders import check_new_folder, in_models_folder
from plumbing.memory import available_memory

FROM_SCRATCH = "from scratch"  # train_config.json's "model" for a run that began from nothing
NOT_SAVED = ("out", "resume", "quiet", "base_url", "device", "zero", "bucket_mb")  # the rest are the run's; any
# device, and any number of processes, resumes it
LORA_FLAGS = tuple(f"lora_{name}" for name in train.LORA)  # a resumed run keeps them: its adapters are their shape
DPO_FLAGS = ("beta", "dpo_loss", "reference")  # preference data's alone
# A billion micro-batches (--steps times --accum) is more than any run finishes: the smallest model there
# is, one layer one wide, takes milliseconds a step (docs/fine_tuning.md), so weeks of nothing else.
MOST_MICRO_BATCHES = 10 ** 9
FLOAT32_MAX = float(np.finfo(np.float32).max)  # a step size or weight above it is infinite in a float32 product


# ----------------------------------------------------------------------------
# The flags
# ----------------------------------------------------------------------------

class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each flag's default, except where there is none to show: a required flag, or
    one whose default depends on the run (None), which its help describes in words."""

    def _get_help_string(self, action):
        return action.help if action.required or action.default is None else super()._get_help_string(action)


def add_table(p, table, prefix="", what=""):
    """A flag for each of a train.py table's settings: --name (with prefix: --prefix-name), its
    type (a number read as every command reads one: options.py's), its default and its help (after
    `what`, the table's few words). check_flags says each one's range."""
    for name, (default, kind, text) in table.items():
        dest = prefix + name
        p.add_argument(f"--{dest.replace('_', '-')}", dest=dest, type={int: at_least(), float: number}.get(kind, kind),
                       default=default, help=what + text)


def parser():
    p = argparse.ArgumentParser(prog="train.py", description="Fine-tune GPT-2 in NumPy on documents, instruction "
                                                             "data or preference pairs (DPO), train a classifier on "
                                                             "labelled texts, or train one from nothing "
                                                             "(--from-scratch).",
                                formatter_class=DefaultsHelp, allow_abbrev=False)
    model_flags(p)
    p.add_argument("--data", help="documents: a UTF-8 .txt file, a folder of them, or a .jsonl of {\"text\": ...} "
                                  "lines; or instruction data: a .jsonl of {\"prompt\": ..., \"response\": ...} "
                                  "lines; labelled texts, {\"text\": ..., \"label\": ...} lines, which train a "
                                  "classifier; or preference pairs, {\"prompt\", \"chosen\", \"rejected\"} lines, "
                                  "for DPO (from scratch, if not given: data/tinyshakespeare.txt; with --resume: the "
                                  "saved run's)")
    p.add_argument("--out", required=True, help="the folder to write the trained model to")
    add_table(p, train.RECIPE)
    p.add_argument("--from-scratch", action="store_true", help="train a new model: learn its vocabulary from the "
                                                               "text, then GPT-2's initialisation (no --model)")
    add_table(p, train.NEW_MODEL, what="from scratch: ")
    add_table(p, train.LORA, prefix="lora_", what="LoRA: ")
    p.add_argument("--beta", type=float, help=f"DPO: how far the policy may go from the reference (default: "
                                              f"{train.PREFERENCE['beta']}, TRL's)")
    p.add_argument("--dpo-loss", help=f"DPO: sigmoid (log-probabilities summed over a completion: TRL's default) or "
                                      f"sigmoid_norm (each log-ratio divided by its completion's length; default: "
                                      f"{train.PREFERENCE['loss_type']})")
    p.add_argument("--reference", metavar="MODEL", help="DPO: the reference model, a size, a folder or hf:owner/name "
                                                        "with the same vocabulary and context (default: the starting "
                                                        "model, frozen; with --lora-rank, the base, adapters off)")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out, with its flags")
    p.add_argument("--quiet", action="store_true", help="no progress (a bar on a terminal, a line every 10 s "
                                                        "in a log)")
    threads_flag(p)
    device_flag(p)
    p.add_argument("--zero", type=at_least(0), default=0, metavar="STAGE", help="under mpiexec: 1 cuts each tensor's "
                   "AdamW moments in a slice for each process (ZeRO stage 1, docs/parallel.md); 0: each holds them all")
    p.add_argument("--bucket-mb", type=at_least(1), default=data_parallel.BUCKET_MB, help="under mpiexec: the "
                   "gradients are summed across the processes in buckets of about this many MB")
    p.error = fail
    return p


def check_flags(args):
    for name in ("steps", "batch_size", "context", "accum", "eval_every", "sample_every", "save_every"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name, ok, rule in (("val_fraction", 0 <= args.val_fraction < 1, "in [0, 1)"),
                           ("dropout", 0 <= args.dropout < 1, "in [0, 1)"),
                           ("lr", 0 < args.lr <= FLOAT32_MAX, f"above 0 and at most {FLOAT32_MAX:.3g} (float32's "
                                                                "largest: the weights are float32)"),
                           ("min_lr_ratio", 0 <= args.min_lr_ratio <= 1, "in [0, 1]"),
                           ("weight_decay", args.weight_decay >= 0, "at least 0"),
                           ("grad_clip", args.grad_clip >= 0, "at least 0 (0: never clip)"),
                           ("warmup", args.warmup is None or args.warmup >= 0, "at least 0")):
        if not ok or not np.isfinite(getattr(args, name) or 0):
            fail(f"--{name.replace('_', '-')} must be {rule}, got {getattr(args, name)}")
    for name in ("n_layer", "n_head", "n_embd"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 < args.beta2 < 1:
        fail(f"--beta2 must be in (0, 1), got {args.beta2}")
    if args.seed < 0:
        fail(f"--seed must be at least 0, got {args.seed}")
    if args.steps > MOST_MICRO_BATCHES:
        fail(f"--steps must be at most {MOST_MICRO_BATCHES:,}: no run finishes {args.steps:,} steps")
    if args.steps * args.accum > MOST_MICRO_BATCHES:
        fail(f"--steps {args.steps:,} --accum {args.accum:,} make {args.steps * args.accum:,} micro-batches: no run "
             f"finishes that many; --steps times --accum must be at most {MOST_MICRO_BATCHES:,}")
    if args.from_scratch and "model" in args.given:
        fail("--from-scratch trains a new model: leave out --model (to train a model further, give --model alone)")
    if not args.from_scratch and args.given & set(train.NEW_MODEL):
        *most, last = (f"--{name.replace('_', '-')}" for name in train.NEW_MODEL)
        fail(f"{', '.join(most)} and {last} go with --from-scratch")
    if args.from_scratch and args.n_embd % args.n_head:
        fail(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}: each head gets n_embd / n_head")
    if args.vocab_size is not None and args.vocab_size < 257:
        fail(f"--vocab-size must be at least 257 (256 bytes and <|endoftext|>), got {args.vocab_size}")
    if args.data is None and not args.resume and not args.from_scratch:
        fail("--data is required: a UTF-8 .txt file, a folder of them, or a .jsonl file")
    check_lora_flags(args)
    if args.beta is not None and not 0 < args.beta <= FLOAT32_MAX:
        fail(f"--beta must be above 0 and at most {FLOAT32_MAX:.3g} (float32's largest: each sequence's weight, "
             f"β σ(-β δ) / P, is float32), got {args.beta:g}")
    if args.dpo_loss is not None and args.dpo_loss not in dpo.LOSSES:
        fail(f"--dpo-loss: no loss {args.dpo_loss!r}: choose from {', '.join(dpo.LOSSES)}")
    if args.zero > 1:
        fail(f"--zero {args.zero}: ZeRO stage 1 (AdamW's moments in slices) is the one here: choose 0 or 1")


def check_preference_flags(args):
    """--beta, --dpo-loss and --reference only with preference data (read to tell, once its path is known)."""
    given = [f"--{name.replace('_', '-')}" for name in DPO_FLAGS if getattr(args, name) is not None]
    if given and not (args.data and corpus.read_corpus([args.data])[2] == "preference"):
        raise UserError(f"{' and '.join(given)} go with preference data (a .jsonl of {{\"prompt\", \"chosen\", "
                        f"\"rejected\"}} lines), which --data {args.data} is not")


def check_lora_flags(args):
    """--lora-rank R >= 1, the other LoRA flags only with it (with --resume, the saved run's flags decide:
    resumed_flags); --lora-targets in the order a block meets its layers, so that they compare as one."""
    if args.lora_rank is None and not args.resume and args.given & {"lora_alpha", "lora_targets"}:
        fail("--lora-alpha and --lora-targets go with --lora-rank")
    if args.lora_rank is not None and args.lora_rank < 1:
        fail(f"--lora-rank must be at least 1, got {args.lora_rank}")
    if args.lora_rank is not None and args.from_scratch:
        fail("--lora-rank fine-tunes a model's frozen weights: leave out --from-scratch")
    if args.lora_alpha is not None and not 0 < args.lora_alpha <= FLOAT32_MAX:
        fail(f"--lora-alpha must be above 0 and at most {FLOAT32_MAX:.3g} (float32's largest), got {args.lora_alpha}")
    targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in train.LORA_TARGETS]
    if unknown or not targets:
        fail(f"--lora-targets: no layer {unknown[0] if unknown else args.lora_targets!r} to adapt: choose from "
             f"{', '.join(train.LORA_TARGETS)}")
    args.lora_targets = ",".join(t for t in train.LORA_TARGETS if t in targets)


def parse_args(argv):
    p = parser()
    args = p.parse_args(argv)
    args.given = given_flags(p, argv)
    check_flags(args)
    return args


def check_out(out, resume):
    if resume and not os.path.exists(os.path.join(out, train.CONFIG_FILE)):
        raise UserError("holds no saved run to --resume", path=out)
    if not resume:
        check_new_folder(out, "choose a new folder, or --resume the run saved there", empty_ok=False)


def resumed_flags(args, saved):
    """The saved run's flags, except those given now; -> one line naming the ones that differ.
    The model cannot change: a resumed run continues the model saved in --out."""
    began = FROM_SCRATCH if saved.get("from_scratch") else f"from {saved.get('model', args.model)}"
    if "model" in args.given and (saved.get("from_scratch") or saved.get("model", args.model) != args.model):
        raise UserError(f"--resume continues the model saved in {args.out} (trained {began}): leave out "
                        f"--model {args.model}")
    for name in LORA_FLAGS:
        if name in args.given and getattr(args, name) != saved.get(name):
            how = (f"with its LoRA flags (--lora-rank {saved['lora_rank']} --lora-alpha {saved['lora_alpha']:g} "
                   f"--lora-targets {saved['lora_targets']})" if saved.get("lora_rank") else
                   "which trains every weight, without LoRA")
            raise UserError(f"--resume continues the run saved in {args.out}, {how}: leave out "
                            f"--{name.replace('_', '-')}")
    changed = restore_flags(args, saved, NOT_SAVED)
    return f"resuming with {', '.join(changed)}" if changed else None


def saved_flags(args, ready):
    """The run's flags as train_config.json keeps them, with what set_up worked out for the run (the
    context, the warm-up, a new model's vocabulary size, LoRA's alpha); a model from scratch says so,
    not --model's default."""
    config = {k: v for k, v in vars(args).items() if k not in NOT_SAVED + ("given",)}
    config |= {name: ready["recipe"][name] for name in train.RECIPE}
    if args.from_scratch:
        config |= {"model": FROM_SCRATCH, "vocab_size": ready["hparams"]["n_vocab"]}
    return config | ({"lora_alpha": ready["lora"]["alpha"]} if ready["lora"] else {})


# ----------------------------------------------------------------------------
# The model, by name, and the run
# ----------------------------------------------------------------------------

def fetched_model(args, recipe, lora):
    """--model's folder, fetched if it is not here; a released size is first checked against the run
    from its shape alone (the memory, a LoRA rank), so that a run that cannot be is refused before
    its download."""
    if args.model in shapes.SIZES:
        hparams = shapes.hparams(args.model)
        train.check_run(hparams, train.with_context(recipe, hparams), lora, available_memory())
    return loading.fetch_model(args.model, args.models_dir, args.base_url, quiet=args.quiet)


def run(args, comm=None):
    with in_models_folder(args.out, args.models_dir):  # --out models/baby on a fresh clone
        return run_in(args, comm)


def run_in(args, comm=None):
    """The run; comm: MPI's, when mpiexec started several processes (plumbing/mpi.py), this one a rank of it."""
    with data_parallel.agreed(comm):  # a mistake any rank finds stops every rank (data_parallel.py)
        xp = array_module(args)  # numpy, or cupy once a GPU has answered: before any work
        check_out(args.out, args.resume)
        if args.resume:
            note = resumed_flags(args, read_json(os.path.join(args.out, train.CONFIG_FILE)))
            if note:
                print(note, file=sys.stderr)
        check_preference_flags(args)
        check_ranks(args, comm, xp)
    recipe = train.recipe_with(**{name: getattr(args, name) for name in train.RECIPE})
    lora = {"rank": args.lora_rank, "alpha": args.lora_alpha, "targets": args.lora_targets.split(","),
            "base": args.model} if args.lora_rank else None
    new = {name: getattr(args, name) for name in train.NEW_MODEL} if args.from_scratch else None
    # a learned vocabulary waits here, beside --out, until each save copies it in
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(args.out)), prefix=".vocab-") as scratch:
        with data_parallel.agreed(comm):
            ready = train.set_up(args.out, recipe, [args.data] if args.data else None,
                                 base=lambda: fetched_model(args, recipe, lora), new=new, lora=lora,
                                 resume=args.resume, vocab_dir=os.path.join(scratch, "vocab"), quiet=args.quiet,
                                 preference=preference_settings(args), xp=xp)
        if ready["state"]["step"] >= recipe["steps"]:
            print(f"{args.out}: already trained for {plural(ready['state']['step'], 'step')}, nothing to do (a larger "
                  "--steps goes on)")
            return 0
        parallel = comm and data_parallel.parallel(comm, ready, args.zero, args.bucket_mb)
        code = train.train(ready, args.out, saved_flags(args, ready), quiet=args.quiet, parallel=parallel)
    if code == 0 and ready["train_data"]["kind"] == "labelled":
        print(f"{args.out}: trained to step {args.steps}; classify with python evaluate.py classify FILE --model "
              f"{args.out}")
    elif code == 0:
        print(f"{args.out}: trained to step {args.steps}; run it with python gpt2_numpy.py --model {args.out} "
              "\"prompt\"")
    return code


def preference_settings(args):
    """DPO's settings from the flags given (the others: train.PREFERENCE's); --reference fetched when needed."""
    reference = args.reference and (lambda: loading.language_model_folder(args.reference, args.models_dir,
                                                                          args.base_url, quiet=args.quiet))
    given = {"beta": args.beta, "loss_type": args.dpo_loss, "reference": reference}
    return {k: v for k, v in given.items() if v is not None}


def check_ranks(args, comm, xp):
    """Under mpiexec, each step's windows are cut among the processes: their number must divide them; the
    arrays stay on the CPU (docs/parallel.md: GPUs are a design); --zero 1 needs processes to cut among."""
    windows = args.batch_size * args.accum
    if comm is None and args.zero:
        raise UserError(f"--zero {args.zero} cuts AdamW's moments among processes: run it under mpiexec -n N, N > 1 "
                        "(docs/parallel.md)")
    if comm is not None and xp is not np:
        raise UserError("--device gpu on several processes is not written yet (docs/parallel.md says how it would "
                        "be): train on the CPUs, or on one GPU without mpiexec")
    if comm is not None and windows % comm.Get_size():
        raise UserError(f"{comm.Get_size()} processes cannot share a step's {windows} windows (--batch-size "
                        f"{args.batch_size} times --accum {args.accum}): choose a number that divides them")


def main(argv=None):
    comm = mpi.world() if argv is None else None  # MPI's, when mpiexec started several processes
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return exit_status(lambda: run(args, comm))  # Ctrl-C in the loop saves first; before it, it is one line
