"""bpe.py against GPT-2's reference tokenizer (tiktoken's golden ids) and an independent classic BPE."""
import json
import os
import random
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

def run_bpe(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bpe.py"), *args],
                          capture_output=True, text=True, encoding="utf-8")


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
    assert r.returncode == 0 and "piece '\\n': 1 bytes" in r.stdout.splitlines()
    assert run_bpe("a\n\tb").stdout.splitlines()[0] == "a|\\n|\\t|b"


def test_help_names_every_command():
    r = run_bpe("--help")
    description = r.stdout.split("\n\n")[1]
    assert r.returncode == 0 and all(flag in description for flag in ("--steps", "--ids", "--train"))
