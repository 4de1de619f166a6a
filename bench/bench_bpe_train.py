"""Learning a vocabulary: bpe.py's trainer against Hugging Face tokenizers' ByteLevelBPETokenizer.

    python bench/bench_bpe_train.py [--vocab-size 4096] [--rounds 3] [--file data/tinyshakespeare.txt]
    python bench/bench_bpe_train.py --vocab-size 100000 --rate 1000   # ours alone: merges/s as it goes

Each round runs both, one after the other in one process (so the machine's drift hits both);
prints each one's median and the median of the per-round ratios. tokenizers is dev-only
(`pip install tokenizers`); without it, ours alone is timed. --rate N: one run of ours, with
its speed over each N merges, to see that the last merges cost what the first did.
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

import bpe  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", default=os.path.join(ROOT, "data", "tinyshakespeare.txt"))
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=int, metavar="N", help="ours alone, once: merges/s over each N merges")
    args = p.parse_args()
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    if args.rate:
        return print_rates(text, args.vocab_size, args.rate)
    hf = importlib.util.find_spec("tokenizers") is not None
    times = {"bpe.py": [], "tokenizers": []}
    for _ in range(args.rounds):
        t = time.perf_counter()
        merges = bpe.train_merges_fast(text, args.vocab_size - 257)
        times["bpe.py"].append(time.perf_counter() - t)
        if hf:
            from tokenizers import ByteLevelBPETokenizer
            t = time.perf_counter()
            ByteLevelBPETokenizer().train([args.file], vocab_size=args.vocab_size, min_frequency=0,
                                          show_progress=False)
            times["tokenizers"].append(time.perf_counter() - t)
    print(f"{os.path.basename(args.file)} ({len(text.encode()):,} bytes), --vocab-size {args.vocab_size}: "
          f"{len(merges)} merges, {args.rounds} rounds")
    for name, ts in times.items():
        if ts:
            print(f"  {name:<12}{statistics.median(ts):8.2f} s (median)")
    if hf:
        ratio = statistics.median(a / b for a, b in zip(times["bpe.py"], times["tokenizers"]))
        print(f"  bpe.py / tokenizers: {ratio:.2f}x the time (median of the rounds' ratios)")


def print_rates(text, vocab_size, every):
    """One run of ours; merges/s over each `every` merges (the first window includes pre-tokenizing)."""
    marks = [time.perf_counter()]

    def on_merge(k):
        if (k + 1) % every == 0:
            marks.append(time.perf_counter())

    merges = bpe.train_merges_fast(text, vocab_size - 257, on_merge)
    end = time.perf_counter()
    print(f"--vocab-size {vocab_size}: {len(merges):,} merges in {end - marks[0]:.1f} s"
          f"{'' if len(merges) == vocab_size - 257 else ' (no pair left)'}")
    for i in range(1, len(marks)):
        print(f"  merges {(i - 1) * every + 1:>7,}-{i * every:<7,} {every / (marks[i] - marks[i - 1]):10,.0f} merges/s")


if __name__ == "__main__":
    main()
