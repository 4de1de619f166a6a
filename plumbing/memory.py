"""Memory: what the OS can still give, one refusal for a request that would not fit, and freed memory kept.

Caching every activation (look_inside.py) and training (train.py) can need more memory than
the machine has; the OS would then swap or kill the process halfway. Both ask here first, and
refuse in one line before anything is allocated.

A forward pass or a training step makes and frees arrays of megabytes (a step at B=4, T=64 on 124M: its
gradients alone are 500 MB). glibc's malloc hands large freed blocks back to the OS, so the next step's arrays
are fresh pages again: a page fault and a page of zeros each, at first touch (a quarter of a step's CPU on one
thread, docs/performance.md). keep_freed_memory() tells malloc to keep them for the next array; every command
calls it as it starts (interface/start.py), a script or a notebook may too.
"""
import ctypes
import os

from plumbing.errors import UserError


def available_memory():
    """Bytes the OS can still give us without swapping (MemAvailable), or None if it won't say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(need, free, what, advice):
    """Refuse `what` if it needs more than `free` bytes (None: the OS won't say, so go on):
    "<what> needs 3.2 GB, but 1.0 GB are free: <advice>"."""
    if free is not None and need > free:
        raise UserError(f"{what} needs {size(need)}, but {size(free)} are free: {advice}")


UNITS = ("GB", "TB", "PB", "EB", "ZB", "YB")  # SI's, as the OS's MemAvailable is read here: 1 GB = 1e9 bytes


def size(n):
    """Bytes as a reader says them: "3.2 GB" below a terabyte, then "102.4 PB" (and past the yottabyte,
    "1,000,000.0 YB"), never "102416000.0 GB"."""
    unit = 0
    while unit < len(UNITS) - 1 and n >= 1e12 * 1000 ** unit:
        unit += 1
    return f"{n / (1e9 * 1000 ** unit):,.1f} {UNITS[unit]}"


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters (glibc's malloc.h)


def keep_freed_memory():
    """glibc's malloc keeps what is freed, for the next arrays, instead of giving it back to the OS: no block of
    its own mapping (M_MMAP_MAX 0; glibc still maps one where its heap cannot grow), and the heap never trimmed
    (M_TRIM_THRESHOLD at its largest). The process's memory stays at its peak so far. -> True where it was set
    (glibc); False elsewhere (macOS, Windows, musl), where nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1) == 1
