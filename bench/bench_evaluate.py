"""evaluate.py against EleutherAI's lm-evaluation-harness (HFLM) on the same model, data, batch
size and thread count, each side timed on its scoring alone (not its loading), alternated.

    python bench/bench_evaluate.py --dev-python /path/to/devvenv/bin/python [--rounds 3]

The model is 124M's shape with random weights (bench/out/124M-random, made if missing, and its
Hugging Face folder bench/out/124M-random-hf, written by transformers in the dev virtualenv).
The data is made here, under bench/out/eval/:
  perplexity   the first 1 MB of tinyshakespeare as one document: lm-eval's loglikelihood_rolling,
               against evaluate.perplexity (context = stride = 1024)
  lambada      1,000 LAMBADA-style items (a passage of 40-80 words; the continuation is its last
               word): lm-eval's loglikelihood against evaluate.loglikelihood
  choice       250 four-way items (a 30-word context, endings of 5-20 words), 1,000 pairs
Then evaluate.py alone on 1,000 short items (the first 8-20 words of each passage, the last of
them the continuation) at batch 1 and batch 16, and the tokens scored a second for each task. Each pair of runs is checked to agree (nll within 1e-4 relative). The
dev python runs lm-eval in a subprocess; a round is (ours, theirs) or (theirs, ours), alternating.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import evaluate  # noqa: E402
from plumbing import shapes  # noqa: E402
from interface.loading import load_model  # noqa: E402

OUT = os.path.join(HERE, "out")
MODEL = os.path.join(OUT, "124M-random")
HF = os.path.join(OUT, "124M-random-hf")
DATA = os.path.join(OUT, "eval")

HF_WRITER = """
import sys, numpy as np, torch, transformers
sys.path.insert(0, {root!r})
from plumbing.checkpoint import load_checkpoint
hp, p = load_checkpoint({model!r})
cfg = transformers.GPT2Config(vocab_size=hp["n_vocab"], n_positions=hp["n_ctx"], n_embd=hp["n_embd"],
                              n_layer=hp["n_layer"], n_head=hp["n_head"])
m = transformers.GPT2LMHeadModel(cfg)
sd = {{"transformer.wte.weight": p["wte"], "transformer.wpe.weight": p["wpe"],
      "transformer.ln_f.weight": p["ln_f"]["g"], "transformer.ln_f.bias": p["ln_f"]["b"]}}
for i, b in enumerate(p["blocks"]):
    for ln in ("ln_1", "ln_2"):
        sd[f"transformer.h.{{i}}.{{ln}}.weight"], sd[f"transformer.h.{{i}}.{{ln}}.bias"] = b[ln]["g"], b[ln]["b"]
    for part, layers in (("attn", ("c_attn", "c_proj")), ("mlp", ("c_fc", "c_proj"))):
        for layer in layers:
            sd[f"transformer.h.{{i}}.{{part}}.{{layer}}.weight"] = b[part][layer]["w"]
            sd[f"transformer.h.{{i}}.{{part}}.{{layer}}.bias"] = b[part][layer]["b"]
m.load_state_dict({{k: torch.tensor(np.array(v)) for k, v in sd.items()}}, strict=False)
m.tie_weights()
m.save_pretrained({hf!r})
import shutil
for ours, theirs in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
    shutil.copy({vocab!r} + "/" + ours, {hf!r} + "/" + theirs)
"""


def make_model(dev_python):
    if not os.path.exists(MODEL):
        from parameters import init_params
        from plumbing.checkpoint import write_checkpoint
        hp = shapes.hparams("124M")
        os.makedirs(OUT, exist_ok=True)  # bench/out/ is not in a fresh clone
        write_checkpoint(MODEL, init_params(hp, seed=0), hp, vocab_dir=os.path.join(ROOT, "data", "gpt2-vocab"))
    if not os.path.exists(HF):
        code = HF_WRITER.format(root=ROOT, model=MODEL, hf=HF, vocab=os.path.join(ROOT, "data", "gpt2-vocab"))
        subprocess.run([dev_python, "-c", code], check=True)


def make_data():
    """Every file the bench scores, made from the project's own tinyshakespeare, the same each time."""
    os.makedirs(DATA, exist_ok=True)
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()
    document = text[:text.index("\n", 1_000_000) + 1]
    words = text.split()
    rng = np.random.default_rng(0)
    passages = []
    for _ in range(1000):
        start, n = int(rng.integers(0, len(words) - 100)), int(rng.integers(40, 81))
        passages.append(" ".join(words[start:start + n]))
    lambada = [evaluate.lambada_pair(p) for p in passages]
    items, pairs = [], []
    for _ in range(250):
        start = int(rng.integers(0, len(words) - 200))
        context = " ".join(words[start:start + 30])
        endings = [" " + " ".join(words[s:s + int(rng.integers(5, 21))])
                   for s in rng.integers(0, len(words) - 30, 4)]
        items.append({"context": context, "choices": endings, "answer": 0})
        pairs += [(context, e) for e in endings]
    short = [evaluate.lambada_pair(" ".join(p.split()[:int(rng.integers(8, 21))])) for p in passages]
    files = {"perplexity": [document], "lambada": lambada, "choice": pairs, "short": short}
    for name, value in files.items():
        with open(os.path.join(DATA, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(value, f)
    return files


def ours(task, items, model, batch):
    encoder, hp, params = model
    start = time.perf_counter()
    if task == "perplexity":
        result = [evaluate.perplexity(items, encoder, params, hp, batch_size=batch)["nll"]]
    else:
        result = [ll for ll, _ in evaluate.loglikelihood(items, encoder, params, hp, batch_size=batch)]
    return time.perf_counter() - start, result


def theirs(task, dev_python, batch, threads):
    kind = "rolling" if task == "perplexity" else "loglikelihood"
    out = subprocess.run([dev_python, os.path.join(HERE, "lmeval_worker.py"), kind, HF,
                          os.path.join(DATA, task + ".json"), str(batch), str(threads)],
                         check=True, capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    result = [-x for x in got["result"]] if task == "perplexity" else [ll for ll, _ in got["result"]]
    return got["seconds"], result


def tokens_scored(task, items, encoder):
    if task == "perplexity":
        return sum(len(encoder.encode(d)) for d in items)
    return sum(len(evaluate.continuation_ids(c, x, encoder)[0][-1024:]) +
               len(evaluate.continuation_ids(c, x, encoder)[1]) for c, x in items)


def blas_kernel():
    try:
        from threadpoolctl import threadpool_info
        return ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')} x{i['num_threads']}"
                         for i in threadpool_info() if i["user_api"] == "blas")
    except ImportError:
        return "unknown (threadpoolctl not installed)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dev-python", required=True, help="a python with torch, transformers and lm-eval")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--tasks", default="lambada,choice,perplexity", help="against lm-eval; '' for none")
    ap.add_argument("--batch-rounds", type=int, default=3, help="ours alone at batch 1 and 16 on 1,000 short "
                    "items (8-20 words), alternated; 0: not run")
    args = ap.parse_args()
    threads = os.cpu_count()
    make_model(args.dev_python)
    files = make_data()
    model = load_model(MODEL, OUT, None)
    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(not set)')}; BLAS: {blas_kernel()}; "
          f"threads {threads}; batch {args.batch_size}")
    for task in filter(None, args.tasks.split(",")):
        items = files[task]
        n_tokens = tokens_scored(task, items, model[0])
        times = {"ours": [], "lm-eval": []}
        for r in range(args.rounds):
            order = ("ours", "lm-eval") if r % 2 == 0 else ("lm-eval", "ours")
            results = {}
            for who in order:
                seconds, results[who] = (ours(task, items, model, args.batch_size) if who == "ours" else
                                         theirs(task, args.dev_python, args.batch_size, threads))
                times[who].append(seconds)
            a, b = np.array(results["ours"]), np.array(results["lm-eval"])
            worst = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-9)))
            assert worst < 1e-4, f"{task}: ours and lm-eval disagree by {worst:.2e} (relative)"
        mo, mt = statistics.median(times["ours"]), statistics.median(times["lm-eval"])
        ratios = [o / t for o, t in zip(times["ours"], times["lm-eval"])]
        print(f"{task:10s} {len(items):5d} requests {n_tokens:8,d} tokens | ours {mo:7.2f} s "
              f"({n_tokens / mo:6.0f} tok/s) | lm-eval {mt:7.2f} s ({n_tokens / mt:6.0f} tok/s) | "
              f"ours/lm-eval {statistics.median(ratios):.2f} (rounds {args.rounds}, largest difference {worst:.1e})")
    if args.batch_rounds:
        items = files["short"]
        n_tokens = tokens_scored("short", items, model[0])
        times = {1: [], 16: []}
        for r in range(args.batch_rounds):
            for batch in ((1, 16) if r % 2 == 0 else (16, 1)):
                times[batch].append(ours("short", items, model, batch)[0])
        m1, m16 = statistics.median(times[1]), statistics.median(times[16])
        print(f"short      {len(items):5d} requests {n_tokens:8,d} tokens | ours, batch 1 {m1:.2f} s "
              f"({n_tokens / m1:.0f} tok/s), batch 16 {m16:.2f} s ({n_tokens / m16:.0f} tok/s): batch 16 is "
              f"{m1 / m16:.2f}x as fast (rounds {args.batch_rounds})")


if __name__ == "__main__":
    main()
