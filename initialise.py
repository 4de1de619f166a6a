"""GPT-2's initialisation: the weights a model starts from before it has seen any text.

    params = init_params(hparams, seed=0)     # then train.py --from-scratch trains them

As in the GPT-2 paper (Radford et al., 2019, §2.3) and OpenAI's code:
  - every matrix and both embeddings: normal(0, 0.02);
  - each residual projection (attn/c_proj and mlp/c_proj, the layers that write into the
    residual stream) scaled by 1/√(2L): the stream is a sum of 2L such writes, so that its
    variance at the top does not grow with the depth;
  - biases 0, LayerNorm gains 1.
The names and shapes are shapes.py's, so the result is a checkpoint like any other.
"""
import math

import numpy as np

from plumbing import shapes

STD = 0.02  # GPT-2's (and GPT-1's) standard deviation for weights


def residual_scale(n_layer):
    """1/√(2L): each block adds two writes (attention, MLP) to the residual stream."""
    return 1.0 / math.sqrt(2 * n_layer)


def init_tensor(name, shape, n_layer, rng):
    """One tensor's starting values, by what its name says it is.   -> float32 array of shape"""
    if name.endswith("/b"):
        return np.zeros(shape, np.float32)
    if name.endswith("/g"):
        return np.ones(shape, np.float32)
    std = STD * residual_scale(n_layer) if name.endswith("c_proj/w") else STD
    return rng.normal(0.0, std, shape).astype(np.float32)


def init_params(hparams, seed=0):
    """Every tensor of a GPT-2 of these hparams, initialised; the same seed gives the same weights.
    -> params (nested as gpt2_numpy's, wte [V, C], wpe [n_ctx, C], blocks, ln_f)"""
    rng = np.random.default_rng(seed)
    flat = {name: init_tensor(name, shape, hparams["n_layer"], rng)
            for name, shape in shapes.tensor_shapes(hparams).items()}
    return shapes.nest(flat, hparams["n_layer"])
