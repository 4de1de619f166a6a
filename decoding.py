"""Decoding beyond the sampler: beam search, and speculative decoding.

  A. beam search          beam_step, finished_score, follow_beams, beam_search (Hugging Face's num_beams)
  B. speculative decoding the distributions, the test, the drafts, the loop (exact sampling, fewer passes)

A. Beam search: greedy decoding that keeps K paths, as Hugging Face's generate runs it (num_beams=K).

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
its own (tests/test_decoding.py). Beam search is deterministic: it samples nothing. Why it finds
likelier text than greedy, and why that text is often worse: docs/decoding.md.

B. Speculative decoding: several tokens a pass over the weights, sampled exactly.

    python gpt2_numpy.py "prompt" --draft lookup          # the text's own repeats draft
    python gpt2_numpy.py "prompt" --model 774M --draft 124M   # a smaller model drafts

Decoding one token streams every weight from memory for a single row of products; a pass that
reads k + 1 positions streams them once too. So a cheap draft guesses k tokens, the model reads
them all in one pass, and each guess it would have made itself is kept (Leviathan et al., 2023;
Chen et al., 2023). The test in `verify` keeps the model's distribution exactly, whatever the
draft: at temperature 0 the text is greedy decoding's, token for token. docs/speculative.md
tells the story, the proof, and when it pays.

Part B reads in the order of one round:
  1. the distributions   token_probs (what sample_next draws from), draw
  2. the test            acceptance_probability, leftover, verify
  3. the drafts          lookup_draft (no model), model_draft (a smaller model)
  4. the loop            generate_with_draft, rewind, the checks
"""
import numpy as np

from gpt2_numpy import (check_sampling, checked_prompt, gpt2, is_whole_number, log_softmax, new_kv_cache, no_hook,
                        penalized, sample_next, sampling_probs, stop_string_end)
from plumbing.device import host  # the logits to the host, where the draws and the beams' choices are made
from plumbing.errors import UserError

# ============================================================================
# A. Beam search
# ============================================================================

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
        at = np.asarray(parents, like=kv["k"])  # where the cache is (a GPU's, or the host's)
        kv["k"], kv["v"] = kv["k"][at], kv["v"][at]


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
    kv_cache = new_kv_cache(hparams, 1, len(prompt) + n_tokens, like=params["wte"])
    logits = host(gpt2(prompt[None], params, hparams, kv_cache, last_only=True)[:, -1])  # [1, V]: the prompt, once
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
        logits = host(gpt2(tokens[go_on, None], params, hparams, kv_cache, last_only=True)[:, -1])  # [k, V]
    return [(new, score) for score, new in finished[:num_return_sequences]]


def check_beams(num_beams, num_return_sequences, length_penalty=1.0, early_stopping=False):
    """Clear errors for beam settings that make no sense; each names its argument."""
    if not is_whole_number(num_beams, 1):
        raise UserError(f"must be a whole number >= 1, got {num_beams!r}", arg="num_beams")
    if not (is_whole_number(num_return_sequences, 1) and num_return_sequences <= num_beams):
        raise UserError(f"must be a whole number from 1 to num_beams ({num_beams}): beam search returns at most "
                        f"its beams, got {num_return_sequences!r}", arg="num_return_sequences")
    if not -50 <= length_penalty <= 50:  # length ** A must stay a number, for any length a model may have
        raise UserError(f"must be in [-50, 50], got {length_penalty!r}", arg="length_penalty")
    if not isinstance(early_stopping, bool):
        raise UserError(f"must be True or False, got {early_stopping!r}", arg="early_stopping")


# ============================================================================
# B. Speculative decoding
# ============================================================================

LOOKUP_NGRAMS = range(3, 0, -1)  # prompt lookup matches the text's last 3 tokens, else its last 2, else its last 1


# ============================================================================
# B1. The distributions
# ============================================================================

def token_probs(logits, temperature=1.0, top_k=None, top_p=1.0):
    """The distribution sample_next draws from, as probabilities: sampling_probs, or at temperature 0
    (greedy) all of it on the argmax.   [B, V] -> [B, V]"""
    if temperature == 0:
        probs = np.zeros(logits.shape, np.float32)
        np.put_along_axis(probs, logits.argmax(axis=-1)[:, None], 1.0, axis=-1)
        return probs
    return sampling_probs(logits, temperature, top_k, top_p)


def draw(probs, rng):
    """A draw from each row of probabilities, by sample_next itself: at temperature 1, on their logs,
    it draws from softmax(log p) = p.   [B, V] -> [B]"""
    with np.errstate(divide="ignore"):  # log 0 = -inf: a token that cannot be drawn
        return sample_next(np.log(probs), rng)


# ============================================================================
# B2. The test
# ============================================================================

def acceptance_probability(p_x, q_x):
    """min(1, p(x) / q(x)): how often a token x that the draft drew with probability q(x) stands, where
    the model gives it p(x). (Written so that q(x) = 0, which a draw never gives, is no division by 0.)"""
    return 1.0 if p_x >= q_x else p_x / q_x


def leftover(p, q):
    """What to draw from once a drafted token falls: max(0, p - q), normalised.   [V], [V] -> [V]
    The kept tokens gave each x min(p(x), q(x)) of its probability; this gives the rest, p(x) - that
    (the proof: docs/speculative.md). It is all zeros only where p = q, where no token falls; should
    rounding make one fall there, p itself is the right distribution."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0 else p


def verify(drafted, p, q, rng):
    """One round's test: keep the draft's tokens while they pass, then add one token of the model's.
    drafted [k] ids, q [k, V] the distributions the draft drew them from, p [k + 1, V] the model's at
    the same positions and one more (after the last drafted token). -> the new ids, 1 to k + 1 of them.
    Token i stands with probability acceptance_probability(p_i(x), q_i(x)); at the first that falls, a
    draw from leftover(p_i, q_i) takes its place and the round ends; if all stand, a draw from p_k
    follows. So each new token has the model's own distribution. At temperature 0, p and q are all on
    their argmax: a drafted token stands if it is the model's argmax, and the model's argmax follows."""
    for i, x in enumerate(drafted):
        if rng.random() >= acceptance_probability(p[i, x], q[i, x]):
            return drafted[:i] + [int(draw(leftover(p[i], q[i])[None], rng)[0])]
    return drafted + [int(draw(p[-1:], rng)[0])]


# ============================================================================
# B3. The drafts
# ============================================================================

def lookup_draft(seq, k, n_vocab):
    """Prompt lookup (Saxena, 2023): the draft is what followed the first earlier occurrence of the
    text's last n tokens, for the longest n in LOOKUP_NGRAMS that occurred before (the first, as Saxena's
    code and Hugging Face's take it: in a loop, the most recent would be too close to the end to have k
    tokens after it). No model: it pays where the text repeats itself (code, quotes, names, a loop).
    seq: the ids so far.
    -> (up to k ids, q [k, V]: each a point mass, since nothing else could have been drafted)"""
    text = np.asarray(seq)
    drafted = []
    for n in LOOKUP_NGRAMS:
        if len(text) > n:
            earlier = np.lib.stride_tricks.sliding_window_view(text[:-1], n)  # every n-gram with a token after it
            found = np.flatnonzero((earlier == text[-n:]).all(axis=-1))
            if found.size:
                drafted = text[found[0] + n:found[0] + n + k].tolist()
                break
    q = np.zeros((len(drafted), n_vocab), np.float32)
    q[np.arange(len(drafted)), drafted] = 1.0
    return drafted, q


def model_draft(seq, draft, draft_cache, k, sampling, rng):
    """A draft model's k tokens, one pass each through its own cache, each drawn from its own
    token_probs under the same sampling settings. seq: the ids so far; the draft first reads those it
    has not read yet (the prompt, at the start; later one, or two after a round that kept every token).
    -> (k ids, q [k, V]: the distribution each was drawn from)"""
    params, hparams = draft
    drafted, q = [], []
    new = seq[draft_cache[0]["n"]:]
    for _ in range(k):
        logits = host(gpt2(np.array([new]), params, hparams, draft_cache, last_only=True)[:, -1])  # [1, V]
        probs = token_probs(logits, **sampling)  # [1, V]
        new = [int(draw(probs, rng)[0])]
        drafted += new
        q.append(probs[0])
    return drafted, np.array(q, np.float32).reshape(k, params["wte"].shape[0])


# ============================================================================
# B4. The loop
# ============================================================================

def generate_with_draft(ids, params, hparams, draft, draft_tokens=4, n_tokens=40, temperature=1.0, top_k=None,
                        top_p=1.0, seed=None, stop=None, hook=no_hook, watch=None, counts=None):
    """gpt2_numpy.generate for one sample, with a draft: "lookup", or a second model with the same
    vocabulary as (params, hparams), which proposes draft_tokens tokens a round. It yields one token
    a step, as arrays [1], from the same distribution as generate (at temperature 0: the same ids),
    more of them a pass over the model's weights. counts, a dict, if given, counts the draft's
    tokens: "proposed" and "accepted". Every argument is checked here, before any step is taken."""
    check_sampling(n_tokens, temperature, top_k, top_p, 1)
    check_draft_tokens(draft_tokens)
    prompt = checked_prompt(ids, params, hparams, n_tokens, stop)
    check_draft(draft, params, len(prompt) + n_tokens)
    rng, sampling = np.random.default_rng(seed), dict(temperature=temperature, top_k=top_k, top_p=top_p)
    return draft_steps(prompt.tolist(), params, hparams, n_tokens, rng, sampling, stop, hook, watch, draft,
                       draft_tokens, counts if counts is not None else {})


def draft_steps(seq, params, hparams, n_tokens, rng, sampling, stop, hook, watch, draft, k, counts):
    """generate_with_draft's loop. Each round: the draft proposes up to k tokens (lookup_draft or
    model_draft); the model reads the last token and them, k + 1 positions, in one pass; verify keeps
    the tokens that stand and adds one of the model's; both caches forget the positions of the tokens
    that fell. The model's cache holds every token but the last, which each round's pass reads first."""
    n_vocab, end = params["wte"].shape[0], len(seq) + n_tokens
    kv_cache = new_kv_cache(hparams, 1, end, like=params["wte"])
    if len(seq) > 1:  # the prompt but its last token, which the first round's pass reads with the draft's
        gpt2(np.array([seq[:-1]]), params, hparams, kv_cache, last_only=True, hook=hook)
    draft_cache = None if draft == "lookup" else new_kv_cache(draft[1], 1, end, like=draft[0]["wte"])
    counts.update(proposed=0, accepted=0)
    while len(seq) < end:
        room = min(k, end - len(seq) - 1)  # a round adds up to k + 1 tokens, and no more than are asked for
        drafted, q = lookup_draft(seq, room, n_vocab) if draft == "lookup" else \
            model_draft(seq, draft, draft_cache, room, sampling, rng)
        logits = host(gpt2(np.array([seq[-1:] + drafted]), params, hparams, kv_cache, hook=hook)[0])  # [k + 1, V]
        new = verify(drafted, token_probs(logits, **sampling), q, rng)
        counts["proposed"] += len(drafted)
        counts["accepted"] += len(new) - 1
        for i, token in enumerate(new):
            if watch:
                watch(logits[i:i + 1])
            yield np.array([token])
            if token == stop:
                return
        seq = seq + new
        rewind(kv_cache, len(seq) - 1)
        if draft_cache is not None:
            rewind(draft_cache, len(seq) - 1)


def rewind(kv_cache, n):
    """Forget every cached position from n on (kv["n"] is how many are filled): the next kv_append
    writes over a rejected draft's keys and values, which nothing reads again."""
    for kv in kv_cache:
        kv["n"] = min(kv["n"], n)


def check_draft_tokens(draft_tokens):
    """A draft proposes at least one token a round."""
    if not is_whole_number(draft_tokens, 1):
        raise UserError(f"must be a whole number >= 1, got {draft_tokens!r}", arg="draft_tokens")


def check_draft(draft, params, end):
    """Clear errors for a draft that cannot draft for this model (end: the prompt and the new tokens)."""
    if isinstance(draft, str):
        if draft != "lookup":
            raise UserError(f"a draft is 'lookup' or a model's (params, hparams), got {draft!r}")
        return
    draft_params, draft_hparams = draft
    if draft_params["wte"].shape[0] != params["wte"].shape[0]:
        raise UserError(f"the draft's vocabulary has {draft_params['wte'].shape[0]:,} ids, the model's "
                        f"{params['wte'].shape[0]:,}: a draft must share the model's vocabulary")
    if end > draft_hparams["n_ctx"]:
        raise UserError(f"the prompt and the new tokens, {end} in all, exceed the draft's context of "
                        f"{draft_hparams['n_ctx']} tokens")
