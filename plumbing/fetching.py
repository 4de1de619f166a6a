"""Fetching one file whole over HTTP, so that no web page, dropped connection or second process
can leave a bad file under its final name.

- A file streams to `<file>.part`, resumes with an HTTP Range request after an interruption
  (within a run, with retries and a growing pause; or on the next run), and gets its final
  name only once it is complete and its caller's check passes: a captive portal's login page
  is never saved as vocab.bpe.
- Processes that download into the same folder take turns on an OS file lock (fcntl), which
  the OS releases if a process dies: one downloads, the others wait and then use its files.
- A failed run (an error, Ctrl-C, SIGTERM) leaves nothing that the next run cannot use: not
  the lock when nothing else is there, not the folders it made; the bytes that arrived stay
  in their .part file, for the next run to resume.

download.py (OpenAI's files) and hub.py (the Hugging Face Hub) fetch their files here.
"""
import contextlib
import os
import re
import sys
import time
from itertools import chain
from urllib.parse import urlsplit

import requests
from tqdm import tqdm

from plumbing.errors import UserError
from plumbing.folders import new_folders, remove_empty

try:
    import fcntl  # POSIX file locks
except ImportError:  # Windows: no lock (see the README)
    fcntl = None

LOCK = ".lock"


class DownloadError(UserError):
    """A model could not be found or fetched; the message is one line for the user."""


class NotFound(DownloadError):
    """The server answered 404."""


class BadFile(Exception):
    """A file's content is not what it should be; str(e) says how, in a few words."""


class WebPage(BadFile):
    """A file that is a web page: what a captive portal or a proxy sends instead of the file."""


def check_not_a_web_page(head):
    """WebPage if a file's first bytes are a web page's."""
    if looks_like_a_web_page(head):
        raise WebPage("it is a web page (HTML or XML), not a model file")


def looks_like_a_web_page(head):
    """The first bytes of a body are HTML or XML: a captive portal's login page, a proxy's
    error, a cloud bucket's <Error><Code>NoSuchKey</Code>. No model file starts like that."""
    start = head.lstrip()[:64].lower()
    return start.startswith((b"<!doctype", b"<html", b"<?xml", b"<head", b"<body", b"<error", b"<!--")) or \
        b"<html" in head[:2048].lower()


# ----------------------------------------------------------------------------
# A folder that one process at a time downloads into
# ----------------------------------------------------------------------------

@contextlib.contextmanager
def downloading_into(folder, model, quiet):
    """Make the folder (and its parents) and hold its lock while a download goes into it. A failure
    (an error, Ctrl-C, SIGTERM) takes away the folders this run created that are left empty;
    taking_turns has taken the lock and the empty .part files away before."""
    made = new_folders(folder)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create this folder ({e.strerror or e})", path=folder) from None
    try:
        with taking_turns(folder, model, quiet):
            yield
    except BaseException:
        remove_empty(made)
        raise


@contextlib.contextmanager
def taking_turns(folder, model, quiet):
    """Hold the folder's lock: one process at a time downloads into it. The OS drops the lock
    when its holder exits, however it exits, so a killed download never blocks the others.
    After a failure, what would resume nothing goes while the lock is held: a .part file that
    holds no bytes, then the lock file if nothing else is left."""
    lock = hold_lock(folder, model, quiet) if fcntl else None
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):  # tidying must not hide the failure
            for name in os.listdir(folder):
                if name.endswith(".part") and os.path.getsize(os.path.join(folder, name)) == 0:
                    os.remove(os.path.join(folder, name))
            if lock and os.listdir(folder) == [LOCK]:
                os.remove(lock.name)  # while we hold it: whoever waits for it sees it gone (hold_lock)
        raise
    finally:
        if lock:
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


def fetch_file(url, path, quiet=False, tries=5, backoff=0.5, check=None, size=None, seen=None, large=False):
    """Download url to path through path + '.part', resuming and retrying. check(part) raises
    BadFile if the content is wrong; size, when known, is the size it must have. The file gets
    its final name only when complete and checked. seen, a dict, gets {file name: SHA-256}
    when the server says it (the Hub's X-Linked-ETag). large: a file that takes minutes (the
    weights), whose download a log without a bar is told of in one line."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, got {tries}")
    part = path + ".part"
    for attempt in range(1, tries + 1):
        try:
            _fetch_into(url, part, quiet, size, seen, large)
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


def _fetch_into(url, part, quiet, size, seen=None, large=False):
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
        if large and not quiet and not sys.stderr.isatty():
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
    if have == 0 and looks_like_a_web_page(first):
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
