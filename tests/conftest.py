"""Shared test fixtures: paths to the committed data, the encoder, and a local model mirror.

Nothing here touches the network beyond 127.0.0.1.
"""
import functools
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

# BLAS on one thread, here and in every command the tests start (they inherit the environment): the
# tests' arrays are small, and on a machine that other work shares OpenBLAS's threads wait for each
# other, several times slower than one (docs/performance.md). OPENBLAS_CORETYPE is left as it is.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
os.environ.update(dict.fromkeys(THREAD_VARIABLES, "1"))

# A shell's background job starts us with SIGINT ignored, and a command started from here would inherit that:
# the tests that press Ctrl-C on one would see it ignored. With Python's own handler here, every command the
# tests start gets the default, as a terminal gives it (a handler, unlike "ignored", does not pass through exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import numpy as np  # noqa: E402  (after the threads: BLAS reads them as NumPy loads)
import pytest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data")
VOCAB = os.path.join(ROOT, "data", "gpt2-vocab")  # the runtime copy: tests read it, never keep one
sys.path.insert(0, ROOT)

import bpe  # noqa: E402


def rand(*shape, seed=0, scale=1.0):
    """A float32 array of standard normal values, the same for the same seed."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# float64 values and derivatives by finite differences, for the backward tests
def r64(*shape, seed=0, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


def as_float64(params):
    """A model's params (nested dicts and lists of arrays) in float64, for finite differences through the model."""
    if isinstance(params, dict):
        return {k: as_float64(v) for k, v in params.items()}
    if isinstance(params, list):
        return [as_float64(v) for v in params]
    return np.array(params, np.float64) if hasattr(params, "shape") else params


def float32_rounding(n, products, scale):
    """How far two float32 forward passes of one model may differ (another library's, another BLAS kernel's:
    the same sums in another order) in values of largest magnitude `scale`, made through `products` chained
    linear layers whose longest sum has n terms. Each side is within λ√n·u of the exact value per sum, relative
    to the magnitude (u = 2⁻²⁴; λ = 4: Higham and Mary's probabilistic bound, SIAM J. Sci. Comput. 41, 2019, which
    then holds for a sum with probability above 0.9993: BLAS's orders are no adversary's, whose worst case is
    n·u); to first order the products' errors add up along the chain, and two sides double it. A fixed 1e-5
    held on one OpenBLAS kernel and stood within 1.2x of the other's error."""
    return 2 * products * 4 * n ** 0.5 * 2.0 ** -24 * scale


def numerical_grad(f, x, eps=1e-6):
    """d f / d x by central differences, one element at a time (float64)."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


GRAD_GOLDEN = np.load(os.path.join(DATA, "grad_golden.npz"))  # torch's gradients: tests/data/make_grad_golden.py


@pytest.fixture(scope="session")
def models():
    """{'tiny', 'odd'}: (hparams, params) of the committed real-TensorFlow checkpoints."""
    from plumbing.checkpoint import load_checkpoint
    return {name: load_checkpoint(checkpoint_dir(name)) for name in ("tiny", "odd")}


def checkpoint_dir(name):
    """A committed real-TensorFlow checkpoint: 'tiny', 'odd' or 'many'."""
    return os.path.join(DATA, name)


def expected_tensors(name):
    """{checkpoint name: array} exactly as make_checkpoints.py gave them to TensorFlow."""
    with np.load(os.path.join(DATA, f"{name}_expected.npz")) as z:
        names, shapes, offsets, values = z["names"], z["shapes"], z["offsets"], z["values"]
    return {n.decode(): values[offsets[i]:offsets[i + 1]].reshape([d for d in shapes[i] if d >= 0])
            for i, n in enumerate(names)}


@pytest.fixture(scope="session")
def encoder():
    return bpe.get_encoder(VOCAB)


def model_folder_copy(name, dest):
    """A complete model folder (checkpoint + the real vocabulary), as OpenAI serves one."""
    os.makedirs(dest, exist_ok=True)
    for f in os.listdir(checkpoint_dir(name)):
        shutil.copy(os.path.join(checkpoint_dir(name), f), dest)
    for f in ("encoder.json", "vocab.bpe"):
        shutil.copy(os.path.join(VOCAB, f), dest)
    return dest


class Mirror:
    """An HTTP server on 127.0.0.1 serving <root>/<size>/<file>, with Range support and faults.

    faults[file name] is a list of faults, one used up per request for that file:
      "404", "500"    -- answer with that status
      "drop:N"        -- promise the whole body, send N bytes, close the connection
      "short"         -- promise the whole body, send all but the last 10 bytes, close
      "stall"         -- send 100,000 bytes, then nothing for 30 s
      "slow"          -- send the body in 64 KiB pieces, 50 ms apart
      "ignore_range"  -- answer a Range request with 200 and the whole file
      "bad_range"     -- answer a Range request with 206 from a byte 100 later than asked
      "no_length"     -- send no Content-Length (the body ends when the connection closes)
    .page, when set to bytes, is what every request gets, with status 200 (a captive portal,
    or a cloud bucket's XML error). A path under /moved/ is redirected (302) to the same path
    without it. Every request is logged in .requests as (path, Range header or None)."""

    def __init__(self, root):
        self.root = root
        self.faults = {}
        self.requests = []
        self.page = None
        self.etags = {}  # file name -> the X-Linked-ETag header to send with it (as the Hub does)
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                mirror.requests.append((self.path, self.headers.get("Range")))
                if mirror.page is not None:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(mirror.page)))
                    self.end_headers()
                    self.wfile.write(mirror.page)
                    return
                if self.path.startswith("/moved/"):
                    self.send_response(302)
                    self.send_header("Location", self.path[len("/moved"):])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                name = self.path.rsplit("/", 1)[-1]
                queue = mirror.faults.get(name) or []
                fault = queue.pop(0) if queue else None
                path = os.path.join(mirror.root, *self.path.strip("/").split("/"))
                if fault in ("404", "500") or not os.path.isfile(path):
                    self.send_response(int(fault or 404))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with open(path, "rb") as f:
                    body = f.read()
                start = 0
                rng = self.headers.get("Range")
                if fault == "ignore_range":
                    rng = None
                if rng and rng.startswith("bytes=") and rng.endswith("-"):
                    start = int(rng[6:-1])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    if fault == "bad_range":
                        start = min(start + 100, len(body) - 1)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                rest = body[start:]
                if name in mirror.etags:
                    self.send_header("X-Linked-ETag", f'"{mirror.etags[name]}"')
                if fault != "no_length":
                    self.send_header("Content-Length", str(len(rest)))
                else:
                    self.close_connection = True
                self.end_headers()
                if fault == "slow":
                    for i in range(0, len(rest), 1 << 16):
                        self.wfile.write(rest[i:i + (1 << 16)])
                        self.wfile.flush()
                        time.sleep(0.05)
                    return
                if fault == "no_length":
                    self.wfile.write(rest)
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault and fault.startswith("drop:"):
                    rest = rest[:int(fault[5:])]
                elif fault == "short":
                    rest = rest[:-10]
                if fault == "stall":
                    self.wfile.write(rest[:100000])
                    self.wfile.flush()
                    time.sleep(30)
                    return
                self.wfile.write(rest)
                if fault in ("drop", "short") or (fault or "").startswith("drop:"):
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def tiny_mirror(root):
    """A mirror that serves the tiny checkpoint (with the real vocabulary) under the name 124M."""
    model_folder_copy("tiny", os.path.join(root, "124M"))
    return Mirror(root)


@pytest.fixture
def mirror(tmp_path):
    m = tiny_mirror(str(tmp_path / "mirror"))
    yield m
    m.close()


def closed_port():
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The order a student meets failures in: the building blocks before the model built from
# them, the model before the programs built on it. test_layout.py holds this list to every test file.
FILE_ORDER = ["test_gpt2_numpy.py", "test_crc32c.py", "test_bpe.py", "test_checkpoint.py", "test_folders.py",
              "test_decoding.py", "test_backward.py", "test_optimizer.py", "test_parallel.py", "test_memory.py", "test_device.py",
              "test_look_inside.py", "test_circuits.py", "test_sae.py", "test_sae_architectures.py", "test_sae_training.py", "test_sae_cli.py", "test_tracing.py", "test_steer.py", "test_lens.py", "test_evaluate.py", "test_train.py", "test_train_cli.py",
              "test_train_documents.py", "test_train_instruction.py", "test_train_lora.py", "test_dpo.py", "test_train_dpo.py", "test_classify.py", "test_train_classify.py", "test_data_parallel.py", "test_data_parallel_mpi.py",
              "test_parameters.py",
              "test_safetensors_writer.py", "test_hf_model.py", "test_classify_hub.py", "test_convert.py", "test_gguf.py", "test_download.py",
               "test_gpt2_cli.py", "test_decoding_speculative.py", "test_html_page.py", "test_start.py", "test_blas.py", "test_loading.py", "test_layout.py",
               "test_real_weights.py", "test_handout_leaks.py", "test_handout.py", "test_handout_notebook.py", "test_gpu.py"]


def pytest_collection_modifyitems(items):
    def rank(item):
        name = os.path.basename(str(item.fspath))
        return FILE_ORDER.index(name) if name in FILE_ORDER else len(FILE_ORDER)

    items.sort(key=rank)  # a stable sort: within a file, the tests keep their order


# python train.py on the tiny model, a short run (test_train.py, test_train_cli.py)
def train_args(model, data, out, *more):
    return ["--model", model, "--data", str(data), "--out", str(out), "--steps", "12", "--batch-size", "2",
            "--context", "16", "--warmup", "3", "--lr", "3e-3", "--eval-every", "6", "--sample-every", "12",
            "--save-every", "6", "--quiet", *more]


def run_train(*args, env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def in_process(main, capsys, *args):
    """A command line's main(args) in this process, without a process's start and imports (a second or
    more on a busy machine): -> a CompletedProcess (exit status, stdout, stderr). For its messages and
    statuses; the tests that stop a command, or that need its imports fresh, start it for real."""
    capsys.readouterr()
    try:
        status = main([str(a) for a in args])
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, out, err)


# a model folder and a small text to fine-tune it on (test_train.py, test_train_lora.py)
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return model_folder_copy("tiny", str(tmp_path_factory.mktemp("m") / "tiny"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat and the dog ran to the park while birds sang in tall green trees".split()
    (folder / "notes.txt").write_text(" ".join(rng.choice(words, 2000)), encoding="utf-8")
    return folder / "notes.txt"


# Hugging Face generate's ids, scores and distributions (tests/data/make_generate_golden.py): test_gpt2_numpy.py,
# test_decoding.py, test_gpt2_cli.py. $GPT2_GENERATE_GOLDEN: a fresh one instead (test_gpt2_numpy.py's live test)
with open(os.environ.get("GPT2_GENERATE_GOLDEN") or os.path.join(DATA, "generate_golden.json"), encoding="utf-8") as f:
    GENERATE_GOLDEN = json.load(f)["cases"]


def generate_golden(kind):
    """The golden's cases of one kind: "greedy", "beams" or "sampling"."""
    def kind_of(case):
        kw = case["generate"]
        return "beams" if kw.get("num_beams", 1) > 1 else "sampling" if kw.get("do_sample") else "greedy"
    return [case for case in GENERATE_GOLDEN if kind_of(case) == kind]


@functools.lru_cache(maxsize=None)
def golden_model(folder):
    """(hparams, params, each id's bytes or None) of a generate golden's folder (under tests/data), loaded once."""
    from plumbing.weights import load_weights
    path = os.path.join(DATA, folder)
    hparams, params = load_weights(path)
    has_vocabulary = any(os.path.exists(os.path.join(path, f)) for f in ("encoder.json", "vocab.json"))
    return hparams, params, bpe.get_encoder(path).token_bytes if has_vocabulary else None


def golden_settings(case):
    """A generate golden's settings, in our names: what generate and beam_search share."""
    kw = case["generate"]
    return dict(n_tokens=kw["max_new_tokens"], stop=kw["eos_token_id"], stop_strings=kw.get("stop_strings", ()),
                repetition_penalty=kw.get("repetition_penalty", 1.0),
                no_repeat_ngram_size=kw.get("no_repeat_ngram_size", 0))
