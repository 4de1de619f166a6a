"""An SAE's folder, as SAELens writes it (SAE.save_model) and reads it (SAE.load_from_disk):

    cfg.json                  {"d_in", "d_sae", "dtype", "device", "apply_b_dec_to_input", "normalize_activations",
                               "reshape_activations", "metadata": {"hook_name", "model_name", "sae_lens_version", ...},
                               "architecture": "standard"}
    sae_weights.safetensors   W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in], float32

A cfg.json without metadata.sae_lens_version (nor a top-level one) is read as SAELens reads one from
before 6.0: its keys are flat (hook_point for hook_name), and without "architecture" it is "standard".
A 6.x one must say its architecture. Only "standard" is this project's.
"""
import json
import os

import numpy as np

from plumbing.errors import UserError, read_json
from plumbing.folders import whole_folder
from plumbing.safetensors_reader import load_file
from plumbing.safetensors_writer import write_safetensors

CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
SAE_LENS_VERSION = "6.54.12"  # the SAELens whose format is followed: without a version, a folder reads as pre-6.0
TENSORS = {"W_enc": ("d_in", "d_sae"), "b_enc": ("d_sae",), "W_dec": ("d_sae", "d_in"), "b_dec": ("d_in",)}
PRE_6_RENAMED = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index",
                 "activation_fn_str": "activation_fn"}
METADATA_KEYS = ("model_name", "hook_name", "hook_head_index", "model_class_name", "context_size", "prepend_bos",
                 "dataset_path", "model_from_pretrained_kwargs", "seqpos_slice", "sae_lens_training_version",
                 "neuronpedia_id", "exclude_special_tokens", "sae_lens_version")


def version_of(cfg):
    return cfg.get("sae_lens_version") or (cfg.get("metadata") or {}).get("sae_lens_version")


def is_pre_6(cfg):
    """SAELens's test (handle_config_defaulting): no version, or one below 6.0."""
    version = version_of(cfg)
    try:
        return not version or int(str(version).split(".")[0]) < 6
    except ValueError:
        return True


def from_pre_6(cfg, path):
    """A pre-6.0 cfg.json in 6.x's shape, as SAELens's handle_pre_6_0_config makes it."""
    cfg = {PRE_6_RENAMED.get(k, k): v for k, v in cfg.items()}
    norm = cfg.get("normalize_activations")
    norm = "expected_average_only_in" if norm is True else "none" if norm in (False, None) else norm
    hook = cfg.get("hook_name") or ""
    return {"d_in": cfg.get("d_in"), "d_sae": cfg.get("d_sae"), "dtype": cfg.get("dtype", "float32"),
            "device": cfg.get("device", "cpu"), "apply_b_dec_to_input": cfg.get("apply_b_dec_to_input", True),
            "normalize_activations": norm,
            "reshape_activations": cfg.get("reshape_activations", "hook_z" if "hook_z" in hook else "none"),
            "metadata": {k: cfg[k] for k in METADATA_KEYS if k in cfg},
            "architecture": cfg.get("architecture", "standard")}


def read_cfg(folder):
    """The folder's cfg.json, in 6.x's shape, checked: a standard SAE with whole-number widths."""
    path = os.path.join(folder, CFG)
    if not os.path.isdir(folder):
        raise UserError("is not an SAE folder (no such folder)", path=folder)
    if not os.path.isfile(path):
        raise UserError(f"is not an SAE folder: it has no {CFG}", path=folder)
    cfg = read_json(path)
    if not isinstance(cfg, dict):
        raise UserError("is not a JSON object", path=path)
    if is_pre_6(cfg):
        cfg = from_pre_6(cfg, path)
    elif "architecture" not in cfg:
        raise UserError(f"says SAELens {version_of(cfg)} but no architecture: SAELens 6 cannot read it either",
                        path=path)
    cfg = {**cfg, "metadata": dict(cfg.get("metadata") or {})}
    if cfg["architecture"] != "standard":
        raise UserError(f"is a {cfg['architecture']!r} SAE: this project reads SAELens's \"standard\" one alone",
                        path=path)
    for key in ("d_in", "d_sae"):
        if not isinstance(cfg.get(key), int) or isinstance(cfg.get(key), bool) or cfg[key] < 1:
            raise UserError(f"{key} must be a whole number of at least 1, got {cfg.get(key)!r}", path=path)
    return cfg


def load_sae(folder):
    """-> an SAE: {"W_enc", "b_enc", "W_dec", "b_dec": float32 arrays, "cfg": read_cfg's}, the shapes checked.
    As SAELens, nothing is scaled for normalize_activations "expected_average_only_in": its factor is not saved."""
    cfg = read_cfg(folder)
    path = os.path.join(folder, WEIGHTS)
    if not os.path.isfile(path):
        raise UserError(f"is not a whole SAE folder: it has {CFG} but no {WEIGHTS}", path=folder)
    tensors, _ = load_file(path)
    sae = {"cfg": cfg}
    for name, dims in TENSORS.items():
        want = tuple(cfg[d] for d in dims)
        if name not in tensors or tuple(tensors[name].shape) != want:
            got = "missing" if name not in tensors else list(tensors[name].shape)
            raise UserError(f"{name} must be {list(want)} (d_in {cfg['d_in']}, d_sae {cfg['d_sae']}), is {got}",
                            path=path)
        sae[name] = np.array(tensors[name], dtype=np.float32)
    return sae


def saved_cfg(cfg):
    """The cfg.json that save writes: SAELens's keys, the version followed in the metadata."""
    metadata = {"sae_lens_version": SAE_LENS_VERSION, "sae_lens_training_version": SAE_LENS_VERSION,
                **cfg.get("metadata", {})}
    keys = ("d_in", "d_sae", "dtype", "device", "apply_b_dec_to_input", "normalize_activations", "reshape_activations")
    defaults = {"dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True, "normalize_activations": "none",
                "reshape_activations": "none"}
    arch = cfg.get("architecture", "standard")
    own = {k: cfg[k] for k in ("k", "rescale_acts_by_decoder_norm") if arch == "topk" and k in cfg}
    return {**{k: cfg.get(k, defaults.get(k)) for k in keys}, **own, "metadata": metadata, "architecture": arch}


def save_sae(folder, sae, extra_files=None):
    """Write the SAE's folder whole or not at all (a folder already there is replaced once the new one is whole).
    extra_files: {file name: text or bytes} written beside (train_log.jsonl, a run's state)."""
    with whole_folder(folder, "the SAE") as tmp:
        write_safetensors(os.path.join(tmp, WEIGHTS), {k: np.ascontiguousarray(sae[k], np.float32)
                                                       for k in (*TENSORS, "threshold") if k in sae})
        with open(os.path.join(tmp, CFG), "w", encoding="utf-8") as f:
            json.dump(saved_cfg(sae["cfg"]), f)
        for name, content in (extra_files or {}).items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(content if isinstance(content, bytes) else content.encode("utf-8"))
