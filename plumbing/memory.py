"""Memory: what the OS can still give, and one refusal for a request that would not fit.

Caching every activation (look_inside.py) and training (train.py) can need more memory than
the machine has; the OS would then swap or kill the process halfway. Both ask here first, and
refuse in one line before anything is allocated.
"""
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
