"""A classification step (forward, backward, clipping, AdamW) of train.py, against a torch step of
transformers' GPT2ForSequenceClassification, on 124M's shape with random weights, alternated in one run.

    flock /work/bench.lock python bench/bench_classify.py --torch-python /work/ref/bin/python [--rounds 5]

Each round runs each contender in a process of its own (the order swapped each round, so that drift on
a shared machine hits both alike), and each process times --steps steps after one to warm up:
  numpy   train.py's train_step on labelled texts: B texts of T tokens padded on the right, 2 labels,
          every weight trained (the recipe's defaults: weight decay 0.1, clipping at 1)
  torch   GPT2ForSequenceClassification (sdpa, dropout 0), cross-entropy of the labels, clip_grad_norm_,
          torch.optim.AdamW(weight_decay=0.1), --threads threads (2 unless told)
Prints each round's medians, the ratio within each round, and their median; and the BLAS that ran
(NumPy's by threadpoolctl, where it is installed; torch's, which it links in, by torch's build
settings). With --phases each round also times the step's parts on both sides (the forward pass,
the backward pass, clipping's norm and AdamW: the numpy side calls train_step's pieces one by one,
the same work) to show where the time goes.
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


def texts_of(args, rng):
    """B random texts of T tokens, the first shortened (so the batch is padded), and their labels."""
    lengths = [args.context - 7] + [args.context] * (args.batch_size - 1)
    return [rng.integers(0, 50256, n) for n in lengths], rng.integers(0, 2, args.batch_size)


def numpy_step(args):
    import numpy as np

    import optimizer
    import train
    import classify
    from parameters import init_params
    from plumbing import shapes
    hp = shapes.hparams("124M")
    params = init_params(hp, 0) | {"score": classify.new_score(2, hp["n_embd"], 0)}
    state, buffers, rng = optimizer.new_adamw_state(params), {}, np.random.default_rng(0)
    texts, labels = texts_of(args, rng)
    data = {"kind": "labelled", "rows": list(zip(texts, labels.tolist())), "labels": [0, 1], "pad_id": 50256}
    recipe = train.recipe_with(steps=args.steps + 1, batch_size=args.batch_size, context=args.context, warmup=0)
    if args.phases:
        return numpy_phases(args, params, hp, state, buffers, data, recipe)
    times = []
    for step in range(args.steps + 1):
        t = time.perf_counter()
        train.train_step(params, hp, state, data, step, recipe, buffers)
        times.append(time.perf_counter() - t)
    return times[1:]


def numpy_phases(args, params, hp, state, buffers, data, recipe):
    """train_step's work for labelled texts, a piece at a time: -> {phase: [seconds a step]}"""
    import numpy as np

    import backward
    import classify
    import optimizer
    import train
    from plumbing.parallel import reused
    ids, labels = train.labelled_batch(data["rows"], range(len(data["rows"])), data["pad_id"])
    phases = {name: [] for name in PHASES}
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        kept, top = backward.training_forward(ids, params, hp)
        positions = classify.pooled_positions(ids, data["pad_id"])
        h = classify.pool(top["ln_f"], positions)
        dlogits = classify.label_loss_backward(h @ params["score"].T, labels)
        t1 = time.perf_counter()
        dwte = reused(buffers, "dwte", params["wte"].shape, np.float32)
        dwte.fill(0.0)
        dxf = classify.pool_backward(dlogits @ params["score"], positions, ids.shape[1])
        grads = backward.model_backward(ids, kept, top, params, hp, dxf, dwte) | {"score": dlogits.T @ h}
        t2 = time.perf_counter()
        scale = optimizer.clip_scale(optimizer.grad_norm(grads), recipe["grad_clip"])
        t3 = time.perf_counter()
        optimizer.adamw_step_fast(params, grads, state, recipe["lr"], weight_decay=recipe["weight_decay"],
                                  grad_scale=scale)
        t4 = time.perf_counter()
        if step:
            for name, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                phases[name].append(seconds)
    return phases


PHASES = ("forward", "backward", "clipping's norm", "AdamW")


def torch_step(args):
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, num_labels=2, pad_token_id=50256)
    config._attn_implementation = "sdpa"
    model = GPT2ForSequenceClassification(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    texts, labels = texts_of(args, np.random.default_rng(0))
    ids = torch.full((args.batch_size, args.context), 50256)
    for b, t in enumerate(texts):
        ids[b, :len(t)] = torch.from_numpy(t)
    labels = torch.from_numpy(labels)
    times, phases = [], {name: [] for name in PHASES}
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        loss = model(ids, labels=labels).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        t3 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        times.append(t4 - t0)
        if step:
            for name, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                phases[name].append(seconds)
    return phases if args.phases else times[1:]


def blas():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # NumPy's own OpenBLAS says which kernel it chose
        import ctypes
        import glob
        import numpy
        libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__), os.pardir, "numpy.libs", "*openblas*"))
        try:
            lib = ctypes.CDLL(libs[0])
            lib.scipy_openblas_get_config64_.restype = ctypes.c_char_p
            return lib.scipy_openblas_get_config64_().decode()
        except (IndexError, OSError, AttributeError):
            return "unknown (no threadpoolctl, and no OpenBLAS found beside NumPy)"
    return "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} ({i.get('num_threads')} "
                     "threads)" for i in threadpool_info())


def torch_blas():
    """torch links its BLAS in (threadpoolctl does not see it): its build settings name it."""
    import torch
    info = torch.__config__.show()
    return next((line.strip() for line in info.splitlines() if "Math Kernel Library" in line),
                "BLAS_INFO=" + info.split("BLAS_INFO=")[1].split(",")[0] if "BLAS_INFO=" in info else "unknown")


def one(args):
    times = (numpy_step if args.one == "numpy" else torch_step)(args)
    kernel = blas() if args.one == "numpy" else f"{torch_blas()} ({args.threads} threads)"
    if args.phases:
        phases = {name: statistics.median(seconds) for name, seconds in times.items()}
        print(json.dumps({"median": sum(phases.values()), "phases": phases, "blas": kernel}))
    else:
        print(json.dumps({"median": statistics.median(times), "blas": kernel}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--torch-python", required=False, default="/work/ref/bin/python")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="threads on each side: BLAS's for NumPy (its element-wise "
                   "helpers use every core whatever this says), torch.set_num_threads for torch (default 2)")
    p.add_argument("--phases", action="store_true", help="also time the forward, backward, norm and AdamW apart")
    p.add_argument("--one", choices=("numpy", "torch"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return one(args)
    settings = ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--context", str(args.context)]
    settings += ["--threads", str(args.threads)] + (["--phases"] if args.phases else [])
    pythons = {"numpy": sys.executable, "torch": args.torch_python}
    rounds, kernels = [], {}
    for r in range(args.rounds):
        got = {}
        for who in (("numpy", "torch") if r % 2 == 0 else ("torch", "numpy")):
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
            out = subprocess.run([pythons[who], os.path.abspath(__file__), "--one", who, *settings], check=True,
                                 capture_output=True, text=True, env=env).stdout
            result = json.loads(out.strip().splitlines()[-1])
            got[who], kernels[who] = result["median"], result["blas"]
            if args.phases:
                print(f"  {who}: " + ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in
                                               result["phases"].items()), flush=True)
        rounds.append(got)
        print(f"round {r + 1}: numpy {got['numpy'] * 1e3:.0f} ms, torch {got['torch'] * 1e3:.0f} ms, "
              f"numpy / torch {got['numpy'] / got['torch']:.2f}", flush=True)
    ours, theirs = (statistics.median(r[who] for r in rounds) for who in ("numpy", "torch"))
    print(f"B={args.batch_size} T={args.context}, 124M, {args.threads} threads: "
          f"median numpy {ours * 1e3:.0f} ms, torch {theirs * 1e3:.0f} ms, "
          f"median ratio numpy / torch {statistics.median(r['numpy'] / r['torch'] for r in rounds):.2f}")
    for who, kernel in kernels.items():
        print(f"{who} BLAS: {kernel}")


if __name__ == "__main__":
    main()
