"""The text that a model (train.py --data) or a vocabulary (bpe.py --train) learns from.

A corpus is a list of documents: a .txt file is one document, a folder gives each of its .txt
files, in sorted order, and a .jsonl file gives each line's {"text": ...}. A .jsonl file of other
lines is examples, told by their fields (KINDS): {"prompt", "response"} instruction data, {"text",
"label"} labelled texts (a classifier's), {"prompt", "chosen", "rejected"} preferences.
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
# A .jsonl line's kind is told by its fields (other fields are let be): {kind: ({field: type}, the fields that
# must not be empty, how a message names it)}. A line whose fields are several kinds' or none's is an error.
KINDS = {
    "documents": ({"text": str}, ("text",), "a document (text)"),
    "instruction": ({"prompt": str, "response": str}, ("response",), "an example (prompt, response)"),
    "labelled": ({"text": str, "label": (str, int)}, ("text",), "a labelled text (text, label)"),
    "preference": ({"prompt": str, "chosen": str, "rejected": str}, ("chosen", "rejected"),
                   "a preference (prompt, chosen, rejected)"),
}
KIND_FIELDS = {field for fields, _, _ in KINDS.values() for field in fields}


def as_documents(text):
    """One text, or a list of documents -> the list of documents (one text is one document)."""
    return [text] if isinstance(text, str) else text


def read_corpus(paths):
    """-> (documents, examples, kind): documents [text, ...] (read_documents); examples, each a line's
    values in KINDS' order ((prompt, response), (text, label), (prompt, chosen, rejected)), None for
    documents; and the kind, KINDS' name. The documents of the other kinds are each line's strings
    joined: what a vocabulary learns from."""
    read = [read_jsonl(path) if is_jsonl(path) else ("documents", read_documents([path])) for path in paths]
    kinds = [kind for kind, _ in read]
    if len(set(kinds)) > 1:
        raise UserError(f"the data mixes {KINDS[kinds[0]][2]} and {KINDS[next(k for k in kinds if k != kinds[0])][2]}"
                        " lines: give one kind")
    if kinds[0] == "documents":
        return [d for _, items in read for d in items], None, "documents"
    examples = [e for _, items in read for e in items]
    return [joined(e) for e in examples], examples, kinds[0]


def joined(example):
    return "".join(value for value in example if isinstance(value, str))


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
            documents += items if kind == "documents" else [joined(e) for e in items]
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
    """A .jsonl file of one of KINDS (jsonl_objects reads it). -> (kind, [text, ...]) for documents, else
    (kind, [a line's values, ...]). A line of no kind or of several, whose values are not of their types,
    or whose main fields are empty, and a file that mixes the kinds, is a UserError naming the line."""
    kind, items = None, []
    for n, item in jsonl_objects(path):
        this = line_kind(item)
        if this is None:
            raise UserError(f"line {n} is not " + " nor ".join(
                "{" + ", ".join(f'"{f}": ...' for f in fields) + "}" for fields, _, _ in KINDS.values()), path=path)
        if kind not in (None, this):
            raise UserError(f"line {n} is {KINDS[this][2]}, but the lines before it are {KINDS[kind][2]}: "
                            "give one kind", path=path)
        kind = this
        fields, not_empty, _ = KINDS[kind]
        check_fields(item, fields, n, path)
        for field in not_empty:
            if not item[field]:
                raise UserError(f"line {n}'s {field} is empty", path=path)
        items.append(item["text"] if kind == "documents" else tuple(item[key] for key in fields))
    return kind, items


def line_kind(item):
    """The kind (KINDS' name) whose fields are exactly those of the line's fields that any kind has; or None."""
    used = set(item) & KIND_FIELDS
    return next((kind for kind, (fields, _, _) in KINDS.items() if set(fields) == used), None)


# --- the one .jsonl reader: every command's lines, with one set of messages ---------------------

# a field's type, as a message names it
TYPE_NAMES = {str: "a string", list: "a list", int: "a whole number", (str, int): "a string or a whole number"}


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
