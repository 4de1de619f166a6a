"""Write tests/data/dpo_golden.json and dpo_golden.npz: what TRL 1.16.0's DPOTrainer computes on the
committed tiny checkpoint (GPT-2's vocabulary, 64 positions) with GPT-2's tokenizer. Dev-only, in the
reference venv (torch 2.13.0, transformers 5.24, peft 0.21.2, trl 1.16.0, datasets). Run:

    python tests/data/make_dpo_golden.py

dpo_golden.json: "pairs", the preference lines (PAIRS); "max_length"; "kept", TRL's prompt_ids,
chosen_ids and rejected_ids of each pair it keeps (its _prepare_dataset: <|endoftext|> added, the
three texts encoded whole, the common prefix; a prompt that fills max_length dropped); "dropped";
"collated": DataCollatorForPreference's input_ids and completion_mask for the kept pairs, one batch.

dpo_golden.npz, for each case under "<case>/": "loss", and TRL's metrics by their names
("<case>/rewards/chosen", ...), from compute_loss on that batch; and torch autograd's gradients
("<case>/grad/<our name>"): every parameter's (wte's as the rows in the batch plus 32 fixed ones,
"wte/rows", "wte/grad_rows", and its norm), or, with LoRA, each adapter's A and B (in our
orientation, as make_lora_golden.py keeps them). The cases:
  start, start_norm   the reference is the starting model (a copy), loss_type sigmoid / sigmoid_norm
  ref, ref_norm       the reference is another model: REFERENCE_SCALES applied to tiny's weights
  lora, lora_norm     PEFT's LoRA on c_attn and c_proj (r 2, alpha 4, B seeded as below), whose
                      reference is the base model with the adapter off, as TRL takes it
"lora/<layer>/A", "lora/<layer>/B": the adapters the test puts in. "steps/<metric>": [S] each step's
value in DPOTrainer's log_history over S steps of AdamW at a constant rate (STEPS), the batch every pair.
"""
import copy
import json
import os
import tempfile

import numpy as np
import peft
import torch
import transformers
import trl
from datasets import Dataset

from make_grad_golden import our_names
from make_hf_golden import HERE, gpt2_tokenizer, hf_model

VOCAB = os.path.join(os.path.dirname(os.path.dirname(HERE)), "data", "gpt2-vocab")
MAX_LENGTH = 64  # the tiny model's n_ctx: train.py's context for it
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 4)
PAIRS = [
    {"prompt": "The capital of France is ", "chosen": "Paris.", "rejected": "London."},  # the space joins " Paris"
    {"prompt": "Q: What is two plus two?\nA:", "chosen": " Four.", "rejected": " Five, I think."},
    {"prompt": "Name a colour of the sky.", "chosen": " Blue.<|endoftext|>", "rejected": " Green."},  # ended already
    {"prompt": "Say hello", "chosen": " hello<|endoftext|> and more", "rejected": " goodbye"},  # the id, inside
    {"prompt": "Tell me a story: " + LONG[:80], "chosen": " " + LONG, "rejected": " No."},  # cut to 64 (keep_start)
    {"prompt": LONG + LONG, "chosen": " x", "rejected": " y"},  # the prompt alone fills 64: dropped
]
REFERENCE_SCALES = {"transformer.ln_f.weight": 0.9, "transformer.wpe.weight": 1.1,
                    "transformer.h.1.mlp.c_fc.weight": 0.8}  # the --reference model: tiny, these tensors scaled
BETA = 0.1
LORA = dict(r=2, lora_alpha=4.0, target_modules=["c_attn", "c_proj"])
STEPS = dict(steps=4, lr=1e-2)


def tokenizer():
    tok = gpt2_tokenizer(VOCAB, eos_token="<|endoftext|>", bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    assert tok("hello world")["input_ids"] == [31373, 995], tok("hello world")
    assert tok("a<|endoftext|>")["input_ids"] == [64, 50256]
    return tok


def config(out, loss_type, **more):
    return trl.DPOConfig(output_dir=out, beta=BETA, loss_type=[loss_type], max_length=MAX_LENGTH, bf16=False,
                         use_cpu=True, report_to=[], per_device_train_batch_size=len(PAIRS), seed=0,
                         dataloader_drop_last=False, **more)


def trainer_for(policy, ref, loss_type, out, peft_config=None, **more):
    return trl.DPOTrainer(model=policy, ref_model=ref, args=config(out, loss_type, **more),
                          train_dataset=Dataset.from_list(PAIRS), processing_class=tokenizer(),
                          peft_config=peft_config)


def reference_model():
    model, _ = hf_model("tiny")
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, scale in REFERENCE_SCALES.items():
            params[name].mul_(scale)
    return model


def grads_of(model, hp, ids, rng):
    params = dict(model.named_parameters())
    out = {f"grad/{ours}": params[theirs].grad.numpy().copy() for ours, theirs in our_names(hp["n_layer"]).items()}
    wte = params["transformer.wte.weight"].grad.numpy()
    rows = np.union1d(ids.ravel(), rng.choice(hp["n_vocab"], 32, replace=False))
    norm = np.float32(np.linalg.norm(wte))
    return out | {"grad/wte/rows": rows, "grad/wte/grad_rows": wte[rows], "grad/wte/norm": norm}


def lora_grads(model):
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            i, part, layer = name.split("transformer.h.")[1].split(".")
            for matrix, t in (("A", module.lora_A["default"].weight), ("B", module.lora_B["default"].weight)):
                out[f"lora/h{i}/{part}/{layer}/lora/{matrix}"] = t.detach().numpy().T.copy()
                out[f"grad/h{i}/{part}/{layer}/lora/{matrix}"] = t.grad.numpy().T.copy()
    return out


def one_batch(trainer, model, batch):
    """compute_loss on the batch, in training mode, and its backward. -> loss, TRL's metrics"""
    model.train()
    model.zero_grad()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    metrics = {k: float(v[-1]) for k, v in trainer._metrics["train"].items() if k.startswith(("rewards", "logps"))}
    trainer._metrics["train"].clear()
    return {"loss": np.float64(loss.item())} | {k: np.float64(v) for k, v in metrics.items()}


def case(kind, loss_type, out):
    hp = hf_model("tiny")[1]
    rng = np.random.default_rng(1)
    policy, _ = hf_model("tiny")
    if kind == "lora":
        torch.manual_seed(0)
        lora = peft.LoraConfig(**LORA, fan_in_fan_out=True, lora_dropout=0.0, task_type="CAUSAL_LM")
        trainer = trainer_for(policy, None, loss_type, out, peft_config=lora)
        model = trainer.model
        seeded = np.random.default_rng(2)
        with torch.no_grad():
            for name, module in model.named_modules():
                if hasattr(module, "lora_B") and "default" in module.lora_B:
                    b = module.lora_B["default"].weight
                    b.copy_(torch.from_numpy(seeded.standard_normal(tuple(b.shape)).astype(np.float32) * 0.5))
    else:
        ref = copy.deepcopy(policy) if kind == "start" else reference_model()
        trainer = trainer_for(policy, ref, loss_type, out)
        model = trainer.model
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    values = one_batch(trainer, model, batch)
    values |= lora_grads(model) if kind == "lora" else grads_of(model, hp, batch["input_ids"].numpy(), rng)
    return trainer, batch, values


def steps(out):
    """STEPS["steps"] of DPOTrainer.train, AdamW at a constant rate, no decay, clipping at 1, the batch every pair."""
    policy, _ = hf_model("tiny")
    trainer = trainer_for(policy, copy.deepcopy(policy), "sigmoid", out, learning_rate=STEPS["lr"],
                          lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, warmup_steps=0,
                          max_steps=STEPS["steps"], logging_steps=1, save_strategy="no")
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry and "train_runtime" not in entry]
    assert len(logs) == STEPS["steps"], logs
    names = ["loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
             "logps/rejected"]
    return {f"steps/{name}": np.array([entry[name] for entry in logs], np.float64) for name in names}


def main():
    golden, numbers = {"pairs": PAIRS, "max_length": MAX_LENGTH, "beta": BETA, "reference_scales": REFERENCE_SCALES,
                       "lora": LORA, "steps": STEPS}, {}
    with tempfile.TemporaryDirectory() as out:
        for label, kind, loss_type in (("start", "start", "sigmoid"), ("start_norm", "start", "sigmoid_norm"),
                                       ("ref", "ref", "sigmoid"), ("ref_norm", "ref", "sigmoid_norm"),
                                       ("lora", "lora", "sigmoid"), ("lora_norm", "lora", "sigmoid_norm")):
            trainer, batch, values = case(kind, loss_type, out)
            numbers |= {f"{label}/{k}": v for k, v in values.items()}
            if label == "start":
                data = trainer.train_dataset
                golden["kept"] = [{k: data[i][k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
                                  for i in range(len(data))]
                golden["dropped"] = len(PAIRS) - len(data)
                golden["collated"] = {k: batch[k].tolist() for k in ("input_ids", "completion_mask")}
        numbers |= steps(out)
    golden["versions"] = [f"torch {torch.__version__}", f"transformers {transformers.__version__}",
                          f"trl {trl.__version__}", f"peft {peft.__version__}"]
    with open(os.path.join(HERE, "dpo_golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    np.savez_compressed(os.path.join(HERE, "dpo_golden.npz"), **numbers)
    print(golden["dropped"], {k: v for k, v in numbers.items() if "/" in k and "grad" not in k and "lora/" not in k})


if __name__ == "__main__":
    main()
