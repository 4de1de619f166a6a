"""GPT-2s in Hugging Face's format: a folder with config.json, model.safetensors (or shards),
vocab.json and merges.txt, as `save_pretrained` writes it and the Hub serves it.

The tensors get the checkpoint's names, so the model never knows where they came from:

    Hugging Face (with or without "transformer.")     here
    wte.weight, wpe.weight                             wte, wpe
    h.3.ln_1.weight, h.3.ln_1.bias                     h3/ln_1/g, h3/ln_1/b
    h.3.attn.c_attn.weight (Conv1D: [n_in, n_out])     h3/attn/c_attn/w (the same layout)
    ln_f.weight, ln_f.bias                             ln_f/g, ln_f/b
    h.3.attn.bias, h.3.attn.masked_bias                (causal-mask buffers of older files: skipped)
    lm_head.weight                                     (the tied head: it must equal wte)

config.json's options that change the architecture are either implemented (n_inner, the
MLP's width; layer_norm_epsilon) or refused by name: never silently wrong logits.
"""
import os

import numpy as np

from gpt2_numpy import LAYER_NORM_EPS
from plumbing import shapes
from plumbing.errors import UserError, read_json
from plumbing.safetensors_reader import load_folder

GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")  # two names for GPT-2's tanh approximation


class HubFolderError(UserError):
    """A Hugging Face folder that cannot be run here; .path names the file."""


def is_hf_folder(folder):
    return os.path.exists(os.path.join(folder, "config.json")) and not os.path.exists(
        os.path.join(folder, "hparams.json"))


def read_config(folder):
    """config.json -> hparams (n_vocab, n_ctx, n_embd, n_head, n_layer, n_inner, layer_norm_epsilon)."""
    path = os.path.join(folder, "config.json")
    config = read_json(path, HubFolderError)
    if not isinstance(config, dict):
        raise HubFolderError("not a JSON object", path=path)
    if config.get("model_type", "gpt2") != "gpt2":
        raise HubFolderError(f"model_type {config['model_type']!r} is not GPT-2's architecture", path=path)
    refused = [("activation_function", config.get("activation_function", "gelu_new") not in GELU_TANH),
               ("scale_attn_by_inverse_layer_idx", bool(config.get("scale_attn_by_inverse_layer_idx"))),
               ("reorder_and_upcast_attn", bool(config.get("reorder_and_upcast_attn"))),
               ("add_cross_attention", bool(config.get("add_cross_attention"))),
               ("scale_attn_weights", config.get("scale_attn_weights", True) is not True)]
    for option, used in refused:
        if used:
            raise HubFolderError(f"{option} = {config.get(option)!r} changes GPT-2's architecture, and this "
                                 "project does not implement it", path=path)
    names = {"n_vocab": "vocab_size", "n_ctx": "n_positions", "n_embd": "n_embd", "n_head": "n_head",
             "n_layer": "n_layer"}
    hp = {ours: config.get(theirs) for ours, theirs in names.items()}
    bad = [theirs for ours, theirs in names.items() if not isinstance(hp[ours], int) or hp[ours] < 1]
    if bad:
        raise HubFolderError(f"needs a positive integer {bad[0]}", path=path)
    if hp["n_embd"] % hp["n_head"]:
        raise HubFolderError(f"n_embd {hp['n_embd']} is not a multiple of n_head {hp['n_head']}", path=path)
    hp["n_inner"] = config.get("n_inner") or 4 * hp["n_embd"]  # null means 4·d
    hp["layer_norm_epsilon"] = float(config.get("layer_norm_epsilon", LAYER_NORM_EPS))
    return hp


def our_name(name):
    """A Hugging Face tensor name -> the checkpoint's (shapes.py), or None for a mask buffer."""
    name = name[len("transformer."):] if name.startswith("transformer.") else name
    parts = name.split(".")
    if parts[0] == "h" and len(parts) >= 3 and parts[1].isdigit():
        if parts[2:] in (["attn", "bias"], ["attn", "masked_bias"]):
            return None
        parts = [f"h{parts[1]}"] + parts[2:]
    last = {"weight": "w", "bias": "b"}.get(parts[-1], parts[-1])
    if last == "w" and (parts[-2].startswith("ln_") or parts[:1] in (["wte"], ["wpe"])):
        last = "g" if parts[-2].startswith("ln_") else None
    return "/".join(parts[:-1] + ([last] if last else []))


def load_hf_folder(folder):
    """-> (hparams, params, converted dtypes). Every float32 array is a read-only view into its file."""
    hp = read_config(folder)
    weights = [f for f in ("model.safetensors", "model.safetensors.index.json") if os.path.exists(os.path.join(folder, f))]
    if not weights:
        if any(os.path.exists(os.path.join(folder, f)) for f in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
            raise HubFolderError("holds only pytorch_model.bin, a Python pickle, and this project never unpickles "
                                 "(loading a pickle can run any code). Convert it once where torch is installed: "
                                 "GPT2LMHeadModel.from_pretrained(folder).save_pretrained(folder), which writes "
                                 "model.safetensors", path=folder)
        raise HubFolderError("has no model.safetensors (nor model.safetensors.index.json)", path=folder)
    tensors, converted = load_folder(folder)
    flat, head = {}, None
    for name, array in tensors.items():
        if name in ("lm_head.weight", "transformer.lm_head.weight"):
            head = array
            continue
        ours = our_name(name)
        if ours is not None:
            flat[ours] = array
    want = shapes.tensor_shapes(hp)
    for problem, names in (("missing", sorted(set(want) - set(flat))), ("unexpected", sorted(set(flat) - set(want)))):
        if names:
            raise HubFolderError(f"the weights have {problem} tensor {names[0]} (for the shape in config.json)",
                                 path=folder)
    for name, shape in want.items():
        if flat[name].shape != shape:
            raise HubFolderError(f"{name} has shape {flat[name].shape}, config.json implies {shape}", path=folder)
    if head is not None and not (head.shape == flat["wte"].shape and np.array_equal(head, flat["wte"])):
        raise HubFolderError("lm_head.weight differs from wte: an untied output layer, which this project does not "
                             "implement (GPT-2 ties them)", path=folder)
    return hp, shapes.nest(flat, hp["n_layer"]), converted  # the layer norms' eps is in hp, a hyperparameter
