"""Run one of the project's scripts with the tiny test checkpoint standing in for 124M.

The test mirror serves tests/data/tiny under the name 124M (the real one is 500 MB). The
downloader checks that a released size's files hold exactly that size's hyperparameters
and parameter count, so here 124M's facts (shapes.SIZES) are the tiny model's:

    python tests/tiny_as_124m.py gpt2_numpy.py "prompt" --models-dir ... --base-url ...
"""
import json
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from plumbing import shapes  # noqa: E402


def pretend():
    with open(os.path.join(HERE, "data", "tiny", "hparams.json"), encoding="utf-8") as f:
        shapes.SIZES["124M"] = json.load(f)


if __name__ == "__main__":
    pretend()
    script = os.path.join(ROOT, sys.argv[1])
    sys.argv = [script] + sys.argv[2:]
    runpy.run_path(script, run_name="__main__")
