"""bpe.py's trainer: the step by hand, the plain and fast forms equal, the merges equal minbpe's
(tests/data/bpe_train/minbpe_merges.json, made by make_minbpe_golden.py beside it), and the
files GPT-2's own format, which tiktoken's loader reads."""
import json
import os
import signal
import subprocess
import sys

import pytest

import bpe
from conftest import DATA, ROOT, VOCAB

GOLDEN_DIR = os.path.join(DATA, "bpe_train")
with open(os.path.join(GOLDEN_DIR, "minbpe_merges.json"), encoding="utf-8") as f:
    GOLDEN = json.load(f)


def golden_case(name):
    case = GOLDEN["cases"][name]
    with open(os.path.join(ROOT, case["file"]), encoding="utf-8") as f:
        text = f.read()[:case["chars"]]
    return text, [tuple(bytes.fromhex(h) for h in merge.split()) for merge in case["merges"]]


def as_bytes(merges):
    token = bpe.merged_bytes(merges)
    return [(token[a], token[b]) for a, b in merges]


def test_pair_counts_and_merge_pair_by_hand():
    assert bpe.pair_counts([[1, 2, 3, 1, 2], [2, 3]]) == {(1, 2): 2, (2, 3): 2, (3, 1): 1}
    assert list(bpe.pair_counts([[5, 6], [1, 2], [5, 6]])) == [(5, 6), (1, 2)]  # in the order they first occur
    assert bpe.merge_pair([1, 2, 3, 1, 2], (1, 2), 9) == [9, 3, 9]
    assert bpe.merge_pair([7, 7, 7], (7, 7), 8) == [8, 7]  # left to right: no overlapping merges


def test_learn_merge_takes_the_most_frequent_pair_and_the_first_of_a_tie():
    pair, pieces = bpe.learn_merge([[1, 2], [3, 4, 3, 4], [1, 2]], 256)
    assert pair in ((1, 2), (3, 4)) and pair == (1, 2)  # 2 each: (1, 2) occurs first
    assert pieces == [[256], [3, 4, 3, 4], [256]]
    pair, pieces = bpe.learn_merge([[1, 2], [3, 4, 3, 4, 3, 4]], 256)
    assert pair == (3, 4) and pieces == [[1, 2], [256, 256, 256]]
    assert bpe.learn_merge([[1], [2]], 256) == (None, [[1], [2]])


def test_the_fast_trainer_is_the_plain_one():
    text, _ = golden_case("multilingual")
    text = text + " the cat, the hat, the bat; the cat sat. " * 5
    assert bpe.train_merges_fast(text, 200) == bpe.train_merges(text, 200)
    assert bpe.train_merges_fast("aaaa aaa", 10) == bpe.train_merges("aaaa aaa", 10)  # runs out early, alike


@pytest.mark.parametrize("name", ["multilingual", "shakespeare"])
def test_the_merges_are_minbpes_in_order(name):
    text, want = golden_case(name)
    got = as_bytes(bpe.train_merges_fast(text, len(want)))
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert first is None and len(got) == len(want), f"merge {first} differs: {got[first]} vs minbpe's {want[first]}"
    if name == "multilingual":
        assert as_bytes(bpe.train_merges(text, len(want))) == want  # the plain form too


def test_the_files_are_written_as_gpt2s():
    with open(os.path.join(VOCAB, "encoder.json"), encoding="utf-8") as f:
        gpt2_first_256 = list(json.load(f).items())[:256]
    merges = bpe.train_merges_fast("the then there their these the the", 5)
    encoder_json, vocab_bpe = bpe.vocab_files(merges)
    encoder = json.loads(encoder_json)
    assert list(encoder.items())[:256] == gpt2_first_256  # the bytes in GPT-2's order, spelled as GPT-2 does
    assert list(encoder.values()) == list(range(256 + 5 + 1)) and encoder["<|endoftext|>"] == 261
    assert vocab_bpe.splitlines() == ["#version: 0.2", "t h", "th e", "Ġ the", "Ġthe n", "Ġthe r"]  # a tie: then first
    assert list(encoder)[256:261] == ["th", "the", "Ġthe", "Ġthen", "Ġther"]
    enc = bpe.parse_vocab(encoder_json, vocab_bpe)
    assert enc.eot == 261 and enc.decode(enc.encode("there then théâtre")) == "there then théâtre"
    assert enc.encode(" then") == [259]


def test_a_vocabulary_of_257_is_the_bytes_and_endoftext():
    encoder_json, vocab_bpe = bpe.vocab_files([])
    assert len(json.loads(encoder_json)) == 257 and vocab_bpe == "#version: 0.2\n"
    enc = bpe.parse_vocab(encoder_json, vocab_bpe)
    assert enc.encode("hi!") == [enc.byte_ids[b] for b in b"hi!"] and enc.eot == 256


def test_two_merges_that_spell_the_same_bytes_are_found():
    a, b, c = ord("a"), ord("b"), ord("c")
    merges = [(a, b), (256, c), (b, c), (a, 258)]  # ab, abc, bc, then a + bc: abc again
    assert bpe.spelled_twice(merges) == 3 and bpe.spelled_twice(merges[:3]) is None


def run_bpe(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bpe.py"), *args], capture_output=True, text=True)


def test_training_on_the_command_line(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat; the cat ate the rat. " * 20, encoding="utf-8")
    r = run_bpe("--train", str(text), "--vocab-size", "270", "--out", str(tmp_path / "v"), "--quiet")
    assert r.returncode == 0, r.stderr
    enc = bpe.get_encoder(str(tmp_path / "v"))
    assert enc.n_vocab == 270 and enc.eot == 269 and enc.decode(enc.encode("the cat")) == "the cat"
    shown = run_bpe("--vocab-dir", str(tmp_path / "v"), "the cat")
    assert shown.returncode == 0 and shown.stdout.startswith("the| cat")


def test_bad_training_input_is_one_line_and_writes_nothing(tmp_path):
    good, empty, latin = tmp_path / "good.txt", tmp_path / "empty.txt", tmp_path / "latin.txt"
    good.write_text("abab abab cdcd", encoding="utf-8")
    empty.write_text(" \n")
    latin.write_bytes("café".encode("latin-1"))
    for args, message in [((good, "256"), "--vocab-size must be at least 257 (256 bytes and <|endoftext|>), got 256"),
                          ((empty, "300"), "empty.txt: is empty"),
                          ((latin, "300"), "latin.txt: is not UTF-8 text"),
                          ((good, "300"), "the text has only enough distinct pairs for 6 merges, not the 43 that "
                                          "--vocab-size 300 asks for: use --vocab-size 263 or more text")]:
        r = run_bpe("--train", str(args[0]), "--vocab-size", args[1], "--out", str(tmp_path / "out"), "--quiet")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
        assert not os.path.exists(tmp_path / "out")
    r = run_bpe("--train", str(good), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "--train needs --vocab-size N and --out DIR" in r.stderr


def test_tiktoken_reads_the_files_and_gives_the_same_ids(tmp_path):
    """The reference tokenizer, dev-only: pip install tiktoken to run it."""
    tiktoken = pytest.importorskip("tiktoken", reason="dev-only reference: pip install tiktoken, then run "
                                                      "python -m pytest -q -k tiktoken_reads_the_files")
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()
    train, held_out = text[:200_000], text[-20_000:]
    folder = bpe.write_vocab(str(tmp_path / "v"), bpe.train_merges_fast(train, 700))
    ranks = data_gym_to_mergeable_bpe_ranks(os.path.join(folder, "vocab.bpe"), os.path.join(folder, "encoder.json"))
    encoding = tiktoken.Encoding("trained", pat_str=bpe.PRETOKENIZE.pattern, mergeable_ranks=ranks,
                                 special_tokens={"<|endoftext|>": len(ranks)})
    golden, _ = golden_case("multilingual")
    enc = bpe.get_encoder(folder)
    for sample in (held_out, golden, "naïve café — 東京 🙂 don't 42"):
        assert enc.encode(sample) == encoding.encode_ordinary(sample)


def test_training_that_would_spell_a_token_twice_stops_and_says_where(monkeypatch):
    a, b, c = ord("a"), ord("b"), ord("c")
    monkeypatch.setattr(bpe, "train_merges_fast", lambda text, n, on_merge=None: [(a, b), (256, c), (b, c), (a, 258)])
    with pytest.raises(bpe.UserError, match=r"merge 4 spells b'abc' a second time, which GPT-2's files cannot hold: "
                                            r"use --vocab-size 260 or less"):
        bpe.train_vocab("abc", 261)


def test_with_many_ties_the_fast_trainer_still_equals_the_plain_to_the_last_merge():
    """Late in training most pairs are tied at a count of 1 or 2: the tie still goes to the pair
    first in the text, merge after merge, until no pair is left."""
    import random
    rng = random.Random(0)
    words = ["".join(rng.choice("abcde") for _ in range(rng.randint(1, 7))) for _ in range(300)]
    text = " ".join(rng.choice(words) for _ in range(1500))
    plain = bpe.train_merges(text, 10 ** 6)
    assert len(plain) > 200 and bpe.train_merges_fast(text, 10 ** 6) == plain
    assert bpe.train_merges_fast(text, 150) == plain[:150]


def test_training_stops_when_no_pair_is_left_and_says_how_many_merges(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abab abab cdcd", encoding="utf-8")
    r = run_bpe("--train", str(text), "--vocab-size", "1000000000", "--out", str(tmp_path / "out"), "--quiet")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "only enough distinct pairs for 6 merges, not the 999,999,743" in r.stderr and "--vocab-size 263" in r.stderr
    assert not os.path.exists(tmp_path / "out")


def test_out_is_checked_before_training(tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    r = run_bpe("--train", os.path.join(ROOT, "data", "tinyshakespeare.txt"), "--vocab-size", "20000",
                "--out", str(taken))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "taken: already exists" in r.stderr, r.stderr
    assert "learning" not in r.stderr  # refused before any merge was learned
    assert os.listdir(taken) == ["notes.txt"]
    r = run_bpe("--train", os.path.join(ROOT, "data", "tinyshakespeare.txt"), "--vocab-size", "300",
                "--out", str(tmp_path / "no" / "such" / "v"))
    assert r.returncode == 2 and "parent folder" in r.stderr and "does not exist" in r.stderr, r.stderr


def test_without_a_terminal_training_says_what_it_does_in_plain_lines(tmp_path, capsys):
    with bpe.merge_progress(3, quiet=False, every=0) as on_merge:
        for k in range(3):
            on_merge(k)
    assert capsys.readouterr().err.splitlines()[0] == "learning up to 3 merges"
    with bpe.merge_progress(3, quiet=False, every=0) as on_merge:
        on_merge(0)
    assert capsys.readouterr().err.splitlines()[1].startswith("merge 1/3 (33%), ")  # plumbing/progress.py's line
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat; the cat ate the rat. " * 20, encoding="utf-8")
    r = run_bpe("--train", str(text), "--vocab-size", "270", "--out", str(tmp_path / "v"))
    assert r.returncode == 0 and r.stderr.splitlines()[0] == "learning up to 13 merges", r.stderr
    assert "\r" not in r.stderr  # no bar drawn into a log
    quiet = run_bpe("--train", str(text), "--vocab-size", "270", "--out", str(tmp_path / "w"), "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""


@pytest.mark.parametrize("stop, said", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")],
                         ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_during_training_is_one_line_and_exit_130(tmp_path, stop, said):
    """Ctrl-C, or SIGTERM (kill, timeout, a scheduler), while the merges are learned: one line, 130, no folder."""
    out = tmp_path / "v"
    corpus = os.path.join(ROOT, "data", "tinyshakespeare.txt")
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "bpe.py"), "--train", corpus, "--vocab-size", "20000",
                          "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stderr.readline().startswith("learning up to 19,743 merges")  # training has begun
    p.send_signal(stop)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 130 and stderr == said + "\n" and stdout == "", stderr
    assert not out.exists() and not [f for f in os.listdir(tmp_path) if f.startswith(".writing-")]
