"""The text that a model (train.py --data) or a vocabulary (bpe.py --train) learns from.

A corpus is a list of documents: a .txt file is one document, a folder gives each of its .txt
files, in sorted order, and a .jsonl file gives each line's {"text": ...}. A .jsonl file whose
lines are {"prompt": ..., "response": ...} is instruction data: each line one example.
Both commands read it here (read_corpus), so that a vocabulary and the model trained with it see
the same documents; where one document ends, train.py puts <|endoftext|> and bpe.py stops its
pieces, so that no merge crosses from one document into the next.

At the end, jsonl_objects reads any .jsonl file (evaluate.py's tasks too): one JSON object a
line, with the fields its reader asks for, so that a mistake in one file reads as in every other.
"""
import json
import os
import sys

from plumbing.errors import UserError, read_text

SEPARATOR = "\n\n"  # the old way between two documents: a blank line, as between two paragraphs
TEXT, INSTRUCTION = ("text",), ("prompt", "response")  # a .jsonl line's keys: a document, or an example


def as_documents(text):
    """One text, or a list of documents -> the list of documents (one text is one document)."""
    return [text] if isinstance(text, str) else text


def read_corpus(paths):
    """-> (documents, examples): documents [text, ...] (read_documents), and examples
    [(prompt, response), ...] when the data is instruction data, else None. The documents of
    instruction data are its prompts and responses joined: what a vocabulary learns from."""
    read = [read_jsonl(path) if is_jsonl(path) else (TEXT, read_documents([path])) for path in paths]
    kinds = {kind for kind, _ in read}
    if len(kinds) > 1:
        raise UserError("the data mixes documents and instruction data (prompt, response): give one kind")
    if kinds == {TEXT}:
        return [d for _, items in read for d in items], None
    examples = [e for _, items in read for e in items]
    return [prompt + response for prompt, response in examples], examples


def read_documents(paths):
    """-> [text, ...]: each path a UTF-8 .txt file (one document), a folder (each .txt file in
    it, sorted by name) or a .jsonl file of {"text": ...} lines. A file named on its own must
    hold text; an empty one in a folder is skipped with a note, so that one stray file does not
    stop a run, but a folder with no text at all is a UserError."""
    documents = []
    for path in paths:
        if os.path.isdir(path):
            documents += folder_documents(path)
        elif is_jsonl(path):
            kind, items = read_jsonl(path)
            documents += items if kind == TEXT else [prompt + response for prompt, response in items]
        else:
            documents.append(read_text(path))
    return documents


def folder_documents(folder):
    """The documents of a folder's .txt files, sorted by name; the empty ones skipped, with a note on stderr."""
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".txt"))
    if not files:
        raise UserError("holds no .txt file", path=folder)
    documents = []
    for path in files:
        try:
            documents.append(read_text(path))
        except UserError as e:
            if e.message != "is empty":
                raise
            print(f"note: {path} is empty: skipped", file=sys.stderr)
    if not documents:
        raise UserError(f"holds only empty .txt files ({len(files)})", path=folder)
    return documents


def is_jsonl(path):
    return path.endswith(".jsonl") and not os.path.isdir(path)


def read_jsonl(path):
    """A .jsonl file of documents or of instruction data, all of one kind (jsonl_objects reads it).
    -> (TEXT, [text, ...]) or (INSTRUCTION, [(prompt, response), ...]). A line with neither kind's
    keys (or both), whose values are not strings, or whose text or response is empty, and a file
    that mixes the kinds, is a UserError naming the line."""
    kind, items = None, []
    for n, item in jsonl_objects(path):
        this = line_kind(item)
        if this is None:
            raise UserError(f'line {n} is not {{"text": ...}} nor {{"prompt": ..., "response": ...}}', path=path)
        if kind not in (None, this):
            raise UserError(f"line {n} is {describe(this)}, but the lines before it are {describe(kind)}: "
                            "give one kind", path=path)
        kind = this
        check_fields(item, dict.fromkeys(this, str), n, path)
        values = [item[key] for key in this]
        if not values[-1]:
            raise UserError(f"line {n}'s {this[-1]} is empty", path=path)
        items.append(values[0] if kind == TEXT else tuple(values))
    return kind, items


def line_kind(item):
    """TEXT, INSTRUCTION, or None: which keys the line's object has (exactly one kind's)."""
    has = {kind for kind in (TEXT, INSTRUCTION) if all(key in item for key in kind)}
    if len(has) != 1 or (TEXT in has and any(key in item for key in INSTRUCTION)):
        return None
    return has.pop()


def describe(kind):
    return "a document (text)" if kind == TEXT else "an example (prompt, response)"


# --- the one .jsonl reader: every command's lines, with one set of messages ---------------------

TYPE_NAMES = {str: "a string", list: "a list", int: "a whole number"}  # a field's type, as a message names it


def jsonl_objects(path, fields=None, limit=None):
    """A .jsonl file's objects, one a line, blank lines skipped: -> [(line number, object), ...], the
    first `limit` of them. Each must hold `fields` ({name: type}, check_fields). A line that is not
    JSON, or not a JSON object, is a UserError naming it. Lines end at "\\n" alone (and a "\\r"
    before it is JSON's whitespace): JSON text may hold U+2028 and the other ends splitlines knows."""
    items = []
    for n, line in enumerate(read_text(path).split("\n"), 1):
        if limit is not None and len(items) == limit:
            break
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"line {n} is not JSON ({e.msg})", path=path) from None
        if not isinstance(item, dict):
            raise UserError(f"line {n} is not a JSON object", path=path)
        check_fields(item, fields or {}, n, path)
        items.append((n, item))
    return items


def check_fields(item, fields, n, path):
    """Line n's object holds each of fields ({name: type}), of its type (true and false are not whole
    numbers, though Python counts them as ints); else a UserError naming the line and the field."""
    for field, kind in fields.items():
        if field not in item:
            raise UserError(f"line {n} has no {field!r}", path=path)
        if not isinstance(item[field], kind) or isinstance(item[field], bool):
            raise UserError(f"line {n}: {field!r} must be {TYPE_NAMES[kind]}", path=path)


def join_documents(documents):
    """The documents as one text, SEPARATOR between each two: how the project joined them before
    each document ended with <|endoftext|> (a reader that wants one text, and the tests' "before")."""
    return SEPARATOR.join(documents)
