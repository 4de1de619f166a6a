"""Draw docs/residual_stream_kl.svg and docs/residual_stream_probes.svg, and print the tables of
docs/residual_stream.md, on the README's from-scratch Shakespeare model (models/baby: 4 blocks, 128 wide, a
vocabulary of 1,024 learned from the text).

    python docs/make_residual_stream_figures.py models/baby [--steps 300] [--lens-out models/baby-lens]

1. The lens: a tuned lens trained with lens.train_lens (tuned-lens's defaults: SGD, Nesterov 0.9, lr 1 x 0.1,
   weight decay 1e-3, KL) on the training 90% of data/tinyshakespeare.txt in windows of 64 tokens, 8 a step,
   in order; then each layer's KL from the model's final distribution, logit lens (translators at zero) against
   tuned lens, on 64 windows of the held-out 10%.
2. The probes: data/speakers.jsonl (data/make_speakers.py: 200 speeches' first lines by women, label 1, and 200
   by men), the first 280 texts to fit on, the last 120 held out; at the embeddings and each block's output, at
   each text's last token and averaged over its tokens; mean-diff and logistic (C = 1, standardized), and the
   same logistic probe fit on shuffled labels (a control task: what a probe this wide finds in noise).
3. Pushing along the direction: at each layer, the mean-diff direction of the last tokens (μ₁ - μ₀ of the texts
   fit on) added at every position of the held-out texts, women's pushed by -1 x, men's by +1 x; the readout is
   how far the model's next-token log-probabilities at the last token move along the two classes' own
   difference (the held-out women's mean log p minus the men's), as a share of that difference; beside it,
   a random direction of the same norm.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import gpt2_numpy as g  # noqa: E402
import lens as LENS  # noqa: E402
import look_inside  # noqa: E402
import train  # noqa: E402
from interface.loading import load_model  # noqa: E402
from plumbing import lens_files  # noqa: E402

CONTEXT, BATCH, HELD_OUT_WINDOWS, FIT = 64, 8, 64, 280
W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 300, 60, 170, 30, 44


def shakespeare(encoder):
    """(training windows, held-out windows) of tiny Shakespeare, train.py's 90/10 split of the text."""
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        fit, held_out = train.split_text(f.read(), 0.1)
    cut = [np.asarray(encoder.encode(t), np.int64) for t in (fit, held_out)]
    return [ids[:len(ids) // CONTEXT * CONTEXT].reshape(-1, CONTEXT) for ids in cut]


def kl_by_layer(windows, params, hparams, lens):
    """Each translator's mean KL(p_final ‖ q_l) over the windows, in nats (the lens's own loss)."""
    totals = np.zeros(hparams["n_layer"])
    for start in range(0, len(windows), BATCH):
        batch = windows[start:start + BATCH]
        logits, cache = look_inside.run_with_cache(batch, params, hparams, names=LENS.lens_sites(hparams["n_layer"]))
        final = g.log_softmax(logits)
        for layer, reading in enumerate(LENS.lens_readings(cache, params, hparams, lens)):
            totals[layer] += LENS.kl_loss(reading, final)[0] * len(batch)
    return totals / len(windows)


def probe_sites(n_layer):
    return ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(n_layer)]


def probes(encoder, params, hparams):
    """Held-out and fit accuracies of each probe at each site and position; and the texts' ids and labels."""
    rows = [json.loads(line) for line in open(os.path.join(ROOT, "data", "speakers.jsonl"), encoding="utf-8")]
    ids, labels = [encoder.encode(r["text"]) for r in rows], np.array([r["label"] for r in rows])
    shuffled = np.random.default_rng(0).permutation(labels[:FIT])
    sites, table = probe_sites(hparams["n_layer"]), {}
    for position in ("last", "mean"):
        features = LENS.probe_features(ids, params, hparams, sites, position)
        for site in sites:
            X = features[site]
            fit, held = (X[:FIT], labels[:FIT]), (X[FIT:], labels[FIT:])
            row = {}
            for name, method, kw, y in (("mean-diff", "mean-diff", {}, held[1]),
                                        ("logistic", "logistic", {"standardize": True}, held[1]),
                                        ("control", "logistic", {"standardize": True}, None)):
                probe = LENS.fit_probe(fit[0], fit[1] if y is not None else shuffled, method, **kw)
                row[name] = (probe["accuracy"], LENS.probe_accuracy(probe, *held))
            table[position, site] = row
            if position == "last":
                table["features", site] = X
    return table, ids, labels


def last_logprobs(ids, params, hparams, hooks=None):
    """The model's next-token log-probabilities at each text's last token.   -> [N, V]"""
    return np.stack([g.log_softmax(look_inside.run_with_hooks([t], params, hparams, hooks or {})[0, -1]) for t in ids])


def pushes(ids, labels, table, params, hparams):
    """At each site: the share of the class difference in the model's output that a push of ±(μ₁ - μ₀) moves the
    held-out texts by, and a random direction's of the same norm."""
    held_ids, held = ids[FIT:], labels[FIT:]
    base = last_logprobs(held_ids, params, hparams)
    gap = base[held == 1].mean(0) - base[held == 0].mean(0)  # [V]: how the classes' predictions differ
    gap_size = float(gap @ gap)
    sign = np.where(held == 1, -1.0, 1.0)  # each text pushed toward the other class
    out = {}
    for site in probe_sites(hparams["n_layer"]):
        X, y = table["features", site][:FIT], labels[:FIT]
        direction = (X[y == 1].mean(0) - X[y == 0].mean(0)).astype(np.float32)
        noise = np.random.default_rng(1).standard_normal(direction.shape).astype(np.float32)
        shares = []
        for v in (direction, noise * np.linalg.norm(direction) / np.linalg.norm(noise)):
            moved = []
            for t, s, before in zip(held_ids, sign, base):
                push = {site: lambda x, name, v=v, s=s: x + np.float32(s) * v}
                after = last_logprobs([t], params, hparams, push)[0]
                moved.append(-s * float((after - before) @ gap) / gap_size)  # + toward the text's other class
            shares.append(float(np.mean(moved)))
        out[site] = shares
    return out


def svg(series, title, ylabel, labels, low=None, high=None):
    """A line chart: series {name: (colour, [values])} over the x labels."""
    values = [v for _, vs in series.values() for v in vs]
    low = min(values) if low is None else low
    high = max(values) if high is None else high
    x = lambda i: LEFT + i / max(1, len(labels) - 1) * (W - LEFT - RIGHT)  # noqa: E731
    y = lambda v: TOP + (high - v) / (high - low) * (H - TOP - BOTTOM)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           'font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>']
    step = 10 ** math.floor(math.log10((high - low) / 2))
    for i in range(math.floor(low / step), math.ceil(high / step) + 1):
        if low <= i * step <= high:
            out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(i * step):.1f}" y2="{y(i * step):.1f}" '
                       f'stroke="#ddd"/><text x="{LEFT - 6}" y="{y(i * step) + 4:.1f}" text-anchor="end">'
                       f'{i * step:g}</text>')
    for i, label in enumerate(labels):
        out.append(f'<text x="{x(i):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{label}</text>')
    for k, (name, (colour, vs)) in enumerate(series.items()):
        dash = ' stroke-dasharray="5,4"' if "control" in name or "logit" in name else ""
        out.append(f'<polyline points="{" ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(vs))}" fill="none" '
                   f'stroke="{colour}" stroke-width="2"{dash}/>')
        out += [f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3" fill="{colour}"/>' for i, v in enumerate(vs)]
        out.append(f'<rect x="{W - RIGHT + 14}" y="{TOP + 8 + 18 * k}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{W - RIGHT + 32}" y="{TOP + 18 + 18 * k}">{name}</text>')
    out.append(f'<text x="{(W - RIGHT + LEFT) / 2}" y="{H - 12}" text-anchor="middle">{ylabel}</text>')
    out.append(f'<text x="{W / 2}" y="18" text-anchor="middle">{title}</text></svg>')
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lens-out", default=os.path.join(ROOT, "models", "baby-lens"))
    args = p.parse_args()
    encoder, hparams, params = load_model(args.model)
    L = hparams["n_layer"]
    fit, held_out = shakespeare(encoder)
    lens = LENS.new_lens(L, hparams["n_embd"])
    losses = [sum(x) for x in LENS.train_lens(fit, params, hparams, lens, args.steps, BATCH)]
    if not os.path.exists(args.lens_out):
        lens_files.save_lens(args.lens_out, lens, lens_files.lens_config(args.model, hparams["n_embd"], L,
                                                                          LENS.unembed_hash(params["wte"])))
    print(f"lens: {args.steps} steps of {BATCH} x {CONTEXT}, loss (summed over {L} translators) {losses[0]:.3f} -> "
          f"{np.mean(losses[-10:]):.3f} (the last 10 steps' mean)\n")
    logit = kl_by_layer(held_out[:HELD_OUT_WINDOWS], params, hparams, LENS.new_lens(L, hparams["n_embd"]))
    tuned = kl_by_layer(held_out[:HELD_OUT_WINDOWS], params, hparams, lens)
    names = look_inside.lens_labels(L)[:L]
    print("| reads | logit lens KL | tuned lens KL |\n|---|---|---|")
    for name, a, b in zip(names, logit, tuned):
        print(f"| {name} | {a:.3f} | {b:.3f} |")
    with open(os.path.join(HERE, "residual_stream_kl.svg"), "w", encoding="utf-8") as f:
        f.write(svg({"logit lens": ("#999", list(logit)), "tuned lens": ("#d33", list(tuned))},
                    "KL(model's final distribution ‖ the lens's reading), nats, held-out text",
                    "the residual stream read: the embeddings, then each block's output", names, low=0.0))
    table, ids, labels = probes(encoder, params, hparams)
    sites = probe_sites(L)
    print("\n| site | last: mean-diff | last: logistic (fit / held out) | last: control (fit / held out) | mean: "
          "mean-diff | mean: logistic (fit / held out) |\n|---|---|---|---|---|---|")
    for site in sites:
        last, mean = table["last", site], table["mean", site]
        print(f"| {site} | {last['mean-diff'][1]:.3f} | {last['logistic'][0]:.3f} / {last['logistic'][1]:.3f} | "
              f"{last['control'][0]:.3f} / {last['control'][1]:.3f} | {mean['mean-diff'][1]:.3f} | "
              f"{mean['logistic'][0]:.3f} / {mean['logistic'][1]:.3f} |")
    short = ["embed"] + [f"h{i}" for i in range(L)]
    with open(os.path.join(HERE, "residual_stream_probes.svg"), "w", encoding="utf-8") as f:
        f.write(svg({"last, logistic": ("#d33", [table["last", s]["logistic"][1] for s in sites]),
                     "last, mean-diff": ("#e90", [table["last", s]["mean-diff"][1] for s in sites]),
                     "mean, logistic": ("#36c", [table["mean", s]["logistic"][1] for s in sites]),
                     "mean, mean-diff": ("#3a3", [table["mean", s]["mean-diff"][1] for s in sites]),
                     "last, control (fit)": ("#999", [table["last", s]["control"][0] for s in sites])},
                    "Who is speaking, a woman or a man? Held-out accuracy of a probe",
                    "the residual stream probed: the embeddings, then each block's output", short, low=0.4, high=1.0))
    moved = pushes(ids, labels, table, params, hparams)
    print("\n| site | pushed along μ₁ - μ₀ | a random direction, the same norm |\n|---|---|---|")
    for site in sites:
        print(f"| {site} | {moved[site][0]:+.3f} | {moved[site][1]:+.3f} |")


if __name__ == "__main__":
    main()
