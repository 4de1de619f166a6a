"""Make minbpe_merges.json: the merges karpathy/minbpe learns, the reference for bpe.py's trainer.

Dev-only (minbpe is never imported by the project or its tests). Get minbpe's source (for
example a clone of github.com/karpathy/minbpe) and run, with `regex` installed:

    python tests/data/bpe_train/make_minbpe_golden.py --minbpe PATH/TO/minbpe

minbpe's RegexTokenizer with GPT2_SPLIT_PATTERN is trained on each case's text; its merges
are stored in the order learned, each as "LEFT RIGHT", a token as the hex of its bytes.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
CASES = {  # name: (file, characters from its start, merges)
    "shakespeare": (os.path.join(ROOT, "data", "tinyshakespeare.txt"), 100_000, 500),
    "multilingual": (os.path.join(HERE, "multilingual.txt"), None, 300),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minbpe", required=True, help="a checkout of karpathy/minbpe")
    args = p.parse_args()
    sys.path.insert(0, args.minbpe)
    from minbpe.regex import GPT2_SPLIT_PATTERN, RegexTokenizer

    commit = subprocess.run(["git", "-C", args.minbpe, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    out = {"reference": f"karpathy/minbpe {commit.strip() or '(no git)'}: RegexTokenizer(GPT2_SPLIT_PATTERN)",
           "cases": {}}
    for name, (path, chars, n_merges) in CASES.items():
        with open(path, encoding="utf-8") as f:
            text = f.read()[:chars]
        tokenizer = RegexTokenizer(GPT2_SPLIT_PATTERN)
        tokenizer.train(text, 256 + n_merges)
        pairs = sorted(tokenizer.merges.items(), key=lambda item: item[1])
        out["cases"][name] = {"file": os.path.relpath(path, ROOT), "chars": chars,
                              "merges": [f"{tokenizer.vocab[a].hex()} {tokenizer.vocab[b].hex()}" for (a, b), _ in pairs]}
    with open(os.path.join(HERE, "minbpe_merges.json"), "w") as f:
        json.dump(out, f, indent=0)
    print(os.path.join(HERE, "minbpe_merges.json"))


if __name__ == "__main__":
    main()
