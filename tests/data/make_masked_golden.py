"""Write tests/data/masked_golden.npz: the masked loss and every parameter's gradient that torch
autograd computes on Hugging Face's GPT2LMHeadModel holding the committed "odd" checkpoint, with
torch.nn.functional.cross_entropy(..., ignore_index=-1): the loss of instruction data, whose prompt
positions and padding have the target -1 (backward.IGNORE). Dev-only: `pip install torch==2.13.0
transformers`. Run: python tests/data/make_masked_golden.py

Under "masked/": ids and targets [B, T] (row 0: a prompt of 4 positions, then the response; row 1:
a prompt of 2, the response, then 3 of padding); loss; and each parameter's gradient by checkpoint
name, wte's as make_grad_golden.py keeps it (the rows the batch touches and 32 more, and its norm).
"""
import os

import numpy as np
import torch

from make_grad_golden import torch_gradients
from make_hf_golden import HERE, hf_model

IGNORE = -1


def masked_case(name, B, T, seed):
    model, hp = hf_model(name)
    rng = np.random.default_rng(seed)
    ids, targets = rng.integers(0, hp["n_vocab"], (B, T)), rng.integers(0, hp["n_vocab"], (B, T))
    targets[0, :4] = IGNORE  # a prompt's positions
    targets[1, :2] = IGNORE
    targets[1, -3:] = IGNORE  # padding
    ids[1, -3:] = 0
    return torch_gradients(model, hp, ids, targets, rng, ignore_index=IGNORE)


def main():
    golden = {f"masked/{k}": v for k, v in masked_case("odd", 2, 11, 7).items()}
    golden["versions"] = np.array([f"torch {torch.__version__}"])
    np.savez_compressed(os.path.join(HERE, "masked_golden.npz"), **golden)
    print(sorted(golden))


if __name__ == "__main__":
    main()
