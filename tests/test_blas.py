"""plumbing/blas.py: set_threads changes the thread count of the BLAS NumPy has already loaded, as OpenBLAS
itself (tests/test_start.py's blas_threads) and threadpoolctl (where it is installed) count them."""
import os
import subprocess
import sys

import numpy as np
import pytest

from plumbing import blas
from test_start import blas_threads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_set_threads_changes_the_loaded_blass_count_and_says_the_one_before():
    before = blas_threads()
    try:
        assert blas.set_threads(2) == before and blas_threads() == blas.blas_threads() == 2
        a = np.random.default_rng(0).standard_normal((300, 300)).astype(np.float32)
        product = a @ a
        assert blas.set_threads(1) == 2 and blas_threads() == 1
        np.testing.assert_allclose(a @ a, product, rtol=1e-5, atol=1e-4)
    finally:
        blas.set_threads(before)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_a_count_that_is_not_a_whole_number_from_1_is_refused(bad):
    with pytest.raises(ValueError, match="threads must be a whole number >= 1"):
        blas.set_threads(bad)


def test_another_blas_is_told_how_to_set_its_threads(monkeypatch):
    monkeypatch.setattr(blas, "loaded_libraries", lambda: [])
    with pytest.raises(RuntimeError, match="OMP_NUM_THREADS=N before Python starts"):
        blas.set_threads(1)


def test_threadpoolctl_sees_the_count_change_after_numpy_loaded():
    """In a fresh process, NumPy loaded on 2 threads (as a notebook's is, on every core), set_threads(1)
    is what threadpoolctl then reports for NumPy's BLAS. (OpenBLAS takes no more threads than cores.)"""
    code = ("import numpy, threadpoolctl; from plumbing import blas; "
            "see = lambda: [i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']; "
            "print(see(), blas.set_threads(1), see())")
    env = {**os.environ, "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    if "No module named 'threadpoolctl'" in r.stderr:
        pytest.skip("threadpoolctl is not installed (the project does not need it): pip install threadpoolctl, or run "
                    "/work/venvs/ref/bin/python -m pytest tests/test_blas.py")
    loaded = str(min(2, os.cpu_count()))
    assert r.returncode == 0 and r.stdout.split() == [f"[{loaded}]", loaded, "[1]"], r.stderr[-2000:]
