"""Speculative decoding (decoding.py, part B): exact at greedy, exact in distribution, and the
caches it rewinds. The models are the committed real-TensorFlow checkpoints: 'odd' (96 ids) and its
perturbed copies as drafts, and 'tiny' (GPT-2's 50,257 ids) for the command line."""
import collections
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, VOCAB, model_folder_copy
import bpe
import gpt2_numpy as g
import parameters
import decoding as spec
from plumbing import shapes
from plumbing.checkpoint import write_checkpoint

PROMPT = [80, 66, 67, 37, 84]  # odd's greedy path from here has 11 different ids in 24, and repeats for lookup


def perturbed(params, scale, seed):
    """A copy of the weights with noise of `scale` times each tensor's spread: a draft that mostly agrees."""
    rng = np.random.default_rng(seed)
    return shapes.map_tensors(lambda x: (x + scale * x.std() * rng.standard_normal(x.shape)).astype(np.float32), params)


@pytest.fixture(scope="module")
def odd(models):
    hp, params = models["odd"]
    return {"model": (params, hp), "self": (params, hp), "perturbed": (perturbed(params, 0.3, 1), hp),
            "random": (parameters.init_params(hp, seed=5), hp), "lookup": "lookup"}


def tokens(steps):
    """generate's steps, run: the one sample's ids."""
    return [int(step[0]) for step in steps]


def drafted(prompt, params, hp, n_tokens, draft, draft_tokens=4, **kw):
    """generate_with_draft's steps, with the arguments in generate's order."""
    return spec.generate_with_draft(prompt, params, hp, draft, draft_tokens, n_tokens, **kw)


# --- at greedy: the same ids -----------------------------------------------------------------------

@pytest.mark.parametrize("k", range(1, 7))
def test_at_greedy_the_ids_are_plain_greedys(odd, k):
    params, hp = odd["model"]
    plain = tokens(g.generate(PROMPT, params, hp, 24, temperature=0))
    assert len(set(plain)) >= 10  # a path worth comparing: not one id over and over
    for name in ("self", "perturbed", "random", "lookup"):
        counts = {}
        got = tokens(drafted(PROMPT, params, hp, 24, temperature=0, draft=odd[name], draft_tokens=k,
                                counts=counts))
        assert got == plain, (name, k)
        if name == "self":
            assert counts["accepted"] == counts["proposed"] > 0
        if name in ("perturbed", "lookup"):  # both branches of the test taken: kept tokens and fallen ones
            assert 0 < counts["accepted"] < counts["proposed"], (name, k, counts)
        if name == "random":
            assert counts["accepted"] < counts["proposed"] / 2, counts


def test_greedy_stops_at_the_stop_token_as_plain_greedy_does(odd):
    params, hp = odd["model"]
    plain = tokens(g.generate(PROMPT, params, hp, 24, temperature=0))
    stop = plain[6]
    want = plain[:plain.index(stop) + 1]
    for name in ("perturbed", "lookup"):
        assert tokens(drafted(PROMPT, params, hp, 24, temperature=0, stop=stop, draft=odd[name])) == want
    assert tokens(drafted(PROMPT, params, hp, 0, draft=odd["perturbed"])) == []
    assert tokens(drafted(PROMPT, params, hp, 1, temperature=0, draft=odd["perturbed"])) == plain[:1]
    first = next(drafted([], params, hp, 3, temperature=0, stop=7, draft="lookup"))  # an empty prompt: after stop
    assert first.tolist() == [int(g.gpt2([7], params, hp)[-1].argmax())]


# --- the test of a drafted token: exact by enumeration -------------------------------------------

def random_distribution(rng, v, zeros):
    """A random distribution over v ids, with `zeros` of them impossible (as top-k makes them)."""
    p = rng.random(v) ** 3
    p[rng.choice(v, zeros, replace=False)] = 0.0
    return (p / p.sum()).astype(np.float32)


def output_distribution(p, q):
    """The distribution of the token that one drafted position yields, enumerated: the draft draws x
    from q; x stands with acceptance_probability, else a draw from the leftover takes its place."""
    out = np.zeros(len(p))
    for x in np.flatnonzero(q):
        a = spec.acceptance_probability(p[x], q[x])
        out[x] += q[x] * a
        out += q[x] * (1 - a) * spec.leftover(p, q)
    return out


def test_a_drafted_token_that_stands_or_is_replaced_has_the_models_distribution_exactly():
    rng = np.random.default_rng(0)
    one_hot = np.eye(6, dtype=np.float32)
    cases = [(random_distribution(rng, 6, zp), random_distribution(rng, 6, zq)) for zp in (0, 2, 4) for zq in (0, 2, 5)
             for _ in range(20)]
    cases += [(p, p) for p, _ in cases[:5]]  # a draft that is the model: nothing falls, the leftover is never used
    cases += [(random_distribution(rng, 6, 2), one_hot[x]) for x in range(6)]  # lookup: q a point mass
    cases += [(one_hot[a], one_hot[x]) for a in range(6) for x in range(6)]  # greedy: both point masses
    for p, q in cases:
        np.testing.assert_allclose(output_distribution(p, q), p, atol=1e-6)


def test_the_acceptance_probability_and_the_residual_are_the_formulas():
    assert spec.acceptance_probability(0.2, 0.5) == pytest.approx(0.4)
    assert spec.acceptance_probability(0.5, 0.2) == 1.0
    assert spec.acceptance_probability(0.3, 0.0) == 1.0  # never drawn by the draft; no division by zero
    p, q = np.array([0.5, 0.3, 0.2, 0.0], np.float32), np.array([0.2, 0.5, 0.0, 0.3], np.float32)
    np.testing.assert_allclose(spec.leftover(p, q), [0.6, 0.0, 0.4, 0.0], atol=1e-7)
    np.testing.assert_array_equal(spec.leftover(p, p), p)


class Draws:
    """A stand-in for np.random.Generator that returns the uniform draws it is given, in turn."""

    def __init__(self, *values):
        self.values = list(values)

    def random(self, size=None, dtype=np.float64):
        value = self.values.pop(0)
        return value if size is None else np.full(size, value, dtype)


def test_verify_keeps_a_token_exactly_when_the_draw_is_below_its_acceptance_probability():
    p = np.array([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.0, 0.0, 1.0]], np.float32)
    q = np.array([[0.2, 0.2, 0.6], [0.5, 0.5, 0.0]], np.float32)
    # token 2 at position 0: min(1, 0.3 / 0.6) = 0.5; token 1 at position 1: 0.25 / 0.5 = 0.5
    assert spec.verify([2, 1], p, q, Draws(0.49, 0.49, 0.5)) == [2, 1, 2]  # both stand; then a draw from p[2]
    assert spec.verify([2, 1], p, q, Draws(0.49, 0.5, 0.9)) == [2, 2]  # the second falls: leftover [0, 0, 1]
    assert spec.verify([2, 1], p, q, Draws(0.5, 0.2)) == [1]  # the first falls: leftover [0, 1, 0]
    assert spec.verify([], p[2:], q[:0], Draws(0.3)) == [2]  # nothing drafted: one token of the model's


# --- the whole loop, sampling: the model's distribution --------------------------------------------

def chi_square_tail(x, df):
    """P(X >= x) for X ~ chi-square with df degrees of freedom: 1 - the regularised lower incomplete gamma
    function P(df/2, x/2), by its power series (Abramowitz & Stegun 6.5.29)."""
    a, z = df / 2, x / 2
    term = total = 1.0 / a
    n = 0
    while term > 1e-15 * total:
        n += 1
        term *= z / (a + n)
        total += term
    return 1.0 - math.exp(a * math.log(z) - z - math.lgamma(a)) * total


def first_tokens_distribution(params, hp, prompt, n, sampling):
    """{(x1, .., xn): probability} of the model's first n tokens after prompt, multiplied out exactly."""
    dist = {(): 1.0}
    for _ in range(n):
        dist = {seq + (x,): pr * float(p) for seq, pr in dist.items()
                for x, p in enumerate(spec.token_probs(g.gpt2(prompt + list(seq), params, hp)[-1:],
                                                    **sampling)[0]) if p > 0}
    return dist


@pytest.mark.parametrize("draft, n_runs", [("perturbed", 1500), ("lookup", 1500)])
def test_the_first_tokens_have_the_models_distribution(odd, draft, n_runs):
    """A chi-square goodness-of-fit test of the first three tokens' joint frequencies over n_runs
    speculative runs (seeds 0, 1, ...) against the model's own probabilities, multiplied out: 27
    outcomes under top-k 3, those expected fewer than 5 times pooled into one. With a fixed seed the
    test is deterministic; over seeds its false-alarm rate is the threshold, 1 in 1,000. The draft
    differs from the model (a perturbed copy, or lookup's point masses), so its tokens fall often
    and the leftover is drawn from: only an exact test leaves the frequencies at the model's."""
    params, hp = odd["model"]
    prompt = [42, 68, 62, 8, 68, 68, 8, 68] if draft == "lookup" else PROMPT  # lookup drafts 68 8: p about 1/2 each
    sampling = dict(temperature=1.0, top_k=3)
    want = first_tokens_distribution(params, hp, prompt, 3, sampling)
    seen, counts = collections.Counter(), {}
    for seed in range(n_runs):
        got = tuple(tokens(drafted(prompt, params, hp, 3, seed=seed, draft=odd[draft], draft_tokens=4,
                                      counts=counts, **sampling)))
        seen[got] += 1
        assert got in want
    expected = {x: n_runs * p for x, p in want.items()}
    big = [x for x in want if expected[x] >= 5]
    observed = [seen.get(x, 0) for x in big] + [n_runs - sum(seen.get(x, 0) for x in big)]
    expected = [expected[x] for x in big] + [n_runs - sum(expected[x] for x in big)]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 0)
    assert chi_square_tail(stat, sum(e > 0 for e in expected) - 1) > 1e-3, (stat, observed, expected)


def test_the_chi_square_tail_is_right():
    assert chi_square_tail(3.841459, 1) == pytest.approx(0.05, abs=1e-6)
    assert chi_square_tail(18.307038, 10) == pytest.approx(0.05, abs=1e-6)
    assert chi_square_tail(45.314747, 20) == pytest.approx(0.001, abs=1e-7)


def test_a_model_drafting_itself_keeps_every_token_when_sampling(odd):
    """p and q are the same distribution, so min(1, p/q) = 1: the draft's own cache must be right for this."""
    params, hp = odd["model"]
    counts = {}
    tokens(drafted(PROMPT, params, hp, 24, seed=3, top_p=0.9, draft=odd["self"], draft_tokens=5,
                      counts=counts))
    assert counts["proposed"] > 15 and counts["accepted"] == counts["proposed"]


def test_the_same_seed_gives_the_same_tokens_with_a_draft(odd):
    params, hp = odd["model"]
    def run(seed, draft):
        return tokens(drafted(PROMPT, params, hp, 20, seed=seed, draft=odd[draft]))

    for draft in ("perturbed", "lookup"):
        assert run(7, draft) == run(7, draft)
        assert run(7, draft) != run(8, draft)


# --- the caches, rewound ---------------------------------------------------------------------------

def test_every_step_draws_from_the_logits_a_fresh_pass_gives(odd):
    """watch sees the logits each token is drawn from; after each round's rejected tokens are forgotten
    (rewind), they must still be those of the whole text read afresh, without a cache."""
    params, hp = odd["model"]
    seen = []
    got = tokens(drafted(PROMPT, params, hp, 20, seed=0, draft=odd["random"], watch=seen.append))
    assert len(seen) == len(got) == 20
    for i, logits in enumerate(seen):
        fresh = g.gpt2(PROMPT + got[:i], params, hp)[-1]
        np.testing.assert_allclose(logits[0], fresh, atol=1e-5)


def test_rewind_forgets_a_rejected_draft(odd):
    params, hp = odd["model"]
    cache = g.new_kv_cache(hp, 1, 20)
    g.gpt2(np.array([PROMPT]), params, hp, cache)
    g.gpt2(np.array([[1, 2, 3, 4]]), params, hp, cache)  # a draft of four that falls
    spec.rewind(cache, len(PROMPT))
    assert all(kv["n"] == len(PROMPT) for kv in cache)
    after = g.gpt2(np.array([[9]]), params, hp, cache)[0, -1]
    np.testing.assert_allclose(after, g.gpt2(PROMPT + [9], params, hp)[-1], atol=1e-5)
    spec.rewind(cache, 50)  # never forward: a rewind past the filled positions changes nothing
    assert all(kv["n"] == len(PROMPT) + 1 for kv in cache)


def test_lookup_drafts_what_followed_the_longest_earlier_match():
    draft, q = spec.lookup_draft([1, 2, 3, 9, 2, 3, 8, 7, 1, 2, 3], 3, 10)
    assert draft == [9, 2, 3]  # "1 2 3" occurred at the start: what followed it
    np.testing.assert_array_equal(q, np.eye(10, dtype=np.float32)[[9, 2, 3]])
    assert spec.lookup_draft([5, 2, 3, 6, 4, 2, 3], 4, 10)[0] == [6, 4, 2, 3]  # "2 3" (no "4 2 3" before)
    assert spec.lookup_draft([5, 6, 7, 5], 4, 10)[0] == [6, 7, 5]  # "5" alone; the draft stops where the text does
    assert spec.lookup_draft([5, 5, 5, 5, 5, 5], 3, 10)[0] == [5, 5, 5]  # the first match, in a loop: k tokens after it
    draft, q = spec.lookup_draft([1, 2, 3], 4, 10)
    assert draft == [] and q.shape == (0, 10)


# --- mistakes: one clear error, at the call ---------------------------------------------------------

def short_context(draft):
    params, hp = draft
    return dict(params, wpe=params["wpe"][:8]), dict(hp, n_ctx=8)


@pytest.mark.parametrize("kw, message", [
    (dict(draft_tokens=0), "draft_tokens must be a whole number >= 1, got 0"),
    (dict(draft_tokens=2.5), "draft_tokens must be a whole number >= 1, got 2.5"),
    (dict(draft="bogus"), "a draft is 'lookup' or a model's (params, hparams), got 'bogus'"),
    (dict(draft="tiny"), "the draft's vocabulary has 50,257 ids, the model's 96"),
    (dict(draft="short"), "the prompt and the new tokens, 15 in all, exceed the draft's context of 8 tokens"),
])
def test_a_draft_that_cannot_draft_is_a_clear_error_at_the_call(models, odd, kw, message):
    params, hp = odd["model"]
    drafts = {"tiny": models["tiny"][::-1], "short": short_context(odd["perturbed"])}
    kw = dict(draft=odd["perturbed"]) | kw
    if isinstance(kw["draft"], str):
        kw["draft"] = drafts.get(kw["draft"], kw["draft"])
    with pytest.raises(ValueError) as e:
        drafted(PROMPT, params, hp, 10, **kw)  # no next(): the call raises
    assert message in str(e.value)


# --- the command line --------------------------------------------------------------------------------

def run(*args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), *args], capture_output=True, timeout=120)
    return r.returncode, r.stdout.decode("utf-8"), r.stderr.decode("utf-8")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return model_folder_copy("tiny", str(tmp_path_factory.mktemp("tiny") / "tiny"))


def test_the_command_line_drafts_with_lookup_or_a_model_and_reports_the_acceptance_rate(tiny):
    base = ("Hello, hello, hello", "--model", tiny, "--n-tokens", "12", "--no-stop", "--json")
    plain = json.loads(run(*base, "--greedy")[1])
    for draft in ("lookup", tiny):
        code, out, err = run(*base, "--greedy", "--draft", draft, "--draft-tokens", "3")
        assert code == 0, err
        got = json.loads(out)
        assert got["samples"] == plain["samples"]
        d = got["draft"]
        assert d["model"] == draft and d["tokens"] == 3 and 0 < d["proposed"] and 0 <= d["accepted"] <= d["proposed"]
        assert d["acceptance_rate"] == d["accepted"] / d["proposed"]
    streamed = [run(*base[:-1], "--seed", "4", "--draft", tiny) for _ in range(2)]
    assert streamed[0][0] == 0 and streamed[0][1] == streamed[1][1] and streamed[0][1].startswith("Hello, hello")
    assert "of the draft's tokens accepted" in streamed[0][2]


def test_a_draft_with_another_vocabulary_is_a_one_line_error(tiny, tmp_path):
    swapped = model_folder_copy("tiny", str(tmp_path / "swapped"))
    with open(os.path.join(VOCAB, "encoder.json"), encoding="utf-8") as f:
        ids = json.load(f)
    ids["hello"], ids["world"] = ids["world"], ids["hello"]  # the same size, two tokens' ids exchanged
    with open(os.path.join(swapped, "encoder.json"), "w", encoding="utf-8") as f:
        json.dump(ids, f)
    bytes_only = str(tmp_path / "bytes")  # a 257-id model, with bpe.py's vocabulary of the bytes alone
    bpe.write_vocab(str(tmp_path / "vocab"), [])
    hp = {"n_vocab": 257, "n_ctx": 64, "n_embd": 8, "n_head": 2, "n_layer": 1}
    write_checkpoint(bytes_only, parameters.init_params(hp), hp, vocab_dir=str(tmp_path / "vocab"))
    for draft in (swapped, bytes_only):
        code, out, err = run("Hello", "--model", tiny, "--draft", draft, "--quiet")
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"error: --draft {draft} has another vocabulary than --model {tiny}" in err


@pytest.mark.parametrize("args, message", [
    (["--draft-tokens", "3", "hi"], "--draft-tokens goes with --draft"),
    (["--draft", "lookup", "--draft-tokens", "0", "hi"], "error: --draft-tokens must be at least 1, got 0"),
    (["--draft", "lookup", "--n-samples", "2", "hi"], "--n-samples must be 1 with a draft"),
    (["--draft", "lookup", "--score", "hi"], "--draft is for generating text; --score reads the text once"),
    (["--draft", "lookup", "--draft-tokens", "x", "hi"], "error: --draft-tokens must be a whole number, got 'x'"),
])
def test_draft_flags_that_make_no_sense_are_one_line_errors(args, message):
    code, out, err = run(*args)
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_help_names_the_draft_flags():
    assert all(flag in run("--help")[1] for flag in ("--draft", "--draft-tokens"))
