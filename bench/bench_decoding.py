"""Greedy, beam search and the processors side by side on one model: how likely the model finds each
text, and how much of it repeats itself (docs/decoding.md's table). No timings: the figures are the
model's, the same on any machine.

    python bpe.py --train data/tinyshakespeare.txt --vocab-size 1024 --out models/shakespeare-1024
    python train.py --from-scratch --tokenizer models/shakespeare-1024 --out models/baby --n-layer 4 --n-head 4 \\
        --n-embd 128 --context 64 --batch-size 12 --steps 2000 --lr 1e-3 --warmup 100 --min-lr-ratio 0.1 --beta2 0.99
    python bench/bench_decoding.py --model models/baby

Each way decodes --n-tokens tokens after each of a few speakers' names ("ROMEO:\\n", ...). log p is the
mean log-probability a token of what it wrote, by gpt2_numpy.score; repeated is the share of its
3-grams of tokens that it had written before. Then the texts after "ROMEO:\\n", one way each.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decoding  # noqa: E402
import gpt2_numpy as g  # noqa: E402
from interface.loading import load_model  # noqa: E402

PROMPTS = ["ROMEO:\n", "JULIET:\n", "First Citizen:\n", "KING RICHARD III:\n", "MENENIUS:\n", "DUKE VINCENTIO:\n",
           "QUEEN MARGARET:\n", "PETRUCHIO:\n"]
WAYS = {  # name: (beams, generate's or beam_search's settings); beams 0 is sampling with seed 2
    "greedy": (1, {}), "greedy, --repetition-penalty 1.3": (1, {"repetition_penalty": 1.3}),
    "greedy, --no-repeat-ngram-size 3": (1, {"no_repeat_ngram_size": 3}),
    "--num-beams 2": (2, {}), "--num-beams 4": (4, {}), "--num-beams 8": (8, {}),
    "--num-beams 4 --repetition-penalty 1.3": (4, {"repetition_penalty": 1.3}),
    "--num-beams 4 --no-repeat-ngram-size 3": (4, {"no_repeat_ngram_size": 3}),
    "sampling, --top-k 40 --seed 2": (0, {"top_k": 40}), "sampling, --min-p 0.1 --seed 2": (0, {"min_p": 0.1})}


def decode(ids, params, hparams, n_tokens, stop, beams, settings):
    if beams > 1:
        return decoding.beam_search(ids, params, hparams, n_tokens, beams, stop=stop, **settings)[0][0]
    temperature = 0.0 if beams == 1 else 1.0
    steps = g.generate(ids, params, hparams, n_tokens, temperature, seed=2, stop=stop, **settings)
    out = [int(step[0]) for step in steps]
    return out[:-1] if out and out[-1] == stop else out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model folder, or a size")
    p.add_argument("--n-tokens", type=int, default=50)
    args = p.parse_args()
    encoder, hparams, params = load_model(args.model, quiet=True)
    print(f"| {args.model}, {args.n_tokens} tokens, {len(PROMPTS)} prompts | log p a token | repeated 3-grams |")
    print("|---|---|---|")
    texts = {}
    for name, (beams, settings) in WAYS.items():
        logp, repeated = [], []
        for prompt in PROMPTS:
            ids = encoder.encode(prompt)
            new = decode(ids, params, hparams, args.n_tokens, encoder.eot, beams, settings)
            logp.append(g.score(ids + new, params, hparams)[0][len(ids) - 1:].mean())
            grams = [tuple(new[i:i + 3]) for i in range(len(new) - 2)]
            repeated.append(1 - len(set(grams)) / max(len(grams), 1))
            texts.setdefault(name, prompt + encoder.decode(new))
        print(f"| {name} | {np.mean(logp):.2f} | {np.mean(repeated):.0%} |")
    for name, text in texts.items():
        print(f"\n{name}:\n{text}")


if __name__ == "__main__":
    main()
