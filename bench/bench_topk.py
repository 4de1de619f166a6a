"""TopK's encode: sae.topk_relu (np.argpartition, linear time) against the same top k by a full sort (np.argsort),
on random pre-activations of OpenAI's GPT-2 small SAEs' size (32,768 latents, k 32), median of 5 each.

    flock /work/bench.lock python bench/bench_topk.py [--tokens 1024] [--d-sae 32768] [--k 32]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import sae  # noqa: E402


def by_sort(h, k):
    """topk_relu's result, the k largest found by sorting each row whole."""
    top = np.argsort(h, -1)[..., -k:]
    f = np.zeros_like(h)
    np.put_along_axis(f, top, np.maximum(np.take_along_axis(h, top, -1), 0.0), -1)
    return f


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--d-sae", type=int, default=32768)
    p.add_argument("--k", type=int, default=32)
    args = p.parse_args()
    h = np.random.default_rng(0).standard_normal((args.tokens, args.d_sae)).astype(np.float32)
    assert (sae.topk_relu(h, args.k) == by_sort(h, args.k)).all()
    times = {}
    for name, fn in (("argpartition", sae.topk_relu), ("argsort", by_sort)):
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            fn(h, args.k)
            runs.append(time.perf_counter() - start)
        times[name] = statistics.median(runs)
    print(f"{args.tokens} x {args.d_sae}, k {args.k}: argpartition {times['argpartition'] * 1e3:.1f} ms, "
          f"argsort {times['argsort'] * 1e3:.1f} ms, ratio {times['argpartition'] / times['argsort']:.3f}")


if __name__ == "__main__":
    main()
