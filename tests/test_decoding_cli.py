"""The decoding flags of python gpt2_numpy.py: --repetition-penalty, --no-repeat-ngram-size, --min-p, --stop,
--num-beams and its companions, on a model trained here (tests/data/shakespeare) and a Hugging Face folder
(tests/data/hf/tiny), each held to Hugging Face generate's ids (tests/data/generate_golden.json); and every
mistake beside them, one line and exit 2."""
import json
import os

import numpy as np
import pytest

from conftest import DATA, GENERATE_GOLDEN
import beam_search
from interface import gpt2_cli

TRAINED, HF_TINY = os.path.join(DATA, "shakespeare"), os.path.join(DATA, "hf", "tiny")
ROMEO, CAT = "ROMEO:\n", "The cat sat on the mat"


def golden(name):
    return next(case for case in GENERATE_GOLDEN if case["name"] == name)


def run(capsys, *args):
    """python gpt2_numpy.py ARGS, in this process -> (exit status, stdout, stderr)."""
    try:
        status = gpt2_cli.main([*args, "--quiet"])
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys, *args):
    status, out, err = run(capsys, *args, "--json")
    assert status == 0, err
    return json.loads(out)


@pytest.mark.parametrize("flags, name", [
    (["--repetition-penalty", "1.3"], "shakespeare: greedy, repetition_penalty 1.3"),
    (["--no-repeat-ngram-size", "3"], "shakespeare: greedy, no_repeat_ngram_size 3"),
    (["--repetition-penalty", "1.2", "--no-repeat-ngram-size", "2"],
     "shakespeare: greedy, repetition_penalty 1.2, no_repeat_ngram_size 2"),
    (["--stop", " then", "--stop", " be"], "shakespeare: greedy, stop strings two, the second first")])
def test_greedy_with_the_processors_on_a_trained_folder_is_generates(capsys, flags, name):
    case = golden(name)
    out = run_json(capsys, ROMEO, "--model", TRAINED, "--greedy", "--n-tokens", "16", *flags)
    assert out["prompt_ids"] == case["prompt_ids"]
    assert out["samples"][0]["ids"] == case["sequences"][0]


def test_a_stop_string_ending_mid_token_is_printed_and_nothing_after_it(capsys):
    """Streamed, the text ends with the stop string, though the token that completed it goes on; --json
    gives generate's ids, through that token, and the same text."""
    case = golden("shakespeare: greedy, stop strings ending mid-token")  # " bei", inside " being"
    status, out, err = run(capsys, ROMEO, "--model", TRAINED, "--greedy", "--n-tokens", "16", "--stop", " bei")
    assert status == 0 and out == ROMEO + "I'll bei\n", (out, err)
    sample = run_json(capsys, ROMEO, "--model", TRAINED, "--greedy", "--n-tokens", "16", "--stop", " bei")["samples"][0]
    assert sample == {"ids": case["sequences"][0], "text": "I'll bei", "finish": "stop"}


def test_stop_strings_and_the_no_repeat_mask_on_a_hugging_face_folder(capsys):
    case = golden("hf/tiny: greedy, stop strings spanning tokens")
    out = run_json(capsys, CAT, "--model", HF_TINY, "--greedy", "--no-stop", "--n-tokens", "16",
                   "--no-repeat-ngram-size", "1", "--stop", case["generate"]["stop_strings"][0])
    assert out["samples"][0]["ids"] == case["sequences"][0] and out["samples"][0]["finish"] == "stop"
    assert out["samples"][0]["text"].endswith("fl757acca")


def test_several_samples_each_end_at_their_own_stop_string(capsys):
    out = run_json(capsys, ROMEO, "--model", TRAINED, "--n-samples", "3", "--seed", "2", "--stop", "e", "--n-tokens",
                   "30")
    for sample in out["samples"]:
        assert sample["finish"] == "stop" and sample["text"].endswith("e") and sample["text"].count("e") == 1


def test_beam_search_on_a_trained_folder_is_generates_with_its_scores(capsys):
    case = golden("shakespeare: beams 4, its own <|endoftext|>, never written")
    out = run_json(capsys, ROMEO, "--model", TRAINED, "--num-beams", "4", "--num-return-sequences", "4",
                   "--n-tokens", "16")
    assert out["num_beams"] == 4 and [s["ids"] for s in out["samples"]] == case["sequences"]
    np.testing.assert_allclose([s["score"] for s in out["samples"]], case["scores"], rtol=1e-5)
    assert {s["finish"] for s in out["samples"]} == {"length"}


def test_beams_that_a_stop_string_ends(capsys):
    case = golden("shakespeare: beams 3, stop string")
    stop = case["generate"]["stop_strings"][0]
    out = run_json(capsys, "First Citizen:\n", "--model", TRAINED, "--num-beams", "3", "--num-return-sequences", "3",
                   "--n-tokens", "16", "--stop", stop, "--length-penalty", "1")
    assert [s["ids"] for s in out["samples"]] == case["sequences"]
    assert [s["finish"] == "stop" for s in out["samples"]] == [len(s) < 16 for s in case["sequences"]]
    assert all(s["text"].endswith(stop) for s in out["samples"] if s["finish"] == "stop")


def test_beams_are_printed_best_first_with_their_scores(capsys):
    status, out, err = run(capsys, ROMEO, "--model", TRAINED, "--num-beams", "3", "--num-return-sequences", "2",
                           "--n-tokens", "10")
    assert status == 0, err
    assert out.count("BEAM ") == 2 and out.index("BEAM 1, score -") < out.index("BEAM 2, score -")


def test_min_p_cuts_each_steps_alternatives(capsys):
    out = run_json(capsys, ROMEO, "--model", TRAINED, "--seed", "3", "--min-p", "0.2", "--top", "50", "--n-tokens",
                   "5")
    for step in out["samples"][0]["top"]:
        best = step[0]["prob"]
        assert all(entry["prob"] >= 0.2 * best - 1e-6 or entry["prob"] == 0 for entry in step)
        assert any(entry["prob"] == 0 for entry in step)  # something was cut


@pytest.mark.parametrize("args, message", [
    (["--repetition-penalty", "0"], "--repetition-penalty must be > 0 (1 is none), got 0.0"),
    (["--repetition-penalty", "-1.5"], "--repetition-penalty must be > 0"),
    (["--no-repeat-ngram-size", "-1"], "--no-repeat-ngram-size must be a whole number >= 0 (0 is none), got -1"),
    (["--min-p", "1.5"], "--min-p must be in [0, 1], got 1.5"),
    (["--min-p", "-0.1"], "--min-p must be in [0, 1]"),
    (["--stop", ""], "--stop must be texts, none empty"),
    (["--num-beams", "0"], "argument --num-beams: invalid whole number >= 1 value: '0'"),
    (["--num-beams", "2", "--num-return-sequences", "3"], "--num-return-sequences must be a whole number from 1 to "
                                                          "num_beams (2)"),
    (["--num-beams", "2", "--draft", "lookup"], "--draft and --num-beams 2 (beam search, which samples nothing) do "
                                                "not combine"),
    (["--num-beams", "2", "--n-samples", "2"], "--n-samples is for sampling; --num-beams 2"),
    (["--num-beams", "2", "--temperature", "0.7"], "--temperature is for sampling and does not go with --num-beams 2"),
    (["--num-beams", "2", "--top-k", "5"], "--top-k is for sampling"),
    (["--num-beams", "2", "--top-p", "0.9"], "--top-p is for sampling"),
    (["--num-beams", "2", "--min-p", "0.1"], "--min-p is for sampling"),
    (["--num-beams", "2", "--seed", "1"], "--seed is for sampling"),
    (["--num-beams", "2", "--json", "--top", "3"], "--top with --json gives sampling's alternatives"),
    (["--length-penalty", "2"], "--length-penalty goes with --num-beams 2 or more"),
    (["--early-stopping"], "--early-stopping goes with --num-beams 2 or more"),
    (["--num-return-sequences", "2"], "--num-return-sequences goes with --num-beams 2 or more"),
    (["--draft", "lookup", "--repetition-penalty", "1.2"], "--repetition-penalty and --draft do not combine"),
    (["--num-beams", "2", "--score"], "--num-beams is for generating text; --score reads the text once"),
])
def test_a_mistake_beside_the_decoding_flags_is_one_line_and_exit_2(capsys, args, message):
    status, out, err = run(capsys, "hi", "--model", TRAINED, *args)
    assert status == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_beams_with_greedy_are_still_beam_search(capsys):
    greedy = run_json(capsys, ROMEO, "--model", TRAINED, "--num-beams", "2", "--greedy", "--n-tokens", "8")
    plain = run_json(capsys, ROMEO, "--model", TRAINED, "--num-beams", "2", "--n-tokens", "8")
    assert greedy == plain and "score" in plain["samples"][0]


def test_ctrl_c_during_beam_search_exits_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(beam_search, "beam_search", interrupted)
    status, out, err = run(capsys, ROMEO, "--model", TRAINED, "--num-beams", "2")
    assert status == 130 and err == "interrupted\n"


def test_a_stop_string_ends_speculative_decoding_where_it_ends_plain_decoding(capsys):
    args = (ROMEO, "--model", TRAINED, "--greedy", "--n-tokens", "16", "--stop", " bei")
    assert run(capsys, *args, "--draft", "lookup") == run(capsys, *args)
