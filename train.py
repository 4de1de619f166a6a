"""Training GPT-2 in NumPy: the recipe, the data, the step, where the model comes from, and the loop.

    python train.py --model 124M --data notes.txt --out models/notes-124M --steps 200     # fine-tune
    python train.py --from-scratch --out models/shakespeare --vocab-size 257 --n-layer 4 --n-head 4 \
        --n-embd 128 --context 64 --batch-size 12 --steps 2000 --lr 1e-3 --beta2 0.99  # from nothing
    python gpt2_numpy.py --model models/notes-124M "prompt"
    mpiexec -n 2 python train.py ...      # the same run on two processes (data_parallel.py, docs/parallel.md)

The recipe comes first: every setting of a run, one a line with its default (RECIPE). Then the
set-up (set_up) says where a run's weights and optimizer state come from: a new model, a saved
one, or the run saved in --out; every weight trained, or LoRA's adapters beside frozen ones.

The data is documents (a .txt file, a folder of them, a .jsonl of {"text": ...}), each followed
by <|endoftext|> so that a model learns to stop; or instruction data (a .jsonl of {"prompt":
..., "response": ...}), where the loss counts only the response and its <|endoftext|>; or labelled
texts ({"text": ..., "label": ...}), which train a classifier (classify.py); or preference pairs
({"prompt", "chosen", "rejected"}), which train by DPO (dpo.py, --beta). Each kind is a line of
DATA_KINDS; examples are visited an epoch at a time, and OUT/train_log.jsonl logs every step.

From scratch, bpe.py first learns a vocabulary from the training part of the text (or
--tokenizer reuses one), parameters.py gives the weights GPT-2's initialisation, and the
same loop trains them; the folder written is a GPT-2 checkpoint like OpenAI's.

A step: take a batch of windows from the text, run loss_and_grads (backward.py: the forward
pass, then the backward pass by hand), clip the gradients, and take an AdamW step
(optimizer.py). Everything a step does depends on the seed and the step's number only, so
a run stopped (Ctrl-C saves it) and resumed is the same run, bit for bit.

    run = set_up("out/notes", recipe_with(steps=50, lr=3e-4), data=["notes.txt"], base="models/124M")
    train(run, "out/notes", config={})

The command line (its flags are made from the tables here, which model, messages) is interface/train_cli.py.
"""
if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("train_cli")  # the command line (flags, which model, messages): this file is the training

import json
import math
import os
import sys
import time

import numpy as np

from backward import IGNORE, loss_and_grads
import bpe
import classify
import dpo
from gpt2_numpy import generate, gpt2, next_token_loss
from parameters import init_params
from optimizer import adamw_step_fast, clip_scale, grad_norm, learning_rate, new_adamw_state
import parameters
from plumbing import classifier_files, corpus, peft_adapter, shapes
from plumbing.device import free_bytes, host, to_device, to_host
from plumbing.checkpoint import check_writable, write_checkpoint
from plumbing.errors import UserError, ctrl_c_waits, plural
from plumbing.memory import available_memory, check_fits
from plumbing.progress import progress
from plumbing.weights import load_weights

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "data", "tinyshakespeare.txt")  # --from-scratch's text when no --data is given
CONTEXT = 256  # tokens a training window holds, unless the recipe says or the model has fewer positions

STATE_FILE = "train_state.npz"  # the optimizer's moments and the step count, beside the checkpoint (no pickle)
CONFIG_FILE = "train_config.json"  # the run's flags, which --resume reads back
LOG_FILE = "train_log.jsonl"  # a line for each step, {"step", "lr", "loss", ...}, and each validation, {"step", "val_loss", ...}


# ============================================================================
# 1. The recipe
# ============================================================================
# Every setting of a run, one a line: (its default, its type, what it is). train.py's flags (--steps,
# --batch-size, ...), their defaults and their --help are made from this table, so that the two cannot
# disagree. None: worked out for the run, as its line says (recipe_with, set_up).

RECIPE = {
    # the step (train_step)
    "steps": (200, int, "optimizer steps in all"),
    "batch_size": (4, int, "windows (or instruction examples) a micro-batch holds"),
    "context": (None, int, f"tokens a training window holds (default: {CONTEXT}, or the model's n_ctx if it has "
                           "fewer positions)"),
    "accum": (1, int, "micro-batches a step accumulates (a larger batch in the same memory)"),
    "lr": (1e-4, float, "the peak learning rate"),
    "min_lr_ratio": (0.1, float, "the cosine decays to lr times this"),
    "warmup": (None, int, "steps of linear warm-up (default: a tenth of --steps, at most 20)"),
    "weight_decay": (0.1, float, "AdamW's decay, on matrices and embeddings"),
    "grad_clip": (1.0, float, "clip gradients to this global norm (0: never)"),
    "dropout": (0.0, float, "dropout probability (GPT-2 was trained with 0.1; fine-tuning usually uses 0)"),
    "beta2": (0.999, float, "AdamW's decay of the squared gradients' mean (nanoGPT's small models use 0.99)"),
    "seed": (0, int, "the same seed gives the same run, bit for bit"),
    # the data and the loop (set_up, train)
    "val_fraction": (0.1, float, "the end of the data held out for validation (the last documents or examples, "
                                 "at least one)"),
    "eval_every": (50, int, "print the validation loss every N steps (and at the end)"),
    "sample_every": (100, int, "print a short sample every N steps"),
    "save_every": (100, int, "save a checkpoint every N steps (and at the end)"),
}


def recipe_with(**settings):
    """RECIPE's defaults with these settings in their place; the warm-up, if not given, a tenth of the
    steps, at most 20. (The context, if not given, is the model's: set_up.)"""
    unknown = sorted(set(settings) - set(RECIPE))
    if unknown:
        raise TypeError(f"the recipe has no setting {unknown[0]!r}")
    recipe = {name: default for name, (default, _, _) in RECIPE.items()} | settings
    return recipe | {"warmup": min(20, recipe["steps"] // 10) if recipe["warmup"] is None else recipe["warmup"]}


# ============================================================================
# 2. The data
# ============================================================================

def split_text(text, val_fraction):
    """-> (training text, validation text): the validation part is the end of the text, as nanoGPT's.
    The text is cut before it has ids, so that a vocabulary learned from scratch sees the training part alone."""
    cut = len(text) - int(len(text) * val_fraction)
    return text[:cut], text[cut:]


def held_out_count(sizes, val_fraction):
    """How many of the last documents (or examples) the validation part holds: the fewest whose
    characters (sizes: each one's) make at least val_fraction of all, at least one, and at least
    one left to train on; 0 when val_fraction is 0."""
    if not val_fraction:
        return 0
    from_the_end = np.cumsum(sizes[::-1])
    k = int(np.searchsorted(from_the_end, val_fraction * from_the_end[-1])) + 1
    return min(k, len(sizes) - 1)


def split_documents(documents, val_fraction):
    """-> (training documents, validation documents). Several: the split falls between documents,
    the last held_out_count of them held out. One: split_text cuts its text."""
    if len(documents) == 1:
        return tuple([part] for part in split_text(documents[0], val_fraction))
    cut = len(documents) - held_out_count([len(d) for d in documents], val_fraction)
    return documents[:cut], documents[cut:]


def document_ids(encoder, documents, ends=True):
    """The token stream: each document's ids, then <|endoftext|> where it ends, so that a model
    learns to stop. ends=False: the last document's end is not here (one text cut in two: its
    training part)."""
    if ends and encoder.eot is None:
        raise UserError("the vocabulary has no <|endoftext|> to end a document with: give the text as one document")
    ids = []
    for document in documents:
        ids += encoder.encode(document) + [encoder.eot] * ends
    return np.asarray(ids, np.int64)


def text_ids(encoder, text, val_fraction, context):
    """The ids to train and validate on. text: one text, or a list of documents (split_documents,
    then document_ids: one document is one text). -> (train ids, validation ids), each at least a
    context and its next token."""
    documents = corpus.as_documents(text)
    if len(documents) == 1:  # cut in two: the document's end, and its <|endoftext|>, is in the last part with text
        train_text, val_text = split_text(documents[0], val_fraction)
        marked = encoder.eot is not None
        train_ids = document_ids(encoder, [train_text], ends=marked and not val_text)
        val_ids = document_ids(encoder, [val_text], ends=marked) if val_text else np.zeros(0, np.int64)
    else:
        train_ids, val_ids = (document_ids(encoder, part) for part in split_documents(documents, val_fraction))
    if len(train_ids) < context + 1 or (val_fraction and len(val_ids) < context + 1):
        raise UserError(f"the text is too short for a context of {context}: it gives {len(train_ids):,} training and "
                        f"{len(val_ids):,} validation tokens, too few for a context of {context} in both "
                        f"(--context, --val-fraction, --data)")
    return train_ids, val_ids


def batch(ids, batch_size, context, rng):
    """batch_size random windows: inputs [B, T] and their next tokens [B, T]."""
    starts = rng.integers(0, len(ids) - context, batch_size)
    x = np.stack([ids[s:s + context] for s in starts])
    return x, np.stack([ids[s + 1:s + context + 1] for s in starts])


# Instruction data: each example is its prompt, its response and <|endoftext|>, a row of its own
# (not packed with others), and the loss counts the response and the <|endoftext|> alone.

def example_ids(encoder, prompt, response):
    """-> (the ids of prompt, response, <|endoftext|>; how many are the prompt's). The two are
    encoded apart, as the model meets them: a prompt encoded alone, then the tokens it writes."""
    if encoder.eot is None:
        raise UserError("the vocabulary has no <|endoftext|> to end a response with")
    prompt_ids = encoder.encode(prompt)
    return prompt_ids + encoder.encode(response) + [encoder.eot], len(prompt_ids)


def cut_example(ids, n_prompt, context):
    """An example of more than context + 1 tokens, cut to that many, keeping the response's start:
    the prompt's first tokens go first (its last one stays, to predict the response's first from),
    then, if the response is still too long, its end. -> (ids, how many are the prompt's)"""
    start = min(max(len(ids) - (context + 1), 0), max(n_prompt - 1, 0))
    return ids[start:start + context + 1], n_prompt - start


def example_row(ids, n_prompt):
    """-> inputs [T], targets [T]: each position's next token, IGNORE where that is the prompt's."""
    inputs, targets = np.asarray(ids[:-1], np.int64), np.asarray(ids[1:], np.int64)
    targets[:max(n_prompt - 1, 0)] = IGNORE
    return inputs, targets


def example_rows(encoder, examples, val_fraction, context):
    """Instruction data to train and validate on: [(prompt, response)] -> (training rows,
    validation rows, how many examples were cut), a row an example's (inputs, targets); the
    last held_out_count examples are held out."""
    held = held_out_count([len(p) + len(r) for p, r in examples], val_fraction)
    if val_fraction and not held:
        raise UserError("one example leaves none to hold out for validation: give more, or --val-fraction 0")
    rows, cut = [], 0
    for prompt, response in examples:
        ids, n_prompt = example_ids(encoder, prompt, response)
        cut += len(ids) > context + 1
        rows.append(example_row(*cut_example(ids, n_prompt, context)))
    return rows[:len(rows) - held], rows[len(rows) - held:], cut


def example_batch(rows, picks):
    """The rows picked, padded on the right to the longest: inputs [B, T], targets [B, T]. A pad's
    input is id 0 (the causal mask hides it from every earlier position) and its target IGNORE."""
    longest = max(len(rows[i][0]) for i in picks)
    x, y = np.zeros((len(picks), longest), np.int64), np.full((len(picks), longest), IGNORE, np.int64)
    for b, i in enumerate(picks):
        inputs, targets = rows[i]
        x[b, :len(inputs)], y[b, :len(targets)] = inputs, targets
    return x, y


# Labelled texts (a classifier's, classify.py): each is its text's ids, with no <|endoftext|> added (an
# <|endoftext|> written in the text is the special id, as transformers' tokenizer reads it), and its label's
# number; a batch is padded on the right with the pad id, as transformers pads a GPT-2.

def labelled_rows(encoder, examples, val_fraction, context, labels=None):
    """[(text, label)] -> (training rows, validation rows, the labels numbered, how many texts were cut):
    a row is (ids, the label's number); a text longer than the context keeps its first tokens (as
    transformers' truncation does). labels: the starting classifier's, which the data's must be among;
    None: the training rows' own, sorted (classify.label_names)."""
    held = held_out_count([len(text) for text, _ in examples], val_fraction)
    if val_fraction and not held:
        raise UserError("one text leaves none to hold out for validation: give more, or --val-fraction 0")
    training, held_out = examples[:len(examples) - held], examples[len(examples) - held:]
    if labels is None:
        classify.label_names([label for _, label in examples])  # strings or numbers, not both
        labels = classify.label_names([label for _, label in training])
        unknown = [label for _, label in held_out if label not in labels]
        if unknown:
            raise UserError(f"label {unknown[0]!r} is in validation (the data's last texts) but not in training: a "
                            "classifier cannot learn it (mix the lines, or give more of that label)")
    numbers = [classifier_files.label_number(label, labels) for _, label in examples]
    if None in numbers:
        raise UserError(f"label {examples[numbers.index(None)][1]!r} is not one of the classifier's labels, {labels}: "
                        "give a language model to start a new head")
    rows, cut = [], 0
    for (text, _), number in zip(examples, numbers):
        ids = encoder.encode(text, allowed_special="all")
        cut += len(ids) > context
        rows.append((np.asarray(ids[:context], np.int64), number))
    return rows[:len(training)], rows[len(training):], labels, cut


def labelled_batch(rows, picks, pad_id):
    """The rows picked, padded on the right with pad_id: ids [B, T], labels [B]."""
    longest = max(len(rows[i][0]) for i in picks)
    x = np.full((len(picks), longest), pad_id, np.int64)
    for b, i in enumerate(picks):
        x[b, :len(rows[i][0])] = rows[i][0]
    return x, np.array([rows[i][1] for i in picks], np.int64)


# Examples are visited an epoch at a time, each once, in a shuffle of the seed and the epoch's number
# (as torch's DataLoader(shuffle=True) and transformers' Trainer visit them); the last batch of an epoch
# holds what is left. The micro-batch's number alone says which examples it holds: a resumed run is
# the same run.

def epoch_picks(n, batch_size, seed, micro):
    """The examples micro-batch number `micro` (from 0) holds, of n: epoch e = micro // ⌈n / B⌉ is a
    permutation of the n, and the micro-batch its k-th run of B (the last one shorter)."""
    per_epoch = -(-n // batch_size)
    epoch, k = divmod(micro, per_epoch)
    order = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2, epoch))).permutation(n)
    return order[k * batch_size:(k + 1) * batch_size]


# ============================================================================
# 2b. The kinds of data
# ============================================================================
# plumbing/corpus.py tells the kind by a .jsonl line's fields. Each kind is a line here: how its
# data splits into training and validation (-> the rows, and what the run keeps of it), a micro-batch
# of it, the loss and gradients of a batch (-> loss, grads, the kind's metrics), and the validation's
# metrics. A batch function takes (data, recipe, micro: the micro-batch's number, rng); a loss function
# (batch, params, hparams, data, recipe, rng, buffers, frozen).

def document_split(encoder, documents, examples, recipe, head):
    train_ids, val_ids = text_ids(encoder, documents, recipe["val_fraction"], recipe["context"])
    return train_ids, val_ids, {}


def instruction_split(encoder, documents, examples, recipe, head):
    train_rows, val_rows, cut = example_rows(encoder, examples, recipe["val_fraction"], recipe["context"])
    print(f"instruction data: {plural(len(examples), 'example', ',')}, {len(val_rows):,} held out for validation; "
          f"{cut:,} longer than --context {recipe['context']} + 1 tokens, cut to fit (the prompt's first tokens "
          "dropped first)")
    return train_rows, val_rows, {}


def labelled_split(encoder, documents, examples, recipe, head):
    if encoder.eot is None:
        raise UserError("the vocabulary has no <|endoftext|> to pad a batch of texts with")
    train_rows, val_rows, labels, cut = labelled_rows(encoder, examples, recipe["val_fraction"], recipe["context"],
                                                      head and head["labels"])
    print(f"labelled texts: {len(examples):,}, {len(val_rows):,} held out for validation; labels {labels} (in this "
          f"order, score's rows); {cut:,} longer than --context {recipe['context']}, cut to their start")
    if head and head["pad_id"] is None:  # transformers cannot batch it; its docs say: pad with the eos
        print(f"note: the classifier has no pad_token_id: its batches are padded with <|endoftext|> ({encoder.eot}),"
              " which the trained classifier keeps as its pad")
    pad_id = head["pad_id"] if head and head["pad_id"] is not None else encoder.eot
    return train_rows, val_rows, {"labels": labels, "pad_id": pad_id}


def preference_split(encoder, documents, examples, recipe, head):
    train_pairs, val_pairs, dropped = preference_pairs(encoder, examples, recipe["val_fraction"], recipe["context"])
    print(f"preference data: {plural(len(examples), 'pair', ',')}, {len(val_pairs):,} held out for validation; "
          f"{dropped:,} dropped (the prompt alone fills --context {recipe['context']})")
    return train_pairs, val_pairs, {}  # set_up adds the reference's log-probabilities (with_reference)


def window_batch(data, recipe, micro, rng):
    return batch(data["rows"], recipe["batch_size"], recipe["context"], rng)


def instruction_batch(data, recipe, micro, rng):
    return example_batch(data["rows"], epoch_picks(len(data["rows"]), recipe["batch_size"], recipe["seed"], micro))


def classifier_batch(data, recipe, micro, rng):
    picks = epoch_picks(len(data["rows"]), recipe["batch_size"], recipe["seed"], micro)
    return labelled_batch(data["rows"], picks, data["pad_id"])


def pair_picks(data, recipe, micro, rng):
    return epoch_picks(len(data["rows"]), recipe["batch_size"], recipe["seed"], micro)


def token_loss(batch, params, hparams, data, recipe, rng, buffers, frozen):
    loss, grads = loss_and_grads(*batch, params, hparams, recipe["dropout"], rng, buffers, frozen=frozen)
    return loss, grads, {}


def label_loss(batch, params, hparams, data, recipe, rng, buffers, frozen):
    loss, grads, accuracy = classify.classifier_loss_and_grads(*batch, params, hparams, data["pad_id"],
                                                               recipe["dropout"], rng, frozen, buffers)
    return loss, grads, {"accuracy": accuracy}


def preference_loss(picks, params, hparams, data, recipe, rng, buffers, frozen):
    """dpo.loss_and_grads on the pairs picked, with the reference's log-probabilities of the same batch."""
    ids, mask = dpo.pair_batch([data["rows"][i] for i in picks], recipe["context"], data["pad_id"])
    ref_logps = dpo.batch_logps(ids, mask, data["reference"], hparams)
    _, grads, metrics = dpo.loss_and_grads(ids, mask, ref_logps, params, hparams, data["beta"], data["loss_type"],
                                           recipe["dropout"], rng, frozen, buffers)
    return metrics["loss"], grads, {k: v for k, v in metrics.items() if k != "loss"}


def token_validation(params, hparams, data, recipe, share=(0, 1)):
    return {"loss": validation_loss(params, hparams, data["rows"], recipe["context"], share=share)}


def label_validation(params, hparams, data, recipe, batch_size=8, share=(0, 1)):
    """The loss and accuracy over every validation text, in order (the forward pass only). share (rank,
    ranks): that rank's part of them, every ranks-th batch, as its part of the means (data_parallel.py)."""
    rows, losses, right = data["rows"], [], 0
    for start in range(0, len(rows), batch_size)[share[0]::share[1]]:
        x, labels = labelled_batch(rows, range(start, min(start + batch_size, len(rows))), data["pad_id"])
        logits = host(classify.classifier_logits(x, params, hparams, data["pad_id"]))  # [B, K], read on the host
        losses.append(classify.label_loss(logits, labels) * len(labels))
        right += int((logits.argmax(-1) == labels).sum())
    return {"loss": sum(losses) / len(rows), "accuracy": right / len(rows)}


def preference_validation(params, hparams, data, recipe):
    """TRL's metrics over every validation pair (the forward pass only)."""
    logps = dpo.pair_logps(data["rows"], params, hparams, recipe["context"], data["pad_id"], recipe["batch_size"])
    return dpo.pairs_metrics(logps, data["ref"], data["lengths"], data["beta"], data["loss_type"])


DATA_KINDS = {  # kind: its split, its micro-batch, its loss and gradients, its validation
    "documents": {"split": document_split, "batch": window_batch, "loss": token_loss, "validate": token_validation},
    "instruction": {"split": instruction_split, "batch": instruction_batch, "loss": token_loss,
                    "validate": token_validation},
    "labelled": {"split": labelled_split, "batch": classifier_batch, "loss": label_loss,
                 "validate": label_validation},
    "preference": {"split": preference_split, "batch": pair_picks, "loss": preference_loss,
                   "validate": preference_validation},
}


# Preference data: each pair is its prompt's, chosen and rejected completions' ids (dpo.pair_ids). A step
# computes the reference's log-probabilities on its own batch, as it computes the policy's (TRL's default,
# precompute_ref_log_probs=False): a sequence's float32 log π depends on the batch it sits in, so numbers
# computed once in other batches would make step 1's rewards rounding noise and its accuracy a coin toss.
# Validation computes the reference's once, in the batches it computes the policy's in.

PREFERENCE = {"beta": 0.1, "loss_type": "sigmoid", "reference": None}  # dpo.py's settings: --beta, --dpo-loss, ...


def preference_pairs(encoder, pairs, val_fraction, context):
    """[(prompt, chosen, rejected)] -> (training pairs, validation pairs, how many were dropped), each
    pair its ids; the last held_out_count pairs are held out, and a pair whose prompt alone fills the
    context is dropped (dpo.tokenized_pairs)."""
    held = held_out_count([sum(map(len, pair)) for pair in pairs], val_fraction)
    if val_fraction and not held:
        raise UserError("one pair leaves none to hold out for validation: give more, or --val-fraction 0")
    train_pairs, dropped = dpo.tokenized_pairs(encoder, pairs[:len(pairs) - held], context)
    val_pairs, val_dropped = dpo.tokenized_pairs(encoder, pairs[len(pairs) - held:], context)
    if not train_pairs:
        raise UserError(f"every training pair's prompt fills --context {context}: none is left to learn from")
    return train_pairs, val_pairs, dropped + val_dropped


def with_reference(data, reference, hparams, context, encoder, preference, batch_size, validation=False):
    """Preference pairs as a run holds them: data ({"kind", "rows": the pairs}) with "reference" (its params,
    for the steps) or, for validation, "ref" [n, 2] (its log-probabilities of each pair's chosen and
    rejected completions, in validation's batches of batch_size pairs), "lengths" [n, 2], "beta",
    "loss_type", "pad_id" (<|endoftext|>, GPT-2's pad as TRL's collator takes it: a pad carries no loss)."""
    held = ({"ref": dpo.pair_logps(data["rows"], reference, hparams, context, encoder.eot, batch_size)} if validation
            else {"reference": reference})
    return data | held | {"lengths": dpo.pair_lengths(data["rows"], context), "beta": preference["beta"],
                          "loss_type": preference["loss_type"], "pad_id": encoder.eot}


def reference_model(preference, start, hparams, encoder, start_folder=None):
    """DPO's reference: the model preference["reference"] names (a folder, or a function that gives one),
    else start_folder's (a resumed run's starting model), else start, the starting model itself (for LoRA,
    the base weights, the adapters off: no second copy). It must share the vocabulary and the context."""
    folder = preference["reference"] or start_folder
    if folder is None:
        return start
    folder = folder() if callable(folder) else folder
    ref_hparams, ref_params = load_weights(folder)
    dpo.check_reference(hparams, encoder, ref_hparams, bpe.get_encoder(folder), folder)
    return ref_params


# ============================================================================
# 3. The step
# ============================================================================

def writable_copy(params):
    """A writable float32 copy of params (the loaded ones are read-only views into the file), where they are
    (like=: a GPU's arrays are copied on the GPU)."""
    return shapes.map_tensors(lambda a: np.array(a, dtype=np.float32, like=a), params)


def accumulate(total, grads):
    """total += grads, tensor by tensor (the first micro-batch's grads are copied: its wte
    gradient is a buffer that the next micro-batch writes over)."""
    if total is None:
        return writable_copy(grads)  # a float32 copy of every array
    into = shapes.flatten(total)
    for name, a in shapes.flatten(grads).items():
        into[name] += a
    return total


class Diverged(UserError):
    """A step whose loss or gradient is not finite (NaN or infinite): no update is made from it."""

    def __init__(self, step, loss, norm):
        super().__init__(f"step {step}: the {'loss is' if not np.isfinite(loss) else 'gradient is'} "
                         f"{loss if not np.isfinite(loss) else norm}: the run diverged")


def gradients(params, hparams, data, step, recipe, buffers=None, frozen=False):
    """The forward and backward passes of a step: the gradients of recipe["accum"] micro-batches of the data,
    their mean. -> (the step's metrics, {"loss", ...}: the loss and the kind's metrics, for preference pairs
    TRL's (dpo.METRICS), the micro-batches' mean; the gradients). data: {"kind": DATA_KINDS' name, "rows": ...,
    and what the kind keeps}; the batches and the dropout depend on the recipe's seed and the step only, so a
    resumed run is the same run. buffers: a dict whose big arrays are made once and reused
    (backward.loss_and_grads); frozen: a LoRA run's (the adapters' gradients alone, and a classifier's score's)."""
    accum, kind = recipe["accum"], DATA_KINDS[data["kind"]]
    rng = np.random.default_rng([recipe["seed"], step])
    total, metrics = None, {}
    for j in range(accum):
        micro_batch = kind["batch"](data, recipe, step * accum + j, rng)
        loss, grads, more = kind["loss"](micro_batch, params, hparams, data, recipe, rng, buffers, frozen)
        total = grads if accum == 1 else accumulate(total, grads)
        for name, value in {"loss": loss, **more}.items():
            metrics[name] = metrics.get(name, 0.0) + value / accum
    if accum > 1:
        for a in shapes.flatten(total).values():
            a /= accum
    return metrics, total


def train_step(params, hparams, state, data, step, recipe, buffers=None, adapters=None, gradients=gradients):
    """One step of training: the forward and backward passes (gradients), the step's learning rate (warm-up,
    then cosine), the gradients clipped to recipe["grad_clip"] by their global norm, and AdamW (beta2,
    weight_decay: the recipe's). -> the step's metrics, {"lr", "loss", ...}. step: counted from 0.
    adapters: a LoRA run's (inside params' layers, with_adapters), the only tensors trained (with a
    classifier's score); None: every parameter is. The rest is gradients', the function above, or on many
    processes data_parallel.py's, which sums every process's."""
    metrics, grads = gradients(params, hparams, data, step, recipe, buffers, adapters is not None)
    norm = grad_norm(grads)
    if not (np.isfinite(metrics["loss"]) and np.isfinite(norm)):  # before AdamW: the weights stay the last good ones
        raise Diverged(step + 1, metrics["loss"], norm)
    lr = learning_rate(step, recipe["lr"], recipe["warmup"], recipe["steps"], recipe["lr"] * recipe["min_lr_ratio"])
    scale = clip_scale(norm, recipe["grad_clip"])  # clipping, folded into the fast AdamW's pass
    adamw_step_fast(params if adapters is None else adapters, grads, state, lr, beta2=recipe["beta2"],
                    weight_decay=recipe["weight_decay"], grad_scale=scale)
    return {"lr": lr, **metrics}


# ============================================================================
# 4. LoRA: adapters beside frozen weights
# ============================================================================
# LoRA (Hu et al., 2021) trains two small matrices beside each targeted weight, y = x w + b + s (x A) B,
# and leaves every weight frozen: the adapters are the only tensors with gradients and moments. A run
# puts them in the model's layers (with_adapters), trains them, and writes the merged model (merged_model).

LORA_TARGETS = {"c_attn": (("attn", "c_attn"),), "c_proj": (("attn", "c_proj"), ("mlp", "c_proj")),
                "c_fc": (("mlp", "c_fc"),)}  # --lora-targets' names (PEFT's): c_proj is the attention's and the MLP's

LORA = {  # a LoRA run's settings, as RECIPE's lines (train.py's --lora-rank, --lora-alpha, --lora-targets)
    "rank": (None, int, "train rank-R adapters beside frozen weights instead of every weight (PEFT's r, e.g. 8); "
                        "--out is the merged model, with the adapter in PEFT's format beside it"),
    "alpha": (None, float, "the adapters' update is scaled by alpha / rank (default: the rank, a scale of 1)"),
    "targets": ("c_attn", str, f"the layers adapted, from {','.join(LORA_TARGETS)} (c_proj: the attention's and "
                               "the MLP's)"),
}


def lora_layers(targets):
    """The (part, layer) pairs of a block that the targets name, in the order the data meets them."""
    wanted = {pair for t in targets for pair in LORA_TARGETS[t]}
    return [pair for pair in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj"))
            if pair in wanted]


def lora_size(hparams, rank, targets):
    """The adapters' parameters: R (n_in + n_out) for each targeted layer of every block."""
    block = shapes.block_shapes(hparams["n_embd"], hparams.get("n_inner"))
    return hparams["n_layer"] * sum(rank * sum(block[f"{part}/{layer}/w"]) for part, layer in lora_layers(targets))


def check_lora_rank(hparams, rank, targets):
    """Refuse a rank that a targeted layer cannot hold: A B of an n_in x n_out layer has rank at most
    min(n_in, n_out), and more would only cost time (checked before an adapter is made)."""
    block = shapes.block_shapes(hparams["n_embd"], hparams.get("n_inner"))
    most, part, layer = min((min(block[f"{part}/{layer}/w"]), part, layer) for part, layer in lora_layers(targets))
    if rank > most:
        n_in, n_out = block[f"{part}/{layer}/w"]
        raise UserError(f"--lora-rank {rank} is more than {part}.{layer} can hold: an update of that {n_in} x {n_out} "
                        f"layer has rank at most {most}: choose --lora-rank {most} or less")


def new_adapters(params, rank, targets, seed):
    """LoRA's A [n_in, R] and B [R, n_out] for each targeted layer of every block, started as PEFT starts
    them: A uniform in ±1/√n_in (torch's kaiming_uniform_ with a = √5), B zero, so that at step 0 the
    model is the base model. -> {"blocks": [{"attn": {"c_attn": {"lora": {"A", "B"}}}, ...}, ...]}"""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,)))  # apart from the steps' [seed, step]
    adapters = {"blocks": []}
    for block in params["blocks"]:
        adapters["blocks"].append({})
        for part, layer in lora_layers(targets):
            n_in, n_out = block[part][layer]["w"].shape
            bound = 1.0 / math.sqrt(n_in)
            adapters["blocks"][-1].setdefault(part, {})[layer] = {"lora": {
                "A": rng.uniform(-bound, bound, (n_in, rank)).astype(np.float32),
                "B": np.zeros((rank, n_out), np.float32)}}
    return adapters


def with_layers(params, layers):
    """A copy of params with these layers in place, {(block, part, layer): its tensors}: new dicts
    around the same arrays (the frozen weights stay the file's maps), every other layer as it is."""
    blocks = [{**block, "attn": dict(block["attn"]), "mlp": dict(block["mlp"])} for block in params["blocks"]]
    for (i, part, layer), tensors in layers.items():
        blocks[i][part][layer] = tensors
    return {**params, "blocks": blocks}


def with_adapters(params, adapters, scale):
    """params with each adapter in its layer, {"w", "b", "lora": {"A", "B", "scale"}}, which linear() and
    the backward read."""
    return with_layers(params, {(i, part, layer): {**params["blocks"][i][part][layer],
                                                   "lora": {**adapter["lora"], "scale": scale}}
                                for i, adapted in enumerate(adapters["blocks"])
                                for part, layers in adapted.items() for layer, adapter in layers.items()})


def merged_model(params):
    """The model a LoRA run writes: w + s A B in each adapted layer (a new array), every other tensor as it is."""
    def merged_layer(t):  # one adapted layer: {"w", "b", "lora"} -> {"w", "b"}
        return {"w": t["w"] + (t["lora"]["A"] @ t["lora"]["B"]) * t["lora"]["scale"], "b": t["b"]}

    return with_layers(params, {(i, part, layer): merged_layer(t) for i, block in enumerate(params["blocks"])
                                for part in ("attn", "mlp") for layer, t in block[part].items() if "lora" in t})


# ============================================================================
# 5. Memory
# ============================================================================

def memory_needed(hparams, batch_size, context, adapter_size=0):
    """About 16 bytes a parameter (weights, gradients, two moments) plus the activations that
    backward.KEPT keeps, per token: 16 C floats a block (resid_pre, ln_1, q, k, v, z, resid_mid,
    ln_2 and the 4C-wide c_fc and gelu) and 2 H T for the attention weights (and their
    gradient), and 3 V for the logits, their gradient and the softmax's temporaries.
    With LoRA (adapter_size: its A and B's parameters, lora_size) the weights are frozen: 4 bytes a
    weight (mapped from the file, read at every step) and 16 an adapter's; the same activations; and
    while a save writes the merged checkpoint (a tensor at a time), up to 4 more a weight for the merged
    copies of the adapted layers (then no activations are held)."""
    n = parameters.count_parameters(hparams, d_ff=hparams.get("n_inner"))["total"]
    C, H, L, V = hparams["n_embd"], hparams["n_head"], hparams["n_layer"], hparams["n_vocab"]
    per_token = 4 * (L * (16 * C + 2 * H * context) + 3 * V)
    if adapter_size:
        return 4 * n + 16 * adapter_size + max(batch_size * context * per_token, 4 * n)
    return 16 * n + batch_size * context * per_token


def check_memory(hparams, batch_size, context, free, adapter_size=0):
    """Refuse, before anything is allocated, a run that cannot fit (1558M cannot, in 24 GB; with LoRA, it can).
    adapter_size: a LoRA run's (lora_size), else 0."""
    if context > hparams["n_ctx"]:
        raise UserError(f"--context {context} is longer than the model's {hparams['n_ctx']} positions")
    what, per = (("LoRA on this model", "4 bytes a frozen weight, 16 an adapter's") if adapter_size else
                 ("training this model", "16 bytes a parameter"))
    check_fits(memory_needed(hparams, batch_size, context, adapter_size), free, f"{what} at --batch-size "
               f"{batch_size} --context {context} ({per}, plus activations)", "use a smaller model, batch or context")


# ============================================================================
# 6. The set-up: where a run's weights and state come from
# ============================================================================
# As nanoGPT's init_from: a new model (from scratch), a saved one (to train further), or the run
# saved in --out (to resume it); then every weight trained, or LoRA's adapters beside frozen ones.

NEW_MODEL = {  # from scratch: the new model's settings, as RECIPE's lines
    "vocab_size": (None, int, "ids in the vocabulary (257: bytes alone; default: 257, or --tokenizer's)"),
    "tokenizer": (None, str, "a folder with encoder.json and vocab.bpe to use instead of learning one"),
    "n_layer": (4, int, "blocks"),
    "n_head": (4, int, "attention heads a block"),
    "n_embd": (128, int, "the residual stream's width"),
}


def parameter_table(hparams):
    """The model's parameters by part, and the token embedding's share: in a small model most of
    them are the vocabulary's, which is why small models use small vocabularies."""
    counts = parameters.count_parameters(hparams)
    lines = [f"a new GPT-2: {plural(hparams['n_layer'], 'layer')}, {plural(hparams['n_head'], 'head')}, "
             f"{hparams['n_embd']} wide, {hparams['n_vocab']:,} ids, {plural(hparams['n_ctx'], 'position')}: "
             f"{counts['total']:,} parameters"]
    lines += [f"  {part:<28}{n:>12,}  {n / counts['total']:6.1%}" for part, n in counts["parts"].items() if n]
    return "\n".join(lines)


def new_model(new, documents, recipe, vocab_dir, quiet=False):
    """From scratch: new["tokenizer"]'s vocabulary, or one learned from the training documents into
    vocab_dir (once the model it asks for is known to fit), and the model's shape; its n_ctx is the
    recipe's context. -> (the vocabulary's folder, its encoder, hparams)"""
    shape = {"n_ctx": recipe["context"], "n_embd": new["n_embd"], "n_head": new["n_head"], "n_layer": new["n_layer"]}
    if new["tokenizer"]:
        encoder = bpe.get_encoder(new["tokenizer"])
        if new["vocab_size"] not in (None, encoder.n_vocab):
            raise UserError(f"--vocab-size {new['vocab_size']} disagrees with --tokenizer {new['tokenizer']}, which "
                            f"has {encoder.n_vocab} ids: give one of them")
        vocab_dir = new["tokenizer"]
    else:
        n_vocab = new["vocab_size"] or 257
        if new["vocab_size"]:  # learned only if the model it makes can fit: a merge costs time
            check_memory({"n_vocab": n_vocab, **shape}, recipe["batch_size"], recipe["context"], available_memory())
        train_documents, _ = split_documents(documents, recipe["val_fraction"])
        bpe.write_vocab(vocab_dir, bpe.train_vocab(train_documents, n_vocab, quiet))
        encoder = bpe.get_encoder(vocab_dir)
    if encoder.eot is None:
        raise UserError("its vocabulary has no <|endoftext|>", path=vocab_dir)
    return vocab_dir, encoder, {"n_vocab": encoder.n_vocab, **shape}


def saved_model(folder, out):
    """A model to train further, from its folder (which holds its vocabulary too), whose shape the
    checkpoint written to out can hold. -> (its encoder, hparams, params: read-only maps of the file, and
    a classifier's head, classifier_files.read_head's, or None)"""
    hparams, params = load_weights(folder)
    check_writable(hparams, out)  # before training, not at the first save
    return bpe.get_encoder(folder), hparams, params, classifier_files.read_head(folder, hparams["n_embd"])


def split_data(encoder, documents, examples, kind, recipe, head=None):
    """The data to train and validate on, as DATA_KINDS' line for the kind splits it: -> (training data,
    validation data), each {"kind", "rows", and what the kind keeps (a classifier's labels and pad id)}.
    head: the starting model's classifier head, or None (a language model)."""
    if head and kind != "labelled":
        raise UserError(f"the model is a classifier (labels {head['labels']}): it trains on labelled texts "
                        f'({{"text", "label"}} lines), not on {corpus.KINDS[kind][2]} lines; give a language model')
    train_rows, val_rows, kept = DATA_KINDS[kind]["split"](encoder, documents, examples, recipe, head)
    return {"kind": kind, "rows": train_rows, **kept}, {"kind": kind, "rows": val_rows, **kept}


def with_context(recipe, hparams):
    """The recipe with its context, if it gives none, the model's: CONTEXT, or n_ctx if that is fewer."""
    return recipe | {"context": recipe["context"] or min(CONTEXT, hparams["n_ctx"])}


def check_run(hparams, recipe, lora, free):
    """Refuse, before anything is made, a run that cannot be: a LoRA rank its layers cannot hold
    (lora: {"rank", "targets", ...}, or None), or one that does not fit in `free` bytes."""
    size = 0
    if lora:
        check_lora_rank(hparams, lora["rank"], lora["targets"])
        size = lora_size(hparams, lora["rank"], lora["targets"])
    check_memory(hparams, recipe["batch_size"], recipe["context"], free, size)


def lora_adapters(params, lora, seed, saved=None):
    """A LoRA run's adapters for params: new ones (new_adapters), or those saved in the folder `saved`
    (a resumed run), which must fit the model."""
    adapters = new_adapters(params, lora["rank"], lora["targets"], seed)
    if saved is None:
        return adapters
    found, _ = peft_adapter.read_adapter(saved)
    want = {k: a.shape for k, a in shapes.flatten(adapters).items()}
    if {k: a.shape for k, a in shapes.flatten(found).items()} != want:
        raise UserError(f"holds an adapter that does not fit {lora['base']} with --lora-rank {lora['rank']} "
                        f"--lora-targets {','.join(lora['targets'])}",
                        path=os.path.join(saved, peft_adapter.ADAPTER_FILE))
    return found


def set_up(out, recipe, data=None, base=None, new=None, lora=None, resume=False, vocab_dir=None, quiet=False,
           preference=None, xp=np):
    """Where a run's params and state come from. -> the run, as train takes it: {"params", "hparams",
    "encoder", "state", "train_data", "val_data", "recipe", "vocab_dir", "lora", "trained" (what AdamW steps),
    "log" (train_log.jsonl's lines so far)}.

    The model is new (NEW_MODEL's settings: a vocabulary learned from the training part of the data
    into the folder vocab_dir, or new["tokenizer"]'s; then GPT-2's initialisation); or base, the
    folder of a saved model, or a function that gives it (the command line's fetches --model by name,
    called only if the run needs it); or, with resume, the run saved in out (for LoRA: base, and the
    adapter saved in out). lora: {"rank", "alpha" (None: the rank), "targets", "base" (its name, for
    PEFT's config)} trains adapters beside the frozen weights; None: every weight. data: the text's
    paths (None: CORPUS). recipe: recipe_with's; a context of None is worked out here (with_context).
    The data's kind (plumbing/corpus.py tells it) is one of DATA_KINDS; labelled texts train a classifier
    (classify.py): a language model gets a new head. preference: PREFERENCE's settings, for preference
    data (None: its defaults). xp: the array module the run computes with (numpy; cupy: every weight, adapter
    and moment on the GPU, plumbing/device.py). Everything is checked before a weight is made or copied."""
    documents, examples, kind = corpus.read_corpus(data or [CORPUS])
    head = None
    if kind == "preference" and new and not resume:
        raise UserError("DPO tunes a model against a reference: give --model, not --from-scratch")
    if new and not resume:
        recipe = recipe | {"context": recipe["context"] or CONTEXT}
        vocab_dir, encoder, hparams = new_model(new, documents, recipe, vocab_dir, quiet)
    else:
        vocab_dir = out if resume and not lora else base() if callable(base) else base  # LoRA's out: merged
        encoder, hparams, params, head = saved_model(vocab_dir, out)
        if resume and lora:  # the head trained so far is in out, beside the adapter
            head = classifier_files.read_head(out, hparams["n_embd"])
        recipe = with_context(recipe, hparams)
    train_data, val_data = split_data(encoder, documents, examples, kind, recipe, head)
    check_run(hparams, recipe | ({"batch_size": 2 * recipe["batch_size"]} if kind == "preference" else {}), lora,
              available_memory() if xp is np else free_bytes(xp))  # 2 rows a pair
    if not (new and not resume):
        params = to_device(params, xp)  # once, from the file's maps (numpy: they stay the maps)
    if kind == "preference":
        preference = PREFERENCE | (preference or {})
        reference = to_device(reference_model(preference, params, hparams, encoder,
                                              base if resume and not lora else None), xp)
        train_data, val_data = (with_reference(part, reference, hparams, recipe["context"], encoder, preference,
                                               recipe["batch_size"], validation) for part, validation
                                in ((train_data, False), (val_data, True)))
    if new and not resume:  # its weights are made once the run is known to fit
        print(parameter_table(hparams))  # even with --quiet: what is being trained
        params = to_device(init_params(hparams, recipe["seed"]), xp)
    elif lora:  # the weights stay the file's read-only maps: only the adapters are trained
        lora = lora | {"alpha": lora["alpha"] or float(lora["rank"])}  # PEFT's r = alpha = 8 is a scale of 1
        lora["adapters"] = to_device(lora_adapters(params, lora, recipe["seed"], out if resume else None), xp)
        params = with_adapters(params, lora["adapters"], lora["alpha"] / lora["rank"])
    else:
        params = writable_copy(params)
    if kind == "labelled":  # a classifier's head: the starting one, or new ones, normal(0, 0.02)
        n_labels = len(train_data["labels"])
        params["score"] = to_device(head["score"] if head else classify.new_score(n_labels, hparams["n_embd"],
                                                                                  recipe["seed"]), xp)
    trained = lora["adapters"] if lora else params
    if lora and kind == "labelled":
        trained = trained | {"score": params["score"]}  # trained in full beside the adapters, as PEFT's SEQ_CLS
    state = to_device(load_state(out, trained), xp) if resume else new_adamw_state(trained)
    return {"params": params, "hparams": hparams, "encoder": encoder, "state": state, "train_data": train_data,
            "val_data": val_data, "recipe": recipe, "vocab_dir": vocab_dir, "lora": lora, "trained": trained,
            "log": read_log(out, state["step"]) if resume else []}


# ============================================================================
# 7. The loop
# ============================================================================

def train(run, out, config, quiet=False, parallel=None):
    """The loop, from the state's step to the recipe's steps: train_step, then the report, the sample and
    the save into `out` as the step's number calls for them; Ctrl-C saves the last step done. Each step's
    metrics, and each validation's, go to run["log"], which each save writes as train_log.jsonl.
    run: set_up's; config: the run's flags, saved with it. -> 0, or 130 after Ctrl-C. A step that diverges
    (Diverged) saves the steps done before it and is a UserError naming the step and the likely flag.
    parallel: one rank's part of a run on many processes (data_parallel.parallel's: its "step", "validation",
    "save" and "steps" in place of these, "waits" in place of ctrl_c_waits, "speaks" on rank 0 alone, and
    "logged", more for each step's line); None: this process alone."""
    params, hparams, encoder, state, recipe, lora = (run[k] for k in ("params", "hparams", "encoder", "state",
                                                                       "recipe", "lora"))
    steps, first, train_data = recipe["steps"], state["step"], run["train_data"]
    samples = train_data["kind"] != "labelled"  # a classifier writes no text: its reports say its accuracy
    start_ids = [] if encoder.eot is not None else train_data["rows"][:1].tolist()  # a sample starts after it
    tokens = recipe["batch_size"] * recipe["accum"] * recipe["context"]  # a step's
    bar, buffers = progress(steps, "step", initial=first, quiet=quiet), {}  # buffers: a step's big arrays, made once
    many = parallel or {"step": train_step, "validation": validation, "save": save, "steps": range,
                        "waits": ctrl_c_waits, "speaks": True, "logged": {}}
    try:
        for step in many["steps"](first + 1, steps + 1):  # counted from 1, as the reports say; train_step's from 0
            start = time.perf_counter()
            # a save after Ctrl-C holds whole steps, so --resume is the same run; an overflow is Diverged's to say
            with many["waits"](), np.errstate(over="ignore", invalid="ignore"):
                metrics = many["step"](params, hparams, state, train_data, step - 1, recipe, buffers,
                                       run["trained"] if lora else None)
                run["log"].append({"step": step, **metrics, **many["logged"]})
            bar.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{tokens / (time.perf_counter() - start):.0f}")
            bar.update(1)
            if step % recipe["eval_every"] == 0 or step == steps:
                val = many["validation"](params, hparams, run["val_data"], recipe)
                if val:
                    run["log"].append({"step": step, **{f"val_{name}": value for name, value in val.items()}})
                if many["speaks"]:
                    bar.write(report(step, metrics, val))
            if samples and many["speaks"] and step % recipe["sample_every"] == 0:
                bar.write(f"step {step} sample: {sample(params, hparams, encoder, recipe['seed'], start_ids)!r}")
            if step % recipe["save_every"] == 0 or step == steps:
                many["save"](out, run, config)
    except Diverged as e:
        bar.close()
        good = state["step"] > first and all(np.isfinite(a).all() for a in shapes.flatten(run["trained"]).values())
        saved = f"saved step {state['step']} in {out}" if good else "nothing new was saved"
        if good:  # the steps done before it, unless their weights are already infinite
            many["save"](out, run, config)
        likely = f"--lr {recipe['lr']:g}" + (f" or --beta {train_data['beta']:g}" if train_data["kind"] == "preference"
                                              else "")
        raise UserError(f"{e}; {saved}; the likely cause: {likely} too large") from None
    except KeyboardInterrupt:
        bar.close()
        if state["step"] == first:
            print("\ninterrupted before a step was done: nothing new was saved", file=sys.stderr)
        else:
            many["save"](out, run, config)
            print(f"\ninterrupted: saved step {state['step']} in {out}; --resume continues", file=sys.stderr)
        return 130
    bar.close()
    return 0


def validation(params, hparams, val_data, recipe):
    """The validation's metrics ({"loss", ...}, as DATA_KINDS' line for the kind says), or {} when
    nothing is held out."""
    return DATA_KINDS[val_data["kind"]]["validate"](params, hparams, val_data, recipe) if len(val_data["rows"]) else {}


def report(step, metrics, val):
    """`step 50: train loss 3.2104, validation loss 3.4511` (no validation part when nothing is held out),
    and the kind's other metrics beside each loss, the validation's by their train_log.jsonl names
    (a classifier's `accuracy 0.75, ..., val_accuracy 0.70`)."""
    def said(m, prefix=""):
        return ", ".join([f"loss {m['loss']:.4f}"] + [f"{prefix}{name} {value:.4f}" for name, value in m.items()
                                                       if name not in ("loss", "lr")])

    return f"step {step}: train {said(metrics)}" + (f", validation {said(val, 'val_')}" if val else "")


def sample(params, hparams, encoder, seed, start_ids=(), n_tokens=30):
    """A short text (top-k 40) after start_ids, or from nothing (after <|endoftext|>), to read what
    the model has learned so far."""
    n_tokens = min(n_tokens, hparams["n_ctx"] - max(len(start_ids), 1))
    ids = np.concatenate(list(generate(list(start_ids), params, hparams, n_tokens, seed=seed, top_k=40,
                                       stop=encoder.eot)))
    return encoder.decode(ids.tolist())


def validation_loss(params, hparams, val_rows, context, batches=4, batch_size=4, share=(0, 1)):
    """The loss on held-out windows of a token stream, or instruction rows (over their responses):
    the forward pass only. share (rank, ranks): that rank's part, every ranks-th batch, as its part of the
    mean (data_parallel.py)."""
    rng = np.random.default_rng(0)  # the same windows every time, so the numbers compare
    losses = []
    for b in range(batches):
        x, y = (batch(val_rows, batch_size, context, rng) if isinstance(val_rows, np.ndarray) else
                example_batch(val_rows, rng.integers(0, len(val_rows), batch_size)))
        if b % share[1] != share[0]:
            continue
        logits = gpt2(x, params, hparams)
        if (y == IGNORE).any():
            logits, y = logits[np.asarray(y != IGNORE, like=logits)], y[y != IGNORE]  # the mask where the logits are
        losses.append(next_token_loss(logits, y))
    return float(np.sum(losses) / batches)


# ============================================================================
# 8. Saving and resuming
# ============================================================================

def save(folder, run, config):
    """The run's checkpoint in OpenAI's format, the tokenizer's files (from run["vocab_dir"]), the
    optimizer's state, the run's flags (config) and its log (train_log.jsonl), written whole or not at
    all; a classifier's head and labels beside them (plumbing/classifier_files.py). A LoRA run writes the
    merged model, and beside it the adapter in PEFT's format, from which --resume reads A and B back
    (their moments are in the optimizer's state)."""
    state, lora, params, data = run["state"], run["lora"], run["params"], run["train_data"]
    moments = to_host({f"m/{k}": a for k, a in state["m"].items()} | {f"v/{k}": a for k, a in state["v"].items()})
    extra = {STATE_FILE: lambda f: np.savez(f, step=np.int64(state["step"]), **moments),  # streamed, not copied
             CONFIG_FILE: json.dumps(config, indent=1).encode(),
             LOG_FILE: "".join(json.dumps(line) + "\n" for line in run["log"]).encode()}
    if "score" in params:
        extra |= classifier_files.head_files(host(params["score"]), data["labels"], data["pad_id"])
        params = {k: v for k, v in params.items() if k != "score"}  # the checkpoint is GPT-2's tensors alone
    if lora:
        extra |= peft_adapter.adapter_files(to_host(lora["adapters"]), lora["alpha"], lora["targets"], lora["base"],
                                            host(run["params"].get("score")))
        params = merged_model(params)
    write_checkpoint(folder, to_host(params), run["hparams"], vocab_dir=run["vocab_dir"], extra=extra)  # the host's


def read_log(folder, step):
    """A resumed run's train_log.jsonl, up to the saved step (a run killed between saves wrote none past it)."""
    path = os.path.join(folder, LOG_FILE)
    if not os.path.exists(path):
        return []
    return [line for _, line in corpus.jsonl_objects(path) if line.get("step", 0) <= step]


def load_state(folder, params):
    """The optimizer's state saved in folder, for params (a LoRA run's: its adapters)."""
    with np.load(os.path.join(folder, STATE_FILE), allow_pickle=False) as z:
        names = shapes.flatten(params)
        return {"step": int(z["step"]), "m": {k: z[f"m/{k}"].copy() for k in names},
                "v": {k: z[f"v/{k}"].copy() for k in names}}

