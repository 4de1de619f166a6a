"""The text that a model (train.py --data) or a vocabulary (bpe.py --train) learns from.

A corpus is a list of documents: a .txt file is one document, and a folder gives each of its
.txt files, in sorted order. Both commands read it here and join it with join_documents, so
that a vocabulary and the model trained with it see the same text.
"""
import os
import sys

from plumbing.errors import UserError, read_text

SEPARATOR = "\n\n"  # between two documents: a blank line, as between two paragraphs


def read_documents(paths):
    """-> [text, ...]: each path a UTF-8 .txt file (one document) or a folder (each .txt file in
    it, sorted by name). A file named on its own must hold text; an empty one in a folder is
    skipped with a note, so that one stray file does not stop a run, but a folder with no text
    at all is a UserError."""
    documents = []
    for path in paths:
        documents += folder_documents(path) if os.path.isdir(path) else [read_text(path)]
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


def join_documents(documents):
    """The documents as one text, SEPARATOR between each two: the one rule for where a document ends."""
    return SEPARATOR.join(documents)


def read_corpus(paths):
    """The text that bpe.py --train and train.py --data learn from: read_documents, joined."""
    return join_documents(read_documents(paths))
