"""Two checkouts' gpt2_numpy.py in one process, alternated call by call: is a change faster or slower?

    git worktree add /tmp/before main                  # the code before a change
    python bench/bench_ab.py --baseline /tmp/before [--what prefill --tokens 256] [--pairs 30]

On a shared machine the speed drifts by more than the changes we want to see, and a
whole-process benchmark run after another can meet a different machine. Here both versions
use the same loaded weights, in the same process, one call after the other (ABBA order),
so drift hits both alike. Prints the medians and the median of the per-pair ratios
(this checkout / baseline: for prefill, the time; for decode, the tokens/s).
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import gpt2_numpy as ours  # noqa: E402
from plumbing.checkpoint import load_checkpoint  # noqa: E402


def load_baseline(folder):
    spec = importlib.util.spec_from_file_location("baseline_gpt2_numpy", os.path.join(folder, "gpt2_numpy.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its own imports resolve to this checkout's helpers; the model is its own
    return module


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="the other checkout")
    p.add_argument("--folder", default=os.path.join(HERE, "out", "124M-random"))
    p.add_argument("--what", choices=["prefill", "decode"], default="prefill")
    p.add_argument("--tokens", type=int, default=256, help="prefill length, or the decode prompt's")
    p.add_argument("--pairs", type=int, default=30)
    args = p.parse_args()
    base = load_baseline(args.baseline)
    hp, params = load_checkpoint(args.folder)
    ids = np.random.default_rng(0).integers(0, hp["n_vocab"], args.tokens)[None]

    def prefill(m):
        cache = m.new_kv_cache(hp, 1, args.tokens)
        t = time.perf_counter()
        m.gpt2(ids, params, hp["n_head"], cache, last_only=True)
        return time.perf_counter() - t

    def decode(m, n=32):
        steps = m.generate(ids[0].tolist(), params, hp, n + 1, temperature=0, stop=None)
        next(steps)
        t = time.perf_counter()
        for _ in steps:
            pass
        return n / (time.perf_counter() - t)

    run = prefill if args.what == "prefill" else decode
    run(ours), run(base)  # warm-up: page the weights in
    got = {"ours": [], "baseline": []}
    for i in range(args.pairs):
        for name, m in ((("ours", ours), ("baseline", base)) if i % 2 == 0 else (("baseline", base), ("ours", ours))):
            got[name].append(run(m))
    unit = "s" if args.what == "prefill" else "tok/s"
    ratios = [a / b for a, b in zip(got["ours"], got["baseline"])]
    print(f"{args.what} {args.tokens} tokens, {args.pairs} pairs: ours {statistics.median(got['ours']):.4f} {unit}, "
          f"baseline {statistics.median(got['baseline']):.4f} {unit}; median pair ratio ours/baseline "
          f"{statistics.median(ratios):.3f} (quartiles {np.percentile(ratios, 25):.3f}..{np.percentile(ratios, 75):.3f})")


if __name__ == "__main__":
    main()
