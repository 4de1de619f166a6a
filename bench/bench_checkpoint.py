"""Checkpoint reading: load_checkpoint with a warm page cache, and verify throughput.

    python bench/make_random_checkpoint.py 124M      # once (needs tensorflow-cpu)
    python bench/bench_checkpoint.py [--size 124M] [--repeats 5]

Goals (issue 2): load under 50 ms; verify at least 300 MB/s. Medians of --repeats runs.
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from plumbing import checkpoint  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="124M")
    p.add_argument("--folder", help="checkpoint folder (default bench/out/<size>-random)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    folder = args.folder or os.path.join(HERE, "out", f"{args.size}-random")
    if not os.path.exists(os.path.join(folder, "model.ckpt.index")):
        raise SystemExit(f"no checkpoint in {folder}: run python bench/make_random_checkpoint.py {args.size}")
    checkpoint.verify_checkpoint(folder)  # warms the page cache
    loads, verifies = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        checkpoint.load_checkpoint(folder)
        loads.append(time.perf_counter() - t)
        t = time.perf_counter()
        nbytes = checkpoint.verify_checkpoint(folder)
        verifies.append(time.perf_counter() - t)
    load_ms, verify_s = 1e3 * statistics.median(loads), statistics.median(verifies)
    print(f"{folder}: {nbytes / 1e6:,.0f} MB of tensors")
    print(f"load_checkpoint (warm): {load_ms:.1f} ms (goal < 50 ms)")
    print(f"verify: {verify_s:.2f} s = {nbytes / 1e6 / verify_s:,.0f} MB/s (goal >= 300 MB/s)")


if __name__ == "__main__":
    main()
