# Needs evaluate.py (issue 24): this file holds its functions to the harness's numbers.
"""evaluate.py against the field's own tools: EleutherAI's lm-evaluation-harness and minicons.

tests/data/eval_golden.json is what lm-eval's rolling windows, HFLM.loglikelihood_rolling and
HFLM.loglikelihood, and minicons' word surprisal give on the Hugging Face folder tests/data/hf/tiny
(GPT-2's vocabulary, 64 positions). tests/data/make_eval_golden.py made it, with those tools in a
dev-only virtualenv; nothing here imports them.

Tolerance: both sides compute in float32. One token's log-probability carries rounding of a few
ulp of values near ln(50257) ~ 11 nats (~1e-6), and a sum of a hundred of them drifts by well under
1e-5 of itself (a plain NumPy scoring agreed with the golden to 2e-7). 1e-4 relative leaves room
for another order of summation and still fails on a wrong token, window or position: position ids
off by one (the left-padding bug) move these sums by 1% or more.
Greedy is compared exactly: the golden's script printed each pair's margin, the smallest 0.49
logits, far above float32 rounding."""
import json
import os

import pytest

import evaluate
from conftest import DATA
from interface.loading import load_model

with open(os.path.join(DATA, "eval_golden.json"), encoding="utf-8") as f:
    GOLDEN = json.load(f)
REL = 1e-4


@pytest.fixture(scope="module")
def tiny():
    """(encoder, hparams, params) of the folder the golden was made on."""
    assert GOLDEN["model"] == "hf/tiny"
    encoder, hparams, params = load_model(os.path.join(DATA, "hf", "tiny"))
    return encoder, hparams, params


@pytest.mark.parametrize("case", GOLDEN["windows"],
                         ids=lambda c: f"n{len(c['ids'])}-context{c['context']}-stride{c['stride']}")
def test_rolling_windows_are_lm_evals(case):
    windows = evaluate.rolling_windows(case["ids"], case["prefix"], case["context"], case["stride"])
    assert [[list(context), list(targets)] for context, targets in windows] == case["pairs"]


@pytest.mark.parametrize("item", GOLDEN["rolling"], ids=lambda item: repr(item["text"][:20]))
def test_a_documents_nll_is_lm_evals_loglikelihood_rolling(tiny, item):
    encoder, hparams, params = tiny
    result = evaluate.perplexity([item["text"]], encoder, params, hparams, context=item["context"])
    assert result["documents"] == 1 and result["context"] == result["stride"] == item["context"]
    assert result["nll"] == pytest.approx(item["nll"], rel=REL)


def test_documents_scored_together_add_up_to_each_scored_alone(tiny):
    encoder, hparams, params = tiny
    texts = [item["text"] for item in GOLDEN["rolling"]]
    result = evaluate.perplexity(texts, encoder, params, hparams, context=GOLDEN["rolling"][0]["context"])
    assert result["documents"] == len(texts)
    assert result["nll"] == pytest.approx(sum(item["nll"] for item in GOLDEN["rolling"]), rel=REL)


def test_loglikelihood_is_lm_evals(tiny):
    encoder, hparams, params = tiny
    items = GOLDEN["loglikelihood"]
    got = evaluate.loglikelihood([(item["context"], item["continuation"]) for item in items], encoder, params, hparams)
    assert len(got) == len(items)
    for (ll, greedy), item in zip(got, items):
        assert ll == pytest.approx(item["ll"], rel=REL), item
        assert bool(greedy) is item["greedy"], item
    assert any(item["greedy"] for item in items)  # the golden holds a greedy case, so greedy can fail


def test_word_surprisal_is_minicons(tiny):
    encoder, hparams, params = tiny
    items = GOLDEN["surprisal"]
    got = evaluate.word_surprisals([item["text"] for item in items], encoder, params, hparams)
    assert len(got) == len(items)
    for words, item in zip(got, items):
        assert [word for word, _, _ in words] == [word for word, _ in item["words"]], item["text"]
        expected = [bits for _, bits in item["words"]]
        assert [bits for _, bits, _ in words] == pytest.approx(expected, rel=REL), item["text"]
