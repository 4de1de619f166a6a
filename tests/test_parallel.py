"""parallel.py: the hot path's helpers give what one plain call gives."""
import threading
import time

import numpy as np
import pytest

import backward
import gpt2_numpy as g
from plumbing import parallel
from plumbing.blas import set_threads


@pytest.fixture
def two_threads():
    """BLAS on 2 threads for one test (the suite runs it on one: tests/conftest.py), so the pool's are used too."""
    before = set_threads(2)
    yield min(parallel.CORES, 2)
    set_threads(before)


def test_in_chunks_on_all_the_cores_is_the_same_function(monkeypatch, two_threads):
    monkeypatch.setattr(parallel, "CHUNK", 100)  # 28 rows of 30: three rows a chunk, the last chunk cut short
    x = np.random.default_rng(3).standard_normal((4, 7, 30), dtype=np.float32)
    dy = np.random.default_rng(4).standard_normal((4, 7, 30), dtype=np.float32)
    got = parallel.in_chunks(backward.gelu_backward_fast, x, dy)
    assert got.shape == x.shape and np.array_equal(got, backward.gelu_backward_fast(x, dy))
    y = g.softmax(x)  # and a function of whole rows
    assert np.array_equal(parallel.in_chunks(backward.softmax_backward, y, dy), backward.softmax_backward(y, dy))
    small = x[:1, :3]  # one chunk: the function's own result, no copy
    assert parallel.in_chunks(lambda a: a, small) is small


def test_the_element_wise_work_runs_on_blas_threads():
    before = set_threads(1)
    try:
        assert parallel.threads() == 1
        assert parallel.shared_among_cores(lambda share: [threading.get_ident()] * len(list(share)), list(range(9))) \
            == [[threading.get_ident()] * 9]  # one thread given: the caller's, every job
        set_threads(2)
        assert parallel.threads() == min(parallel.CORES, 2)
    finally:
        set_threads(before)


def test_shared_among_cores_hands_each_job_out_once_and_a_slow_thread_takes_fewer(two_threads):
    jobs = list(range(40))
    shares = parallel.shared_among_cores(list, jobs)
    assert len(shares) == min(two_threads, len(jobs)) and sorted(j for s in shares for j in s) == jobs
    assert all(s == sorted(s) for s in shares)  # each thread takes the jobs in their order
    assert parallel.shared_among_cores(list, [5]) == [[5]]
    caller = threading.get_ident()

    def work(share):  # the pool's thread is slow, as where OpenBLAS's idle thread spins on its core
        return [time.sleep(0.004 if threading.get_ident() != caller else 0.0) or j for j in share]

    if two_threads > 1:
        mine, theirs = parallel.shared_among_cores(work, list(range(20)))
        assert len(mine) > len(theirs)
    threads = [set(x for s in parallel.shared_among_cores(lambda share: [threading.get_ident()], jobs) for x in s)
               for _ in range(20)]
    assert len(set().union(*threads)) <= parallel.CORES  # the pool's workers, started once, and this thread


def test_reused_gives_the_same_array_until_the_shape_changes():
    buffers = {}
    a = parallel.reused(buffers, "x", (3, 4), np.float32)
    assert parallel.reused(buffers, "x", (3, 4), np.float32) is a
    assert parallel.reused(buffers, "x", (3, 5), np.float32) is not a
    assert parallel.reused(None, "x", (3, 4), np.float32) is not parallel.reused(None, "x", (3, 4), np.float32)
