"""The hot path's helpers: all the cores, cache-sized chunks, and buffers made once.

NumPy runs a matrix product on every core (BLAS does), but each element-wise operation
(exp, tanh, +, *) on one core, and each one passes over its whole array: on arrays larger
than the cache, every operation is another trip to main memory. These helpers let a plain
row-wise function run on a few rows at a time, each chunk's temporaries staying in the
cache, with the chunks shared among the cores. NumPy lets go of the GIL inside each
operation on large arrays, so threads are enough.

    threads()                        how many threads the element-wise work runs on: BLAS's (--threads)
    shared_among_cores(work, jobs)   work(share) on each thread, each taking the next job as it finishes one
    in_chunks(rowwise, *arrays)      rowwise(*arrays), a few rows at a time, on those threads
    reused(buffers, name, ...)       an array made once and written over at every step
    rows_at_a_time(a, rows)          how many rows a chunked loop takes at once: `rows`, or all on a device

They run on as many threads as BLAS has (plumbing/blas.py: --threads N, set_threads(n)), never more than the
cores: one thread given is one core used, which is what a shared machine wants. The jobs are not split in fixed
shares: each thread takes the next one as it finishes one. After each matrix product OpenBLAS's idle thread spins
on its core for about 0.1 s (docs/performance.md), so a thread of ours there runs at half speed; with fixed
halves the caller would wait for it, and two threads would take as long as one.

The plain functions (gelu, softmax, gelu_backward, ...) know nothing of this: the caller
chooses to run them in chunks, and a test holds the result equal to one plain call.

All of this is for a CPU. On a GPU (plumbing/device.py) a chunk is a kernel launch, and its
cache is not the CPU's: there each helper is one whole-array call (in_chunks runs the function's
fused twin where one stands beside it), and a test holds the count of calls.
"""
import concurrent.futures
import functools
import itertools
import os

import numpy as np

from plumbing import blas, device

CORES = os.cpu_count() or 1
CHUNK = 1 << 16  # floats: a chunk's arrays (AdamW's p, g, m, v and two scratch) stay in the cache
WHOLE = 1 << 21  # floats (8 MB): on one thread, in_chunks makes one call of an array up to this size, which stays in
# the last cache with its temporaries (with freed memory kept, plumbing/memory.py, no fresh pages either): chunks
# there only add their copies (docs/performance.md)

# The other cores' workers, started once: a pool made at every call spends its time starting
# threads and taking locks, a large share of a small model's training step (docs/performance.md).
# The calling thread does the first share itself.
WORKERS = concurrent.futures.ThreadPoolExecutor(max(1, CORES - 1), thread_name_prefix="gpt2-numpy-core")


def threads():
    """How many threads the element-wise work runs on: as many as BLAS's matrix products (the user's --threads),
    at most the cores; all the cores where NumPy's BLAS cannot say (neither OpenBLAS nor MKL)."""
    count = blas_count()
    return CORES if count is None else max(1, min(CORES, count()))


@functools.lru_cache(maxsize=None)
def blas_count():
    """BLAS's own function that says its thread count, found once (a search of the loaded libraries); None
    where NumPy's BLAS has none."""
    try:
        return blas.blas_functions()[1]
    except RuntimeError:
        return None


def shared_among_cores(work, jobs):
    """work(share) on each of threads() threads at once, each share an iterator that hands its thread the next
    job not yet taken, until none is left: a thread slowed down (another's spin on its core) takes fewer.
    -> each share's result, in no fixed order (a caller that sums them in order keys them by job).
    work must not call this again: a worker of the pool would then wait for a job queued behind itself."""
    n = min(threads(), len(jobs)) or 1
    if n == 1:
        return [work(iter(jobs))]
    taken = itertools.count()  # next() on it is one step under the GIL: no two threads get the same job

    def share():
        for i in iter(taken.__next__, None):
            if i >= len(jobs):
                return
            yield jobs[i]

    others = [WORKERS.submit(work, share()) for _ in range(n - 1)]
    return [work(share())] + [f.result() for f in others]


def in_chunks(rowwise, *arrays):
    """rowwise(*arrays) for arrays of one shape and a function that works on each row (the last
    axis) alone, element-wise ones included, computed a few rows (about CHUNK elements) at a
    time on threads() threads: each chunk's temporaries stay in the cache, where one pass over the
    whole arrays per operation would go to main memory each time. An array that fits one chunk, or on one thread
    WHOLE, is one call of the function itself.   [..., N] -> [..., N]"""
    if device.on_device(arrays[0]):  # one call, one kernel if the function has a fused twin
        fused = device.twin(rowwise, device.module_of(arrays[0]))
        return (fused or rowwise)(*arrays)
    n = arrays[0].shape[-1]
    step = max(1, CHUNK // n)
    if arrays[0].size <= (WHOLE if threads() == 1 else step * n):  # one call, no copy (a decoded token's rows)
        return rowwise(*arrays)
    rows = [a.reshape(-1, n) for a in arrays]
    out = np.empty_like(rows[0])

    def work(starts):
        for i in starts:
            out[i:i + step] = rowwise(*(a[i:i + step] for a in rows))

    shared_among_cores(work, list(range(0, len(out), step)))
    return out.reshape(arrays[0].shape)


def reused(buffers, name, shape, dtype, like=None):
    """buffers[name], made once and used again at every step: fresh memory is slow to touch, and a
    step's largest arrays (the [B·T, V] logits, wte's gradient) are tens to hundreds of MB.
    buffers None: a new array every time. like: an array whose kind (NumPy's, a device's) it is made as."""
    if buffers is None:
        return np.empty(shape, dtype, like=like)
    kind = np.ndarray if like is None else type(like)
    old = buffers.get(name)
    if old is None or old.shape != shape or old.dtype != dtype or type(old) is not kind:
        buffers[name] = np.empty(shape, dtype, like=like)
    return buffers[name]


def rows_at_a_time(a, rows):
    """How many rows of `a` a chunked loop takes at once: `rows` on the host (they stay in the cache),
    all of them on a device (one launch each, not one per chunk)."""
    return max(len(a), 1) if device.on_device(a) else rows
