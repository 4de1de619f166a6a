"""Fetch OpenAI's GPT-2 checkpoints over HTTP, so that no web page, proxy or second process
can break a models folder.

- Each file streams to `<file>.part`, resumes with an HTTP Range request after an
  interruption, and gets its final name only after its content is checked (model_files.py):
  a captive portal's login page is never saved as vocab.bpe.
- The files come in an order that lets each explain the next: hparams.json, then the index,
  whose tensors give the data file's size before its first byte arrives.
- Every run checks a released size's files again (milliseconds): a bad one (from a crash,
  a copy by hand, an older version of this program) is fetched again, never an error that
  repeats forever. A folder the user names by path is only checked, never changed.
- Processes that want the same model in the same folder take turns on an OS file lock,
  which the OS releases if a process dies: one downloads, the others wait and use it.

Run `python download.py 124M` to fetch a model, `python download.py --verify 124M`
to check every tensor's checksum.
"""
import argparse
import contextlib
import os
import re
import sys
import time

import requests
from tqdm import tqdm

from plumbing import hf_model, model_files, safetensors_reader, shapes
from plumbing.checkpoint import DATA_SUFFIX, CheckpointError, checkpoint_prefix, verify_checkpoint
from plumbing.errors import UserError, fail
from plumbing.model_files import DATA_FILE, MODEL_FILES, BadFile, WebPage

try:
    import fcntl  # POSIX file locks
except ImportError:  # Windows: no lock (see the README)
    fcntl = None

MODEL_SIZES = tuple(shapes.SIZES)
DEFAULT_BASE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/models"
BASE_URL_ENV = "GPT2_BASE_URL"
MODELS_DIR_ENV = "GPT2_MODELS_DIR"
LOCK = ".lock"


class DownloadError(UserError):
    """A model could not be found or fetched; the message is one line for the user."""


class NotFound(DownloadError):
    """The server answered 404."""


# ----------------------------------------------------------------------------
# Where models live
# ----------------------------------------------------------------------------

def default_models_dir():
    """$GPT2_MODELS_DIR, else models/ beside this file (so any working directory works)."""
    return os.environ.get(MODELS_DIR_ENV) or os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


def model_folder(model, models_dir=None):
    """The folder for `model`: one of MODEL_SIZES under models_dir, or an existing folder."""
    if model in MODEL_SIZES:
        return os.path.join(models_dir or default_models_dir(), model)
    if os.path.isdir(model):
        return model
    if os.path.exists(model):
        raise DownloadError("is not a folder: --model takes a model folder (hparams.json and model.ckpt.*, or "
                            "config.json and model.safetensors), a size, or hf:owner/name", path=model)
    raise DownloadError(f"unknown model {model!r}: choose one of {', '.join(MODEL_SIZES)}, "
                        "hf:owner/name from the Hugging Face Hub, or give the path of a model folder")


# ----------------------------------------------------------------------------
# A models folder that heals itself
# ----------------------------------------------------------------------------

def download_model(model, models_dir=None, base_url=None, quiet=False, tries=5, backoff=0.5):
    """Make sure every file of `model` is on disk and good; returns its folder.

    A released size is downloaded (or mended) as needed. A path to an existing folder is
    checked and returned: a bad file in it is an error naming it, and nothing is changed.
    (hf:owner/name is hub.py's, on this file's downloader: loading.fetch_model chooses.)"""
    folder = model_folder(model, models_dir)
    if model not in MODEL_SIZES:
        if not hf_model.is_hf_folder(folder):  # a Hugging Face folder is checked as it is read
            check_user_folder(folder)
        return folder
    if not bad_files(folder, model) and model_files.is_verified(folder):
        return folder  # the usual case: everything checked in milliseconds, nothing to fetch
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create this folder ({e.strerror or e})", path=folder) from None
    with taking_turns(folder, model, quiet):
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
                       size=model_files.expected_size(name, model, context))
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


@contextlib.contextmanager
def taking_turns(folder, model, quiet):
    """Hold the folder's lock: one process at a time downloads into it. The OS drops the lock
    when its holder exits, however it exits, so a killed download never blocks the others."""
    if fcntl is None:
        yield
        return
    with open(os.path.join(folder, LOCK), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                print(f"waiting for another download of {model} in {folder}", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------
# Downloading one file
# ----------------------------------------------------------------------------

class _Retryable(Exception):
    """A failure worth another try: a dropped connection, a short body, a 5xx."""


def web_page_sent(name, url):
    return DownloadError(f"the server sent a web page instead of {name}: a captive portal or proxy? ({url}); "
                         "nothing was kept under the final name")


def fetch_file(url, path, quiet=False, tries=5, backoff=0.5, check=None, size=None, seen=None):
    """Download url to path through path + '.part', resuming and retrying. check(part) raises
    BadFile if the content is wrong; size, when known, is the size it must have. The file gets
    its final name only when complete and checked. seen, a dict, gets {file name: SHA-256}
    when the server says it (the Hub's X-Linked-ETag)."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, got {tries}")
    part = path + ".part"
    name = os.path.basename(path)
    for attempt in range(1, tries + 1):
        try:
            _fetch_into(url, part, quiet, size, seen)
            break
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                _Retryable) as e:
            reason = _one_line(e)
            if attempt < tries:
                time.sleep(backoff * 2 ** (attempt - 1))
    else:
        have = os.path.getsize(part) if os.path.exists(part) else 0
        raise DownloadError(f"could not download {url} after {tries} tries ({reason}); "
                            f"{have:,} bytes of it are in {part}: run again to resume")
    try:
        if check:
            check(part)
    except WebPage:
        os.remove(part)
        raise web_page_sent(name, url) from None
    except BadFile as e:
        os.remove(part)
        raise DownloadError(f"{url} sent a bad {name}: {e}; nothing was kept under the final name") from None
    os.replace(part, path)


def _fetch_into(url, part, quiet, size, seen=None):
    """One try: append to `part` what the server still has to send."""
    have = os.path.getsize(part) if os.path.exists(part) else 0
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    name = os.path.basename(part[:-len(".part")])
    with requests.get(url, headers=headers, stream=True, timeout=(10, 60)) as r:
        if r.status_code == 404:
            raise NotFound(f"unknown model size or wrong mirror: {url} answered HTTP 404")
        if seen is not None:
            for response in r.history + [r]:  # the Hub gives it on the redirect to its CDN
                etag = response.headers.get("X-Linked-ETag", "").strip('"')
                if re.fullmatch(r"[0-9a-f]{64}", etag):
                    seen[name] = etag
        if r.status_code == 416:  # our .part does not fit what the server has: start again
            os.remove(part)
            raise _Retryable("HTTP 416")
        if r.status_code >= 500:
            raise _Retryable(f"HTTP {r.status_code}")
        if r.status_code == 206:
            start, total = _content_range(r.headers.get("Content-Range", ""))
            if start != have:  # not the part we asked for: start this file again, cleanly
                os.remove(part)
                raise _Retryable(f"server resumed at byte {start}, not {have}")
            mode = "ab"
        elif r.status_code == 200:  # the whole file (a server that ignores Range sends it all again)
            have, mode = 0, "wb"
            total = int(r.headers["Content-Length"]) if "Content-Length" in r.headers else None
        else:
            raise DownloadError(f"HTTP {r.status_code} for {url}")
        chunks = r.iter_content(chunk_size=1 << 16)  # small: when a connection breaks, the chunk in flight is lost
        first = next(chunks, b"")
        if have == 0 and model_files.looks_like_a_web_page(first):
            raise web_page_sent(name, url)
        if size is not None and total is not None and total != size:
            raise DownloadError(f"{url} is {total:,} bytes, but {name} must be {size:,}: the wrong file, or a "
                                "mirror's error; nothing was kept under the final name")
        total = size if total is None else total  # no Content-Length: the size we know, if we know it
        if not quiet and not sys.stderr.isatty() and (name == DATA_FILE or name.endswith(".safetensors")):
            # a log or a notebook gets no bar: one line for the weights, the download that takes minutes
            size_text = f"{total:,} bytes" if total is not None else "size unknown"
            print(f"downloading {name} ({size_text}{f', from byte {have:,}' if have else ''}) from {url} into "
                  f"{os.path.dirname(os.path.abspath(part))}", file=sys.stderr)
        bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=name, disable=quiet or not sys.stderr.isatty())
        try:
            with open(part, mode) as f:
                f.write(first)
                bar.update(len(first))
                for chunk in chunks:
                    f.write(chunk)
                    bar.update(len(chunk))
        except requests.RequestException:
            raise  # a network error (requests' errors are OSErrors too): retried by the caller
        except OSError as e:
            raise DownloadError(f"cannot write ({e.strerror or e}); what was written is kept here, "
                                "run again to resume", path=part) from None
        finally:
            bar.close()
    got = os.path.getsize(part)
    if total is not None and got != total:
        if got > total:  # more than the file can hold: nothing in it is to be trusted
            os.remove(part)
        raise _Retryable(f"got {got:,} of {total:,} bytes")


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
        if args.verify and hf_model.is_hf_folder(model_folder(args.model, args.models_dir)):
            files = safetensors_reader.verify_folder(model_folder(args.model, args.models_dir))
            print(f"{model_folder(args.model, args.models_dir)}: every tensor's offsets and size fit its file "
                  f"({', '.join(files)}); safetensors files hold no checksums")
        elif args.verify:
            folder = model_folder(args.model, args.models_dir)
            start = time.perf_counter()
            nbytes = verify_checkpoint(folder, quiet=args.quiet)
            seconds = time.perf_counter() - start
            print(f"{folder}: all tensors match their checksums "
                  f"({nbytes / 1e6:,.1f} MB in {seconds:.2f} s, {nbytes / 1e6 / seconds:,.0f} MB/s)")
        else:
            if args.model.startswith("hf:"):  # hub.py downloads on this file's downloader, so not from here
                raise UserError(f"{args.model} is a Hub model: python gpt2_numpy.py --model {args.model} \"prompt\" "
                                "downloads it on first use")
            print(download_model(args.model, args.models_dir, args.base_url, args.quiet, tries=args.retries))
    except UserError as e:
        fail(str(e))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
