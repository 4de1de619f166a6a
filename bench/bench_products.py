"""The matrix products alone, NumPy against torch on the same shapes: is either's BLAS faster here?

    python bench/bench_products.py                                   # the from-scratch step's products
    python bench/bench_products.py --rows 1021 --n-embd 768 --layers 12 --forward-only   # a 124M prefill's
    PY=/path/to/python-with-torch; $PY bench/bench_products.py ...   # the same, and torch's

The products of the linear layers (c_attn, attn.c_proj, c_fc, mlp.c_proj) of --layers blocks
on --rows positions; with training (the default) also each one's two backward products
(dx = dy wᵀ, dw = xᵀ dy) and the tied head's three. Random float32 arrays, --threads on both sides
(default 2), medians of 30 passes. Run with a Python that has torch, it times torch's matmul on the same arrays too.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plumbing.blas import set_threads  # noqa: E402  (OpenBLAS's count, NumPy loaded or not)


def shapes(rows, n_embd, layers, vocab, forward_only):
    """(m, k, n) of every product: [m, k] @ [k, n]."""
    C = n_embd
    forward = [(rows, C, 3 * C), (rows, C, C), (rows, C, 4 * C), (rows, 4 * C, C)]
    step = []
    for m, k, n in forward:
        step += [(m, k, n)] if forward_only else [(m, k, n), (m, n, k), (k, m, n)]
    head = [] if forward_only else [(rows, C, vocab), (rows, vocab, C), (vocab, rows, C)]
    return step * layers + head


def median_seconds(pairs, n=30):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        for a, b in pairs:
            a @ b
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=12 * 64, help="B·T positions (default: the from-scratch recipe's)")
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=257)
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--threads", type=int, default=2, help="BLAS threads, NumPy's and torch's (default 2)")
    args = p.parse_args()
    set_threads(args.threads)
    rng = np.random.default_rng(0)
    mkn = shapes(args.rows, args.n_embd, args.layers, args.vocab, args.forward_only)
    pairs = [(rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32))
             for m, k, n in mkn]
    flop = sum(2 * m * k * n for m, k, n in mkn)
    print(f"{len(mkn)} products, {flop / 1e9:.2f} GFLOP, {args.threads} threads")
    s = median_seconds(pairs)
    print(f"  numpy {s * 1e3:.2f} ms, {flop / s / 1e9:.0f} GFLOP/s")
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(args.threads)
    s = median_seconds([(torch.from_numpy(a), torch.from_numpy(b)) for a, b in pairs])
    print(f"  torch {s * 1e3:.2f} ms, {flop / s / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
