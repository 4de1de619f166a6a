"""Fetch OpenAI's GPT-2 checkpoints over HTTP.

Each file is streamed to `<file>.part`, resumed with an HTTP Range request after an
interruption, checked against its Content-Length, then renamed. So a file under its
final name is always complete, and a complete file is never fetched again. After a
download the checkpoint is verified once (checkpoint.py reads and checks it).

Run `python download.py 124M` to fetch a model, `python download.py --verify 124M`
to check every tensor's checksum.
"""
import argparse
import os
import sys
import time

import requests
from tqdm import tqdm

import shapes
from checkpoint import CheckpointError, verify_checkpoint
from errors import UserError, fail

MODEL_SIZES = tuple(shapes.SIZES)
# model.ckpt.meta (the TensorFlow graph) is not fetched: nothing here reads it.
MODEL_FILES = ("checkpoint", "hparams.json", "encoder.json", "vocab.bpe",
               "model.ckpt.index", "model.ckpt.data-00000-of-00001")
DEFAULT_BASE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/models"
BASE_URL_ENV = "GPT2_BASE_URL"
MODELS_DIR_ENV = "GPT2_MODELS_DIR"


class DownloadError(UserError):
    """A model could not be found or fetched; the message is one line for the user."""


# ----------------------------------------------------------------------------
# Where models live
# ----------------------------------------------------------------------------

def default_models_dir():
    """$GPT2_MODELS_DIR, else models/ beside this file (so any working directory works)."""
    return os.environ.get(MODELS_DIR_ENV) or os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


def model_folder(model, models_dir=None):
    """The folder for `model`: one of MODEL_SIZES under models_dir, or an existing folder as given."""
    if model in MODEL_SIZES:
        return os.path.join(models_dir or default_models_dir(), model)
    if os.path.isdir(model):
        return model
    raise DownloadError(f"unknown model {model!r}: choose one of {', '.join(MODEL_SIZES)}, "
                        "or give the path of a checkpoint folder")


# ----------------------------------------------------------------------------
# Downloading
# ----------------------------------------------------------------------------

class _Retryable(Exception):
    """A failure worth another try: a dropped connection, a short body, a 5xx."""


def download_model(model, models_dir=None, base_url=None, quiet=False, tries=5, backoff=0.5):
    """Make sure every file of `model` is on disk; returns its folder.

    Only the four released sizes are downloaded. A path to an existing folder is
    returned as it is. After fetching anything, the checkpoint is verified once."""
    folder = model_folder(model, models_dir)
    if model not in MODEL_SIZES:
        return folder
    base_url = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create this folder ({e.strerror or e})", path=folder) from None
    fetched = False
    for name in MODEL_FILES:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            fetch_file(f"{base_url}/{model}/{name}", path, quiet=quiet, tries=tries, backoff=backoff)
            fetched = True
    if fetched:
        _verify_fresh_download(folder, quiet)
    return folder


def fetch_file(url, path, quiet=False, tries=5, backoff=0.5):
    """Download url to path through path + '.part', resuming and retrying; rename when complete."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, got {tries}")
    part = path + ".part"
    for attempt in range(1, tries + 1):
        try:
            _fetch_into(url, part, quiet)
            os.replace(part, path)
            return
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                _Retryable) as e:
            reason = _one_line(e)
            if attempt < tries:
                time.sleep(backoff * 2 ** (attempt - 1))
    have = os.path.getsize(part) if os.path.exists(part) else 0
    raise DownloadError(f"could not download {url} after {tries} tries ({reason}); "
                        f"{have:,} bytes of it are in {part}: run again to resume")


def _fetch_into(url, part, quiet):
    """One try: append to `part` what the server still has to send."""
    have = os.path.getsize(part) if os.path.exists(part) else 0
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with requests.get(url, headers=headers, stream=True, timeout=(10, 60)) as r:
        if r.status_code == 404:
            raise DownloadError(f"unknown model size or wrong mirror: {url} answered HTTP 404")
        if r.status_code == 416:  # our .part does not fit what the server has: start again
            os.remove(part)
            raise _Retryable("HTTP 416")
        if r.status_code >= 500:
            raise _Retryable(f"HTTP {r.status_code}")
        if r.status_code == 206:
            start, total = _content_range(r.headers.get("Content-Range", ""))
            if start != have:
                raise _Retryable(f"server resumed at byte {start}, not {have}")
            mode = "ab"
        elif r.status_code == 200:
            have, mode = 0, "wb"
            total = int(r.headers["Content-Length"]) if "Content-Length" in r.headers else None
        else:
            raise DownloadError(f"HTTP {r.status_code} for {url}")
        bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=os.path.basename(part[:-5]), disable=quiet or not sys.stderr.isatty())
        try:
            with open(part, mode) as f:
                # small chunks: when a connection breaks, the chunk in flight is lost
                for chunk in r.iter_content(chunk_size=1 << 16):
                    f.write(chunk)
                    bar.update(len(chunk))
        except requests.RequestException:
            raise  # a network error (requests' errors are OSErrors too): retried by the caller
        except OSError as e:
            raise DownloadError(f"cannot write ({e.strerror or e}); what was written is kept here, "
                                "run again to resume", path=part) from None
        finally:
            bar.close()
    size = os.path.getsize(part)
    if total is not None and size != total:
        raise _Retryable(f"got {size:,} of {total:,} bytes")


def _content_range(value):
    """'bytes 100-199/200' -> (100, 200)."""
    try:
        unit, rest = value.split(" ", 1)
        span, total = rest.split("/")
        return int(span.split("-")[0]), int(total)
    except ValueError:
        raise _Retryable(f"bad Content-Range {value!r}") from None


def _one_line(e):
    return " ".join(str(e).split()) or type(e).__name__


def _verify_fresh_download(folder, quiet):
    """A just-downloaded checkpoint must be whole: the file an error names (its .path) is
    removed, so that the next run fetches it again."""
    try:
        verify_checkpoint(folder, quiet=quiet)
    except CheckpointError as e:
        name = os.path.basename(e.path or "")
        if not (e.path and os.path.dirname(e.path) == folder and name in MODEL_FILES):
            raise
        os.remove(e.path)
        raise CheckpointError(f"{e.message} (removed {name}: run again to fetch it again)", path=e.path) from None


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Download a GPT-2 checkpoint from OpenAI (or a mirror), or verify one on disk.",
        epilog=f"Models go to --models-dir, else ${MODELS_DIR_ENV}, else models/ beside this script. "
               f"Files are fetched from --base-url, else ${BASE_URL_ENV}, else {DEFAULT_BASE_URL}.")
    parser.add_argument("model", help=f"one of {', '.join(MODEL_SIZES)}, or a checkpoint folder (with --verify)")
    parser.add_argument("--models-dir", help="folder that holds one subfolder per model size")
    parser.add_argument("--base-url", help="where <size>/<file> is fetched from (a mirror)")
    parser.add_argument("--verify", action="store_true", help="check every tensor's CRC-32C instead of downloading")
    parser.add_argument("--retries", type=int, default=5, help="tries per file before giving up (default 5)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.error = fail
    args = parser.parse_args(argv)
    if args.retries < 1:
        fail("--retries must be at least 1")
    try:
        if args.verify:
            folder = model_folder(args.model, args.models_dir)
            start = time.perf_counter()
            nbytes = verify_checkpoint(folder, quiet=args.quiet)
            seconds = time.perf_counter() - start
            print(f"{folder}: all tensors match their checksums "
                  f"({nbytes / 1e6:,.1f} MB in {seconds:.2f} s, {nbytes / 1e6 / seconds:,.0f} MB/s)")
        else:
            folder = download_model(args.model, args.models_dir, args.base_url, args.quiet, tries=args.retries)
            print(folder)
    except UserError as e:
        fail(str(e))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
