"""Write tests/data/lora_golden.npz: what PEFT's LoRA on Hugging Face's GPT2LMHeadModel (float32,
dropout 0) computes on the committed checkpoints' weights: the loss, and torch autograd's gradients
of every adapter's A and B. Dev-only: `pip install torch==2.13.0 transformers peft==0.21.2`. Run:

    python tests/data/make_lora_golden.py

PEFT starts B at zero, so its gradient would be the only one that is not zero; B is set here to
seeded random values instead, so that both gradients are tested. For each case, under "<case>/":
ids and targets [B, T]; loss; rank, alpha and layers (as --lora-targets writes them); and for each
adapted layer, by our name ("h0/attn/c_attn/lora/A", in our orientation, A [n_in, R] = lora_A.weight
transposed, B [R, n_out] = lora_B.weight transposed), its value and its gradient ("grad/h0/...").
"init/<name>": PEFT's own first A of each layer (kaiming_uniform_ with a = √5), before B is set, and
"init/B_is_zero": whether every B it made was zero.
"""
import os

import numpy as np
import peft
import torch

from make_hf_golden import HERE, hf_model

CASES = (("tiny", "tiny", 4, 8.0, ("c_attn", "c_proj", "c_fc"), 2, 12, 0),  # scale 2, every layer
         ("odd", "odd", 2, 2.0, ("c_attn",), 2, 9, 1))  # PEFT's default target, scale 1


def case(name, rank, alpha, layers, B, T, seed):
    model, hp = hf_model(name)
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(layers), fan_in_fan_out=True,
                             lora_dropout=0.0, task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, config)
    rng = np.random.default_rng(seed)
    out, lora_a, lora_b = {}, {}, {}
    for module_name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            i, part, layer = module_name.split("transformer.h.")[1].split(".")
            ours = f"h{i}/{part}/{layer}/lora"
            lora_a[ours], lora_b[ours] = module.lora_A["default"].weight, module.lora_B["default"].weight
    out["init/B_is_zero"] = np.array(all(float(b.detach().abs().max()) == 0.0 for b in lora_b.values()))
    for ours, a in lora_a.items():
        out[f"init/{ours}/A"] = a.detach().numpy().T.copy()
    with torch.no_grad():
        for b in lora_b.values():
            b.copy_(torch.from_numpy(rng.standard_normal(tuple(b.shape)).astype(np.float32) * 0.5))
    ids, targets = rng.integers(0, hp["n_vocab"], (B, T)), rng.integers(0, hp["n_vocab"], (B, T))
    logits = model(torch.tensor(ids)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, hp["n_vocab"]), torch.tensor(targets).reshape(-1))
    loss.backward()
    out.update({"ids": ids, "targets": targets, "loss": np.float32(loss.item()), "rank": np.int64(rank),
                "alpha": np.float64(alpha), "layers": np.array(",".join(layers))})
    for ours in lora_a:
        for matrix, tensor in (("A", lora_a[ours]), ("B", lora_b[ours])):
            out[f"{ours}/{matrix}"] = tensor.detach().numpy().T.copy()
            out[f"grad/{ours}/{matrix}"] = tensor.grad.numpy().T.copy()
    return out


def main():
    golden = {}
    for label, name, rank, alpha, layers, B, T, seed in CASES:
        golden.update({f"{label}/{k}": v for k, v in case(name, rank, alpha, layers, B, T, seed).items()})
    golden["versions"] = np.array([f"torch {torch.__version__}", f"peft {peft.__version__}"])
    np.savez_compressed(os.path.join(HERE, "lora_golden.npz"), **golden)
    print(sorted(golden)[:8], len(golden))


if __name__ == "__main__":
    main()
