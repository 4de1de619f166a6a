"""LoRA: a step's speed against full fine-tuning's, and the memory that lets 1558M fine-tune on 24 GB.

    python bench/make_random_checkpoint.py 124M          # once each (needs tensorflow-cpu)
    python bench/make_random_checkpoint.py 1558M
    python bench/bench_lora.py speed                     # (a) 124M, B=4, T=64: LoRA step / full step
    python bench/bench_lora.py memory                    # (b) 1558M, B=1, T=256: LoRA's peak RSS,
                                                         #     and full fine-tuning refused

speed: train.py's own train_step on the same random 124M weights, a LoRA step (rank 8 on c_attn,
the defaults; the weights the file's read-only maps) and a full fine-tuning step (a writable copy,
AdamW on every parameter) alternated, the order swapped each round so that drift on a shared
machine hits both alike. Prints each one's median over the rounds after the first, and the median
of the rounds' ratios LoRA / full.

memory: `python train.py --model 1558M-random --lora-rank 8 --batch-size 1 --context 256` for a
few steps and its save (the merged checkpoint and the adapter), in a process of its own, whose
peak RSS (resource usage of that child, from os.wait4) is printed; then the same without
--lora-rank, which must be refused in one line (exit 2) before anything is allocated: its own
peak RSS shows it. The text is random words, written to a temporary folder.
"""
import argparse
import random
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

WORDS = "the cat sat on a mat and the dog ran to the park while birds sang in tall green trees".split()


def speed(args):
    import numpy as np

    import optimizer
    import train
    from plumbing.checkpoint import load_checkpoint
    hp, base = load_checkpoint(args.folder)
    full = train.writable_copy(base)
    adapters = train.new_adapters(base, args.rank, args.targets.split(","), seed=0)
    lora = train.with_adapters(base, adapters, 1.0)
    runs = {"full": (full, optimizer.new_adamw_state(full), None),
            "lora": (lora, optimizer.new_adamw_state(adapters), adapters)}
    buffers = {kind: {} for kind in runs}
    tokens = np.random.default_rng(0).integers(0, hp["n_vocab"], 100_000)
    recipe = train.recipe_with(steps=args.steps, batch_size=args.batch_size, context=args.context, warmup=0)
    times = {kind: [] for kind in runs}
    for step in range(args.steps):
        for kind in (("lora", "full") if step % 2 else ("full", "lora")):
            params, state, trained = runs[kind]
            t = time.perf_counter()
            train.train_step(params, hp, state, {"kind": "documents", "rows": tokens}, step, recipe, buffers[kind],
                             trained)
            times[kind].append(time.perf_counter() - t)
    later = {kind: t[1:] or t for kind, t in times.items()}
    ratio = statistics.median(a / b for a, b in zip(later["lora"], later["full"]))
    print(f"{args.folder}: B={args.batch_size}, T={args.context}, {args.steps} rounds, LoRA rank {args.rank} on "
          f"{args.targets}")
    for kind, label in (("full", "full fine-tuning step"), ("lora", "LoRA step")):
        print(f"  {label:<24}{statistics.median(later[kind]) * 1e3:9.0f} ms")
    print(f"  LoRA / full (median of the rounds' ratios): {ratio:.2f}")
    print(f"  peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


def child(command):
    """Run a command in a process of its own. -> (exit code, stderr's last line, its peak RSS in MB, seconds)"""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return os.waitstatus_to_exitcode(status), (lines or [""])[-1], usage.ru_maxrss / 1024, time.perf_counter() - t


def memory(args):
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        data = os.path.join(tmp, "notes.txt")
        rng = random.Random(0)
        with open(data, "w", encoding="utf-8") as f:
            f.write(" ".join(rng.choice(WORDS) for _ in range(50_000)))
        common = [sys.executable, os.path.join(ROOT, "train.py"), "--model", args.folder, "--data", data,
                  "--batch-size", str(args.batch_size), "--context", str(args.context), "--steps", str(args.steps),
                  "--eval-every", str(args.steps), "--sample-every", str(10 * args.steps), "--val-fraction", "0.1",
                  "--quiet"]
        print(f"{args.folder}: B={args.batch_size}, T={args.context}, {args.steps} steps and a save")
        code, line, peak, seconds = child(common + ["--out", os.path.join(tmp, "full")])
        refused = code == 2 and "needs" in line
        print(f"  full fine-tuning: exit {code} ({'refused' if refused else 'NOT refused'}), peak RSS {peak:.0f} MB, "
              f"{seconds:.1f} s: {line}")
        code, line, peak, seconds = child(common + ["--out", os.path.join(tmp, "lora"), "--lora-rank", str(args.rank),
                                                    "--lora-targets", args.targets])
        print(f"  LoRA rank {args.rank} on {args.targets}: exit {code}, peak RSS {peak / 1024:.2f} GB, "
              f"{seconds:.0f} s in all{'' if code == 0 else ': ' + line}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=["speed", "memory"])
    p.add_argument("--folder", help="the model (default: bench/out/124M-random for speed, 1558M-random for memory)")
    p.add_argument("--batch-size", type=int, help="default: 4 for speed, 1 for memory")
    p.add_argument("--context", type=int, help="default: 64 for speed, 256 for memory")
    p.add_argument("--steps", type=int, help="rounds (speed, default 6) or training steps (memory, default 3)")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--targets", default="c_attn")
    p.add_argument("--tmp", help="where memory's run writes its checkpoints (default: the system's; 1558M's merged "
                                 "model is 6.2 GB)")
    args = p.parse_args()
    is_speed = args.part == "speed"
    args.folder = args.folder or os.path.join(HERE, "out", "124M-random" if is_speed else "1558M-random")
    args.batch_size = args.batch_size or (4 if is_speed else 1)
    args.context = args.context or (64 if is_speed else 256)
    args.steps = args.steps or (6 if is_speed else 3)
    (speed if is_speed else memory)(args)


if __name__ == "__main__":
    main()
