"""A GPT-2 kept in Q8_0: the memory it takes and its speed, all dequantized at load or a layer at
a time (issue 40 §3). No real weights are needed for memory and speed: random ones of a size's
shape cost the same.

    python bench/bench_gguf.py make 1558M            # -> bench/out/gpt2-1558M-random/gpt2-1558M-random.gguf (q8_0)
    python bench/bench_gguf.py run FILE.gguf --mode full      # load_weights: every tensor float32 in memory
    python bench/bench_gguf.py run FILE.gguf --mode layers    # wte, wpe, ln_f float32; each block
                                                              # dequantized from the map when the pass reaches it

`run` prints one JSON line: the seconds to load, to prefill --prompt tokens (with the first new
token), the median seconds of each further new token (greedy, with the KV cache: a step is one pass
through every block), and the process's peak resident memory (ru_maxrss, which counts the
file's pages it touched). Run each mode in its own process, one at a time, under flock /work/bench.lock.
"""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import gpt2_numpy as g  # noqa: E402
from plumbing import gguf, shapes  # noqa: E402
from plumbing.gguf_writer import merges_from_text, write_gguf  # noqa: E402


def make(size, gguf_type):
    hp = shapes.hparams(size)
    rng = np.random.default_rng(0)
    flat = {}
    for name, shape in shapes.tensor_shapes(hp).items():
        flat[name] = np.ones(shape, np.float32) if name.endswith("/g") else \
            rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    vocab = os.path.join(ROOT, "data", "gpt2-vocab")
    with open(os.path.join(vocab, "encoder.json"), encoding="utf-8") as f:
        tokens = list(json.load(f))
    with open(os.path.join(vocab, "vocab.bpe"), encoding="utf-8") as f:
        merges = merges_from_text(f.read())
    name = f"gpt2-{size}-random"
    out = os.path.join(HERE, "out", name, f"{name}-{gguf_type}.gguf")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_gguf(out, shapes.nest(flat, hp["n_layer"]), hp, tokens, merges, shapes.ENDOFTEXT_ID, gguf_type, name)
    print(out)


class LayerAtATime:
    """params["blocks"] whose block i is dequantized from the file when the forward pass reaches it,
    and let go when it moves on: only one block is float32 at a time."""

    def __init__(self, file, hp, path):
        self.file, self.hp, self.path = file, hp, path

    def __len__(self):
        return self.hp["n_layer"]

    def __getitem__(self, i):
        parts = shapes.block_shapes(self.hp["n_embd"], self.hp["n_inner"])
        flat = {f"h{i}/{n}": gguf.read_tensor(self.file, f"h{i}/{n}", s, self.path) for n, s in parts.items()}
        return shapes.nest({n.replace(f"h{i}/", "h0/"): a for n, a in flat.items()}, 1)["blocks"][0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def load(path, mode):
    if mode == "full":
        return gguf.load_gguf(path)
    file = gguf.open_gguf(path)
    hp = gguf.read_hparams(file[0], file[1], path)
    top = shapes.tensor_shapes({**hp, "n_layer": 0})  # wte, wpe, ln_f
    params = shapes.nest({n: gguf.read_tensor(file, n, s, path) for n, s in top.items()}, 0)
    params["blocks"] = LayerAtATime(file, hp, path)
    return hp, params


def run(path, mode, n_prompt, n_new):
    t0 = time.perf_counter()
    hp, params = load(path, mode)
    t1 = time.perf_counter()
    ids = np.random.default_rng(1).integers(0, hp["n_vocab"], n_prompt).tolist()
    stamps = [time.perf_counter()]
    for _ in g.generate(ids, params, hp, n_tokens=n_new, top_k=1, seed=0):  # greedy, with the KV cache
        stamps.append(time.perf_counter())
    steps = np.diff(stamps[1:])
    print(json.dumps({"file": os.path.basename(path), "mode": mode, "load_s": round(t1 - t0, 2),
                      "prefill_s": round(stamps[1] - stamps[0], 2), "prompt": n_prompt,
                      "s_per_new_token": round(float(np.median(steps)), 3), "new": n_new,
                      "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("size", choices=list(shapes.SIZES))
    m.add_argument("--gguf-type", default="q8_0", choices=["f32", "f16", "q8_0"])
    r = sub.add_parser("run")
    r.add_argument("file")
    r.add_argument("--mode", choices=["full", "layers"], required=True)
    r.add_argument("--prompt", type=int, default=64)
    r.add_argument("--new", type=int, default=8)
    args = p.parse_args()
    if args.command == "make":
        make(args.size, args.gguf_type)
    else:
        run(args.file, args.mode, args.prompt, args.new)


if __name__ == "__main__":
    main()
