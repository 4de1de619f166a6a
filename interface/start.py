"""A command's first step, before anything heavy loads (the standard library alone).

`python train.py` runs train.py as __main__, and its first lines, above its imports, hand over to
start(): so Ctrl-C and SIGTERM end the command as they do later, in one line with exit status 130
(plumbing/errors.py's exit_status), from here on, the second that NumPy takes to load included.
And BLAS reads its thread count once, as NumPy loads: so --threads is seen to here, before it does.
(A script or notebook, where NumPy is loaded already, calls plumbing.blas.set_threads instead.)

    start("train_cli")    interface/train_cli.py's main (which imports train.py as train), then exit
    use_threads(argv)     BLAS's threads: --threads N, else the environment's, else THREADS

Only Python's own start comes earlier (site's imports, compiling the script: tens of milliseconds);
a signal there ends the process as it would any program's.
"""
import importlib
import os
import signal
import sys

from plumbing.errors import ctrl_c_waits, exit_status
from plumbing.memory import keep_freed_memory

# BLAS's threads unless told: one. On a machine that other work shares, OpenBLAS's threads wait for
# each other and run 3-7x slower than one; idle, a second saves about a tenth (docs/performance.md).
THREADS = 1
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cpus():
    """The CPUs this process may run on (its affinity, else the machine's count): OpenBLAS runs no more threads
    than these, whatever it is told, so --threads is at most this many (interface/options.py's threads_flag)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def start(cli):
    """Run interface/<cli>.py's main() as the program, its imports and its work inside exit_status."""
    use_threads(sys.argv[1:])
    keep_freed_memory()  # the next step's arrays reuse this one's memory: no fresh pages (plumbing/memory.py)
    sys.exit(exit_status(lambda: main_of(cli)))


def use_threads(argv):
    """Set BLAS's thread count before NumPy loads: the last --threads N or --threads=N before `--`
    (a value that is not a whole number >= 1 is left to argparse's message), else whatever the
    environment already says, else THREADS."""
    given = None
    for word, after in zip(argv, argv[1:] + [None]):
        if word == "--":
            break
        value = word[len("--threads="):] if word.startswith("--threads=") else after if word == "--threads" else None
        if value is not None and value.isdigit() and int(value) >= 1:
            given = int(value)
    if given is None and any(v in os.environ for v in THREAD_VARIABLES):
        return
    for v in THREAD_VARIABLES:
        os.environ[v] = str(given or THREADS)


def main_of(cli):
    """The command line's imports, then its work. A signal is held back until the imports are done:
    raised inside NumPy's, it can come out as an ImportError. Once the outcome is known, a late
    signal changes nothing: it is ignored, and the process ends with the command's own status,
    even while Python shuts down."""
    try:
        with ctrl_c_waits():
            command_line = importlib.import_module(f"interface.{cli}")
        return command_line.main()
    finally:
        for stop in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop, signal.SIG_IGN)
