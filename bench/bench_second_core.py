"""Can the element-wise work (forward and backward) use the second core? Each operation timed right after a matrix product.

    python bench/bench_second_core.py
    OPENBLAS_THREAD_TIMEOUT=4 python bench/bench_second_core.py    # OpenBLAS's workers sleep at once

After a matrix product, OpenBLAS's worker thread keeps spinning, waiting for the next one
(OPENBLAS_THREAD_TIMEOUT, default 2^28 cycles: about 0.1 s). In the forward pass a product
comes every few milliseconds, so that worker always holds the second core, and a thread of
ours given half the rows (parallel.in_chunks) shares that core with it.

Prints the CPU time the process burns while it sleeps for 1 s right after a product (the
spinning), then the forward's softmax and gelu and the backward's at the sizes the model and
training meet, each timed right after a product three ways: in one call, through in_chunks
(cache-sized chunks shared among the cores), and the same chunks one after another on the
calling core alone. Medians of 30.
"""
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import backward  # noqa: E402
import gpt2_numpy as g  # noqa: E402
from plumbing.parallel import CHUNK, in_chunks  # noqa: E402


def chunks_on_one_core(rowwise, *arrays):
    """in_chunks without the other cores: the same cache-sized chunks, one after another."""
    n = arrays[0].shape[-1]
    rows = [a.reshape(-1, n) for a in arrays]
    out = np.empty_like(rows[0])
    step = max(1, CHUNK // n)
    for i in range(0, len(out), step):
        out[i:i + step] = rowwise(*(a[i:i + step] for a in rows))
    return out.reshape(arrays[0].shape)


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
    cases = [("softmax", g.softmax, [(1, 12, 128, 1021)]),  # one block of a prefill's queries
             ("gelu", g.gelu_fast, [(1021, 3072)]),  # a 1021-token prefill's MLP
             ("gelu_backward", backward.gelu_backward_fast, [(2048, 3072), (256, 3072), (768, 512)]),
             ("softmax_backward", backward.softmax_backward, [(8, 12, 256, 256), (12, 4, 64, 64)])]
    a @ w
    cpu = time.process_time()
    time.sleep(1.0)
    print(f"OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT', 'unset')}: "
          f"CPU burnt in a 1 s sleep after a product: {time.process_time() - cpu:.3f} s")
    print(f"  ms, right after a product: one call / in_chunks on {os.cpu_count()} cores / chunks on one core")
    for name, f, sizes in cases:
        for shape in sizes:
            xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(f.__code__.co_argcount)]
            times = [after_a_product(lambda: run(f, *xs), a, w) for run in
                     (lambda f, *x: f(*x), in_chunks, chunks_on_one_core)]
            print(f"  {name} {list(shape)}: " + " / ".join(f"{t:.2f}" for t in times))


if __name__ == "__main__":
    main()
