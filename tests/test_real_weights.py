"""GPT-2 124M's real answers. Opt-in: OpenAI's weights are not in the repository.

To run it, download 124M once (about 500 MB) and point the test at the models folder:

    python download.py 124M --models-dir ~/gpt2-models
    GPT2_REAL_MODELS_DIR=~/gpt2-models python -m pytest -q tests/test_real_weights.py
"""
import os

import numpy as np
import pytest

import bpe
import gpt2_numpy as g
from plumbing.checkpoint import load_checkpoint, verify_checkpoint

MODELS = os.environ.get("GPT2_REAL_MODELS_DIR", "")
FOLDER = os.path.join(os.path.expanduser(MODELS), "124M") if MODELS else ""

pytestmark = pytest.mark.skipif(
    not (FOLDER and os.path.exists(os.path.join(FOLDER, "model.ckpt.index"))),
    reason="needs OpenAI's 124M weights: run `python download.py 124M --models-dir DIR`, then set "
           "GPT2_REAL_MODELS_DIR=DIR and run `python -m pytest -q tests/test_real_weights.py`")


@pytest.fixture(scope="module")
def model():
    hparams, params = load_checkpoint(FOLDER)
    return bpe.get_encoder(FOLDER), hparams, params


def greedy(model, ids, n):
    encoder, hparams, params = model
    return np.concatenate(list(g.generate(ids, params, hparams, n, temperature=0, stop=None))).tolist()


def test_alan_turing_greedy_40_tokens(model):
    encoder = model[0]
    ids = encoder.encode("Alan Turing theorized that computers would one day become")
    assert encoder.decode(greedy(model, ids, 40)) == (
        " the most powerful machines on the planet.\n\nThe computer is a machine that can perform complex "
        "calculations, and it can perform these calculations in a way that is very similar to the human brain.\n")


def test_alan_turing_ids(model):
    encoder = model[0]
    ids = encoder.encode("Alan Turing theorized that computers would one day become very powerful, "
                         "but even he could not imagine")
    assert ids == [36235, 39141, 18765, 1143, 326, 9061, 561, 530, 1110, 1716, 845, 3665, 11, 475, 772, 339, 714,
                   407, 5967]
    assert greedy(model, ids, 20) == [703, 484, 561, 307, 1498, 284, 466, 523, 13, 198, 198, 1, 40, 892, 326, 262,
                                      749, 1593, 1517, 318]


def test_the_checkpoint_matches_its_checksums():
    assert verify_checkpoint(FOLDER) > 400_000_000
