"""Writing what a command makes (a model's folder, a vocabulary, a page): whole or not at all,
and never over someone's work.

Everything is written into a hidden `.writing-*` sibling first and renamed into place only
when complete, so a crash, a full disk or Ctrl-C never leaves half a folder, nor the hidden
one. What is made gets the permissions `open()` and `mkdir` would have given it (tempfile
makes its folders and files private). The models folder (models/ on a fresh clone) is made
when a command writes into it; no other missing folder is.
"""
import contextlib
import os
import shutil
import tempfile

from plumbing.errors import UserError, ctrl_c_waits

MODELS_DIR_ENV = "GPT2_MODELS_DIR"
PROJECT_MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")


def default_models_dir():
    """$GPT2_MODELS_DIR, else models/ in the project's folder (so any working directory works)."""
    return os.environ.get(MODELS_DIR_ENV) or PROJECT_MODELS


def new_folders(folder):
    """The folders that os.makedirs(folder) would create, the deepest first."""
    made, folder = [], os.path.abspath(folder)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        made.append(folder)
        folder = os.path.dirname(folder)
    return made


def remove_empty(made):
    """Take away the folders a run made (new_folders'), the deepest first, while they are empty."""
    for path in made:
        try:
            os.rmdir(path)
        except OSError:
            break  # one that is not empty stops the walk up


@contextlib.contextmanager
def in_models_folder(path, models_dir=None):
    """`with in_models_folder(out, models_dir):` write `out`. Where out goes straight into the models
    folder (models_dir, else default_models_dir(); or the project's own models/) and that folder is
    not there yet, as on a fresh clone, it is made first, as a download makes it; if the block fails,
    what was made goes again while it is empty. Any other missing parent is left to check_new_folder
    to refuse: a mistyped path grows no folders."""
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    homes = {os.path.realpath(models_dir or default_models_dir()), os.path.realpath(PROJECT_MODELS)}
    made = new_folders(parent) if parent in homes else []
    if made:
        try:
            os.makedirs(parent)
        except OSError as e:
            raise UserError(f"cannot create the models folder {parent} ({e.strerror or e})", path=path) from None
    try:
        yield
    except BaseException:
        remove_empty(made)
        raise


def check_new_folder(path, advice="choose a new one", empty_ok=True):
    """A folder a command is about to make: its parent is a writable folder, and `path` does not
    exist yet (or, with empty_ok, is an empty folder). Checked before the work, not after it."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"its parent {parent} is not a folder" if os.path.exists(parent) else
                        f"its parent folder {parent} does not exist", path=path)
    if not os.access(parent, os.W_OK):
        raise UserError(f"its parent folder {parent} is not writable", path=path)
    if os.path.exists(path) and not empty_ok:
        raise UserError(f"already exists: {advice}", path=path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"is a file, not a folder: {advice}", path=path)
    if os.path.exists(path) and os.listdir(path):
        raise UserError(f"already exists and is not an empty folder: {advice}", path=path)


def umask():
    """The process's umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def whole_folder(folder, what="the folder", error=UserError):
    """`with whole_folder(folder) as tmp:` write the files into tmp; when the block ends, tmp
    becomes `folder`. A folder already there (the last save of a run) steps aside only once
    the new one is whole. An OSError is `error` naming the folder; on any interruption (an
    error, a bug, Ctrl-C) the temporary folder is removed. A Ctrl-C or SIGTERM waits while a folder is made
    and named, and while the new one takes the old one's place and the old one goes: one that came
    there would leave a folder no name points to (.writing-*, .replaced-*), or none at `folder`."""
    parent = os.path.dirname(os.path.abspath(folder))
    tmp = None
    try:
        with ctrl_c_waits():
            tmp = tempfile.mkdtemp(dir=parent, prefix=".writing-")
        yield tmp
        with ctrl_c_waits():
            os.chmod(tmp, 0o777 & ~umask())
            if os.path.exists(folder):
                old = tempfile.mkdtemp(dir=parent, prefix=".replaced-")
                os.rename(folder, os.path.join(old, "previous"))
                try:
                    os.rename(tmp, folder)
                except BaseException:
                    os.rename(os.path.join(old, "previous"), folder)  # the last save comes back
                    raise
                finally:
                    shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, folder)
    except OSError as e:
        raise error(f"cannot write {what} ({e.strerror or e})", path=folder) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing left once renamed; else the half-written folder


@contextlib.contextmanager
def whole_file(path, what="the file", error=UserError):
    """`with whole_file(path) as tmp:` write the file at the path tmp; when the block ends, it
    replaces `path`. The same promises as whole_folder, for one file."""
    tmp = None
    try:
        with ctrl_c_waits():
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".writing-")
            os.close(fd)
        yield tmp
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except OSError as e:
        raise error(f"cannot write {what} ({e.strerror or e})", path=path) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def write_page(path, text):
    """A page of HTML (or any text) written to path whole, as UTF-8: -> its size in bytes."""
    with whole_file(path, "the page") as tmp:  # never half a page
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return os.path.getsize(path)
