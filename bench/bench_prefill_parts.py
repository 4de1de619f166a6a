"""Where a prefill's time goes: each stage of every block, timed on its own at the model's shapes.

    python bench/make_random_checkpoint.py 124M          # once (needs tensorflow-cpu)
    python bench/bench_prefill_parts.py [--tokens 1021] [--repeats 5] [--threads N]

Runs the blocks of gpt2_numpy.py's forward pass one stage at a time (the same functions the
model calls, in its order) on a prompt of --tokens random ids, and sums each stage's time over
the blocks: the four matrix products, attention (blocked_attention_fast: its own products, softmax
and mask), gelu, the layer norms, merging heads and the residual adds; and, not in the sum, the
plain blocked_attention on the same arrays. Then the whole gpt2() call, for comparison. Medians
over --repeats passes.
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
from plumbing.parallel import in_chunks  # noqa: E402


def one_pass(x, params, n_head, plain=False):
    """The blocks, stage by stage. -> {stage: seconds summed over the blocks}"""
    spent = {}

    def timed(stage, f, *args, **kwargs):
        t = time.perf_counter()
        y = f(*args, **kwargs)
        spent[stage] = spent.get(stage, 0.0) + time.perf_counter() - t
        return y

    for block in params["blocks"]:
        h = timed("layer norms", g.layer_norm_fast, x, **block["ln_1"])
        qkv = timed("matrix products", g.linear, h, **block["attn"]["c_attn"])
        q, k, v = (g.split_heads(a, n_head) for a in np.split(qkv, 3, axis=-1))
        z = timed("attention", g.blocked_attention_fast, q, k, v)
        if plain:  # the plain form beside it, not in the sum: what the fast one saves
            timed("(plain blocked_attention)", g.blocked_attention, q, k, v)
        z = timed("merge heads", g.merge_heads, z)
        x = timed("residual adds", np.add, x, timed("matrix products", g.linear, z, **block["attn"]["c_proj"]))
        h = timed("layer norms", g.layer_norm_fast, x, **block["ln_2"])
        a = timed("gelu", in_chunks, g.gelu_fast, timed("matrix products", g.linear, h, **block["mlp"]["c_fc"]))
        x = timed("residual adds", np.add, x, timed("matrix products", g.linear, a, **block["mlp"]["c_proj"]))
    return spent


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default=os.path.join(HERE, "out", "124M-random"))
    p.add_argument("--tokens", type=int, default=1021)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, help="BLAS's threads (and the element-wise work's); default: as loaded")
    args = p.parse_args()
    if args.threads:
        set_threads(args.threads)
    hp, params = load_checkpoint(args.folder)
    ids = np.random.default_rng(0).integers(0, hp["n_vocab"], (1, args.tokens))
    x = params["wte"][ids] + params["wpe"][:args.tokens]
    one_pass(x, params, hp["n_head"])  # warm-up: page the weights in
    passes = [one_pass(x, params, hp["n_head"], plain=True) for _ in range(args.repeats)]
    whole = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        g.gpt2(ids, params, hp, last_only=True)
        whole.append(time.perf_counter() - t)
    print(f"{args.tokens}-token prefill, {hp['n_layer']} blocks, medians of {args.repeats}")
    for stage in passes[0]:
        print(f"  {stage:18s} {statistics.median(s[stage] for s in passes):.3f} s")
    summed = [sum(v for stage, v in s.items() if not stage.startswith("(")) for s in passes]
    print(f"  {'sum of stages':18s} {statistics.median(summed):.3f} s")
    print(f"  {'gpt2() whole':18s} {statistics.median(whole):.3f} s")


if __name__ == "__main__":
    keep_freed_memory()  # as gpt2_numpy.py's command does (interface/start.py)
    main()
