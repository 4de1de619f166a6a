"""A LoRA run's adapter in PEFT's own format, written beside its merged model so that PEFT loads it:
`PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(base), OUT)`.

    adapter_model.safetensors   base_model.model.transformer.h.{i}.attn.c_attn.lora_A.weight  [R, n_in]
                                base_model.model.transformer.h.{i}.attn.c_attn.lora_B.weight  [n_out, R]
                                ... for each adapted layer (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)
    adapter_config.json         peft_type "LORA", task_type "CAUSAL_LM", r, lora_alpha, target_modules,
                                fan_in_fan_out: true, base_model_name_or_path, ...

A classifier's (classify.py) is task_type "SEQ_CLS", with its head saved whole beside the adapters
(modules_to_save ["score"]: base_model.model.score.weight [K, C]), which PEFT loads onto
GPT2ForSequenceClassification.from_pretrained(base, num_labels=K, pad_token_id=...).

PEFT holds A and B as torch.nn.Linear layers, whose weight is [out, in]: its lora_A.weight is our
A [n_in, R] transposed, and lora_B.weight our B [R, n_out] transposed. fan_in_fan_out is true
because GPT-2's Conv1D stores w as [n_in, n_out], as we do: PEFT then merges w + scale·(B A)ᵀ.
The files are what PEFT 0.21.2's save_pretrained writes for GPT-2 (the same keys, the header's
{"format": "pt"}); the adapter is also how a LoRA run is resumed: its A and B, read back exactly.
"""
import json
import os
import tempfile

import numpy as np

from plumbing import shapes
from plumbing.errors import UserError, read_json
from plumbing.safetensors_reader import load_file
from plumbing.safetensors_writer import write_safetensors

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
PREFIX = "base_model.model.transformer.h."  # PeftModel -> LoraModel -> GPT2LMHeadModel -> its blocks
SCORE = "base_model.model.score.weight"  # a classifier's head, saved whole (PEFT's modules_to_save)
HUB_NAMES = {"124M": "gpt2", "355M": "gpt2-medium", "774M": "gpt2-large", "1558M": "gpt2-xl"}  # the sizes' HF names


def peft_tensors(adapters):
    """Our adapters {"blocks": [{"attn": {"c_attn": {"lora": {"A", "B"}}}, ...}]} -> {PEFT's name: [out, in] array}."""
    tensors = {}
    for name, array in shapes.flatten(adapters).items():  # "h3/attn/c_attn/lora/A"
        block, part, layer, _, matrix = name.split("/")
        tensors[f"{PREFIX}{block[1:]}.{part}.{layer}.lora_{matrix}.weight"] = np.ascontiguousarray(array.T)
    return tensors


def base_name(model):
    """The base model as Hugging Face names it: a size's Hub name, hf:owner/name's, or a folder's path."""
    if model in HUB_NAMES:
        return HUB_NAMES[model]
    return model[3:] if model.startswith("hf:") else os.path.abspath(model)


def adapter_config(rank, alpha, targets, base, classifier=False):
    """adapter_config.json's content, with the keys and defaults PEFT 0.21.2 writes for a plain LoRA;
    a classifier's (classifier: True) is task_type SEQ_CLS, whose score is saved whole (modules_to_save)."""
    return {"base_model_name_or_path": base_name(base), "bias": "none", "fan_in_fan_out": True,
            "inference_mode": True, "init_lora_weights": True, "layers_pattern": None, "layers_to_transform": None,
            "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha, "lora_dropout": 0.0,
            "modules_to_save": ["score"] if classifier else None, "peft_type": "LORA", "r": rank, "revision": None,
            "target_modules": list(targets), "task_type": "SEQ_CLS" if classifier else "CAUSAL_LM", "use_dora": False,
            "use_rslora": False}


def adapter_files(adapters, alpha, targets, base, score=None):
    """{file name: bytes}: the two files, for checkpoint.write_checkpoint's `extra` (written with the model,
    whole or not at all). rank: A's width. score: a classifier's head [K, C], trained in full, which PEFT
    keeps as base_model.model.score.weight: PeftModel.from_pretrained(GPT2ForSequenceClassification
    .from_pretrained(base, num_labels=K, pad_token_id=...), OUT)."""
    rank = next(iter(shapes.flatten(adapters).values())).shape[1]
    tensors = peft_tensors(adapters) | ({SCORE: score} if score is not None else {})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, ADAPTER_FILE)
        write_safetensors(path, tensors, {"format": "pt"})
        with open(path, "rb") as f:
            weights = f.read()
    config = adapter_config(rank, alpha, targets, base, classifier=score is not None)
    return {ADAPTER_FILE: weights, CONFIG_FILE: json.dumps(config, indent=2).encode()}


def read_adapter(folder):
    """A LoRA run's saved adapter -> (adapters, as peft_tensors took them, float32 copies; its config).
    A missing or broken file is a UserError naming it."""
    config = read_json(os.path.join(folder, CONFIG_FILE))
    tensors, _ = load_file(os.path.join(folder, ADAPTER_FILE))
    flat = {}
    for name, array in tensors.items():
        if name == SCORE:
            continue  # a classifier's head: read back from beside the model (classifier_files)
        if not name.startswith(PREFIX) or not name.endswith(".weight") or array.ndim != 2:
            raise UserError(f"holds {name}, not a LoRA adapter's tensor", path=os.path.join(folder, ADAPTER_FILE))
        block, part, layer, matrix = name[len(PREFIX):-len(".weight")].split(".")
        flat[f"h{block}/{part}/{layer}/lora/{matrix[len('lora_'):]}"] = np.array(array.T, np.float32, order="C")
    n_layer = 1 + max(shapes.block_index(name) for name in flat)
    return shapes.nest(flat, n_layer), config
