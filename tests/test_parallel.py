"""parallel.py: the hot path's helpers give what one plain call gives."""
import threading

import numpy as np

import backward
import gpt2_numpy as g
from plumbing import parallel


def test_in_chunks_on_all_the_cores_is_the_same_function(monkeypatch):
    monkeypatch.setattr(parallel, "CHUNK", 100)  # 28 rows of 30: three rows a chunk, the last chunk cut short
    x = np.random.default_rng(3).standard_normal((4, 7, 30), dtype=np.float32)
    dy = np.random.default_rng(4).standard_normal((4, 7, 30), dtype=np.float32)
    got = parallel.in_chunks(backward.gelu_backward_fast, x, dy)
    assert got.shape == x.shape and np.array_equal(got, backward.gelu_backward_fast(x, dy))
    y = g.softmax(x)  # and a function of whole rows
    assert np.array_equal(parallel.in_chunks(backward.softmax_backward, y, dy), backward.softmax_backward(y, dy))


def test_shared_among_cores_gives_each_share_in_order_on_the_same_threads():
    jobs = list(range(10))
    shares = parallel.shared_among_cores(lambda share: share, jobs)
    n = min(parallel.CORES, len(jobs))
    assert shares == [jobs[i::n] for i in range(n)]
    assert parallel.shared_among_cores(sum, [5]) == [5]
    threads = [set(x for s in parallel.shared_among_cores(lambda share: [threading.get_ident()], jobs) for x in s)
               for _ in range(20)]
    assert len(set().union(*threads)) <= parallel.CORES  # the pool's workers, started once, and this thread


def test_reused_gives_the_same_array_until_the_shape_changes():
    buffers = {}
    a = parallel.reused(buffers, "x", (3, 4), np.float32)
    assert parallel.reused(buffers, "x", (3, 4), np.float32) is a
    assert parallel.reused(buffers, "x", (3, 5), np.float32) is not a
    assert parallel.reused(None, "x", (3, 4), np.float32) is not parallel.reused(None, "x", (3, 4), np.float32)
