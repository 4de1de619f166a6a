"""GPT-2's byte-level BPE tokenizer, rewritten from OpenAI's encoder.json and vocab.bpe.

One idea, seen from its two sides, and the file has two parts:
  Part 1. Using a vocabulary    encode and decode with the merges that encoder.json and vocab.bpe hold
  Part 2. Learning a vocabulary the trainer (minbpe's algorithm): the merges from a text, written
                                as the same two files, so that Part 1 reads them like GPT-2's own
Both cut a text with the same pre-tokenizer and spell tokens with the same byte alphabet.

Part 1 follows the data, in this order:

    text --pre-tokenize--> pieces --UTF-8--> bytes --merges--> ids
    "Hello world"  ->  ["Hello", " world"]  ->  [72, 101, ...]  ->  [15496, 995]

1. Pre-tokenize: a regular expression cuts the text into words, numbers,
   punctuation runs and whitespace. Merges never cross a piece boundary.
2. Each piece becomes its UTF-8 bytes, so any text at all can be encoded:
   there is no "unknown" token, the worst case is one token per byte.
3. Merges: repeatedly join the adjacent pair of tokens whose merge rule has the
   lowest rank (came first in vocab.bpe), until no pair has a rule.
4. Decoding is the reverse: ids -> bytes -> UTF-8 text.

The two files spell every token with printable characters (see
`bytes_to_unicode`); we translate them once, when the encoder is built, so the
hot loop works on bytes and integer ids only.

Two fast forms stand beside their plain ones (merge_fast beside merge, train_merges_fast beside
train_merges); a test holds each pair equal, and a handout runs the plain one.

    python bpe.py "Hello, world"        # tokens and ids
    python bpe.py --ids 15496 11 995    # ids back to text
    python bpe.py --steps "tokenization"  # every merge, from bytes to tokens
    python bpe.py --train data/tinyshakespeare.txt --vocab-size 4096 --out my-vocab   # learn one

(The command line is interface/bpe_cli.py; this file is the tokenizer.)
"""
if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("bpe_cli")  # the command line (show, decode, learn a vocabulary): this file is the tokenizer

import codecs
import contextlib
import heapq
import json
import operator
import os
import re
import sys
from collections import Counter
from itertools import chain

import regex

from plumbing import corpus, gguf, hf_model
from plumbing.errors import UserError, plural
from plumbing.folders import check_new_folder, whole_folder
from plumbing.progress import EVERY, progress
from plumbing.shapes import TOKENIZER_FILES

ENDOFTEXT = "<|endoftext|>"
DEFAULT_VOCAB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gpt2-vocab")


class VocabError(UserError):
    """encoder.json or vocab.bpe is missing or not a GPT-2 vocabulary; .path names the file."""


# ============================================================================
# Part 1. Using a vocabulary: text -> ids -> text
# ============================================================================

def bytes_to_unicode():
    """A reversible map from the 256 byte values to 256 printable characters.

    The vocabulary files are text, and a token may hold any bytes: spaces,
    newlines, control bytes, half of a UTF-8 character. So every byte gets a
    visible stand-in: the 188 bytes that are printable Latin-1 characters
    (other than space) stand for themselves; the other 68 (0x00-0x20,
    0x7F-0xA0, 0xAD) are shifted to U+0100, U+0101, ... in byte order.
    That is why a space shows up as 'Ġ' (U+0120) and a newline as 'Ċ' in the files."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, shifted = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


# The table is a 256-character code page, so Python's charmap codec applies it in C.
CODE_PAGE = "".join(bytes_to_unicode()[b] for b in range(256))
CODE_PAGE_MAP = codecs.charmap_build(CODE_PAGE)


def to_printable(data):
    """bytes -> their printable spelling, as in the vocabulary files: b' hi' -> 'Ġhi'."""
    return codecs.charmap_decode(data, "strict", CODE_PAGE)[0]


def from_printable(token):
    """A token's printable spelling -> its bytes: 'Ġhi' -> b' hi'."""
    return codecs.charmap_encode(token, "strict", CODE_PAGE_MAP)[0]


# Pre-tokenization: the first alternative that matches at each position wins.
# OpenAI's pattern lists the contractions first; words and numbers can go before
# them (an apostrophe is neither a letter nor a digit, so nothing changes), which is
# faster since most pieces are words. They must stay before punctuation,
# which would otherwise take the apostrophe.
PRETOKENIZE = regex.compile(
    r" ?\p{L}+"                 # a word: letters of any script, with at most one leading space
    r"| ?\p{N}+"                # a number: digits of any script, with at most one leading space
    r"|'(?:s|t|re|ve|m|ll|d)"   # English contractions, lower case only, ASCII apostrophe only
    r"| ?[^\s\p{L}\p{N}]+"      # a run of punctuation and symbols, with at most one leading space
    r"|\s+(?!\S)"               # whitespace, but not the last space before a word (it joins the word)
    r"|\s+"                     # any whitespace left (at the very end of the text)
)

# A speed-up that changes no result: cutting the text before pre-tokenizing it. No
# piece holds a space after a non-space character (words, numbers and punctuation
# take one space only in front), and the pattern never looks back, so the text may be
# cut before every such space and each stretch encoded on its own. Python's `re`
# finds these cuts in C, and a stretch is mostly one word with its punctuation, so
# whole stretches are cached too. (`re`'s \S is stricter than `regex`'s: it calls a few
# control characters whitespace, so it may miss a cut, but never makes a wrong one.)
CUTS = re.compile(r"(?<=\S)(?= )")


class Encoder:
    """encode(text) -> ids and decode(ids) -> text, from the vocabulary and the merge list.

    encoder: {token spelled in printable characters: id}, as in encoder.json.
    merges:  [(left, right), ...] in priority order, as in vocab.bpe."""

    def __init__(self, encoder, merges):
        self.n_vocab = n = len(encoder)
        tokens = list(encoder)
        if list(encoder.values()) != list(range(n)):  # OpenAI's file is already in id order
            tokens.sort(key=encoder.get)
            if [encoder[t] for t in tokens] != list(range(n)):
                raise VocabError("ids must be 0, 1, 2, ... with none missing or repeated", path="encoder.json")
        self.encoder = encoder
        try:
            self.token_bytes = [from_printable(t) for t in tokens]  # id -> the bytes it stands for
        except UnicodeEncodeError:
            raise VocabError("a token uses a character outside the byte alphabet", path="encoder.json") from None
        missing = [c for c in CODE_PAGE if c not in encoder]
        if missing:
            raise VocabError(f"lacks the one-byte token {missing[0]!r}: every byte needs one", path="encoder.json")
        self.byte_ids = [encoder[c] for c in CODE_PAGE]  # byte -> its one-byte token
        # A merge rule joins the pair (left id, right id). We key each rule by one
        # int, left * n_vocab + right: cheaper to build and look up than a tuple.
        try:
            self.ranks = {encoder[left] * n + encoder[right]: rank  # pair key -> rank: lower merges first
                          for rank, (left, right) in enumerate(merges)}
            self.token_of_rank = [encoder[left + right] for left, right in merges]  # rank -> the id it makes
        except KeyError as e:
            raise VocabError(f"a merge uses the token {e.args[0]!r}, which encoder.json lacks",
                             path="vocab.bpe") from None
        self.eot = encoder.get(ENDOFTEXT)
        self.merged_pieces = Memo(self.encode_piece)  # piece -> ids
        self.stretches = Memo(self.encode_stretch)  # stretch between two cuts -> ids

    # --- encoding -------------------------------------------------------------

    def merge_once(self, ids):
        """One merge: join the adjacent pair whose rule has the lowest rank (came first in
        vocab.bpe). -> the new list of ids, or None when no pair has a rule.
        Among equal pairs the leftmost goes first, which gives the same result as
        OpenAI's "merge every occurrence at once"."""
        n = self.n_vocab
        ranks = [self.ranks.get(a * n + b) for a, b in zip(ids, ids[1:])]  # pair i = (ids[i], ids[i+1])
        ranked = [(rank, i) for i, rank in enumerate(ranks) if rank is not None]
        if not ranked:
            return None
        rank, i = min(ranked)
        return ids[:i] + [self.token_of_rank[rank]] + ids[i + 2:]

    def merge(self, ids):
        """Byte-level BPE on one piece: merge until no pair has a rule.   ids -> ids"""
        ids = list(ids)
        while True:
            merged = self.merge_once(ids)
            if merged is None:
                return ids
            ids = merged

    def merge_fast(self, ids):
        """merge(ids), for encode's hot path. merge_once looks up every
        pair's rank again after each merge; here each pair's rank is kept in a list, and after a
        merge only the two pairs next to it are looked up again. (A merge only creates pairs of
        higher rank: their rules use the new token, so they came later in vocab.bpe.)"""
        no_rule, n, ranks = len(self.token_of_rank), self.n_vocab, self.ranks
        ids = list(ids)
        pair_ranks = [ranks.get(a * n + b, no_rule) for a, b in zip(ids, ids[1:])]
        while pair_ranks:
            best = min(pair_ranks)
            if best == no_rule:
                break
            i = pair_ranks.index(best)
            ids[i:i + 2] = [self.token_of_rank[best]]
            del pair_ranks[i]
            if i > 0:
                pair_ranks[i - 1] = ranks.get(ids[i - 1] * n + ids[i], no_rule)
            if i < len(pair_ranks):
                pair_ranks[i] = ranks.get(ids[i] * n + ids[i + 1], no_rule)
        return ids

    def encode_piece(self, piece):
        """One pre-token -> ids (a tuple: cached, so it must not change). A piece that is
        itself a token needs no merging (tiktoken takes the same shortcut; a test checks
        it changes no result)."""
        data = piece.encode("utf-8")
        whole = self.encoder.get(to_printable(data))
        if whole is not None:
            return (whole,)
        return tuple(self.merge_fast([self.byte_ids[b] for b in data]))

    def encode(self, text, allowed_special=()):
        """Text -> ids. '<|endoftext|>' in the text is ordinary text unless
        allowed_special contains it (or is "all"): then it becomes its id (self.eot: 50256 in GPT-2's)."""
        if allowed_special == "all" or ENDOFTEXT in allowed_special:
            if self.eot is None:
                raise UserError(f"this vocabulary has no {ENDOFTEXT}")
            pieces = [self.encode(part) for part in text.split(ENDOFTEXT)]
            return pieces[0] + list(chain.from_iterable([self.eot] + p for p in pieces[1:]))
        if set(allowed_special) - {ENDOFTEXT}:
            raise UserError(f"unknown special tokens {sorted(set(allowed_special) - {ENDOFTEXT})}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates become U+FFFD, as in tiktoken
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return list(chain.from_iterable(map(self.stretches.__getitem__, CUTS.split(text))))

    def encode_stretch(self, text):
        """Pre-tokenize, then each piece's ids, one after another (a tuple, as it is cached)."""
        return tuple(chain.from_iterable(map(self.merged_pieces.__getitem__, PRETOKENIZE.findall(text))))

    # --- decoding -------------------------------------------------------------

    def decode_bytes(self, ids):
        """ids -> the bytes they stand for; a token may end inside a UTF-8 character."""
        out = []
        for i in ids:
            try:
                i = operator.index(i)
            except TypeError:
                raise TypeError(f"token ids must be integers, got {i!r}") from None
            if not 0 <= i < self.n_vocab:
                raise UserError(f"token id {i} is outside 0..{self.n_vocab - 1}")
            out.append(self.token_bytes[i])
        return b"".join(out)

    def decode(self, ids):
        """ids -> text; bytes that are not valid UTF-8 (a character cut in two) become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


class Memo(dict):
    """text -> ids, computed on first use. Text repeats its words, so most are
    looked up, not merged; and the lookup runs in C (dict.__getitem__). The ids are
    tuples: Python's garbage collector stops tracking tuples of ints, but would walk
    hundreds of thousands of cached lists again and again."""

    def __init__(self, compute):
        super().__init__()
        self.compute = compute

    def __missing__(self, text):
        ids = self[text] = self.compute(text)
        return ids


def parse_vocab(encoder_json, vocab_bpe):
    """The two files' contents -> an Encoder."""
    try:
        encoder = json.loads(encoder_json)
    except ValueError as e:
        raise VocabError(f"not valid JSON ({e})", path="encoder.json") from None
    if not isinstance(encoder, dict):
        raise VocabError("must hold a JSON object of token -> id", path="encoder.json")
    if vocab_bpe.startswith("#version"):
        vocab_bpe = vocab_bpe[vocab_bpe.find("\n") + 1:]
    tokens = vocab_bpe.split()
    merges = list(zip(tokens[0::2], tokens[1::2]))
    if len(tokens) != 2 * vocab_bpe.rstrip("\n").count("\n") + 2:  # not two tokens a line: find the line
        for number, line in enumerate(vocab_bpe.splitlines(), start=1):
            if line.strip() and len(line.split()) != 2:
                raise VocabError(f"merge line {number} does not hold two tokens", path="vocab.bpe")
    return Encoder(encoder, merges)


def get_encoder(folder):
    """The Encoder for a model folder: OpenAI's encoder.json and vocab.bpe, or Hugging Face's
    vocab.json and merges.txt (the same two tables under other names); or for a GGUF file, whose
    tokenizer.ggml.tokens and merges are the same two tables again; or a tokenizer.json alone (what
    transformers 5 saves), whose BPE model holds them too."""
    if gguf.is_gguf(folder):
        tokens, merges = gguf.read_vocabulary(folder)
        return Encoder({token: i for i, token in enumerate(tokens)}, merges)
    if hf_model.has_tokenizer_json_only(folder):
        files = hf_model.tokenizer_json_files(folder)
        try:
            return parse_vocab(files["encoder.json"].decode("utf-8"), files["vocab.bpe"].decode("utf-8"))
        except VocabError as e:
            raise VocabError(e.message, path=os.path.join(folder, hf_model.TOKENIZER_JSON)) from None
    names = ("encoder.json", "vocab.bpe")
    hf_names = tuple(TOKENIZER_FILES[name] for name in names)
    if not os.path.exists(os.path.join(folder, names[0])) and os.path.exists(os.path.join(folder, hf_names[0])):
        names = hf_names
    contents = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                contents.append(f.read())
        except OSError as e:
            raise VocabError(e.strerror, path=path) from None
        except UnicodeDecodeError:
            raise VocabError("not UTF-8 text", path=path) from None
    try:
        return parse_vocab(*contents)
    except VocabError as e:
        file = dict(zip(("encoder.json", "vocab.bpe"), names)).get(e.path, e.path)
        raise VocabError(e.message, path=os.path.join(folder, file)) from None


# ============================================================================
# Part 2. Learning a vocabulary: the merges from a text, written as GPT-2's two files
# ============================================================================
# In order: the plain trainer (pair_counts, merge_pair, learn_merge, train_merges), its fast twin
# (train_merges_fast and its heap), the two files (vocab_files), then train_vocab and
# write_vocab, which learn a whole vocabulary and write it.
# While learning, a token is an int: 0-255 are the bytes themselves, 256 + k is the k-th
# merge's token. The files give the bytes GPT-2's own ids (GPT2_BYTE_ORDER) when written.

def pair_counts(pieces):
    """How often each adjacent pair of tokens occurs, over every piece.
    -> {(left, right): count}, in the order the pairs first occur in the text"""
    counts = {}
    for ids in pieces:
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge_pair(ids, pair, new_id):
    """ids with every occurrence of pair, left to right, replaced by new_id."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def learn_merge(pieces, new_id):
    """One step of training: the most frequent pair (a tie: the one that occurs first in the
    text as it stands), merged everywhere into new_id. -> (that pair, the new pieces), or
    (None, pieces) when no piece has two tokens left."""
    counts = pair_counts(pieces)
    if not counts:
        return None, pieces
    best = max(counts, key=counts.get)  # max keeps the first of equals: dicts keep insertion order
    return best, [merge_pair(ids, best, new_id) for ids in pieces]


def pretokenize(text):
    """The pieces a trainer merges within. text: one text, or a list of documents, each cut on its
    own, so that no piece, and so no merge, crosses from one document into the next."""
    documents = corpus.as_documents(text)
    return [piece for document in documents for piece in PRETOKENIZE.findall(document)]


def train_merges(text, n_merges, on_merge=None):
    """The plain trainer: pre-tokenize, then learn_merge n_merges times (fewer if the pairs run
    out). -> [(left, right)], the merges in the order they were learned (ids as above).
    text: one text or a list of documents (pretokenize). on_merge(k) is called after each, for a progress bar."""
    pieces = [list(piece.encode("utf-8")) for piece in pretokenize(text)]
    merges = []
    for k in range(n_merges):
        pair, pieces = learn_merge(pieces, 256 + k)
        if pair is None:
            break
        merges.append(pair)
        if on_merge:
            on_merge(k)
    return merges


def train_merges_fast(text, n_merges, on_merge=None):
    """train_merges, for a real corpus. Each distinct piece is kept
    once with how often it occurs, so a word seen 1,000 times is merged once, and counted 1,000
    times. After a merge only the pieces that held the pair are counted again (remerge_piece),
    and the best pair comes off a heap ordered by count and first place (pop_best_pair), so a
    merge costs the same at the end as at the start."""
    freq = Counter(pretokenize(text))  # insertion order: the order pieces first occur
    pieces = [list(piece.encode("utf-8")) for piece in freq]
    weight = list(freq.values())
    counts, where, first = {}, {}, {}  # pair -> total count; -> the pieces that hold it; -> the first of them
    for i, ids in enumerate(pieces):
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + weight[i]
            where.setdefault(pair, set()).add(i)
            first.setdefault(pair, i)
    live = {}  # pair -> its one heap entry that is up to date
    heap = [heap_entry(pair, counts, where, first, pieces, live) for pair in counts]
    heapq.heapify(heap)
    merges = []
    for k in range(n_merges):
        best = pop_best_pair(heap, live)
        if best is None:
            break
        changed = set()  # the pairs whose count, or first place in the text, moved
        for i in sorted(where[best]):
            remerge_piece(i, best, 256 + k, pieces, weight[i], counts, where, first, changed)
        for pair in changed:  # each goes on the heap again; its older entry is skipped when it comes off
            if counts[pair] > 0:
                heapq.heappush(heap, heap_entry(pair, counts, where, first, pieces, live))
            else:
                for table in (counts, where, first, live):
                    table.pop(pair, None)
        if len(heap) > 2 * len(live) + 1024:  # mostly outdated entries: keep only the live ones
            heap = list(live.values())
            heapq.heapify(heap)
        merges.append(best)
        if on_merge:
            on_merge(k)
    return merges


def heap_entry(pair, counts, where, first, pieces, live):
    """The pair's place in the heap, recorded in `live`: (-count, its first piece, its first position
    there, pair). So the most frequent pair comes off first, and of a tie the pair that occurs
    first in the text (pieces are numbered in the order they first occur), as in train_merges.
    A pair whose first piece lost it is missing from `first`: its first piece is found again here."""
    i = first.get(pair)
    if i is None:
        i = first[pair] = min(where[pair])
    entry = live[pair] = (-counts[pair], i, list(zip(pieces[i], pieces[i][1:])).index(pair), pair)
    return entry


def pop_best_pair(heap, live):
    """The most frequent pair off the heap (a tie: the one first in the text), or None when no pair
    is left. Each entry comes off once; one that is no longer its pair's live entry is dropped."""
    while heap:
        entry = heapq.heappop(heap)
        if live.get(entry[-1]) is entry:
            return entry[-1]
    return None


def remerge_piece(i, pair, new_id, pieces, weight, counts, where, first, changed):
    """Merge pair into new_id in piece i (seen `weight` times), moving its pairs' counts and
    their `where` and `first` entries from the old spelling to the new one; each pair of the old
    spelling or the new goes into the set `changed`."""
    before = list(zip(pieces[i], pieces[i][1:]))
    pieces[i] = merge_pair(pieces[i], pair, new_id)
    after = list(zip(pieces[i], pieces[i][1:]))
    for p in before:
        counts[p] -= weight
    for p in after:
        counts[p] = counts.get(p, 0) + weight
    old, new = set(before), set(after)
    for p in old - new:
        where[p].discard(i)
        if first.get(p) == i:
            del first[p]  # found again, once, when the pair goes back on the heap
    for p in new - old:
        where.setdefault(p, set()).add(i)
        if p in first and i < first[p]:
            first[p] = i
    changed.update(before)
    changed.update(after)


GPT2_BYTE_ORDER = sorted(range(256), key=lambda b: ord(CODE_PAGE[b]))  # ids 0..255 -> their bytes, as GPT-2's


def merged_bytes(merges):
    """Each learned token's bytes: [the 256 bytes, then each merge's left + right]."""
    token = [bytes([b]) for b in range(256)]
    for left, right in merges:
        token.append(token[left] + token[right])
    return token


def spelled_twice(merges):
    """The first merge whose token spells bytes an earlier token already spells, or None.
    GPT-2's files name tokens by their bytes, so they cannot hold both."""
    seen = set(bytes([b]) for b in range(256))
    for k, data in enumerate(merged_bytes(merges)[256:]):
        if data in seen:
            return k
        seen.add(data)
    return None


def vocab_files(merges):
    """The merges as GPT-2's two files: (encoder.json, vocab.bpe) as text. Ids: the 256 bytes in
    GPT-2's order, then the merges in the order they were learned, then <|endoftext|>."""
    token = merged_bytes(merges)
    order = [token[b] for b in GPT2_BYTE_ORDER] + token[256:]
    encoder = {to_printable(data): i for i, data in enumerate(order)}
    encoder[ENDOFTEXT] = len(order)
    lines = [f"{to_printable(token[left])} {to_printable(token[right])}\n" for left, right in merges]
    return json.dumps(encoder, ensure_ascii=False), "#version: 0.2\n" + "".join(lines)


def train_vocab(text, vocab_size, quiet=True):
    """vocab_size ids in all, as GPT-2's 50257: 256 bytes, vocab_size - 257 merges, <|endoftext|>.
    text: one text or a list of documents (no merge crosses from one into the next). -> the merges.
    The merges stop when no pair is left: too few distinct pairs, or a merge that spells an
    earlier token again, is a UserError saying how many merges were learned."""
    if vocab_size < 257:
        raise UserError(f"must be at least 257 (256 bytes and <|endoftext|>), got {vocab_size}", arg="--vocab-size")
    wanted = vocab_size - 257
    documents = corpus.as_documents(text)
    most = max(sum(len(d.encode("utf-8")) for d in documents) - 1, 0)  # a merge uses up at least one adjacent pair
    with merge_progress(min(wanted, most), quiet) as on_merge:
        merges = train_merges_fast(text, wanted, on_merge=on_merge)
    if len(merges) < wanted:
        raise UserError(f"the text has only enough distinct pairs for {plural(len(merges), 'merge', ',')}, not the "
                        f"{wanted:,} that --vocab-size {vocab_size} asks for: use --vocab-size {257 + len(merges)} or "
                        "more text")
    twice = spelled_twice(merges)
    if twice is not None:
        raise UserError(f"merge {twice + 1} spells {merged_bytes(merges)[256 + twice]!r} a second time, which "
                        f"GPT-2's files cannot hold: use --vocab-size {257 + twice} or less")
    return merges


# The one place where training shows its progress.


@contextlib.contextmanager
def merge_progress(total, quiet, every=EVERY):
    """`with merge_progress(n, quiet) as on_merge:` on_merge(k) after merge k, shown as every
    command shows progress (plumbing/progress.py): a bar on a terminal; in a log, a first line
    and then a plain line every `every` seconds; nothing when quiet."""
    # no time left: the first merges, of the most frequent pairs, cost the most (on tiny Shakespeare, 767 merges:
    # the first tenth take half the time), so their rate so far would promise 7 to 170 times the time left
    with progress(total, "merge", quiet=quiet, every=every, estimate=False) as bar:
        if not quiet and not sys.stderr.isatty():
            print(f"learning up to {plural(total, 'merge', ',')}", file=sys.stderr, flush=True)
        yield lambda k: bar.update(1)


def write_vocab(folder, merges):
    """encoder.json and vocab.bpe into folder (made new), whole or not at all."""
    check_new_folder(folder)
    encoder_json, vocab_bpe = vocab_files(merges)
    with whole_folder(folder, "the vocabulary") as tmp:
        for name, content in (("encoder.json", encoder_json), ("vocab.bpe", vocab_bpe)):
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(content)
    return folder

