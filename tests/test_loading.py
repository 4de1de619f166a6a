"""What each command does with a classifier's folder, as interface/loading.py decides it once: a command
whose answer is the next token's distribution refuses it in one line that names what to use instead (exit 2,
nothing written); a reading of activations alone takes its body."""
import json
import re
import os

import numpy as np
import pytest

from conftest import DATA, in_process, model_folder_copy
from interface import circuits_cli, evaluate_cli, gpt2_cli, loading, sae_cli, train_cli
from plumbing import classifier_files
from plumbing.errors import UserError

SCORE = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
SAE = os.path.join(DATA, "sae_golden", "sae")  # reads blocks.1.hook_resid_pre, 8 wide: tiny's
TEXT = "the cat sat on the mat and the dog ran to the park " * 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """tiny as a classifier (labels ham, spam), tiny as a language model, and a file of each kind of data."""
    root = tmp_path_factory.mktemp("loading")
    cls = model_folder_copy("tiny", str(root / "cls"))
    for name, content in classifier_files.head_files(SCORE, ["ham", "spam"], 50256).items():
        (root / "cls" / name).write_bytes(content)
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    (root / "prefs.jsonl").write_text(json.dumps({"prompt": "q", "chosen": " a", "rejected": " b"}) + "\n" * 1 +
                                      json.dumps({"prompt": "r", "chosen": " c", "rejected": " d"}) + "\n")
    return {"cls": cls, "lm": model_folder_copy("tiny", str(root / "lm")), "root": root}


REFUSAL = "is a classifier (labels ham, spam): its output is a label, not the next token"


def assert_refused(r, files, before):
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and REFUSAL in r.stderr, r.stderr
    assert f"use evaluate.py classify FILE --model {files['cls']}" in r.stderr
    assert sorted(os.listdir(files["root"])) == before  # nothing written


def data(files, name):
    return str(files["root"] / name)


NEXT_TOKEN = {  # each command whose answer is the next token's distribution: its arguments, the classifier given
    "evaluate perplexity": (evaluate_cli, lambda f: ["perplexity", data(f, "text.txt"), "--model", f["cls"]]),
    "evaluate surprisal": (evaluate_cli, lambda f: ["surprisal", data(f, "text.txt"), "--model", f["cls"]]),
    "evaluate choice": (evaluate_cli, lambda f: ["choice", os.path.join(DATA, "eval", "choice.jsonl"), "--model",
                                                 f["cls"]]),
    "evaluate lambada": (evaluate_cli, lambda f: ["lambada", os.path.join(DATA, "eval", "lambada.jsonl"), "--model",
                                                  f["cls"]]),
    "evaluate preference, the policy": (evaluate_cli, lambda f: ["preference", data(f, "prefs.jsonl"), "--model",
                                                                 f["cls"], "--reference", f["lm"]]),
    "evaluate preference, the reference": (evaluate_cli, lambda f: ["preference", data(f, "prefs.jsonl"), "--model",
                                                                    f["lm"], "--reference", f["cls"]]),
    "circuits logit-diff": (circuits_cli, lambda f: ["logit-diff", "--clean", "the cat sat on the", "--answer",
                                                     " mat", "--wrong", " dog", "--model", f["cls"]]),
    "circuits dla, its page": (circuits_cli, lambda f: ["dla", "--clean", "the cat sat on the", "--answer", " mat",
                                                        "--wrong", " dog", "--model", f["cls"], "--html",
                                                        data(f, "dla.html")]),
    "a draft": (gpt2_cli, lambda f: ["hi", "--model", f["lm"], "--draft", f["cls"], "--n-tokens", "2"]),
    "sae eval (its CE loss)": (sae_cli, lambda f: ["eval", "--sae", SAE, "--data", data(f, "text.txt"), "--context",
                                                   "16", "--model", f["cls"]]),
    "sae features (the tokens a latent promotes)": (sae_cli, lambda f: ["features", "--sae", SAE, "--data",
                                                                        data(f, "text.txt"), "--context", "16",
                                                                        "--model", f["cls"], "--html",
                                                                        data(f, "f.html")]),
    "DPO's reference": (train_cli, lambda f: ["--model", f["lm"], "--data", data(f, "prefs.jsonl"), "--reference",
                                              f["cls"], "--out", data(f, "dpo"), "--steps", "1", "--batch-size", "2",
                                              "--val-fraction", "0", "--quiet"]),
}


@pytest.mark.parametrize("case", NEXT_TOKEN)
def test_a_command_that_answers_with_the_next_token_refuses_a_classifier_in_one_line(files, capsys, case):
    main, argv = NEXT_TOKEN[case]
    before = sorted(os.listdir(files["root"]))
    assert_refused(in_process(main.main, capsys, *argv(files), *(["--quiet"] if main is not train_cli else [])),
                   files, before)


@pytest.mark.parametrize("flag", [["--score"], ["--lens"], ["--top", "3"], ["--html", "page.html"],
                                  ["--n-tokens", "3"]])
def test_gpt2_numpy_refuses_a_classifier_the_next_token_readings_and_names_the_flag(files, capsys, flag):
    before = sorted(os.listdir(files["root"]))
    if flag[0] == "--html":
        flag = [flag[0], data(files, flag[1])]
    r = in_process(gpt2_cli.main, capsys, "the cat", "--model", files["cls"], "--quiet", *flag)
    assert_refused(r, files, before)
    assert f"not the next token, so {flag[0]} does not apply" in r.stderr


def test_gpt2_numpy_traces_a_classifier_up_to_its_labels_logits(files, capsys):
    r = in_process(gpt2_cli.main, capsys, "the cat sat", "--model", files["cls"], "--trace", "--json")
    assert r.returncode == 0, r.stderr
    stages = json.loads(r.stdout)["stages"]
    assert stages[-2]["name"] == "ln_final.hook_normalized" and stages[-1]["name"] == "score (the labels' logits)"
    assert stages[-1]["shape"] == [1, 2]
    r = in_process(gpt2_cli.main, capsys, "the cat sat", "--model", files["cls"], "--json")
    logits = json.loads(r.stdout)["logits"]  # the label's: the trace's last stage is the same numbers
    assert stages[-1]["max"] == pytest.approx(max(logits), rel=1e-6)


def test_circuits_head_detectors_read_a_classifiers_attention(files, capsys):
    r = in_process(circuits_cli.main, capsys, "heads", "--text", "random:6", "--pattern", "previous", "--json",
                   "--model", files["cls"])
    lm = in_process(circuits_cli.main, capsys, "heads", "--text", "random:6", "--pattern", "previous", "--json",
                    "--model", files["lm"])
    assert r.returncode == 0 and json.loads(r.stdout) == json.loads(lm.stdout)  # the body is the language model's


def test_sae_train_and_encode_read_a_classifiers_activations(files, tmp_path, capsys):
    out = tmp_path / "sae"
    r = in_process(sae_cli.main, capsys, "train", "--site", "blocks.1.hook_resid_pre", "--data",
                   data(files, "text.txt"), "--d-sae", "4", "--l1", "1", "--tokens", "32", "--batch-tokens", "32",
                   "--context", "16", "--out", out, "--model", files["cls"], "--quiet")
    assert r.returncode == 0, r.stderr
    assert (out / "sae_weights.safetensors").exists()
    r = in_process(sae_cli.main, capsys, "encode", "--sae", SAE, "--text", "the cat", "--json", "--model",
                   files["cls"], "--quiet")
    lm = in_process(sae_cli.main, capsys, "encode", "--sae", SAE, "--text", "the cat", "--json", "--model",
                    files["lm"], "--quiet")
    assert r.returncode == 0 and json.loads(r.stdout) == json.loads(lm.stdout)


def test_loading_says_which_is_which(files):
    with pytest.raises(UserError, match=re.escape(REFUSAL)):
        loading.load_model(files["cls"])
    with pytest.raises(UserError, match=re.escape(REFUSAL)):
        loading.language_model_folder(files["cls"])
    _, _, params = loading.load_body(files["cls"])
    assert "score" not in params
    assert loading.language_model_folder(files["lm"]) == files["lm"]
