"""download.py against a local mirror on 127.0.0.1 that drops connections and fails on purpose."""
import os
import subprocess
import sys

import pytest

import download
from download import CheckpointError, DownloadError
from conftest import ROOT, closed_port

DATA_FILE = "model.ckpt.data-00000-of-00001"


def files_under(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


def fetch(mirror, models, model="124M", **kw):
    kw.setdefault("backoff", 0)
    return download.download_model(model, str(models), base_url=mirror.url, quiet=True, **kw)


def same_bytes(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        return f.read() == g.read()


def test_download_fetches_every_file_exactly(mirror, tmp_path):
    models = tmp_path / "models"
    folder = fetch(mirror, models)
    assert folder == str(models / "124M")
    assert files_under(folder) == sorted(download.MODEL_FILES)
    for name in download.MODEL_FILES:
        assert same_bytes(os.path.join(folder, name), os.path.join(mirror.root, "124M", name)), name
    assert sorted(path for path, _ in mirror.requests) == sorted(f"/124M/{n}" for n in download.MODEL_FILES)


def test_a_finished_download_is_not_fetched_again(mirror, tmp_path):
    fetch(mirror, tmp_path / "models")
    mirror.requests.clear()
    fetch(mirror, tmp_path / "models")
    assert mirror.requests == []


def test_a_dropped_connection_resumes_on_the_next_run(mirror, tmp_path):
    mirror.faults[DATA_FILE] = ["drop:200000"]
    with pytest.raises(DownloadError, match="run again to resume"):
        fetch(mirror, tmp_path / "models", tries=1)
    folder = tmp_path / "models" / "124M"
    assert not (folder / DATA_FILE).exists()
    kept = (folder / (DATA_FILE + ".part")).stat().st_size
    assert 131072 <= kept <= 200000  # all but the 64 KiB chunk that was in flight
    mirror.requests.clear()
    fetch(mirror, tmp_path / "models", tries=1)
    assert mirror.requests == [(f"/124M/{DATA_FILE}", f"bytes={kept}-")]
    assert same_bytes(folder / DATA_FILE, os.path.join(mirror.root, "124M", DATA_FILE))
    assert not (folder / (DATA_FILE + ".part")).exists()


def test_a_dropped_connection_is_retried_within_one_run(mirror, tmp_path):
    mirror.faults[DATA_FILE] = ["drop:70000", "drop:70000"]
    folder = fetch(mirror, tmp_path / "models", tries=3)
    ranges = [r for p, r in mirror.requests if p.endswith(DATA_FILE)]
    assert ranges[0] is None and len(ranges) == 3
    first, second = (int(r[len("bytes="):-1]) for r in ranges[1:])
    # each try resumes after what reached the disk: all that was sent, or all but the chunk in flight
    assert 65536 <= first <= 70000 and first + 65536 <= second <= first + 70000
    assert same_bytes(os.path.join(folder, DATA_FILE), os.path.join(mirror.root, "124M", DATA_FILE))


def test_server_errors_are_retried(mirror, tmp_path):
    mirror.faults["hparams.json"] = ["500", "500"]
    fetch(mirror, tmp_path / "models", tries=3)
    assert [p for p, _ in mirror.requests].count("/124M/hparams.json") == 3


def test_server_errors_give_up_after_the_last_try(mirror, tmp_path):
    mirror.faults["hparams.json"] = ["500"] * 3
    with pytest.raises(DownloadError, match=r"after 3 tries \(HTTP 500\)"):
        fetch(mirror, tmp_path / "models", tries=3)


def test_a_404_is_a_clear_error_and_leaves_nothing_under_final_names(mirror, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(mirror, tmp_path / "models", model="355M")
    assert not any(f in download.MODEL_FILES for f in files_under(str(tmp_path / "models")))


def test_a_short_body_is_never_renamed(mirror, tmp_path):
    mirror.faults[DATA_FILE] = ["short"] * 3
    with pytest.raises(DownloadError, match="after 3 tries"):
        fetch(mirror, tmp_path / "models", tries=3)
    folder = tmp_path / "models" / "124M"
    assert not (folder / DATA_FILE).exists()
    size = os.path.getsize(os.path.join(mirror.root, "124M", DATA_FILE))
    assert 0 < (folder / (DATA_FILE + ".part")).stat().st_size < size


def test_a_corrupt_download_is_caught_by_verification_and_removed(mirror, tmp_path):
    served = os.path.join(mirror.root, "124M", DATA_FILE)
    data = bytearray(open(served, "rb").read())
    data[777] ^= 1
    open(served, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match=f"checksum mismatch .*removed {DATA_FILE}: run again"):
        fetch(mirror, tmp_path / "models")
    assert not (tmp_path / "models" / "124M" / DATA_FILE).exists()
    assert (tmp_path / "models" / "124M" / "model.ckpt.index").exists()


def test_a_corrupt_index_is_removed_and_the_data_kept(mirror, tmp_path):
    served = os.path.join(mirror.root, "124M", "model.ckpt.index")
    data = bytearray(open(served, "rb").read())
    data[10] ^= 1
    open(served, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match="model.ckpt.index: checksum mismatch .*removed model.ckpt.index"):
        fetch(mirror, tmp_path / "models")
    folder = tmp_path / "models" / "124M"
    assert not (folder / "model.ckpt.index").exists() and (folder / DATA_FILE).exists()
    mirror.requests.clear()
    open(served, "wb").write(bytes(data[:10]) + bytes([data[10] ^ 1]) + bytes(data[11:]))  # the mirror is mended
    fetch(mirror, tmp_path / "models")
    assert [p for p, _ in mirror.requests] == ["/124M/model.ckpt.index"]


def test_a_models_folder_that_cannot_be_made_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(DownloadError, match="cannot create"):
        download.download_model("124M", str(blocker / "models"), base_url="http://127.0.0.1:9", quiet=True)


def test_a_full_disk_is_one_clear_error(mirror, tmp_path):
    folder = tmp_path / "models" / "124M"
    folder.mkdir(parents=True)
    os.symlink("/dev/full", folder / (DATA_FILE + ".part"))  # every write fails with ENOSPC
    with pytest.raises(DownloadError, match="No space left on device"):
        fetch(mirror, tmp_path / "models")
    assert not (folder / DATA_FILE).exists()


def test_no_server_is_one_clear_error(tmp_path):
    with pytest.raises(DownloadError, match="could not download .* after 2 tries"):
        download.download_model("124M", str(tmp_path), base_url=f"http://127.0.0.1:{closed_port()}",
                                quiet=True, tries=2, backoff=0)


@pytest.mark.parametrize("name", ["124", "gpt2", "../124M", "124M/../../x", ""])
def test_only_the_four_sizes_are_downloaded(tmp_path, name):
    with pytest.raises(DownloadError, match="unknown model"):
        download.download_model(name, str(tmp_path / "models"), base_url="http://127.0.0.1:9", quiet=True)
    assert not (tmp_path / "models").exists()


def test_an_existing_folder_is_used_as_it_is(mirror, tmp_path):
    folder = str(tmp_path / "mine")
    os.makedirs(folder)
    assert fetch(mirror, tmp_path / "models", model=folder) == folder
    assert mirror.requests == []


def test_environment_variables_choose_the_folder_and_the_mirror(mirror, tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2_MODELS_DIR", str(tmp_path / "env-models"))
    monkeypatch.setenv("GPT2_BASE_URL", mirror.url)
    folder = download.download_model("124M", quiet=True)
    assert folder == str(tmp_path / "env-models" / "124M") and os.path.exists(os.path.join(folder, DATA_FILE))


def test_default_models_folder_is_beside_the_code(monkeypatch):
    monkeypatch.delenv("GPT2_MODELS_DIR", raising=False)
    assert download.default_models_dir() == os.path.join(ROOT, "models")


# --- command line -----------------------------------------------------------------------

def run_download(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "download.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_downloads_and_verifies(mirror, tmp_path):
    r = run_download("124M", "--models-dir", str(tmp_path), "--base-url", mirror.url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "124M")
    r = run_download("--verify", "124M", "--models-dir", str(tmp_path))
    assert r.returncode == 0 and "all tensors match their checksums" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["350M"], "unknown model '350M'"),
    (["124M", "--retries", "0"], "--retries must be at least 1"),
    (["124M", "--retries", "1", "--base-url", "http://127.0.0.1:{port}"], "could not download"),
    (["--verify", "{tmp}"], "hparams.json"),
])
def test_cli_errors_are_one_line_and_exit_2(tmp_path, args, message):
    args = [a.format(port=closed_port(), tmp=tmp_path) for a in args]
    r = run_download(*args, "--models-dir", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr
