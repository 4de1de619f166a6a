"""gpt2_numpy.py's logit processors and stop strings: each against its rule written out here, then
generate id for id against Hugging Face's generate (tests/data/generate_golden.json, made by
tests/data/make_generate_golden.py): greedy with each processor and all of them, stop strings, and
the distributions sampling draws from with min-p and every warper at once."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import DATA, GENERATE_GOLDEN, ROOT, generate_golden, golden_model, golden_settings, rand
import gpt2_numpy as g
from plumbing.errors import UserError


# --- the processors, each against its rule -------------------------------------------------------

def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = rand(3, 20, seed=1)
    ids = np.array([[1, 2, 2, 5, 1], [0, 0, 0, 0, 0], [19, 3, 7, 11, 3]])
    for penalty in (1.5, 0.5):  # above 1 a seen token is made less likely; below 1, likelier
        want = logits.copy()
        for b, row in enumerate(ids.tolist()):
            for t in set(row):  # once a token, however often it came
                s = logits[b, t]
                want[b, t] = s / penalty if s > 0 else s * penalty
        got = g.penalize_repeats(logits, ids, penalty)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def banned_by_hand(row, n):
    """The tokens that would complete an n-gram already in `row`: every n-gram written out."""
    last = tuple(row[len(row) - n + 1:]) if n > 1 else ()
    return {row[i + n - 1] for i in range(len(row) - n + 1) if tuple(row[i:i + n - 1]) == last}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_no_repeat_mask_bans_each_token_that_would_complete_an_earlier_ngram(n):
    logits = rand(3, 12, seed=2)
    ids = np.array([[1, 2, 3, 1, 2, 4, 1, 2], [5, 5, 5, 5, 5, 5, 5, 5], [0, 1, 2, 3, 4, 5, 6, 7]])
    got = g.ban_repeated_ngrams(logits, ids, n)
    assert got.dtype == np.float32
    for b, row in enumerate(ids.tolist()):
        banned = banned_by_hand(row, n)
        assert set(np.flatnonzero(got[b] == -np.inf).tolist()) == banned, (n, row)
        kept = [t for t in range(12) if t not in banned]
        np.testing.assert_array_equal(got[b, kept], logits[b, kept])
    np.testing.assert_array_equal(g.ban_repeated_ngrams(logits, ids[:, :n - 1], n), logits)  # no n-gram yet


def test_the_penalties_apply_in_generates_order_and_only_when_on():
    logits, ids = rand(2, 9, seed=5), np.array([[1, 2, 1], [3, 3, 4]])
    want = g.ban_repeated_ngrams(g.penalize_repeats(logits, ids, 1.4), ids, 2)
    np.testing.assert_array_equal(g.penalized(logits, ids, 1.4, 2), want)
    assert g.penalized(logits, ids) is logits


def test_min_p_keeps_the_tokens_at_least_p_times_as_likely_as_the_most_likely():
    logits = rand(4, 30, seed=3, scale=2.0)
    for p in (0.0, 0.05, 0.3, 1.0):
        got = g.min_p_filter(logits, p)
        for b in range(4):
            probs = np.exp(logits[b].astype(np.float64) - logits[b].max())
            probs /= probs.sum()
            keep = probs >= p * probs.max()
            assert keep[logits[b].argmax()]
            np.testing.assert_array_equal(got[b][keep], logits[b][keep])
            assert np.all(got[b][~keep] == -np.inf)


def test_sampling_cuts_with_min_p_after_the_temperature_top_k_and_top_p():
    logits = rand(2, 40, seed=6, scale=3.0)
    want = g.softmax(g.min_p_filter(g.top_p_filter(g.top_k_filter(logits / 0.7, 20), 0.9), 0.1))
    np.testing.assert_array_equal(g.sampling_probs(logits, 0.7, 20, 0.9, 0.1), want)


@pytest.mark.parametrize("pieces, ends", [  # Hugging Face's StopStringCriteria's own examples, for "stop"
    (["st", "op"], True), (["stop"], True), (["st", "opera"], True), (["sto", "pper"], True),
    (["las", "topper"], True), (["s", "to", "pped"], True),
    (["stop", "at"], False), (["st", "op", "at"], False), (["st", "opera", "tion"], False)])
def test_a_stop_string_ends_at_the_token_that_completes_it(pieces, ends):
    text = "".join(pieces).encode()
    end = g.stop_string_end(text, len(pieces[-1]), [b"stop"])
    assert (end is not None) == ends
    if ends:
        assert text[:end].endswith(b"stop") and end > len(text) - len(pieces[-1])


def test_the_stop_string_that_ends_first_ends_the_text():
    assert g.stop_string_end(b"a cat sat", 4, [b"sat", b"cat", b"t s"]) == len(b"a cat s")
    assert g.stop_string_end(b"a cat sat", 4, [b"cat"]) is None  # it ended before the last token


# --- id for id against Hugging Face's generate ----------------------------------------------------

@pytest.mark.parametrize("case", generate_golden("greedy"), ids=lambda c: c["name"])
def test_greedy_with_the_processors_and_stop_strings_gives_generates_ids(case):
    hparams, params, token_bytes = golden_model(case["folder"])
    steps = g.generate(case["prompt_ids"], params, hparams, temperature=0, token_bytes=token_bytes,
                       **golden_settings(case))
    assert [int(step[0]) for step in steps] == case["sequences"][0]


@pytest.mark.parametrize("case", generate_golden("sampling"), ids=lambda c: c["name"])
def test_sampling_draws_from_generates_warped_distribution(case):
    """At each step of generate's own draw, the distribution we would draw from (the penalties, then the
    temperature, top-k, top-p and min-p) is generate's: the same tokens kept, the same probabilities."""
    hparams, params, _ = golden_model(case["folder"])
    kw, seq = case["generate"], list(case["prompt_ids"])
    for token, step in zip(case["sequences"][0], case["steps"]):
        logits = g.gpt2(np.array([seq]), params, hparams, last_only=True)[:, -1]
        logits = g.penalized(logits, np.array([seq]), kw.get("repetition_penalty", 1.0),
                             kw.get("no_repeat_ngram_size", 0))
        top_k = kw.get("top_k", 50) or None  # generate's own default top_k, 50; 0 turns it off
        probs = g.sampling_probs(logits, kw.get("temperature", 1.0), top_k, kw.get("top_p", 1.0), kw["min_p"])[0]
        assert np.flatnonzero(probs).tolist() == step["ids"]
        np.testing.assert_allclose(probs[step["ids"]], step["probs"], rtol=1e-4, atol=1e-6)
        seq.append(token)


def test_a_batch_stops_each_sample_at_its_stop_string_and_pads_it_with_the_stop_token():
    hparams, params, token_bytes = golden_model("shakespeare")
    steps = np.array(list(g.generate([49, 46, 44, 36, 46, 25, 198], params, hparams, n_tokens=30, n_samples=3, seed=4,
                                     stop=511, stop_strings=["e"], token_bytes=token_bytes)))  # [steps, 3]
    for sample in steps.T:
        text = b"".join(token_bytes[t] for t in sample)
        first = next(i for i in range(len(sample)) if b"e" in b"".join(token_bytes[t] for t in sample[:i + 1]))
        assert text.count(b"e") >= 1 and set(sample[first + 1:].tolist()) <= {511}, sample
    assert len(steps) < 30  # every sample ended, so the loop did


# --- bad input: one error naming its argument, before any step ---------------------------------------

@pytest.mark.parametrize("kwargs, arg", [
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"repetition_penalty": -1.2}, "repetition_penalty"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size"), ({"no_repeat_ngram_size": 2.0}, "no_repeat_ngram_size"),
    ({"min_p": 1.5}, "min_p"), ({"min_p": -0.1}, "min_p"),
    ({"stop_strings": [""]}, "stop_strings"), ({"stop_strings": "\n"}, "stop_strings"),
    ({"stop_strings": ["x"], "token_bytes": None}, "stop_strings")])
def test_processor_settings_that_make_no_sense_are_refused_by_name(kwargs, arg):
    hparams, params, token_bytes = golden_model("shakespeare")
    with pytest.raises(UserError) as e:
        g.generate([1, 2], params, hparams, n_tokens=3, **{"token_bytes": token_bytes, **kwargs})
    assert e.value.arg == arg


# --- dev-only: transformers itself, live ---------------------------------------------------------

DEV_PYTHON = os.environ.get("GPT2_DEV_PYTHON", "")


@pytest.mark.skipif(not DEV_PYTHON, reason="dev-only: needs a Python with torch and transformers 5.x: "
                                           "GPT2_DEV_PYTHON=/work/devvenv/bin/python python -m pytest -q "
                                           "tests/test_decoding.py -k live")
def test_live_generate_gives_what_the_golden_holds_and_ours_agrees(tmp_path):
    """generate run again now (make_generate_golden.py --out), and every golden test run against its answers."""
    fresh = tmp_path / "generate_golden.json"
    r = subprocess.run([DEV_PYTHON, os.path.join(DATA, "make_generate_golden.py"), "--out", str(fresh)], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(fresh, encoding="utf-8") as f:
        assert [c["name"] for c in json.load(f)["cases"]] == [c["name"] for c in GENERATE_GOLDEN]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_decoding.py",
                        "tests/test_beam_search.py", "tests/test_decoding_cli.py", "-k", "generate and not live"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "GPT2_GENERATE_GOLDEN": str(fresh)})
    assert r.returncode == 0 and " passed" in r.stdout.splitlines()[-1], r.stdout[-3000:]
