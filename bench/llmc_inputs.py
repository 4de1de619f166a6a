"""Write llm.c's input files from one of our checkpoints, so that train_gpt2.c trains the same
weights that bench_train.py times (dev-only; llm.c itself is not part of this project).

    python bench/llmc_inputs.py --folder bench/out/124M-random --out /tmp/llmc

writes, under --out:
    gpt2_124M.bin                                    the weights, in llm.c's version-3 layout
    dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin   random token ids (the speed
                                                     of a step does not depend on the text)
The file formats are as llm.c's train_gpt2.c reads them: a header of 256 int32 (magic,
version, sizes), then the data. llm.c stores each matrix as PyTorch's Linear does, [out, in];
our checkpoint stores Conv1D's [in, out], so every matrix is transposed on the way.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from plumbing.checkpoint import load_checkpoint  # noqa: E402

MODEL_MAGIC, MODEL_VERSION = 20240326, 3
DATA_MAGIC, DATA_VERSION = 20240520, 1
PADDED_VOCAB = 50304  # llm.c pads the vocabulary to a multiple of 128


def header(*values):
    h = np.zeros(256, np.int32)
    h[:len(values)] = values
    return h.tobytes()


def llmc_tensors(hp, params):
    """The 16 tensors in llm.c's order: each per-layer one stacked over the layers."""
    blocks = params["blocks"]

    def stack(get):
        return np.stack([get(b) for b in blocks])

    wte = np.zeros((PADDED_VOCAB, hp["n_embd"]), np.float32)
    wte[:hp["n_vocab"]] = params["wte"]
    return [wte, params["wpe"],
            stack(lambda b: b["ln_1"]["g"]), stack(lambda b: b["ln_1"]["b"]),
            stack(lambda b: b["attn"]["c_attn"]["w"].T), stack(lambda b: b["attn"]["c_attn"]["b"]),
            stack(lambda b: b["attn"]["c_proj"]["w"].T), stack(lambda b: b["attn"]["c_proj"]["b"]),
            stack(lambda b: b["ln_2"]["g"]), stack(lambda b: b["ln_2"]["b"]),
            stack(lambda b: b["mlp"]["c_fc"]["w"].T), stack(lambda b: b["mlp"]["c_fc"]["b"]),
            stack(lambda b: b["mlp"]["c_proj"]["w"].T), stack(lambda b: b["mlp"]["c_proj"]["b"]),
            params["ln_f"]["g"], params["ln_f"]["b"]]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default=os.path.join(HERE, "out", "124M-random"))
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=300_000)
    args = p.parse_args()
    hp, params = load_checkpoint(args.folder)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpt2_124M.bin"), "wb") as f:
        f.write(header(MODEL_MAGIC, MODEL_VERSION, hp["n_ctx"], hp["n_vocab"], hp["n_layer"], hp["n_head"],
                       hp["n_embd"], PADDED_VOCAB))
        for t in llmc_tensors(hp, params):
            f.write(np.ascontiguousarray(t, np.float32).tobytes())
    data = os.path.join(args.out, "dev", "data", "tinyshakespeare")
    os.makedirs(data, exist_ok=True)
    rng = np.random.default_rng(0)
    for part, n in (("train", args.tokens), ("val", args.tokens // 10)):
        with open(os.path.join(data, f"tiny_shakespeare_{part}.bin"), "wb") as f:
            f.write(header(DATA_MAGIC, DATA_VERSION, n))
            f.write(rng.integers(0, hp["n_vocab"], n).astype(np.uint16).tobytes())


if __name__ == "__main__":
    main()
