"""bpe.py against GPT-2's reference tokenizer (tiktoken's golden ids) and an independent classic BPE;
then its trainer: the step by hand, the plain and fast forms equal, the merges equal minbpe's
(tests/data/bpe_train/minbpe_merges.json, made by make_minbpe_golden.py beside it), and the
files GPT-2's own format, which tiktoken's loader reads."""
import json
import os
import random
import signal
import subprocess
import sys

import pytest
import regex

import bpe
from conftest import DATA, ROOT, VOCAB

with open(os.path.join(DATA, "bpe_golden.json"), encoding="utf-8") as f:
    GOLDEN = json.load(f)["cases"]


# --- the byte <-> printable character table ------------------------------------

def test_bytes_to_unicode_is_a_printable_bijection():
    table = bpe.bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())


def test_bytes_to_unicode_keeps_printable_latin1_and_shifts_the_rest_in_order():
    table = bpe.bytes_to_unicode()
    kept = [b for b in range(256) if chr(b).isprintable() and b != 0x20 and b != 0xAD]
    assert len(kept) == 188 and all(table[b] == chr(b) for b in kept)
    shifted = [b for b in range(256) if b not in kept]
    assert [table[b] for b in shifted] == [chr(256 + i) for i in range(68)]
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


def test_printable_spelling_round_trips_every_byte():
    data = bytes(range(256))
    assert bpe.from_printable(bpe.to_printable(data)) == data
    assert bpe.to_printable(b" hi\n") == "ĠhiĊ"


# --- pre-tokenization ------------------------------------------------------------

@pytest.mark.parametrize("text, pieces", [
    ("Hello world", ["Hello", " world"]),
    ("Hello  world", ["Hello", " ", " world"]),  # the last space joins the word
    ("it's we'll I'D", ["it", "'s", " we", "'ll", " I", "'", "D"]),  # contractions: lower case only
    ("it’s", ["it", "’", "s"]),  # a curly apostrophe is punctuation
    ("abc123 456", ["abc", "123", " 456"]),
    ("x!!? (y)", ["x", "!!?", " (", "y", ")"]),
    ("a\n\nb", ["a", "\n", "\n", "b"]),  # the last newline cannot join the word: \p{L} needs a space
    ("end   ", ["end", "   "]),
    ("你好 мир", ["你好", " мир"]),
])
def test_pretokenize(text, pieces):
    assert bpe.PRETOKENIZE.findall(text) == pieces


def test_the_reordered_pattern_cuts_like_openais():
    openai = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    rng = random.Random(5)
    texts = [c["text"] for c in GOLDEN] + ["".join(rng.choice("'’sdtremlv aZ9 !\n") for _ in range(40))
                                           for _ in range(2000)]
    for text in texts:
        assert bpe.PRETOKENIZE.findall(text) == openai.findall(text), repr(text)


# --- exact ids ---------------------------------------------------------------------

@pytest.mark.parametrize("text, ids", [
    ("Hello!! I'm Andrej Karpathy. It's 2022. w00t :D 🤗",
     [15496, 3228, 314, 1101, 10948, 73, 509, 5117, 10036, 13, 632, 338, 33160, 13, 266, 405, 83, 1058, 35, 12520,
      97, 245]),
    ("This is some text", [1212, 318, 617, 2420]),
    ("\n", [198]),
])
def test_known_vectors(encoder, text, ids):
    assert encoder.encode(text) == ids
    assert encoder.decode(ids) == text


def test_golden_corpus_is_broad():
    groups = {c["group"] for c in GOLDEN}
    assert len(GOLDEN) >= 200
    assert {"script", "emoji", "combining", "control", "whitespace", "contraction", "digits", "code", "url",
            "long", "special-as-text", "special-allowed", "surrogate", "unicode-edges"} <= groups


@pytest.mark.parametrize("case", GOLDEN, ids=[f"{c['group']}-{i}" for i, c in enumerate(GOLDEN)])
def test_golden_ids_from_the_reference_tokenizer(encoder, case):
    allowed = "all" if case["group"] == "special-allowed" else ()
    assert encoder.encode(case["text"], allowed_special=allowed) == case["ids"], repr(case["text"][:80])


def test_regex_uses_the_reference_unicode_version():
    """The promise: pre-tokenization uses Unicode 16's letters, as tiktoken's gpt2 encoding.

    regex >= 2025.10 knows Unicode 17, so about 17,000 more characters count as
    letters or digits; requirements.txt pins regex<2025.10."""
    assert regex.match(r"\p{L}", "\u1c89"), "U+1C89 (new in Unicode 16) must be a letter"
    assert not regex.match(r"\p{L}", "\U00010940"), (
        f"regex {regex.__version__} uses Unicode 17; install regex>=2024.9.11,<2025.10 (requirements.txt)")


# --- the merge loop against an independent classic implementation ----------------------

def classic_bpe(token, ranks):
    """OpenAI's algorithm on printable strings: find the lowest-ranked pair, merge every
    occurrence of it left to right, repeat."""
    word = list(token)
    while len(word) > 1:
        best = min(zip(word, word[1:]), key=lambda pair: ranks.get(pair, float("inf")))
        if best not in ranks:
            break
        merged, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                merged.append(word[i] + word[i + 1])
                i += 2
            else:
                merged.append(word[i])
                i += 1
        word = merged
    return word


@pytest.fixture(scope="module")
def classic_ranks():
    with open(os.path.join(VOCAB, "vocab.bpe"), encoding="utf-8") as f:
        lines = f.read().split("\n")[1:]
    return {tuple(line.split()): i for i, line in enumerate(lines) if line}


def test_merges_match_the_classic_algorithm(encoder, classic_ranks):
    with open(os.path.join(VOCAB, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    rng = random.Random(7)
    pieces = set()
    for case in GOLDEN:
        if case["group"] != "surrogate":
            pieces.update(bpe.PRETOKENIZE.findall(case["text"]))
    alphabet = "abcdefghijklmnopqrstuvwxyz eéñ你好ß!?.'0123456789"
    for _ in range(3000):
        pieces.update(bpe.PRETOKENIZE.findall("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))))
    for piece in sorted(pieces):
        data = piece.encode("utf-8")
        ours = encoder.merge([encoder.byte_ids[b] for b in data])
        want = [vocab[t] for t in classic_bpe(bpe.to_printable(data), classic_ranks)]
        assert list(ours) == want, f"merge of {piece!r}'s bytes gave {list(ours)}, the classic BPE {want}"


def test_one_merge_joins_the_pair_with_the_lowest_rank(encoder):
    h, e, ell, o, q = (encoder.byte_ids[ord(c)] for c in "heloq")
    # of the pairs h e, e l, l l, l o, "h e" has the lowest rank (2): it merges first
    assert encoder.merge_once([h, e, ell, ell, o]) == [encoder.encoder["he"], ell, ell, o]
    assert encoder.merge_once([encoder.encoder["hello"]]) is None  # one token: no pair left
    assert encoder.merge_once([q, q]) == [encoder.encoder["qq"]]


def test_the_fast_merge_equals_merge(encoder):
    """encode uses merge_fast; it must give what the plain merge gives, piece for piece."""
    rng = random.Random(8)
    words = [list(data) for data in encoder.token_bytes[256:4000]]
    words += [list("".join(rng.choice("abcdefghijklmnop qrstuvwxyzé你") for _ in range(rng.randint(2, 25)))
                   .encode("utf-8")) for _ in range(2000)]
    for data in words:
        ids = [encoder.byte_ids[b] for b in data]
        assert encoder.merge_fast(ids) == list(encoder.merge(ids)), bytes(data)


def test_a_whole_token_merges_into_itself(encoder):
    """Why encode_piece may skip merging a piece that is already a token: for this vocabulary,
    merging any token's bytes always ends in that very token."""
    for i, data in enumerate(encoder.token_bytes):
        if i == encoder.eot:
            continue
        assert encoder.merge_fast([encoder.byte_ids[b] for b in data]) == [i], (i, data)


# --- round trips, special token, decoding -----------------------------------------------

def random_unicode_text(rng):
    """A string of valid scalar values, mixing ASCII, the BMP and all of Unicode."""
    chars = []
    for _ in range(rng.randint(0, 24)):
        kind = rng.random()
        if kind < 0.3:
            c = rng.randint(0x20, 0x7E)
        elif kind < 0.6:
            c = rng.randint(0, 0xFFFF)
        else:
            c = rng.randint(0, 0x10FFFF)
        if 0xD800 <= c <= 0xDFFF:
            c = 0xFFFD
        chars.append(chr(c))
    return "".join(chars)


def test_round_trip_10000_random_strings(encoder):
    rng = random.Random(2024)
    for _ in range(10_000):
        s = random_unicode_text(rng)
        assert encoder.decode(encoder.encode(s)) == s, repr(s)


def test_endoftext_is_text_by_default_and_a_token_when_allowed(encoder):
    assert encoder.encode("<|endoftext|>") == [27, 91, 437, 1659, 5239, 91, 29]
    assert encoder.encode("a<|endoftext|>b", allowed_special={"<|endoftext|>"}) == [64, 50256, 65]
    assert encoder.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert encoder.decode([50256]) == "<|endoftext|>"
    with pytest.raises(ValueError, match="unknown special"):
        encoder.encode("x", allowed_special={"<|im_start|>"})


def test_decode_replaces_a_split_character(encoder):
    ids = encoder.encode("🤗")
    assert len(ids) == 3
    assert encoder.decode(ids[:1]) == "\ufffd"
    assert encoder.decode_bytes(ids) == "🤗".encode("utf-8")


def test_lone_surrogates_become_the_replacement_character(encoder):
    assert encoder.encode("a\ud800b") == encoder.encode("a\ufffdb")


@pytest.mark.parametrize("bad", [-1, 50257, 10**9])
def test_decode_rejects_ids_out_of_range(encoder, bad):
    with pytest.raises(ValueError, match=str(bad)):
        encoder.decode([1, bad])


@pytest.mark.parametrize("bad", [1.5, "3", None])
def test_decode_rejects_non_integers(encoder, bad):
    with pytest.raises(TypeError, match="integers"):
        encoder.decode([bad])


def test_decode_accepts_numpy_integers(encoder):
    import numpy as np
    assert encoder.decode(np.array([15496, 11, 995])) == "Hello, world"


def test_pieces_and_stretches_are_cached(encoder):
    encoder.encode("a cachedword, again")
    assert encoder.merged_pieces[" cachedword"] == encoder.encode_piece(" cachedword")
    assert list(encoder.stretches[" cachedword,"]) == encoder.encode(" cachedword,")


def test_cuts_are_found_with_a_whitespace_set_that_contains_regexs():
    """Why `re` may find the cuts: every character `regex` calls whitespace, Python's str
    calls whitespace too (Python adds U+001C..U+001F), so `re` never cuts where `regex`
    would not."""
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert all(c.isspace() for c in regex.findall(r"\s", everything))
    assert [c for c in everything if c.isspace() and not regex.match(r"\s", c)] == list("\x1c\x1d\x1e\x1f")


def test_cutting_the_text_changes_no_ids(encoder):
    rng = random.Random(11)
    alphabet = [" ", " ", "  ", "\n", "\t", "\x1c", "\x1f", "\xa0", "\u3000", "a", "Z", "é", "你", "1", "٣",
                "'", "s", "!", ".", "🤗", "\u0301"]
    texts = [c["text"] for c in GOLDEN if c["group"] != "surrogate"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(3000)]
    for text in texts:
        assert encoder.encode(text) == list(encoder.encode_stretch(text)), repr(text)


# --- building an encoder ---------------------------------------------------------------

def test_built_from_contents_equals_built_from_folder(encoder):
    with open(os.path.join(VOCAB, "encoder.json"), encoding="utf-8") as f, \
            open(os.path.join(VOCAB, "vocab.bpe"), encoding="utf-8") as g:
        other = bpe.parse_vocab(f.read(), g.read())
    assert other.encode("Hello, world") == encoder.encode("Hello, world") == [15496, 11, 995]


def toy_encoder_json(*extra):
    """All 256 one-byte tokens, then the given tokens."""
    tokens = list(bpe.CODE_PAGE) + list(extra)
    return json.dumps({t: i for i, t in enumerate(tokens)})


@pytest.mark.parametrize("encoder_json, vocab_bpe, message", [
    ("not json", "#version: 0.2\n", "not valid JSON"),
    ("[1, 2]", "#version: 0.2\n", "JSON object"),
    ('{"a": 0, "b": 0}', "#version: 0.2\n", "ids must be"),
    ('{"a": 0, "b": 1, "ab": 2}', "#version: 0.2\n", "one-byte token"),
    (toy_encoder_json("ab"), "#version: 0.2\na b c\n", "line 1"),
    (toy_encoder_json("ab"), "#version: 0.2\na b\nb ab\n", "'bab'"),
])
def test_bad_vocabularies_are_named(encoder_json, vocab_bpe, message):
    with pytest.raises(bpe.VocabError, match=message):
        bpe.parse_vocab(encoder_json, vocab_bpe)


def test_a_toy_vocabulary_works():
    enc = bpe.parse_vocab(toy_encoder_json("ab", "abab"), "#version: 0.2\na b\nab ab\n")
    # ids: byte b is b (the one-byte tokens come first, in byte order), "ab" 256, "abab" 257
    assert enc.encode("ababa") == [257, ord("a")]
    assert enc.decode([257, 97]) == "ababa"


def test_missing_vocabulary_folder(tmp_path):
    with pytest.raises(bpe.VocabError, match="encoder.json"):
        bpe.get_encoder(str(tmp_path))


# --- command line -------------------------------------------------------------------------

def run_bpe(*args, env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bpe.py"), *args],
                          capture_output=True, text=True, encoding="utf-8", env={**os.environ, **(env or {})})


def test_cli_shows_tokens_and_ids():
    r = run_bpe("Hello, world")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["Hello|,| world", "[15496, 11, 995]"]


def test_cli_decodes_ids():
    r = run_bpe("--ids", "15496", "11", "995")
    assert (r.returncode, r.stdout) == (0, "Hello, world\n")


def test_cli_shows_each_merge():
    r = run_bpe("--steps", "tokenization")
    lines = r.stdout.splitlines()
    assert r.returncode == 0
    assert lines[1].split() == ["start", "t|o|k|e|n|i|z|a|t|i|o|n"]
    assert lines[-2].split() == ["merge", "->", "token|ization"]
    assert lines[-1].split(None, 1) == ["ids", "[30001, 1634]"]


def test_cli_on_a_terminal_that_cannot_show_the_text():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bpe.py"), "café 🤗"], capture_output=True,
                       env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0
    assert r.stdout.splitlines() == [b"c|af|?| ?|?|?", b"[66, 1878, 2634, 12520, 97, 245]"]


@pytest.mark.parametrize("args, message", [
    (["--ids", "x"], "whole numbers"),
    (["--ids", "99999"], "99999"),
    (["--vocab-dir", "/nonexistent", "hi"], "encoder.json"),
    (["--bogus"], "unrecognized"),
])
def test_cli_errors_are_one_line_and_exit_2(args, message):
    r = run_bpe(*args)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr


def test_cli_shows_a_newline_escaped_once():
    r = run_bpe("--steps", "a\nb")
    assert r.returncode == 0 and "piece '\\n': 1 byte" in r.stdout.splitlines()
    assert run_bpe("a\n\tb").stdout.splitlines()[0] == "a|\\n|\\t|b"


def test_help_names_every_command():
    r = run_bpe("--help")
    description = r.stdout.split("\n\n")[1]
    assert r.returncode == 0 and all(flag in description for flag in ("--steps", "--ids", "--train"))


# === the trainer: the step by hand, the plain and fast forms equal, minbpe's merges, GPT-2's files ===
GOLDEN_DIR = os.path.join(DATA, "bpe_train")

with open(os.path.join(GOLDEN_DIR, "minbpe_merges.json"), encoding="utf-8") as f:
    MINBPE = json.load(f)


def golden_case(name):
    case = MINBPE["cases"][name]
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
    pair, _ = bpe.learn_merge([[5, 6], [1, 2], [5, 6], [1, 2]], 256)
    assert pair == (5, 6)  # the first seen, though (1, 2) is the smaller pair
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
                          ((good, "many"), "error: --vocab-size must be a whole number, got 'many'"),
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


def test_train_out_in_a_models_folder_not_yet_made_makes_it(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abab abab cdcd " * 20, encoding="utf-8")
    models = tmp_path / "models"
    r = run_bpe("--train", str(text), "--vocab-size", "260", "--out", str(models / "vocab"), "--quiet",
                env={"GPT2_MODELS_DIR": str(models)})
    assert r.returncode == 0 and sorted(os.listdir(models / "vocab")) == ["encoder.json", "vocab.bpe"], r.stderr
    r = run_bpe("--train", str(text), "--vocab-size", "260", "--out", str(tmp_path / "no" / "vocab"), "--quiet")
    assert r.returncode == 2 and "no does not exist" in r.stderr and not (tmp_path / "no").exists(), r.stderr


def test_steps_say_one_byte_in_the_singular(encoder):
    from interface.bpe_cli import show_steps

    assert show_steps(encoder, "a b").splitlines()[0] == "piece 'a': 1 byte"
    assert show_steps(encoder, "a b").splitlines()[3] == "piece ' b': 2 bytes"


def test_merges_promise_no_time_left(capsys, monkeypatch):
    """The first merges cost the most: an estimate from their rate said 129 s left of a 4 s run. A log's lines
    and a terminal's bar show the merges' count, time and rate, and no time left; a training step's still do."""
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    with bpe.merge_progress(3, quiet=False, every=0) as on_merge:
        on_merge(0)
    log = capsys.readouterr().err
    assert "merge 1/3 (33%), " in log and " left" not in log, log
    monkeypatch.setattr(sys, "stderr", Terminal())
    with bpe.merge_progress(3, quiet=False) as on_merge:
        for k in range(3):
            on_merge(k)
    bar = sys.stderr.getvalue()
    assert "3/3 [" in bar and "<" not in bar, bar  # tqdm's [elapsed<remaining], without the remaining
    from plumbing.progress import progress

    steps = Terminal()
    with progress(3, "step", file=steps) as bar:
        bar.update(3)
    assert "<" in steps.getvalue()
