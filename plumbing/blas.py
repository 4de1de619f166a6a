"""BLAS's thread count, set in a running process: the Python API's --threads.

A command sets its threads before NumPy loads (interface/start.py: the environment, which BLAS reads
once, as it loads). A script or a notebook has NumPy loaded already, where the environment no longer
counts; so this asks the loaded library itself, through its own entry point, as threadpoolctl does:

    set_threads(1)     every later matrix product on one thread   -> the count before
    blas_threads()     the count now

NumPy's wheels bundle OpenBLAS (numpy.libs/, .dylibs/; scipy-openblas builds name its functions
scipy_openblas_..._64_); a NumPy built on MKL (conda's) is told through MKL's. Another BLAS is a
RuntimeError that says how to set its threads instead.
"""
import ctypes
import glob
import os

import numpy as np

SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
           "MKL_Set_Num_Threads")
GETTERS = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
           "MKL_Get_Max_Threads")


def loaded_libraries():
    """The paths of the shared libraries that may be NumPy's BLAS: those NumPy's wheel carries beside it
    first (another library, torch's, may have loaded a BLAS of its own), then those this process has
    loaded (Linux's /proc/self/maps: a NumPy built on the system's or conda's BLAS)."""
    here = os.path.dirname(np.__file__)
    paths = [p for folder in (os.path.join(os.path.dirname(here), "numpy.libs"), os.path.join(here, ".dylibs"))
             for p in sorted(glob.glob(os.path.join(folder, "*blas*")))]
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths += [line.split()[-1] for line in f
                      if "/" in line and ("blas" in line.lower() or "mkl" in line.lower())]
    except OSError:
        pass
    return [p for p in dict.fromkeys(paths) if os.path.isfile(p)]


def blas_functions():
    """-> (set, get): the loaded BLAS's functions of its thread count, as ctypes functions of an int."""
    for path in loaded_libraries():
        library = ctypes.CDLL(path)  # the library already loaded: the same one NumPy calls
        found = [next((getattr(library, name) for name in names if hasattr(library, name)), None)
                 for names in (SETTERS, GETTERS)]
        if all(found):
            found[0].argtypes, found[0].restype, found[1].restype = [ctypes.c_int], None, ctypes.c_int
            return found
    raise RuntimeError("NumPy's BLAS here is neither OpenBLAS nor MKL (numpy.show_config() names it): set its "
                       "threads with OMP_NUM_THREADS=N before Python starts, or with threadpoolctl")


def blas_threads():
    """How many threads BLAS's matrix products use now."""
    return blas_functions()[1]()


def set_threads(n):
    """Every later matrix product on n threads (NumPy loaded or not). -> the count before. On a machine
    that other work shares, 1 is faster (docs/performance.md); the commands' --threads N is this."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"threads must be a whole number >= 1, got {n!r}")
    set_n, get_n = blas_functions()
    before = get_n()
    set_n(n)
    return before
