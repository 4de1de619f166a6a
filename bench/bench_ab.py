"""Two checkouts in one process, alternated call by call: is a change faster or slower?

    git worktree add /tmp/before main                  # the code before a change
    python bench/bench_ab.py --baseline /tmp/before --what prefill [--tokens 1021] [--pairs 30]
    python bench/bench_ab.py --baseline /tmp/before --what decode
    python bench/bench_ab.py --baseline /tmp/before --what finetune-step     # 124M, B=4, T=64
    python bench/bench_ab.py --baseline /tmp/before --what scratch-step      # the README's from-scratch recipe

On a shared machine the speed drifts by more than the changes we want to see, and a
whole-process benchmark run after another can meet a different machine. Here both versions
run in the same process, each with its own modules (each checkout is imported on its own,
so its train.py uses its own backward.py), on the same weights, one call after the other
(ABBA order), so drift hits both alike. Prints the medians and the median of the per-pair
ratios (this checkout / baseline: for prefill and the steps, the time; for decode, the tokens/s).
"""
import argparse
import glob
import importlib
import inspect
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

import numpy as np  # noqa: E402


def load_checkout(folder, names):
    """{name: module} of one checkout, imported on its own: its modules never mix with the other's."""
    project = {os.path.basename(p)[:-3] for f in (folder, ROOT) for p in glob.glob(os.path.join(f, "*.py"))}
    project |= {"plumbing", "conftest"}
    mine = [n for n in sys.modules if n.split(".")[0] in project]
    saved, path = {n: sys.modules.pop(n) for n in mine}, sys.path[:]
    sys.path.insert(0, folder)
    try:
        return {n: importlib.import_module(n) for n in names}
    finally:
        for n in [n for n in sys.modules if n.split(".")[0] in project]:
            del sys.modules[n]
        sys.modules.update(saved)
        sys.path[:] = path


def initialising(folder):
    """The module of a checkout that holds init_params: initialise.py until it went into parameters.py."""
    return "initialise" if os.path.exists(os.path.join(folder, "initialise.py")) else "parameters"


def model_runs(args, hp, params, ids):
    def prefill(m):
        g = m["gpt2_numpy"]
        cache = g.new_kv_cache(hp, 1, args.tokens)
        t = time.perf_counter()
        g.gpt2(ids, params, hp, cache, last_only=True)
        return time.perf_counter() - t

    def decode(m, n=32):
        steps = m["gpt2_numpy"].generate(ids[0].tolist(), params, hp, n + 1, temperature=0, stop=None)
        next(steps)
        t = time.perf_counter()
        for _ in steps:
            pass
        return n / (time.perf_counter() - t)

    return prefill if args.what == "prefill" else decode


SCRATCH = {"n_vocab": 257, "n_ctx": 64, "n_embd": 128, "n_head": 4, "n_layer": 4}
RECIPES = {"finetune-step": dict(batch_size=4, context=64, lr=1e-4, warmup=20, weight_decay=0.1, beta2=0.999),
           "scratch-step": dict(batch_size=12, context=64, lr=1e-3, warmup=100, weight_decay=0.1, beta2=0.99)}


def step_run(args, m, hp, params, train_ids):
    """A function that makes one training step of checkout m and returns its time."""
    train = m["train"]
    params = (getattr(train, "writable_copy", None) or train.trainable)(params)  # a baseline before the rename too
    state = m["optimizer"].new_adamw_state(params)
    recipe = dict(RECIPES[args.what], steps=10 ** 6, accum=1, min_lr_ratio=0.1, grad_clip=1.0, dropout=0.0, seed=0)
    buffers, step = {}, [0]
    takes_recipe = "recipe" in inspect.signature(train.train_step).parameters  # else the settings as keywords
    if hasattr(train, "DATA_KINDS"):  # since a step's data says its kind
        train_ids = {"kind": "documents", "rows": train_ids}

    def run(_):
        t = time.perf_counter()
        if takes_recipe:
            train.train_step(params, hp, state, train_ids, step[0], recipe, buffers)
        else:
            train.train_step(params, hp, state, train_ids, step[0], buffers=buffers, **recipe)
        step[0] += 1
        return time.perf_counter() - t

    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="the other checkout")
    p.add_argument("--folder", default=os.path.join(HERE, "out", "124M-random"))
    p.add_argument("--what", choices=["prefill", "decode", "finetune-step", "scratch-step"], default="prefill")
    p.add_argument("--tokens", type=int, default=256, help="prefill length, or the decode prompt's")
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--threads", type=int, help="BLAS's threads (and so the element-wise work's); default: as loaded")
    args = p.parse_args()
    if args.threads:
        sys.path.insert(0, ROOT)
        from plumbing.blas import set_threads
        set_threads(args.threads)
    names = ["gpt2_numpy", "train", "optimizer"]
    ours = load_checkout(ROOT, names + [initialising(ROOT), "plumbing.checkpoint"])
    base = load_checkout(os.path.abspath(args.baseline), names)
    rng = np.random.default_rng(0)
    if args.what == "scratch-step":
        hp = SCRATCH
        params = ours[initialising(ROOT)].init_params(hp, seed=0)
    else:
        hp, params = ours["plumbing.checkpoint"].load_checkpoint(args.folder)
    if args.what.endswith("-step"):
        train_ids = rng.integers(0, hp["n_vocab"], 100_000)
        run = {"ours": step_run(args, ours, hp, params, train_ids), "baseline": step_run(args, base, hp, params, train_ids)}
    else:
        ids = rng.integers(0, hp["n_vocab"], args.tokens)[None]
        f = model_runs(args, hp, params, ids)
        run = {"ours": lambda _: f(ours), "baseline": lambda _: f(base)}
    run["ours"](0), run["baseline"](0)  # warm-up: page the weights in, make the buffers
    got = {"ours": [], "baseline": []}
    for i in range(args.pairs):
        for name in ("ours", "baseline") if i % 2 == 0 else ("baseline", "ours"):
            got[name].append(run[name](i))
    unit = "tok/s" if args.what == "decode" else "s"
    ratios = [a / b for a, b in zip(got["ours"], got["baseline"])]
    print(f"{args.what} ({args.tokens} tokens)" if args.what in ("prefill", "decode") else args.what,
          f"{args.pairs} pairs: ours {statistics.median(got['ours']):.4f} {unit}, "
          f"baseline {statistics.median(got['baseline']):.4f} {unit}; median pair ratio ours/baseline "
          f"{statistics.median(ratios):.3f} (quartiles {np.percentile(ratios, 25):.3f}..{np.percentile(ratios, 75):.3f})")


if __name__ == "__main__":
    main()
