"""A model folder's weights, whichever format holds them: OpenAI's TensorFlow checkpoint
(hparams.json, model.ckpt.*) or Hugging Face's safetensors (config.json, model.safetensors);
or a GGUF file, llama.cpp's, which is a model in one file (plumbing/gguf.py).

A folder that is not a model is said to be what it is: a LoRA adapter alone (PEFT's two
files) is a change to a model, and its base model or the run's merged model is what to give.
"""
import os
import sys

from plumbing import gguf, hf_model
from plumbing.checkpoint import load_checkpoint
from plumbing.errors import UserError
from plumbing.peft_adapter import ADAPTER_FILE, CONFIG_FILE

HPARAMS_FILES = ("hparams.json", "config.json")  # where a model keeps its shape: OpenAI's name, Hugging Face's


def load_weights(folder):
    """-> (hparams, params) from OpenAI's TensorFlow checkpoint, a Hugging Face safetensors folder
    or a GGUF file (dequantized to float32)."""
    if gguf.is_gguf(folder):
        return gguf.load_gguf(folder)
    check_not_only_an_adapter(folder)
    if hf_model.is_hf_folder(folder):
        hparams, params, converted = hf_model.load_hf_folder(folder)
        if converted:
            print(f"note: {' and '.join(sorted(converted))} weights were converted once to float32", file=sys.stderr)
        return hparams, params
    return load_checkpoint(folder)


def check_not_only_an_adapter(folder):
    """A LoRA adapter alone (PEFT's two files) is a change to a model, not a model: say so, by name."""
    if any(os.path.exists(os.path.join(folder, f)) for f in (CONFIG_FILE, ADAPTER_FILE)) and \
            not any(os.path.exists(os.path.join(folder, f)) for f in HPARAMS_FILES):
        raise UserError(f"holds a LoRA adapter ({CONFIG_FILE}, {ADAPTER_FILE}) but no model: give the folder the "
                        "LoRA run wrote (its merged model beside the adapter), or the adapter's base model",
                        path=folder)


def check_tokenizer_fits(n_ids, hparams, folder):
    """A tokenizer of n_ids ids would make ids that a model of n_vocab rows has no row for."""
    if n_ids > hparams["n_vocab"]:
        raise UserError(f"its vocabulary has {n_ids:,} ids, its model {hparams['n_vocab']:,}: the tokenizer's "
                        "files and the weights come from different models", path=folder)
