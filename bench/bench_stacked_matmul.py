"""A stack [B, T, n] times w, against one [B·T, n] product: why gpt2_numpy.matmul reshapes.

    flock /work/bench.lock python bench/bench_stacked_matmul.py [--threads 1] [--repeats 15]

NumPy's matmul multiplies a stack by w one [T, n] slice at a time (a BLAS call each); reshaped, it is
one BLAS call over B·T rows. Times 124M's four products of a block (c_attn, attn's c_proj, c_fc, mlp's
c_proj) on B=4, T=128, each way in turn, and prints the medians, their ratio, and the BLAS that ran.
Set the threads before NumPy loads: --threads sets OPENBLAS_NUM_THREADS and OMP_NUM_THREADS and runs
itself again. With --torch-python PY, the same four products in torch too (its own BLAS, MKL on x86).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]  # a block's four products: n_in, n_out


def blas():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    return "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} ({i.get('num_threads')} "
                     "threads)" for i in threadpool_info())


def measure(args):
    import numpy as np
    rng = np.random.default_rng(0)
    total = {"stack": 0.0, "one": 0.0}
    for n_in, n_out in SHAPES:
        x = rng.standard_normal((args.batch_size, args.context, n_in)).astype(np.float32)
        w = rng.standard_normal((n_in, n_out)).astype(np.float32)
        ways = {"stack": lambda: x @ w, "one": lambda: (x.reshape(-1, n_in) @ w).reshape(*x.shape[:-1], n_out)}
        times = {way: [] for way in ways}
        for _ in range(args.repeats):
            for way, f in ways.items():
                t = time.perf_counter()
                f()
                times[way].append(time.perf_counter() - t)
        medians = {way: statistics.median(t) for way, t in times.items()}
        for way in total:
            total[way] += medians[way]
        print(f"[{args.batch_size}, {args.context}, {n_in}] @ [{n_in}, {n_out}]: "
              f"stack {medians['stack'] * 1e3:.2f} ms, "
              f"one product {medians['one'] * 1e3:.2f} ms, stack / one {medians['stack'] / medians['one']:.2f}")
    print(f"a block's four: stack {total['stack'] * 1e3:.1f} ms, one product {total['one'] * 1e3:.1f} ms, "
          f"stack / one {total['stack'] / total['one']:.2f}; BLAS: {blas()}")


def measure_torch(args):
    import torch
    torch.set_num_threads(args.threads)
    total = 0.0
    for n_in, n_out in SHAPES:
        x, w = torch.randn(args.batch_size * args.context, n_in), torch.randn(n_in, n_out)
        times = []
        for _ in range(args.repeats + 1):
            t = time.perf_counter()
            x @ w
            times.append(time.perf_counter() - t)
        total += statistics.median(times[1:])
    blas = next((line.strip() for line in torch.__config__.show().splitlines() if "Math Kernel" in line), "?")
    print(f"torch, a block's four as one product each: {total * 1e3:.1f} ms ({blas}, {args.threads} threads)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--torch-python", help="a python with torch: time its products too")
    p.add_argument("--child", choices=("numpy", "torch"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return measure(args) if args.child == "numpy" else measure_torch(args)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    settings = ["--threads", str(args.threads), "--repeats", str(args.repeats), "--batch-size", str(args.batch_size),
                "--context", str(args.context)]
    for python, child in [(sys.executable, "numpy")] + ([(args.torch_python, "torch")] if args.torch_python else []):
        subprocess.run([python, os.path.abspath(__file__), "--child", child, *settings], env=env, check=True)


if __name__ == "__main__":
    main()
