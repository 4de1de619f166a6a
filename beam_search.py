"""Beam search: greedy decoding that keeps K paths, as Hugging Face's generate runs it (num_beams=K).

    python gpt2_numpy.py "prompt" --num-beams 4                              # the best of 4 beams
    python gpt2_numpy.py "prompt" --num-beams 4 --num-return-sequences 2 --json   # each with its score

Greedy decoding keeps one sequence and takes its most likely next token. Beam search keeps the K
likeliest sequences found so far, the beams, scored by their summed log-probability. At each step:

  1. every beam's log-probabilities, log_softmax(logits) through the penalties (gpt2_numpy.penalized,
     not renormalised), are added to its score, and of all K·V continuations the best 2K are taken
     (beam_step);
  2. those among the first K that end (with <|endoftext|>, a stop string, or at the last step) are
     finished: each joins the finished list with score / length ** A (finished_score), and the list
     keeps its best K;
  3. the best K that did not end go on, and the KV cache follows them (follow_beams). 2K are taken so
     that K can go on even if every one of the first K ended.

It stops when the finished list is full (K sequences) and, with early_stopping, at once; without it,
once the best open beam's score / (its length) ** A cannot beat the worst finished one (generate's
heuristic for early_stopping=False); or when every candidate ended; or at the last step, where
the beams still open finish as every sequence does. It returns the best num_return_sequences.

The length is the count of new tokens, <|endoftext|> included (as generate counts it in 5.x); A,
length_penalty, is 1 by default: the mean log-probability per token. A = 0 is the plain sum (short
texts win), A > 1 favours longer ones. Every rule and constant here is generate's (transformers'
generation/utils.py, _beam_search and its helpers), so on the same weights the ids and scores are
its own (tests/test_beam_search.py). Beam search is deterministic: it samples nothing. Why it finds
likelier text than greedy, and why that text is often worse: docs/decoding.md.
"""
import numpy as np

from gpt2_numpy import check_sampling, checked_prompt, gpt2, is_whole_number, log_softmax, new_kv_cache, penalized, \
    stop_string_end
from plumbing.errors import UserError

ENDED = np.float32(-1e9)  # generate's push-down: a candidate that ended goes on only if fewer than K did not


def beam_step(scores, logprobs, n):
    """The n best continuations of all the beams: each beam's score plus each token's log-probability,
    the n largest of the B·V sums, best first.   scores [B], logprobs [B, V] -> (totals, beams, tokens), each [n]"""
    totals = (scores[:, None] + logprobs).ravel()  # [B·V]: beam b's token t is at b·V + t
    best = np.argpartition(-totals, n - 1)[:n]
    best = best[np.argsort(-totals[best], kind="stable")]
    return totals[best], best // logprobs.shape[1], best % logprobs.shape[1]


def finished_score(total, length, length_penalty):
    """A finished sequence's score: its summed log-probability / length ** A (length: its new tokens)."""
    return total / length ** length_penalty


def follow_beams(kv_cache, parents):
    """Each beam's keys and values go where the beam goes: every layer's row i becomes row parents[i], a
    gather on the batch axis (the prompt's one row becomes K at the first step). Nothing is recomputed."""
    for kv in kv_cache:
        kv["k"], kv["v"] = kv["k"][parents], kv["v"][parents]


def beam_search(ids, params, hparams, n_tokens=40, num_beams=4, length_penalty=1.0, early_stopping=False,
                num_return_sequences=1, stop=None, stop_strings=(), token_bytes=None, repetition_penalty=1.0,
                no_repeat_ngram_size=0):
    """The best num_return_sequences finished sequences, best first: [(new ids, score)], the ids
    through the token that ended each (stop, or the one completing a stop string). stop, stop_strings,
    token_bytes and the penalties mean what they mean to gpt2_numpy.generate. Checked before any work."""
    check_sampling(n_tokens, 0.0, None, 1.0, 1, 0.0, repetition_penalty, no_repeat_ngram_size, stop_strings,
                   token_bytes)
    check_beams(num_beams, num_return_sequences, length_penalty, early_stopping)
    if n_tokens == 0:
        raise UserError("must be at least 1 for beam search: the beams are the new tokens", arg="n_tokens")
    prompt, k = checked_prompt(ids, params, hparams, n_tokens, stop), num_beams
    stop_strings = [s.encode("utf-8") for s in stop_strings]
    kv_cache = new_kv_cache(hparams, 1, len(prompt) + n_tokens)
    logits = gpt2(prompt[None], params, hparams, kv_cache, last_only=True)[:, -1]  # [1, V]: the prompt, once
    seqs, scores = prompt[None], np.zeros(1, np.float32)  # the open beams: ids (prompt included), summed log p
    texts = [b"".join(token_bytes[i] for i in prompt)] if stop_strings else None
    finished = []  # [(score, new ids)], best first, at most k
    for step in range(n_tokens):
        logprobs = penalized(log_softmax(logits), seqs, repetition_penalty, no_repeat_ngram_size)  # [B, V]
        totals, beams, tokens = beam_step(scores, logprobs, 2 * k)  # [2k]
        ended = (tokens == stop) | (step == n_tokens - 1)
        if stop_strings:
            texts = [texts[b] + token_bytes[t] for b, t in zip(beams, tokens)]
            ended |= [stop_string_end(text, len(token_bytes[t]), stop_strings) is not None
                      for text, t in zip(texts, tokens)]
        for i in np.flatnonzero(ended[:k]):  # only the best k may finish; the rest are there to go on
            finished.append((float(finished_score(totals[i:i + 1], step + 1, length_penalty)[0]),
                             seqs[beams[i], len(prompt):].tolist() + [int(tokens[i])]))
        finished = sorted(finished, key=lambda f: -f[0])[:k]
        pushed = totals + ended * ENDED
        go_on = np.argsort(-pushed, kind="stable")[:k]
        scores = pushed[go_on]
        if ended.all() or len(finished) == k and (
                early_stopping or finished_score(scores[:1], step + 1, length_penalty)[0] <= finished[-1][0]):
            break
        seqs = np.concatenate([seqs[beams[go_on]], tokens[go_on, None]], axis=1)
        texts = [texts[i] for i in go_on] if stop_strings else None
        follow_beams(kv_cache, beams[go_on])
        logits = gpt2(tokens[go_on, None], params, hparams, kv_cache, last_only=True)[:, -1]  # [k, V]
    return [(new, score) for score, new in finished[:num_return_sequences]]


def check_beams(num_beams, num_return_sequences, length_penalty=1.0, early_stopping=False):
    """Clear errors for beam settings that make no sense; each names its argument."""
    if not is_whole_number(num_beams, 1):
        raise UserError(f"must be a whole number >= 1, got {num_beams!r}", arg="num_beams")
    if not (is_whole_number(num_return_sequences, 1) and num_return_sequences <= num_beams):
        raise UserError(f"must be a whole number from 1 to num_beams ({num_beams}): beam search returns at most "
                        f"its beams, got {num_return_sequences!r}", arg="num_return_sequences")
    if not np.isfinite(length_penalty):
        raise UserError(f"must be a finite number, got {length_penalty!r}", arg="length_penalty")
    if not isinstance(early_stopping, bool):
        raise UserError(f"must be True or False, got {early_stopping!r}", arg="early_stopping")
