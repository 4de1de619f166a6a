"""Fine-tuning speed: one training step of train.py (forward, backward, clipping, AdamW).

    python bench/make_random_checkpoint.py 124M      # once (needs tensorflow-cpu)
    python bench/bench_train.py --batch-size 4 --context 64 [--steps 4]

Medians over the steps after the first; peak RSS of the process (weights, gradients, the two
moments and the activations). Not yet here: torch and llm.c side by side (the fine-tuning issue).
"""
import argparse
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import train  # noqa: E402
from checkpoint import load_checkpoint  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default=os.path.join(HERE, "out", "124M-random"))
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    hp, params = load_checkpoint(args.folder)
    params = train.trainable(params)
    state = train.new_adamw_state(params)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, hp["n_vocab"], 100_000)
    times = {"forward and backward": [], "AdamW": []}
    for _ in range(args.steps):
        x, y = train.batch(tokens, args.batch_size, args.context, rng)
        t0 = time.perf_counter()
        _, grads = train.loss_and_grads(x, y, params, hp["n_head"])
        t1 = time.perf_counter()
        train.clip_grad_norm(grads, 1.0)
        train.adamw_step_fast(params, grads, state, 1e-4, weight_decay=0.1)
        t2 = time.perf_counter()
        times["forward and backward"].append(t1 - t0)
        times["AdamW"].append(t2 - t1)
    med = {k: statistics.median(v[1:] or v) for k, v in times.items()}
    step = sum(med.values())
    print(f"B={args.batch_size}, T={args.context}: " + ", ".join(f"{k} {v:.3f} s" for k, v in med.items()) +
          f"; step {step:.3f} s ({args.batch_size * args.context / step:.0f} tok/s); "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")


if __name__ == "__main__":
    main()
