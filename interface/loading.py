"""Loading a model by its name: a released size, a folder on disk, hf:owner/name from the Hub, or a
GGUF file (FILE.gguf, memory-mapped, its weights dequantized to float32: plumbing/gguf.py).

    import gpt2_numpy as g
    from interface.loading import load_model
    encoder, hparams, params = load_model("124M")
    ids = encoder.encode("Alan Turing theorized that")
    tokens = [int(t[0]) for t in g.generate(ids, params, hparams, n_tokens=20, seed=0)]

gpt2_numpy.py is the model and needs only NumPy; everything that finds, downloads and reads
files is here and below: download.py (OpenAI's files over HTTP), plumbing/hub.py (the Hugging
Face Hub), plumbing/weights.py (the weights, in TensorFlow's format or Hugging Face's), bpe.py
(the tokenizer's files).
"""
import os

import bpe
import download
from plumbing import classifier_files, gguf, hub, sae_files
from plumbing.errors import UserError
from plumbing.weights import check_tokenizer_fits, load_weights


def model_folder(model, models_dir=None):
    """Where `model` lives (or will): a size or hf:owner/name under models_dir, or a folder's own path
    (a GGUF file's own path: it is a model in one file)."""
    if gguf.is_gguf(model):
        return model
    if model.startswith("hf:"):
        return hub.hub_folder(model[3:], models_dir)
    return download.model_folder(model, models_dir)


def fetch_model(model, models_dir=None, base_url=None, quiet=False, tries=5, backoff=0.5):
    """Make sure every file of `model` is on disk and good (downloading what is missing) -> its folder
    (a GGUF file: the file, checked as it is read)."""
    if gguf.is_gguf(model):
        if not os.path.isfile(model):
            raise UserError("no such GGUF file" if not os.path.exists(model) else "is not a file", path=model)
        return model
    if model.startswith("hf:"):
        return hub.download_hub_model(model[3:], models_dir, quiet=quiet, tries=tries, backoff=backoff)
    return download.download_model(model, models_dir, base_url, quiet=quiet, tries=tries, backoff=backoff)


# What a classifier's folder is good for, decided here for every command. Its body is a GPT-2 whose
# activations are as real as any's, but its output is a label: its tied wte-transpose "next token"
# was never trained for the task and is not what the folder's model computes. So a command whose
# answer is the next token's distribution (generation, scores, perplexity, the logit lens, logit
# differences, a draft, DPO's log-probabilities, an SAE's CE loss) refuses it (load_model,
# language_model_folder), and the readings of activations alone take it (load_body).

def not_a_language_model(model, head, flag=None):
    """The one line a classifier gets where a language model is due (flag: the flag that asked for one)."""
    why = f", so --{flag.replace('_', '-')} does not apply" if flag else ""
    return UserError(f"{model} is a classifier (labels {', '.join(map(str, head['labels']))}): its output is a label, "
                     f"not the next token{why}; use "
                     f"evaluate.py classify FILE --model {model} (or gpt2_numpy.py --model {model} \"TEXT\" for one "
                     "text's label)")


def load_model(model="124M", models_dir=None, base_url=None, quiet=False):
    """-> (encoder, hparams, params) of a language model: a size (downloaded on first use), a checkpoint
    folder, a Hugging Face folder, hf:owner/name from the Hub, or a GGUF file (FILE.gguf: llama.cpp's).
    A classifier's folder is a UserError (not_a_language_model)."""
    encoder, hparams, params, head = load_model_or_classifier(model, models_dir, base_url, quiet)
    if head is not None:
        raise not_a_language_model(model, head)
    return encoder, hparams, params


def load_body(model, models_dir=None, base_url=None, quiet=False):
    """-> (encoder, hparams, params) of any GPT-2, a classifier's body too (its head left out): for the
    commands that read activations alone."""
    encoder, hparams, params, _ = load_model_or_classifier(model, models_dir, base_url, quiet)
    return encoder, hparams, {k: v for k, v in params.items() if k != "score"}


def language_model_folder(model, models_dir=None, base_url=None, quiet=False):
    """fetch_model's folder, for a command that reads it itself as a language model (train.py's
    --reference); a classifier's is not_a_language_model."""
    folder = fetch_model(model, models_dir, base_url, quiet=quiet)
    hparams, _ = load_weights(folder)
    head = classifier_files.read_head(folder, hparams["n_embd"])
    if head is not None:
        raise not_a_language_model(model, head)
    return folder


def load_model_or_classifier(model, models_dir=None, base_url=None, quiet=False):
    """-> (encoder, hparams, params, head): load_model's, and a classifier's head ({"labels", "pad_id",
    "score"}; params then holds its "score" too), or None for a language model."""
    folder = fetch_model(model, models_dir, base_url, quiet=quiet)
    hparams, params = load_weights(folder)
    head = classifier_files.read_head(folder, hparams["n_embd"])
    encoder = bpe.get_encoder(folder)
    check_tokenizer_fits(encoder.n_vocab, hparams, folder)
    return encoder, hparams, params | ({"score": head["score"]} if head else {}), head


def load_classifier(model, models_dir=None, base_url=None, quiet=False):
    """load_model_or_classifier's, for a classifier's folder (train.py on labelled texts, or a
    GPT2ForSequenceClassification); a language model is a UserError."""
    encoder, hparams, params, head = load_model_or_classifier(model, models_dir, base_url, quiet)
    if head is None:
        raise UserError("holds a language model, not a classifier: it has no head (classifier.json and score.npy, "
                        "or a GPT2ForSequenceClassification's config); train one with train.py --data "
                        "labelled.jsonl", path=model_folder(model, models_dir))
    return encoder, hparams, params, head


def load_sae(name, models_dir=None, quiet=False):
    """An SAE by name: a folder as SAELens saves it, or hf:owner/name/PATH from the Hub (fetched once)."""
    if name.startswith("hf:"):
        name = hub.download_hub_sae(name[3:], models_dir, quiet=quiet)
    return sae_files.load_sae(name)
