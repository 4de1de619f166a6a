"""Induction heads while the README's from-scratch Shakespeare model learns: each head's detect_head score
(circuits.py heads --text random:N --pattern induction) at steps 0, 500, 1,000 and 2,000.

    python bench/induction_heads.py                          # trains (a few minutes), then draws
    python bench/induction_heads.py --rescore        # scores the models it left in bench/out/induction again
    python bench/induction_heads.py --redraw bench/out/induction/scores.json   # draws again, no training

It runs the README's commands as they are: bpe.py --train for the vocabulary, then train.py --from-scratch
with the README's recipe, and --save-every 500, into bench/out/induction/run. Each save replaces that
folder whole, 500 steps apart, so the script copies each one as it appears (to step-500/, step-1000/;
step 2,000 is the run itself). Step 0 is the model before its first step: parameters.init_params on the
run's hparams and seed, as train.py makes it. Each model is scored on --seeds texts of N random ids said
twice after <|endoftext|> (N = (n_ctx - 1) // 2, the most that fit), by circuits.head_scores, for induction
heads and for previous-token heads (the first half of the circuit), with the loss on each copy of the ids;
the means over the texts are drawn, a heatmap of layers x heads a pattern and a step (--svg, default
docs/induction_heads.svg). The numbers go to bench/out/induction/scores.json, beside the models.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "out", "induction")
VOCAB = ["bpe.py", "--train", os.path.join("data", "tinyshakespeare.txt"), "--vocab-size", "1024"]  # + --out
TRAIN = ["train.py", "--from-scratch", "--n-layer", "4", "--n-head", "4", "--n-embd", "128", "--context", "64",
         "--batch-size", "12", "--steps", "2000", "--lr", "1e-3", "--warmup", "100", "--min-lr-ratio", "0.1",
         "--beta2", "0.99"]  # the README's, + --tokenizer and --out
STEPS = (0, 500, 1000, 2000)


def step_of(folder):
    """The step a saved run holds (train_state.npz's), or None while there is none."""
    import numpy as np

    try:
        with np.load(os.path.join(folder, "train_state.npz")) as z:
            return int(z["step"])
    except (OSError, KeyError, ValueError):
        return None


def train(out):
    """The README's two commands; each save of the run copied as it appears. -> {step: model folder}"""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    vocab, run = os.path.join(out, "shakespeare-1024"), os.path.join(out, "run")
    subprocess.run([sys.executable, *VOCAB, "--out", vocab], cwd=ROOT, check=True)
    p = subprocess.Popen([sys.executable, *TRAIN, "--tokenizer", vocab, "--out", run, "--save-every", "500",
                          "--eval-every", "500", "--sample-every", "100000", "--quiet"], cwd=ROOT)
    folders, seen = {}, None
    while p.poll() is None or step_of(run) != seen:
        step = step_of(run)
        if step != seen and step in STEPS[1:-1]:
            folders[step] = os.path.join(out, f"step-{step}")
            shutil.copytree(run, folders[step])  # 500 steps before the next save replaces it
            if step_of(folders[step]) != step:
                sys.exit(f"the copy of step {step} holds another step: a save came during the copy")
        seen = step
        time.sleep(0.2)
    if p.returncode:
        sys.exit(f"train.py failed ({p.returncode})")
    folders[STEPS[-1]] = run
    return folders


PATTERNS = ("induction", "previous")  # the heads scored: the circuit's second head, and the first one it needs


def scores(folders, seeds):
    """Each pattern's mean head scores a step, {pattern: {step: [L, H]}}; the mean loss on each half of the texts,
    {step: [first copy, second copy]} (an induction head makes the second the lower); and the texts' length."""
    import numpy as np

    import circuits
    import gpt2_numpy as g
    from parameters import init_params
    from interface import loading

    found, losses = {pattern: {} for pattern in PATTERNS}, {}
    for step in STEPS:
        encoder, hparams, params = loading.load_model(folders[max(STEPS[1], step)], quiet=True)
        if step == 0:
            with open(os.path.join(folders[STEPS[-1]], "train_config.json"), encoding="utf-8") as f:
                params = init_params(hparams, json.load(f)["seed"])  # as train.py began
        n = (hparams["n_ctx"] - 1) // 2
        texts = [circuits.repeated_random_tokens(n, hparams["n_vocab"], encoder.eot, seed) for seed in range(seeds)]
        for pattern in PATTERNS:
            found[pattern][step] = np.mean([circuits.head_scores(params, hparams, ids, pattern) for ids in texts],
                                           0).tolist()
        logprobs = np.array([g.token_logprobs(g.gpt2(ids, params, hparams)[:-1], ids[1:]) for ids in texts])
        losses[step] = [float(-logprobs[:, :n].mean()), float(-logprobs[:, n:].mean())]  # predicting 1..n, n+1..2n
    return found, losses, 2 * n + 1


def svg(found, losses, path, n_tokens):
    """A heatmap of layers x heads for each pattern (a row) and step (a column), white 0 to dark blue at 1,
    each cell labelled; under each step, the loss on the first and the second copy of the random ids."""
    first = next(iter(found.values()))
    L, H = len(next(iter(first.values()))), len(next(iter(first.values()))[0])
    cell, gap, left, top = 44, 36, 90, 64
    panel = L * cell + 48
    width = left + len(first) * (H * cell + gap)
    height = top + len(found) * panel + 56
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="20" font-size="15">Each head\'s detect_head score ("mul") on {n_tokens} tokens, '
             'random ids said twice, through training</text>']
    for row, (pattern, by_step) in enumerate(found.items()):
        y0 = top + row * panel
        parts.append(f'<text x="8" y="{y0 + L * cell / 2}" font-size="13">{pattern}</text>')
        for k, (step, grid) in enumerate(by_step.items()):
            x0 = left + k * (H * cell + gap)
            if row == 0:
                parts.append(f'<text x="{x0 + H * cell / 2}" y="{top - 26}" text-anchor="middle">step {step}</text>')
            parts += [f'<text x="{x0 + h * cell + cell / 2}" y="{y0 - 6}" text-anchor="middle" fill="#666">H{h}</text>'
                      for h in range(H)]
            for i, values in enumerate(grid):
                if k == 0:
                    parts.append(f'<text x="{left - 8}" y="{y0 + i * cell + cell / 2 + 4}" text-anchor="end" '
                                 f'fill="#666">L{i}</text>')
                for h, v in enumerate(values):
                    shade = min(max(v, 0.0), 1.0)
                    r, g, b = (int(255 - shade * (255 - c)) for c in (31, 78, 160))
                    parts.append(f'<rect x="{x0 + h * cell}" y="{y0 + i * cell}" width="{cell - 2}" '
                                 f'height="{cell - 2}" fill="rgb({r},{g},{b})"/><text x="{x0 + h * cell + cell / 2 - 1}" '
                                 f'y="{y0 + i * cell + cell / 2 + 4}" text-anchor="middle" '
                                 f'fill="{"white" if shade > 0.55 else "black"}">{v:.2f}</text>')
    y = top + len(found) * panel
    for k, (step, (one, two)) in enumerate(losses.items()):
        parts.append(f'<text x="{left + k * (H * cell + gap) + H * cell / 2}" y="{y}" text-anchor="middle" '
                     f'fill="#444">loss {one:.2f} then {two:.2f}</text>')
    half = (n_tokens - 1) // 2
    parts.append(f'<text x="{left}" y="{height - 14}" fill="#666">a perfect induction head scores {half}/{n_tokens} = '
                 f'{half / n_tokens:.2f} (only the second copy has a token to find), a perfect previous-token head '
                 f'{n_tokens - 1}/{n_tokens}; the loss, in nats, on the first copy then on the second</text>')
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts + ["</svg>"]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10, help="random texts a model is scored on (default 10)")
    p.add_argument("--svg", default=os.path.join(ROOT, "docs", "induction_heads.svg"))
    p.add_argument("--redraw", metavar="JSON", help="draw again from a scores.json this script wrote: no training")
    p.add_argument("--rescore", action="store_true", help="score the models a run left in bench/out/induction again: "
                                                          "no training")
    args = p.parse_args()
    sys.path.insert(0, ROOT)
    if args.redraw:
        with open(args.redraw, encoding="utf-8") as f:
            kept = json.load(f)
    else:
        folders = {step: os.path.join(OUT, f"step-{step}") for step in STEPS[1:-1]}
        folders[STEPS[-1]] = os.path.join(OUT, "run")
        found, losses, n_tokens = scores(folders if args.rescore else train(OUT), args.seeds)
        kept = {"n_tokens": n_tokens, "seeds": args.seeds, "scores": found, "loss": losses}
        with open(os.path.join(OUT, "scores.json"), "w", encoding="utf-8") as f:
            json.dump(kept, f, indent=1)
    svg(kept["scores"], kept["loss"], args.svg, kept["n_tokens"])
    for pattern, by_step in kept["scores"].items():
        for step, grid in by_step.items():
            print(f"{pattern}, step {step}: " + " | ".join(" ".join(f"{v:.3f}" for v in row) for row in grid))
    for step, (one, two) in kept["loss"].items():
        print(f"step {step}: loss {one:.3f} on the first copy, {two:.3f} on the second")
    print(args.svg)

if __name__ == "__main__":
    main()
