"""Write tests/data/safetensors_golden.safetensors: a small file written by the real safetensors
library, which plumbing/safetensors_writer.py must reproduce byte for byte
(tests/test_safetensors_writer.py).

The tensors and metadata come from golden_tensors() and METADATA below (NumPy alone, so the test
imports them); they cover every dtype the writer writes, a scalar, an empty tensor, a
big-endian and a non-contiguous array, names out of order and outside ASCII, and metadata that
JSON must escape. Dev-only: `pip install safetensors` (last: safetensors 0.8.0). Run:

    /work/devvenv/bin/python tests/data/make_safetensors_golden.py
"""
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "safetensors_golden.safetensors")
# One entry: the library keeps metadata in a hash map, so the order of several is not fixed.
METADATA = {"note\t✓": 'quote " backslash \\ tab \t newline \n bell \x07 é ✓ \u2028'}


def golden_tensors():
    """{name: array}, the same on every run."""
    rng = np.random.default_rng(25)
    return {
        "transformer.h.0.attn.c_attn.weight": rng.standard_normal((4, 12)).astype(np.float32),
        "transformer.h.0.attn.c_attn.bias": rng.standard_normal(12).astype(np.float32),
        "a.first.by.name": rng.standard_normal((3, 2)).astype(np.float16),
        "big.endian": rng.standard_normal((2, 3)).astype(">f4"),
        "transposed": rng.standard_normal((3, 5)).astype(np.float32).T,
        "scalar": np.array(np.pi, np.float32),
        "empty": np.zeros((0, 7), np.float32),
        "double": rng.standard_normal(3),
        "ids": np.arange(-3, 4, dtype=np.int64),
        "ints32": np.arange(5, dtype=np.int32) * 1000003,
        "bytes": np.arange(250, 256, dtype=np.uint8),
        "mask": np.array([True, False, True]),
        "wte.é✓": rng.standard_normal(5).astype(np.float32),
    }


def main():
    import safetensors
    import safetensors.numpy
    tensors = {k: v.astype(v.dtype.newbyteorder("<"), order="C") for k, v in golden_tensors().items()}
    safetensors.numpy.save_file(tensors, GOLDEN, metadata=METADATA)
    print(f"wrote {GOLDEN} ({os.path.getsize(GOLDEN)} bytes) with safetensors {safetensors.__version__}")


if __name__ == "__main__":
    main()
