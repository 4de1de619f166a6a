"""Model speed: gpt2_numpy against transformers' GPT2LMHeadModel (torch), same weights, same run.

    python bench/make_random_checkpoint.py 124M          # once (needs tensorflow-cpu)
    python bench/bench_model.py --size 124M [--threads 2] [--repeats 3] [--baseline DIR]

--baseline DIR also measures the gpt2_numpy.py of another checkout (say, main before a
change: `git worktree add DIR main`), interleaved with this one and with HF's.

Measured, each in its own worker process, ours and Hugging Face's interleaved:
  decode   batch 1, a 16-token prompt then 128 new tokens, greedy: tokens/s after the first token
  prefill  16, 256 and 1024 tokens through an empty KV cache, logits for the last position
  rss      the worker's peak resident memory (the weights are memory-mapped for ours)
and process start to first token of `python gpt2_numpy.py PROMPT --model 124M` with a warm page cache
(a released size from a models folder, with every per-run check of its files).
Figures are medians; the ratio column is ours / Hugging Face from the same run.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKER = r'''
import json, os, resource, sys, time
sys.path.insert(0, ROOT)
import numpy as np
try:
    from plumbing.checkpoint import load_checkpoint
except ImportError:  # a baseline from before checkpoint.py had its own file
    from download import load_checkpoint
hp, params = load_checkpoint(FOLDER)
rng = np.random.default_rng(0)
prompt = rng.integers(0, hp["n_vocab"], 16)
prefill_ids = {T: rng.integers(0, hp["n_vocab"], T) for T in (16, 256, 1024)}
out = {"decode": [], "prefill": {T: [] for T in prefill_ids}}

if WHICH in ("ours", "baseline"):
    import gpt2_numpy as g
    try:
        from plumbing.memory import keep_freed_memory
        keep_freed_memory()  # as gpt2_numpy.py's command does (interface/start.py)
    except ImportError:  # a baseline from before it
        pass

    def decode():
        steps = g.generate(prompt.tolist(), params, hp, 128, temperature=0, stop=None)
        ids = [int(next(steps)[0])]
        t = time.perf_counter()
        ids += [int(s[0]) for s in steps]
        return 127 / (time.perf_counter() - t), ids

    def prefill(ids):
        cache = g.new_kv_cache(hp, 1, len(ids))
        t = time.perf_counter()
        g.gpt2(ids[None], params, hp, cache, last_only=True)
        return time.perf_counter() - t
else:
    import torch, transformers
    torch.set_num_threads(THREADS)
    config = transformers.GPT2Config(vocab_size=hp["n_vocab"], n_positions=hp["n_ctx"], n_embd=hp["n_embd"],
                                     n_layer=hp["n_layer"], n_head=hp["n_head"], activation_function="gelu_new")
    state = {"transformer.wte.weight": params["wte"], "transformer.wpe.weight": params["wpe"],
             "transformer.ln_f.weight": params["ln_f"]["g"], "transformer.ln_f.bias": params["ln_f"]["b"]}
    for i, b in enumerate(params["blocks"]):
        for part, layer in [("ln_1", b["ln_1"]), ("ln_2", b["ln_2"]), ("attn.c_attn", b["attn"]["c_attn"]),
                            ("attn.c_proj", b["attn"]["c_proj"]), ("mlp.c_fc", b["mlp"]["c_fc"]),
                            ("mlp.c_proj", b["mlp"]["c_proj"])]:
            for ours, theirs in (("g", "weight"), ("w", "weight"), ("b", "bias")):
                if ours in layer:
                    state[f"transformer.h.{i}.{part}.{theirs}"] = layer[ours]
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=False, assign=True)
    model.tie_weights()
    model.eval()

    @torch.inference_mode()
    def decode():
        o = model(torch.from_numpy(prompt[None]), use_cache=True, logits_to_keep=1)
        nxt = o.logits[:, -1].argmax(-1, keepdim=True)
        ids, past = [int(nxt)], o.past_key_values
        t = time.perf_counter()
        for _ in range(127):
            o = model(nxt, past_key_values=past, use_cache=True)
            past = o.past_key_values
            nxt = o.logits[:, -1].argmax(-1, keepdim=True)
            ids.append(int(nxt))
        return 127 / (time.perf_counter() - t), ids

    @torch.inference_mode()
    def prefill(ids):
        x = torch.from_numpy(ids[None])
        t = time.perf_counter()
        model(x, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - t

decode()  # warm-up: page the weights in, let BLAS and torch settle
prefill(prefill_ids[16])
for _ in range(REPEATS):
    rate, ids = decode()
    out["decode"].append(rate)
    for T, ids_T in prefill_ids.items():
        out["prefill"][T].append(prefill(ids_T))
out["ids"] = ids
out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
'''


def worker(which, folder, threads, repeats, root=ROOT):
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads)}
    code = f"ROOT={root!r}; FOLDER={folder!r}; WHICH={which!r}; THREADS={threads}; REPEATS={repeats}\n" + WORKER
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def first_token_seconds(folder, threads, runs=5, root=ROOT, size="124M"):
    """Wall time from starting `python gpt2_numpy.py PROMPT --model SIZE` (as the README runs it:
    a released size from a models folder, here a link to `folder`) to its first generated byte."""
    prompt = "Alan Turing theorized that computers would one day become"
    models = os.path.join(HERE, "out", "models-for-first-token")
    os.makedirs(models, exist_ok=True)
    link = os.path.join(models, size)
    if not os.path.islink(link):
        os.symlink(os.path.abspath(folder), link)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "GPT2_MODELS_DIR": models, "GPT2_BASE_URL": "http://127.0.0.1:9"}  # nothing may be fetched
    times = []
    for _ in range(runs + 1):  # the first run warms the page cache (and may check the CRCs once)
        start = time.perf_counter()
        p = subprocess.Popen([sys.executable, os.path.join(root, "gpt2_numpy.py"), prompt, "--model", size,
                              "--n-tokens", "5", "--greedy", "--no-stop", "--quiet"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        got = b""
        while len(got) <= len(prompt):
            chunk = p.stdout.read1(4096)
            if not chunk:
                break
            got += chunk
        times.append(time.perf_counter() - start)
        err = p.communicate()[1]
        if p.returncode:
            raise SystemExit(err.decode(errors="replace")[-2000:])
    return statistics.median(times[1:])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="124M")
    p.add_argument("--folder", help="checkpoint folder (default bench/out/<size>-random)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="ours/HF worker pairs, interleaved")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--baseline", help="another checkout whose gpt2_numpy.py is measured too, interleaved")
    args = p.parse_args()
    folder = args.folder or os.path.join(HERE, "out", f"{args.size}-random")
    if not os.path.exists(os.path.join(folder, "model.ckpt.index")):
        raise SystemExit(f"no checkpoint in {folder}: run python bench/make_random_checkpoint.py {args.size}")
    which = ["ours"] + (["baseline"] if args.baseline else [])
    roots = {"baseline": args.baseline}
    if not args.skip_hf:
        if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
            which.append("hf")
        else:
            print("transformers or torch is not installed: measuring ours alone")
    runs = {w: [] for w in which}
    for _ in range(args.rounds):
        for w in which:
            runs[w].append(worker(w, folder, args.threads, args.repeats, roots.get(w, ROOT)))
    med = {}
    for w, rs in runs.items():
        med[w] = {"decode tok/s": statistics.median(x for r in rs for x in r["decode"])}
        for T in ("16", "256", "1024"):
            med[w][f"prefill {T} (s)"] = statistics.median(x for r in rs for x in r["prefill"][T])
        med[w]["peak RSS (MB)"] = max(r["rss_mb"] for r in rs)
    print(f"{args.size} shape, random weights, {args.threads} threads, medians of "
          f"{args.rounds * args.repeats} runs")
    print(f"{'':<18}{'ours':>12}" + (f"{'baseline':>12}{'ours/base':>10}" if "baseline" in med else "")
          + (f"{'HF torch':>12}{'ours/HF':>10}" if "hf" in med else ""))
    for key in med["ours"]:
        line = f"{key:<18}{med['ours'][key]:>12.3f}"
        for other in ("baseline", "hf"):
            if other in med:
                line += f"{med[other][key]:>12.3f}{med['ours'][key] / med[other][key]:>10.2f}"
        print(line)
    if "hf" in med:
        same = sum(a == b for a, b in zip(runs["ours"][0]["ids"], runs["hf"][0]["ids"]))
        print(f"greedy ids equal to HF's: {same} of 128")
        print(f"decode speed-up: {med['ours']['decode tok/s'] / med['hf']['decode tok/s']:.2f}x; "
              f"1024-token prefill: HF time / ours = {med['hf']['prefill 1024 (s)'] / med['ours']['prefill 1024 (s)']:.2f}x")
    firsts = {w: [] for w in which if w != "hf"}
    for _ in range(3):  # interleaved, each a median of 5 runs
        for w in firsts:
            firsts[w].append(first_token_seconds(folder, args.threads, root=roots.get(w, ROOT), size=args.size))
    for w, times in firsts.items():
        print(f"process start to first token (warm cache), {w}: {statistics.median(times):.3f} s")


if __name__ == "__main__":
    main()
