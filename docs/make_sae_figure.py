"""Draw docs/sae_sweep.svg: L0 against explained variance and CE loss recovered, one point an L1 coefficient.

    python docs/make_sae_figure.py RUN_DIR            # RUN_DIR/eval-<C>.json, from `python sae.py eval --json`

Each eval-<C>.json is one SAE's `sae.py eval --json` (docs/sae.md's measured run); the figure is plain SVG,
no plotting library.
"""
import glob
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
W, H, LEFT, RIGHT, TOP, BOTTOM = 560, 340, 60, 20, 30, 50
SERIES = (("explained_variance", "explained variance", "#1f77b4"), ("ce_loss_score", "CE loss recovered", "#d62728"))


def points(folder):
    runs = []
    for path in glob.glob(os.path.join(folder, "eval-*.json")):
        with open(path, encoding="utf-8") as f:
            runs.append((float(os.path.basename(path)[5:-5]), json.load(f)))
    return sorted(runs)


def svg(runs):
    l0s = [m["l0"] for _, m in runs]
    lo, hi = math.log10(min(l0s)) - 0.1, math.log10(max(l0s)) + 0.1
    x = lambda l0: LEFT + (math.log10(l0) - lo) / (hi - lo) * (W - LEFT - RIGHT)  # noqa: E731
    low = min([-0.25] + [m[k] for _, m in runs for k, _, _ in SERIES])
    y = lambda v: TOP + (1 - v) / (1 - low) * (H - TOP - BOTTOM)  # noqa: E731  (low to 1 upwards)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           'font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>']
    for v in [t / 4 for t in range(math.floor(low * 4), 5)]:
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                   f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    for l0 in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000):
        if lo <= math.log10(l0) <= hi:
            out.append(f'<text x="{x(l0):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{l0}</text>')
    out.append(f'<text x="{(W + LEFT) / 2}" y="{H - 12}" text-anchor="middle">L0: latents firing a token (log scale)'
               '</text>')
    for key, label, colour in SERIES:
        line = " ".join(f"{x(m['l0']):.1f},{y(m[key]):.1f}" for _, m in runs)
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for c, m in runs:
            out.append(f'<circle cx="{x(m["l0"]):.1f}" cy="{y(m[key]):.1f}" r="4" fill="{colour}"/>')
            if key == SERIES[0][0]:
                out.append(f'<text x="{x(m["l0"]):.1f}" y="{y(m[key]) - 8:.1f}" text-anchor="middle">C={c:g}</text>')
    for i, (_, label, colour) in enumerate(SERIES):
        out.append(f'<rect x="{LEFT + 10}" y="{TOP + 8 + 18 * i}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{LEFT + 28}" y="{TOP + 18 + 18 * i}">{label}</text>')
    out.append(f'<text x="{W / 2}" y="18" text-anchor="middle">an SAE at blocks.2.hook_resid_pre of the README\'s '
               'Shakespeare model, 2048 latents</text></svg>')
    return "\n".join(out) + "\n"


def main():
    runs = points(sys.argv[1])
    with open(os.path.join(HERE, "sae_sweep.svg"), "w", encoding="utf-8") as f:
        f.write(svg(runs))
    for c, m in runs:
        print(f"C={c:g}: l0 {m['l0']:.1f}, explained variance {m['explained_variance']:.3f}, "
              f"ce_loss_score {m['ce_loss_score']:.3f}, kl_div_score {m['kl_div_score']:.3f}")


if __name__ == "__main__":
    main()
