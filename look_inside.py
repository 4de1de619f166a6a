"""Looking inside GPT-2: every activation of one forward pass, by name.

The model (gpt2_numpy.py) shows each activation it makes to a hook, `hook(name, x)`;
here are hooks that keep what they are shown. The names, in the order the data meets
them (block i's names start with "h{i}.", as the checkpoint's do):

    wte, wpe                        the two embeddings' rows        [B, T, C]
    h{i}.resid_pre                  the residual stream into block i [B, T, C]
    h{i}.ln_1                       layer_norm(x, ln_1)              [B, T, C]
    h{i}.attn.q, .attn.k, .attn.v   each head's queries, keys, values [B, H, T, D]
    h{i}.attn.scores                q kᵀ/√D + mask                   [B, H, T, T]
    h{i}.attn.weights               softmax of the scores            [B, H, T, T]
    h{i}.attn.z                     weights @ v, per head            [B, H, T, D]
    h{i}.attn.out                   c_proj(merged heads)             [B, T, C]
    h{i}.resid_mid                  x + attn.out                     [B, T, C]
    h{i}.ln_2, .mlp.c_fc, .mlp.gelu, .mlp.out                        [B, T, C or 4C]
    h{i}.resid_post                 x + mlp.out                      [B, T, C]
    ln_f                            the final layer norm             [B, T, C]
"""
import numpy as np

from gpt2_numpy import gpt2


def trace(ids, params, n_head, blocks=None):
    """One forward pass, every stage in order: [(name, array)], from the token ids to the
    logits. It is gpt2() itself, run with a hook that keeps what it is shown.
    blocks: the set of blocks whose stages to keep (default all)."""
    ids = np.atleast_2d(np.asarray(ids))
    stages = [("token ids", ids)]

    def keep(name, x):
        block = name.split(".")[0]
        if blocks is None or not block[1:].isdigit() or int(block[1:]) in blocks:
            stages.append((name, x))
        return x

    stages.append(("logits", gpt2(ids, params, n_head, hook=keep)))
    return stages
