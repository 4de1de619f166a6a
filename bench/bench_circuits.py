"""Activation patching's speed: circuits.patch against TransformerLens 4.3.0's sweeps, on the same weights.

    python bench/bench_circuits.py                      # random:124M, the IOI pair (15 tokens), median of 5
    python bench/bench_circuits.py --sites resid_pre --repeats 3 --profile

Two sweeps of the IOI pair, "When Mary and John went to the store, John gave a drink to" against "... Mary
gave ...", 15 tokens with <|endoftext|>, metric the logit difference " Mary" - " John":
  resid_pre  one position of one layer at a time: n_layer x 15 patched runs (get_act_patch_resid_pre)
  head       one head's z at one position: n_layer x 15 x n_head runs (get_act_patch_attn_head_out_by_pos)
Each row is the whole experiment: the clean run's cache, then the sweep (ours also runs the corrupted
prompt once, for the residual stream the copies start from). TransformerLens runs in a process of its own
(--torch-python: a Python with torch and transformer-lens), booted once, TransformerBridge.boot_transformers
on the model as a Hugging Face folder (convert.py writes it once, beside the model), as booted: the raw
model, no processing. The two take turns, ours then TransformerLens's, --repeats times after one warm-up
round each, on --threads threads (BLAS's, torch.set_num_threads); each figure is a median. The bench checks
that the two give the same numbers (within 1e-4 of the largest) and stops if not.

random:SIZE is bench_speculative's: that size's shape with GPT-2's initialisation, written once to
bench/out/SIZE-random-init/. After the table: where our time goes (the two caches, and the copies' passes
by the layer they start at), and with --profile the functions that take it.
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
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"
ANSWER, WRONG = " Mary", " John"
TL_SWEEPS = {"resid_pre": "get_act_patch_resid_pre", "head": "get_act_patch_attn_head_out_by_pos"}


def tl_worker(folder, threads):
    """Runs under --torch-python: boots the bridge, then times the sweep named on each line of stdin,
    answering one JSON line: {"seconds", "values"}."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformer_lens import patching
    from transformer_lens.model_bridge import TransformerBridge

    torch.set_num_threads(threads)
    model = TransformerBridge.boot_transformers(folder, device="cpu").eval()
    clean, corrupted = model.to_tokens(CLEAN), model.to_tokens(CORRUPTED)
    a, w = model.to_single_token(ANSWER), model.to_single_token(WRONG)

    def metric(logits):
        return (logits[:, -1, a] - logits[:, -1, w]).mean()

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        sweep = getattr(patching, TL_SWEEPS[line.strip()])
        start = time.perf_counter()
        with torch.no_grad():
            _, cache = model.run_with_cache(clean)
            values = sweep(model, corrupted, cache, metric)
        print(json.dumps({"seconds": time.perf_counter() - start, "values": values.tolist()}), flush=True)


class TransformerLens:
    """The worker process, asked one sweep at a time."""

    def __init__(self, python, folder, threads):
        self.p = subprocess.Popen([python, os.path.abspath(__file__), "--tl-worker", folder, "--threads", str(threads)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.answer()

    def answer(self):
        line = self.p.stdout.readline()
        if not line:
            sys.exit("the TransformerLens worker stopped")
        return json.loads(line)

    def sweep(self, site):
        self.p.stdin.write(site + "\n")
        self.p.stdin.flush()
        return self.answer()

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def timed_parts(circuits):
    """Wrap circuits' run_with_cache and copies_forward to add up their seconds: -> the dict they add to."""
    parts = {}

    def wrap(name, key):
        fn = getattr(circuits, name)

        def timed(*args, **kw):
            start = time.perf_counter()
            out = fn(*args, **kw)
            k = key(*args, **kw)
            parts[k] = parts.get(k, 0.0) + time.perf_counter() - start
            return out

        setattr(circuits, name, timed)

    wrap("run_with_cache", lambda *a, **k: "caches")
    wrap("copies_forward", lambda params, hparams, ids, resid, layer, *rest, **kw: f"copies from layer {layer}")
    return parts


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:124M", help="a model folder, or random:SIZE (default random:124M)")
    p.add_argument("--sites", nargs="+", default=list(TL_SWEEPS), choices=list(TL_SWEEPS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="BLAS threads, ours and torch's")
    p.add_argument("--torch-python", default="/work/devvenv/bin/python", help="a Python with torch and transformer-lens")
    p.add_argument("--no-tl", action="store_true", help="ours alone")
    p.add_argument("--profile", action="store_true", help="then profile one sweep of ours of each site")
    p.add_argument("--tl-worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tl_worker:
        return tl_worker(args.tl_worker, args.threads)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # before NumPy loads
    sys.path.insert(0, ROOT)
    sys.path.insert(0, HERE)
    import numpy as np

    import circuits
    from bench_speculative import model_folder
    from interface import loading

    folder = model_folder(args.model)
    encoder, hparams, params = loading.load_model(folder, quiet=True)
    clean, corrupted = ([encoder.eot] + encoder.encode(text) for text in (CLEAN, CORRUPTED))
    answer, wrong = encoder.encode(ANSWER)[0], encoder.encode(WRONG)[0]
    tl = None
    if not args.no_tl:
        hf = folder if os.path.exists(os.path.join(folder, "config.json")) else folder.rstrip("/") + "-hf"
        if not os.path.exists(os.path.join(hf, "config.json")):
            import convert
            convert.convert(folder, hf, "hf")
        tl = TransformerLens(args.torch_python, hf, args.threads)
    parts = timed_parts(circuits)
    seconds = {(who, site): [] for site in args.sites for who in ("ours", "TL")}
    for repeat in range(args.repeats + 1):  # the first round warms up; ours and TL's take turns
        for site in args.sites:
            parts.clear()
            start = time.perf_counter()
            ours = circuits.patch(params, hparams, [clean], [corrupted], answer, wrong, site)
            took = time.perf_counter() - start
            if repeat:
                seconds[("ours", site)].append(took)
                print(f"repeat {repeat} {site}: ours {took:.2f} s ({', '.join(f'{k} {v:.2f}' for k, v in parts.items())})",
                      file=sys.stderr)
            if tl:
                theirs = tl.sweep(site)
                if repeat:
                    seconds[("TL", site)].append(theirs["seconds"])
                gap = np.abs(ours - np.array(theirs["values"])).max()
                if gap > 1e-4 * np.abs(ours).max():
                    sys.exit(f"{site}: ours and TransformerLens's differ by {gap:.3g}: a bug")
    if tl:
        tl.close()
    n = len(clean)
    print(f"{args.model}: the IOI pair, {n} tokens, {args.threads} threads, median of {args.repeats}")
    print("| sweep | patched runs | ours | TransformerLens 4.3.0 | TL / ours |\n|---|---|---|---|---|")
    for site in args.sites:
        runs = hparams["n_layer"] * n * (hparams["n_head"] if site == "head" else 1)
        mine = statistics.median(seconds[("ours", site)])
        theirs = statistics.median(seconds[("TL", site)]) if tl else None
        print(f"| {site} | {runs:,} | {mine:.2f} s | " + (f"{theirs:.2f} s | {theirs / mine:.1f}x |" if tl else "– | – |"))
    for site in args.sites:  # where our time goes, in the last round
        parts.clear()
        circuits.patch(params, hparams, [clean], [corrupted], answer, wrong, site)
        print(f"{site}, ours: " + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()))
    if args.profile:
        import cProfile
        import pstats

        for site in args.sites:
            profile = cProfile.Profile()
            profile.runcall(circuits.patch, params, hparams, [clean], [corrupted], answer, wrong, site)
            print(f"--- {site}: the functions that take the time")
            pstats.Stats(profile).sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()
