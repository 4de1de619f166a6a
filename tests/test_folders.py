"""plumbing/folders.py: what a command writes is whole or absent, with the permissions a user expects."""
import os

import pytest

from plumbing.errors import UserError
from plumbing import folders
from plumbing.folders import check_new_folder, in_models_folder, whole_file, whole_folder


def test_an_interrupted_write_leaves_nothing_behind(tmp_path):
    """Ctrl-C (KeyboardInterrupt) in the middle of a save: neither half a folder nor the hidden one."""
    with pytest.raises(KeyboardInterrupt):
        with whole_folder(str(tmp_path / "out")) as tmp:
            open(os.path.join(tmp, "half"), "w").close()
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_an_interrupted_resave_keeps_the_last_save(tmp_path):
    out = tmp_path / "out"
    with whole_folder(str(out)) as tmp:
        open(os.path.join(tmp, "first"), "w").close()
    with pytest.raises(KeyboardInterrupt):
        with whole_folder(str(out)) as tmp:
            open(os.path.join(tmp, "second"), "w").close()
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["out"] and os.listdir(out) == ["first"]
    with whole_folder(str(out)) as tmp:
        open(os.path.join(tmp, "second"), "w").close()
    assert os.listdir(tmp_path) == ["out"] and os.listdir(out) == ["second"]


@pytest.mark.parametrize("moment", ["making .writing-", "removing the last save"])
def test_a_sigterm_at_any_moment_of_a_resave_leaves_one_whole_folder_and_nothing_beside_it(tmp_path, monkeypatch,
                                                                                          moment):
    """A real SIGTERM (exit_status's handler: Terminated) where a save's folders are made or swapped, where a
    signal between two lines once left a .replaced-* folder beside a training run's (train.py's test of
    SIGTERM in the loop failed now and then): it waits until the folder is whole, then stops the save."""
    import signal
    import shutil
    import tempfile

    from plumbing.errors import Terminated, raise_terminated

    out = tmp_path / "out"
    with whole_folder(str(out)) as tmp:
        open(os.path.join(tmp, "first"), "w").close()
    mkdtemp, rmtree = tempfile.mkdtemp, shutil.rmtree

    def signalled(fn, when, before):  # SIGTERM as fn begins, or as it returns (the folder made, not yet named)
        def at_that_moment(*args, **kw):
            if before and when(args, kw):
                signal.raise_signal(signal.SIGTERM)  # handled at once, as a real one would be
            result = fn(*args, **kw)
            if not before and when(args, kw):
                signal.raise_signal(signal.SIGTERM)
            return result
        return at_that_moment

    if moment == "making .writing-":
        monkeypatch.setattr(tempfile, "mkdtemp", signalled(mkdtemp, lambda _, kw: kw["prefix"] == ".writing-", False))
    else:
        monkeypatch.setattr(shutil, "rmtree", signalled(rmtree, lambda args, _: ".replaced-" in str(args[0]), True))
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        with pytest.raises(Terminated):
            with whole_folder(str(out)) as tmp:
                open(os.path.join(tmp, "second"), "w").close()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert os.listdir(tmp_path) == ["out"]
    assert os.listdir(out) == (["first"] if moment == "making .writing-" else ["second"])


def test_what_is_written_has_the_umasks_permissions_not_tempfiles_private_ones(tmp_path):
    old = os.umask(0o022)
    try:
        with whole_folder(str(tmp_path / "out")) as tmp:
            open(os.path.join(tmp, "f"), "w").close()
        with whole_file(str(tmp_path / "page.html")) as tmp:
            with open(tmp, "w") as f:
                f.write("<p>")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "out").st_mode & 0o777 == 0o755
    assert os.stat(tmp_path / "page.html").st_mode & 0o777 == 0o644
    assert (tmp_path / "page.html").read_text() == "<p>"


def test_a_failed_file_write_is_one_error_naming_the_file_and_leaves_nothing(tmp_path):
    (tmp_path / "page.html").mkdir()
    with pytest.raises(UserError, match="page.html: cannot write the page"):
        with whole_file(str(tmp_path / "page.html"), "the page") as tmp:
            with open(tmp, "w") as f:
                f.write("x")
    assert sorted(os.listdir(tmp_path)) == ["page.html"]


def test_a_new_folder_is_checked_before_the_work(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "empty").mkdir()
    check_new_folder(str(tmp_path / "new"))
    check_new_folder(str(tmp_path / "empty"))
    with pytest.raises(UserError, match="full: already exists and is not an empty folder: choose a new one"):
        check_new_folder(str(tmp_path / "full"))
    with pytest.raises(UserError, match="empty: already exists: pick another"):
        check_new_folder(str(tmp_path / "empty"), "pick another", empty_ok=False)
    with pytest.raises(UserError, match="its parent folder .* does not exist"):
        check_new_folder(str(tmp_path / "no" / "new"))


def test_the_models_folder_is_made_for_what_goes_into_it_and_no_other(tmp_path, monkeypatch):
    """A fresh clone has no models/: a command writing models/baby makes it (and its parents, as a download
    does), keeps it once something is in it, and takes it away again if the work fails. Any other missing
    parent grows nothing: check_new_folder refuses it."""
    models = tmp_path / "deep" / "models"
    with in_models_folder(str(models / "baby"), str(models)):
        check_new_folder(str(models / "baby"))
        (models / "baby").mkdir()
    assert os.listdir(models) == ["baby"]
    with pytest.raises(KeyboardInterrupt):
        with in_models_folder(str(tmp_path / "other" / "models" / "baby"), str(tmp_path / "other" / "models")):
            assert (tmp_path / "other" / "models").is_dir()
            raise KeyboardInterrupt
    assert sorted(os.listdir(tmp_path)) == ["deep"]  # what it made, it took away
    with pytest.raises(UserError, match="its parent folder .*runs does not exist"):
        with in_models_folder(str(tmp_path / "runs" / "baby"), str(models)):
            check_new_folder(str(tmp_path / "runs" / "baby"))
    with pytest.raises(UserError, match="its parent folder .*models does not exist"):  # models/ one level down
        with in_models_folder(str(models / "runs" / "models" / "baby"), str(models)):
            check_new_folder(str(models / "runs" / "models" / "baby"))
    assert sorted(os.listdir(tmp_path)) == ["deep"] and os.listdir(models) == ["baby"]


def test_the_projects_own_models_folder_is_made_even_with_another_models_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(folders, "PROJECT_MODELS", str(tmp_path / "project" / "models"))
    monkeypatch.setenv(folders.MODELS_DIR_ENV, str(tmp_path / "elsewhere"))
    with in_models_folder(str(tmp_path / "project" / "models" / "baby")):
        assert (tmp_path / "project" / "models").is_dir()
    with in_models_folder(str(tmp_path / "elsewhere" / "baby")):  # $GPT2_MODELS_DIR: the models folder in effect
        assert (tmp_path / "elsewhere").is_dir()
