"""Training GPT-2 in NumPy: the data, the training loop, and its command line.

    python train.py --model 124M --data notes.txt --out models/notes-124M --steps 200     # fine-tune
    python train.py --from-scratch --out models/shakespeare --vocab-size 257 --n-layer 4 --n-head 4 \
        --n-embd 128 --context 64 --batch-size 12 --steps 2000 --lr 1e-3 --beta2 0.99  # from nothing
    python gpt2_numpy.py --model models/notes-124M "prompt"

From scratch, bpe.py first learns a vocabulary from the training part of the text (or
--tokenizer reuses one), initialise.py gives the weights GPT-2's initialisation, and the
same loop trains them; the folder written is a GPT-2 checkpoint like OpenAI's.

A step: take a batch of windows from the text, run loss_and_grads (backward.py: the forward
pass, then the backward pass by hand), clip the gradients, and take an AdamW step
(optimizer.py). Everything a step does depends on the seed and the step's number only, so
a run stopped (Ctrl-C saves it) and resumed is the same run, bit for bit.
"""
import argparse
import io
import json
import os
import sys
import time

import numpy as np

from backward import loss_and_grads
from gpt2_numpy import generate, gpt2, next_token_loss
from optimizer import adamw_step_fast, clip_scale, grad_norm, learning_rate, new_adamw_state
import parameters
from plumbing import shapes
from plumbing.checkpoint import check_writable, write_checkpoint
from plumbing.errors import UserError, fail, given_flags, read_json, read_text
from plumbing.folders import check_new_folder
from plumbing.memory import available_memory, check_fits

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "data", "tinyshakespeare.txt")  # --from-scratch's text when no --data is given

STATE_FILE = "train_state.npz"  # the optimizer's moments and the step count, beside the checkpoint (no pickle)
CONFIG_FILE = "train_config.json"  # the run's flags, which --resume reads back


# ============================================================================
# 1. The data
# ============================================================================

def read_data(path):
    """--data: a .txt file, or every .txt file in a folder (sorted), as one text."""
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".txt")) if os.path.isdir(path) \
        else [path]
    if not files:
        raise UserError("holds no .txt file", path=path)
    return "\n\n".join(read_text(f) for f in files)


def split_tokens(ids, context, val_fraction):
    """-> (train ids, validation ids); each must hold at least one context plus its next token."""
    ids = np.asarray(ids, dtype=np.int64)
    n_val = int(len(ids) * val_fraction)
    train_ids, val_ids = ids[:len(ids) - n_val], ids[len(ids) - n_val:]
    if len(train_ids) < context + 1 or (val_fraction and len(val_ids) < context + 1):
        raise UserError(f"the text has {len(ids):,} tokens: too short for a context of {context} in both the "
                        f"training and the validation part (--context, --val-fraction)")
    return train_ids, val_ids


def split_text(text, val_fraction):
    """-> (training text, validation text): the validation part is the end of the text, as nanoGPT's.
    From scratch the text is cut before it has ids, so that its vocabulary is learned from the training part."""
    cut = len(text) - int(len(text) * val_fraction)
    return text[:cut], text[cut:]


def text_ids(encoder, text, val_fraction, context):
    """split_text, then each part's ids. -> (train ids, validation ids), each at least a context and its next token."""
    train_ids, val_ids = (np.asarray(encoder.encode(part), np.int64) for part in split_text(text, val_fraction))
    if len(train_ids) < context + 1 or (val_fraction and len(val_ids) < context + 1):
        raise UserError(f"the text gives {len(train_ids):,} training and {len(val_ids):,} validation tokens: too few "
                        f"for a context of {context} in both (--context, --val-fraction, --data)")
    return train_ids, val_ids


def batch(ids, batch_size, context, rng):
    """batch_size random windows: inputs [B, T] and their next tokens [B, T]."""
    starts = rng.integers(0, len(ids) - context, batch_size)
    x = np.stack([ids[s:s + context] for s in starts])
    return x, np.stack([ids[s + 1:s + context + 1] for s in starts])


# ============================================================================
# 2. Memory
# ============================================================================

def memory_needed(hparams, batch_size, context):
    """About 16 bytes a parameter (weights, gradients, two moments) plus the activations that
    backward.KEPT keeps, per token: 16 C floats a block (resid_pre, ln_1, q, k, v, z, resid_mid,
    ln_2 and the 4C-wide c_fc and gelu) and 2 H T for the attention weights (and their
    gradient), and 3 V for the logits, their gradient and the softmax's temporaries."""
    n = parameters.count_parameters(hparams, d_ff=hparams.get("n_inner"))["total"]
    C, H, L, V = hparams["n_embd"], hparams["n_head"], hparams["n_layer"], hparams["n_vocab"]
    per_token = 4 * (L * (16 * C + 2 * H * context) + 3 * V)
    return 16 * n + batch_size * context * per_token


def check_memory(hparams, batch_size, context, free):
    """Refuse, before anything is allocated, a run that cannot fit (1558M cannot, in 24 GB)."""
    if context > hparams["n_ctx"]:
        raise UserError(f"--context {context} is longer than the model's {hparams['n_ctx']} positions")
    check_fits(memory_needed(hparams, batch_size, context), free, f"training this model at --batch-size "
               f"{batch_size} --context {context} (16 bytes a parameter, plus activations)",
               "use a smaller model, batch or context")


# ============================================================================
# 3. The loop
# ============================================================================

def trainable(params):
    """A writable float32 copy of params (the loaded ones are read-only views into the file)."""
    if isinstance(params, dict):
        return {k: trainable(v) for k, v in params.items()}
    if isinstance(params, list):
        return [trainable(v) for v in params]
    return np.array(params, dtype=np.float32)


def accumulate(total, grads):
    """total += grads, tensor by tensor (the first micro-batch's grads are copied: its wte
    gradient is a buffer that the next micro-batch writes over)."""
    if total is None:
        return trainable(grads)  # a float32 copy of every array
    into = shapes.flatten(total)
    for name, a in shapes.flatten(grads).items():
        into[name] += a
    return total


def train_step(params, n_head, state, train_ids, step, *, steps, batch_size, context, accum, lr, min_lr_ratio,
               warmup, weight_decay, grad_clip, dropout, seed, beta2=0.999, buffers=None):
    """One step: the gradients of `accum` micro-batches, clipping, AdamW. -> the mean loss.
    The batches and the dropout depend on the seed and the step only, so a resumed run is the
    same run. buffers: a dict whose big arrays are made once and reused (backward.loss_and_grads)."""
    rng = np.random.default_rng([seed, step])
    total, loss = None, 0.0
    for _ in range(accum):
        x, y = batch(train_ids, batch_size, context, rng)
        micro, grads = loss_and_grads(x, y, params, n_head, dropout, rng, buffers)
        total = grads if accum == 1 else accumulate(total, grads)
        loss += micro / accum
    if accum > 1:
        for a in shapes.flatten(total).values():
            a /= accum
    scale = clip_scale(grad_norm(total), grad_clip)
    rate = learning_rate(step, lr, warmup, steps, lr * min_lr_ratio)
    adamw_step_fast(params, total, state, rate, beta2=beta2, weight_decay=weight_decay, grad_scale=scale)
    return loss


def train(params, n_head, train_ids, state, recipe, on_step=None):
    """The loop: train_step after train_step, from state["step"] to recipe["steps"]. -> the last loss.
    recipe: train_step's keyword arguments (steps, batch_size, context, accum, lr, ...).
    on_step(step, loss, state) is called after each step."""
    buffers = {}  # the big arrays of a step, made once
    loss = None
    for step in range(state["step"], recipe["steps"]):
        loss = train_step(params, n_head, state, train_ids, step, buffers=buffers, **recipe)
        if on_step:
            on_step(step + 1, loss, state)
    return loss


def validation_loss(params, n_head, val_ids, context, batches=4, batch_size=4):
    """The loss on held-out windows: the forward pass only."""
    rng = np.random.default_rng(0)  # the same windows every time, so the numbers compare
    losses = []
    for _ in range(batches):
        x, y = batch(val_ids, batch_size, context, rng)
        losses.append(next_token_loss(gpt2(x, params, n_head), y))
    return float(np.mean(losses))


# ============================================================================
# 4. Saving and resuming
# ============================================================================

def save(folder, params, hparams, state, vocab, config):
    """The checkpoint in OpenAI's format, the tokenizer's files (from the folder `vocab`), the
    optimizer's state and the run's flags (config), written whole or not at all."""
    moments = {f"m/{k}": a for k, a in state["m"].items()} | {f"v/{k}": a for k, a in state["v"].items()}
    buf = io.BytesIO()
    np.savez(buf, step=np.int64(state["step"]), **moments)
    extra = {STATE_FILE: buf.getvalue(), CONFIG_FILE: json.dumps(config, indent=1).encode()}
    write_checkpoint(folder, params, hparams, vocab=vocab, extra=extra)


def load_state(folder, params):
    with np.load(os.path.join(folder, STATE_FILE), allow_pickle=False) as z:
        names = shapes.flatten(params)
        return {"step": int(z["step"]), "m": {k: z[f"m/{k}"].copy() for k in names},
                "v": {k: z[f"v/{k}"].copy() for k in names}}


# ============================================================================
# 5. The command line
# ============================================================================

RECIPE = ("steps", "batch_size", "context", "accum", "lr", "min_lr_ratio", "warmup", "weight_decay", "grad_clip",
          "dropout", "seed", "beta2")  # train_step's settings, as flags
NOT_SAVED = ("out", "resume", "quiet")  # every other flag is the run's, and --resume reads it back


def parser():
    p = argparse.ArgumentParser(prog="train.py", description="Fine-tune GPT-2 in NumPy on a text file, or train "
                                                             "one from nothing (--from-scratch).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument("--model", default="124M", help="124M, 355M, 774M, a model folder, or hf:owner/name")
    p.add_argument("--data", help="a UTF-8 .txt file, or a folder of them (with --resume: the saved run's)")
    p.add_argument("--out", required=True, help="the folder to write the trained model to")
    p.add_argument("--models-dir", help="where model sizes are downloaded")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in all")
    p.add_argument("--batch-size", type=int, default=4, help="windows a micro-batch holds")
    p.add_argument("--context", type=int, default=256, help="tokens a training window holds")
    p.add_argument("--accum", type=int, default=1, help="micro-batches a step accumulates (a larger batch in the "
                                                        "same memory)")
    p.add_argument("--lr", type=float, default=1e-4, help="the peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="the cosine decays to lr times this")
    p.add_argument("--warmup", type=int, default=None, help="steps of linear warm-up (default: a tenth of --steps, "
                                                            "at most 20)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW's decay, on matrices and embeddings")
    p.add_argument("--grad-clip", type=float, default=1.0, help="clip gradients to this global norm (0: never)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability (GPT-2 was trained with 0.1; "
                                                              "fine-tuning usually uses 0)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="the end of the text held out for validation")
    p.add_argument("--eval-every", type=int, default=50, help="print the validation loss every N steps (and at "
                                                              "the end)")
    p.add_argument("--sample-every", type=int, default=100, help="print a short sample every N steps")
    p.add_argument("--save-every", type=int, default=100, help="save a checkpoint every N steps (and at the end)")
    p.add_argument("--beta2", type=float, default=0.999, help="AdamW's decay of the squared gradients' mean "
                                                            "(nanoGPT's small models use 0.99)")
    p.add_argument("--seed", type=int, default=0, help="the same seed gives the same run, bit for bit")
    p.add_argument("--from-scratch", action="store_true", help="train a new model: learn its vocabulary from the "
                                                               "text, then GPT-2's initialisation (no --model)")
    p.add_argument("--vocab-size", type=int, default=None, help="from scratch: ids in the vocabulary (257: bytes "
                                                                "alone; default 257, or --tokenizer's)")
    p.add_argument("--tokenizer", help="from scratch: a folder with encoder.json and vocab.bpe to use instead of "
                                       "learning one")
    p.add_argument("--n-layer", type=int, default=4, help="from scratch: blocks")
    p.add_argument("--n-head", type=int, default=4, help="from scratch: attention heads a block")
    p.add_argument("--n-embd", type=int, default=128, help="from scratch: the residual stream's width")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out, with its flags")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.error = fail
    return p


def check_flags(args):
    for name in ("steps", "batch_size", "context", "accum", "eval_every", "sample_every", "save_every"):
        if getattr(args, name) < 1:
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
        fail("--data is required: a UTF-8 .txt file, or a folder of them")


def parse_args(argv):
    p = parser()
    args = p.parse_args(argv)
    args.given = given_flags(p, argv)
    check_flags(args)
    return args


def resumed_flags(args, saved):
    """The saved run's flags, except those given now; -> one line naming the ones that differ.
    The model cannot change: a resumed run continues the model saved in --out."""
    if "model" in args.given and saved.get("model", args.model) != args.model:
        raise UserError(f"--resume continues the model saved in {args.out} (trained from {saved['model']}): "
                        f"leave out --model {args.model}")
    changed = []
    for name, value in saved.items():
        if name in NOT_SAVED or not hasattr(args, name):
            continue
        if name not in args.given:
            setattr(args, name, value)
        elif getattr(args, name) != value:
            changed.append(f"--{name.replace('_', '-')} {getattr(args, name)} (the saved run had {value})")
    return f"resuming with {', '.join(changed)}" if changed else None


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except UserError as e:
        fail(str(e))


def check_out(out, resume):
    if resume and not os.path.exists(os.path.join(out, CONFIG_FILE)):
        raise UserError("holds no saved run to --resume", path=out)
    if not resume:
        check_new_folder(out, "choose a new folder, or --resume the run saved there", empty_ok=False)


def parameter_table(hparams):
    """The model's parameters by part, and the token embedding's share: in a small model most of
    them are the vocabulary's, which is why small models use small vocabularies."""
    counts = parameters.count_parameters(hparams)
    lines = [f"a new GPT-2: {hparams['n_layer']} layers, {hparams['n_head']} heads, {hparams['n_embd']} wide, "
             f"{hparams['n_vocab']:,} ids, {hparams['n_ctx']} positions: {counts['total']:,} parameters"]
    lines += [f"  {part:<28}{n:>12,}  {n / counts['total']:6.1%}" for part, n in counts["parts"].items() if n]
    return "\n".join(lines)


def from_scratch(args, vocab_dir):
    """A new model: its vocabulary (--tokenizer's, or learned from the training text into vocab_dir),
    GPT-2's initialisation, and the text's ids. -> (vocabulary folder, hparams, params, train ids, val ids)"""
    import bpe
    from initialise import init_params

    text = read_data(args.data or CORPUS)
    if args.tokenizer:
        encoder, vocab_dir = bpe.get_encoder(args.tokenizer), args.tokenizer
        if args.vocab_size not in (None, encoder.n_vocab):
            raise UserError(f"--vocab-size {args.vocab_size} disagrees with --tokenizer {args.tokenizer}, which has "
                            f"{encoder.n_vocab} ids: give one of them")
    else:
        train_text, _ = split_text(text, args.val_fraction)
        bpe.write_vocab(vocab_dir, bpe.train_vocab(train_text, args.vocab_size or 257, args.quiet))
        encoder = bpe.get_encoder(vocab_dir)
    if encoder.eot is None:
        raise UserError("its vocabulary has no <|endoftext|>", path=vocab_dir)
    args.vocab_size = encoder.n_vocab  # saved with the run's flags
    hparams = {"n_vocab": encoder.n_vocab, "n_ctx": args.context, "n_embd": args.n_embd, "n_head": args.n_head,
               "n_layer": args.n_layer}
    train_ids, val_ids = text_ids(encoder, text, args.val_fraction, args.context)
    check_memory(hparams, args.batch_size, args.context, available_memory())
    print(parameter_table(hparams))  # even with --quiet: what is being trained
    return vocab_dir, hparams, init_params(hparams, args.seed), train_ids, val_ids


def from_a_model(args):
    """A model to train further: a released size, a folder, hf:owner/name, or (--resume) the run in
    --out. -> (its folder, hparams, trainable params, train ids, val ids)"""
    import bpe
    from plumbing import loading

    if args.model in shapes.SIZES and not args.resume:  # a released size: refuse before downloading it
        check_memory(shapes.hparams(args.model), args.batch_size, args.context, available_memory())
    text = read_data(args.data or CORPUS)
    folder = args.out if args.resume else loading.fetch_model(args.model, args.models_dir, quiet=args.quiet)
    hparams, params = loading.load_weights(folder)
    check_writable(hparams, args.out)  # before training, not at the first save
    check_memory(hparams, args.batch_size, args.context, available_memory())
    encoder = bpe.get_encoder(folder)
    if args.from_scratch:  # a resumed run from scratch: the same split as at its start
        train_ids, val_ids = text_ids(encoder, text, args.val_fraction, args.context)
    else:
        train_ids, val_ids = split_tokens(encoder.encode(text), args.context, args.val_fraction)
    return folder, hparams, trainable(params), train_ids, val_ids


def run(args):
    import tempfile

    check_out(args.out, args.resume)
    if args.resume:
        note = resumed_flags(args, read_json(os.path.join(args.out, CONFIG_FILE)))
        if note:
            print(note, file=sys.stderr)
    if args.warmup is None:
        args.warmup = min(20, args.steps // 10)
    # a learned vocabulary waits here, beside --out, until each save copies it in
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(args.out)), prefix=".vocab-") as scratch:
        if args.from_scratch and not args.resume:
            return train_and_save(args, *from_scratch(args, os.path.join(scratch, "vocab")))
        return train_and_save(args, *from_a_model(args))


def train_and_save(args, folder, hparams, params, train_ids, val_ids):
    """The loop with its progress bar, reports, samples and saves. folder: where the vocabulary is."""
    import bpe
    from tqdm import tqdm

    encoder = bpe.get_encoder(folder)
    state = load_state(args.out, params) if args.resume else new_adamw_state(params)
    config = {k: v for k, v in vars(args).items() if k not in NOT_SAVED + ("given",)}
    recipe = {k: getattr(args, k) for k in RECIPE}
    n_head = hparams["n_head"]
    if state["step"] >= args.steps:
        print(f"{args.out}: already trained for {state['step']} steps, nothing to do (a larger --steps goes on)")
        return 0
    bar = tqdm(total=args.steps, initial=state["step"], unit="step", disable=args.quiet)
    clock = {"t": time.perf_counter(), "state": None}

    def report(step, loss):
        text = f"step {step}: train loss {loss:.4f}"
        if len(val_ids):
            text += f", validation loss {validation_loss(params, n_head, val_ids, args.context):.4f}"
        bar.write(text)

    def on_step(step, loss, state):
        clock["state"] = state
        rate = args.batch_size * args.accum * args.context / (time.perf_counter() - clock["t"])
        clock["t"] = time.perf_counter()
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{rate:.0f}")
        bar.update(1)
        if step % args.eval_every == 0 or step == args.steps:
            report(step, loss)
        if step % args.sample_every == 0:
            ids = np.concatenate(list(generate([], params, hparams, min(30, hparams["n_ctx"] - 1), seed=args.seed,
                                               top_k=40, stop=encoder.eot)))
            bar.write(f"step {step} sample: {encoder.decode(ids.tolist())!r}")
        if step % args.save_every == 0 or step == args.steps:
            save(args.out, params, hparams, state, folder, config)

    try:
        train(params, n_head, train_ids, state, recipe, on_step)
    except KeyboardInterrupt:
        bar.close()
        if clock["state"] is not None:
            save(args.out, params, hparams, clock["state"], folder, config)
            print(f"\ninterrupted: saved step {clock['state']['step']} in {args.out}; --resume continues",
                  file=sys.stderr)
        return 130
    bar.close()
    print(f"{args.out}: trained to step {args.steps}; run it with python gpt2_numpy.py --model {args.out} "
          "\"prompt\"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
