"""The parameters: how many a GPT-2 has, part by part, and the values they start from.

  1. counting        count_parameters (by formula), count_tensors (from the arrays), published_counts
  2. initialising    residual_scale, init_tensor, init_params (for a model trained from nothing)

Counting parameters: by formula, part by part, and by counting a checkpoint's arrays.

    python gpt2_numpy.py --params 124M     # or all: the four sizes, GPT-3's and Llama 3 8B's

A GPT-2 block has 12·d² + 13·d parameters: attention 4d² + 4d (c_attn 3d² + 3d, c_proj
d² + d), the MLP 8d² + 5d (c_fc 4d² + 4d, c_proj 4d² + d), two LayerNorms 4d. Around
the blocks: wte V·d, wpe T·d and ln_f 2d; the head is wte again (tied), so it adds 0.

GPT-2's initialisation: the weights a model starts from before it has seen any text.

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

# ============================================================================
# 1. Counting
# ============================================================================

PARTS = ("wte (token embedding)", "wpe (position embedding)", "blocks", "ln_f", "head")


def count_parameters(hparams, n_kv_head=None, d_ff=None, gated_mlp=False, tied_head=True, biases=True,
                     norm="layernorm", learned_positions=True):
    """Exact parameter count of each part of a decoder-only transformer. The defaults are GPT-2;
    the options describe others (GPT-3 is GPT-2's shape; Llama uses n_kv_head, gated_mlp,
    an untied head, no biases, RMSNorm and no position table)."""
    V, T, d, L, H = (hparams[k] for k in ("n_vocab", "n_ctx", "n_embd", "n_layer", "n_head"))
    kv = d * (n_kv_head or H) // H  # width of k and of v: d, unless heads share keys and values
    f = d_ff or 4 * d
    norm_size = 2 * d if norm == "layernorm" else d  # a LayerNorm has gain and bias; RMSNorm a gain
    attn = {"c_attn.w": d * (d + 2 * kv), "c_attn.b": (d + 2 * kv) * biases,
            "c_proj.w": d * d, "c_proj.b": d * biases}
    mlp = {"c_fc.w": d * f * (2 if gated_mlp else 1), "c_fc.b": f * (2 if gated_mlp else 1) * biases,
           "c_proj.w": f * d, "c_proj.b": d * biases}
    block = {"attention": sum(attn.values()), "mlp": sum(mlp.values()), "layer norms": 2 * norm_size}
    parts = dict(zip(PARTS, (V * d, T * d * learned_positions, L * sum(block.values()), norm_size,
                             0 if tied_head else V * d)))
    total = sum(parts.values())
    embedding = parts["wte (token embedding)"] + parts["wpe (position embedding)"] + parts["head"]
    approx = 12 * L * d * d
    return {"parts": parts, "block": block, "attention": attn, "mlp": mlp, "total": total,
            "non_embedding": total - embedding, "wte_share": parts["wte (token embedding)"] / total,
            "approx_12Ld2": approx, "approx_error": (approx - (total - embedding)) / (total - embedding)}


def count_tensors(params):
    """The same parts counted from the arrays themselves, independently of the formula."""
    parts = dict.fromkeys(PARTS, 0)
    by_first_name = {"wte": PARTS[0], "wpe": PARTS[1], "ln_f": PARTS[3]}
    for name, array in shapes.flatten(params).items():
        parts[by_first_name.get(name.split("/")[0], "blocks")] += array.size
    return parts


PUBLISHED = [  # name, published size, shape (Brown et al. 2020, Table 2.1; Llama 3 model card)
    ("GPT-3 Small", 125e6, dict(n_layer=12, n_embd=768, n_head=12), {}),
    ("GPT-3 Medium", 350e6, dict(n_layer=24, n_embd=1024, n_head=16), {}),
    ("GPT-3 Large", 760e6, dict(n_layer=24, n_embd=1536, n_head=16), {}),
    ("GPT-3 XL", 1.3e9, dict(n_layer=24, n_embd=2048, n_head=24), {}),
    ("GPT-3 2.7B", 2.7e9, dict(n_layer=32, n_embd=2560, n_head=32), {}),
    ("GPT-3 6.7B", 6.7e9, dict(n_layer=32, n_embd=4096, n_head=32), {}),
    ("GPT-3 13B", 13e9, dict(n_layer=40, n_embd=5140, n_head=40), {}),  # 5140 as printed (40 x 128 = 5120)
    ("GPT-3 175B", 175e9, dict(n_layer=96, n_embd=12288, n_head=96), {}),
    ("Llama 3 8B", 8.03e9, dict(n_layer=32, n_embd=4096, n_head=32, n_vocab=128256, n_ctx=8192),
     dict(n_kv_head=8, d_ff=14336, gated_mlp=True, tied_head=False, biases=False, norm="rmsnorm",
          learned_positions=False)),
]


def published_counts():
    """[(name, published, counted)] for the shapes above (GPT-3: n_ctx 2048, GPT-2's vocabulary)."""
    return [(name, published,
             count_parameters({"n_vocab": shapes.N_VOCAB, "n_ctx": 2048, **shape}, **options)["total"])
            for name, published, shape, options in PUBLISHED]


# ============================================================================
# 2. Initialising: GPT-2's starting values
# ============================================================================

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
