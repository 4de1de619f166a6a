"""Many processes (data_parallel.py): a training step on 2 ranks against 1, and against nanoGPT's and torch's
on 2 threads, side by side, round after round; the all-reduce's share of a step; each rank's peak RSS.

    python bench/bench_parallel.py baby --nanogpt DIR --torch-python PY     # the README's from-scratch step
    python bench/bench_parallel.py 124m --torch-python PY                   # a 124M fine-tuning step, B=4, T=64

baby: the README's from-scratch recipe (4 layers, 4 heads, 128 wide, vocabulary 257, B=12, T=64), ours on one
process (2 BLAS threads) and on 2 ranks (mpiexec -n 2, 1 thread each, each rank 6 of the 12 windows), and
nanoGPT's train.py on 2 threads (DIR: a checkout of karpathy/nanoGPT, run, never copied; PY a Python with
torch). 124m: GPT-2 124M's shape (random weights: only the time is measured), the same global batch, B=4,
T=64: ours on one process and on 2 ranks, plain and --zero 1, against transformers' GPT2LMHeadModel and
torch.optim.AdamW on 2 threads (bench/bench_train.py's torch step). Each rank's peak RSS (ru_maxrss) and
AdamW's moments' bytes on it come with every run of ours. "all-reduce" is the time a step spends in MPI's
calls (posting the buckets, waiting for them; under ZeRO-1 the reduce-scatter and the weights' all-gather).

Each contender is a process of its own (ours under mpiexec for 2 ranks), run in turn, round after round;
medians over the steps after the first, then over the rounds. The machine is shared: run it under
`flock /work/bench.lock` and say the load (uptime) beside the figures.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

BABY = dict(n_layer=4, n_head=4, n_embd=128, vocab_size=257, batch_size=12, context=64)
FINE_TUNING = dict(batch_size=4, context=64)
MODEL_124M = os.path.join(HERE, "out", "124M-dp")  # random weights in 124M's shape, written here once


def worker(kind, steps, zero):
    """One contender of ours, in this process (alone, or a rank under mpiexec): -> rank 0 prints its JSON."""
    import numpy as np

    import bpe
    import data_parallel
    import train
    from optimizer import new_adamw_state
    from plumbing import corpus, mpi
    from plumbing.memory import keep_freed_memory
    from plumbing.weights import load_weights

    keep_freed_memory()  # as train.py's command does on every rank (interface/start.py)
    comm = mpi.world()
    if kind == "baby":
        text, = corpus.read_documents([train.CORPUS])
        encoder = bpe.parse_vocab(*bpe.vocab_files(bpe.train_vocab(train.split_text(text, 0.1)[0], 257)))
        hp = {"n_vocab": encoder.n_vocab, "n_ctx": BABY["context"], **{k: BABY[k] for k in ("n_layer", "n_head",
                                                                                            "n_embd")}}
        params, rows = train.init_params(hp, 0), train.text_ids(encoder, text, 0.1, BABY["context"])[0]
        recipe = train.recipe_with(steps=steps, batch_size=BABY["batch_size"], context=BABY["context"], lr=1e-3,
                                   warmup=100, min_lr_ratio=0.1, beta2=0.99)
    else:
        hp, params = load_weights(MODEL_124M)
        params = train.writable_copy(params)
        rows = np.random.default_rng(0).integers(0, hp["n_vocab"], 100_000)
        recipe = train.recipe_with(steps=steps, warmup=0, **FINE_TUNING)
    data, state, buffers = {"kind": "documents", "rows": rows}, new_adamw_state(params), {}
    in_mpi = [0.0]
    if comm is not None:
        timed_mpi(data_parallel, in_mpi)
        run = {"trained": params, "state": state, "lora": None}
        step = data_parallel.parallel(comm, run, zero)["step"]
        state = run["state"]
    else:
        step = train.train_step
    times, mpi_times = [], []
    for s in range(steps):
        in_mpi[0] = 0.0
        t = time.perf_counter()
        step(params, hp, state, data, s, recipe, buffers, None)
        times.append(time.perf_counter() - t)
        mpi_times.append(in_mpi[0])
    moments = sum(a.nbytes for k in ("m", "v") for a in state[k].values())
    mine = {"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "moments_mb": moments / 2 ** 20}
    every = comm.allgather(mine) if comm is not None else [mine]
    if comm is None or comm.Get_rank() == 0:
        print(json.dumps({"step": statistics.median(times[1:]), "all-reduce": statistics.median(mpi_times[1:]),
                          "rss_mb": [r["rss_mb"] for r in every], "moments_mb": [r["moments_mb"] for r in every]}),
              file=sys.__stdout__, flush=True)


def timed_mpi(data_parallel, total):
    """Every MPI call a step makes, timed into total[0]: posting the buckets, waiting for them, ZeRO-1's gather."""
    def timed(f):
        def call(*args):
            t = time.perf_counter()
            out = f(*args)
            total[0] += time.perf_counter() - t
            return timed(out) if callable(out) else out  # the wait a post returns
        return call

    for name in ("ring_allreduce_fast", "post_reduce_scatter", "gather_weights", "summed", "clip_slices"):
        setattr(data_parallel, name, timed(getattr(data_parallel, name)))


def make_124m():
    """bench/out/124M-dp: GPT-2 124M's tensors, GPT-2's initialisation, with the real vocabulary (once)."""
    if os.path.isdir(MODEL_124M):
        return
    import parameters
    from plumbing import shapes
    from plumbing.checkpoint import write_checkpoint
    hp = shapes.hparams("124M")
    os.makedirs(os.path.dirname(MODEL_124M), exist_ok=True)  # bench/out/ is not in a fresh clone
    write_checkpoint(MODEL_124M, parameters.init_params(hp, 0), hp, vocab_dir=os.path.join(ROOT, "data", "gpt2-vocab"))


def ours(kind, steps, ranks, zero=0, threads=1):
    """Our step in a process of its own (ranks > 1: under mpiexec), each on `threads` BLAS threads."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    command = [sys.executable, os.path.abspath(__file__), "--worker", kind, str(steps), str(zero)]
    if ranks > 1:
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        command = [mpiexec if os.path.isfile(mpiexec) else "mpiexec", "-n", str(ranks)] + command
    r = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"{' '.join(command)}: {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def nanogpt(folder, python, steps, threads):
    import bench_from_scratch
    r = bench_from_scratch.nanogpt(folder, python, steps, threads)
    return {"step": r["step_ms"] / 1000}


def torch_124m(python, steps, threads):
    r = subprocess.run([python, os.path.join(HERE, "bench_train.py"), "--framework", "torch", "--folder", MODEL_124M,
                        "--batch-size", str(FINE_TUNING["batch_size"]), "--context", str(FINE_TUNING["context"]),
                        "--steps", str(steps), "--threads", str(threads)], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=["baby", "124m"])
    p.add_argument("--steps", type=int, help="steps a run (default: 60 for baby, 6 for 124m)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nanogpt", help="a checkout of karpathy/nanoGPT (baby)")
    p.add_argument("--torch-python", help="a Python with torch and transformers")
    args = p.parse_args()
    steps = args.steps or (60 if args.kind == "baby" else 6)
    # the reference first, then ours: each ratio is against the reference's 2 threads; 1 thread each beside,
    # since on a busy machine a second thread waits for a core (docs/performance.md, issue 37)
    contenders = {}
    for threads in (2, 1):
        if args.kind == "124m" and args.torch_python:
            contenders[f"torch, {threads} threads"] = lambda t=threads: torch_124m(args.torch_python, steps, t)
        elif args.kind == "baby" and args.nanogpt:
            contenders[f"nanoGPT, {threads} threads"] = lambda t=threads: nanogpt(
                args.nanogpt, args.torch_python or sys.executable, steps, t)
        contenders[f"ours, 1 process, {threads} threads"] = lambda t=threads: ours(args.kind, steps, 1, threads=t)
    contenders["ours, 2 ranks, 1 thread each"] = lambda: ours(args.kind, steps, 2)
    if args.kind == "124m":
        make_124m()
        contenders["ours, 2 ranks, --zero 1"] = lambda: ours(args.kind, steps, 2, zero=1)
    results = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, run in contenders.items():
            results[name].append(run())
            print(f"  {name}: {results[name][-1]}", file=sys.stderr)
    print(f"{args.kind}: {steps} steps a run, {args.rounds} rounds; medians; load before: {os.getloadavg()}")
    base = next((n for n in results if n.startswith(("nanoGPT", "torch"))), None)  # on 2 threads
    for name, runs in results.items():
        step = statistics.median(r["step"] for r in runs)
        line = f"{name}: {step * 1000:.1f} ms a step"
        if base:
            line += f", {step / statistics.median(r['step'] for r in results[base]):.2f}x {base}"
        if "all-reduce" in runs[0] and name.startswith("ours, 2"):
            share = statistics.median(r["all-reduce"] / r["step"] for r in runs)
            line += f", MPI {share:.0%} of it"
        if "rss_mb" in runs[0]:
            line += (f"; peak RSS {', '.join(f'{m:.0f}' for m in runs[-1]['rss_mb'])} MB, AdamW's moments "
                     f"{', '.join(f'{m:.0f}' for m in runs[-1]['moments_mb'])} MB a rank")
        elif "rss" in runs[0]:
            line += f"; peak RSS {runs[-1]['rss']:.0f} MB"
        print(line)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
