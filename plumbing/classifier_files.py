"""A classifier's head in a model folder (classify.py's model): the score matrix [K, C] and the labels.

    OpenAI's format (the project's)    beside hparams.json: classifier.json {"labels": [...], "pad_token_id": id}
                                       and score.npy, the head's float32 [K, C] (NumPy's own format, no pickle)
    Hugging Face's                     config.json: architectures ["GPT2ForSequenceClassification"], num_labels,
                                       id2label, label2id, pad_token_id; model.safetensors: score.weight [K, C]

The checkpoint itself stays GPT-2's tensors alone, so OpenAI's readers (and TensorFlow) read its
body as they read any GPT-2, and the head is two small files a reader can open by hand. Label i is
score's row i. Hugging Face's id2label holds strings: labels that were whole numbers go there as
their digits, and come back as numbers when every label of a folder is the digits of a whole number.

As transformers reads a config: no id2label means num_labels (2 if absent, which transformers does not
save) labels named LABEL_0, LABEL_1, ... (label_number then takes a whole number i for row i, as
transformers' Trainer does); pad_token_id null means no pad, and each text is pooled at its last
token (classify.pooled_positions), as transformers pools a text alone.
"""
import io
import json
import os

import numpy as np

from plumbing.errors import UserError, read_json
from plumbing.safetensors_reader import load_folder

LABELS_FILE, SCORE_FILE = "classifier.json", "score.npy"
ARCHITECTURE = "GPT2ForSequenceClassification"


def head_files(score, labels, pad_id):
    """{file name: bytes}: the head beside a checkpoint (checkpoint.write_checkpoint's `extra`)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(score, np.float32), allow_pickle=False)
    return {LABELS_FILE: json.dumps({"labels": list(labels), "pad_token_id": pad_id}, indent=1).encode(),
            SCORE_FILE: buffer.getvalue()}


def read_head(folder, n_embd):
    """-> {"score" [K, C] (writable float32), "labels", "pad_id"}, or None when the folder holds a
    language model. A head that does not fit the model (n_embd wide, a row a label) is a UserError."""
    if os.path.exists(os.path.join(folder, LABELS_FILE)):
        head = our_head(folder)
        path = os.path.join(folder, SCORE_FILE)
    elif os.path.exists(os.path.join(folder, "config.json")) and \
            not os.path.exists(os.path.join(folder, "hparams.json")):  # hf_model.is_hf_folder, which imports this
        head = hf_head(folder)
        path = os.path.join(folder, "config.json")
    else:
        return None
    if head is None:
        return None
    if head["score"].shape != (len(head["labels"]), n_embd):
        raise UserError(f"the classifier's head is {head['score'].shape}, its {len(head['labels'])} labels and the "
                        f"model's width {n_embd} make ({len(head['labels'])}, {n_embd})", path=path)
    if len(head["labels"]) < 2 or len(set(head["labels"])) != len(head["labels"]):
        raise UserError("a classifier's labels must be two or more, each once", path=path)
    return head


def our_head(folder):
    path = os.path.join(folder, LABELS_FILE)
    meta = read_json(path)
    labels, pad_id = (meta.get(key) if isinstance(meta, dict) else None for key in ("labels", "pad_token_id"))
    if not isinstance(labels, list) or not all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in labels) \
            or not (pad_id is None or isinstance(pad_id, int)):
        raise UserError('must be {"labels": [strings or whole numbers], "pad_token_id": a whole number or null}',
                        path=path)
    try:
        score = np.load(os.path.join(folder, SCORE_FILE), allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read the classifier's head ({e})", path=os.path.join(folder, SCORE_FILE)) from None
    return {"score": np.array(score, np.float32), "labels": labels, "pad_id": pad_id}


def hf_head(folder):
    """A Hugging Face folder's head, if its config says it is a sequence classifier."""
    path = os.path.join(folder, "config.json")
    config = read_json(path)
    if not isinstance(config, dict) or ARCHITECTURE not in (config.get("architectures") or []):
        return None
    if config.get("problem_type") not in (None, "single_label_classification"):
        raise UserError(f"problem_type {config['problem_type']!r}: this project's classifiers give one label a text "
                        "(single_label_classification)", path=path)
    id2label, pad_id = config.get("id2label"), config.get("pad_token_id")
    if id2label is None:  # transformers' defaults: num_labels 2 is not saved, and LABEL_i names label i
        n = config.get("num_labels", 2)
        id2label = {str(i): f"LABEL_{i}" for i in range(n if isinstance(n, int) and not isinstance(n, bool) else 0)}
    if not isinstance(id2label, dict) or not (pad_id is None or isinstance(pad_id, int)):
        raise UserError(f"a {ARCHITECTURE}'s id2label must be an object and its pad_token_id an id or null", path=path)
    try:
        labels = [id2label[str(i)] for i in range(len(id2label))]
    except KeyError:
        raise UserError("id2label's ids must be 0, 1, ... in order", path=path) from None
    if all(isinstance(x, str) and x.isdigit() and str(int(x)) == x for x in labels):
        labels = [int(x) for x in labels]
    tensors, _ = load_folder(folder)
    if "score.weight" not in tensors:
        raise UserError(f"a {ARCHITECTURE} whose weights have no score.weight", path=folder)
    return {"score": np.array(tensors["score.weight"], np.float32), "labels": labels, "pad_id": pad_id}


def default_labels(labels):
    """transformers' names for labels its config did not name: LABEL_0, LABEL_1, ..."""
    return labels == [f"LABEL_{i}" for i in range(len(labels))]


def label_number(label, labels):
    """A data label's row in a head with these labels, or None if it has none. A head whose labels are
    transformers' defaults (LABEL_0, ...) takes a whole number i for row i too, as transformers' Trainer
    reads an integer label (a dataset's 0 and 1 on a Hub classifier that never named its labels)."""
    if label in labels:
        return labels.index(label)
    if default_labels(labels) and isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(labels):
        return label
    return None


def hf_config(labels, pad_id):
    """config.json's keys that make a GPT2ForSequenceClassification (over GPT2LMHeadModel's)."""
    id2label = {str(i): str(label) for i, label in enumerate(labels)}
    return {"architectures": [ARCHITECTURE], "num_labels": len(labels), "id2label": id2label,
            "label2id": {name: int(i) for i, name in id2label.items()}, "pad_token_id": pad_id,
            "problem_type": "single_label_classification"}
