"""A command's first step, before anything heavy loads (the standard library alone).

`python train.py` runs train.py as __main__, and its first lines, above its imports, hand over to
start(): so Ctrl-C and SIGTERM end the command as they do later, in one line with exit status 130
(plumbing/errors.py's exit_status), from here on, the second that NumPy takes to load included.

    start("train_cli")    interface/train_cli.py's main (which imports train.py as train), then exit

Only Python's own start comes earlier (site's imports, compiling the script: tens of milliseconds);
a signal there ends the process as it would any program's.
"""
import importlib
import signal
import sys

from plumbing.errors import ctrl_c_waits, exit_status


def start(cli):
    """Run interface/<cli>.py's main() as the program, its imports and its work inside exit_status."""
    sys.exit(exit_status(lambda: main_of(cli)))


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
