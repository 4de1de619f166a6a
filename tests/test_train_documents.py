"""Documents that end: --data's three kinds of documents, each followed by <|endoftext|> in the
token stream, the split between documents, bpe's trainer that merges within a document only,
and a model that learns to stop."""
import json
import os
import re

import numpy as np
import pytest

import bpe
from gpt2_numpy import generate
from parameters import init_params
import optimizer
import train
from interface import bpe_cli, train_cli
from plumbing import corpus
from plumbing.errors import UserError

BYTES = bpe.parse_vocab(*bpe.vocab_files([]))  # a vocabulary from scratch with no merge: 257 ids, <|endoftext|> 256


def write_jsonl(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return str(path)


def test_data_is_a_txt_file_a_folder_of_them_or_a_jsonl_of_texts(tmp_path):
    (tmp_path / "one.txt").write_text("a whole story", encoding="utf-8")
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in (("b.txt", "second"), ("a.txt", "first")):
        (folder / name).write_text(text, encoding="utf-8")
    lines = write_jsonl(tmp_path / "d.jsonl", [{"text": "line one"}, {"text": "line two\nstill two", "id": 7}])
    (tmp_path / "d.jsonl").write_text((tmp_path / "d.jsonl").read_text() + "\n  \n", encoding="utf-8")  # blank: skipped
    assert corpus.read_corpus([str(tmp_path / "one.txt")]) == (["a whole story"], None, "documents")
    assert corpus.read_corpus([str(folder)]) == (["first", "second"], None, "documents")
    assert corpus.read_corpus([lines]) == (["line one", "line two\nstill two"], None, "documents")
    assert corpus.read_documents([str(folder), lines]) == ["first", "second", "line one", "line two\nstill two"]


def test_a_jsonl_line_ends_at_a_newline_alone(tmp_path):
    """JSON text may hold U+2028 and U+0085 raw, which str.splitlines would take for line ends."""
    text = "one\u2028two\x85three"
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": text}, ensure_ascii=False) + "\r\n" + json.dumps({"text": "b"}) + "\n",
                    encoding="utf-8")
    assert corpus.read_corpus([str(path)]) == ([text, "b"], None, "documents")
    assert corpus.jsonl_objects(str(path), {"text": str}, limit=1) == [(1, {"text": text})]


@pytest.mark.parametrize("content, message", [
    ('{"text": "fine"}\n{"text": "cut', 'line 2 is not JSON'),
    ('{"text": "fine"}\n["a list"]\n', 'line 2 is not a JSON object'),
    ('{"body": "no text"}\n', 'line 1 is not {"text": ...} nor'),
    ('{"prompt": "a question"}\n', 'line 1 is not {"text": ...} nor'),
    ('{"text": "both", "prompt": "a", "response": "b"}\n', 'line 1 is not {"text": ...} nor'),
    ('{"text": "a"}\n{"prompt": "b", "response": "c"}\n', 'line 2 is an example (prompt, response), but the lines '
                                                          'before it are a document (text): give one kind'),
    ('{"text": 3}\n', "line 1: 'text' must be a string"),
    ('{"prompt": "a", "response": ["b"]}\n', "line 1: 'response' must be a string"),
    ('{"text": ""}\n', "line 1's text is empty"),
    ('{"prompt": "a", "response": ""}\n', "line 1's response is empty"),
    ("\n  \n", "is empty"),
])
def test_a_bad_jsonl_line_is_a_user_error_naming_it(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"bad.jsonl: {message}")):
        corpus.read_corpus([str(path)])


def test_each_document_is_followed_by_endoftext_in_the_token_stream(encoder):
    documents = ["The first.", "A second one.", "Third", "And the last, the longest of them all."]
    train_ids, val_ids = train.text_ids(encoder, documents, 0.25, 2)
    assert encoder.eot == 50256
    want = [encoder.encode(d) + [50256] for d in documents]
    assert train_ids.tolist() == sum(want[:3], []) and val_ids.tolist() == want[3]
    assert train_ids.dtype == np.int64
    train_ids, val_ids = train.text_ids(BYTES, documents, 0.0, 2)  # from scratch: its vocabulary's own id
    assert BYTES.eot == 256 and len(val_ids) == 0
    assert train_ids.tolist() == sum([BYTES.encode(d) + [256] for d in documents], [])


def test_the_split_falls_between_documents_at_least_one_each_side():
    """The validation part is the fewest last documents that hold val_fraction of the characters,
    at least one, with at least one left to train on; none when val_fraction is 0."""
    ten = ["x" * 10] * 10
    fractions = (0.0, 0.001, 0.1, 0.11, 0.25, 0.99)
    assert [train.held_out_count([len(d) for d in ten], f) for f in fractions] == [0, 1, 1, 2, 3, 9]
    assert train.held_out_count([5, 1000], 0.5) == 1 and train.held_out_count([1000, 5], 0.5) == 1
    assert train.held_out_count([100, 100, 1], 0.1) == 2  # the last document alone is 0.5% of the text
    docs = [f"document {i}" for i in range(10)]
    assert train.split_documents(docs, 0.1) == (docs[:9], docs[9:])


def test_one_document_is_split_as_one_text_always_was(encoder):
    """A single document falls back to the fraction split of its text. Its one end, and so its
    <|endoftext|>, is in the validation part; with nothing held out, in the training part."""
    text = "the cat sat on the mat. " * 40
    assert [a.tolist() for a in train.text_ids(encoder, [text], 0.25, 8)] == \
           [a.tolist() for a in train.text_ids(encoder, text, 0.25, 8)]
    assert train.split_documents([text], 0.25) == ([text[:720]], [text[720:]])
    train_ids, val_ids = train.text_ids(encoder, text, 0.25, 8)
    assert train_ids.tolist() == encoder.encode(text[:720])
    assert val_ids.tolist() == encoder.encode(text[720:]) + [encoder.eot]
    train_ids, val_ids = train.text_ids(encoder, text, 0.0, 8)
    assert train_ids.tolist() == encoder.encode(text) + [encoder.eot] and len(val_ids) == 0


def test_no_merge_crosses_a_document_boundary():
    """Documents that end and begin with a newline: joined (the old way), their newlines make one
    piece and the trainer merges "\\n\\n" across the boundary; read as documents, it never does."""
    documents = ["the end\n", "\nthe start\n"] * 20
    merged = bpe.merged_bytes(bpe.train_merges_fast(documents, 20))[256:]
    old = bpe.merged_bytes(bpe.train_merges_fast(corpus.join_documents(documents), 20))[256:]
    assert b"\n\n" in old and not any(b"\n\n" in token for token in merged)
    assert bpe.train_merges(documents, 20) == bpe.train_merges_fast(documents, 20)  # the plain trainer too
    assert bpe.pretokenize(documents) == [p for d in documents for p in bpe.PRETOKENIZE.findall(d)]


def test_bpe_train_takes_the_same_three_kinds_of_data(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    texts = ["the end\n", "\nthe start\n", "then the other\n"]
    for i, text in enumerate(texts):
        (folder / f"{i}.txt").write_text(text, encoding="utf-8")
    lines = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    want = bpe.vocab_files(bpe.train_merges_fast(texts, 265 - 257))[1]
    for data in (str(folder), lines):
        out = tmp_path / f"v-{os.path.basename(data)}"
        assert bpe_cli.main(["--train", data, "--vocab-size", "265", "--out", str(out), "--quiet"]) == 0
        assert (out / "vocab.bpe").read_text(encoding="utf-8") == want


def test_train_py_runs_on_a_jsonl_of_documents_from_scratch(tmp_path, capsys):
    """From scratch, the vocabulary is learned from the training documents and its own
    <|endoftext|> (its last id) ends each document of the stream the model trains on."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": f"note {i}: the cat sat."} for i in range(40)])
    out = tmp_path / "run"
    code = train_cli.main(["--from-scratch", "--data", data, "--out", str(out), "--vocab-size", "262", "--n-layer", "1",
                           "--n-head", "2", "--n-embd", "16", "--context", "16", "--steps", "2", "--quiet"])
    assert code == 0, capsys.readouterr().err
    encoder = bpe.get_encoder(str(out))
    assert encoder.eot == 261
    documents, _, _ = corpus.read_corpus([data])
    train_documents, _ = train.split_documents(documents, 0.1)
    assert len(train_documents) == 36
    assert (out / "vocab.bpe").read_text(encoding="utf-8") == bpe.vocab_files(bpe.train_merges_fast(train_documents,
                                                                                                     5))[1]


# --- a model learns to stop ------------------------------------------------------------------

NAMES = ["Tom", "Ann", "Bob", "Eve", "Sam", "Kim", "Max", "Liz"]
SHORT_DOCUMENTS = [f"{name} {verb}." for name in NAMES for verb in ("ran", "sat", "hid", "sang", "swam", "slept")]
STOP_RECIPE = dict(steps=60, batch_size=8, context=32, accum=1, lr=1e-2, min_lr_ratio=0.1, warmup=10, weight_decay=0.0,
                   grad_clip=1.0, dropout=0.0, seed=0, beta2=0.99)
ENDED_AT_LEAST = 6  # of the 8 greedy samples (one after each name) end with <|endoftext|> within 20 tokens


def greedy_samples_that_end(ids):
    """A 1-layer, 32-wide model trained from scratch on the stream ids for 60 steps (about 1 s);
    then, for each name, greedy text after <|endoftext|> and the name. -> how many end with <|endoftext|>"""
    hp = {"n_vocab": BYTES.n_vocab, "n_ctx": 32, "n_embd": 32, "n_head": 2, "n_layer": 1}
    params = init_params(hp, 0)
    state, buffers = optimizer.new_adamw_state(params), {}
    for step in range(STOP_RECIPE["steps"]):
        train.train_step(params, hp, state, {"kind": "documents", "rows": ids}, step, STOP_RECIPE, buffers)
    samples = [np.concatenate(list(generate([BYTES.eot] + BYTES.encode(name), params, hp, 20, top_k=1,
                                            stop=BYTES.eot))).tolist() for name in NAMES]
    return sum(BYTES.eot in sample for sample in samples)


def test_a_model_trained_on_documents_that_end_learns_to_stop():
    """48 short documents, shuffled and seen four times: with <|endoftext|> after each, at least 6 of 8
    greedy samples end with it (8 do); joined the old way, with a blank line between two, none does."""
    order = np.random.default_rng(0).permutation(len(SHORT_DOCUMENTS))
    documents = [SHORT_DOCUMENTS[i] for i in order] * 4
    with_ends, _ = train.text_ids(BYTES, documents, 0.0, STOP_RECIPE["context"])
    joined = np.asarray(BYTES.encode(corpus.join_documents(documents)), np.int64)  # before documents ended
    assert greedy_samples_that_end(with_ends) >= ENDED_AT_LEAST
    assert greedy_samples_that_end(joined) == 0
