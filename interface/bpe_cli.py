"""The command line of bpe.py: watch the tokenizer work, decode ids, learn a vocabulary.

    python bpe.py "Hello, world"          # tokens and ids
    python bpe.py --ids 15496 11 995      # ids back to text
    python bpe.py --steps "tokenization"  # every merge, from bytes to tokens
    python bpe.py --train data/tinyshakespeare.txt --vocab-size 4096 --out my-vocab   # learn one

Exit status: 0 done, 2 a user's mistake (one line on stderr), 130 interrupted (Ctrl-C or SIGTERM).
"""
import argparse
import sys

import bpe
from interface.options import at_least
from plumbing import corpus
from plumbing.errors import UserError, exit_status, fail, plural
from plumbing.folders import check_new_folder, in_models_folder

SHOW = str.maketrans({c: f"\\x{c:02x}" for c in list(range(32)) + [127]} | {10: "\\n", 9: "\\t", 13: "\\r"})


def shown_token(enc, i):
    """A token's text as a line or a table cell shows it: control characters escaped, a newline as \\n."""
    return enc.decode([int(i)]).translate(SHOW)


def show_tokens(enc, ids):
    """'Hello|,| world': each token's text, control characters escaped."""
    return "|".join(shown_token(enc, i) for i in ids)


def show_steps(enc, text):
    """Every piece, and every merge inside it, from bytes to final tokens."""
    lines = []
    for piece in bpe.PRETOKENIZE.findall(text):
        ids = [enc.byte_ids[b] for b in piece.encode("utf-8")]
        lines.append(f"piece {piece!r}: {plural(len(ids), 'byte')}")  # repr escapes control characters, once
        lines.append(f"  start    {show_tokens(enc, ids)}")
        while (merged := enc.merge_once(ids)) is not None:
            ids = merged
            lines.append(f"  merge -> {show_tokens(enc, ids)}")
        lines.append(f"  ids      {ids}")
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="bpe.py", description="GPT-2's byte-level BPE: show how a text is tokenized (--steps: every merge), "
                                   "decode ids (--ids), or learn a vocabulary from text files (--train).",
        epilog="All four GPT-2 sizes share one vocabulary; a copy ships in data/gpt2-vocab.")
    parser.add_argument("text", nargs="*", help="text to tokenize (or ids, with --ids)")
    parser.add_argument("--ids", action="store_true", help="decode the arguments, which are token ids")
    parser.add_argument("--steps", action="store_true", help="show each merge, from bytes to final tokens")
    parser.add_argument("--vocab-dir", default=bpe.DEFAULT_VOCAB_DIR,
                        help="folder with encoder.json and vocab.bpe (default: the copy in data/gpt2-vocab)")
    parser.add_argument("--train", nargs="+", metavar="FILE", help="learn a vocabulary from these documents: UTF-8 "
                                                                   ".txt files, folders of them, .jsonl files")
    parser.add_argument("--vocab-size", type=at_least(257, " (256 bytes and <|endoftext|>)"),
                        help="with --train: ids in all (256 bytes, the merges, <|endoftext|>; GPT-2 has 50257)")
    parser.add_argument("--out", help="with --train: a new folder for encoder.json and vocab.bpe")
    parser.add_argument("--quiet", action="store_true", help="with --train: no progress")
    parser.error = fail
    args = parser.parse_args(argv)
    if args.train is not None and (args.vocab_size is None or args.out is None):
        fail("--train needs --vocab-size N and --out DIR")
    return args


def run_train(args):
    """--train: check --out first, learn the merges, write the two files."""
    with in_models_folder(args.out):  # --out models/my-vocab on a fresh clone
        check_new_folder(args.out)
        merges = bpe.train_vocab(corpus.read_corpus(args.train)[0], args.vocab_size, args.quiet)
        bpe.write_vocab(args.out, merges)
    print(f"{args.out}: {args.vocab_size} ids ({plural(len(merges), 'merge')}); "
          f"python bpe.py --vocab-dir {args.out} \"text\" uses it")


def run_ids(enc, words):
    """--ids: the arguments, which are token ids, back to text."""
    try:
        ids = [int(t) for t in " ".join(words).replace(",", " ").strip("[] ").split()]
    except ValueError:
        raise UserError("--ids takes whole numbers, e.g. --ids 15496 11 995") from None
    print(enc.decode(ids))


def run_show(enc, text, steps):
    """The text's tokens and ids, or with --steps every merge that makes them."""
    if steps:
        print(show_steps(enc, text))
    else:
        ids = enc.encode(text)
        print(show_tokens(enc, ids))
        print(ids)


def main(argv=None):
    args = parse_args(argv)
    sys.stdout.reconfigure(errors="replace")  # a terminal that cannot show a character gets '?'
    return exit_status(lambda: run(args))


def run(args):
    """The one thing the command line asked for."""
    if args.train is not None:
        run_train(args)
    elif args.ids:
        run_ids(bpe.get_encoder(args.vocab_dir), args.text)
    else:
        run_show(bpe.get_encoder(args.vocab_dir), " ".join(args.text), args.steps)
