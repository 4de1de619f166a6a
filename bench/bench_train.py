"""Fine-tuning speed: one training step (forward, backward, clipping, AdamW) of train.py, of
torch, and of llm.c, side by side, with the peak RSS and the step's GEMM work timed alone.

    python bench/make_random_checkpoint.py 124M            # once (needs tensorflow-cpu)
    python bench/bench_train.py --batch-size 4 --context 64            # this project alone
    python bench/bench_train.py --side-by-side --batch-size 4 --context 64 \\
        --torch-python /tmp/dev/bin/python --llmc /tmp/llmc [--rounds 3]

--side-by-side runs each contender in a process of its own, round after round (so drift on a
shared machine hits them all alike), and prints the medians and the ratios within each round:
  numpy        train.py's own train_step (reused buffers, clipping folded into adamw_step_fast;
               "AdamW" is that call, "forward and backward" the rest, gradient norm included), on
               --threads BLAS threads (plumbing.blas.set_threads: NumPy is loaded by then) and freed
               memory kept as train.py's command keeps it (plumbing/memory.py), with OPENBLAS_CORETYPE
               as this environment sets it and unset (`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`; the
               kernel OpenBLAS chose is shown), and once with glibc's default (freed memory returned)
  gemm         every matrix product of that step alone, in NumPy, into preallocated outputs:
               the floor that the step's other work sits on
  torch        transformers' GPT2LMHeadModel (sdpa, dropout 0) and torch.optim.AdamW, --threads threads;
               also with glibc told to keep freed memory (MALLOC_MMAP_MAX_=0 ...)
  llm.c        train_gpt2.c built with OpenMP, on the same weights (not part of this project):
                   python bench/llmc_inputs.py --out /tmp/llmc     # its weights and data files
                   # copy llm.c's train_gpt2.c and llmc/ into /tmp/llmc, then, in /tmp/llmc:
                   sed 's/step <= 40/step <= 6/' train_gpt2.c > t.c
                   gcc -Ofast -march=native -fopenmp -DOMP t.c -lm -o train_gpt2_B4_T64
                   sed 's/int B = 4;/int B = 8;/; s/int T = 64;/int T = 256;/; s/step <= 40/step <= 3/' \\
                       train_gpt2.c > t.c && gcc -Ofast -march=native -fopenmp -DOMP t.c -lm -o train_gpt2_B8_T256
Medians over the steps after the first.
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

KEEP_FREED_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000", "MALLOC_TOP_PAD_": "536870912"}


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def medians(times):
    return {k: statistics.median(v[1:] or v) for k, v in times.items()}


def use_threads(n):
    """BLAS's threads (and so the element-wise work's, plumbing/parallel.py's) in this process, NumPy loaded: n.
    The environment no longer counts once NumPy has loaded; this asks OpenBLAS itself (plumbing/blas.py)."""
    from plumbing.blas import blas_threads, set_threads
    set_threads(n)
    assert blas_threads() == n, (blas_threads(), n)


def numpy_step(args):
    import numpy as np

    import optimizer
    import train
    from plumbing.checkpoint import load_checkpoint
    from plumbing.memory import keep_freed_memory
    use_threads(args.threads)
    if not os.environ.get("BENCH_FREED_MEMORY_RETURNED"):
        keep_freed_memory()  # as train.py's command does (interface/start.py)
    hp, params = load_checkpoint(args.folder)
    params = train.writable_copy(params)  # the read-only file views are dropped here
    state, buffers = optimizer.new_adamw_state(params), {}
    tokens = np.random.default_rng(0).integers(0, hp["n_vocab"], 100_000)
    recipe = train.recipe_with(steps=args.steps, batch_size=args.batch_size, context=args.context, warmup=0)
    times = {"forward and backward": [], "AdamW": []}
    adamw = train.adamw_step_fast

    def timed_adamw(*a, **k):  # the loop's own step, with its optimizer's share timed
        t = time.perf_counter()
        adamw(*a, **k)
        times["AdamW"][-1] += time.perf_counter() - t

    train.adamw_step_fast = timed_adamw
    for step in range(args.steps):
        times["AdamW"].append(0.0)
        t = time.perf_counter()
        train.train_step(params, hp, state, {"kind": "documents", "rows": tokens}, step, recipe, buffers)
        times["forward and backward"].append(time.perf_counter() - t - times["AdamW"][-1])
    return medians(times)


def gemm_work(args):
    """Each matrix product of one step (forward, both backward products, the tied head) at
    its own shape, into a preallocated output, median of 5."""
    import numpy as np
    use_threads(args.threads)
    B, T, C, V, L = args.batch_size, args.context, 768, 50257, 12
    N, H, D = B * T, 12, 64
    rng = np.random.default_rng(0)

    def timed(a_shape, b_shape, count, transpose_a=False):
        a = rng.standard_normal(a_shape[::-1] if transpose_a else a_shape, dtype=np.float32)
        a = a.T if transpose_a else a
        b = rng.standard_normal(b_shape, dtype=np.float32)
        out = np.empty(a.shape[:-2] + (a.shape[-2], b.shape[-1]), np.float32)
        runs = []
        for _ in range(6):
            t = time.perf_counter()
            np.matmul(a, b, out=out)
            runs.append(time.perf_counter() - t)
        return count * statistics.median(runs[1:])

    total = 0.0
    for n_in, n_out in ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)):
        total += timed((N, n_in), (n_in, n_out), L)  # forward
        total += timed((N, n_out), (n_out, n_in), L)  # dx = dy wᵀ
        total += timed((n_in, N), (N, n_out), L, transpose_a=True)  # dw = xᵀ dy
    total += 3 * timed((N, C), (C, V), 1)  # logits, dx, dwte: three [N, C, V] products
    total += 2 * timed((B, H, T, D), (B, H, D, T), L)  # attention's q kᵀ, and dweights = dz vᵀ
    total += 4 * timed((B, H, T, T), (B, H, T, D), L)  # weights v, and dv, dq, dk
    return {"GEMM alone": total}


def torch_step(args):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    times = {"forward": [], "backward": [], "AdamW": []}
    for _ in range(args.steps):
        x = torch.randint(0, config.vocab_size, (args.batch_size, args.context))
        y = torch.randint(0, config.vocab_size, (args.batch_size, args.context))
        t0 = time.perf_counter()
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
            times[k].append(v)
    return medians(times)


def llmc_step(args):
    exe = os.path.join(args.llmc, f"train_gpt2_B{args.batch_size}_T{args.context}")
    if not os.path.exists(exe):
        sys.exit(f"{exe}: not built (see this file's docstring)")
    r = subprocess.run([exe], cwd=args.llmc, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    took = [float(t) / 1000 for t in re.findall(r"took ([0-9.]+) ms", r.stdout)]
    if r.returncode or len(took) < 2:
        sys.exit(f"{exe} failed: {r.stdout[-500:]}{r.stderr[-500:]}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"step": statistics.median(took[1:]), "rss": rss}


def run_one(args):
    result = {"numpy": numpy_step, "gemm": gemm_work, "torch": torch_step, "llmc": llmc_step}[args.framework](args)
    result.setdefault("step", sum(v for k, v in result.items()))
    result.setdefault("rss", peak_rss_mb())
    print(json.dumps(result))


CONTENDERS = {  # name -> (framework, environment changes; None removes a variable)
    "numpy, OPENBLAS_CORETYPE as set": ("numpy", {}),
    "numpy, OPENBLAS_CORETYPE unset": ("numpy", {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}),
    "numpy, freed memory returned (glibc's default)": ("numpy", {"BENCH_FREED_MEMORY_RETURNED": "1"}),
    "GEMM alone, as set": ("gemm", {}),
    "GEMM alone, unset": ("gemm", {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}),
    "torch": ("torch", {}),
    "torch, freed memory kept": ("torch", KEEP_FREED_MEMORY),
    "llm.c": ("llmc", {}),
}


def side_by_side(args):
    env_as_set = dict(os.environ)
    env_as_set.setdefault("OPENBLAS_CORETYPE", "Haswell")  # as this project's machines set it
    chosen = {k: v for k, v in CONTENDERS.items() if (v[0] != "llmc" or args.llmc)}
    results = {k: [] for k in chosen}
    kernels = {}
    for _ in range(args.rounds):
        for name, (framework, changes) in chosen.items():
            env = dict(env_as_set, OPENBLAS_VERBOSE="2")
            for k, v in changes.items():
                env.pop(k, None) if v is None else env.__setitem__(k, v)
            python = args.torch_python if framework == "torch" else sys.executable
            cmd = [python, os.path.abspath(__file__), "--framework", framework, "--folder", args.folder,
                   "--batch-size", str(args.batch_size), "--context", str(args.context), "--steps", str(args.steps),
                   "--threads", str(args.threads)] + (["--llmc", args.llmc] if args.llmc else [])
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"{name}: {r.stderr.strip()[-800:]}")
            results[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
            core = re.search(r"Core: (\w+)", r.stderr)
            if core and framework in ("numpy", "gemm"):
                kernels[name] = core.group(1)
            print(f"  {name}: {results[name][-1]}", file=sys.stderr)
    tokens = args.batch_size * args.context
    print(f"B={args.batch_size}, T={args.context}, {args.rounds} rounds, {args.threads} threads; medians over rounds")
    for name, runs in results.items():
        step = statistics.median(r["step"] for r in runs)
        parts = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k not in ("step", "rss")}
        kernel = f" [kernel {kernels[name]}]" if name in kernels else ""
        detail = ", ".join(f"{k} {v:.3f} s" for k, v in parts.items() if k != "GEMM alone")
        rss = "" if chosen[name][0] == "gemm" else f"; peak RSS {statistics.median(r['rss'] for r in runs):,.0f} MB"
        print(f"{name}{kernel}: step {step:.3f} s ({tokens / step:.0f} tok/s)" + (f"; {detail}" if detail else "") + rss)

    def ratio(a, b):
        return statistics.median(x["step"] / y["step"] for x, y in zip(results[a], results[b]))

    for ours, gemm in (("numpy, OPENBLAS_CORETYPE as set", "GEMM alone, as set"),
                       ("numpy, OPENBLAS_CORETYPE unset", "GEMM alone, unset")):
        line = f"{ours}: GEMM share {ratio(gemm, ours):.0%}; / torch {ratio(ours, 'torch'):.2f}x"
        line += f", / torch with freed memory kept {ratio(ours, 'torch, freed memory kept'):.2f}x"
        if "llm.c" in results:
            line += f"; tokens/s {1 / ratio(ours, 'llm.c'):.2f}x llm.c's"
        print(line)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default=os.path.join(HERE, "out", "124M-random"))
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--framework", choices=["numpy", "gemm", "torch", "llmc"], default="numpy")
    p.add_argument("--side-by-side", action="store_true")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--torch-python", default=sys.executable, help="a Python with torch and transformers")
    p.add_argument("--llmc", help="the folder with llm.c's train_gpt2_B{B}_T{T} and its inputs")
    args = p.parse_args()
    if args.side_by_side:
        side_by_side(args)
    else:
        run_one(args)


if __name__ == "__main__":
    main()
