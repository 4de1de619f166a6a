"""Ctrl-C and SIGTERM in a command's first second: exit 130, one line, no traceback, nothing left.

Each command's first lines hand over to interface/start.py before its imports, so a signal that
arrives while NumPy loads is handled as one that arrives later. These tests start each command for
real and stop it at once (0 ms) and 50 ms after the moment its first step takes the signals (the
SIGTERM bit of /proc/PID/status's SigCgt), both inside the imports, and once at 0 ms from the
start of the process. Only Python's own start comes before the first step (tens of ms): there
SIGTERM ends the process as it would any program's, silently, and Ctrl-C is Python's to report.
Models come from a slow mirror of the tiny checkpoint (tests/tiny_as_124m.py), so that each command
is still at work when the last signal comes, and has something to leave behind if it were careless.
"""
import concurrent.futures
import inspect
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, tiny_mirror
from interface import start

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc/PID/status (Linux)")

TINY = os.path.join(ROOT, "tests", "tiny_as_124m.py")
TEXT = os.path.join(ROOT, "data", "tinyshakespeare.txt")
SAID = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    mirror = tiny_mirror(str(tmp_path_factory.mktemp("mirror")))
    mirror.faults["model.ckpt.data-00000-of-00001"] = ["slow"] * 1000  # 1.6 MB in 64 KiB, 50 ms apart
    yield mirror.url
    mirror.close()


def commands(url):
    """{name: the arguments of python, run in a folder of its own}: each downloads or reads for seconds."""
    mirror = ["--models-dir", "models", "--base-url", url, "--quiet"]
    return {"gpt2_numpy.py": [TINY, "gpt2_numpy.py", "Hello", *mirror],
            "train.py": [TINY, "train.py", "--data", TEXT, "--out", "trained", "--steps", "3", *mirror],
            "evaluate.py": [TINY, "evaluate.py", "perplexity", TEXT, *mirror],
            "circuits.py": [TINY, "circuits.py", "heads", "--text", "the cat sat", "--pattern", "previous",
                            "--html", "page.html", *mirror],
            "bpe.py": [os.path.join(ROOT, "bpe.py"), "--train", TEXT, "--vocab-size", "600", "--out", "vocab",
                       "--quiet"],
            "convert.py": [TINY, "convert.py", "124M", "hf", "--to", "hf", *mirror],
            "download.py": [TINY, "download.py", "124M", *mirror],
            "handout.py": [os.path.join(ROOT, "handout.py"), "class"],
            "sae.py": [TINY, "sae.py", "train", "--site", "blocks.0.hook_resid_pre", "--data", TEXT, "--d-sae", "16",
                       "--l1", "1", "--tokens", "8192", "--out", "sae", *mirror],
            "steer.py": [TINY, "steer.py", "add", "I hate you because", "--add", "Love", "--sub", "Hate", "--layer",
                         "0", "--coeff", "5", "--logits", "logits.npy", *mirror]}


def handles(pid, signum):
    """Whether the process has a handler of its own for the signal: its bit in /proc/PID/status's SigCgt."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) >> (signum - 1) & 1)


def libraries(pid):
    """The compiled libraries of NumPy and regex that the process has loaded."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split()[-1] for line in f if "/numpy" in line or "/regex/" in line}
    except OSError:
        return set()


def stopped(args, folder, stop, after, from_first_step=True):
    """Start python ARGS in folder, send it stop `after` seconds from its first step (or from its start),
    -> (what loaded before the first step, whether the command still ran at the signal, exit status, stderr).
    Looking late sees a later moment, in which the handler is still there: it can miss an early import,
    never invent one."""
    os.makedirs(folder)
    p = subprocess.Popen([sys.executable, *args], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline, early = time.monotonic() + 60, set()
        while from_first_step and p.poll() is None and not handles(p.pid, signal.SIGTERM) and not early:
            assert time.monotonic() < deadline, "the command never took SIGTERM"
            early = libraries(p.pid)
            time.sleep(0.0005)
        time.sleep(after)
        running = p.poll() is None
        p.send_signal(stop)
        err = p.communicate(timeout=120)[1]
        return early, running, p.returncode, err
    finally:
        if p.poll() is None:
            p.kill()


# Seconds after the first step: the imports (NumPy's alone is 0.1 s idle) take longer than the last.
INSTANTS = [(signal.SIGINT, 0.0), (signal.SIGTERM, 0.05)]


@pytest.mark.parametrize("name", list(commands("URL")))
def test_a_signal_in_the_first_second_is_one_line_and_130(url, tmp_path, name):
    """The first step comes before NumPy loads (and regex). At each instant: exit 130, the one line
    that names the signal, no traceback, the command's folder as empty as it began; from the process's
    start (0 ms), SIGTERM is silent whenever it comes.
    handout.py may be done before a late signal: then it is done whole, and exit 0."""
    args = commands(url)[name]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell may start the tests with it ignored
    try:
        runs = [(stop, after, True) for stop, after in INSTANTS] + [(signal.SIGTERM, 0.0, False)]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            outcomes = list(pool.map(lambda i: stopped(args, str(tmp_path / str(i)), *runs[i]), range(len(runs))))
    finally:
        signal.signal(signal.SIGINT, previous)
    for i, ((stop, after, from_first_step), (early, running, status, err)) in enumerate(zip(runs, outcomes)):
        at = f"{name}: {stop.name} {after * 1000:.0f} ms after its {'first step' if from_first_step else 'start'}"
        left = sorted(os.listdir(tmp_path / str(i)))
        assert not early, f"{at}: the first step came after {sorted(early)} had loaded"
        assert "Traceback" not in err, f"{at}:\n{err}"
        if name == "handout.py" and status == 0:
            assert left == ["class"] and os.path.isfile(tmp_path / str(i) / "class" / "handout.py"), at
            continue
        assert running, f"{at}: the command was over before the signal; give it more to do"
        if not from_first_step and status == -stop:  # still in Python's own start: ended as any program is
            assert err == "" and left == [], (at, err, left)
            continue
        assert status == 130 and err.strip() == SAID[stop], (at, status, err)
        assert left == [], (at, left)


# --- --threads: BLAS's threads, set before NumPy loads ---------------------------------------

@pytest.mark.parametrize("argv, environment, threads", [
    (["--threads", "3"], {}, "3"), (["--threads=2", "x"], {}, "2"), (["--threads", "3", "--threads", "2"], {}, "2"),
    (["--threads", "3"], {"OMP_NUM_THREADS": "2"}, "3"),  # the flag over the environment
    ([], {"OPENBLAS_NUM_THREADS": "2"}, None),  # the environment's own, left alone
    ([], {}, str(start.THREADS)), (["--threads", "0"], {}, str(start.THREADS)),  # argparse says what 0 is
    (["--", "--threads", "3"], {}, str(start.THREADS)), (["--threads"], {}, str(start.THREADS))])
def test_threads_come_from_the_flag_else_the_environment_else_the_default(monkeypatch, argv, environment, threads):
    for v in start.THREAD_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    for v, value in environment.items():
        monkeypatch.setenv(v, value)
    start.use_threads(argv)
    assert {v: os.environ.get(v) for v in start.THREAD_VARIABLES} == (
        {v: environment.get(v) for v in start.THREAD_VARIABLES} if threads is None
        else dict.fromkeys(start.THREAD_VARIABLES, threads))


def blas_threads():
    """The threads of the process's BLAS, as OpenBLAS itself counts them."""
    import ctypes
    with open("/proc/self/maps") as f:
        lib = ctypes.CDLL(next(line.split()[-1] for line in f if "openblas" in line and ".so" in line))
    name = next(n for n in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                            "openblas_get_num_threads") if hasattr(lib, n))
    return getattr(lib, name)()


# Runs a command as python would, and says on its way out how many threads its BLAS ran.
BLAS_THREADS = f"""import atexit, runpy, sys
{inspect.getsource(blas_threads)}
atexit.register(lambda: print("BLAS threads", blas_threads(), file=sys.stderr))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("name", ["gpt2_numpy.py", "train.py", "evaluate.py", "circuits.py", "sae.py", "steer.py",
                                  "lens.py"])
def test_each_computing_command_runs_blas_on_the_threads_it_is_given(name):
    """--threads N is BLAS's thread count, and so is the default without it: BLAS took them as NumPy
    loaded. The commands stop at a mistake in their flags, after their imports, so each run is short."""
    mistake = {"gpt2_numpy.py": ["--top-k", "-3"], "train.py": ["--out"], "evaluate.py": ["perplexity"],
               "circuits.py": ["heads"], "sae.py": ["train"], "steer.py": ["add"], "lens.py": ["read"]}[name]
    env = {k: v for k, v in os.environ.items() if k not in start.THREAD_VARIABLES}
    said = {}
    given = "2" if start.THREADS == 1 else "1"
    for threads in (given, None):
        r = subprocess.run([sys.executable, "-c", BLAS_THREADS, os.path.join(ROOT, name), *mistake,
                            *(["--threads", threads] if threads else [])], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and r.stderr.startswith("error: "), r.stderr
        said[threads] = r.stderr.splitlines()[-1]
    assert said == {given: f"BLAS threads {given}", None: f"BLAS threads {start.THREADS}"}
    subcommand = {"evaluate.py": ["perplexity"], "circuits.py": ["heads"], "sae.py": ["eval"], "steer.py": ["add"],
                  "lens.py": ["read"]}.get(name, [])
    r = subprocess.run([sys.executable, os.path.join(ROOT, name), *subcommand, "--threads", "0"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "--threads" in r.stderr, r.stderr


def test_the_tests_and_the_commands_they_start_run_blas_on_one_thread():
    """tests/conftest.py's threads: robust to a busy machine, in this process and in those it starts."""
    r = subprocess.run([sys.executable, "-c", BLAS_THREADS, os.path.join(ROOT, "gpt2_numpy.py"), "--top-k", "-3"],
                       capture_output=True, text=True)
    assert r.stderr.splitlines()[-1] == "BLAS threads 1", r.stderr
    assert blas_threads() == 1


def test_every_evaluate_command_takes_threads():
    """The README: every command that computes takes --threads (evaluate.py preference lacked it, issue 44)."""
    from interface import evaluate_cli
    for command in ("perplexity", "surprisal", "choice", "lambada", "classify", "preference"):
        more = ["--reference", "124M"] if command == "preference" else []
        assert evaluate_cli.parse_args([command, "FILE", *more, "--threads", "2"]).threads == 2, command


def test_threads_above_the_cpus_the_process_may_use_are_refused_in_one_line():
    """OpenBLAS runs no more threads than the CPUs, whatever it is told: --threads 1000000000 was taken and quietly
    not followed (issue 51 §6). Every command's --threads is threads_flag's."""
    import argparse

    from interface.options import threads_flag

    p = argparse.ArgumentParser()
    threads_flag(p)
    assert p.parse_args(["--threads", str(start.usable_cpus())]).threads == start.usable_cpus()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), "hi", "--threads", "1000000000"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr == (f"error: --threads must be at most {start.usable_cpus()}, the CPUs this "
                                              "process may use (BLAS runs no more threads), got 1000000000\n"), r.stderr
