"""Can the forward pass's element-wise work use the second core? Each operation timed right after a matrix product.

    python bench/bench_second_core.py
    OPENBLAS_THREAD_TIMEOUT=4 python bench/bench_second_core.py    # OpenBLAS's workers sleep at once

After a matrix product, OpenBLAS's worker thread keeps spinning, waiting for the next one
(OPENBLAS_THREAD_TIMEOUT, default 2^28 cycles: about 0.1 s). In the forward pass a product
comes every few milliseconds, so that worker always holds the second core, and a thread of
ours given half the rows (parallel.in_chunks) shares that core with it.

Prints the CPU time the process burns while it sleeps for 1 s right after a product (the
spinning), then softmax on a block of attention scores and gelu on a 1021-token MLP, each
timed right after a product, plainly and through in_chunks. Medians of 30.
"""
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import gpt2_numpy as g  # noqa: E402
from parallel import in_chunks  # noqa: E402


def after_a_product(f, a, w, n=30):
    """Median milliseconds of f(), each call right after a @ w."""
    times = []
    for _ in range(n):
        a @ w
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main():
    rng = np.random.default_rng(0)
    a, w = (rng.standard_normal(s).astype(np.float32) for s in ((1021, 768), (768, 768)))
    scores = rng.standard_normal((1, 12, 128, 1021)).astype(np.float32)  # one block of queries
    h = rng.standard_normal((1021, 3072)).astype(np.float32)  # the MLP's hidden layer
    a @ w
    cpu = time.process_time()
    time.sleep(1.0)
    print(f"OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT', 'unset')}: "
          f"CPU burnt in a 1 s sleep after a product: {time.process_time() - cpu:.3f} s")
    for name, f, x in (("softmax [1,12,128,1021]", g.softmax, scores), ("gelu [1021,3072]", g.gelu_no_temporaries, h)):
        plain = after_a_product(lambda: f(x), a, w)
        shared = after_a_product(lambda: in_chunks(f, x), a, w)
        print(f"  {name}: one call {plain:.2f} ms, in_chunks on {os.cpu_count()} cores {shared:.2f} ms")


if __name__ == "__main__":
    main()
