"""Write tests/data/grad_golden.npz: the loss and every parameter's gradient that torch autograd
computes on Hugging Face's GPT2LMHeadModel (float32, dropout 0) holding the committed checkpoints'
weights. Dev-only: `pip install torch==2.13.0 transformers`. Run: python tests/data/make_grad_golden.py

For each case, under "<case>/": ids and targets [B, T]; loss (mean cross-entropy); and for each
parameter, by checkpoint name ("h0/attn/c_attn/w", ...), its gradient. wte's is kept small: the rows
the batch's tokens touch plus 32 fixed random rows ("wte/rows", "wte/grad_rows"), and its norm.
"adamw_<name>/losses": the loss at each of 10 torch.optim.AdamW steps on one batch (ADAMW below).
"""
import os

import numpy as np
import torch

from make_hf_golden import HERE, hf_model

THEIRS = {"g": "weight", "w": "weight", "b": "bias"}


def our_names(n_layer):
    names = {"wpe": "transformer.wpe.weight", "ln_f/g": "transformer.ln_f.weight", "ln_f/b": "transformer.ln_f.bias"}
    for i in range(n_layer):
        for part in ("ln_1/g", "ln_1/b", "attn/c_attn/w", "attn/c_attn/b", "attn/c_proj/w", "attn/c_proj/b",
                     "ln_2/g", "ln_2/b", "mlp/c_fc/w", "mlp/c_fc/b", "mlp/c_proj/w", "mlp/c_proj/b"):
            *path, last = part.split("/")
            names[f"h{i}/{part}"] = f"transformer.h.{i}.{'.'.join(path)}.{THEIRS[last]}"
    return names


def case(name, B, T, seed):
    model, hp = hf_model(name)
    rng = np.random.default_rng(seed)
    ids, targets = rng.integers(0, hp["n_vocab"], (B, T)), rng.integers(0, hp["n_vocab"], (B, T))
    return torch_gradients(model, hp, ids, targets, rng)


def torch_gradients(model, hp, ids, targets, rng, ignore_index=-100):
    """The loss and every parameter's gradient by our names, from torch autograd; wte's as the rows
    the batch touches and 32 more drawn from rng, and its norm. ignore_index: targets left out
    (torch's default, -100, is never a target here)."""
    model.zero_grad()
    logits = model(torch.tensor(ids)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, hp["n_vocab"]), torch.tensor(targets).reshape(-1),
                                             ignore_index=ignore_index)
    loss.backward()
    params = dict(model.named_parameters())
    out = {"ids": ids, "targets": targets, "loss": np.float32(loss.item())}
    for ours, theirs in our_names(hp["n_layer"]).items():
        out[ours] = params[theirs].grad.numpy()
    wte = params["transformer.wte.weight"].grad.numpy()
    rows = np.union1d(ids.ravel(), rng.choice(hp["n_vocab"], 32, replace=False))
    out.update({"wte/rows": rows, "wte/grad_rows": wte[rows], "wte/norm": np.float32(np.linalg.norm(wte))})
    return out


ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)  # and gradients clipped to norm 1


def adamw_losses(name, B, T, seed, steps=10):
    """The loss at each of 10 AdamW steps on one fixed batch, as llm.c's test_gpt2 does."""
    model, hp = hf_model(name)
    rng = np.random.default_rng(seed)
    ids, targets = rng.integers(0, hp["n_vocab"], (B, T)), rng.integers(0, hp["n_vocab"], (B, T))
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings
    rest = [p for p in model.parameters() if p.dim() < 2]  # biases and gains
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=ADAMW["lr"], betas=ADAMW["betas"],
                            eps=ADAMW["eps"])
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = model(torch.tensor(ids)).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, hp["n_vocab"]), torch.tensor(targets).reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return {"ids": ids, "targets": targets, "losses": np.array(losses, np.float32)}


def main():
    golden = {}
    for label, name, B, T, seed in (("odd", "odd", 2, 9, 0), ("odd_full", "odd", 1, 32, 1), ("tiny", "tiny", 2, 12, 2)):
        golden.update({f"{label}/{k}": v for k, v in case(name, B, T, seed).items()})
    for label, name, B, T, seed in (("adamw_odd", "odd", 4, 16, 3), ("adamw_tiny", "tiny", 2, 16, 4)):
        golden.update({f"{label}/{k}": v for k, v in adamw_losses(name, B, T, seed).items()})
    golden["versions"] = np.array([f"torch {torch.__version__}"])
    np.savez_compressed(os.path.join(HERE, "grad_golden.npz"), **golden)
    print(sorted({k.split("/")[0] for k in golden}))


if __name__ == "__main__":
    main()
