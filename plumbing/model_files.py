"""What a GPT-2 model folder holds, and how each file is known to be good.

A file that only looks complete (an HTML login page saved as vocab.bpe, an error
message saved as `checkpoint`, half a data file after a full disk) must never pass
for the real one. So each file has a check of its content, not just of its length:

    checkpoint        a small text file naming the checkpoint prefix, model.ckpt
    hparams.json      JSON with n_vocab, n_ctx, n_embd, n_head, n_layer (a released size: exactly its own)
    encoder.json      the SHA-256 that every GPT-2 size shares (tiktoken pins the same)
    vocab.bpe         likewise
    model.ckpt.index  parses, every block's CRC right, exactly the tensors hparams imply
    model.ckpt.data-00000-of-00001
                      exactly the size the index implies (a released size: 4 bytes a parameter);
                      every tensor's CRC-32C once, then a marker (.verified) remembers it,
                      tied to the file's size and modification time

download.py checks a file before giving it its final name, and checks a released size's
files again on every run (milliseconds; the data file only by its size and the marker).
"""
import hashlib
import json
import math
import os

from plumbing import shapes
from plumbing.checkpoint import CheckpointError, DATA_SUFFIX, data_size, read_gpt2_index, verify_checkpoint
from plumbing.fetching import BadFile, check_not_a_web_page

DATA_FILE = "model.ckpt" + DATA_SUFFIX
# In the order they are fetched: hparams.json before the index (which it explains), the
# index before the data file (whose size it gives). model.ckpt.meta is not fetched: nothing reads it.
MODEL_FILES = ("checkpoint", "hparams.json", "encoder.json", "vocab.bpe", "model.ckpt.index", DATA_FILE)
VOCABULARY = {  # the four sizes share one vocabulary: (size in bytes, SHA-256)
    "encoder.json": (1_042_301, "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "vocab.bpe": (456_318, "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
}
MARKER = ".verified"


def expected_size(name, model, context):
    """The size a file must have when it is known before it arrives, else None."""
    if name in VOCABULARY and model is not None:  # a folder of the user's may have its own vocabulary
        return VOCABULARY[name][0]
    if name == DATA_FILE and "data_size" in context:
        return context["data_size"]
    return None


def check_file(name, path, model, context):
    """Raise BadFile unless the file at path is a good `name` for `model` (a released size,
    or None for a folder of the user's). context carries what earlier files told us:
    the hparams, then the data file's size."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise BadFile(e.strerror) from None
    check_not_a_web_page(head)
    want = expected_size(name, model, context)
    if want is not None and size != want:
        raise BadFile(f"it has {size:,} bytes, not {want:,}")
    if name == "checkpoint":
        check_checkpoint_file(head if size <= 4096 else b"")
    elif name == "hparams.json":
        context["hparams"] = check_hparams(path, model)
    elif name in VOCABULARY:
        if model is not None and sha256(path) != VOCABULARY[name][1]:
            raise BadFile("its SHA-256 is not that of GPT-2's vocabulary")
    elif name == "model.ckpt.index":
        if "hparams" not in context:
            raise BadFile("it cannot be checked without a good hparams.json")
        try:
            context["data_size"] = data_size(read_gpt2_index(path, context["hparams"]))
        except CheckpointError as e:
            raise BadFile(e.message) from None
        if model is not None and context["data_size"] != 4 * parameter_count(shapes.hparams(model)):
            raise BadFile("its tensors do not add up to 4 bytes for each of the model's parameters")


def parameter_count(hp):
    """The numbers a GPT-2 of these hparams holds: its tensors' shapes, multiplied out and added up."""
    return sum(math.prod(shape) for shape in shapes.tensor_shapes(hp).values())


def check_checkpoint_file(text):
    """`checkpoint`: model_checkpoint_path: "model.ckpt" (and perhaps more lines like it)."""
    try:
        lines = text.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise BadFile("it is not text") from None
    paths = [line.split(":", 1)[1].strip().strip('"') for line in lines if line.startswith("model_checkpoint_path:")]
    if len(paths) != 1 or os.path.basename(paths[0]) != "model.ckpt":
        raise BadFile('it does not say model_checkpoint_path: "model.ckpt"')


def check_hparams(path, model):
    try:
        with open(path, encoding="utf-8") as f:
            hp = json.load(f)
    except (ValueError, UnicodeDecodeError):
        raise BadFile("it is not valid JSON") from None
    problem = shapes.hparams_problem(hp)
    if problem:
        raise BadFile(f"it {problem}")
    hp = {k: hp[k] for k in shapes.HPARAM_KEYS}
    if model is not None and hp != shapes.hparams(model):
        raise BadFile(f"it does not hold {model}'s hyperparameters")
    return hp


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ----------------------------------------------------------------------------
# The data file's CRCs: checked once, then remembered
# ----------------------------------------------------------------------------

def stamp(path):
    st = os.stat(path)
    return {"file": os.path.basename(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_verified(folder):
    """The marker says the data file, as it is now (size and modification time), was verified."""
    try:
        with open(os.path.join(folder, MARKER), encoding="utf-8") as f:
            return json.load(f) == stamp(os.path.join(folder, DATA_FILE))
    except (OSError, ValueError):
        return False


def verify_and_mark(folder, quiet=True):
    """Check every tensor's CRC-32C (CheckpointError if one is wrong), then write the marker."""
    verify_checkpoint(folder, quiet=quiet)
    tmp = os.path.join(folder, MARKER + ".part")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(stamp(os.path.join(folder, DATA_FILE)), f)
    os.replace(tmp, os.path.join(folder, MARKER))
