"""hf:owner/name classifiers: GPT2ForSequenceClassification folders as transformers 5 saves them (config.json,
model.safetensors, tokenizer.json alone; tests/data/make_hub_classifier.py), served from a fake Hub on
127.0.0.1: train.py continues the head, evaluate.py classify and gpt2_numpy.py give transformers' logits and
label. One has named labels and a pad; one has transformers' defaults (no id2label: LABEL_0, LABEL_1; no pad)."""
import json
import os
import shutil

import numpy as np
import pytest

from conftest import DATA, Mirror, in_process
from interface import evaluate_cli, gpt2_cli, train_cli
from plumbing import hf_model

FOLDERS = os.path.join(DATA, "hub_classifier")
GOLDEN = np.load(os.path.join(FOLDERS, "golden.npz"))
TEXTS, LABELS = [str(t) for t in GOLDEN["texts"]], [str(x) for x in GOLDEN["text_labels"]]
REPOS = {"genre": "named", "unnamed": "default"}  # hf:test-org/<repo>: the folder it serves


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    for repo, folder in REPOS.items():
        shutil.copytree(os.path.join(FOLDERS, folder), root / "test-org" / repo / "resolve" / "main")
    m = Mirror(str(root))
    yield m
    m.close()


@pytest.fixture
def env(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    return ["--models-dir", str(tmp_path / "models"), "--quiet"]


def jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def close(ours, theirs, tol=1e-5):
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=tol * float(np.abs(theirs).max()))


def test_evaluate_classify_fetches_a_hub_classifier_and_gives_transformers_logits(env, hub, tmp_path, capsys):
    data = jsonl(tmp_path / "t.jsonl", [{"text": t, "label": x} for t, x in zip(TEXTS, LABELS)])
    r = in_process(evaluate_cli.main, capsys, "classify", data, "--model", "hf:test-org/genre", "--json", *env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    close([p["logits"] for p in out["predictions"]], GOLDEN["named/logits"])
    assert out["labels"] == GOLDEN["named/id2label"].tolist() == ["comedy", "history", "tragedy"]
    predicted = GOLDEN["named/logits"].argmax(-1)
    assert out["accuracy"] == pytest.approx(np.mean([out["labels"][i] == x for i, x in zip(predicted, LABELS)]))
    folder = tmp_path / "models" / "hf" / "test-org" / "genre"
    assert sorted(f for f in os.listdir(folder) if not f.startswith(".")) == ["config.json", "model.safetensors",
                                                                               "tokenizer.json"]
    hub.requests.clear()
    r = in_process(evaluate_cli.main, capsys, "classify", data, "--model", "hf:test-org/genre", "--json", *env)
    assert r.returncode == 0 and hub.requests == []  # a warm run fetches nothing


def test_a_hub_classifier_with_transformers_defaults_is_read_as_transformers_reads_it(env, tmp_path, capsys):
    """No id2label: 2 labels, LABEL_0 and LABEL_1, and a dataset's 0 and 1 are their rows; no pad: each text
    pooled at its last token (the one that ends in <|endoftext|> at that token), as transformers runs it alone."""
    data = jsonl(tmp_path / "t.jsonl", [{"text": t, "label": i % 2} for i, t in enumerate(TEXTS)])
    r = in_process(evaluate_cli.main, capsys, "classify", data, "--model", "hf:test-org/unnamed", "--json", *env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["labels"] == ["LABEL_0", "LABEL_1"] == GOLDEN["default/id2label"].tolist()
    close([p["logits"] for p in out["predictions"]], GOLDEN["default/logits"])
    predicted = GOLDEN["default/logits"].argmax(-1)
    assert out["accuracy"] == pytest.approx(np.mean(predicted == np.arange(len(TEXTS)) % 2))
    r = in_process(gpt2_cli.main, capsys, "--model", "hf:test-org/unnamed", TEXTS[3], *env)
    assert r.returncode == 0 and r.stdout.splitlines()[0] == f"LABEL_{predicted[3]}"


def test_gpt2_numpy_gives_a_hub_classifiers_label(env, capsys):
    for i in (0, 3):
        r = in_process(gpt2_cli.main, capsys, "--model", "hf:test-org/genre", TEXTS[i], "--json", *env)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        close(out["logits"], GOLDEN["named/logits"][i])
        assert out["label"] == ["comedy", "history", "tragedy"][int(GOLDEN["named/logits"][i].argmax())]
    r = in_process(gpt2_cli.main, capsys, "--model", "hf:test-org/genre", TEXTS[1], *env)
    assert r.stdout.splitlines()[0] == ["comedy", "history", "tragedy"][int(GOLDEN["named/logits"][1].argmax())]


def test_train_continues_a_hub_classifiers_head_as_a_torch_loop_does(env, tmp_path, capsys):
    data = jsonl(tmp_path / "t.jsonl", [{"text": t, "label": x} for t, x in zip(TEXTS, LABELS)])
    out = tmp_path / "out"
    r = in_process(train_cli.main, capsys, "--model", "hf:test-org/genre", "--data", data, "--out", out,
                   "--batch-size", "5", "--steps", "3", "--val-fraction", "0", "--warmup", "0", "--min-lr-ratio", "1",
                   "--weight-decay", "0", "--grad-clip", "1", "--lr", "1e-3", *env)
    assert r.returncode == 0, r.stderr
    losses = [json.loads(line)["loss"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(losses, GOLDEN["named/adamw_losses"], rtol=1e-5)
    assert json.loads((out / "classifier.json").read_text()) == {"labels": ["comedy", "history", "tragedy"],
                                                                 "pad_token_id": 511}
    r = in_process(gpt2_cli.main, capsys, "--model", out, TEXTS[0], "--quiet")  # its vocabulary came along
    assert r.returncode == 0 and r.stdout.splitlines()[0] in ("comedy", "history", "tragedy")


def test_train_from_a_hub_classifier_with_no_pad_pads_with_endoftext_and_says_so(env, tmp_path, capsys):
    data = jsonl(tmp_path / "t.jsonl", [{"text": t, "label": i % 2} for i, t in enumerate(TEXTS)])
    out = tmp_path / "out"
    r = in_process(train_cli.main, capsys, "--model", "hf:test-org/unnamed", "--data", data, "--out", out,
                   "--batch-size", "5", "--steps", "1", "--val-fraction", "0", *env)
    assert r.returncode == 0, r.stderr
    assert "the classifier has no pad_token_id: its batches are padded with <|endoftext|> (511)" in r.stdout
    assert json.loads((out / "classifier.json").read_text()) == {"labels": ["LABEL_0", "LABEL_1"],
                                                                 "pad_token_id": 511}
    r = in_process(train_cli.main, capsys, "--model", "hf:test-org/unnamed", "--data",
                   jsonl(tmp_path / "u.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 2}]),
                   "--out", tmp_path / "bad", "--val-fraction", "0", *env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "label 2 is not one of the classifier's" in r.stderr


def test_a_hub_repository_with_no_tokenizer_is_one_line(env, hub, tmp_path, capsys):
    files = tmp_path / "hub" / "test-org" / "bare" / "resolve" / "main"
    shutil.copytree(os.path.join(FOLDERS, "named"), files, ignore=shutil.ignore_patterns("tokenizer*"))
    m = Mirror(str(tmp_path / "hub"))
    try:
        os.environ["HF_ENDPOINT"] = m.url  # env's monkeypatch puts it back
        r = in_process(gpt2_cli.main, capsys, "--model", "hf:test-org/bare", "hi", *env)
    finally:
        m.close()
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "hf:test-org/bare has no vocab.json nor tokenizer.json" in r.stderr
    assert not (tmp_path / "models" / "hf" / "test-org" / "bare").exists()


@pytest.mark.parametrize("change, message", [
    (lambda t: t["pre_tokenizer"].update(add_prefix_space=True), "a pre-tokenizer other than GPT-2's"),
    (lambda t: t.update(normalizer={"type": "NFC"}), "a normalizer"),
    (lambda t: t["post_processor"].update(single=[{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                  {"Sequence": {"id": "A", "type_id": 0}}]),
     "a post-processor that adds tokens around a text"),
    (lambda t: t["model"].update(type="WordPiece"), "is not a BPE tokenizer"),
])
def test_a_tokenizer_json_that_is_not_gpt2s_is_refused_by_name(tmp_path, change, message):
    folder = tmp_path / "cls"
    shutil.copytree(os.path.join(FOLDERS, "named"), folder)
    t = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    change(t)
    (folder / "tokenizer.json").write_text(json.dumps(t), encoding="utf-8")
    with pytest.raises(hf_model.HubFolderError, match=message):
        hf_model.tokenizer_json_files(str(folder))


def test_a_tokenizer_json_gives_the_two_tables_of_vocab_json_and_merges_txt():
    files = hf_model.tokenizer_json_files(os.path.join(FOLDERS, "named"))
    with open(os.path.join(DATA, "shakespeare", "encoder.json"), encoding="utf-8") as f:
        assert json.loads(files["encoder.json"]) == json.load(f)
    with open(os.path.join(DATA, "shakespeare", "vocab.bpe"), encoding="utf-8") as f:
        assert files["vocab.bpe"].decode().split("\n")[1:] == f.read().split("\n")[1:]


@pytest.mark.parametrize("name", ["named", "default"])
def test_convert_takes_a_tokenizer_json_folder_to_either_format_with_the_same_logits(tmp_path, capsys, name):
    import convert
    openai = convert.convert(os.path.join(FOLDERS, name), str(tmp_path / "openai"), "openai")
    hf = convert.convert(openai, str(tmp_path / "hf"), "hf")
    assert {"encoder.json", "vocab.bpe", "classifier.json"} <= set(os.listdir(openai))
    assert {"vocab.json", "merges.txt"} <= set(os.listdir(hf))
    data = jsonl(tmp_path / "t.jsonl", [{"text": t} for t in TEXTS])
    for folder in (openai, hf):
        r = in_process(evaluate_cli.main, capsys, "classify", data, "--model", folder, "--json", "--quiet")
        close([p["logits"] for p in json.loads(r.stdout)["predictions"]], GOLDEN[f"{name}/logits"])


def test_a_pad_token_added_beyond_the_vocab_gets_its_id(tmp_path):
    """tokenizer.add_special_tokens({"pad_token": "[PAD]"}), as many fine-tunes do: its id follows the vocab's."""
    import bpe
    folder = tmp_path / "cls"
    shutil.copytree(os.path.join(FOLDERS, "named"), folder)
    t = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    t["added_tokens"].append({"id": 512, "content": "[PAD]", "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(t), encoding="utf-8")
    encoder = bpe.get_encoder(str(folder))
    assert encoder.n_vocab == 513 and encoder.encoder["[PAD]"] == 512 and encoder.eot == 511
