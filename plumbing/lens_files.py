"""A tuned lens's folder as tuned-lens 0.2.0 saves it, and a linear probe's folder.

    LENS_DIR/config.json    {"base_model_name_or_path", "d_model", "num_hidden_layers", "bias": true,
                             "base_model_revision", "unembed_hash", "lens_type": "linear_tuned_lens"}
    LENS_DIR/params.pt      torch.save of the translators' state dict: "0.weight" [C, C], "0.bias" [C], "1.weight", ...
                            (plumbing/torch_archive.py: read and written without torch)

    PROBE_DIR/probe.json         {"method", "site", "position", "bias", "standardize", "C", "iid", "d", ...}
    PROBE_DIR/probe.safetensors  "direction" [d]; "mean" and "scale" [d] when the features were standardized

A lens is a list of translators {"weight", "bias"} (lens.py); a probe is {"direction", "bias", "mean", "scale",
...}. Both are written whole or not at all (plumbing/folders.py).
"""
import json
import os

import numpy as np

from plumbing.errors import UserError, read_json
from plumbing.folders import whole_folder
from plumbing.safetensors_reader import load_file
from plumbing.safetensors_writer import write_safetensors
from plumbing.torch_archive import read_state_dict, write_state_dict

LENS_CONFIG, LENS_PARAMS = "config.json", "params.pt"
PROBE_CONFIG, PROBE_TENSORS = "probe.json", "probe.safetensors"
LENS_TYPE = "linear_tuned_lens"
HUB_NAMES = {"124M": "gpt2", "355M": "gpt2-medium", "774M": "gpt2-large", "1558M": "gpt2-xl"}  # tuned-lens's names


def lens_config(model, n_embd, n_layer, unembed_hash):
    """tuned-lens's TunedLensConfig for a lens of this model (a released size by its Hub name)."""
    return {"base_model_name_or_path": HUB_NAMES.get(model, model), "d_model": n_embd, "num_hidden_layers": n_layer,
            "bias": True, "base_model_revision": None, "unembed_hash": unembed_hash, "lens_type": LENS_TYPE}


def save_lens(folder, lens, config):
    """The lens's folder: config.json and params.pt, as TunedLens.save writes them."""
    tensors, metadata = {}, {"": {"version": 1}}
    for i, translator in enumerate(lens):
        tensors[f"{i}.weight"], tensors[f"{i}.bias"] = translator["weight"], translator["bias"]
        metadata[str(i)] = {"version": 1}
    with whole_folder(folder, "the lens") as tmp:
        write_state_dict(os.path.join(tmp, LENS_PARAMS), tensors, metadata)
        with open(os.path.join(tmp, LENS_CONFIG), "w", encoding="utf-8") as f:
            json.dump(config, f)


def load_lens(folder):
    """-> (lens, config) from tuned-lens's folder: each translator's weight [C, C] and bias [C]; a folder that is
    not a linear tuned lens is a UserError."""
    if not os.path.isdir(folder):
        raise UserError("no such lens folder" if not os.path.exists(folder) else "is not a folder", path=folder)
    for name in (LENS_CONFIG, LENS_PARAMS):
        if not os.path.isfile(os.path.join(folder, name)):
            raise UserError(f"is not a tuned lens's folder: it has no {name}", path=folder)
    config = read_json(os.path.join(folder, LENS_CONFIG))
    if not isinstance(config, dict) or config.get("lens_type", LENS_TYPE) != LENS_TYPE:
        raise UserError(f"is not a {LENS_TYPE} (tuned-lens's lens_type)", path=os.path.join(folder, LENS_CONFIG))
    path = os.path.join(folder, LENS_PARAMS)
    tensors, _ = read_state_dict(path)
    lens, i = [], 0
    while f"{i}.weight" in tensors:
        bias = tensors.pop(f"{i}.bias", None)
        if bias is None:
            raise UserError(f"translator {i} has no bias (tuned-lens's lenses have one: bias true)", path=path)
        lens.append({"weight": tensors.pop(f"{i}.weight"), "bias": bias})
        i += 1
    if not lens or tensors:
        raise UserError(f"holds {', '.join(sorted(tensors)[:3]) or 'nothing'}, not translators "
                        "(0.weight, 0.bias, 1.weight, ...)", path=path)
    for i, t in enumerate(lens):
        C = t["weight"].shape[-1]
        if t["weight"].shape != (C, C) or t["bias"].shape != (C,):
            raise UserError(f"translator {i} is {list(t['weight'].shape)} with a bias of {list(t['bias'].shape)}, "
                            "not [C, C] and [C]", path=path)
    return lens, config


def save_probe(folder, probe, settings):
    """The probe's folder: probe.json (settings: method, site, position, ...; and the bias) and probe.safetensors
    (the direction; mean and scale when standardized)."""
    tensors = {"direction": np.asarray(probe["direction"], np.float32)}
    if settings.get("standardize"):
        tensors |= {"mean": np.asarray(probe["mean"], np.float32), "scale": np.asarray(probe["scale"], np.float32)}
    with whole_folder(folder, "the probe") as tmp:
        write_safetensors(os.path.join(tmp, PROBE_TENSORS), tensors)
        with open(os.path.join(tmp, PROBE_CONFIG), "w", encoding="utf-8") as f:
            json.dump({**settings, "bias": float(probe["bias"]), "d": len(tensors["direction"])}, f, indent=1)


def load_probe(folder):
    """-> a probe: {"direction" [d], "bias", "mean" [d], "scale" [d] (0 and 1 unless standardized), and
    probe.json's settings}; a folder that is not one is a UserError."""
    for name in (PROBE_CONFIG, PROBE_TENSORS):
        if not os.path.isfile(os.path.join(folder, name)):
            raise UserError(f"is not a probe's folder (lens.py probe writes one): it has no {name}", path=folder)
    settings = read_json(os.path.join(folder, PROBE_CONFIG))
    tensors, _ = load_file(os.path.join(folder, PROBE_TENSORS))
    direction = np.asarray(tensors.get("direction", np.zeros((0, 0))), np.float32)
    if not isinstance(settings, dict) or not isinstance(settings.get("site"), str) or direction.ndim != 1 \
            or not isinstance(settings.get("bias"), (int, float)):
        raise UserError("is not a probe: probe.json needs a site and a bias, probe.safetensors a direction [d]",
                        path=folder)
    d = len(direction)
    mean = np.asarray(tensors.get("mean", np.zeros(d)), np.float32)
    scale = np.asarray(tensors.get("scale", np.ones(d)), np.float32)
    if mean.shape != (d,) or scale.shape != (d,) or not (scale > 0).all():
        raise UserError(f"its mean and scale must be [{d}], the scale positive", path=folder)
    return {**settings, "direction": direction, "mean": mean, "scale": scale}
