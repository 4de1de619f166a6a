"""Draw docs/steering_sweep.svg: ActAdd's "Love" - "Hate" at each layer and coefficient, measured as the paper
measures a steering's effect on a topic: the change in the log-probability of a word list.

    python docs/make_steering_figure.py models/baby        # the README's from-scratch Shakespeare model
    python docs/make_steering_figure.py models/baby " love" " hate"    # another pair: the table alone

For each text (TEXTS lines of the validation tenth of data/tinyshakespeare.txt, WINDOW tokens each after
<|endoftext|>) and each position past the steered front, the next-token log-probability of the love words
(log Σ p(w), w in LOVE) and of the hate words (HATE), steered less unsteered; the figure shows their mean
difference, Δ log p(love) − Δ log p(hate), in nats: above 0, the steering moved the text toward love. Only the
words the model's vocabulary holds as one token count; the script prints which. Plain SVG, no plotting library.
"""
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import look_inside  # noqa: E402
import steer  # noqa: E402
from gpt2_numpy import log_softmax  # noqa: E402
from interface import loading  # noqa: E402

COEFFS = (1, 2, 5, 10, 20)
TEXTS, WINDOW = 24, 48
LOVE = (" love", " loves", " loved", " lovely", " sweet", " dear", " gentle", " kind", " fair", " joy", " heart",
        " friend", " kiss", " happy", " good", " grace")
HATE = (" hate", " hated", " death", " dead", " die", " kill", " foul", " curse", " blood", " villain", " enemy",
        " war", " traitor", " vile", " grief", " fear")
W, H, LEFT, RIGHT, TOP, BOTTOM = 560, 340, 60, 110, 30, 50
COLOURS = ("#9ecae1", "#6baed6", "#3182bd", "#08519c", "#08306b")


def single_tokens(encoder, words):
    return {w: ids[0] for w in words if len(ids := encoder.encode(w)) == 1}


def texts(encoder):
    """TEXTS windows of WINDOW tokens from the validation tenth, each after <|endoftext|>, starting at a line."""
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()
    held_out = text[int(len(text) * 0.9):]
    lines = [i + 1 for i, c in enumerate(held_out) if c == "\n"]
    starts = lines[::max(1, len(lines) // TEXTS)][:TEXTS]
    return [[encoder.eot] + encoder.encode(held_out[s:s + 400])[:WINDOW - 1] for s in starts]


def mass(logits, ids):
    """log Σ_w p(w) at each position.   [B, T, V] -> [B, T]"""
    lp = log_softmax(logits)[..., ids]
    top = lp.max(-1, keepdims=True)
    return (top + np.log(np.exp(lp - top).sum(-1, keepdims=True)))[..., 0]


def sweep(model, pair=("Love", "Hate")):
    encoder, hparams, params = loading.load_model(model, quiet=True)
    love, hate = single_tokens(encoder, LOVE), single_tokens(encoder, HATE)
    if not love or not hate:
        sys.exit(f"{model}: its vocabulary holds none of the {'love' if not love else 'hate'} words as one token")
    batch = np.array(texts(encoder))
    plain = look_inside.run_with_hooks(batch, params, hparams, {})
    add, sub = ([encoder.eot] + encoder.encode(t) for t in pair)
    n = max(len(add), len(sub))
    results = {}
    for layer in range(hparams["n_layer"]):
        for coeff in COEFFS:
            v = steer.act_add_vector(params, hparams, add, sub, layer, coeff, pad_id=encoder.encode(" ")[0])
            logits = look_inside.run_with_hooks(batch, params, hparams, steer.act_add_hooks(v, layer))
            shift = [float((mass(logits, list(w.values())) - mass(plain, list(w.values())))[:, n:].mean())
                     for w in (love, hate)]
            results[(layer, coeff)] = shift
    return {"love": list(love), "hate": list(hate), "n": n, "n_layer": hparams["n_layer"],
            "shifts": {f"{layer},{coeff}": s for (layer, coeff), s in results.items()}}


def svg(run):
    layers = range(run["n_layer"])
    score = {k: s[0] - s[1] for k, s in run["shifts"].items()}
    low, high = min(0.0, *score.values()), max(score.values())
    x = lambda layer: LEFT + layer / max(1, run["n_layer"] - 1) * (W - LEFT - RIGHT)  # noqa: E731
    y = lambda v: TOP + (high - v) / (high - low) * (H - TOP - BOTTOM)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           'font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>']
    step = 10 ** math.floor(math.log10((high - low) / 2)) if high > low else 1
    for i in range(math.floor(low / step), math.ceil(high / step) + 1):
        v = i * step
        if low <= v <= high:
            out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                       f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    for layer in layers:
        out.append(f'<text x="{x(layer):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{layer}</text>')
    out.append(f'<text x="{(W - RIGHT + LEFT) / 2}" y="{H - 12}" text-anchor="middle">layer: blocks.L.hook_resid_pre'
               '</text>')
    for coeff, colour in zip(COEFFS, COLOURS):
        line = " ".join(f"{x(layer):.1f},{y(score[f'{layer},{coeff}']):.1f}" for layer in layers)
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [f'<circle cx="{x(layer):.1f}" cy="{y(score[f"{layer},{coeff}"]):.1f}" r="3.5" fill="{colour}"/>'
                for layer in layers]
    for i, (coeff, colour) in enumerate(zip(COEFFS, COLOURS)):
        out.append(f'<rect x="{W - RIGHT + 14}" y="{TOP + 8 + 18 * i}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{W - RIGHT + 32}" y="{TOP + 18 + 18 * i}">coeff {coeff}</text>')
    out.append(f'<text x="{W / 2}" y="18" text-anchor="middle">"Love" − "Hate": Δ log p(love words) − '
               'Δ log p(hate words), nats</text></svg>')
    return "\n".join(out) + "\n"


def main():
    pair = tuple(sys.argv[2:4]) or ("Love", "Hate")
    run = sweep(sys.argv[1], pair)
    if pair == ("Love", "Hate"):
        with open(os.path.join(HERE, "steering_sweep.svg"), "w", encoding="utf-8") as f:
            f.write(svg(run))
    print(json.dumps({k: run[k] for k in ("love", "hate", "n")}))
    print("layer " + "".join(f"{'coeff ' + str(c):>22}" for c in COEFFS))
    for layer in range(run["n_layer"]):
        print(f"{layer:<6}" + "".join(f"{s[0] - s[1]:>+8.3f} ({s[0]:+.2f}/{s[1]:+.2f})"
                                      for c in COEFFS for s in [run["shifts"][f"{layer},{c}"]]))


if __name__ == "__main__":
    main()
