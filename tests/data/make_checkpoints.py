"""Write the tiny GPT-2-shaped checkpoints the tests read, with real TensorFlow.

Dev-only: needs `pip install tensorflow-cpu numpy` (tested with 2.21). The tests
themselves never import TensorFlow. Run from anywhere:

    python tests/data/make_checkpoints.py

For each model it writes tests/data/<name>/ with hparams.json, checkpoint,
model.ckpt.index and model.ckpt.data-00000-of-00001 (no .meta: nothing reads it),
plus tests/data/<name>_expected.npz holding every variable exactly as it was
given to TensorFlow: `names` (checkpoint names, sorted), `shapes` and `offsets`
into `values`, all the variables' float32 values flattened one after another
(one array rather than thousands keeps the file small).
"""
import json
import os
import shutil

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))

MODELS = {
    # Real vocabulary size, so the real encoder.json/vocab.bpe drive it end to end.
    "tiny": dict(n_vocab=50257, n_ctx=64, n_embd=8, n_head=2, n_layer=2, seed=1),
    # An odd head count and a small vocabulary: exactness against Hugging Face.
    "odd": dict(n_vocab=96, n_ctx=32, n_embd=48, n_head=3, n_layer=3, seed=2),
    # Thousands of small variables, so model.ckpt.index needs several data blocks.
    # (TensorFlow's table blocks hold 256 KiB; 800 layers make about 9,600 entries.)
    "many": dict(n_vocab=16, n_ctx=8, n_embd=2, n_head=1, n_layer=800, seed=3),
}


def gpt2_variables(hp, rng):
    """OpenAI's variable names and shapes, with random values everywhere.

    Biases and LayerNorm gains/biases are random too: zeros and ones would hide
    a forgotten bias or a swapped gain."""
    V, T, d = hp["n_vocab"], hp["n_ctx"], hp["n_embd"]

    def normal(*shape, std=0.2):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def gain(*shape):
        return (1.0 + rng.standard_normal(shape) * 0.1).astype(np.float32)

    v = {"model/wte": normal(V, d, std=0.5), "model/wpe": normal(T, d, std=0.1)}
    for i in range(hp["n_layer"]):
        p = f"model/h{i}/"
        v[p + "ln_1/g"], v[p + "ln_1/b"] = gain(d), normal(d, std=0.1)
        v[p + "attn/c_attn/w"], v[p + "attn/c_attn/b"] = normal(1, d, 3 * d), normal(3 * d)
        v[p + "attn/c_proj/w"], v[p + "attn/c_proj/b"] = normal(1, d, d), normal(d)
        v[p + "ln_2/g"], v[p + "ln_2/b"] = gain(d), normal(d, std=0.1)
        v[p + "mlp/c_fc/w"], v[p + "mlp/c_fc/b"] = normal(1, d, 4 * d), normal(4 * d)
        v[p + "mlp/c_proj/w"], v[p + "mlp/c_proj/b"] = normal(1, 4 * d, d), normal(d)
    v["model/ln_f/g"], v["model/ln_f/b"] = gain(d), normal(d, std=0.1)
    return v


def write_checkpoint(folder, hp, values):
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    graph = tf.Graph()
    with graph.as_default():
        tf_vars = [tf.compat.v1.Variable(value, name=name) for name, value in values.items()]
        saver = tf.compat.v1.train.Saver(tf_vars)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, os.path.join(folder, "model.ckpt"), write_meta_graph=False)
    with open(os.path.join(folder, "hparams.json"), "w") as f:
        json.dump({k: hp[k] for k in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")}, f, indent=2)
    # Saver writes an absolute path; OpenAI's file names the checkpoint relatively.
    with open(os.path.join(folder, "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "model.ckpt"\nall_model_checkpoint_paths: "model.ckpt"\n')


def save_expected(path, values):
    names = sorted(values)
    sizes = [values[n].size for n in names]
    shapes = np.zeros((len(names), 3), np.int64)  # padded with -1 past each tensor's rank
    shapes[:] = -1
    for i, n in enumerate(names):
        shapes[i, :values[n].ndim] = values[n].shape
    np.savez(path, names=np.array(names, dtype="S"), shapes=shapes,
             offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
             values=np.concatenate([values[n].ravel() for n in names]))


def main():
    tf.compat.v1.disable_eager_execution()
    for name, hp in MODELS.items():
        values = gpt2_variables(hp, np.random.default_rng(hp["seed"]))
        write_checkpoint(os.path.join(HERE, name), hp, values)
        save_expected(os.path.join(HERE, f"{name}_expected.npz"), values)
        print(name, len(values), "variables")


if __name__ == "__main__":
    main()
