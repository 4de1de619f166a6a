"""The hot path's helpers: all the cores, cache-sized chunks, and buffers made once.

NumPy runs a matrix product on every core (BLAS does), but each element-wise operation
(exp, tanh, +, *) on one core, and each one passes over its whole array: on arrays larger
than the cache, every operation is another trip to main memory. These helpers let a plain
row-wise function run on a few rows at a time, each chunk's temporaries staying in the
cache, with the chunks shared among the cores. NumPy lets go of the GIL inside each
operation on large arrays, so threads are enough.

    shared_among_cores(work, jobs)   work(share) on each core's share of the jobs, at once
    in_chunks(rowwise, *arrays)      rowwise(*arrays), a few rows at a time, on all the cores
    reused(buffers, name, ...)       an array made once and written over at every step
    rows_at_a_time(a, rows)          how many rows a chunked loop takes at once: `rows`, or all on a device

The plain functions (gelu, softmax, gelu_backward, ...) know nothing of this: the caller
chooses to run them in chunks, and a test holds the result equal to one plain call.

All of this is for a CPU. On a GPU (plumbing/device.py) a chunk is a kernel launch, and its
cache is not the CPU's: there each helper is one whole-array call (in_chunks runs the function's
fused twin where one stands beside it), and a test holds the count of calls.
"""
import concurrent.futures
import os

import numpy as np

from plumbing import device

CORES = os.cpu_count() or 1
CHUNK = 1 << 16  # floats: a chunk's arrays (AdamW's p, g, m, v and two scratch) stay in the cache

# The other cores' workers, started once: a pool made at every call spends its time starting
# threads and taking locks, a large share of a small model's training step (docs/performance.md).
# The calling thread does the first share itself.
WORKERS = concurrent.futures.ThreadPoolExecutor(max(1, CORES - 1), thread_name_prefix="gpt2-numpy-core")


def shared_among_cores(work, jobs):
    """work(share) for each core's share of the jobs (jobs[i::cores]), at once. -> each share's result
    work must not call this again: a worker of the pool would then wait for a job queued behind itself."""
    n = min(CORES, len(jobs)) or 1
    shares = [jobs[i::n] for i in range(n)]
    others = [WORKERS.submit(work, share) for share in shares[1:]]
    return [work(shares[0])] + [f.result() for f in others]


def in_chunks(rowwise, *arrays):
    """rowwise(*arrays) for arrays of one shape and a function that works on each row (the last
    axis) alone, element-wise ones included, computed a few rows (about CHUNK elements) at a
    time on all the cores: each chunk's temporaries stay in the cache, where one pass over the
    whole arrays per operation would go to main memory each time.   [..., N] -> [..., N]"""
    if device.on_device(arrays[0]):  # one call, one kernel if the function has a fused twin
        fused = device.twin(rowwise, device.module_of(arrays[0]))
        return (fused or rowwise)(*arrays)
    n = arrays[0].shape[-1]
    rows = [a.reshape(-1, n) for a in arrays]
    out = np.empty_like(rows[0])
    step = max(1, CHUNK // n)

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
