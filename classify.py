"""Classifying a text: GPT-2 with a label head, as transformers' GPT2ForSequenceClassification.

    python train.py --model 124M --data labelled.jsonl --out models/spam-124M      # {"text", "label"} lines
    python evaluate.py classify texts.jsonl --model models/spam-124M              # accuracy, confusion, each text

The model is GPT-2 up to ln_f (gpt2_hidden), and a new last layer: a `score` matrix [K, C] with no
bias, one row a label. A text's logits are its final hidden state at one position, times scoreᵀ:

    logits = ln_f(x)[b, p_b] scoreᵀ      p_b = the last position of row b whose id is not the pad

Why the last token: attention is causal, so only the last position has seen the whole text.
Why "not the pad": texts of a batch differ in length and are padded on the right with the pad id
(<|endoftext|>, as a GPT-2 is padded); row b's last position is a pad, which has seen the text
too but means nothing learned. transformers' rule is the last position whose id is not the pad
id, so a text that itself ends in <|endoftext|> is pooled at the token before it, and a text of
pads alone at position 0 (pooled_positions, exactly as transformers computes it).

The loss is the cross-entropy of the labels over the batch, and its gradient enters the model
at one position a text: d loss / d ln_f's output is 0 everywhere but at p_b (pool_backward,
the gather's mirror), and backward.py's forward_backward takes it from there. The head is a
matrix like any other: AdamW decays it; a LoRA run trains it in full beside the adapters, as
PEFT's task_type="SEQ_CLS" does (modules_to_save=["score"]).

The labels are numbered in sorted order (strings, or whole numbers, never both): label i is
score's row i. A folder keeps them beside the checkpoint (plumbing/classifier_files.py).
"""
import numpy as np

from backward import forward_backward
from gpt2_numpy import checked_ids, gpt2_hidden, log_softmax, softmax
from plumbing.device import host
from plumbing.errors import UserError
from plumbing.parallel import reused

SCORE_STD = 0.02  # a new head, as transformers starts one: normal(0, initializer_range)


# ============================================================================
# 1. The labels and the head
# ============================================================================

def label_names(labels):
    """The labels a training set uses, numbered: sorted, so that the same labels are always the same
    rows. labels: strings, or whole numbers (not both, which have no order between them)."""
    kinds = {isinstance(label, str) for label in labels}
    if len(kinds) > 1:
        raise UserError("the labels mix strings and whole numbers: give them all as one or the other")
    names = sorted(set(labels))
    if len(names) < 2:
        raise UserError(f"a classifier needs at least two labels; the training data has "
                        f"{'only ' + repr(names[0]) if names else 'none'}")
    return names


def new_score(n_labels, n_embd, seed):
    """A new head: score [K, C], each weight normal(0, 0.02)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(3,)))  # apart from the steps' and LoRA's
    return (rng.standard_normal((n_labels, n_embd)) * SCORE_STD).astype(np.float32)


# ============================================================================
# 2. Pooling at the last token that is not a pad
# ============================================================================

def pooled_positions(ids, pad_id):
    """p_b = max { t : ids[b, t] != pad } (0 if the row is all pads): transformers' rule, which also
    finds the text's end when it is padded on the left. With no pad (pad_id None) no id is one, and a
    row is pooled at its last position, as transformers pools a text alone.   ids [B, T] -> [B]"""
    return (np.arange(ids.shape[1]) * (ids != pad_id)).argmax(axis=-1)


def pool(x, positions):
    """Each row's hidden state at its position.   x [B, T, C], positions [B] -> [B, C]"""
    return x[np.arange(len(x), like=x), np.asarray(positions, like=x)]  # the indices where x is (a GPU's?)


def pool_backward(dpooled, positions, T):
    """pool backwards: the gradient goes back to each row's one position, 0 at every other.
    dpooled [B, C] -> dx [B, T, C]"""
    dx = np.zeros((len(dpooled), T, dpooled.shape[-1]), dpooled.dtype, like=dpooled)
    dx[np.arange(len(dpooled), like=dx), np.asarray(positions, like=dx)] = dpooled
    return dx


# ============================================================================
# 3. The logits, the loss and its gradient
# ============================================================================

def classifier_logits(ids, params, hparams, pad_id):
    """Token ids -> each text's logits over the labels: ln_f's output at p_b, times scoreᵀ.
    ids [B, T] -> [B, K]; one text, ids [T], gives [K]."""
    ids = checked_ids(ids, params)
    if ids.ndim == 1:
        return classifier_logits(ids[None], params, hparams, pad_id)[0]
    return pool(gpt2_hidden(ids, params, hparams), pooled_positions(ids, pad_id)) @ params["score"].T


def label_loss(logits, labels):
    """-mean log softmax(logits)[label] over the batch.   logits [B, K], labels [B]"""
    return -float(np.mean(log_softmax(logits)[np.arange(len(labels), like=logits), np.asarray(labels, like=logits)]))


def label_loss_backward(logits, labels):
    """d loss / d logits = (softmax(logits) - onehot(label)) / B.   [B, K] -> [B, K]"""
    d = softmax(logits)
    d[np.arange(len(labels), like=d), np.asarray(labels, like=d)] -= 1.0
    return d / len(labels)


def classifier_loss_and_grads(ids, labels, params, hparams, pad_id, p_drop=0.0, rng=None, frozen=False,
                              buffers=None):
    """The loss of labels [B] given ids [B, T] (padded on the right with pad_id), and d loss / d every
    parameter, score's among them:
        dscore = dlogitsᵀ h,   dh = dlogits score,   d ln_f's output = dh at p_b, 0 elsewhere
    where h [B, C] is the pooled hidden state. frozen (a LoRA run): the adapters' gradients and score's.
    buffers: the training loop's dict (backward.loss_and_grads's), where wte's gradient is kept between steps.
    -> (loss, grads, the batch's accuracy)"""
    ids, labels = checked_ids(ids, params), np.asarray(labels)
    positions = pooled_positions(ids, pad_id)

    def head(xf):  # ln_f's output [B, T, C] -> the loss, its gradient, wte's head part (none), score's, the logits
        h = pool(xf, positions)  # [B, C]
        logits = h @ params["score"].T  # [B, K]
        dlogits = label_loss_backward(logits, labels)
        dwte = None if frozen else reused(buffers, "dwte", params["wte"].shape, np.float32, like=params["wte"])
        if dwte is not None:  # the tied output layer is not used: wte's gradient is the gather's alone
            dwte.fill(0.0)  # kept between steps, it costs one pass of writes; fresh, the OS's page faults too
        dxf = pool_backward(dlogits @ params["score"], positions, ids.shape[1])
        return label_loss(logits, labels), dxf, dwte, (dlogits.T @ h, logits)

    loss, grads, (dscore, logits) = forward_backward(ids, params, hparams, head, p_drop, rng, frozen)
    return loss, grads | {"score": dscore}, float(np.mean(logits.argmax(axis=-1) == np.asarray(labels, like=logits)))


# ============================================================================
# 4. Using it
# ============================================================================

def text_ids(encoder, text, n_ctx):
    """A text's ids as the classifier reads them: <|endoftext|> written in it is the special id, nothing is
    appended, and a text longer than the context keeps its first n_ctx tokens (as training cuts it)."""
    return encoder.encode(text, allowed_special="all")[:n_ctx]


def classify_texts(texts, encoder, params, hparams, pad_id, batch_size=8):
    """Each text's logits over the labels, [N, K]: batches of batch_size texts, padded on the right with
    the pad id (the pooling finds each text's end; the causal mask hides the pads from it). With no pad
    id, a text is a batch of its own (transformers refuses to batch such a classifier)."""
    rows = [text_ids(encoder, text, hparams["n_ctx"]) for text in texts]
    batch_size = batch_size if pad_id is not None else 1
    out = []
    for start in range(0, len(rows), batch_size):
        part = rows[start:start + batch_size]
        ids = np.full((len(part), max(len(r) for r in part)), 0 if pad_id is None else pad_id, np.int64)
        for b, r in enumerate(part):
            ids[b, :len(r)] = r
        out.append(host(classifier_logits(ids, params, hparams, pad_id)))  # [B, K] numbers, on the host
    return np.concatenate(out) if out else np.zeros((0, len(params["score"])), np.float32)
