"""Train the pair that bench_speculative.py times: a model and its draft, from nothing, on Shakespeare.

    python bench/train_speculative_pair.py                       # both, cached under bench/out/
    python bench/train_speculative_pair.py --target-steps 600 --draft-steps 1500
    python bench/train_speculative_pair.py --time-steps 3        # only time a few steps of each

Random weights never agree, so a pair that does must be trained. Both come from train.py
--from-scratch on data/tinyshakespeare.txt, with the same tokenizer (the target learns it; the
draft reads it back with --tokenizer), so the draft's ids are the target's:

- the target: nanoGPT's Shakespeare shape (config/train_shakespeare_char.py): 6 layers, 6 heads,
  384 wide, context 256; lr 1e-3, beta2 0.99, 100 warm-up steps; no dropout (a few hundred CPU
  steps are far from overfitting). nanoGPT's batch of 64 would take hours here: --target-batch.
- the draft: nanoGPT's CPU "baby" shape (bench_from_scratch.py's SHAPE): 4 layers, 4 heads, 128
  wide, but with the target's context of 256, so that it can draft wherever the target reads.

A folder that already holds the finished run is kept (delete it to train again); a run stopped
part way, after one of its saves, is resumed. Each run's log is beside its folder
(bench/out/spec-target.log, bench/out/spec-draft.log).
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "out")
TARGET = dict(n_layer=6, n_head=6, n_embd=384)  # nanoGPT's train_shakespeare_char.py
DRAFT = dict(n_layer=4, n_head=4, n_embd=128)  # nanoGPT's CPU recipe (bench_from_scratch.SHAPE)
CONTEXT = 256
RECIPE = ["--lr", "1e-3", "--min-lr-ratio", "0.1", "--beta2", "0.99", "--weight-decay", "0.1", "--grad-clip", "1.0",
          "--dropout", "0.0", "--context", str(CONTEXT), "--seed", "0"]


def train_command(out, shape, steps, batch, vocab_size=None, tokenizer=None):
    """train.py --from-scratch with the recipe, into out."""
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--from-scratch", "--out", out, "--steps", str(steps),
           "--batch-size", str(batch), "--warmup", str(min(100, steps // 10)), "--eval-every", str(max(steps // 10, 1)),
           "--sample-every", str(max(steps // 4, 1)), "--save-every", str(max(steps // 4, 1)), *RECIPE,
           *(f"--{k.replace('_', '-')}={v}" for k, v in shape.items())]
    cmd += ["--vocab-size", str(vocab_size)] if tokenizer is None else ["--tokenizer", tokenizer]
    return cmd


def saved_steps(folder):
    """(steps the run saved in folder has done, steps it was asked for), or None: no run there."""
    import json

    import numpy as np

    if not os.path.exists(os.path.join(folder, "train_config.json")):
        return None
    with open(os.path.join(folder, "train_config.json")) as f:
        wanted = json.load(f)["steps"]
    with np.load(os.path.join(folder, "train_state.npz")) as state:
        return int(state["step"]), wanted


def train(name, cmd, folder):
    """Run one training (its output to a log beside the folder), unless its model is there already;
    a run stopped part way (Ctrl-C, or killed after a save) is resumed with train.py --resume."""
    saved = saved_steps(folder)
    if saved and saved[0] >= saved[1]:
        print(f"{folder}: trained already, {saved[0]} steps (delete it to train again)")
        return
    if saved:
        cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--out", folder, "--resume"]
    log = folder + ".log"
    print(f"training {name}: {' '.join(cmd)}\n  log: {log}", flush=True)
    start = time.perf_counter()
    with open(log, "a") as f:
        r = subprocess.run(cmd + ["--quiet"], stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        sys.exit(f"{name}: train.py exited with {r.returncode}: see {log}")
    print(f"  {name} done in {time.perf_counter() - start:.0f} s", flush=True)


def time_steps(shape, steps, batch, vocab_size):
    """Seconds a training step of this shape takes here: train.train_step in this process, as train.py
    --from-scratch runs it (the median of `steps` steps, after one to warm up)."""
    import numpy as np

    sys.path.insert(0, ROOT)
    import train
    from parameters import init_params
    from optimizer import new_adamw_state

    hp = {"n_vocab": vocab_size, "n_ctx": CONTEXT, **shape}
    params, ids = init_params(hp), np.random.default_rng(0).integers(0, vocab_size, 100_000)
    state, buffers, times = new_adamw_state(params), {}, []
    recipe = dict(steps=steps + 1, batch_size=batch, context=CONTEXT, accum=1, lr=1e-3, min_lr_ratio=0.1, warmup=1,
                  weight_decay=0.1, grad_clip=1.0, dropout=0.0, seed=0, beta2=0.99)
    for step in range(steps + 1):
        start = time.perf_counter()
        train.train_step(params, hp, state, {"kind": "documents", "rows": ids}, step, recipe, buffers)
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-steps", type=int, default=600)
    p.add_argument("--draft-steps", type=int, default=1500)
    p.add_argument("--target-batch", type=int, default=8, help="windows of 256 tokens a step (nanoGPT's: 64)")
    p.add_argument("--draft-batch", type=int, default=12)
    p.add_argument("--vocab-size", type=int, default=257, help="the tokenizer the target learns (257: bytes, as "
                                                               "nanoGPT's character-level Shakespeare)")
    p.add_argument("--out", default=OUT, help="where the pair goes (default bench/out/)")
    p.add_argument("--time-steps", type=int, metavar="N", help="only time N steps of each (random data, "
                                                               "nothing written) and say how long the pair would take")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    target, draft = os.path.join(args.out, "spec-target"), os.path.join(args.out, "spec-draft")
    if args.time_steps:
        t = time_steps(TARGET, args.time_steps, args.target_batch, args.vocab_size)
        d = time_steps(DRAFT, args.time_steps, args.draft_batch, args.vocab_size)
        print(f"a step: target {t:.2f} s, draft {d:.2f} s; {args.target_steps} + {args.draft_steps} steps: about "
              f"{(t * args.target_steps + d * args.draft_steps) / 60:.0f} min (and the evaluations, samples, saves)")
        return
    train("the target", train_command(target, TARGET, args.target_steps, args.target_batch, args.vocab_size), target)
    train("the draft", train_command(draft, DRAFT, args.draft_steps, args.draft_batch, tokenizer=target), draft)
    print(f"the pair: --model {target} --draft {draft}")


if __name__ == "__main__":
    main()
