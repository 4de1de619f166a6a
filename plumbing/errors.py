"""Two kinds of failure, kept apart: a user's mistake, and a bug.

A user's mistake (a bad flag value, an unknown model, a prompt too long for the
context, a missing or corrupt file, no network) is a `UserError`. It carries what
it is about as data: `arg`, the argument's name in the Python API ("top_k"), or
`path`, the file. The command lines print it as one line and exit with status 2.

Anything else is a bug, in this code or in a student's rewrite of a function: it
is never caught, so it shows its traceback. (A matmul with mismatched shapes is a
ValueError from NumPy, but not a UserError: you see where it happened.)

Stopping a command from outside is neither: Ctrl-C (SIGINT) and SIGTERM (`kill`, `timeout`,
a scheduler) are handled alike. Each is raised where the program is (SIGTERM as Terminated, a
KeyboardInterrupt), so what is being written is taken away on the way out; the command says so
in one line and ends with status 130, the status of Ctrl-C, whichever of the two stopped it.
"""
import contextlib
import json
import os
import re
import signal
import sys
import threading


class UserError(ValueError):
    """A mistake in what the user asked for or gave; str(e) is one line for them.
    A subclass of ValueError, so that API users can catch it as one."""

    def __init__(self, message, arg=None, path=None):
        self.message, self.arg, self.path = message, arg, path
        super().__init__(f"{arg} {message}" if arg else f"{path}: {message}" if path else message)


def plural(n, word, spec=""):
    """'1 token', '2 tokens': a count in a message, as a reader says it (spec ",": '1,181 tokens')."""
    return f"{n:{spec}} {word}{'' if n == 1 else 's'}"


def fail(message):
    """Report a user's mistake on the command line: one line on stderr, exit status 2. It is each
    command's parser's error too: there a flag's type that says what the flag must be (interface/
    options.py's at_least) reads as every other message, "--top-k must be ...", not argparse's
    "argument --top-k: must be ..."."""
    message = re.sub(r"^argument (\S+): (?=must be )", r"\1 ", message)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, as Ctrl-C raises KeyboardInterrupt: whatever handles
    Ctrl-C (a temporary folder's cleanup, training's last save) handles it too."""


def raise_terminated(signum, frame):
    raise Terminated


def exit_status(work, message=str):
    """How every command ends: work()'s exit status (None is 0). A user's mistake is one line and
    status 2 (`fail`, with message(e)); Ctrl-C and SIGTERM are one line and 130; a reader that went
    away (`| head`) is a quiet stop. A bug is not caught here: it shows its traceback."""
    main = threading.current_thread() is threading.main_thread()  # only there can a signal be handled
    previous = signal.signal(signal.SIGTERM, raise_terminated) if main else None
    try:
        return work() or 0
    except UserError as e:
        fail(message(e))
    except KeyboardInterrupt as e:  # on a terminal the line may hold a bar or streamed text: start a new one
        what = "terminated" if isinstance(e, Terminated) else "interrupted"
        print(f"\n{what}" if sys.stderr.isatty() else what, file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


WAITING = (signal.SIGINT, signal.SIGTERM)  # the signals that ctrl_c_waits holds back


@contextlib.contextmanager
def ctrl_c_waits():
    """`with ctrl_c_waits():` a Ctrl-C (or SIGTERM) that arrives inside the block is raised when
    the block ends, so the work in it (a training step: its update runs on both cores) is done
    whole or not begun: then Ctrl-C is a KeyboardInterrupt, and SIGTERM goes to the handler it
    would have met at once (exit_status's Terminated; outside a command, the process ends).
    An exception raised in the block goes on as usual. Outside the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in WAITING}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if signal.SIGTERM in arrived:
        signal.raise_signal(signal.SIGTERM)
    if signal.SIGINT in arrived:
        raise KeyboardInterrupt


def given_flags(parser, argv):
    """The flags written on a command line, as their destinations: those a user chose, not left
    to their defaults (argparse's namespace cannot tell the two apart)."""
    words = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    return {a.dest for a in parser._actions if words & set(a.option_strings)}


def read_json(path, error=UserError):
    """A JSON file's content; a missing or unreadable one is `error` (a UserError) naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise error(e.strerror, path=path) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise error(f"not valid JSON ({e})", path=path) from None


def read_text(path):
    """A UTF-8 text file's content; a missing, unreadable, non-UTF-8 or empty one is a UserError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise UserError("is not UTF-8 text", path=path) from None
    except OSError as e:
        raise UserError(e.strerror or str(e), path=path) from None
    if not text.strip():
        raise UserError("is empty", path=path)
    return text
