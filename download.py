"""OpenAI's GPT-2 checkpoints: the four released sizes, where they are served, and a models
folder that heals itself.

- The files come in an order that lets each explain the next: hparams.json, then the index,
  whose tensors give the data file's size before its first byte arrives.
- Each file is fetched whole (plumbing/fetching.py: resumed, retried, locked, never under its
  final name before its content is checked against what model_files.py says a good one is):
  a captive portal's login page is never saved as vocab.bpe.
- Every run checks a released size's files again (milliseconds): a bad one (from a crash,
  a copy by hand, an older version of this program) is fetched again, never an error that
  repeats forever. A folder the user names by path is only checked, never changed.
- A failed download leaves nothing this run made that the next cannot use: not the lock, not
  the folders it created. A network failure keeps what arrived, for the next run to resume.

Run `python download.py 124M` to fetch a model, `python download.py --verify 124M`
to check every tensor's checksum (the command line: interface/download_cli.py).
"""
if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("download_cli")  # the command line (a size to fetch, or --verify)

import os
import shlex
import sys
import time

from plumbing import hf_model, model_files, safetensors_reader, shapes
from plumbing.checkpoint import DATA_SUFFIX, CheckpointError, checkpoint_prefix, verify_checkpoint
from plumbing.fetching import BadFile, DownloadError, downloading_into, fetch_file
from plumbing.folders import default_models_dir
from plumbing.model_files import DATA_FILE, MODEL_FILES
from plumbing.shapes import TOKENIZER_FILES
from plumbing.weights import check_not_only_an_adapter

MODEL_SIZES = tuple(shapes.SIZES)
DEFAULT_BASE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/models"
BASE_URL_ENV = "GPT2_BASE_URL"


# ----------------------------------------------------------------------------
# Where models live
# ----------------------------------------------------------------------------

def model_folder(model, models_dir=None):
    """The folder for `model`: one of MODEL_SIZES under models_dir, or an existing folder."""
    if model in MODEL_SIZES:
        return os.path.join(models_dir or default_models_dir(), model)
    if os.path.isdir(model):
        check_not_only_an_adapter(model)
        return model
    if os.path.exists(model):
        raise DownloadError("is not a folder: --model takes a model folder (hparams.json and model.ckpt.*, or "
                            "config.json and model.safetensors), a GGUF file (FILE.gguf), a size, or hf:owner/name",
                            path=model)
    if looks_like_a_path(model):
        raise DownloadError(f"no such folder: {model} (and as a name it is an unknown model: the sizes are "
                            f"{', '.join(MODEL_SIZES)}; a Hub model is hf:owner/name; a GGUF file ends in .gguf)")
    raise DownloadError(f"unknown model {model!r}: choose one of {', '.join(MODEL_SIZES)}, "
                        "hf:owner/name from the Hugging Face Hub, or give the path of a model folder or a GGUF file")


def looks_like_a_path(model):
    """A value with a folder separator, or one that starts with '.', names a folder (hf:owner/name
    names a Hub model)."""
    return not model.startswith("hf:") and (
        model.startswith(".") or any(sep and sep in model for sep in ("/", os.sep, os.altsep)))


# ----------------------------------------------------------------------------
# A models folder that heals itself
# ----------------------------------------------------------------------------

def download_model(model, models_dir=None, base_url=None, quiet=False, tries=5, backoff=0.5):
    """Make sure every file of `model` is on disk and good; returns its folder.

    A released size is downloaded (or mended) as needed. A path to an existing folder is
    checked and returned: a bad file in it is an error naming it, and nothing is changed.
    (hf:owner/name is plumbing/hub.py's: interface/loading.fetch_model chooses.)"""
    folder = model_folder(model, models_dir)
    if model not in MODEL_SIZES:
        if not hf_model.is_hf_folder(folder):  # a Hugging Face folder is checked as it is read
            check_user_folder(folder)
        return folder
    if not bad_files(folder, model) and model_files.is_verified(folder):
        return folder  # the usual case: everything checked in milliseconds, nothing to fetch
    with downloading_into(folder, model, quiet):
        mend(folder, model, base_url, quiet, tries, backoff)
    return folder


def bad_files(folder, model):
    """{name: why} for each of a released size's files that is missing or bad."""
    bad, context = {}, {}
    for name in MODEL_FILES:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            bad[name] = "missing"
            continue
        try:
            model_files.check_file(name, path, model, context)
        except BadFile as e:
            bad[name] = str(e)
    return bad


def mend(folder, model, base_url, quiet, tries, backoff):
    """Fetch each missing or bad file (under the lock), then check the data's CRCs once."""
    base_url = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
    for attempt in (1, 2):  # a second time only when a data file that was already here fails its CRCs
        context, fetched = {}, set()
        for name in MODEL_FILES:
            path = os.path.join(folder, name)
            if os.path.exists(path):
                try:
                    model_files.check_file(name, path, model, context)
                    continue
                except BadFile as e:
                    if not quiet:
                        print(f"{path}: {e}; fetching it again", file=sys.stderr)
                    os.remove(path)
            fetch_file(f"{base_url}/{model}/{name}", path, quiet=quiet, tries=tries, backoff=backoff,
                       check=lambda part, name=name: model_files.check_file(name, part, model, context),
                       size=model_files.expected_size(name, model, context), large=name == DATA_FILE)
            fetched.add(name)
        if model_files.is_verified(folder):
            return
        try:
            model_files.verify_and_mark(folder, quiet=quiet)
            return
        except CheckpointError as e:
            name = os.path.basename(e.path or "")
            if name not in MODEL_FILES:
                raise
            os.remove(e.path)
            if name in fetched or attempt == 2:  # just downloaded and still wrong: the mirror's copy is bad
                raise CheckpointError(f"{e.message} (removed {name}: run again to fetch it again)",
                                      path=e.path) from None
            if not quiet:
                print(f"{e.path}: {e.message}; fetching it again", file=sys.stderr)


def check_user_folder(folder):
    """A folder the user named: each file must be good, or it is an error that says which and
    what to do. Its data is not CRC-checked here (`python download.py --verify FOLDER` does)."""
    prefix = checkpoint_prefix(folder)  # the `checkpoint` file may name another prefix than model.ckpt
    files = [("checkpoint", os.path.join(folder, "checkpoint")), ("hparams.json", os.path.join(folder, "hparams.json")),
             ("encoder.json", os.path.join(folder, "encoder.json")), ("vocab.bpe", os.path.join(folder, "vocab.bpe")),
             ("model.ckpt.index", prefix + ".index"), (DATA_FILE, prefix + DATA_SUFFIX)]
    tokenizer = tokenizer_files(folder)
    if tokenizer and not any(os.path.exists(path) for name, path in files if name not in TOKENIZER_FILES):
        raise DownloadError(f"a tokenizer folder ({' and '.join(tokenizer)}, no weights), not a model: --model "
                            "needs a model folder (hparams.json and model.ckpt.*, or config.json and "
                            "model.safetensors); train.py --from-scratch --tokenizer takes a tokenizer folder",
                            path=folder)
    context = {}
    for name, path in files:
        if not os.path.exists(path):
            if name == "checkpoint":
                continue  # optional: the prefix is then model.ckpt
            raise DownloadError(f"{os.path.basename(path)} is missing from this folder: a model folder holds "
                                f"{', '.join(MODEL_FILES)}", path=folder)
        try:
            if name == "checkpoint":  # any prefix will do here; only a web page is wrong
                with open(path, "rb") as f:
                    model_files.check_not_a_web_page(f.read(4096))
            else:
                model_files.check_file(name, path, None, context)
        except BadFile as e:
            raise DownloadError(f"{e}: replace it with a good copy (for a released size, delete it and run "
                                "python download.py SIZE); nothing in this folder was changed", path=path) from None


def tokenizer_files(folder):
    """The names of the tokenizer's two files in this folder (OpenAI's, or Hugging Face's), or None."""
    for names in (tuple(TOKENIZER_FILES), tuple(TOKENIZER_FILES.values())):
        if all(os.path.exists(os.path.join(folder, name)) for name in names):
            return names
    return None


# ----------------------------------------------------------------------------
# Checking a model on disk again
# ----------------------------------------------------------------------------

def verify(model, models_dir, quiet):
    """Check a model on disk again, all that its format lets us check. -> the line that says so"""
    folder = model_folder(model, models_dir)
    if hf_model.is_hf_folder(folder):
        files = safetensors_reader.verify_folder(folder)
        return (f"{folder}: every tensor's offsets and size fit its file ({', '.join(files)}); "
                "safetensors files hold no checksums")
    if model in MODEL_SIZES:
        check_downloaded(model, folder, models_dir)
    start = time.perf_counter()
    nbytes = verify_checkpoint(folder, quiet=quiet)
    seconds = time.perf_counter() - start
    return (f"{folder}: all tensors match their checksums "
            f"({nbytes / 1e6:,.1f} MB in {seconds:.2f} s, {nbytes / 1e6 / seconds:,.0f} MB/s)")


def check_downloaded(model, folder, models_dir):
    """A released size must be downloaded before it is verified: if not, say how."""
    missing = [name for name in MODEL_FILES if not os.path.exists(os.path.join(folder, name))]
    if missing:
        what = "no such folder" if not os.path.isdir(folder) else f"{missing[0]} is missing from"
        flag = f" --models-dir {shlex.quote(models_dir)}" if models_dir else ""
        raise DownloadError(f"{model} is not downloaded ({what} {folder}): python download.py {model}{flag} "
                            "downloads it")

