"""GPT-2s in Hugging Face's format: a folder with config.json, model.safetensors (or shards),
vocab.json and merges.txt (or tokenizer.json alone), as `save_pretrained` writes it and the Hub
serves it; read here, and written here (convert.py --to hf) as save_pretrained would write it.

The tensors are the checkpoint's under torch's names, stated once (hf_name; reading goes through
the same names backwards), so the model never knows where they came from:

    Hugging Face (with or without "transformer.")     here
    wte.weight, wpe.weight                             wte, wpe
    h.3.ln_1.weight, h.3.ln_1.bias                     h3/ln_1/g, h3/ln_1/b
    h.3.attn.c_attn.weight (Conv1D: [n_in, n_out])     h3/attn/c_attn/w (the same layout)
    ln_f.weight, ln_f.bias                             ln_f/g, ln_f/b
    h.3.attn.bias, h.3.attn.masked_bias                (causal-mask buffers of older files: skipped)
    lm_head.weight                                     (the tied head: it must equal wte; not written)

config.json's options that change the architecture are either implemented (n_inner, the
MLP's width; layer_norm_epsilon) or refused by name: never silently wrong logits.
"""
import json
import os
import shutil

import numpy as np

from plumbing import classifier_files, gguf, shapes
from plumbing.errors import UserError, read_json
from plumbing.folders import whole_folder
from plumbing.shapes import LAYER_NORM_EPS, TOKENIZER_FILES, TOKENIZER_JSON
from plumbing.safetensors_reader import SafetensorsError, load_folder
from plumbing.safetensors_writer import write_safetensors

GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")  # two names for GPT-2's tanh approximation
CONFIG_NAMES = {"n_vocab": "vocab_size", "n_ctx": "n_positions", "n_embd": "n_embd", "n_head": "n_head",
                "n_layer": "n_layer"}  # hparams.json's names -> config.json's
TORCH_NAMES = {"w": "weight", "b": "bias", "g": "weight"}  # a layer's parameters, in torch's words


class HubFolderError(UserError):
    """A Hugging Face folder that cannot be run (or written) here; .path names the file."""


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
    hp = {ours: config.get(theirs) for ours, theirs in CONFIG_NAMES.items()}
    bad = [theirs for ours, theirs in CONFIG_NAMES.items() if not isinstance(hp[ours], int) or hp[ours] < 1]
    if bad:
        raise HubFolderError(f"needs a positive integer {bad[0]}", path=path)
    if hp["n_embd"] % hp["n_head"]:
        raise HubFolderError(f"n_embd {hp['n_embd']} is not a multiple of n_head {hp['n_head']}", path=path)
    hp["n_inner"] = config.get("n_inner") or 4 * hp["n_embd"]  # null means 4·d
    hp["layer_norm_epsilon"] = float(config.get("layer_norm_epsilon", LAYER_NORM_EPS))
    return hp


def hf_name(name):
    """The checkpoint's name (shapes.py) -> Hugging Face's: h3/attn/c_attn/w -> transformer.h.3.attn.c_attn.weight,
    ln_f/g -> transformer.ln_f.weight, wte -> transformer.wte.weight (an embedding's table is its weight)."""
    *layer, last = name.split("/")
    block = shapes.block_index(name)
    if block is not None:
        layer[0] = f"h.{block}"
    return ".".join(["transformer", *layer, TORCH_NAMES[last]] if layer else ["transformer", last, "weight"])


def our_names(hp):
    """{Hugging Face's name: the checkpoint's} for every tensor of a GPT-2 of these hparams: hf_name backwards."""
    return {hf_name(name): name for name in shapes.tensor_shapes(hp)}


def is_mask_buffer(name):
    """h.3.attn.bias and h.3.attn.masked_bias: the causal mask, which older files stored as if a weight."""
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "h" and parts[1].isdigit() and parts[2:] in (
        ["attn", "bias"], ["attn", "masked_bias"])


def tokenizer_json_files(folder):
    """tokenizer.json -> OpenAI's two files, {"encoder.json": bytes, "vocab.bpe": bytes}: its BPE model's
    vocab and merges are the same two tables. Only GPT-2's own tokenizer is read (byte-level BPE, GPT-2's
    pre-tokenizer, no normalizer, nothing added around a text); anything else is refused by name, as
    transformers would tokenize it otherwise. Added tokens beyond the vocab (a [PAD] added for padding)
    get their ids."""
    path = os.path.join(folder, TOKENIZER_JSON)
    t = read_json(path, HubFolderError)
    model = t.get("model") if isinstance(t, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict) \
            or not isinstance(model.get("merges"), list):
        raise HubFolderError("is not a BPE tokenizer (its model needs type BPE, a vocab and merges)", path=path)
    pre = t.get("pre_tokenizer") or {}
    post = t.get("post_processor") or {"type": "ByteLevel"}
    differs = [(t.get("normalizer") is not None, "a normalizer"),
               (pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or pre.get("use_regex") is False,
                "a pre-tokenizer other than GPT-2's (ByteLevel, no prefix space)"),
               (post.get("type") not in ("ByteLevel", "TemplateProcessing") or
                any("SpecialToken" in piece for piece in post.get("single") or []),
                "a post-processor that adds tokens around a text"),
               (bool(model.get("ignore_merges")) or bool(model.get("byte_fallback")) or model.get("dropout")
                or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"),
                "a BPE model with options GPT-2's does not have")]
    for different, what in differs:
        if different:
            raise HubFolderError(f"has {what}: this project reads GPT-2's byte-level BPE only", path=path)
    vocab = dict(model["vocab"])
    for added in t.get("added_tokens") or []:
        if isinstance(added, dict) and added.get("content") not in vocab and isinstance(added.get("id"), int):
            vocab[added["content"]] = added["id"]
    merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
    if not all(isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m) for m in merges):
        raise HubFolderError("has a merge that is not two tokens", path=path)
    return {"encoder.json": json.dumps(vocab, ensure_ascii=False).encode("utf-8"),
            "vocab.bpe": ("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)).encode("utf-8")}


def has_tokenizer_json_only(folder):
    """A folder whose tokenizer is tokenizer.json alone (neither OpenAI's two files nor vocab.json)."""
    return os.path.isdir(folder) and os.path.exists(os.path.join(folder, TOKENIZER_JSON)) and not any(
        os.path.exists(os.path.join(folder, name)) for name in (*TOKENIZER_FILES, *TOKENIZER_FILES.values()))


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
    ours, flat, head, unexpected = our_names(hp), {}, None, []
    for name, array in tensors.items():
        short = name[len("transformer."):] if name.startswith("transformer.") else name
        if short == "lm_head.weight":
            head = array
        elif "transformer." + short in ours:
            flat[ours["transformer." + short]] = array
        elif short != "score.weight" and not is_mask_buffer(short):  # a classifier's head: classifier_files.py
            unexpected.append(name)
    want = shapes.tensor_shapes(hp)
    for problem, names in (("missing", [hf_name(n) for n in want if n not in flat]), ("unexpected", sorted(unexpected))):
        if names:
            raise HubFolderError(f"the weights have {problem} tensor {names[0]} (for the shape in config.json)",
                                 path=folder)
    for name, shape in want.items():
        if flat[name].shape != shape:
            raise HubFolderError(f"{hf_name(name)} has shape {flat[name].shape}, config.json implies {shape}",
                                 path=folder)
    if head is not None and not (head.shape == flat["wte"].shape and np.array_equal(head, flat["wte"])):
        raise HubFolderError("lm_head.weight differs from wte: an untied output layer, which this project does not "
                             "implement (GPT-2 ties them)", path=folder)
    return hp, shapes.nest(flat, hp["n_layer"]), converted  # the layer norms' eps is in hp, a hyperparameter


# ----------------------------------------------------------------------------
# Writing a folder, as save_pretrained would
# ----------------------------------------------------------------------------

def config(hp, eot):
    """config.json for GPT2LMHeadModel: what transformers' save_pretrained writes for a GPT-2 of these
    hparams (GPT2Config's defaults for the rest), but transformers_version: this is not transformers.
    n_ctx is the released models' duplicate of n_positions, which TransformerLens reads. eot: the
    vocabulary's <|endoftext|>, which is GPT-2's bos and eos."""
    d = hp["n_embd"]
    n_inner = hp.get("n_inner") or 4 * d
    return {"activation_function": "gelu_new", "add_cross_attention": False, "architectures": ["GPT2LMHeadModel"],
            "attn_pdrop": 0.1, "bos_token_id": eot, "dtype": "float32", "embd_pdrop": 0.1, "eos_token_id": eot,
            "initializer_range": 0.02, "layer_norm_epsilon": hp.get("layer_norm_epsilon", LAYER_NORM_EPS),
            "model_type": "gpt2", "n_ctx": hp["n_ctx"], "n_inner": None if n_inner == 4 * d else n_inner,
            "pad_token_id": None, "reorder_and_upcast_attn": False, "resid_pdrop": 0.1,
            "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True, "summary_activation": None,
            "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
            "summary_use_proj": True, "tie_word_embeddings": True, "use_cache": True,
            **{theirs: hp[ours] for ours, theirs in CONFIG_NAMES.items()}}


def generation_config(eot):
    """generation_config.json, as save_pretrained derives it from the model's config."""
    return {"_from_model_config": True, "bos_token_id": eot, "eos_token_id": eot, "output_attentions": False,
            "output_hidden_states": False, "use_cache": True}


def json_file(content):
    """A JSON file as transformers writes its own: keys sorted, two spaces, a newline at the end."""
    return (json.dumps(content, indent=2, sort_keys=True) + "\n").encode()


def merges_txt(vocab_bpe):
    """vocab.bpe's bytes as merges.txt: the same lines, under the "#version" line that Hugging Face's
    readers skip (OpenAI's file has it; a file without it would lose its first merge to some readers)."""
    return vocab_bpe if vocab_bpe.startswith(b"#version") else b"#version: 0.2\n" + vocab_bpe


def write_hf_folder(folder, params, hparams, vocab_dir, eot, head=None):
    """Write params as a Hugging Face folder that GPT2LMHeadModel.from_pretrained and
    GPT2TokenizerFast.from_pretrained load: config.json, generation_config.json, model.safetensors
    (float32, the tied head left out as save_pretrained leaves it), and the tokenizer's two files from
    vocab_dir (under OpenAI's names or Hugging Face's), whole or not at all. head: a classifier's
    ({"score", "labels", "pad_id"}, classifier_files.read_head's): a GPT2ForSequenceClassification, whose
    score.weight is beside the body's tensors and whose config says its labels."""
    flat = shapes.flatten(params)
    for name, shape in shapes.tensor_shapes(hparams).items():
        if flat[name].shape != shape:
            raise HubFolderError(f"{name} has shape {flat[name].shape}, its hparams imply {shape}", path=folder)
    tensors = {hf_name(name): array for name, array in flat.items()}
    settings = config(hparams, eot)
    if head is not None:
        tensors["score.weight"] = head["score"]
        settings |= classifier_files.hf_config(head["labels"], head["pad_id"])
    files = {"config.json": json_file(settings), "generation_config.json": json_file(generation_config(eot)),
             "tokenizer_config.json": json_file({"model_max_length": hparams["n_ctx"]})}
    with whole_folder(folder, "the Hugging Face folder", HubFolderError) as tmp:
        try:
            write_safetensors(os.path.join(tmp, "model.safetensors"), tensors, metadata={"format": "pt"})
        except SafetensorsError as e:  # it names the hidden folder, which is gone: name the one asked for
            raise HubFolderError(e.message, path=folder) from None
        vocab = gguf.vocabulary_files(vocab_dir) if gguf.is_gguf(vocab_dir) else \
            tokenizer_json_files(vocab_dir) if has_tokenizer_json_only(vocab_dir) else {}  # a GGUF's, tokenizer.json's
        for name, hf in TOKENIZER_FILES.items():
            if vocab:
                files[hf] = merges_txt(vocab[name]) if hf == "merges.txt" else vocab[name]
                continue
            source = os.path.join(vocab_dir, name if os.path.exists(os.path.join(vocab_dir, name)) else hf)
            if hf == "merges.txt":
                with open(source, "rb") as f:
                    files[hf] = merges_txt(f.read())
            else:
                shutil.copy(source, os.path.join(tmp, hf))
        for name, content in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(content)
    return folder
