"""Write a GPT-2 checkpoint with random weights in a real size's shape, with real TensorFlow.

Same names, shapes and file layout as OpenAI's checkpoints, plus the real vocabulary, so the
benchmarks time exactly what a real model would cost. Dev-only: `pip install tensorflow-cpu`.

    python bench/make_random_checkpoint.py 124M      # -> bench/out/124M-random/ (about 500 MB)
    python bench/make_random_checkpoint.py 1558M     # -> bench/out/1558M-random/ (about 6.2 GB)
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from plumbing import shapes  # noqa: E402
from plumbing.checkpoint import stored_shapes  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("size", choices=["124M", "355M", "774M", "1558M"])
    p.add_argument("--out", help="folder to write (default bench/out/<size>-random)")
    args = p.parse_args()
    out = args.out or os.path.join(HERE, "out", f"{args.size}-random")
    hp = shapes.hparams(args.size)
    tensor_shapes = stored_shapes(hp)
    rng = np.random.default_rng(0)
    os.makedirs(out, exist_ok=True)
    tf.compat.v1.disable_eager_execution()
    graph = tf.Graph()
    with graph.as_default():
        variables = {n: tf.compat.v1.get_variable(n, s, tf.float32, tf.compat.v1.zeros_initializer())
                     for n, s in tensor_shapes.items()}
        value = tf.compat.v1.placeholder(tf.float32)
        saver = tf.compat.v1.train.Saver(list(variables.values()))
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for name, var in variables.items():
                shape = tensor_shapes[name]
                if name.endswith("/g"):
                    array = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
                else:
                    std = 0.1 if name.endswith("/wte") else 0.02
                    array = std * rng.standard_normal(shape, dtype=np.float32)
                sess.run(var.assign(value), {value: array})
            saver.save(sess, os.path.join(out, "model.ckpt"), write_meta_graph=False)
    with open(os.path.join(out, "hparams.json"), "w") as f:
        json.dump(hp, f)
    with open(os.path.join(out, "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "model.ckpt"\n')
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(os.path.join(ROOT, "data", "gpt2-vocab", name), out)
    print(out)


if __name__ == "__main__":
    main()
