"""Write tests/data/circuits_model/: a small GPT-2 trained from nothing by train.py, for the circuits tests.

    python tests/data/make_circuits_model.py        # about 2 minutes of CPU; needs only the project's venv

It is the README's from-scratch recipe at a size the tests can afford: bytes alone for its vocabulary
(257 ids), 3 blocks of 4 heads, 32 wide, 32 positions, 1,500 steps on data/tinyshakespeare.txt.
Random weights (tests/data/hf) hold the definitions; this one holds them on weights that have learned
something, so its attention patterns and its answers look like a real model's. The folder keeps what
train.py wrote, but the optimizer's state (train_state.npz, twice the model's size): the checkpoint,
hparams.json, the vocabulary and train_config.json, which records the run's flags.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "circuits_model")
RECIPE = ["--from-scratch", "--vocab-size", "257", "--n-layer", "3", "--n-head", "4", "--n-embd", "32",
          "--context", "32", "--batch-size", "16", "--steps", "1500", "--lr", "3e-3", "--warmup", "100",
          "--beta2", "0.99", "--eval-every", "500", "--sample-every", "100000", "--quiet"]


def main():
    with tempfile.TemporaryDirectory() as scratch:
        run = os.path.join(scratch, "run")
        subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *RECIPE, "--out", run], check=True)
        shutil.rmtree(OUT, ignore_errors=True)
        os.makedirs(OUT)
        for name in sorted(os.listdir(run)):
            if name != "train_state.npz":
                shutil.copy(os.path.join(run, name), OUT)
    print(OUT, sorted(os.listdir(OUT)))


if __name__ == "__main__":
    main()
