"""A GPT-2 written as a GGUF file (plumbing/gguf.py draws the format), byte for byte as llama.cpp's
convert_hf_to_gguf.py (with gguf-py 0.19.0) writes it with --outtype f32, f16 or q8_0 for the
Hugging Face folder that convert.py --to hf writes of the same model, named after that folder.

What the converter chooses, and so this file:
- the metadata, in its order: general.architecture, general.type, general.name (and version,
  finetune, basename, size_label: gguf-py's reading of the folder's name, below), the gpt2.*
  hyperparameters (feed_forward_length always 4d: it ignores n_inner), general.file_type,
  general.quantization_version, then the tokenizer: model "gpt2", pre "gpt-2", the tokens (an id
  the vocabulary lacks is "[PADn]", unused), their types (<|endoftext|> control, the rest
  normal), the merges as merges.txt holds them, and config.json's bos and eos ids;
- the tensors in the order of their Hugging Face names, sorted as strings (h.10 before h.2);
- their types: float32 for 1-D tensors and position_embd; otherwise the --outtype, except that a
  tensor whose rows are not whole Q8_0 blocks of 32 falls back to float16.
"""
import re
import struct

import numpy as np

from plumbing import gguf, shapes
from plumbing.folders import whole_file
from plumbing.gguf import F16, F32, Q8_0, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNUSED, GGUFError
from plumbing.hf_model import hf_name

FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7}  # general.file_type: LlamaFileType's ALL_F32, MOSTLY_F16, MOSTLY_Q8_0
WEIGHT_TYPES = {"f32": F32, "f16": F16, "q8_0": Q8_0}
QUANTIZATION_VERSION = 2  # ggml's GGML_QNT_VERSION
ENDOFTEXT = "<|endoftext|>"
U32, F32_VALUE, STRING, ARRAY, INT32 = gguf.UINT32, gguf.FLOAT32, gguf.STRING, gguf.ARRAY, gguf.INT32


# ----------------------------------------------------------------------------
# The name, as gguf-py's Metadata reads a model folder's name
# ----------------------------------------------------------------------------

def rounded_count(n):
    """gguf-py's model_weight_count_rounded_notation (min_digits 2): 124,439,808 -> "124M", 43,904 -> "44K"."""
    scaled, suffix = next(((n * factor, suffix) for limit, factor, suffix in
                           ((1e12, 1e-12, "T"), (1e9, 1e-9, "B"), (1e6, 1e-6, "M")) if n > limit), (n * 1e-3, "K"))
    fix = max(2 - len(str(round(scaled)).lstrip("0")), 0)
    return f"{scaled:.{fix}f}{suffix}"


def id_to_title(string):
    """gguf-py's Metadata.id_to_title: "gpt2-124M" -> "Gpt2 124M"."""
    return " ".join(w.title() if w.islower() and not re.match(r"^(v\d+(?:\.\d+)*|\d.*)$", w) else w
                    for w in string.strip().replace("-", " ").split())


def name_components(model_id, total_params):
    """gguf-py's Metadata.get_model_id_components for a folder's name (which has no org/):
    -> (basename, finetune, version, size_label), each None where the name says nothing."""
    if " " in model_id:
        return None, None, None, None
    parts = [p for p in model_id.split("-") if p]
    kinds = [set() for _ in parts]
    for i, part in enumerate(parts):
        if re.fullmatch(r"(v|iter)?\d+([.]\d+)*", part, re.IGNORECASE):
            kinds[i].add("version")
        elif re.fullmatch(r"i?q\d(_\w)*|b?fp?(16|32)", part, re.IGNORECASE):
            kinds[i].add("type")
            parts[i] = part.upper()
        elif i > 0 and re.fullmatch(r"(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)", part,
                                    re.IGNORECASE):
            part = part.replace("_", ".")
            if part[-1].isdecimal():
                part = part[:-2] + "." + part[-1] + part[-2]
            if len(part) > 1 and part[-2].isdecimal() and part[-1] in "kmbt":
                part = part[:-1] + part[-1].upper()
            if total_params != 0:
                try:
                    label = float(part[:-1]) * pow(1000, " KMBT".find(part[-1]))
                    if total_params > 0 and abs(label - total_params) > 7 * total_params // 8:
                        kinds[i].add("finetune")  # likely a context length
                        part = part[:-1] + part[-1].lower()
                except ValueError:
                    pass
            if not kinds[i]:
                kinds[i].add("size_label")
            parts[i] = part
        elif i > 0 and re.fullmatch(r"chat|instruct|vision|lora", part, re.IGNORECASE):
            kinds[i].add("finetune")
    if any(c.isdecimal() for p, k in zip(parts, kinds) if "size_label" in k for c in p):
        for p, k in zip(parts, kinds):
            if "size_label" in k and all(c.isalpha() for c in p):
                k.remove("size_label")
    at_start = True
    for p, k in zip(parts, kinds):
        if at_start and ((not k and p[0].isalpha()) or "version" in k):
            k.add("basename")
        else:
            at_start = False
            if not k:
                k.add("finetune")
    for p, k in zip(reversed(parts), reversed(kinds)):
        if "basename" in k and len(k) > 1:
            k.remove("basename")
        else:
            break

    def joined(kind, sep="-", unless=None):
        return sep.join(dict.fromkeys(p for p, k in zip(parts, kinds) if kind in k and unless not in k)) or None

    basename, size_label = joined("basename"), joined("size_label")
    finetune = "-".join(p for p, k in zip(parts, kinds) if "finetune" in k) or None
    version = "-".join(p for p, k in zip(parts, kinds) if "version" in k and "basename" not in k) or None
    if size_label is None and finetune is None and version is None:
        basename = None
    return basename, finetune, version, size_label


def general_metadata(folder_name, total_params):
    """general.* as the converter writes them for a folder of this name."""
    basename, finetune, version, size_label = name_components(folder_name, total_params)
    meta = [("general.architecture", STRING, "gpt2"), ("general.type", STRING, "model"),
            ("general.name", STRING, id_to_title(folder_name))]
    meta += [(f"general.{key}", STRING, value) for key, value in
             (("version", version), ("finetune", finetune), ("basename", basename)) if value is not None]
    return meta + [("general.size_label", STRING, size_label or rounded_count(total_params))]


# ----------------------------------------------------------------------------
# The tensors and the metadata
# ----------------------------------------------------------------------------

def tensor_type(name, shape, gguf_type):
    """The converter's choice: 1-D tensors and position_embd stay float32; a weight whose rows
    are not whole Q8_0 blocks falls back to float16."""
    if len(shape) <= 1 or name == "position_embd.weight" or not name.endswith(".weight"):
        return F32
    if gguf_type == "q8_0" and shape[-1] % gguf.QK8_0:
        return F16
    return WEIGHT_TYPES[gguf_type]


def in_file_order(hp):
    """Our tensor names in the converter's order: by Hugging Face name, sorted as strings."""
    return sorted(shapes.tensor_shapes(hp), key=hf_name)


def stored_shape(name, shape):
    return tuple(reversed(shape)) if name.endswith(gguf.TRANSPOSED) else tuple(shape)


def tensor_bytes(array, name, ggml_type):
    """One tensor's bytes as the converter writes them (Conv1D's weights transposed first)."""
    a = np.asarray(array, dtype=np.float32)
    a = a.T if name.endswith(gguf.TRANSPOSED) else a
    if ggml_type == F32:
        return np.ascontiguousarray(a, dtype="<f4")
    if ggml_type == F16:
        return np.ascontiguousarray(a).astype("<f2")
    return gguf.quantize_q8_0_fast(np.ascontiguousarray(a))


def merges_from_text(text):
    """merges.txt's lines as gguf-py's SpecialVocab reads them: a first line starting with "#" is
    skipped, and so are blank lines and lines that are not two tokens."""
    lines = text.splitlines()
    if lines and lines[0].strip().startswith("#"):
        lines = lines[1:]
    return [" ".join(parts) for parts in (line.strip().split(None, 3) for line in lines) if len(parts) == 2]


def tokenizer_metadata(tokens, merges, n_vocab, eot, path=None):
    """tokenizer.*: tokens by id ("[PADn]" where the vocabulary has no id n), their types, merges."""
    if eot is None:
        raise GGUFError(f"cannot be written: the vocabulary has no {ENDOFTEXT}, which llama.cpp needs as GPT-2's "
                        "bos and eos token", path=path)
    texts = [tokens[i] if i < len(tokens) else f"[PAD{i}]" for i in range(n_vocab)]
    types = [TOKEN_UNUSED if i >= len(tokens) else TOKEN_CONTROL if i == eot else TOKEN_NORMAL
             for i in range(n_vocab)]
    return [("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, "gpt-2"),
            ("tokenizer.ggml.tokens", ARRAY, (STRING, texts)), ("tokenizer.ggml.token_type", ARRAY, (INT32, types)),
            ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
            ("tokenizer.ggml.bos_token_id", U32, eot), ("tokenizer.ggml.eos_token_id", U32, eot)]


def metadata(hp, gguf_type, folder_name, total_params, tokenizer):
    """Every key, in the converter's order: [(key, value type, value)]."""
    return general_metadata(folder_name, total_params) + [
        ("gpt2.block_count", U32, hp["n_layer"]), ("gpt2.context_length", U32, hp["n_ctx"]),
        ("gpt2.embedding_length", U32, hp["n_embd"]), ("gpt2.feed_forward_length", U32, 4 * hp["n_embd"]),
        ("gpt2.attention.head_count", U32, hp["n_head"]),
        ("gpt2.attention.layer_norm_epsilon", F32_VALUE, hp.get("layer_norm_epsilon", shapes.LAYER_NORM_EPS)),
        ("general.file_type", U32, FILE_TYPES[gguf_type]), ("general.quantization_version", U32, QUANTIZATION_VERSION),
    ] + tokenizer


def pack_string(s):
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def pack_value(vtype, value):
    """A metadata value's bytes after its type: a scalar, a string, or (item type, items)."""
    if vtype == STRING:
        return pack_string(value)
    if vtype == ARRAY:
        item, items = value
        head = struct.pack("<IQ", item, len(items))
        if item == STRING:
            return head + b"".join(pack_string(s) for s in items)
        return head + np.asarray(items, dtype=gguf.SCALARS[item]).tobytes()
    return struct.pack(gguf.SCALARS[vtype], value)


def padding(n):
    return b"\0" * (-n % gguf.ALIGNMENT)


def header_bytes(keys, infos):
    """The header, the metadata and the tensor infos, padded to where the data begins."""
    out = [gguf.MAGIC, struct.pack("<IQQ", 3, len(infos), len(keys))]
    for key, vtype, value in keys:
        out += [pack_string(key), struct.pack("<I", vtype), pack_value(vtype, value)]
    offset = 0
    for name, shape, ggml_type in infos:
        out += [pack_string(name), struct.pack("<I", len(shape)), struct.pack(f"<{len(shape)}Q", *reversed(shape)),
                struct.pack("<IQ", ggml_type, offset)]
        n = gguf.tensor_nbytes(shape, ggml_type)
        offset += n + (-n % gguf.ALIGNMENT)
    raw = b"".join(out)
    return raw + padding(len(raw))


def write_gguf(path, params, hparams, tokens, merges, eot, gguf_type="f32", folder_name=None):
    """Write params as a GGUF file at `path`, whole or not at all. tokens: the vocabulary by id,
    spelled as encoder.json spells it; merges: ["left right", ...] (merges_from_text); eot: the
    id of <|endoftext|>. folder_name: the name of the folder the converter converts (convert.converted_name;
    None: OUT's, less .gguf)."""
    flat = shapes.flatten(params)
    for name, shape in shapes.tensor_shapes(hparams).items():
        if flat[name].shape != shape:
            raise GGUFError(f"{name} has shape {flat[name].shape}, its hparams imply {shape}", path=path)
    names = in_file_order(hparams)
    infos = [(gguf.gguf_name(n), stored_shape(n, flat[n].shape)) for n in names]
    infos = [(theirs, shape, tensor_type(theirs, shape, gguf_type)) for theirs, shape in infos]
    total = sum(int(np.prod(shape)) for _, shape, _ in infos)
    if folder_name is None:
        folder_name = re.sub(r"\.gguf$", "", str(path).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1], flags=re.I)
    keys = metadata(hparams, gguf_type, folder_name, total,
                    tokenizer_metadata(tokens, merges, hparams["n_vocab"], eot, path))
    with whole_file(path, "the GGUF file", error=GGUFError) as tmp, open(tmp, "wb") as f:
        f.write(header_bytes(keys, infos))
        for name, (_, _, ggml_type) in zip(names, infos):
            data = tensor_bytes(flat[name], name, ggml_type)
            f.write(data.data)
            f.write(padding(data.nbytes))
    return path
