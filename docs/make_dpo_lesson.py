"""The DPO lesson's preference set and its figure (docs/fine_tuning.md, "Preference tuning: DPO").

    python docs/make_dpo_lesson.py data                          # writes data/preferences.jsonl
    python docs/make_dpo_lesson.py figure RUN/train_log.jsonl    # writes RUN/dpo_rewards.svg
    python docs/make_dpo_lesson.py figure RUN/train_log.jsonl --out docs/dpo_rewards.svg   # the tracked figure

The set is made for the project: 64 requests, each answered twice, once kindly (chosen) and once
curtly (rejected), from the phrases below in a seeded order; no text is copied from anywhere. The
figure draws, from a run's train_log.jsonl, rewards/accuracies and rewards/margins over the steps,
for the training batches and for the held-out pairs (val_...).
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ASKS = ["pass me the salt", "open the window", "help me carry this box", "lend me a pen", "tell me the time",
        "close the door", "read this letter to me", "water the plants", "wait for me", "show me the way to the market",
        "hold my coat", "find my keys", "call a doctor", "fetch some bread", "mend my shoe", "light the fire"]
OPENINGS = ["Could you", "Would you", "Will you", "Can you"]
KIND = [" Of course, gladly.", " Yes, with pleasure.", " Certainly, right away.", " Gladly, my friend."]
CURT = [" No.", " Do it yourself.", " Not now, go away.", " Why should I?"]


def pairs():
    rng = random.Random(0)
    made = [{"prompt": f"{opening} {ask}?", "chosen": rng.choice(KIND), "rejected": rng.choice(CURT)}
            for ask in ASKS for opening in OPENINGS]
    rng.shuffle(made)
    return made


def write_data(path=os.path.join(ROOT, "data", "preferences.jsonl")):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(p) + "\n" for p in pairs()))
    print(f"{path}: {len(pairs())} pairs")


def polyline(points, width, height, x_max, y_min, y_max, colour, dashed=False):
    def at(x, y):
        return f"{40 + (width - 60) * x / x_max:.1f},{height - 30 - (height - 50) * (y - y_min) / (y_max - y_min):.1f}"

    xy = " ".join(at(x, y) for x, y in points)
    dash = ' stroke-dasharray="5,4"' if dashed else ""
    return f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{xy}"/>'


def figure(log_path, out=None):
    """The figure of the run whose train_log.jsonl is log_path, written to out (None: dpo_rewards.svg beside the
    log: the tracked docs/dpo_rewards.svg is rewritten only when asked for)."""
    out = out or os.path.join(os.path.dirname(os.path.abspath(log_path)), "dpo_rewards.svg")
    with open(log_path, encoding="utf-8") as f:
        log = [json.loads(line) for line in f]
    train = [r for r in log if "lr" in r]
    val = [r for r in log if "val_loss" in r]
    steps = max(r["step"] for r in log)
    top = max([r["rewards/margins"] for r in train] + [r["val_rewards/margins"] for r in val] + [1.0])
    width, height = 640, 300
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="12">', '<rect width="100%" height="100%" fill="white"/>',
             f'<line x1="40" y1="{height - 30}" x2="{width - 20}" y2="{height - 30}" stroke="black"/>',
             f'<line x1="40" y1="20" x2="40" y2="{height - 30}" stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">step (of {steps})</text>',
             f'<text x="44" y="16">accuracies (0 to 1) and margins (0 to {top:.2f}), DPO, beta 0.1</text>']
    for name, colour, scale in (("rewards/accuracies", "#1f77b4", 1.0), ("rewards/margins", "#d62728", top)):
        parts.append(polyline([(r["step"], r[name] / scale) for r in train], width, height, steps, 0, 1.05, colour))
        if val:
            parts.append(polyline([(r["step"], r["val_" + name] / scale) for r in val], width, height, steps, 0, 1.05,
                                  colour, dashed=True))
    for i, (label, colour) in enumerate((("rewards/accuracies", "#1f77b4"), ("rewards/margins", "#d62728"),
                                          ("solid: training batch; dashed: held-out pairs", "black"))):
        parts.append(f'<text x="{width - 330}" y="{height - 90 + 16 * i}" fill="{colour}">{label}</text>')
    parts.append("</svg>")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")
    print(f"{out}: {len(train)} steps, {len(val)} validations")


if __name__ == "__main__":
    if sys.argv[1:2] == ["data"]:
        write_data()
    elif sys.argv[1:2] == ["figure"] and len(sys.argv) == 3:
        figure(sys.argv[2])
    elif sys.argv[1:2] == ["figure"] and len(sys.argv) == 5 and sys.argv[3] == "--out":
        figure(sys.argv[2], sys.argv[4])
    else:
        sys.exit(__doc__)
