"""Preference tuning with DPO (Rafailov et al., 2023), exactly as TRL 1.16.0's DPOTrainer computes it.

    python train.py --model 124M --data prefs.jsonl --out models/dpo --beta 0.1     # {"prompt", "chosen", "rejected"}
    python evaluate.py preference prefs.jsonl --model models/dpo --reference 124M --json

A pair is a prompt and two completions, one preferred. DPO raises the policy's log-probability of the
chosen completion against the reference's, and lowers the rejected one's, with no reward model:

    δ = (log π(chosen) - log π_ref(chosen)) - (log π(rejected) - log π_ref(rejected)),   loss = -log σ(β δ)

the mean over the pairs. log π(·) is the sum of the completion's tokens' log-probabilities (TRL's
loss_type="sigmoid"); "sigmoid_norm" divides each log-ratio by its completion's length (the per-token
average of Raschka's notebook). β × a log-ratio is the "reward" TRL reports.

The gradient needs nothing new from backward.py. A sequence's log π is a sum over its tokens, so

    d loss / d logits[b, t] = w_b (softmax(logits[b, t]) - onehot(next token)),   w_b = -d loss / d log π_b

at each completion position: the instruction-tuning gradient of the sum, times one weight for its
sequence. For the pair's chosen row w = β σ(-β δ) / P (P pairs; / its length with sigmoid_norm), and
for the rejected row the same, negative: the chosen one is learned as instruction tuning learns a
response, the rejected one unlearned, both the more as the model gets the pair wrong (σ(-β δ) near 1).

The order: a pair's tokens (TRL's), a batch of pairs (TRL's collator), the log-probabilities, the loss
with its weights and metrics, and the gradient (backward.py's forward_backward, from those weights).
"""
import numpy as np

from backward import forward_backward, training_forward
from bpe import ENDOFTEXT
from gpt2_numpy import checked_ids, gpt2_hidden, log_softmax, softmax
from plumbing import corpus
from plumbing.device import host
from plumbing.errors import UserError
from plumbing.parallel import reused

LOSSES = ("sigmoid", "sigmoid_norm")  # --dpo-loss: TRL's loss_type names
FIELDS = tuple(corpus.KINDS["preference"][0])  # a preference line's keys: TRL's standard preference format
# A pair won by a wide margin has σ(-β δ) so small that its weight, and every product it enters in the
# backward, is a subnormal float32, which a CPU computes up to 100x slower (a 124M step: 200 s, not 6).
# Such a weight moves no parameter (AdamW's eps, 1e-8, dwarfs the gradients it makes): it is made 0.
NEGLIGIBLE = 1e-30
METRICS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected")  # TRL's names, as its logs print them


# ============================================================================
# 1. The data: a pair's tokens, as TRL makes them
# ============================================================================

def read_pairs(path):
    """A .jsonl of {"prompt", "chosen", "rejected"} lines -> [(prompt, chosen, rejected)], read as train.py
    reads them (corpus.read_jsonl: a line that lacks a field, or whose chosen or rejected is empty, is a
    UserError naming it); a file of another kind of line is one too."""
    kind, pairs = corpus.read_jsonl(path)
    if kind != "preference":
        raise UserError(f"holds {corpus.KINDS[kind][2]} lines, not preference pairs: give {{\"prompt\", \"chosen\", "
                        '"rejected"} lines', path=path)
    return pairs


def common_prefix_length(a, b):
    """How many ids a and b start with in common."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def pair_ids(encoder, prompt, chosen, rejected):
    """TRL 1.16's tokens of a pair -> (prompt ids, chosen ids, rejected ids). <|endoftext|> ends each
    completion (unless it is there already); prompt, prompt + chosen and prompt + rejected are encoded
    whole, <|endoftext|> as its id (as transformers' tokenizer reads it); the prompt is the longest
    start the three share, and the rest is each completion. A prompt that ends in a space loses it:
    BPE joins the space to the completion's first word (" Paris"), so the completion begins there."""
    if encoder.eot is None:
        raise UserError("the vocabulary has no <|endoftext|> to end a completion with")
    ended = [c if c.endswith(ENDOFTEXT) else c + ENDOFTEXT for c in (chosen, rejected)]
    p, c, r = (encoder.encode(text, allowed_special="all") for text in (prompt, prompt + ended[0], prompt + ended[1]))
    n = min(common_prefix_length(p, c), common_prefix_length(p, r))
    return p[:n], c[n:], r[n:]


def tokenized_pairs(encoder, pairs, context):
    """[(prompt, chosen, rejected)] -> ([(prompt ids, chosen ids, rejected ids)], how many were dropped):
    a pair whose prompt alone fills the context is dropped (TRL's keep_start would leave it no
    completion token to learn from)."""
    kept = [pair_ids(encoder, *pair) for pair in pairs]
    fits = [ids for ids in kept if len(ids[0]) < context]
    return fits, len(kept) - len(fits)


def pair_batch(pairs, context, pad_id):
    """TRL's DataCollatorForPreference: P pairs -> ids [2P, T] and the completion mask [2P, T] (1 on a
    completion's tokens), the P chosen rows first, then the P rejected ones; each row prompt +
    completion, its first `context` tokens kept (keep_start), padded on the right with pad_id
    (<|endoftext|>: GPT-2 has no pad token) to the longest."""
    rows = [(p + c, [0] * len(p) + [1] * len(c)) for p, c, _ in pairs] + \
           [(p + r, [0] * len(p) + [1] * len(r)) for p, _, r in pairs]
    rows = [(ids[:context], mask[:context]) for ids, mask in rows]
    longest = max(len(ids) for ids, _ in rows)
    ids, mask = np.full((len(rows), longest), pad_id, np.int64), np.zeros((len(rows), longest), np.int64)
    for b, (row, m) in enumerate(rows):
        ids[b, :len(row)], mask[b, :len(m)] = row, m
    return ids, mask


# ============================================================================
# 2. The log-probabilities of a completion
# ============================================================================

def completion_positions(mask):
    """The positions whose next token is a completion's: mask [2P, T] -> bools [2P, T], position t
    predicting token t + 1. (A completion's first token, if it starts the row, is predicted by none.)"""
    scored = np.zeros(mask.shape, bool)
    scored[:, :-1] = mask[:, 1:] == 1
    return scored


def token_logps(x, wte, next_ids):
    """log softmax(x wteᵀ)[next id] at each scored position: x [N, C], next_ids [N] -> [N], and the
    logits [N, V] they came from. Only the completion's positions go through the output layer."""
    logits = x @ wte.T
    return np.take_along_axis(log_softmax(logits), next_ids[:, None], -1)[:, 0], logits


def sequence_logps(per_token, scored):
    """log π of each row's completion, the sum of its tokens' log-probabilities: per_token [N] (at the
    scored positions, in row order), scored [2P, T] -> [2P]."""
    rows = np.nonzero(scored)[0]
    return np.bincount(rows, weights=per_token.astype(np.float64), minlength=len(scored)).astype(np.float32)


def completion_logps(ids, mask, params, hparams):
    """log π of each row's completion under params (the reference's, or a policy's to judge it): the forward
    pass only. ids, mask [2P, T] -> [2P]"""
    scored = completion_positions(mask)
    x = gpt2_hidden(checked_ids(ids, params), params, hparams)
    on, next_ids = (np.asarray(a, like=x) for a in (scored, ids[:, 1:][scored[:, :-1]]))  # where x is (a GPU's?)
    per_token, _ = token_logps(x[on], params["wte"], next_ids)
    return sequence_logps(host(per_token), scored)


def batch_logps(ids, mask, params, hparams):
    """log π of each row of a batch, computed as loss_and_grads computes the policy's (training_forward's
    pass, no dropout, at this batch's shapes): the step's reference. A row's float32 sum depends on the
    batch it sits in (its padding, the products' shapes), so only the same computation on the same batch
    makes a reference that is the policy give exactly r = 0.   ids, mask [2P, T] -> [2P]"""
    ids, scored = checked_ids(ids, params), completion_positions(mask)
    _, top = training_forward(ids, params, hparams)
    on, next_ids = (np.asarray(a, like=top["ln_f"]) for a in (scored, ids[:, 1:][scored[:, :-1]]))  # where x is
    per_token, _ = token_logps(top["ln_f"][on], params["wte"], next_ids)
    return sequence_logps(host(per_token), scored)


def pair_logps(pairs, params, hparams, context, pad_id, batch_size=8):
    """log π of each pair's chosen and rejected completions, batch_size pairs a forward pass (the forward
    only: the reference's, computed once for each pair; a policy's, to judge it). -> [n, 2]"""
    out = []
    for i in range(0, len(pairs), batch_size):
        logps = completion_logps(*pair_batch(pairs[i:i + batch_size], context, pad_id), params, hparams)
        out.append(np.stack(np.split(logps, 2), axis=1))
    return np.concatenate(out) if out else np.zeros((0, 2), np.float32)


def pair_lengths(pairs, context):
    """Each pair's chosen and rejected completion tokens once cut to the context (sigmoid_norm's n). -> [n, 2]"""
    return np.array([[min(len(p) + len(completion), context) - len(p) for completion in (chosen, rejected)]
                     for p, chosen, rejected in pairs], np.int64).reshape(-1, 2)


def as_rows(per_pair):
    """[n, 2] (chosen, rejected) -> [2n]: the n chosen, then the n rejected, as a batch's rows are."""
    return np.concatenate([per_pair[:, 0], per_pair[:, 1]])


def check_reference(hparams, encoder, ref_hparams, ref_encoder, name):
    """A reference must read the same ids in the same context as the policy: else a UserError naming it."""
    other = ref_encoder.encoder != encoder.encoder or ref_encoder.ranks != encoder.ranks
    if (ref_hparams["n_vocab"], ref_hparams["n_ctx"]) != (hparams["n_vocab"], hparams["n_ctx"]) or other:
        raise UserError(f"--reference {name} must have the trained model's vocabulary and context ("
                        f"{hparams['n_vocab']:,} ids, {hparams['n_ctx']} positions; it has {ref_hparams['n_vocab']:,} "
                        f"and {ref_hparams['n_ctx']}{', and other tokens' if other else ''})")


# ============================================================================
# 3. The loss, its weight for each sequence, and TRL's metrics
# ============================================================================

def log_sigmoid(z):
    """log σ(z) = -log(1 + e^-z), without overflow for large |z|."""
    return np.minimum(z, 0.0) - np.log1p(np.exp(-np.abs(z)))


def sigmoid(z):
    return np.exp(log_sigmoid(z))


def dpo_loss(logps, ref_logps, lengths, beta, loss_type="sigmoid"):
    """The DPO loss over P pairs, its weights and TRL's metrics. logps, ref_logps [2P] (the chosen rows,
    then the rejected), lengths [2P] (each completion's tokens, at least 1). -> (loss, weights [2P],
    metrics). With r = log π - log π_ref and n = 1 (sigmoid) or the completion's length (sigmoid_norm):
        δ = r_c / n_c - r_r / n_r,   loss = mean -log σ(β δ),
        w_c = -d loss / d log π_c = β σ(-β δ) / (P n_c),   w_r = -β σ(-β δ) / (P n_r)
    The rewards are β r (not divided by n), as TRL reports them."""
    if loss_type not in LOSSES:
        raise ValueError(f"unknown DPO loss {loss_type!r}: one of {', '.join(LOSSES)}")
    logps, ref_logps = np.asarray(logps, np.float64), np.asarray(ref_logps, np.float64)
    P = len(logps) // 2
    ratios = logps - ref_logps  # [2P]: r_c for the P pairs, then r_r
    n = np.maximum(np.asarray(lengths, np.float64), 1.0) if loss_type == "sigmoid_norm" else np.ones(2 * P)
    delta = ratios[:P] / n[:P] - ratios[P:] / n[P:]  # [P]
    pull = beta * sigmoid(-beta * delta) / P  # [P]: -d loss / d δ
    weights = np.concatenate([pull / n[:P], -pull / n[P:]])
    rewards = beta * ratios
    metrics = {"loss": float(np.mean(-log_sigmoid(beta * delta))),
               "rewards/chosen": float(rewards[:P].mean()), "rewards/rejected": float(rewards[P:].mean()),
               "rewards/accuracies": float(np.mean(rewards[:P] > rewards[P:])),  # strictly, as TRL counts
               "rewards/margins": float(np.mean(rewards[:P] - rewards[P:])),
               "logps/chosen": float(logps[:P].mean()), "logps/rejected": float(logps[P:].mean())}
    return metrics["loss"], weights.astype(np.float32), metrics


def pairs_metrics(logps, ref_logps, lengths, beta, loss_type="sigmoid"):
    """TRL's metrics over many pairs, each [n, 2] (pair_logps, pair_lengths): the mean over all of them."""
    return dpo_loss(as_rows(logps), as_rows(ref_logps), as_rows(lengths), beta, loss_type)[2]


def judge(pairs, policy, reference, hparams, context, pad_id, beta, loss_type="sigmoid", batch_size=8):
    """How a tuned model (policy) prefers the pairs (pair_ids'), against the reference: TRL's metrics over
    them all, and "pairs", how many. The forward pass only, batch_size pairs at a time."""
    logps, ref_logps = (pair_logps(pairs, params, hparams, context, pad_id, batch_size)
                        for params in (policy, reference))
    return {"pairs": len(pairs)} | pairs_metrics(logps, ref_logps, pair_lengths(pairs, context), beta, loss_type)


def completion_lengths(mask):
    """Each row's completion tokens, as TRL's sigmoid_norm counts them (the mask's sum). mask [2P, T] -> [2P]"""
    return mask.sum(axis=1)


# ============================================================================
# 4. The gradient: the instruction-tuning gradient, one weight for each sequence
# ============================================================================

def weighted_logits_grad(logits, next_ids, row_weights):
    """d loss / d logits = w_b (softmax(logits) - onehot(next id)) at each scored position, its row's
    weight w_b.   logits [N, V], next_ids [N], row_weights [N] -> [N, V]"""
    d = softmax(logits)
    d[np.arange(len(next_ids), like=next_ids), next_ids] -= 1.0
    d *= row_weights[:, None]
    return d


def loss_and_grads(ids, mask, ref_logps, params, hparams, beta, loss_type="sigmoid", p_drop=0.0, rng=None,
                   frozen=False, buffers=None):
    """The DPO loss of a batch of pairs (pair_batch's ids and mask [2P, T]; ref_logps [2P], the reference's),
    TRL's metrics, and d loss / d every parameter (frozen, a LoRA run: the adapters' alone), through
    backward.py's forward_backward. buffers: the training loop's dict, where wte's gradient [V, C] is kept
    between steps (backward.loss_and_grads's). -> (loss, grads, metrics)"""
    ids = checked_ids(ids, params)
    scored = completion_positions(mask)

    def head(xf):  # ln_f's output [2P, T, C] -> the loss, its gradient, wte's head part, TRL's metrics
        on = np.asarray(scored, like=xf)  # the positions, where the activations are (a GPU's, or the host's)
        x, next_ids = xf[on], np.asarray(ids[:, 1:][scored[:, :-1]], like=xf)  # [N, C], [N]: the completions'
        per_token, logits = token_logps(x, params["wte"], next_ids)
        loss, weights, metrics = dpo_loss(sequence_logps(host(per_token), scored), ref_logps,
                                          completion_lengths(mask), beta, loss_type)  # on the host: [2P] numbers
        weights[np.abs(weights) < NEGLIGIBLE] = 0.0  # no subnormal products (NEGLIGIBLE)
        dlogits = weighted_logits_grad(logits, next_ids, np.asarray(weights[np.nonzero(scored)[0]], like=xf))
        dxf = np.zeros_like(xf)
        dxf[on] = dlogits @ params["wte"]  # logits = x wteᵀ: dx = dlogits wte
        # wte's gradient: the head's part, dlogitsᵀ x, in a buffer kept between steps (the backward adds the gather's)
        dwte = None if frozen else np.matmul(dlogits.T, x, out=reused(buffers, "dwte", params["wte"].shape, x.dtype,
                                                                      like=x))
        return loss, dxf, dwte, metrics

    return forward_backward(ids, params, hparams, head, p_drop, rng, frozen)
