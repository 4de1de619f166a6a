"""Training from nothing: our train.py --from-scratch against nanoGPT's CPU recipe, side by side.

    python bench/bench_from_scratch.py                              # ours alone
    python bench/bench_from_scratch.py --nanogpt DIR --torch-python PY  # and nanoGPT, in turn
    python bench/bench_from_scratch.py --vocab-sizes 257 1024 4096 --steps 2000   # what a vocabulary buys

The recipe is the one nanoGPT's README gives for a CPU: 4 layers, 4 heads, 128 wide, 64
positions, batch 12, 2000 steps, lr 1e-3 with 100 warm-up steps, cosine to 1e-4, beta2 0.99,
weight decay 0.1, clipping at 1, no dropout, on the same Shakespeare (data/tinyshakespeare.txt,
the last 10% held out). At --vocab-size 257 our tokens are bytes, which on this ASCII text are
nanoGPT's characters, so the losses compare per byte. Larger vocabularies are turned into nats
per byte by the tokens-per-byte of the held-out text. After training, each of our models is kept in
bench/out/scratch-V (the held-out text in bench/out/shakespeare-heldout.txt) and its bits per byte
on the held-out text comes from evaluate.perplexity, as `python evaluate.py perplexity` computes it:
every held-out token predicted once, through rolling windows of the model's 64 positions.

DIR is a checkout of karpathy/nanoGPT (run, never copied); PY a Python with torch. Its data is
prepared from our copy of the text (its input.txt), so nothing is downloaded. Each contender
runs in its own process; ours is timed step by step in-process (time.perf_counter around
train_step), nanoGPT's from its own "iter N: ... time Xms" lines. The validation loss is the
mean over 20 batches of 12 windows, as nanoGPT's eval_iters=20 measures it. --svg FILE draws
every run's validation curve (every 250 steps) and keeps their numbers in the file, so that
--redraw FILE draws it again without training. docs/from_scratch_loss.svg is

    python bench/bench_from_scratch.py --vocab-sizes 257 1024 4096 --svg docs/from_scratch_loss.svg \
        --nanogpt DIR --torch-python PY
"""
import argparse
import html
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

SHAPE = dict(n_layer=4, n_head=4, n_embd=128)  # nanoGPT's CPU recipe; its context is 64
RECIPE = dict(batch_size=12, context=64, accum=1, lr=1e-3, warmup=100, min_lr_ratio=0.1, beta2=0.99, weight_decay=0.1,
              grad_clip=1.0, dropout=0.0)  # train.train_step's settings, as train.py --from-scratch gets them
EVAL_EVERY, EVAL_BATCHES = 250, 20


def ours(vocab_size, steps, seed=0):
    """Train in this process; -> {"step_ms": [..], "curve": [(step, val)], "val": final, "nats_per_byte": .., ...}"""
    import numpy as np

    import bpe
    import evaluate
    import parameters
    import train
    from plumbing import corpus
    from plumbing.memory import keep_freed_memory
    from gpt2_numpy import gpt2, next_token_loss
    keep_freed_memory()  # as train.py's command does (interface/start.py)
    from parameters import init_params
    from optimizer import new_adamw_state

    text, = corpus.read_documents([train.CORPUS])  # one document: split as one text, as train.py splits it
    train_text, val_text = train.split_text(text, 0.1)
    t = time.perf_counter()
    merges = bpe.train_vocab(train_text, vocab_size)
    encoder = bpe.parse_vocab(*bpe.vocab_files(merges))  # as train.py's
    tokenizer_s = time.perf_counter() - t
    hp = {"n_vocab": encoder.n_vocab, "n_ctx": RECIPE["context"], **SHAPE}
    params = init_params(hp, seed)
    train_ids, val_ids = train.text_ids(encoder, text, 0.1, RECIPE["context"])
    bytes_per_token = len(val_text.encode("utf-8")) / len(val_ids)

    def val_loss():
        rng = np.random.default_rng(1)
        return float(np.mean([next_token_loss(gpt2(x, params, hp), y) for x, y in
                              (train.batch(val_ids, 12, RECIPE["context"], rng) for _ in range(EVAL_BATCHES))]))

    recipe = dict(RECIPE, steps=steps, seed=seed)
    state, buffers, times, curve = new_adamw_state(params), {}, [], []
    start = time.perf_counter()
    for step in range(steps):
        t = time.perf_counter()
        train.train_step(params, hp, state, {"kind": "documents", "rows": train_ids}, step, recipe, buffers)
        times.append(time.perf_counter() - t)
        if (step + 1) % EVAL_EVERY == 0 or step + 1 == steps:
            curve.append((step + 1, val_loss()))
    wall = time.perf_counter() - start
    counts = parameters.count_parameters(hp)
    held_out = evaluate.perplexity([val_text], encoder, params, hp)  # evaluate.py perplexity's own function
    keep(f"scratch-{vocab_size}", params, hp, merges, val_text)
    return {"vocab_size": vocab_size, "step_ms": statistics.median(times) * 1000, "wall_s": wall, "curve": curve,
            "val": curve[-1][1], "nats_per_byte": curve[-1][1] / bytes_per_token, "tokenizer_s": tokenizer_s,
            "bytes_per_token": bytes_per_token, "params": counts["total"], "wte_share": counts["wte_share"],
            "bits_per_byte": held_out["bits_per_byte"], "held_out_perplexity": held_out["perplexity"]}


def keep(name, params, hp, merges, val_text):
    """The trained model in bench/out/NAME (the project's format, its vocabulary beside it) and the held-out
    text in bench/out/shakespeare-heldout.txt, so that `python evaluate.py perplexity` can score it again."""
    import bpe
    from plumbing.checkpoint import write_checkpoint

    out = os.path.join(HERE, "out")
    os.makedirs(out, exist_ok=True)  # bench/out/ is not in a fresh clone
    shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        bpe.write_vocab(os.path.join(scratch, "vocab"), merges)
        write_checkpoint(os.path.join(out, name), params, hp, vocab_dir=os.path.join(scratch, "vocab"))
    with open(os.path.join(out, "shakespeare-heldout.txt"), "w", encoding="utf-8") as f:
        f.write(val_text)


def nanogpt(folder, python, steps, threads):
    """nanoGPT's train.py with the recipe, on our copy of the text. -> the same figures, from its output."""
    data = os.path.join(folder, "data", "shakespeare_char")
    shutil.copy(os.path.join(ROOT, "data", "tinyshakespeare.txt"), os.path.join(data, "input.txt"))
    subprocess.run([python, "prepare.py"], cwd=data, check=True, capture_output=True)
    out = tempfile.mkdtemp(prefix="nanogpt-")
    cmd = [python, "train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
           f"--eval_iters={EVAL_BATCHES}", "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4",
           "--n_head=4", "--n_embd=128", f"--max_iters={steps}", f"--lr_decay_iters={steps}", "--dropout=0.0",
           f"--eval_interval={min(EVAL_EVERY, steps)}", f"--out_dir={out}"]  # it evaluates at multiples alone
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    times = [float(m) for m in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", r.stdout, re.M)][1:]
    curve = [(int(s), float(v)) for s, v in re.findall(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)", r.stdout,
                                                       re.M) if int(s) > 0]
    return {"step_ms": statistics.median(times), "wall_s": wall, "curve": curve, "val": curve[-1][1],
            "nats_per_byte": curve[-1][1]}


def round_ticks(lo, hi, most=6):
    """Round tick values covering lo..hi: a step of 1, 2, 2.5 or 5 times a power of ten, at most `most` ticks."""
    span = (hi - lo) or abs(hi) or 1.0
    power = 10.0 ** math.floor(math.log10(span / most))
    step = next(power * m for m in (1, 2, 2.5, 5, 10) if span / (power * m) <= most - 1)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    last = max(last, first + 1)  # a flat line still gets an axis
    decimals = max(0, -math.floor(math.log10(step) + 1e-9) + (step / power == 2.5))
    return [round(i * step, 10) for i in range(first, last + 1)], decimals


def svg(curves, path, title="Validation loss, training from scratch", width=720, height=420):
    """A line chart of validation loss against step, one line a run, as an SVG file: round ticks with
    tick marks and grid lines, a title, and a legend with each line's sample. The curves' numbers go
    in its <desc>, so that --redraw can draw it again without training.   curves: {name: [(step, loss)]}"""
    left, right, top, bottom = 64, 24, 48, 52
    colours, dashes = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"], ["", "7 4", "2 3", "9 3 2 3"]
    xticks, _ = round_ticks(0, max(s for c in curves.values() for s, _ in c), 5)
    lo, hi = min(v for c in curves.values() for _, v in c), max(v for c in curves.values() for _, v in c)
    yticks, decimals = round_ticks(lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo))  # no line on an axis

    def px(s, v):
        return (left + (s - xticks[0]) / (xticks[-1] - xticks[0]) * (width - left - right),
                height - bottom - (v - yticks[0]) / (yticks[-1] - yticks[0]) * (height - top - bottom))

    x0, y0 = px(xticks[0], yticks[0])
    x1, y1 = px(xticks[-1], yticks[-1])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="15" font-weight="bold">'
             f'{html.escape(title)}</text>',
             f'<desc>{html.escape(json.dumps({"title": title, "curves": curves}))}</desc>']
    for tick in xticks:
        x, _ = px(tick, yticks[0])
        parts += [f'<line x1="{x:.1f}" y1="{y0:.1f}" x2="{x:.1f}" y2="{y0 + 5:.1f}" stroke="black"/>',
                  f'<text x="{x:.1f}" y="{y0 + 19:.1f}" text-anchor="middle">{tick:g}</text>']
    for tick in yticks:
        _, y = px(xticks[0], tick)
        parts += [f'<line x1="{x0:.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>',
                  f'<line x1="{x0 - 5:.1f}" y1="{y:.1f}" x2="{x0:.1f}" y2="{y:.1f}" stroke="black"/>',
                  f'<text x="{x0 - 8:.1f}" y="{y + 4:.1f}" text-anchor="end">{tick:.{decimals}f}</text>']
    parts += [f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y0:.1f}" stroke="black"/>',
              f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x0:.1f}" y2="{y1:.1f}" stroke="black"/>',
              f'<text x="{(x0 + x1) / 2:.1f}" y="{height - 12}" text-anchor="middle">step</text>',
              f'<text x="16" y="{(y0 + y1) / 2:.1f}" transform="rotate(-90 16 {(y0 + y1) / 2:.1f})" '
              'text-anchor="middle">validation loss (nats per byte)</text>']
    legend_width = 24 + 7 * max(len(name) for name in curves)
    lx, ly = x1 - legend_width - 10, y1 + 10
    parts.append(f'<rect x="{lx:.1f}" y="{ly:.1f}" width="{legend_width}" height="{8 + 18 * len(curves)}" '
                 'fill="white" stroke="#bbbbbb"/>')
    for i, (name, curve) in enumerate(curves.items()):
        style = f'fill="none" stroke="{colours[i % len(colours)]}" stroke-width="2"' + (
            f' stroke-dasharray="{dashes[i % len(dashes)]}"' if dashes[i % len(dashes)] else "")
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (px(s, v) for s, v in curve))
        parts.append(f'<polyline points="{points}" {style}/>')
        y = ly + 15 + 18 * i
        parts += [f'<line x1="{lx + 6:.1f}" y1="{y - 4:.1f}" x2="{lx + 30:.1f}" y2="{y - 4:.1f}" {style}/>',
                  f'<text x="{lx + 36:.1f}" y="{y:.1f}">{html.escape(name)}</text>']
    with open(path, "w") as f:
        f.write("\n".join(parts + ["</svg>"]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--vocab-sizes", type=int, nargs="+", default=[257])
    p.add_argument("--nanogpt", help="a checkout of karpathy/nanoGPT, to run side by side")
    p.add_argument("--torch-python", default=sys.executable, help="a Python with torch, for nanoGPT")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--svg", help="write the validation curves here")
    p.add_argument("--redraw", metavar="SVG", help="draw an SVG this bench wrote again, from the numbers it holds "
                   "(to --svg, else in place): no training")
    args = p.parse_args()
    if args.redraw:
        with open(args.redraw) as f:
            kept = re.search(r"<desc>(.*?)</desc>", f.read(), re.S)
        if not kept:
            raise SystemExit(f"error: {args.redraw} holds no curves: only an SVG this bench drew can be redrawn")
        drawn = json.loads(html.unescape(kept.group(1)))
        svg(drawn["curves"], args.svg or args.redraw, drawn["title"])
        return print(args.svg or args.redraw)
    results = {}
    for vocab_size in args.vocab_sizes:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", str(vocab_size), str(args.steps)],
                           capture_output=True, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS=str(args.threads),
                                    OPENBLAS_NUM_THREADS=str(args.threads)))
        if r.returncode:
            raise SystemExit(r.stderr[-3000:])
        results[f"ours, vocab {vocab_size}"] = json.loads(r.stdout.splitlines()[-1])
    if args.nanogpt:
        results["nanoGPT (characters)"] = nanogpt(args.nanogpt, args.torch_python, args.steps, args.threads)
    print(f"{args.steps} steps, B=12, T=64, 4 layers, 4 heads, 128 wide, {args.threads} threads")
    for name, r in results.items():
        extra = (f", {r['bytes_per_token']:.2f} bytes a token, {r['params']:,} parameters, the token embedding "
                 f"{r['wte_share']:.1%}, tokenizer {r['tokenizer_s']:.1f} s" if "params" in r else "")
        print(f"{name}: {r['step_ms']:.1f} ms a step (median), {r['wall_s']:.0f} s in all, validation loss "
              f"{r['val']:.3f} nats a token = {r['nats_per_byte']:.3f} nats a byte{extra}")
        if "bits_per_byte" in r:
            print(f"  held-out text through evaluate.perplexity: {r['bits_per_byte']:.4f} bits a byte, perplexity "
                  f"{r['held_out_perplexity']:.3f}; again with python evaluate.py perplexity "
                  f"bench/out/shakespeare-heldout.txt --model bench/out/scratch-{r['vocab_size']} --json")
    if args.svg:
        svg({name: [(s, v / r.get("bytes_per_token", 1.0)) for s, v in r["curve"]] for name, r in results.items()},
            args.svg, f"From scratch on Shakespeare: validation loss ({args.steps} steps, 4 layers, 128 wide)")
        print(args.svg)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        print(json.dumps(ours(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        main()
