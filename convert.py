"""One model, two kinds of folder: OpenAI's and Hugging Face's, both ways.

    python convert.py MODEL OUT --to hf       # MODEL: 124M ... 1558M, a folder (OpenAI's, one train.py
    python convert.py MODEL OUT --to openai   #        wrote, a LoRA run's merged model), hf:owner/name
    python convert.py MODEL OUT.gguf --to gguf [--gguf-type f32|f16|q8_0]   # or a GGUF file: llama.cpp's

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
- **A classifier** (classify.py) is a GPT2ForSequenceClassification in Hugging Face's format: its
  score.weight beside the body's tensors, and config.json's architectures, num_labels, id2label,
  label2id and pad_token_id; in OpenAI's, the same head beside hparams.json (classifier.json and
  score.npy: plumbing/classifier_files.py).
- **The values** stay float32 both ways, so a round trip gives every tensor back bit for bit.

OUT is written whole or not at all, and must not exist. The files themselves are written by
plumbing/checkpoint.py (TensorFlow's format) and plumbing/hf_model.py (with
plumbing/safetensors_writer.py); docs/fine_tuning.md shows the folder loading in transformers.
The command line, which fetches MODEL first, is interface/convert_cli.py.

GGUF (llama.cpp's, Ollama's) is a third format: one file, its tensors under llama.cpp's names
(token_embd, blk.3.attn_qkv, ...), c_attn, c_proj and c_fc transposed, and the tokenizer's two tables
in its metadata; --gguf-type q8_0 keeps the weights in 8 bits. plumbing/gguf_writer.py writes it as
llama.cpp's converter writes it (docs/files.md draws it), plumbing/gguf.py reads it.
"""
if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("convert_cli")  # the command line (which model, OUT, messages): this file is the formats

import os
import re

import bpe
from plumbing import classifier_files, gguf, hf_model
from plumbing.checkpoint import write_checkpoint
from plumbing.errors import UserError
from plumbing.folders import check_new_folder
from plumbing.gguf_writer import merges_from_text, write_gguf
from plumbing.weights import check_tokenizer_fits, load_weights

FORMATS = {"hf": "Hugging Face's", "openai": "OpenAI's", "gguf": "llama.cpp's GGUF"}
GGUF_TYPES = ("f32", "f16", "q8_0")


def convert(folder, out, to, gguf_type="f32"):
    """Read the model in `folder` (OpenAI's files or Hugging Face's, or a GGUF file) and write it to
    the new folder `out` in the format `to` ("hf" or "openai"), or to the new file `out` ("gguf", of
    gguf_type f32, f16 or q8_0): the same tensors and vocabulary, under the other format's names. -> out"""
    check_new_folder(out, advice=f"choose a new {'file' if to == 'gguf' else 'folder'} for OUT", empty_ok=False)
    hparams, params = load_weights(folder)
    head = classifier_files.read_head(folder, hparams["n_embd"])
    encoder = bpe.get_encoder(folder)
    check_tokenizer_fits(encoder.n_vocab, hparams, folder)
    if to == "gguf":
        if head is not None:  # llama.cpp's GPT-2 is a language model: the file would hold the body alone
            raise UserError(f"is a classifier (labels {', '.join(map(str, head['labels']))}): llama.cpp's GPT-2 GGUF "
                            "has no place for its head; convert it --to hf or --to openai", path=folder)
        tokens = sorted(encoder.encoder, key=encoder.encoder.get)  # by id
        return write_gguf(out, params, hparams, tokens, vocabulary_merges(folder), encoder.eot, gguf_type,
                          converted_name(folder))
    if to == "hf":
        return hf_model.write_hf_folder(out, params, hparams, folder, encoder.eot, head)
    extra = classifier_files.head_files(head["score"], head["labels"], head["pad_id"]) if head else None
    return write_checkpoint(out, params, hparams, vocab_dir=folder, extra=extra)


def converted_name(folder):
    """The name llama.cpp's converter gives the model of this folder (gguf-py's Metadata: the folder's own
    name, whatever OUT is called); a GGUF file's is its name less .gguf."""
    return re.sub(r"\.gguf$", "", os.path.basename(os.path.normpath(folder)), flags=re.I)


def vocabulary_merges(folder):
    """The merges as "left right" lines: a GGUF's tokenizer.ggml.merges, or vocab.bpe (merges.txt)
    as llama.cpp's converter reads merges.txt."""
    if gguf.is_gguf(folder):
        return [" ".join(pair) for pair in gguf.read_vocabulary(folder)[1]]
    name = next(n for n in ("vocab.bpe", "merges.txt") if os.path.exists(os.path.join(folder, n)))
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        return merges_from_text(f.read())
