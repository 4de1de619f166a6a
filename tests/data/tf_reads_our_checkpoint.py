"""Dev-only: real TensorFlow reads a checkpoint that checkpoint.write_checkpoint wrote, bit for bit.

    pip install tensorflow-cpu && python tests/data/tf_reads_our_checkpoint.py

It writes the odd test model with changed values (so nothing is a copy of TensorFlow's own
files), loads it with tf.train.load_checkpoint, and compares every tensor. The tests hold our
index to TensorFlow's own byte for byte (test_checkpoint.py); this checks the other direction.
"""
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from plumbing import checkpoint  # noqa: E402
from plumbing import shapes  # noqa: E402


def main():
    hp, params = checkpoint.load_checkpoint(os.path.join(HERE, "odd"))
    rng = np.random.default_rng(7)
    flat = {k: (a + rng.standard_normal(a.shape)).astype(np.float32) for k, a in shapes.flatten(params).items()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = checkpoint.write_checkpoint(os.path.join(tmp, "ours"), shapes.nest(flat, hp["n_layer"]), hp)
        reader = tf.train.load_checkpoint(os.path.join(folder, "model.ckpt"))
        names = reader.get_variable_to_shape_map()
        assert sorted(names) == sorted(f"model/{k}" for k in flat), "different tensor names"
        for k, a in flat.items():
            got = reader.get_tensor(f"model/{k}")
            want = a[None] if k.endswith("/w") else a
            assert got.dtype == np.float32 and got.shape == want.shape and np.array_equal(got, want), k
    print(f"TensorFlow {tf.__version__} read all {len(flat)} tensors of our checkpoint, bit for bit")


if __name__ == "__main__":
    main()
