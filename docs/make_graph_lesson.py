"""Make the worked graph of docs/circuits.md's "Attribution graphs": the Shakespeare model of tests/data/shakespeare
(2 layers, 32 wide, a 512-id vocabulary, trained here), one transcoder a layer trained by sae.py, the attribution
graph of one prompt, its page and a screenshot of it. Dev-only: Debian's chromium for the screenshot.

    python docs/make_graph_lesson.py OUT_DIR

1. For each layer L: python sae.py train --site blocks.L.ln2.hook_normalized --site-out blocks.L.hook_mlp_out
   --architecture standard ... --out OUT_DIR/tc/L, on data/tinyshakespeare.txt's first 90% (the model's own
   training text; /work/shared/data/ or $TINYSHAKESPEARE).
2. python circuits.py graph PROMPT --model tests/data/shakespeare --transcoders OUT_DIR/tc/0 OUT_DIR/tc/1
   --out docs/graph_lesson.json --npz OUT_DIR/graph.npz --html OUT_DIR/graph.html
3. chromium's screenshot of the page, the most influential feature chosen (PAGE.html#ID): docs/graph_lesson.png
It prints the numbers the lesson quotes: each transcoder's fraction of variance explained and L0, the graph's.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import sae as S  # noqa: E402
from interface import loading  # noqa: E402

MODEL = os.path.join(ROOT, "tests", "data", "shakespeare")
PROMPT = "ROMEO:\nI will not go.\n\nJULI"
D_SAE, L1, TOKENS, BATCH, LR, CONTEXT = 256, 0.3, 1_000_000, 4096, 1e-3, 64


def text():
    for path in (os.environ.get("TINYSHAKESPEARE", ""), os.path.join(ROOT, "data", "tinyshakespeare.txt"),
                 "/work/shared/data/tinyshakespeare.txt"):
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                whole = f.read()
            return whole[:int(len(whole) * 0.9)]
    sys.exit("no tinyshakespeare.txt: set $TINYSHAKESPEARE")


def train(layer, data, out):
    """sae.py train: a ReLU transcoder from the MLP's input to its output at this layer."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "sae.py"), "train", "--model", MODEL, "--data", data,
                        "--site", f"blocks.{layer}.ln2.hook_normalized", "--site-out", f"blocks.{layer}.hook_mlp_out",
                        "--architecture", "standard", "--d-sae", str(D_SAE), "--l1", str(L1), "--tokens", str(TOKENS),
                        "--batch-tokens", str(BATCH), "--lr", str(LR), "--context", str(CONTEXT), "--out", out,
                        "--quiet"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sae.py train failed:\n{r.stderr}")


def explained(tc, x, y):
    """The fraction of y's variance the transcoder's output explains, and its L0."""
    out, f, _ = S.forward(x, tc)
    return 1 - ((out - y) ** 2).sum() / ((y - y.mean(0)) ** 2).sum(), float((f > 0).sum(-1).mean())


def main():
    out = os.path.abspath(sys.argv[1])
    os.makedirs(os.path.join(out, "tc"), exist_ok=True)
    encoder, hp, params = loading.load_model(MODEL)
    words = text()
    rows = S.windows(encoder.encode(words), CONTEXT, encoder.eot)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
        f.write(words)
    for layer in range(hp["n_layer"]):
        folder = os.path.join(out, "tc", str(layer))
        x, y = (S.gather_all(rows, params, hp, f"blocks.{layer}.{site}", batch=64).reshape(-1, hp["n_embd"])
                for site in ("ln2.hook_normalized", "hook_mlp_out"))
        train(layer, f.name, folder)
        variance, l0 = explained(loading.load_sae(folder), x, y)
        print(f"layer {layer}: explained variance {variance:.3f}, L0 {l0:.1f} of {D_SAE}")
    os.remove(f.name)
    page, png = os.path.join(out, "graph.html"), os.path.join(HERE, "graph_lesson.png")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "circuits.py"), "graph", PROMPT, "--model", MODEL,
                        "--transcoders", *[os.path.join(out, "tc", str(l)) for l in range(hp["n_layer"])],
                        "--out", os.path.join(HERE, "graph_lesson.json"), "--npz", os.path.join(out, "graph.npz"),
                        "--html", page, "--scan", "shakespeare-transcoders", "--quiet"],
                       capture_output=True, text=True, check=True)
    print(r.stdout, end="")
    graph = np.load(os.path.join(out, "graph.npz"))
    print("the logits:", [(encoder.decode([int(t)]), round(float(p), 3)) for t, p in
                          zip(graph["logit_tokens"], graph["logit_probabilities"])])
    with open(os.path.join(HERE, "graph_lesson.json"), encoding="utf-8") as f2:
        kept = [n for n in json.load(f2)["nodes"] if n["feature_type"] == "cross layer transcoder"]
    print("the kept features:", [(n["node_id"], round(n["activation"], 3), round(n["influence"], 3)) for n in kept])
    first = min(kept, key=lambda n: n["influence"])["node_id"]  # the most influential: chosen in the picture
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--no-first-run", f"--user-data-dir={os.path.join(tmp, 'profile')}", "--window-size=1450,720",
                        f"--screenshot={png}", f"file://{page}#{first}"], check=True, stderr=subprocess.DEVNULL)
    print(png)


if __name__ == "__main__":
    main()
