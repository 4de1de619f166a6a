"""Loading a model by its name: a released size, a folder on disk, or hf:owner/name from the Hub.

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
import bpe
import download
from plumbing import hub, sae_files
from plumbing.weights import check_tokenizer_fits, load_weights


def model_folder(model, models_dir=None):
    """Where `model` lives (or will): a size or hf:owner/name under models_dir, or a folder's own path."""
    if model.startswith("hf:"):
        return hub.hub_folder(model[3:], models_dir)
    return download.model_folder(model, models_dir)


def fetch_model(model, models_dir=None, base_url=None, quiet=False, tries=5, backoff=0.5):
    """Make sure every file of `model` is on disk and good (downloading what is missing) -> its folder."""
    if model.startswith("hf:"):
        return hub.download_hub_model(model[3:], models_dir, quiet=quiet, tries=tries, backoff=backoff)
    return download.download_model(model, models_dir, base_url, quiet=quiet, tries=tries, backoff=backoff)


def load_model(model="124M", models_dir=None, base_url=None, quiet=False):
    """-> (encoder, hparams, params) for a size (downloaded on first use), a checkpoint folder,
    a Hugging Face folder, or hf:owner/name from the Hub."""
    folder = fetch_model(model, models_dir, base_url, quiet=quiet)
    hparams, params = load_weights(folder)
    encoder = bpe.get_encoder(folder)
    check_tokenizer_fits(encoder.n_vocab, hparams, folder)
    return encoder, hparams, params


def load_sae(name, models_dir=None, quiet=False):
    """An SAE by name: a folder as SAELens saves it, or hf:owner/name/PATH from the Hub (fetched once)."""
    if name.startswith("hf:"):
        name = hub.download_hub_sae(name[3:], models_dir, quiet=quiet)
    return sae_files.load_sae(name)
