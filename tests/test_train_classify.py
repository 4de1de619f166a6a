"""train.py on labelled texts: a classifier trained as a plain torch loop trains GPT2ForSequenceClassification
(tests/data/make_classify_golden.py), its folder, the epochs every kind of example is visited in, the log
of a run, and one-line errors for bad labelled data."""
import json
import os

import numpy as np
import pytest

import train
from conftest import model_folder_copy
from interface import train_cli
from plumbing import classifier_files
from test_classify import GOLDEN, PAD

SPAM = [("buy cheap pills now", "spam"), ("see you at lunch", "ham"), ("win a free prize today", "spam"),
        ("the train is late again", "ham"), ("claim your reward, click here", "spam"), ("dinner at eight?", "ham"),
        ("cheap loans, no questions", "spam"), ("happy birthday, Ann!", "ham")]


def write_jsonl(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return str(path)


def labelled(path, pairs=SPAM):
    return write_jsonl(path, [{"text": t, "label": label} for t, label in pairs])


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return model_folder_copy("tiny", str(tmp_path_factory.mktemp("lm") / "tiny"))


@pytest.fixture(scope="module")
def golden_classifier(tmp_path_factory):
    """tiny with the golden's starting head, as a classifier folder (the project's format)."""
    folder = model_folder_copy("tiny", str(tmp_path_factory.mktemp("cls") / "tiny-cls"))
    for name, content in classifier_files.head_files(GOLDEN["start_score"], GOLDEN["label_names"].tolist(),
                                                     PAD).items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(content)
    return folder


def run(model, data, out, *more):
    return train_cli.main(["--model", model, "--data", data, "--out", str(out), "--quiet", "--batch-size", "4",
                           "--steps", "4", "--eval-every", "2", "--save-every", "2", *more])


def read_log(out):
    return [json.loads(line) for line in (out / train.LOG_FILE).read_text().splitlines()]


def test_a_few_adamw_steps_equal_a_plain_torch_loop_on_gpt2_for_sequence_classification(golden_classifier, tmp_path):
    """From the same start (a classifier folder: its head goes on training), each step's loss in
    train_log.jsonl is torch's, within 1e-5 relative (a batch of every example, a constant rate)."""
    data = labelled(tmp_path / "l.jsonl", [(str(t), str(label)) for t, label in zip(GOLDEN["texts"],
                                                                                   GOLDEN["text_labels"])])
    out = tmp_path / "out"
    assert run(golden_classifier, data, out, "--val-fraction", "0", "--warmup", "0", "--min-lr-ratio", "1",
               "--weight-decay", "0", "--grad-clip", "1", "--lr", "1e-3") == 0
    log = read_log(out)
    assert all("val_loss" not in line for line in log)  # nothing held out
    np.testing.assert_allclose([line["loss"] for line in log], GOLDEN["adamw/losses"], rtol=1e-5)
    assert [line["lr"] for line in log] == [1e-3] * 4
    head = classifier_files.read_head(str(out), 8)
    assert head["labels"] == ["ham", "other", "spam"] and head["pad_id"] == PAD
    assert not np.array_equal(head["score"], GOLDEN["start_score"])  # it trained


def test_a_language_model_gets_a_new_head_and_the_folder_keeps_it_beside_hparams(tiny_lm, tmp_path, capsys):
    out = tmp_path / "spam"
    assert run(tiny_lm, labelled(tmp_path / "l.jsonl"), out) == 0
    printed = capsys.readouterr().out
    assert "labelled texts: 8, 1 held out for validation; labels ['ham', 'spam'] (in this order" in printed
    assert "validation loss" in printed and "accuracy" in printed and "sample:" not in printed
    assert f"classify with python evaluate.py classify FILE --model {out}" in printed
    assert {"classifier.json", "score.npy", "hparams.json", "train_log.jsonl"} <= set(os.listdir(out))
    assert json.loads((out / "classifier.json").read_text()) == {"labels": ["ham", "spam"], "pad_token_id": PAD}
    log = read_log(out)
    assert [sorted(line) for line in log if line["step"] == 2] == [["accuracy", "loss", "lr", "step"],
                                                                    ["step", "val_accuracy", "val_loss"]]
    score = np.load(out / "score.npy")
    assert score.shape == (2, 8) and score.dtype == np.float32


def test_the_epochs_visit_each_example_once_in_a_seeded_shuffle():
    n, b = 10, 4
    batches = [train.epoch_picks(n, b, seed=1, micro=m) for m in range(6)]  # 3 a epoch: 4, 4, 2
    assert [len(x) for x in batches] == [4, 4, 2, 4, 4, 2]
    for epoch in (batches[:3], batches[3:]):
        assert sorted(np.concatenate(epoch).tolist()) == list(range(n))
    assert np.concatenate(batches[:3]).tolist() != np.concatenate(batches[3:]).tolist()  # a new shuffle each epoch
    assert np.concatenate(batches[:3]).tolist() != list(range(n))
    assert train.epoch_picks(n, b, 1, 4).tolist() == batches[4].tolist()  # the micro-batch's number alone decides
    assert train.epoch_picks(n, b, 2, 0).tolist() != batches[0].tolist()  # and the seed
    assert sorted(train.epoch_picks(n, n, 0, 7).tolist()) == list(range(n))  # a batch of every example: the whole set


def test_a_stopped_labelled_run_resumes_bit_for_bit_and_its_log_goes_on(tiny_lm, tmp_path, monkeypatch):
    data = labelled(tmp_path / "l.jsonl")
    assert run(tiny_lm, data, tmp_path / "straight") == 0
    step, calls = train.train_step, []

    def ctrl_c_in_step_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(train, "train_step", ctrl_c_in_step_3)
    assert run(tiny_lm, data, tmp_path / "stopped") == 130
    assert [line["step"] for line in read_log(tmp_path / "stopped")] == [1, 2, 2]
    monkeypatch.setattr(train, "train_step", step)
    assert train_cli.main(["--out", str(tmp_path / "stopped"), "--resume", "--quiet"]) == 0
    for name in ("model.ckpt.data-00000-of-00001", "score.npy", "train_log.jsonl"):
        assert (tmp_path / "stopped" / name).read_bytes() == (tmp_path / "straight" / name).read_bytes(), name


@pytest.mark.parametrize("lines, message", [
    ([{"text": "a", "label": "x"}, {"text": "b", "label": "x"}], "a classifier needs at least two labels; the training "
                                                                  "data has only 'x'"),
    ([{"text": "a", "label": "x"}, {"text": "b", "label": "y"}, {"text": "c", "label": "z"}],
     "label 'z' is in validation (the data's last texts) but not in training"),
    ([{"text": "a", "label": 1}, {"text": "b", "label": "y"}], "the labels mix strings and whole numbers"),
    ([{"text": "a", "label": True}], "line 1: 'label' must be a string or a whole number"),
    ([{"text": "", "label": "x"}], "line 1's text is empty"),
    ([{"text": "a", "label": "x"}, {"text": "b"}], "line 2 is a document (text), but the lines before it are a "
                                                   "labelled text (text, label): give one kind"),
])
def test_bad_labelled_data_is_one_line_and_nothing_is_written(tiny_lm, tmp_path, capsys, lines, message):
    data = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(SystemExit) as e:
        run(tiny_lm, data, tmp_path / "out", "--val-fraction", "0.3")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_a_classifier_given_to_a_run_on_documents_or_instruction_data_is_one_line(golden_classifier, tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("the cat sat on the mat " * 40, encoding="utf-8")
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "q", "response": "a"}] * 4)
    for data, kind in ((str(text), "a document (text)"), (pairs, "an example (prompt, response)")):
        with pytest.raises(SystemExit):
            run(golden_classifier, data, tmp_path / "out", "--context", "16")
        err = capsys.readouterr().err
        assert "the model is a classifier (labels ['ham', 'other', 'spam']): it trains on labelled texts" in err
        assert f"not on {kind} lines" in err and not (tmp_path / "out").exists()


def test_val_fraction_0_is_allowed_for_instruction_data(tiny_lm, tmp_path):
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "q", "response": "a"}])
    out = tmp_path / "out"
    assert run(tiny_lm, pairs, out, "--val-fraction", "0", "--batch-size", "1") == 0
    assert [line["step"] for line in read_log(out)] == [1, 2, 3, 4]


# --- folders: Hugging Face's, both ways, and PEFT's adapter --------------------------------------

def sha256(path):
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def our_logits(folder):
    from plumbing.weights import load_weights
    import classify
    hp, params = load_weights(str(folder))
    head = classifier_files.read_head(str(folder), hp["n_embd"])
    return classify.classifier_logits(GOLDEN["batch/ids"], params | {"score": head["score"]}, hp, head["pad_id"]), head


def test_convert_writes_a_classifier_transformers_loads_with_the_same_logits_and_back(golden_classifier, tmp_path):
    import convert
    hf = tmp_path / "hf"
    convert.convert(golden_classifier, str(hf), "hf")
    assert [sha256(hf / name) for name in ("config.json", "model.safetensors")] == GOLDEN["hf_folder/sha256"].tolist()
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["GPT2ForSequenceClassification"] and config["num_labels"] == 3
    assert config["id2label"] == {"0": "ham", "1": "other", "2": "spam"} and config["label2id"]["spam"] == 2
    assert config["pad_token_id"] == PAD == int(GOLDEN["hf_folder/pad_token_id"])
    logits, head = our_logits(hf)  # read back by the project: transformers' logits, within 1e-5 of the largest
    scale = float(np.abs(GOLDEN["hf_folder/logits"]).max())
    np.testing.assert_allclose(logits, GOLDEN["hf_folder/logits"], rtol=0, atol=1e-5 * scale)
    assert head["labels"] == GOLDEN["hf_folder/id2label"].tolist()
    back = tmp_path / "back"
    convert.convert(str(hf), str(back), "openai")
    for name in ("model.ckpt.data-00000-of-00001", "score.npy", "classifier.json"):
        assert (back / name).read_bytes() == open(os.path.join(golden_classifier, name), "rb").read(), name


def test_whole_number_labels_go_to_hugging_face_as_digits_and_come_back_as_numbers(tiny_lm, tmp_path):
    import convert
    out = tmp_path / "digits"
    assert run(tiny_lm, labelled(tmp_path / "l.jsonl", [(t, int(label == "spam")) for t, label in SPAM]), out,
               "--steps", "1") == 0
    convert.convert(str(out), str(tmp_path / "hf"), "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["id2label"] == {"0": "0", "1": "1"}
    assert classifier_files.read_head(str(tmp_path / "hf"), 8)["labels"] == [0, 1]


def test_peft_loads_a_lora_classifiers_adapter_with_the_same_logits(tiny_lm, tmp_path):
    """PEFT's task_type SEQ_CLS: the adapters and the whole score (modules_to_save), which PEFT put on
    transformers' GPT2ForSequenceClassification and gave these logits (make_classify_golden.py)."""
    data = labelled(tmp_path / "l.jsonl", [(str(t), str(label)) for t, label in zip(GOLDEN["texts"],
                                                                                   GOLDEN["text_labels"])])
    out = tmp_path / "lora"
    assert train_cli.main(["--model", tiny_lm, "--data", data, "--out", str(out), "--batch-size", "4", "--steps", "3",
                           "--lr", "1e-2", "--lora-rank", "2", "--val-fraction", "0", "--quiet"]) == 0
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and config["modules_to_save"] == ["score"]
    logits, _ = our_logits(out)  # the merged model and its head
    scale = float(np.abs(GOLDEN["lora/logits"]).max())
    np.testing.assert_allclose(logits, GOLDEN["lora/logits"], rtol=0, atol=1e-5 * scale)


# --- evaluate.py classify ----------------------------------------------------------------------

def evaluate_classify(capsys, *args):
    from interface import evaluate_cli
    code = evaluate_cli.main(["classify", *args, "--quiet"])
    return code, capsys.readouterr()


def test_evaluate_classify_gives_the_accuracy_a_confusion_table_and_each_prediction(golden_classifier, tmp_path,
                                                                                     capsys):
    data = labelled(tmp_path / "t.jsonl", [(str(t), str(label)) for t, label in zip(GOLDEN["texts"],
                                                                                   GOLDEN["text_labels"])])
    code, out = evaluate_classify(capsys, data, "--model", golden_classifier, "--json")
    assert code == 0
    result = json.loads(out.out)
    names = ["ham", "other", "spam"]
    predicted = GOLDEN["batch/logits"].argmax(-1)
    assert result["labels"] == names and [p["label"] for p in result["predictions"]] == [names[i] for i in predicted]
    np.testing.assert_allclose([p["logits"] for p in result["predictions"]], GOLDEN["batch/logits"], atol=1e-5)
    true = GOLDEN["batch/labels"]
    assert result["accuracy"] == pytest.approx(np.mean(predicted == true))
    want = np.zeros((3, 3), int)
    np.add.at(want, (true, predicted), 1)
    assert result["confusion"] == want.tolist()
    code, out = evaluate_classify(capsys, data, "--model", golden_classifier)
    assert out.out.startswith(f"accuracy  {result['accuracy']:.4f}") and "true \\ predicted" in out.out
    assert out.out.splitlines()[-1].startswith(f"4\tother\t{names[predicted[3]]}\tThe meeting moved")
    unlabelled = write_jsonl(tmp_path / "u.jsonl", [{"text": str(t)} for t in GOLDEN["texts"]])
    code, out = evaluate_classify(capsys, unlabelled, "--model", golden_classifier, "--json")
    assert sorted(json.loads(out.out)) == ["labels", "predictions"]


@pytest.mark.parametrize("lines, message", [
    ([{"text": "a", "label": "ham"}, {"text": "b"}], "line 2 has no label, unlike the lines before it"),
    ([{"text": "a", "label": "eggs"}], "text 1's label 'eggs' is not one of the classifier's, ['ham', 'other', "
                                       "'spam']"),
])
def test_evaluate_classify_refuses_bad_lines_in_one_line(golden_classifier, tmp_path, capsys, lines, message):
    with pytest.raises(SystemExit) as e:
        evaluate_classify(capsys, write_jsonl(tmp_path / "t.jsonl", lines), "--model", golden_classifier)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_evaluate_classify_on_a_model_with_no_head_is_one_line(tiny_lm, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        evaluate_classify(capsys, write_jsonl(tmp_path / "t.jsonl", [{"text": "a"}]), "--model", tiny_lm)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "holds a language model, not a classifier" in err, err


def test_gpt2_numpy_on_a_classifier_labels_the_prompt_and_refuses_generating_flags(golden_classifier, capsys):
    from interface import gpt2_cli
    text = str(GOLDEN["texts"][0])
    assert gpt2_cli.main(["--model", golden_classifier, text, "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(result["logits"], GOLDEN["batch/logits"][0], atol=1e-5)
    assert result["label"] == ["ham", "other", "spam"][int(GOLDEN["batch/logits"][0].argmax())]
    assert sum(result["probs"]) == pytest.approx(1.0)
    assert gpt2_cli.main(["--model", golden_classifier, text, "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == result["label"]
    for flag in (["--n-tokens", "5"], ["--score"]):
        with pytest.raises(SystemExit):
            gpt2_cli.main(["--model", golden_classifier, text, "--quiet", *flag])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is a classifier (labels ham, other, spam): its output is a label" in err
        assert f"not the next token, so {flag[0]} does not apply; use evaluate.py classify FILE" in err


def test_a_run_starts_from_transformers_classifier_folder_and_its_head_goes_on_training(golden_classifier, tmp_path):
    import convert
    hf = convert.convert(golden_classifier, str(tmp_path / "hf"), "hf")  # a GPT2ForSequenceClassification folder
    data = labelled(tmp_path / "l.jsonl", [(str(t), str(label)) for t, label in zip(GOLDEN["texts"],
                                                                                   GOLDEN["text_labels"])])
    out = tmp_path / "out"
    assert run(hf, data, out, "--val-fraction", "0", "--warmup", "0", "--min-lr-ratio", "1", "--weight-decay", "0",
               "--lr", "1e-3") == 0
    np.testing.assert_allclose([line["loss"] for line in read_log(out)], GOLDEN["adamw/losses"], rtol=1e-5)
    with pytest.raises(SystemExit):  # its labels are the head's: a label it lacks is one line
        run(hf, labelled(tmp_path / "other.jsonl", [("a", "ham"), ("b", "eggs")]), tmp_path / "bad")
