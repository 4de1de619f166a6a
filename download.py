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
- A model that is not there (HTTP 404) leaves nothing this run made: not the lock, not the
  folders it created. A network failure keeps what arrived, for the next run to resume.

Run `python download.py 124M` to fetch a model, `python download.py --verify 124M`
to check every tensor's checksum.
"""
import argparse
import contextlib
import os
import re
import shlex
import sys
import time
from itertools import chain
from urllib.parse import urlsplit

import requests
from tqdm import tqdm

from plumbing import hf_model, model_files, safetensors_reader, shapes
from plumbing.checkpoint import DATA_SUFFIX, CheckpointError, checkpoint_prefix, verify_checkpoint
from plumbing.errors import UserError, exit_status, fail
from plumbing.model_files import DATA_FILE, MODEL_FILES, BadFile, WebPage
from plumbing.shapes import TOKENIZER_FILES

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
    if looks_like_a_path(model):
        raise DownloadError(f"no such folder: {model} (and as a name it is an unknown model: the sizes are "
                            f"{', '.join(MODEL_SIZES)}; a Hub model is hf:owner/name)")
    raise DownloadError(f"unknown model {model!r}: choose one of {', '.join(MODEL_SIZES)}, "
                        "hf:owner/name from the Hugging Face Hub, or give the path of a model folder")


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
    (hf:owner/name is hub.py's, on this file's downloader: loading.fetch_model chooses.)"""
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


@contextlib.contextmanager
def downloading_into(folder, model, quiet, leaves_nothing=(NotFound,)):
    """Make the folder (and its parents) and hold its lock while a download goes into it. A
    failure in leaves_nothing (by default a model that is not there, HTTP 404: NotFound) leaves
    nothing this run made where nothing was saved: not the lock, and not a folder it created.
    Any other failure keeps the folder, where the next run resumes."""
    made = new_folders(folder)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create this folder ({e.strerror or e})", path=folder) from None
    try:
        with taking_turns(folder, model, quiet, leaves_nothing):
            yield
    except leaves_nothing:
        for path in made:  # the deepest first; one that is not empty stops the walk up
            try:
                os.rmdir(path)
            except OSError:
                break
        raise


def new_folders(folder):
    """The folders that os.makedirs(folder) would create, the deepest first."""
    made, folder = [], os.path.abspath(folder)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        made.append(folder)
        folder = os.path.dirname(folder)
    return made


@contextlib.contextmanager
def taking_turns(folder, model, quiet, leaves_nothing=(NotFound,)):
    """Hold the folder's lock: one process at a time downloads into it. The OS drops the lock
    when its holder exits, however it exits, so a killed download never blocks the others.
    A failure in leaves_nothing takes the lock file away if nothing else is left."""
    if fcntl is None:
        yield
        return
    lock = hold_lock(folder, model, quiet)
    try:
        yield
    except leaves_nothing:
        if os.listdir(folder) == [LOCK]:
            os.remove(lock.name)  # while we hold it: whoever waits for it sees it gone (hold_lock)
        raise
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def hold_lock(folder, model, quiet):
    """The folder's lock file, open and locked by this process. A lock file that was removed
    while we waited for it (a failed download's cleanup) locks nothing: then again, on a new one."""
    path, said = os.path.join(folder, LOCK), False
    while True:
        try:
            lock = open(path, "a")
        except FileNotFoundError:  # the folder went with the lock: make it again
            os.makedirs(folder, exist_ok=True)
            continue
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not quiet and not said:
                    print(f"waiting for another download of {model} in {folder}", file=sys.stderr)
                said = True
                fcntl.flock(lock, fcntl.LOCK_EX)
            if is_the_file_at(lock, path):
                return lock
        except BaseException:
            lock.close()
            raise
        lock.close()


def is_the_file_at(f, path):
    """The open file f is still the one that path names (not removed, nor replaced by another)."""
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


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
        raise gave_up(url, part, tries, reason)
    check_and_rename(url, part, path, check)


def gave_up(url, part, tries, reason):
    """The error after the last try: what is kept for the next run, or where nothing was saved."""
    have = os.path.getsize(part) if os.path.exists(part) else 0
    after = f"after {tries} {'try' if tries == 1 else 'tries'} ({reason})"
    if have:
        return DownloadError(f"could not download {url} {after}; {have:,} bytes of it are in {part}: "
                             "run again to resume")
    return DownloadError(f"could not download {url} {after}: is {urlsplit(url).netloc} reachable? Nothing was "
                         f"saved in {os.path.dirname(os.path.abspath(part))}")


def check_and_rename(url, part, path, check):
    """The whole file gets its final name once check(part) passes; a bad one is not kept."""
    name = os.path.basename(path)
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
    name = os.path.basename(part[:-len(".part")])
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with requests.get(url, headers=headers, stream=True, timeout=(10, 60)) as r:
        if r.status_code == 404:
            raise NotFound(f"unknown model size or wrong mirror: {url} answered HTTP 404")
        if seen is not None:
            _note_sha256(r, name, seen)
        have, mode, total = _what_is_sent(r, url, part, have)
        chunks = r.iter_content(chunk_size=1 << 16)  # small: when a connection breaks, the chunk in flight is lost
        first = next(chunks, b"")
        total = _check_what_arrives(first, have, total, size, name, url)
        if not quiet and not sys.stderr.isatty() and (name == DATA_FILE or name.endswith(".safetensors")):
            _say_what_downloads(name, total, have, url, part)
        bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024, desc=name,
                   disable=quiet or not sys.stderr.isatty())
        _write_body(part, mode, chain([first], chunks), bar)
    got = os.path.getsize(part)
    if total is not None and got != total:
        if got > total:  # more than the file can hold: nothing in it is to be trusted
            os.remove(part)
        raise _Retryable(f"got {got:,} of {total:,} bytes")


def _note_sha256(r, name, seen):
    """seen[name] = the SHA-256 the server gives in X-Linked-ETag, if it gives one."""
    for response in r.history + [r]:  # the Hub gives it on the redirect to its CDN
        etag = response.headers.get("X-Linked-ETag", "").strip('"')
        if re.fullmatch(r"[0-9a-f]{64}", etag):
            seen[name] = etag


def _what_is_sent(r, url, part, have):
    """From the status: -> (bytes of `part` it continues, the mode to open it in, the file's total
    size or None). A resume that does not fit what we have starts the file again."""
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
        return have, "ab", total
    if r.status_code == 200:  # the whole file (a server that ignores Range sends it all again)
        return 0, "wb", int(r.headers["Content-Length"]) if "Content-Length" in r.headers else None
    raise DownloadError(f"HTTP {r.status_code} for {url}")


def _check_what_arrives(first, have, total, size, name, url):
    """No web page, and the size the file must have -> the total to expect (the known size when
    the server gives none)."""
    if have == 0 and model_files.looks_like_a_web_page(first):
        raise web_page_sent(name, url)
    if size is not None and total is not None and total != size:
        raise DownloadError(f"{url} is {total:,} bytes, but {name} must be {size:,}: the wrong file, or a "
                            "mirror's error; nothing was kept under the final name")
    return size if total is None else total


def _say_what_downloads(name, total, have, url, part):
    """A log or a notebook gets no bar: one line for the weights, the download that takes minutes."""
    size_text = f"{total:,} bytes" if total is not None else "size unknown"
    print(f"downloading {name} ({size_text}{f', from byte {have:,}' if have else ''}) from {url} into "
          f"{os.path.dirname(os.path.abspath(part))}", file=sys.stderr)


def _write_body(part, mode, chunks, bar):
    """Write the body's chunks to `part` as they arrive, moving the bar."""
    try:
        with open(part, mode) as f:
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


def _content_range(value):
    """'bytes 100-199/200' -> (100, 200)."""
    try:
        unit, rest = value.split(" ", 1)
        span, total = rest.split("/")
        return int(span.split("-")[0]), int(total)
    except ValueError:
        raise _Retryable(f"bad Content-Range {value!r}") from None


def _one_line(e):
    """Why a try failed, in a few words: the OS's reason ("Connection refused") when there is
    one, not the nest of reprs that urllib3 wraps it in."""
    text = " ".join(str(e).split()) or type(e).__name__
    reason = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    return reason.group(1).strip() if reason else text


# ----------------------------------------------------------------------------
# Command line
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
    return exit_status(lambda: run(args))


def run(args):
    """--verify, or the download."""
    if args.verify:
        print(verify(args.model, args.models_dir, args.quiet))
    elif args.model.startswith("hf:"):  # hub.py downloads on this file's downloader, so not from here
        raise UserError(f"{args.model} is a Hub model: python gpt2_numpy.py --model {args.model} \"prompt\" "
                        "downloads it on first use")
    else:
        print(download_model(args.model, args.models_dir, args.base_url, args.quiet, tries=args.retries))


if __name__ == "__main__":
    sys.exit(main())
