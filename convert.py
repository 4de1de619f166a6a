"""One model, two kinds of folder: OpenAI's and Hugging Face's, both ways.

    python convert.py MODEL OUT --to hf       # MODEL: 124M ... 1558M, a folder (OpenAI's, one train.py
    python convert.py MODEL OUT --to openai   #        wrote, a LoRA run's merged model) or hf:owner/name

A GPT-2 is the same tensors wherever it is kept. A format is only a choice of names, of
layouts, and of the file that holds them. Side by side, for 124M (block 3 stands for all 12):

    here (shapes.py)    OpenAI's checkpoint                      Hugging Face's model.safetensors
    wte                 model/wte               [50257, 768]     transformer.wte.weight              [50257, 768]
    wpe                 model/wpe               [1024, 768]      transformer.wpe.weight              [1024, 768]
    h3/ln_1/g           model/h3/ln_1/g         [768]            transformer.h.3.ln_1.weight         [768]
    h3/ln_1/b           model/h3/ln_1/b         [768]            transformer.h.3.ln_1.bias           [768]
    h3/attn/c_attn/w    model/h3/attn/c_attn/w  [1, 768, 2304]   transformer.h.3.attn.c_attn.weight  [768, 2304]
    h3/attn/c_attn/b    model/h3/attn/c_attn/b  [2304]           transformer.h.3.attn.c_attn.bias    [2304]
    ...                 (attn/c_proj, ln_2, mlp/c_fc and mlp/c_proj the same way)
    ln_f/g              model/ln_f/g            [768]            transformer.ln_f.weight             [768]
    (the head is wteᵀ)  (not stored)                             (not stored: lm_head.weight is tied to wte)

- **Names.** Hugging Face's are ours in torch's words: a block is h.3, a weight or a layer
  norm's gain is .weight, an embedding's table is its .weight (plumbing/hf_model.py states
  this once, as hf_name, and reads it backwards).
- **Layouts.** OpenAI's weights were 1x1 convolutions, so each carries a leading 1:
  [1, n_in, n_out]. Hugging Face's GPT-2 keeps them [n_in, n_out] in its Conv1D, as the model
  here multiplies them (x @ w): nothing is transposed. (Most other Hugging Face models use
  nn.Linear, whose weight is [n_out, n_in]: that is why PEFT needs fan_in_fan_out for GPT-2.)
- **The head** is wte itself, so neither format stores it twice.
- **Hyperparameters.** hparams.json's n_vocab and n_ctx are config.json's vocab_size and
  n_positions. config.json can also say what OpenAI's cannot: the MLP's width (n_inner) and
  the layer norms' eps, so such a model converts to Hugging Face's format only.
- **The tokenizer** is two tables, OpenAI's encoder.json and vocab.bpe, which Hugging Face
  calls vocab.json and merges.txt; the vocabulary's own <|endoftext|> is config.json's
  bos_token_id and eos_token_id (50256 for GPT-2's, the last id of one trained from scratch).
- **The values** stay float32 both ways, so a round trip gives every tensor back bit for bit.

OUT is written whole or not at all, and must not exist. The files themselves are written by
plumbing/checkpoint.py (TensorFlow's format) and plumbing/hf_model.py (with
plumbing/safetensors_writer.py); docs/fine_tuning.md shows the folder loading in transformers.
"""
import argparse
import os
import sys

from plumbing import hf_model, loading
from plumbing.checkpoint import write_checkpoint
from plumbing.errors import UserError, exit_status, fail
from plumbing.folders import check_new_folder

FORMATS = {"hf": "Hugging Face's", "openai": "OpenAI's"}
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")  # PEFT's names for a LoRA adapter
MODEL_FILES = ("hparams.json", "config.json")  # what every model folder has, in one format or the other


def convert(model, out, to, models_dir=None, base_url=None, quiet=False):
    """Read `model` (a size, a folder or hf:owner/name) and write it to the new folder `out` in the
    format `to` ("hf" or "openai"): the same tensors and vocabulary, under the other format's names. -> out"""
    check_new_folder(out, advice="choose a new folder for OUT", empty_ok=False)
    check_not_only_an_adapter(model)
    encoder, hparams, params = loading.load_model(model, models_dir, base_url, quiet=quiet)
    folder = loading.model_folder(model, models_dir)  # where its tokenizer's files are
    if to == "hf":
        return hf_model.write_hf_folder(out, params, hparams, folder, encoder.eot)
    return write_checkpoint(out, params, hparams, vocab_dir=folder)


def check_not_only_an_adapter(model):
    """A LoRA adapter alone (PEFT's two files) is a change to a model, not a model: say so, by name."""
    if os.path.isdir(model) and any(os.path.exists(os.path.join(model, f)) for f in ADAPTER_FILES) and \
            not any(os.path.exists(os.path.join(model, f)) for f in MODEL_FILES):
        raise UserError("holds a LoRA adapter (adapter_config.json, adapter_model.safetensors) but no model: give "
                        "the folder the LoRA run wrote (its merged model beside the adapter), or the adapter's "
                        "base model", path=model)


# ----------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(prog="convert.py", allow_abbrev=False,
                                description="Write a GPT-2 as a Hugging Face folder or as OpenAI's files.",
                                epilog="transformers, TransformerLens and lm-eval load --to hf's folder; every "
                                       "command here loads either (docs/fine_tuning.md).")
    p.add_argument("model", metavar="MODEL", help="124M, 355M, 774M, 1558M, a model folder, or hf:owner/name")
    p.add_argument("out", metavar="OUT", help="the folder to write (it must not exist)")
    p.add_argument("--to", required=True, choices=list(FORMATS), help="hf: Hugging Face's format; openai: OpenAI's")
    p.add_argument("--models-dir", help="where model sizes are downloaded")
    p.add_argument("--base-url", help="a mirror of OpenAI's model files")
    p.add_argument("--quiet", action="store_true", help="no progress display while downloading")
    p.error = fail
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    return exit_status(lambda: run(args))


def run(args):
    out = convert(args.model, args.out, args.to, args.models_dir, args.base_url, args.quiet)
    print(f"wrote {out}: {args.model} in {FORMATS[args.to]} format")


if __name__ == "__main__":
    sys.exit(main())
