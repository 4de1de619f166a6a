"""Measuring a GPT-2 the way the field does: perplexity of long texts, word surprisal, and multiple choice.

    python evaluate.py perplexity wiki.test.raw --json
    python evaluate.py surprisal sentences.txt
    python evaluate.py choice hellaswag.jsonl
    python evaluate.py lambada lambada_test.jsonl
    python evaluate.py classify texts.jsonl --model models/spam-124M

The definitions are those of EleutherAI's lm-evaluation-harness (lm-eval), the harness the
field reports with, and of minicons for word surprisal; docs/evaluating.md gives each one's
equation, and where the GPT-2 paper's own numbers differ. The file goes:
  1. rolling windows     how a text longer than the context is cut so every token is predicted once
  2. scoring in a batch  many (context, continuation) requests in one forward pass, padded on the right,
                         in batches of at most BATCH_TOKENS positions
  3. perplexity          of whole documents: nll, perplexity, word and byte perplexity, bits per byte
  4. loglikelihood       a continuation given a context (lm-eval's), and choice and lambada on top of it
  5. word surprisal      bits per word, a word's tokens found from their characters
  6. classification      a classifier's accuracy and confusion table (its logits: classify.py)
and above them all the entry point, which hands over to interface/evaluate_cli.py.

Every score is log p of a token given the tokens before it: gpt2_numpy's model, and its
token_logprobs. A text is scored after <|endoftext|> (encoder.eot), so its first token has a
prediction too. Shapes: B = requests in a batch, T = positions, C = n_embd, V = n_vocab.
rolling_windows_fast stands beside rolling_windows, and a test holds the two equal.
"""
if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("evaluate_cli")  # the command line (flags, files, printing, exit codes)

import math
import re

import numpy as np

from gpt2_numpy import checked_ids, gpt2_hidden, token_logprobs
from plumbing.device import host
from plumbing.errors import UserError

BATCH_SIZE = 8  # requests in one forward pass, at most
BATCH_TOKENS = 1024  # positions in one forward pass (requests x the longest), at most: one window of 124M's context
READ_AHEAD = 1024  # requests read ahead and sorted by length together: little padding, and memory stays flat
OUTPUT_LAYER_ROWS = 256  # positions through the output layer at a time: [256, V] logits are 51 MB at GPT-2's vocabulary


# ============================================================================
# 1. Rolling windows
# ============================================================================

def rolling_windows(ids, prefix_id, context, stride):
    """A text longer than the model's context, cut into windows, as lm-eval cuts it
    (get_rolling_token_windows with context_len = N - S + 1, then make_disjoint_window).
    -> [(window_context, window_targets), ...]; the model reads window_context + window_targets[:-1]
    (at most N = context tokens) and predicts window_targets.
    Every token of ids is predicted exactly once. The first window predicts its first N tokens
    after prefix_id; each later one predicts the next S = stride tokens from the N tokens before
    the last of them, so the first of those S sees N - S + 1 tokens of context. A smaller S gives
    each prediction more context (a lower perplexity) for N / S times the work."""
    check_stride(stride, context)
    ids = list(ids)
    if not ids:
        return []
    windows = [([prefix_id], ids[:context])]  # the first window: its first N tokens, after <|endoftext|>
    predicted = len(windows[0][1])
    while predicted < len(ids):
        end = min(predicted + stride, len(ids))  # the next S tokens (fewer at the end)
        windows.append((ids[end - 1 - context:predicted], ids[predicted:end]))  # N inputs end before the last target
        predicted = end
    return windows


def rolling_windows_fast(ids, prefix_id, context, stride):
    """rolling_windows, for a long document: one window at a time, each a pair of slices of ids (an
    array), so that no list of all its windows is ever made."""
    check_stride(stride, context)
    if len(ids):
        yield [prefix_id], ids[:context]
    predicted = min(context, len(ids))
    while predicted < len(ids):
        end = min(predicted + stride, len(ids))
        yield ids[end - 1 - context:predicted], ids[predicted:end]
        predicted = end


def check_stride(stride, context):
    """A window moves 1 to `context` tokens: a larger stride would skip tokens, and 0 would never move."""
    if not 1 <= stride <= context:
        raise UserError(f"must be between 1 and the context ({context}), got {stride}", arg="stride")


# ============================================================================
# 2. Scoring many requests in one [B, T] batch
# ============================================================================

def score_batch(requests, params, hparams):
    """log p of each continuation token given everything before it, for B requests in one forward pass.
    requests: [(context ids, continuation ids), ...], each read as context + continuation[:-1]
    -> [(logprobs [len(continuation)], greedy), ...]; greedy: every continuation token is the argmax.

    The inputs have different lengths; they are padded ON THE RIGHT to the longest, T, in one
    [B, T] batch. No attention mask is needed: the model is causal, so a real token attends only
    to the positions before it, which are all real, and the padding after it changes nothing it
    computes; and each text's positions stay 0..len-1, as when it is scored alone. Only the rows
    of real continuation tokens are read out.
    Padding on the left would be wrong without more work: it shifts every real token's position
    id by the padding's length (and would need a mask to hide the padding before it)."""
    inputs = [np.concatenate([np.asarray(c, np.int64), np.asarray(t, np.int64)])[:-1] for c, t in requests]
    batch = np.zeros((len(inputs), max(map(len, inputs))), np.int64)  # [B, T]; 0 pads: never attended to
    for row, x in zip(batch, inputs):
        row[:len(x)] = x
    checked_ids(batch, params)
    hidden = gpt2_hidden(batch, params, hparams)  # [B, T, C]
    where = [(i, len(x) - len(t)) for i, (x, (_, t)) in enumerate(zip(inputs, requests))]
    rows = np.concatenate([hidden[i, start:start + len(t)] for (i, start), (_, t) in zip(where, requests)])  # [M, C]
    targets = np.concatenate([np.asarray(t, np.int64) for _, t in requests])  # [M]
    logprobs, argmax = np.empty(len(rows), np.float32), np.empty(len(rows), np.int64)
    for s in range(0, len(rows), OUTPUT_LAYER_ROWS):  # the output layer a chunk of rows at a time: memory stays small
        chunk = slice(s, s + OUTPUT_LAYER_ROWS)
        logits = rows[chunk] @ params["wte"].T  # [OUTPUT_LAYER_ROWS, V]
        logprobs[chunk] = host(token_logprobs(logits, targets[chunk]))  # [M] numbers: read on the host
        argmax[chunk] = host(logits.argmax(axis=-1))
    ends = np.cumsum([len(t) for _, t in requests])
    return [(lp, bool(np.all(am == t))) for lp, am, t in
            zip(np.split(logprobs, ends[:-1]), np.split(argmax, ends[:-1]), np.split(targets, ends[:-1]))]


def score_requests(requests, params, hparams, batch_size=BATCH_SIZE, progress=None, *, batch_tokens=BATCH_TOKENS):
    """score_batch over any number of requests (an iterable, read READ_AHEAD requests ahead), in
    batches of at most batch_size requests and batch_tokens positions; -> the results one by one, in
    the input's order. progress(n): told, as each request is scored, how many tokens it scored."""
    requests = iter(requests)
    while True:
        pool = [r for _, r in zip(range(READ_AHEAD), requests)]
        if not pool:
            return
        results = [None] * len(pool)
        for chosen in batches(pool, batch_size, batch_tokens):
            for i, result in zip(chosen, score_batch([pool[i] for i in chosen], params, hparams)):
                results[i] = result
                if progress:
                    progress(len(pool[i][1]))
        yield from results


def batches(requests, batch_size, batch_tokens):
    """The requests in batches, longest first so that little is padded: each batch at most batch_size
    requests, and at most batch_tokens positions, its rows x its longest input (T of [B, T]). The
    budget is in positions because a forward pass's work and memory grow with them: a few long
    windows together outgrow the cache that one fits in, while short texts still batch many.
    A request longer than batch_tokens goes alone. -> [[index into requests, ...], ...]"""
    length = [len(context) + len(continuation) - 1 for context, continuation in requests]  # its input's T
    order = sorted(range(len(requests)), key=lambda i: -length[i])
    out, s = [], 0
    while s < len(order):
        rows = max(1, min(batch_size, batch_tokens // length[order[s]]))  # the first is the longest
        out.append(order[s:s + rows])
        s += rows
    return out


# ============================================================================
# 3. Perplexity of documents
# ============================================================================

def perplexity(documents, encoder, params, hparams, context=None, stride=None, batch_size=BATCH_SIZE, progress=None, *,
               batch_tokens=BATCH_TOKENS):
    """How well the model predicts whole documents, each scored on its own after <|endoftext|>,
    through rolling windows of `context` tokens (the model's n_ctx) moving `stride` (context) at a
    time; no window crosses two documents. The fields, as lm-eval's wikitext task defines them:
      nll = -Σ log p(token | the window before it), in nats, over every token of every document
      loss = nll / tokens,  perplexity = exp(loss)
      word_perplexity = exp(nll / words),  words = Σ len(re.split(r"\\s+", document))
      byte_perplexity = exp(nll / bytes),  bits_per_byte = nll / (bytes ln 2),  bytes of UTF-8
    Bits per byte compares models with different vocabularies: it divides by the text, not the tokens."""
    counts, windows = document_windows(documents, encoder, hparams, context, stride)
    return perplexity_fields(counts, score_requests(windows, params, hparams, batch_size, progress,
                                                    batch_tokens=batch_tokens))


def document_windows(documents, encoder, hparams, context=None, stride=None):
    """Every document encoded, and the requests that score it: -> (counts, windows), counts the
    documents, tokens, bytes and words (and the context and stride), windows an iterator of
    rolling_windows_fast's, made one at a time. So how many tokens there are to score is known
    before the first is scored."""
    context = hparams["n_ctx"] if context is None else context
    stride = context if stride is None else stride
    if not 1 <= context <= hparams["n_ctx"]:
        raise UserError(f"must be between 1 and the model's context ({hparams['n_ctx']}), got {context}", arg="context")
    check_stride(stride, context)
    documents = list(documents)
    for n, document in enumerate(documents, 1):
        if not document:
            raise UserError(f"document {n} is empty: too short to score")
    encoded = [np.asarray(encoder.encode(d), np.int64) for d in documents]  # 8 bytes a token, not a Python int's 36
    counts = {"documents": len(documents), "tokens": sum(map(len, encoded)),
              "bytes": sum(len(document.encode("utf-8")) for document in documents),
              "words": sum(len(re.split(r"\s+", document)) for document in documents),
              "context": context, "stride": stride}
    prefix = end_of_text(encoder)
    return counts, (window for ids in encoded for window in rolling_windows_fast(ids, prefix, context, stride))


def perplexity_fields(counts, scored):
    """perplexity's fields, from document_windows' counts and the scores of its windows (score_requests')."""
    nll = -sum(float(logprobs.sum(dtype=np.float64)) for logprobs, _ in scored)
    tokens, n_bytes, words = counts["tokens"], counts["bytes"], counts["words"]
    return {"documents": counts["documents"], "tokens": tokens, "bytes": n_bytes, "words": words,
            "nll": nll, "loss": nll / tokens, "perplexity": math.exp(nll / tokens),
            "word_perplexity": math.exp(nll / words), "byte_perplexity": math.exp(nll / n_bytes),
            "bits_per_byte": nll / (n_bytes * math.log(2)), "context": counts["context"], "stride": counts["stride"]}


def end_of_text(encoder):
    """<|endoftext|>'s id, which every text is scored after."""
    if encoder.eot is None:
        raise UserError("this vocabulary has no <|endoftext|> to score a text after")
    return encoder.eot


# ============================================================================
# 4. A continuation's log-likelihood: multiple choice and LAMBADA
# ============================================================================

def continuation_ids(context, continuation, encoder):
    """(context ids, continuation ids), as lm-eval encodes a pair: the context's trailing whitespace
    moves to the front of the continuation (GPT-2's tokens carry the space before a word); then
    context + continuation is encoded as one text, and the continuation's tokens are those after the
    context's own. An empty context is <|endoftext|>, and the continuation is encoded alone (so is
    one of whitespace only, after the move: it has no token to predict the continuation's first from)."""
    kept = context.rstrip()
    continuation, context = context[len(kept):] + continuation, kept
    if context == "":
        return [end_of_text(encoder)], encoder.encode(continuation)
    context_ids = encoder.encode(context)
    return context_ids, encoder.encode(context + continuation)[len(context_ids):]


def loglikelihood_requests(pairs, encoder, n_ctx, names=None):
    """Each (context, continuation) pair as a request for score_requests: its ids, the context cut to
    its last tokens when the two do not fit, as lm-eval cuts them (it keeps the last n_ctx + 1 tokens
    of context + continuation and drops the final one from the input). names[i]: what an error calls pair i."""
    requests = []
    for i, (context, continuation) in enumerate(pairs):
        name = names[i] if names else f"pair {i + 1}"
        context_ids, target_ids = continuation_ids(context, continuation, encoder)
        if not target_ids:
            raise UserError(f"{name}: the continuation {continuation!r} has no tokens of its own after the context")
        if len(target_ids) > n_ctx:
            raise UserError(f"{name}: the continuation's {len(target_ids)} tokens do not fit the model's "
                            f"context of {n_ctx}")
        keep = n_ctx + 1 - len(target_ids)  # context tokens that fit: at least 1
        requests.append((context_ids[max(0, len(context_ids) - keep):], target_ids))
    return requests


def loglikelihood(pairs, encoder, params, hparams, batch_size=BATCH_SIZE, progress=None, *, batch_tokens=BATCH_TOKENS):
    """log p(continuation | context) = Σ log p(token | the tokens before it), over the continuation's
    tokens, for each (context, continuation) pair, as lm-eval's loglikelihood.
    -> [(ll, greedy), ...]; greedy: every continuation token is the model's most likely one."""
    requests = loglikelihood_requests(pairs, encoder, hparams["n_ctx"])  # every pair checked before any is scored
    return [(float(lp.sum(dtype=np.float64)), greedy)
            for lp, greedy in score_requests(requests, params, hparams, batch_size, progress,
                                             batch_tokens=batch_tokens)]


def choice(items, lls):
    """Multiple choice, as lm-eval scores it, from the log-likelihood of each item's choices:
    acc: the most likely choice is the answer; acc_norm: the same with each log-likelihood divided
    by its choice's length in characters (lm-eval's HellaSwag normalisation, which keeps long
    choices from losing for their length alone).
    items: [{"context", "choices", "answer"}]; lls: each item's lls, [[ll per choice], ...]."""
    scored = [{"lls": ll, "pred": int(np.argmax(ll)),
               "pred_norm": int(np.argmax([x / len(c) for x, c in zip(ll, item["choices"])])),
               "answer": item["answer"]} for item, ll in zip(items, lls)]
    n = len(scored)
    return {"n": n, "acc": sum(s["pred"] == s["answer"] for s in scored) / n,
            "acc_norm": sum(s["pred_norm"] == s["answer"] for s in scored) / n, "items": scored}


def lambada_pair(text):
    """OpenAI's LAMBADA, as lm-eval's lambada_openai reads it: (the text up to its last space, " " + its last word)."""
    context, _, word = text.rpartition(" ")
    return context, " " + word


def lambada(results):
    """acc = the mean of greedy (the model's most likely tokens spell the last word);
    perplexity = exp(-mean ll).   results: [(ll, greedy)] of lambada_pair's pairs."""
    n = len(results)
    return {"n": n, "acc": sum(greedy for _, greedy in results) / n,
            "perplexity": math.exp(-sum(ll for ll, _ in results) / n),
            "items": [{"ll": ll, "greedy": greedy} for ll, greedy in results]}


# ============================================================================
# 5. Word surprisal
# ============================================================================

def word_owners(text, encoder, ids):
    """Which word each token belongs to: the word its last byte's character falls in, where a
    whitespace character belongs to the word after it (GPT-2's tokens carry the space before a
    word) and whitespace after the last word belongs to the last word, so the words' surprisals add
    up to the text's.   -> ([word, ...], [word index per token])"""
    words = text.split()
    owner_of_char, w = [], 0
    for m in re.finditer(r"(\s*)(\S+)|\s+$", text):
        owner_of_char += [min(w, len(words) - 1)] * (m.end() - m.start())
        w += 1 if m.group(2) else 0
    owner_of_byte = [o for ch, o in zip(text, owner_of_char) for _ in range(len(ch.encode("utf-8")))]
    ends = np.cumsum([len(encoder.token_bytes[i]) for i in ids])  # where each token's bytes end
    return words, [owner_of_byte[e - 1] for e in ends]


def word_surprisals(lines, encoder, params, hparams, batch_size=BATCH_SIZE, progress=None, *,
                    batch_tokens=BATCH_TOKENS):
    """Each word's surprisal in each line, the line scored on its own after <|endoftext|>:
    surprisal(word) = Σ -log2 p(token | the tokens before it), over the word's tokens, in bits.
    Words are the line split on whitespace; a word's tokens are those whose characters fall in it
    (word_owners). On single-spaced text this is minicons' word_score_tokenized (bos_token=True,
    surprisal=True, base_two=True); after runs of spaces, a tab or a leading space minicons, which
    counts a word's tokens from " " + word alone, gives a word the wrong tokens, and this does not.
    -> for each line, [(word, bits, n_tokens), ...]; a blank line gives []."""
    lines = list(lines)
    encoded = [encoder.encode(line) if line.split() else [] for line in lines]
    for n, ids in enumerate(encoded, 1):
        if len(ids) > hparams["n_ctx"]:
            raise UserError(f"line {n} has {len(ids)} tokens, more than the model's context of {hparams['n_ctx']}")
    scored = [i for i, ids in enumerate(encoded) if ids]
    requests = (([end_of_text(encoder)], encoded[i]) for i in scored)
    out = [[] for _ in lines]
    for i, (logprobs, _) in zip(scored, score_requests(requests, params, hparams, batch_size, progress,
                                                       batch_tokens=batch_tokens)):
        words, owners = word_owners(lines[i], encoder, encoded[i])
        bits, n_tokens = np.zeros(len(words)), np.zeros(len(words), np.int64)
        np.add.at(bits, owners, -logprobs.astype(np.float64) / math.log(2))  # -log2 p = -ln p / ln 2
        np.add.at(n_tokens, owners, 1)
        out[i] = [(word, float(b), int(k)) for word, b, k in zip(words, bits, n_tokens)]
    return out


# ============================================================================
# 6. Classification
# ============================================================================

def classification(true, predicted, n_labels):
    """-> (accuracy, confusion [K][K]): confusion[i][j] counts the texts of true label i predicted j."""
    confusion = np.zeros((n_labels, n_labels), np.int64)
    np.add.at(confusion, (np.asarray(true, np.int64), np.asarray(predicted, np.int64)), 1)
    return float(np.trace(confusion) / max(len(true), 1)), confusion.tolist()
