"""Decode against its floor: how close one generated token comes to its matrix-vector products alone.

    python bench/make_random_checkpoint.py 124M          # once (needs tensorflow-cpu)
    python bench/bench_decode.py [--folder DIR] [--rounds 15] [--tokens 32] [--threads N]

A token of batch-1 decoding reads every weight once: per block c_attn, attn.c_proj, c_fc and
mlp.c_proj, then the logits' wteᵀ. Those products alone, on the same memory-mapped arrays,
one after another with nothing between them, are the floor ("the bound"): memory bandwidth,
not arithmetic, sets it. Everything else a token costs (layer norms, the KV-cache attention,
gelu, splitting heads, sampling, Python's calls) is the overhead this measures.

Each round times `--tokens` greedy tokens of gpt2_numpy.generate after a 16-token prompt, then
the bound as many times, in the same process, so drift on a shared machine hits both alike.
Prints the medians, the overhead per token, and the median of the rounds' bound / decode.
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import gpt2_numpy as g  # noqa: E402
from plumbing.blas import set_threads  # noqa: E402
from plumbing.checkpoint import load_checkpoint  # noqa: E402
from plumbing.memory import keep_freed_memory  # noqa: E402


def products(params):
    """The matrices one token multiplies, in the order the model uses them: [(w, n_in)]."""
    ws = [b[part][name]["w"] for b in params["blocks"] for part, name in
          (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj"))]
    return ws + [params["wte"].T]


def bound_seconds(ws, vectors):
    """One token's products alone: x [1, 1, n_in] @ w for each matrix, as the model shapes x."""
    t = time.perf_counter()
    for w in ws:
        vectors[w.shape[0]] @ w
    return time.perf_counter() - t


def decode_seconds(params, hp, prompt, n):
    """Seconds per token of greedy decoding, after the first token (the prompt's prefill)."""
    steps = g.generate(prompt, params, hp, n + 1, temperature=0, stop=None)
    next(steps)
    t = time.perf_counter()
    for _ in steps:
        pass
    return (time.perf_counter() - t) / n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default=os.path.join(HERE, "out", "124M-random"))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--threads", type=int, help="BLAS's threads (and the element-wise work's); default: as loaded")
    args = p.parse_args()
    if args.threads:
        set_threads(args.threads)
    hp, params = load_checkpoint(args.folder)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, hp["n_vocab"], 16).tolist()
    ws = products(params)
    vectors = {n: rng.standard_normal((1, 1, n)).astype(np.float32) for n in {w.shape[0] for w in ws}}
    decode_seconds(params, hp, prompt, 4), bound_seconds(ws, vectors)  # warm-up: page the weights in
    decode, bound = [], []
    for _ in range(args.rounds):
        decode.append(decode_seconds(params, hp, prompt, args.tokens))
        bound.append(statistics.median(bound_seconds(ws, vectors) for _ in range(args.tokens)))
    d, b = statistics.median(decode), statistics.median(bound)
    ratios = [bi / di for bi, di in zip(bound, decode)]
    print(f"{hp['n_layer']} layers, C={hp['n_embd']}, {args.rounds} rounds of {args.tokens} tokens")
    print(f"decode {d * 1e3:.2f} ms/token ({1 / d:.1f} tok/s); bound {b * 1e3:.2f} ms; overhead {(d - b) * 1e3:.2f} ms/token "
          f"({(d - b) / hp['n_layer'] * 1e6:.0f} us a block)")
    print(f"bound / decode: median of rounds {statistics.median(ratios):.3f} "
          f"(quartiles {np.percentile(ratios, 25):.3f}..{np.percentile(ratios, 75):.3f})")


if __name__ == "__main__":
    keep_freed_memory()  # as gpt2_numpy.py's command does (interface/start.py)
    main()
