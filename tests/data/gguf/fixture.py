"""The 12-layer GGUF fixture, made the same way by the tests and by make_gguf_golden.py: a seeded
random GPT-2 with GPT-2's vocabulary, 12 blocks (so that the converter's order puts h.10 before
h.2) and 16 wide (so that under q8_0 only ffn_down's rows, 64 long, are whole blocks: the rest
falls back to float16). A few rows are awkward on purpose: zeros, a constant, tiny values.

    python tests/data/gguf/fixture.py OUT_FOLDER     # writes it as OpenAI's files
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

from plumbing import shapes  # noqa: E402
from plumbing.checkpoint import write_checkpoint  # noqa: E402

NAME = "twelve-layers-v2"  # the folder name the converter sees: general.name, basename and version come from it
HPARAMS = {"n_vocab": shapes.N_VOCAB, "n_ctx": shapes.N_CTX, "n_embd": 16, "n_head": 2, "n_layer": 12}
VOCAB = os.path.join(ROOT, "data", "gpt2-vocab")


def params():
    rng = np.random.default_rng(40)
    flat = {name: (rng.standard_normal(shape) * (1.0 if name.endswith("/g") else 0.1)).astype(np.float32)
            for name, shape in shapes.tensor_shapes(HPARAMS).items()}
    flat["h0/mlp/c_proj/w"][:, 0] = 0  # ffn_down's row 0: zeros, then a constant, then tiny values
    flat["h0/mlp/c_proj/w"][:, 1] = 0.375
    flat["h0/mlp/c_proj/w"][:, 2] *= 1e-7
    return shapes.nest(flat, HPARAMS["n_layer"])


def write(folder):
    return write_checkpoint(folder, params(), HPARAMS, vocab_dir=VOCAB)


if __name__ == "__main__":
    write(sys.argv[1])
