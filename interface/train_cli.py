"""The command line of train.py: flags, which model and which text, messages and exit codes.

    python train.py --model 124M --data notes.txt --out models/notes-124M    fine-tune a model
    python train.py --from-scratch --out models/baby                         a new one, on Shakespeare
    python train.py --out models/notes-124M --resume --steps 400             go on with a saved run
    python train.py --model 1558M --data notes.txt --out models/n --lora-rank 8  LoRA: adapters on frozen weights

The flags become train.py's explicit arguments: the model (a released size, a folder,
hf:owner/name, a new one, or the run saved in --out), the text's ids, the optimizer's state,
and then train.train, the loop. Exit status: 0 done, 2 a user's mistake (one line on stderr),
130 interrupted (Ctrl-C or SIGTERM: in the loop, it first saves the steps done).
"""
import argparse
import os
import sys
import tempfile

import numpy as np

import bpe
from initialise import init_params
from optimizer import new_adamw_state
import parameters
import train
from interface import loading
from interface.options import model_flags
from plumbing import corpus, peft_adapter, shapes
from plumbing.checkpoint import check_writable
from plumbing.errors import UserError, exit_status, fail, given_flags, read_json
from plumbing.folders import check_new_folder
from plumbing.memory import available_memory
from plumbing.weights import load_weights

DEFAULT_CONTEXT = 256  # tokens a training window holds, unless the model has fewer positions
FROM_SCRATCH = "from scratch"  # train_config.json's "model" for a run that began from nothing
RECIPE = ("steps", "batch_size", "context", "accum", "lr", "min_lr_ratio", "warmup", "weight_decay", "grad_clip",
          "dropout", "seed", "beta2")  # train_step's settings, as flags
NOT_SAVED = ("out", "resume", "quiet", "base_url")  # every other flag is the run's, and --resume reads it back
LORA_FLAGS = ("lora_rank", "lora_alpha", "lora_targets")  # a resumed run keeps them: its adapters are their shape


# ----------------------------------------------------------------------------
# The flags
# ----------------------------------------------------------------------------

class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each flag's default, except where there is none to show: a required flag, or
    one whose default depends on the run (None), which its help describes in words."""

    def _get_help_string(self, action):
        return action.help if action.required or action.default is None else super()._get_help_string(action)


def parser():
    p = argparse.ArgumentParser(prog="train.py", description="Fine-tune GPT-2 in NumPy on documents or instruction "
                                                             "data, or train one from nothing (--from-scratch).",
                                formatter_class=DefaultsHelp, allow_abbrev=False)
    model_flags(p)
    p.add_argument("--data", help="documents: a UTF-8 .txt file, a folder of them, or a .jsonl of {\"text\": ...} "
                                  "lines; or instruction data: a .jsonl of {\"prompt\": ..., \"response\": ...} "
                                  "lines (from scratch, if not given: data/tinyshakespeare.txt; with --resume: the "
                                  "saved run's)")
    p.add_argument("--out", required=True, help="the folder to write the trained model to")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in all")
    p.add_argument("--batch-size", type=int, default=4, help="windows a micro-batch holds")
    p.add_argument("--context", type=int, help=f"tokens a training window holds (default: {DEFAULT_CONTEXT}, or the "
                                               "model's n_ctx if it has fewer positions)")
    p.add_argument("--accum", type=int, default=1, help="micro-batches a step accumulates (a larger batch in the "
                                                        "same memory)")
    p.add_argument("--lr", type=float, default=1e-4, help="the peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="the cosine decays to lr times this")
    p.add_argument("--warmup", type=int, help="steps of linear warm-up (default: a tenth of --steps, at most 20)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW's decay, on matrices and embeddings")
    p.add_argument("--grad-clip", type=float, default=1.0, help="clip gradients to this global norm (0: never)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability (GPT-2 was trained with 0.1; "
                                                              "fine-tuning usually uses 0)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="the end of the data held out for validation (the "
                                                                   "last documents or examples, at least one)")
    p.add_argument("--eval-every", type=int, default=50, help="print the validation loss every N steps (and at "
                                                              "the end)")
    p.add_argument("--sample-every", type=int, default=100, help="print a short sample every N steps")
    p.add_argument("--save-every", type=int, default=100, help="save a checkpoint every N steps (and at the end)")
    p.add_argument("--beta2", type=float, default=0.999, help="AdamW's decay of the squared gradients' mean "
                                                            "(nanoGPT's small models use 0.99)")
    p.add_argument("--seed", type=int, default=0, help="the same seed gives the same run, bit for bit")
    p.add_argument("--from-scratch", action="store_true", help="train a new model: learn its vocabulary from the "
                                                               "text, then GPT-2's initialisation (no --model)")
    p.add_argument("--vocab-size", type=int, help="from scratch: ids in the vocabulary (257: bytes alone; default: "
                                                  "257, or --tokenizer's)")
    p.add_argument("--tokenizer", help="from scratch: a folder with encoder.json and vocab.bpe to use instead of "
                                       "learning one")
    p.add_argument("--n-layer", type=int, default=4, help="from scratch: blocks")
    p.add_argument("--n-head", type=int, default=4, help="from scratch: attention heads a block")
    p.add_argument("--n-embd", type=int, default=128, help="from scratch: the residual stream's width")
    p.add_argument("--lora-rank", type=int, help="LoRA: train rank-R adapters beside frozen weights instead of every "
                                                 "weight (PEFT's r, e.g. 8); --out is the merged model, with the "
                                                 "adapter in PEFT's format beside it")
    p.add_argument("--lora-alpha", type=float, help="LoRA: the adapters' update is scaled by alpha / rank (default: "
                                                    "the rank, a scale of 1)")
    p.add_argument("--lora-targets", default="c_attn", help="LoRA: the layers adapted, from "
                                                            f"{','.join(train.LORA_TARGETS)} (c_proj: the "
                                                            "attention's and the MLP's)")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out, with its flags")
    p.add_argument("--quiet", action="store_true", help="no progress (a bar on a terminal, a line every 10 s "
                                                        "in a log)")
    p.error = fail
    return p


def check_flags(args):
    for name in ("steps", "batch_size", "context", "accum", "eval_every", "sample_every", "save_every"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1")
    for name, ok, rule in (("val_fraction", 0 <= args.val_fraction < 1, "in [0, 1)"),
                           ("dropout", 0 <= args.dropout < 1, "in [0, 1)"),
                           ("lr", args.lr > 0, "above 0"),
                           ("min_lr_ratio", 0 <= args.min_lr_ratio <= 1, "in [0, 1]"),
                           ("weight_decay", args.weight_decay >= 0, "at least 0"),
                           ("grad_clip", args.grad_clip >= 0, "at least 0 (0: never clip)"),
                           ("warmup", args.warmup is None or args.warmup >= 0, "at least 0")):
        if not ok or not np.isfinite(getattr(args, name) or 0):
            fail(f"--{name.replace('_', '-')} must be {rule}")
    for name in ("n_layer", "n_head", "n_embd"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.beta2 < 1:
        fail("--beta2 must be in (0, 1)")
    if args.from_scratch and "model" in args.given:
        fail("--from-scratch trains a new model: leave out --model (to train a model further, give --model alone)")
    if not args.from_scratch and args.given & {"vocab_size", "tokenizer", "n_layer", "n_head", "n_embd"}:
        fail("--vocab-size, --tokenizer, --n-layer, --n-head and --n-embd go with --from-scratch")
    if args.from_scratch and args.n_embd % args.n_head:
        fail(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}: each head gets n_embd / n_head")
    if args.vocab_size is not None and args.vocab_size < 257:
        fail(f"--vocab-size must be at least 257 (256 bytes and <|endoftext|>), got {args.vocab_size}")
    if args.data is None and not args.resume and not args.from_scratch:
        fail("--data is required: a UTF-8 .txt file, a folder of them, or a .jsonl file")
    check_lora_flags(args)


def check_lora_flags(args):
    """--lora-rank R >= 1, the other LoRA flags only with it (with --resume, the saved run's flags decide:
    resumed_flags); --lora-targets in the order a block meets its layers, so that they compare as one."""
    if args.lora_rank is None and not args.resume and args.given & {"lora_alpha", "lora_targets"}:
        fail("--lora-alpha and --lora-targets go with --lora-rank")
    if args.lora_rank is not None and args.lora_rank < 1:
        fail(f"--lora-rank must be at least 1, got {args.lora_rank}")
    if args.lora_rank is not None and args.from_scratch:
        fail("--lora-rank fine-tunes a model's frozen weights: leave out --from-scratch")
    if args.lora_alpha is not None and not (args.lora_alpha > 0 and np.isfinite(args.lora_alpha)):
        fail("--lora-alpha must be above 0")
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
    changed = []
    for name, value in saved.items():
        if name in NOT_SAVED or not hasattr(args, name):
            continue
        if name not in args.given:
            setattr(args, name, value)
        elif getattr(args, name) != value:
            changed.append(f"--{name.replace('_', '-')} {getattr(args, name)} (the saved run had {value})")
    return f"resuming with {', '.join(changed)}" if changed else None


def saved_flags(args):
    """The run's flags as train_config.json keeps them; a model from scratch says so, not --model's default."""
    config = {k: v for k, v in vars(args).items() if k not in NOT_SAVED + ("given",)}
    return config | ({"model": FROM_SCRATCH} if args.from_scratch else {})


# ----------------------------------------------------------------------------
# The model and its text
# ----------------------------------------------------------------------------

def parameter_table(hparams):
    """The model's parameters by part, and the token embedding's share: in a small model most of
    them are the vocabulary's, which is why small models use small vocabularies."""
    counts = parameters.count_parameters(hparams)
    lines = [f"a new GPT-2: {hparams['n_layer']} layers, {hparams['n_head']} heads, {hparams['n_embd']} wide, "
             f"{hparams['n_vocab']:,} ids, {hparams['n_ctx']} positions: {counts['total']:,} parameters"]
    lines += [f"  {part:<28}{n:>12,}  {n / counts['total']:6.1%}" for part, n in counts["parts"].items() if n]
    return "\n".join(lines)


def new_model(args, documents, vocab_dir):
    """From scratch: --tokenizer's vocabulary, or one learned from the training documents
    into vocab_dir, and the model's shape. -> (the vocabulary's folder, its encoder, hparams)"""
    if args.tokenizer:
        encoder = bpe.get_encoder(args.tokenizer)
        if args.vocab_size not in (None, encoder.n_vocab):
            raise UserError(f"--vocab-size {args.vocab_size} disagrees with --tokenizer {args.tokenizer}, which has "
                            f"{encoder.n_vocab} ids: give one of them")
        vocab_dir = args.tokenizer
    else:
        train_documents, _ = train.split_documents(documents, args.val_fraction)
        bpe.write_vocab(vocab_dir, bpe.train_vocab(train_documents, args.vocab_size or 257, args.quiet))
        encoder = bpe.get_encoder(vocab_dir)
    if encoder.eot is None:
        raise UserError("its vocabulary has no <|endoftext|>", path=vocab_dir)
    args.vocab_size, args.context = encoder.n_vocab, args.context or DEFAULT_CONTEXT  # saved with the run's flags
    hparams = {"n_vocab": encoder.n_vocab, "n_ctx": args.context, "n_embd": args.n_embd, "n_head": args.n_head,
               "n_layer": args.n_layer}
    return vocab_dir, encoder, hparams


def saved_model(args):
    """A model to train further: a released size, a folder, hf:owner/name, or (--resume) the run in
    --out. -> (its folder, which holds its vocabulary too, its encoder, hparams, params)"""
    if args.model in shapes.SIZES and not args.resume:  # a released size: refuse before downloading it
        hparams = shapes.hparams(args.model)
        train.check_memory(hparams, args.batch_size, args.context or min(DEFAULT_CONTEXT, hparams["n_ctx"]),
                           available_memory(), adapter_size(args, hparams))
    # a resumed LoRA run goes on from its base model (--out holds the merged one) and its saved adapter
    folder = args.out if args.resume and not args.lora_rank else loading.fetch_model(args.model, args.models_dir,
                                                                                      args.base_url, quiet=args.quiet)
    hparams, params = load_weights(folder)
    check_writable(hparams, args.out)  # before training, not at the first save
    args.context = args.context or min(DEFAULT_CONTEXT, hparams["n_ctx"])  # saved with the run's flags
    return folder, bpe.get_encoder(folder), hparams, params


def data_ids(encoder, documents, examples, val_fraction, context):
    """The data to train and validate on: the documents' token streams, or instruction data's
    rows (saying how many examples there are, and how many were cut to fit the context)."""
    if examples is None:
        return train.text_ids(encoder, documents, val_fraction, context)
    train_rows, val_rows, cut = train.example_rows(encoder, examples, val_fraction, context)
    print(f"instruction data: {len(examples):,} examples, {len(val_rows):,} held out for validation; {cut:,} longer "
          f"than --context {context} + 1 tokens, cut to fit (the prompt's first tokens dropped first)")
    return train_rows, val_rows


def adapter_size(args, hparams):
    """A LoRA run's adapter parameters (train.lora_size), for a rank its layers can hold; 0 for full training."""
    if not args.lora_rank:
        return 0
    train.check_lora_rank(hparams, args.lora_rank, args.lora_targets.split(","))
    return train.lora_size(hparams, args.lora_rank, args.lora_targets.split(","))


def lora_adapters(args, params):
    """A LoRA run's {"adapters", "alpha", "targets", "base"} (train.train's lora): new adapters, or
    (--resume) the ones saved in --out, which must fit the model."""
    targets = args.lora_targets.split(",")
    if args.resume:
        adapters, _ = peft_adapter.read_adapter(args.out)
        want = shapes.flatten(train.new_adapters(params, args.lora_rank, targets, args.seed))
        if {k: a.shape for k, a in shapes.flatten(adapters).items()} != {k: a.shape for k, a in want.items()}:
            raise UserError(f"holds an adapter that does not fit {args.model} with --lora-rank {args.lora_rank} "
                            f"--lora-targets {args.lora_targets}", path=os.path.join(args.out,
                                                                                     peft_adapter.ADAPTER_FILE))
    else:
        adapters = train.new_adapters(params, args.lora_rank, targets, args.seed)
    return {"adapters": adapters, "alpha": args.lora_alpha, "targets": targets, "base": args.model}


def run(args):
    check_out(args.out, args.resume)
    if args.resume:
        note = resumed_flags(args, read_json(os.path.join(args.out, train.CONFIG_FILE)))
        if note:
            print(note, file=sys.stderr)
    if args.warmup is None:
        args.warmup = min(20, args.steps // 10)
    if args.lora_rank and args.lora_alpha is None:
        args.lora_alpha = float(args.lora_rank)  # PEFT's default pair, r = alpha = 8, is a scale of 1
    new = args.from_scratch and not args.resume
    documents, examples = corpus.read_corpus([args.data or train.CORPUS])
    # a learned vocabulary waits here, beside --out, until each save copies it in
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(args.out)), prefix=".vocab-") as scratch:
        if new:
            vocab_dir, encoder, hparams = new_model(args, documents, os.path.join(scratch, "vocab"))
        else:
            vocab_dir, encoder, hparams, params = saved_model(args)
        train_ids, val_ids = data_ids(encoder, documents, examples, args.val_fraction, args.context)
        train.check_memory(hparams, args.batch_size, args.context, available_memory(), adapter_size(args, hparams))
        lora = lora_adapters(args, params) if args.lora_rank else None
        if new:  # its weights are made once the run is known to fit
            print(parameter_table(hparams))  # even with --quiet: what is being trained
            params = init_params(hparams, args.seed)
        elif lora:  # the weights stay the file's read-only maps: only the adapters are trained
            params = train.with_adapters(params, lora["adapters"], args.lora_alpha / args.lora_rank)
        else:
            params = train.writable_copy(params)
        trained = lora["adapters"] if lora else params
        state = train.load_state(args.out, trained) if args.resume else new_adamw_state(trained)
        if state["step"] >= args.steps:
            print(f"{args.out}: already trained for {state['step']} steps, nothing to do (a larger --steps goes on)")
            return 0
        code = train.train(params, hparams, encoder, state, train_ids, val_ids, {k: getattr(args, k) for k in RECIPE},
                           out=args.out, vocab_dir=vocab_dir, config=saved_flags(args), eval_every=args.eval_every,
                           sample_every=args.sample_every, save_every=args.save_every, quiet=args.quiet, lora=lora)
    if code == 0:
        print(f"{args.out}: trained to step {args.steps}; run it with python gpt2_numpy.py --model {args.out} "
              "\"prompt\"")
    return code


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return exit_status(lambda: run(args))  # Ctrl-C in the loop saves first; before it, it is one line
