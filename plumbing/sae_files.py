"""An SAE's folder, as SAELens 6.54.12 writes it (SAE.save_model, TrainingSAE.save_inference_model) and reads
it (SAE.load_from_disk):

    cfg.json                  {"d_in", "d_sae", "dtype", "device", "apply_b_dec_to_input", "normalize_activations",
                               "reshape_activations", "metadata": {"hook_name", "model_name", "sae_lens_version", ...},
                               "architecture", and the architecture's own fields: ARCHITECTURE_FIELDS}
    sae_weights.safetensors   W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_out], b_dec [d_out], float32;
                              threshold [d_sae] (jumprelu*), W_skip [d_out, d_in] (*skip_transcoder)

The architectures: standard, topk (k, rescale_acts_by_decoder_norm), jumprelu (a BatchTopK is saved as one, its
threshold the same for every latent), and the transcoders (d_out, metadata.hook_name_out: they read hook_name
and write hook_name_out; b_dec is never taken from their input, so apply_b_dec_to_input must be false).
A cfg.json without metadata.sae_lens_version (nor a top-level one) is read as SAELens reads one from
before 6.0: its keys are flat (hook_point for hook_name), without "architecture" it is "standard", and
activation_fn "topk" with activation_fn_kwargs {"k": K} is a TopK SAE. A 6.x one must say its architecture.
What SAELens would refuse, or run wrongly, is refused here in one line (UserError): an unknown architecture or
normalisation, k above d_sae, a JumpReLU without its threshold, a transcoder that takes b_dec from its input.
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
TENSORS = {"W_enc": ("d_in", "d_sae"), "b_enc": ("d_sae",), "W_dec": ("d_sae", "d_out"), "b_dec": ("d_out",),
           "threshold": ("d_sae",), "W_skip": ("d_out", "d_in")}
ARCHITECTURES = ("standard", "topk", "jumprelu", "transcoder", "skip_transcoder", "jumprelu_transcoder",
                 "jumprelu_skip_transcoder")  # SAELens 6.54.12's inference SAEs that this project runs
NORMALIZATIONS = ("none", "expected_average_only_in", "covariance_whitening", "constant_norm_rescale", "layer_norm")
ARCHITECTURE_FIELDS = {"topk": {"k": 100, "rescale_acts_by_decoder_norm": False},  # TopKSAEConfig's defaults
                       "transcoder": {"d_out": 768}}  # TranscoderConfig's (every *transcoder)
PRE_6_RENAMED = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index",
                 "activation_fn_str": "activation_fn"}
METADATA_KEYS = ("model_name", "hook_name", "hook_head_index", "model_class_name", "context_size", "prepend_bos",
                 "dataset_path", "model_from_pretrained_kwargs", "seqpos_slice", "sae_lens_training_version",
                 "neuronpedia_id", "exclude_special_tokens", "sae_lens_version", "hook_name_out",
                 "hook_head_index_out", "hf_hook_name", "hf_hook_name_out")


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
            "architecture": cfg.get("architecture", "standard"), **pre_6_fields(cfg)}


def pre_6_fields(cfg):
    """The architecture's own fields of a pre-6.0 cfg.json (a TopK's k from activation_fn_kwargs, as SAELens)."""
    topk = cfg.get("activation_fn") == "topk" and (cfg.get("activation_fn_kwargs") or {}).get("k") is not None
    architecture = "topk" if topk else cfg.get("architecture", "standard")
    fields = {k: cfg[k] for k in fields_of(architecture) if k in cfg}
    return {**fields, "architecture": architecture, **({"k": cfg["activation_fn_kwargs"]["k"]} if topk else {})}


def fields_of(architecture):
    """The cfg.json fields an architecture adds to SAELens's SAEConfig, with their defaults."""
    return ARCHITECTURE_FIELDS.get("transcoder" if architecture.endswith("transcoder") else architecture, {})


def read_cfg(folder):
    """The folder's cfg.json, in 6.x's shape, with its architecture's defaults (and d_out, d_in but for a
    transcoder), checked: an architecture and a normalisation this project runs, whole-number widths."""
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
    architecture = cfg["architecture"]
    if architecture not in ARCHITECTURES:
        raise UserError(f"is a {architecture!r} SAE: this project runs SAELens's {', '.join(ARCHITECTURES)} "
                        "(a BatchTopK is saved as a jumprelu)", path=path)
    cfg = {**fields_of(architecture), **cfg}
    if architecture.endswith("transcoder"):
        if cfg.get("apply_b_dec_to_input", True):
            raise UserError("is a transcoder with apply_b_dec_to_input true: its b_dec is its output's, d_out wide "
                            "(SAELens refuses it too)", path=path)
    else:
        cfg["d_out"] = cfg.get("d_in")
    for key in ("d_in", "d_sae", "d_out") + (("k",) if architecture == "topk" else ()):
        if not isinstance(cfg.get(key), int) or isinstance(cfg.get(key), bool) or cfg[key] < 1:
            raise UserError(f"{key} must be a whole number of at least 1, got {cfg.get(key)!r}", path=path)
    if architecture == "topk" and cfg["k"] > cfg["d_sae"]:
        raise UserError(f"k is {cfg['k']} but the SAE has {cfg['d_sae']} latents: k must be at most d_sae", path=path)
    if cfg.get("normalize_activations", "none") not in NORMALIZATIONS:
        raise UserError(f"normalize_activations must be one of {', '.join(NORMALIZATIONS)}, got "
                        f"{cfg.get('normalize_activations')!r}", path=path)
    return cfg


def tensor_names(architecture):
    """The tensors an architecture's sae_weights.safetensors holds."""
    names = ["W_enc", "b_enc", "W_dec", "b_dec"]
    if architecture.startswith("jumprelu"):
        names.append("threshold")
    if architecture.endswith("skip_transcoder"):
        names.append("W_skip")
    return names


def load_sae(folder):
    """-> an SAE: {"W_enc", "b_enc", "W_dec", "b_dec": float32 arrays, "cfg": read_cfg's}, the shapes checked.
    As SAELens, nothing is scaled for normalize_activations "expected_average_only_in": its factor is not saved."""
    cfg = read_cfg(folder)
    path = os.path.join(folder, WEIGHTS)
    if not os.path.isfile(path):
        raise UserError(f"is not a whole SAE folder: it has {CFG} but no {WEIGHTS}", path=folder)
    tensors, _ = load_file(path)
    if "threshold" not in tensors and "log_threshold" in tensors:  # SAELens's older JumpReLU checkpoints
        tensors["threshold"] = np.exp(np.asarray(tensors["log_threshold"], np.float32))
    sae = {"cfg": cfg}
    for name in tensor_names(cfg["architecture"]):
        want = tuple(cfg[d] for d in TENSORS[name])
        if name not in tensors or tuple(tensors[name].shape) != want:
            got = "missing" if name not in tensors else list(tensors[name].shape)
            sizes = ", ".join(f"{d} {cfg[d]}" for d in ("d_in", "d_sae", "d_out"))
            raise UserError(f"{name} must be {list(want)} ({sizes}; a {cfg['architecture']} SAE), is {got}",
                            path=path)
        sae[name] = np.array(tensors[name], dtype=np.float32)
    return sae


def saved_cfg(cfg):
    """The cfg.json that save writes, as SAELens's save_inference_model writes it: SAEConfig's keys, the
    architecture's own (fields_of: d_out only for a transcoder), the version followed in the metadata."""
    metadata = {"sae_lens_version": SAE_LENS_VERSION, "sae_lens_training_version": SAE_LENS_VERSION,
                **cfg.get("metadata", {})}
    architecture = cfg.get("architecture", "standard")
    keys = ("d_in", "d_sae", "dtype", "device", "apply_b_dec_to_input", "normalize_activations", "reshape_activations")
    defaults = {"dtype": "float32", "device": "cpu", "apply_b_dec_to_input": not architecture.endswith("transcoder"),
                "normalize_activations": "none", "reshape_activations": "none", **fields_of(architecture)}
    own = {k: cfg.get(k, defaults[k]) for k in fields_of(architecture)}
    return {**{k: cfg.get(k, defaults.get(k)) for k in keys}, "metadata": metadata, **own,
            "architecture": architecture}


def save_sae(folder, sae, extra_files=None):
    """Write the SAE's folder whole or not at all (a folder already there is replaced once the new one is whole):
    the tensors of its architecture (a TopK's decoder norms already folded, a BatchTopK already a jumprelu: the
    trainer's saving does that). extra_files: {file name: text or bytes} written beside (train_log.jsonl, a run's state)."""
    names = tensor_names(sae["cfg"].get("architecture", "standard"))
    with whole_folder(folder, "the SAE") as tmp:
        write_safetensors(os.path.join(tmp, WEIGHTS), {k: np.ascontiguousarray(sae[k], np.float32) for k in names})
        with open(os.path.join(tmp, CFG), "w", encoding="utf-8") as f:
            json.dump(saved_cfg(sae["cfg"]), f)
        for name, content in (extra_files or {}).items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(content if isinstance(content, bytes) else content.encode("utf-8"))
