"""Progress, the same way in every command: a bar on a terminal, an occasional plain line in a log.

A tqdm bar redraws itself with a carriage return several times a second. On a terminal that
is one line that moves; in a log (a file, a pipe, CI) every redraw stays, 286 KB of them in a
2000-step training run. So progress() gives tqdm's bar when its stream is a terminal, and
otherwise a Lines reporter: the same methods, one plain line every `every` seconds and one at
the end. Messages written through either (write) go to stdout, above the bar.
"""
import sys
import time

EVERY = 10.0  # seconds between two lines in a log
NO_ESTIMATE = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"  # tqdm's own, without {remaining}


def progress(total, unit, initial=0, quiet=False, file=None, every=EVERY, estimate=True):
    """A progress display with tqdm's update, set_postfix, write and close (and `with`): tqdm's
    bar if `file` (stderr) is a terminal, plain lines if not, nothing but write's messages if quiet.
    The time left is the time so far over the units done, times those to do: right where each unit
    costs about the same (a training step); estimate=False shows none, where the units' cost falls
    as they go (a vocabulary's merges), so that no rate measured so far says what the rest will take."""
    file = sys.stderr if file is None else file
    if not quiet and file.isatty():
        from tqdm import tqdm
        return tqdm(total=total, initial=initial, unit=unit, file=file, bar_format=None if estimate else NO_ESTIMATE)
    return Lines(total, unit, initial, file, None if quiet else every, estimate)


class Lines:
    """tqdm's interface, for a log: a line such as `step 120/2,000 (6%), 65 s, 1,003 s left, loss=3.21`
    when `every` seconds have passed since the last one, and one at close if the count moved
    since. every=None: no lines at all."""

    def __init__(self, total, unit, initial, file, every, estimate=True):
        self.total, self.unit, self.file, self.every, self.estimate = total, unit, file, every, estimate
        self.n = self.shown = self.initial = initial
        self.postfix = ""
        self.start = self.last = time.monotonic()

    def update(self, n=1):
        self.n += n
        if self.every is not None and time.monotonic() - self.last >= self.every:
            self.line()

    def set_postfix(self, **values):
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def write(self, text):
        print(text, flush=True)

    def line(self):
        self.last, self.shown = time.monotonic(), self.n
        elapsed = self.last - self.start
        parts = [f"{self.unit} {self.n:,}" + (f"/{self.total:,} ({self.n / self.total:.0%})" if self.total else ""),
                 f"{elapsed:.0f} s"]
        if self.estimate and self.total and self.n > self.initial:
            parts.append(f"{elapsed / (self.n - self.initial) * (self.total - self.n):.0f} s left")
        print(", ".join(parts + ([self.postfix] if self.postfix else [])), file=self.file, flush=True)

    def close(self):
        if self.every is not None and self.n != self.shown:
            self.line()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
