"""Speculative decoding's speed: plain decode, --draft MODEL and --draft lookup, with Hugging Face's
assisted generation on the same pair beside them.

    python bench/train_speculative_pair.py        # the trained pair, once: bench/out/spec-target, spec-draft
    python bench/bench_speculative.py --model bench/out/spec-target --draft bench/out/spec-draft
    python convert.py bench/out/spec-target bench/out/spec-target-hf --to hf     # Hugging Face's folders
    python convert.py bench/out/spec-draft bench/out/spec-draft-hf --to hf
    python bench/bench_speculative.py --model bench/out/spec-target --draft bench/out/spec-draft \\
        --hf-model bench/out/spec-target-hf --hf-draft bench/out/spec-draft-hf --torch-python /work/devvenv/bin/python

The worst case, a draft that never agrees (random weights) with a large model:

    python bench/bench_speculative.py --model random:1558M --draft random:124M --n-tokens 24 --repeats 2

random:SIZE is a model of that size's shape with GPT-2's initialisation (initialise.py, seed 0) and
GPT-2's vocabulary, written once to bench/out/SIZE-random-init/ (1558M: 6.2 GB on disk, and about
twice that in memory while it is written); a folder from bench/make_random_checkpoint.py does as well.

Each row decodes --n-tokens tokens (no stop token) after the same prompt, the first --prompt-tokens
ids of the held-out end of data/tinyshakespeare.txt in the model's own vocabulary, at greedy and at
temperature 1 (no top-k, no top-p: every flag at its default). Its time is the whole call, prefill
included, the median of --repeats runs; the rows take turns within each repeat, so a busy machine
slows them alike. tokens/s is n_tokens over that time. The acceptance rate is accepted / proposed
(ours from draft_counts; Hugging Face's is not reported by generate). At greedy every row must give
plain decode's ids: the bench says so, and stops if ours do not.

After the table, the figures that bound it (pass_costs): t(n), the model's pass over n positions
through its cache as a multiple of a pass over one, and c, a draft step as a multiple of the
model's; so the best a round can do, every drafted token accepted, is (K + 1) / (K c + t(K + 1)).

Hugging Face's rows run in a process of their own (--torch-python, a Python with torch and
transformers), one a repeat, after ours, so that the two take turns; each process warms up on a
call of each row before the one it times. On the same threads: assistant_model with
num_assistant_tokens = K and the "constant" schedule (our K, fixed), then with its default
"heuristic" schedule (K grows while drafts pass and shrinks when they fall), and
prompt_lookup_num_tokens = K (its n-grams: 1..2, ours: 1..3).
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


def model_folder(name):
    """A model folder: name itself, or for random:SIZE the random model of that shape, written once."""
    if not name.startswith("random:"):
        return name
    size = name.split(":", 1)[1]
    folder = os.path.join(HERE, "out", f"{size}-random-init")
    if not os.path.exists(os.path.join(folder, "hparams.json")):
        from parameters import init_params
        from plumbing import shapes
        from plumbing.checkpoint import write_checkpoint

        print(f"writing {folder} (random weights, once)", file=sys.stderr)
        hparams = shapes.hparams(size)
        os.makedirs(os.path.dirname(folder), exist_ok=True)  # bench/out/ is not in a fresh clone
        write_checkpoint(folder, init_params(hparams), hparams, vocab_dir=os.path.join(ROOT, "data", "gpt2-vocab"))
    return folder


def prompt_ids(encoder, n):
    """The first n ids of the held-out end of the Shakespeare (train.py holds out the last 10%)."""
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()
    held_out = text[int(len(text) * 0.9):]
    held_out = held_out[held_out.index("\n\n") + 2:]  # from the start of a speech
    return encoder.encode(held_out[:20 * n])[:n]


def load_pair(args):
    """(encoder, (params, hparams), (draft_params, draft_hparams)) for --model and --draft, or exit."""
    from interface import loading

    encoder, hparams, params = loading.load_model(args.model, quiet=True)
    draft_encoder, draft_hparams, draft_params = loading.load_model(args.draft, quiet=True)
    if draft_encoder.token_bytes != encoder.token_bytes:
        sys.exit(f"{args.draft} and {args.model} have different vocabularies")
    return encoder, (params, hparams), (draft_params, draft_hparams)


def ours(args, prompt, model, draft, repeat, results):
    """One round of our rows (plain, --draft, --draft lookup; greedy, then temperature 1), added to
    results: {(row, temperature): {"seconds": [...], "ids": [...], "proposed", "accepted"}}.
    Round 0 warms up (the page cache, BLAS's buffers) and is not counted."""
    import gpt2_numpy as g
    import decoding as speculative

    params, hparams = model
    drafts = {"plain": None, "--draft": draft, "--draft lookup": "lookup"}
    for temperature in (0.0, 1.0):
        for row, d in drafts.items():
            counts = {}
            start = time.perf_counter()
            steps = g.generate(prompt, params, hparams, args.n_tokens, temperature, seed=repeat, stop=None) \
                if d is None else speculative.generate_with_draft(prompt, params, hparams, d, args.draft_tokens,
                                                                  args.n_tokens, temperature, seed=repeat,
                                                                  counts=counts)
            ids = [int(s[0]) for s in steps]
            seconds = time.perf_counter() - start
            r = results.setdefault((row, temperature), {"seconds": [], "proposed": 0, "accepted": 0})
            if repeat:
                r["seconds"].append(seconds)
                r["proposed"] += counts.get("proposed", 0)
                r["accepted"] += counts.get("accepted", 0)
            r["ids"] = ids
            if temperature == 0 and ids != results[("plain", 0.0)]["ids"]:
                sys.exit(f"{row} at greedy gave other ids than plain decode: a bug")


def pass_costs(model, draft, prompt, k, rounds=30):
    """What the docs' formula needs (docs/speculative.md, "When it pays"): t[n], a pass of the model over n
    positions through its cache after the prompt, as a multiple of a pass over one, for n = 1 ... k + 1;
    and c, a draft step over one position, as a multiple of the model's. The passes take turns, `rounds`
    times, and each figure is a median. model, draft: (params, hparams)."""
    import numpy as np

    import gpt2_numpy as g
    import decoding as speculative

    def one_pass(params, hparams, kv, n):
        speculative.rewind(kv, len(prompt))
        start = time.perf_counter()
        g.gpt2(np.zeros((1, n), int), params, hparams, kv, last_only=n == 1)
        return time.perf_counter() - start

    caches = []
    for params, hparams in (model, draft):
        kv = g.new_kv_cache(hparams, 1, len(prompt) + k + 1)
        g.gpt2(np.array([prompt]), params, hparams, kv, last_only=True)
        caches.append(kv)
    times = {n: [] for n in ["draft", *range(1, k + 2)]}
    for _ in range(rounds + 1):  # the first warms up
        for n in times:
            times[n].append(one_pass(*draft, caches[1], 1) if n == "draft" else one_pass(*model, caches[0], n))
    median = {n: statistics.median(ts[1:]) for n, ts in times.items()}
    return {n: median[n] / median[1] for n in range(1, k + 2)}, median["draft"] / median[1], median[1]


def hugging_face(args, prompt, repeat, results):
    """One round of the same rows from transformers, in its own process (which loads both models and
    warms up on one call of each row first), added to results as ours adds its rows."""
    spec = dict(model=args.hf_model, draft=args.hf_draft, prompt=prompt, n_tokens=args.n_tokens, k=args.draft_tokens,
                repeats=1, threads=args.threads, seed=repeat)
    r = subprocess.run([args.torch_python, os.path.abspath(__file__), "--hf-worker", json.dumps(spec)],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"the Hugging Face worker failed:\n{r.stderr}")
    for row, t, v in json.loads(r.stdout.splitlines()[-1]):
        kept = results.setdefault((row, t), {"seconds": []})
        kept["seconds"] += v["seconds"] if repeat else []
        kept["ids"] = v["ids"]


def hf_worker(spec):
    """Runs under --torch-python: transformers' generate, plain and assisted, timed as ours are."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(spec["threads"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], torch_dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(spec["draft"], torch_dtype=torch.float32).eval()
    ids = torch.tensor([spec["prompt"]])
    n, k = spec["n_tokens"], spec["k"]

    def assisted(schedule):
        def kw():
            draft.generation_config.num_assistant_tokens = k
            draft.generation_config.num_assistant_tokens_schedule = schedule
            return dict(assistant_model=draft)
        return kw

    rows = {"HF plain": dict, "HF assistant_model (K constant)": assisted("constant"),
            "HF assistant_model (heuristic K)": assisted("heuristic"),
            "HF prompt_lookup_num_tokens": lambda: dict(prompt_lookup_num_tokens=k)}
    results = {}
    for repeat in range(spec["repeats"] + 1):
        for temperature in (0.0, 1.0):
            sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if temperature else \
                dict(do_sample=False)
            for row, extra in rows.items():
                torch.manual_seed(spec["seed"] + repeat)
                start = time.perf_counter()
                with torch.no_grad():
                    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                         min_new_tokens=n, pad_token_id=model.config.eos_token_id, **sampling,
                                         **extra())
                seconds = time.perf_counter() - start
                r = results.setdefault((row, temperature), {"seconds": []})
                if repeat:
                    r["seconds"].append(seconds)
                r["ids"] = out[0, len(spec["prompt"]):].tolist()
    print(json.dumps([[row, t, v] for (row, t), v in results.items()]))


def table(results, n_tokens, plain_ids):
    """Markdown: one row per way of decoding and temperature."""
    lines = ["| decoding | temperature | tokens/s | ms a token | × plain | accepted / proposed | greedy ids = plain's |",
             "|---|---|---|---|---|---|---|"]
    for temperature in (0.0, 1.0):
        plain = statistics.median(results[("plain", temperature)]["seconds"])
        for (row, t), r in results.items():
            if t != temperature:
                continue
            s = statistics.median(r["seconds"])
            rate = f"{r['accepted'] / r['proposed']:.2f} ({r['accepted']}/{r['proposed']})" if r.get("proposed") \
                else "–"
            same = ("yes" if r["ids"] == plain_ids else "**no**") if temperature == 0 else "–"
            lines.append(f"| {row} | {'greedy' if t == 0 else '1'} | {n_tokens / s:.1f} | {1000 * s / n_tokens:.1f} | "
                         f"{plain / s:.2f}× | {rate} | {same} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.path.join(HERE, "out", "spec-target"), help="a model folder, or random:SIZE")
    p.add_argument("--draft", default=os.path.join(HERE, "out", "spec-draft"), help="a model folder, or random:SIZE")
    p.add_argument("--draft-tokens", type=int, default=4, help="K (default 4)")
    p.add_argument("--n-tokens", type=int, default=200)
    p.add_argument("--prompt-tokens", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="BLAS threads, ours and torch's")
    p.add_argument("--hf-model", help="--model as a Hugging Face folder (convert.py --to hf)")
    p.add_argument("--hf-draft", help="--draft as a Hugging Face folder")
    p.add_argument("--torch-python", default="/work/devvenv/bin/python", help="a Python with torch and transformers")
    p.add_argument("--json", metavar="FILE", help="also write every time and id here")
    p.add_argument("--hf-worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.hf_worker:
        return hf_worker(json.loads(args.hf_worker))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # before NumPy loads
    sys.path.insert(0, ROOT)
    args.model, args.draft = model_folder(args.model), model_folder(args.draft)
    encoder, model, draft = load_pair(args)
    prompt = prompt_ids(encoder, args.prompt_tokens)
    results = {}
    for repeat in range(args.repeats + 1):  # ours and Hugging Face's take turns, so that drift hits both alike
        ours(args, prompt, model, draft, repeat, results)
        if args.hf_model:
            hugging_face(args, prompt, repeat, results)
    t, c, one = pass_costs(model, draft, prompt, args.draft_tokens)
    print(f"{args.model} with the draft {args.draft}, K = {args.draft_tokens}: {args.n_tokens} tokens after "
          f"{len(prompt)}, {args.threads} threads, median of {args.repeats}")
    print(table(results, args.n_tokens, results[("plain", 0.0)]["ids"]))
    print("greedy text:", repr(encoder.decode(results[("plain", 0.0)]["ids"])[:200]))
    k = args.draft_tokens
    print(f"a pass over n positions, in passes over one ({1000 * one:.2f} ms): "
          + ", ".join(f"t({n}) = {t[n]:.2f}" for n in t) + f"; a draft step: c = {c:.2f} of a pass over one")
    print(f"so a round costs K c + t(K + 1) = {k * c + t[k + 1]:.2f} passes over one, and gives at most K + 1 = {k + 1} "
          f"tokens: at best {(k + 1) / (k * c + t[k + 1]):.2f}x plain decode with a draft model, "
          f"{(k + 1) / t[k + 1]:.2f}x with lookup (c = 0)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([[row, t, v] for (row, t), v in results.items()], f)


if __name__ == "__main__":
    main()
