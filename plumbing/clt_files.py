"""A cross-layer transcoder's folder, as circuit-tracer writes it (CrossLayerTranscoder.to_safetensors) and reads
it (load_clt): two safetensors files a layer l = 0 ... L-1,

    W_enc_{l}.safetensors     W_enc_{l} [d_tc, d_model], b_enc_{l} [d_tc], b_dec_{l} [d_model] (layer l's output's
                              bias), threshold_{l} [d_tc] when the activation is a JumpReLU (in every layer or none)
    W_dec_{l}.safetensors     W_dec_{l} [d_tc, L - l, d_model]: index j is what a feature of layer l writes at l + j

L is the number of W_enc_* files, which must run 0 ... L-1 with a W_dec_* beside each. Each shape is checked;
a mistake is one line (UserError) naming the file.
"""
import os
import re

import numpy as np

from plumbing.errors import UserError
from plumbing.safetensors_reader import load_file


def clt_layers(folder):
    """How many layers the folder's W_enc_{l}.safetensors files cover (0 ... L-1, none missing)."""
    if not os.path.isdir(folder):
        raise UserError("is not a cross-layer transcoder's folder (no such folder)", path=folder)
    found = sorted(int(m[1]) for m in map(re.compile(r"W_enc_(\d+)\.safetensors$").match, os.listdir(folder)) if m)
    if not found:
        raise UserError("is not a cross-layer transcoder's folder: it has no W_enc_0.safetensors", path=folder)
    if found != list(range(len(found))):
        missing = min(set(range(len(found) + 1)) - set(found))
        raise UserError(f"has no W_enc_{missing}.safetensors: a layer's files are missing", path=folder)
    return len(found)


def tensor(tensors, name, shape, path):
    """tensors[name] (float32, as the file maps it: not copied), of this shape, or one line naming the file."""
    if name not in tensors or tuple(tensors[name].shape) != shape:
        got = "missing" if name not in tensors else list(tensors[name].shape)
        raise UserError(f"{name} must be {list(shape)}, is {got}", path=path)
    return np.asarray(tensors[name], dtype=np.float32)


def read_clt(folder):
    """-> one dict a layer l: {"W_enc" [d_tc, d_model], "b_enc" [d_tc], "b_dec" [d_model], "W_dec" [d_tc, L - l,
    d_model], and "threshold" [d_tc] for a JumpReLU}, circuit-tracer's layouts, float32."""
    n_layers, layers = clt_layers(folder), []
    for l in range(n_layers):
        enc_path = os.path.join(folder, f"W_enc_{l}.safetensors")
        dec_path = os.path.join(folder, f"W_dec_{l}.safetensors")
        if not os.path.isfile(dec_path):
            raise UserError(f"has W_enc_{l}.safetensors but no W_dec_{l}.safetensors", path=folder)
        enc, dec = load_file(enc_path)[0], load_file(dec_path)[0]
        W_enc = enc.get(f"W_enc_{l}")
        if W_enc is None or W_enc.ndim != 2:
            raise UserError(f"W_enc_{l} must be [d_tc, d_model], is "
                            f"{'missing' if W_enc is None else list(W_enc.shape)}", path=enc_path)
        d_tc, d_model = W_enc.shape
        layer = {"W_enc": np.asarray(W_enc, np.float32), "b_enc": tensor(enc, f"b_enc_{l}", (d_tc,), enc_path),
                 "b_dec": tensor(enc, f"b_dec_{l}", (d_model,), enc_path),
                 "W_dec": tensor(dec, f"W_dec_{l}", (d_tc, n_layers - l, d_model), dec_path)}
        if f"threshold_{l}" in enc:
            layer["threshold"] = tensor(enc, f"threshold_{l}", (d_tc,), enc_path)
        if layers and ("threshold" in layer) != ("threshold" in layers[0]):
            raise UserError(f"has a JumpReLU's threshold_ in some layers' files but not in "
                            f"W_enc_{l}.safetensors", path=folder)
        if layers and layer["W_enc"].shape != layers[0]["W_enc"].shape:
            raise UserError(f"W_enc_{l} is {list(layer['W_enc'].shape)} but W_enc_0 "
                            f"{list(layers[0]['W_enc'].shape)}: every layer has the same width", path=enc_path)
        layers.append(layer)
    return layers
