"""download.py against a local mirror on 127.0.0.1 that drops connections and fails on purpose."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import DATA, ROOT, checkpoint_dir, closed_port, model_folder_copy
import download
from plumbing import fetching, shapes
from plumbing.checkpoint import CheckpointError
from plumbing.fetching import DownloadError
from plumbing.checkpoint import load_checkpoint

DATA_FILE = "model.ckpt.data-00000-of-00001"


@pytest.fixture(autouse=True)
def tiny_is_124m(monkeypatch):
    """The mirror serves the tiny checkpoint as 124M: let 124M's facts be the tiny model's."""
    monkeypatch.setitem(shapes.SIZES, "124M", load_checkpoint(checkpoint_dir("tiny"))[0])


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
    assert files_under(folder) == sorted(download.MODEL_FILES + (".lock", ".verified"))
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


def test_a_corrupt_index_is_never_kept_and_the_data_is_not_fetched_for_it(mirror, tmp_path):
    served = os.path.join(mirror.root, "124M", "model.ckpt.index")
    data = bytearray(open(served, "rb").read())
    data[10] ^= 1
    open(served, "wb").write(bytes(data))
    with pytest.raises(DownloadError, match="sent a bad model.ckpt.index: checksum mismatch .*nothing was kept"):
        fetch(mirror, tmp_path / "models")
    folder = tmp_path / "models" / "124M"
    assert not (folder / "model.ckpt.index").exists() and not (folder / "model.ckpt.index.part").exists()
    assert not (folder / DATA_FILE).exists()  # its size comes from the index: nothing to fetch it by
    mirror.requests.clear()
    open(served, "wb").write(bytes(data[:10]) + bytes([data[10] ^ 1]) + bytes(data[11:]))  # the mirror is mended
    fetch(mirror, tmp_path / "models")
    assert [p for p, _ in mirror.requests] == ["/124M/model.ckpt.index", f"/124M/{DATA_FILE}"]


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
    folder = model_folder_copy("odd", str(tmp_path / "mine"))
    before = files_under(folder)
    assert fetch(mirror, tmp_path / "models", model=folder) == folder
    assert mirror.requests == [] and files_under(folder) == before


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
    """python download.py ARGS, with the mirror's tiny model standing in for 124M."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "tests", "tiny_as_124m.py"), "download.py", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_downloads_and_verifies(mirror, tmp_path):
    r = run_download("124M", "--models-dir", str(tmp_path), "--base-url", mirror.url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "124M")
    r = run_download("--verify", "124M", "--models-dir", str(tmp_path))
    assert r.returncode == 0 and "all tensors match their checksums" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["350M"], "unknown model '350M'"),
    (["124M", "--retries", "0"], "error: --retries must be at least 1, got 0"),
    (["124M", "--retries", "1", "--base-url", "http://127.0.0.1:{port}"], "could not download"),
    (["--verify", "{tmp}"], "hparams.json"),
])
def test_cli_errors_are_one_line_and_exit_2(tmp_path, args, message):
    args = [a.format(port=closed_port(), tmp=tmp_path) for a in args]
    r = run_download(*args, "--models-dir", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr


# --- web pages, bad files on disk, odd servers, several processes (issue: downloads that cannot break) ---

PORTAL = b"<!DOCTYPE html><html><head><title>Hotel Wi-Fi</title></head><body>Please log in</body></html>\n"
BUCKET = (b'<?xml version="1.0" encoding="utf-8"?><Error><Code>NoSuchKey</Code>'
          b"<Message>The specified key does not exist.</Message></Error>")


@pytest.mark.parametrize("page", [PORTAL, BUCKET], ids=["captive portal", "bucket error"])
def test_a_web_page_is_never_saved_and_the_real_mirror_then_just_works(mirror, tmp_path, page):
    mirror.page = page
    with pytest.raises(DownloadError, match=r"the server sent a web page instead of checkpoint: a captive portal or "
                                            r"proxy\? \(http://127.0.0.1:\d+/124M/checkpoint\); nothing was kept"):
        fetch(mirror, tmp_path / "models")
    folder = tmp_path / "models" / "124M"
    assert not (tmp_path / "models").exists()  # nothing was saved: no file, no .part, no lock, no folder
    mirror.page = None  # back on a working network: no cleanup by hand
    fetch(mirror, tmp_path / "models")
    for name in download.MODEL_FILES:
        assert same_bytes(folder / name, os.path.join(mirror.root, "124M", name)), name


def test_every_file_is_checked_before_it_gets_its_final_name(mirror, tmp_path):
    """The portal answers only for vocab.bpe (say, a proxy that blocks .bpe files)."""
    served = os.path.join(mirror.root, "124M", "vocab.bpe")
    open(served, "wb").write(PORTAL)
    with pytest.raises(DownloadError, match="web page instead of vocab.bpe"):
        fetch(mirror, tmp_path / "models")
    folder = tmp_path / "models" / "124M"
    assert not (folder / "vocab.bpe").exists() and (folder / "encoder.json").exists()


BAD_CONTENT = {
    "checkpoint": b"404: Not Found",
    "hparams.json": b'{"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}',
    "encoder.json": b'{"a": 0}',
    "vocab.bpe": b"#version: 0.2\na b\n",
    "model.ckpt.index": b"\x00" * 200,
    DATA_FILE: b"\x00" * 1000,
}


@pytest.mark.parametrize("name", download.MODEL_FILES)
def test_a_bad_file_planted_under_a_final_name_is_replaced_on_the_next_run(mirror, tmp_path, name):
    folder = fetch(mirror, tmp_path / "models")
    with open(os.path.join(folder, name), "wb") as f:
        f.write(BAD_CONTENT[name])
    mirror.requests.clear()
    fetch(mirror, tmp_path / "models")
    assert same_bytes(os.path.join(folder, name), os.path.join(mirror.root, "124M", name))
    assert [p for p, _ in mirror.requests] == [f"/124M/{name}"]  # that file, and nothing else


@pytest.mark.parametrize("name", download.MODEL_FILES)
def test_a_bad_file_in_a_folder_named_by_path_is_a_clear_error_and_stays(tmp_path, name):
    folder = model_folder_copy("tiny", str(tmp_path / "mine"))
    # a folder of the user's may hold its own vocabulary and sizes: what is checked is that
    # no file is a web page, and that the index and data file fit its hparams.json
    content = BAD_CONTENT[name] if name in ("model.ckpt.index", DATA_FILE) else PORTAL
    with open(os.path.join(folder, name), "wb") as f:
        f.write(content)
    with pytest.raises(DownloadError, match=f"{name}: .*replace it with a good copy.*nothing in this folder was changed"):
        download.download_model(folder, quiet=True)
    assert open(os.path.join(folder, name), "rb").read() == content


def test_a_data_file_that_changes_after_it_was_verified_is_verified_again(mirror, tmp_path):
    folder = fetch(mirror, tmp_path / "models")
    path = os.path.join(folder, DATA_FILE)
    data = bytearray(open(path, "rb").read())
    data[5000] ^= 0xFF  # same size: only the CRCs can tell
    open(path, "wb").write(bytes(data))
    mirror.requests.clear()
    fetch(mirror, tmp_path / "models")  # the marker no longer matches the file: its CRCs are checked, and fail
    assert [p for p, _ in mirror.requests] == [f"/124M/{DATA_FILE}"]
    assert same_bytes(path, os.path.join(mirror.root, "124M", DATA_FILE))
    mirror.requests.clear()
    fetch(mirror, tmp_path / "models")
    assert mirror.requests == []


def test_a_warm_run_reads_the_data_file_only_for_its_size(mirror, tmp_path, monkeypatch):
    fetch(mirror, tmp_path / "models")
    monkeypatch.setattr(download.model_files, "verify_checkpoint",
                        lambda *a, **k: pytest.fail("the CRCs were checked again"))
    fetch(mirror, tmp_path / "models")


def test_a_server_that_ignores_range_starts_the_file_again(mirror, tmp_path):
    mirror.faults[DATA_FILE] = ["drop:200000", "ignore_range"]
    folder = fetch(mirror, tmp_path / "models", tries=2)
    ranges = [r for p, r in mirror.requests if p.endswith(DATA_FILE)]
    assert ranges[0] is None and ranges[1].startswith("bytes=")  # asked to resume, got the whole file
    assert same_bytes(os.path.join(folder, DATA_FILE), os.path.join(mirror.root, "124M", DATA_FILE))


def test_a_wrong_content_range_starts_the_file_again(mirror, tmp_path):
    mirror.faults[DATA_FILE] = ["drop:200000", "bad_range"]
    folder = fetch(mirror, tmp_path / "models", tries=3)
    ranges = [r for p, r in mirror.requests if p.endswith(DATA_FILE)]
    assert len(ranges) == 3 and ranges[0] is None and ranges[1].startswith("bytes=") and ranges[2] is None
    assert same_bytes(os.path.join(folder, DATA_FILE), os.path.join(mirror.root, "124M", DATA_FILE))


def test_no_content_length_is_checked_against_the_known_size(mirror, tmp_path):
    mirror.faults[DATA_FILE] = ["no_length"]
    mirror.faults["vocab.bpe"] = ["no_length"]
    folder = fetch(mirror, tmp_path / "models")
    assert same_bytes(os.path.join(folder, DATA_FILE), os.path.join(mirror.root, "124M", DATA_FILE))
    served = os.path.join(mirror.root, "124M", "vocab.bpe")
    open(served, "ab").write(b"extra\n")  # no length given, and longer than GPT-2's vocab.bpe
    mirror.faults["vocab.bpe"] = ["no_length"] * 5
    os.remove(os.path.join(folder, "vocab.bpe"))
    with pytest.raises(DownloadError, match=r"after 5 tries \(got 456,324 of 456,318 bytes\)"):
        fetch(mirror, tmp_path / "models")
    assert not os.path.exists(os.path.join(folder, "vocab.bpe"))


def test_a_wrong_content_length_for_the_data_file_is_caught_at_once(mirror, tmp_path):
    served = os.path.join(mirror.root, "124M", DATA_FILE)
    open(served, "ab").write(b"\x00" * 4)
    with pytest.raises(DownloadError, match=rf"is 1,617,316 bytes, but {DATA_FILE} must be 1,617,312"):
        fetch(mirror, tmp_path / "models")
    assert [r for p, r in mirror.requests if p.endswith(DATA_FILE)] == [None]  # one request, not five
    assert not os.path.exists(os.path.join(tmp_path, "models", "124M", DATA_FILE + ".part"))


def test_redirects_are_followed(mirror, tmp_path):
    folder = download.download_model("124M", str(tmp_path / "models"), base_url=mirror.url + "/moved", quiet=True)
    assert same_bytes(os.path.join(folder, DATA_FILE), os.path.join(mirror.root, "124M", DATA_FILE))
    assert any(p.startswith("/moved/") for p, _ in mirror.requests)


def test_the_vendored_vocabulary_has_the_pinned_hashes():
    for name, (size, digest) in download.model_files.VOCABULARY.items():
        path = os.path.join(ROOT, "data", "gpt2-vocab", name)
        assert os.path.getsize(path) == size and download.model_files.sha256(path) == digest


def test_three_processes_downloading_one_model_take_turns(mirror, tmp_path):
    mirror.faults[DATA_FILE] = ["slow"] * 3  # about 1.3 s: long enough for the others to arrive
    args = ["124M", "--models-dir", str(tmp_path / "models"), "--base-url", mirror.url]
    procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "tiny_as_124m.py"), "download.py", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert [code for _, _, code in results] == [0, 0, 0], results
    waited = sum("waiting for another download of 124M in" in err for _, err, _ in results)
    assert waited == 2 and not any("Traceback" in err for _, err, _ in results)
    folder = tmp_path / "models" / "124M"
    for name in download.MODEL_FILES:
        assert same_bytes(folder / name, os.path.join(mirror.root, "124M", name)), name
    assert sorted(p for p, _ in mirror.requests) == sorted(f"/124M/{n}" for n in download.MODEL_FILES)


def test_sigterm_in_the_middle_of_a_download_is_ctrl_c_and_the_next_run_resumes(mirror, tmp_path):
    """A real SIGTERM while the weights stream in: one line, exit 130, the bytes that arrived kept in
    their .part file (never under the final name), and the next run asks only for the rest."""
    mirror.faults[DATA_FILE] = ["slow"]  # about 1.3 s
    folder = tmp_path / "models" / "124M"
    part = folder / (DATA_FILE + ".part")
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "tiny_as_124m.py"), "download.py", "124M",
                          "--models-dir", str(tmp_path / "models"), "--base-url", mirror.url, "--quiet"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (part.exists() and part.stat().st_size) and p.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == "terminated\n" and out == "", (p.returncode, err)
    assert files_under(str(folder)) == sorted([".lock", DATA_FILE + ".part"] + [n for n in download.MODEL_FILES
                                                                                if n != DATA_FILE])
    have = part.stat().st_size
    mirror.requests.clear()
    fetch(mirror, tmp_path / "models")
    assert mirror.requests == [(f"/124M/{DATA_FILE}", f"bytes={have}-")]
    assert same_bytes(folder / DATA_FILE, os.path.join(mirror.root, "124M", DATA_FILE))


def test_cli_web_page_is_one_line_and_exit_2(mirror, tmp_path):
    mirror.page = PORTAL
    r = run_download("124M", "--models-dir", str(tmp_path), "--base-url", mirror.url)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "web page instead of checkpoint: a captive portal or proxy?" in r.stderr


def test_a_hub_name_given_to_download_py_says_where_it_downloads(tmp_path):
    r = run_download("hf:owner/name", "--models-dir", str(tmp_path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert 'hf:owner/name is a Hub model: python gpt2_numpy.py --model hf:owner/name "prompt" downloads it' in r.stderr
    assert os.listdir(tmp_path) == []


# --- a failed download says what is true, and leaves nothing of its own behind (issue 23, §6.11) ---

def test_no_server_names_the_host_and_the_folder_not_a_part_file_that_was_never_made(tmp_path):
    port = closed_port()
    with pytest.raises(DownloadError) as e:
        download.download_model("124M", str(tmp_path), base_url=f"http://127.0.0.1:{port}", quiet=True,
                                tries=1, backoff=0)
    message = str(e.value)
    assert f"is 127.0.0.1:{port} reachable?" in message and "(Connection refused)" in message
    assert f"Nothing was saved in {tmp_path / '124M'}" in message
    assert ".part" not in message and not [f for f in files_under(str(tmp_path)) if f.endswith(".part")]


def test_no_server_leaves_no_lock_and_no_folder_it_made(tmp_path):
    """"Nothing was saved" is true of the folders too: the run's lock file and the folders it made go."""
    port = closed_port()
    for models, size in ((tmp_path / "new" / "models", "124M"), (tmp_path / "mine", "1558M")):
        os.makedirs(tmp_path / "mine", exist_ok=True)
        with pytest.raises(DownloadError, match="Nothing was saved"):
            download.download_model(size, str(models), base_url=f"http://127.0.0.1:{port}", quiet=True, tries=1,
                                    backoff=0)
    assert os.listdir(tmp_path) == ["mine"] and os.listdir(tmp_path / "mine") == []  # the user's folder stays


def test_a_connection_that_sends_no_byte_leaves_no_empty_part_file(mirror, tmp_path):
    mirror.faults["checkpoint"] = ["drop:0"]
    with pytest.raises(DownloadError, match="Nothing was saved"):
        fetch(mirror, tmp_path / "models", tries=1)
    assert not (tmp_path / "models").exists()


def test_a_network_failure_keeps_the_bytes_that_arrived_and_the_lock_beside_them(mirror, tmp_path):
    mirror.faults[DATA_FILE] = ["drop:200000"]
    with pytest.raises(DownloadError, match="run again to resume"):
        fetch(mirror, tmp_path / "models", tries=1)
    folder = str(tmp_path / "models" / "124M")
    assert files_under(folder) == sorted([".lock", DATA_FILE + ".part"] + [n for n in download.MODEL_FILES
                                                                           if n != DATA_FILE])
    assert 0 < os.path.getsize(os.path.join(folder, DATA_FILE + ".part")) <= 200000  # the chunk in flight is lost


def test_a_404_removes_the_lock_and_the_folders_it_made(mirror, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(mirror, tmp_path / "models", model="355M")
    assert not (tmp_path / "models").exists()  # made by this run, and left empty: gone
    (tmp_path / "models").mkdir()
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(mirror, tmp_path / "models", model="355M")
    assert os.listdir(tmp_path / "models") == []  # the user's folder stays; only 355M/ and its lock go


def test_a_404_after_some_files_keeps_them_and_the_lock(mirror, tmp_path):
    os.remove(os.path.join(mirror.root, "124M", DATA_FILE))  # a mirror that lacks the weights
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(mirror, tmp_path / "models")
    assert files_under(str(tmp_path / "models" / "124M")) == sorted(
        [".lock"] + [n for n in download.MODEL_FILES if n != DATA_FILE])


def test_a_lock_file_removed_while_waiting_for_it_is_not_held(tmp_path):
    """A failed download removes its lock file while another process waits on it: the waiter must
    lock the file that is there now, not the removed one (two downloads at once otherwise)."""
    fcntl = pytest.importorskip("fcntl")
    folder = tmp_path / "124M"
    folder.mkdir()
    first = open(folder / fetching.LOCK, "a")
    fcntl.flock(first, fcntl.LOCK_EX)
    got = []
    waiter = threading.Thread(target=lambda: got.append(fetching.hold_lock(str(folder), "124M", quiet=True)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # it waits for the lock
    os.remove(folder / fetching.LOCK)
    os.rmdir(folder)  # as a failed first download leaves things: nothing
    fcntl.flock(first, fcntl.LOCK_UN)
    first.close()
    waiter.join(10)
    assert got and fetching.is_the_file_at(got[0], str(folder / fetching.LOCK))
    got[0].close()


# --- errors that say more (issue 23, §6 friction) ---------------------------------------------

def run_generate(*args):
    """python gpt2_numpy.py ARGS, with the mirror's tiny model standing in for 124M."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "tests", "tiny_as_124m.py"), "gpt2_numpy.py", *args],
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(r, message):
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_verify_before_a_download_says_how_to_download(tmp_path):
    r = run_download("--verify", "355M", "--models-dir", str(tmp_path))
    assert_one_line_error(r, f"355M is not downloaded (no such folder {tmp_path / '355M'}): "
                             f"python download.py 355M --models-dir {tmp_path} downloads it")
    (tmp_path / "355M").mkdir()
    (tmp_path / "355M" / "checkpoint").write_text('model_checkpoint_path: "model.ckpt"\n')
    r = run_download("--verify", "355M", "--models-dir", str(tmp_path))
    assert_one_line_error(r, f"355M is not downloaded (hparams.json is missing from {tmp_path / '355M'})")


def test_a_trained_tokenizer_given_as_a_model_is_named_a_tokenizer_folder(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat. " * 20)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bpe.py"), "--train", str(text), "--vocab-size", "260",
                        "--out", str(tmp_path / "tok"), "--quiet"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert_one_line_error(run_generate("--model", str(tmp_path / "tok"), "hi"),
                          "a tokenizer folder (encoder.json and vocab.bpe, no weights), not a model: --model needs "
                          "a model folder")
    assert "train.py --from-scratch --tokenizer" in run_generate("--model", str(tmp_path / "tok"), "hi").stderr


def test_a_hugging_face_tokenizer_given_as_a_model_is_named_a_tokenizer_folder(tmp_path):
    folder = tmp_path / "hf-tok"
    folder.mkdir()
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(DATA, "hf", "tiny", f), folder)
    assert_one_line_error(run_generate("--model", str(folder), "hi"),
                          "a tokenizer folder (vocab.json and merges.txt, no weights), not a model")


@pytest.mark.parametrize("model", ["/nonexistent", "./models/mine", "runs/baby", ".hidden"])
def test_a_missing_folder_is_no_such_folder(tmp_path, model):
    r = run_generate("--model", model, "--models-dir", str(tmp_path), "hi")
    assert_one_line_error(r, f"no such folder: {model} (")
    assert os.listdir(tmp_path) == []


def test_a_bare_word_is_an_unknown_model_with_the_sizes(tmp_path):
    r = run_generate("--model", "gpt3", "--models-dir", str(tmp_path), "hi")
    assert_one_line_error(r, "unknown model 'gpt3': choose one of 124M, 355M, 774M, 1558M")
