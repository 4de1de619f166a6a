"""bench/: on a fresh clone, where bench/out/ is not yet there, each bench makes the folder it writes into."""
import os
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench_from_scratch  # noqa: E402 (bench/ is not a package: its scripts import each other by name)
import bench_speculative  # noqa: E402
from plumbing import shapes  # noqa: E402
from plumbing.checkpoint import load_checkpoint  # noqa: E402

TINY = {"n_vocab": 50257, "n_ctx": 8, "n_embd": 8, "n_head": 2, "n_layer": 1}  # random:SIZE's shape, but small


def test_a_random_model_is_written_into_a_bench_out_not_yet_made(tmp_path, monkeypatch):
    """bench_circuits.py's (and bench_speculative.py's) random:124M on a fresh clone."""
    monkeypatch.setattr(bench_speculative, "HERE", str(tmp_path / "bench"))
    monkeypatch.setattr(shapes, "hparams", lambda size: dict(TINY))
    folder = bench_speculative.model_folder("random:124M")
    assert folder == str(tmp_path / "bench" / "out" / "124M-random-init")
    assert load_checkpoint(folder)[0] == TINY


def test_a_trained_model_is_kept_in_a_bench_out_not_yet_made(tmp_path, monkeypatch):
    from initialise import init_params

    monkeypatch.setattr(bench_from_scratch, "HERE", str(tmp_path / "bench"))
    hp = dict(TINY, n_vocab=257)
    bench_from_scratch.keep("scratch-257", init_params(hp), hp, [], "held out")
    out = tmp_path / "bench" / "out"
    assert sorted(os.listdir(out)) == ["scratch-257", "shakespeare-heldout.txt"]
