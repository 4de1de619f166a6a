"""decoding.py, beam search: one step against every continuation written out, the cache that follows the beams,
and Hugging Face generate's beam search id for id, with its sequences_scores (tests/data/generate_golden.json:
K = 2 and 4, length penalties 0, 1 and 2, early stopping on and off, R = K, the penalties, a stop string)."""
import numpy as np
import pytest

from conftest import generate_golden, golden_model, golden_settings, rand
import decoding as bs
import gpt2_numpy as g
from plumbing.errors import UserError


def test_beam_step_takes_the_best_continuations_of_all_the_beams():
    scores = np.array([-1.0, -2.5, -0.5], np.float32)
    logprobs = g.log_softmax(rand(3, 7, seed=4))
    totals, beams, tokens = bs.beam_step(scores, logprobs, 5)
    every = sorted(((scores[b] + logprobs[b, t], b, t) for b in range(3) for t in range(7)), reverse=True)[:5]
    assert list(zip(beams.tolist(), tokens.tolist())) == [(b, t) for _, b, t in every]
    np.testing.assert_array_equal(totals, [s for s, _, _ in every])
    assert totals.dtype == np.float32


def test_a_finished_score_is_the_summed_log_probability_over_the_length_to_the_power_a():
    total = np.array([-6.0], np.float32)
    got = [bs.finished_score(total, 3, a) for a in (0.0, 1.0, 2.0)]
    assert [x.dtype for x in got] == [np.float32] * 3  # float32, as generate's, no silent float64
    assert [float(x[0]) for x in got] == [-6.0, -2.0, float(np.float32(-6.0 / 9))]


def test_the_cache_follows_the_beams_by_a_gather_and_is_never_recomputed(monkeypatch):
    hparams, params, _ = golden_model("hf/inner")
    fed, model = [], bs.gpt2

    def counted(ids, *args, **kwargs):
        fed.append(np.shape(ids))
        return model(ids, *args, **kwargs)

    monkeypatch.setattr(bs, "gpt2", counted)
    bs.beam_search([5, 17, 80], params, hparams, n_tokens=6, num_beams=3)
    assert fed == [(1, 3)] + [(3, 1)] * 5  # the prompt once, then each beam's newest token
    cache = [{"k": np.arange(6.0).reshape(3, 1, 2, 1), "v": -np.arange(6.0).reshape(3, 1, 2, 1), "n": 2}]
    bs.follow_beams(cache, np.array([2, 2, 0]))
    assert cache[0]["k"][:, 0, :, 0].tolist() == [[4, 5], [4, 5], [0, 1]] and cache[0]["n"] == 2


@pytest.mark.parametrize("case", generate_golden("beams"), ids=lambda c: c["name"])
def test_beam_search_gives_generates_sequences_and_scores(case):
    hparams, params, token_bytes = golden_model(case["folder"])
    kw = case["generate"]
    best = bs.beam_search(case["prompt_ids"], params, hparams, num_beams=kw["num_beams"],
                          length_penalty=kw.get("length_penalty", 1.0), early_stopping=kw.get("early_stopping", False),
                          num_return_sequences=kw["num_return_sequences"], token_bytes=token_bytes,
                          **golden_settings(case))
    assert [ids for ids, _ in best] == case["sequences"]
    np.testing.assert_allclose([score for _, score in best], case["scores"], rtol=1e-5, atol=1e-6)


def test_beam_searchs_golden_runs_the_processors_as_exercise_30_says(monkeypatch):
    """docs/exercises.md says exercise 30's second test needs 28 and 29 done too: its cases call both processors."""
    import os
    from conftest import ROOT
    with open(os.path.join(ROOT, "docs", "exercises.md"), encoding="utf-8") as f:
        item = f.read().split("\n30. ", 1)[1].split("\n31. ", 1)[0]
    assert "it needs exercises 28 and 29 done too" in " ".join(item.split())
    called = set()
    for name in ("penalize_repeats", "ban_repeated_ngrams"):
        monkeypatch.setattr(g, name, lambda *args, name=name, real=getattr(g, name): called.add(name) or real(*args))
    for case in generate_golden("beams"):
        if "repetition_penalty" in case["generate"] or "no_repeat_ngram_size" in case["generate"]:
            test_beam_search_gives_generates_sequences_and_scores(case)
    assert called == {"penalize_repeats", "ban_repeated_ngrams"}


def test_beam_search_finds_likelier_text_than_greedy():
    """What beam search is for: on the trained model its best text is likelier than greedy's, over as many tokens."""
    hparams, params, _ = golden_model("shakespeare")
    prompt = [49, 46, 44, 36, 46, 25, 198]
    greedy = [int(s[0]) for s in g.generate(prompt, params, hparams, n_tokens=20, temperature=0)]
    (beam, _), = bs.beam_search(prompt, params, hparams, n_tokens=20, num_beams=4)
    logp = [g.score(prompt + ids, params, hparams)[0][len(prompt) - 1:].sum() for ids in (greedy, beam)]
    assert len(beam) == len(greedy) == 20 and logp[1] > logp[0], logp


@pytest.mark.parametrize("kwargs, arg", [
    ({"num_beams": 0}, "num_beams"), ({"num_beams": 2.5}, "num_beams"),
    ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences"),
    ({"num_return_sequences": 0}, "num_return_sequences"), ({"length_penalty": float("inf")}, "length_penalty"),
    ({"early_stopping": "never"}, "early_stopping"), ({"n_tokens": 0}, "n_tokens"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"stop_strings": [""]}, "stop_strings")])
def test_beam_settings_that_make_no_sense_are_refused_by_name(kwargs, arg):
    hparams, params, _ = golden_model("hf/inner")
    with pytest.raises(UserError) as e:
        bs.beam_search([1, 2], params, hparams, **{"n_tokens": 3, **kwargs})
    assert e.value.arg == arg
