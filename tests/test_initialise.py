"""initialise.py: GPT-2's initialisation, checked by its statistics (GPT-2 paper §2.3)."""
import math

import numpy as np

import initialise
from plumbing import shapes

HP = {"n_vocab": 1000, "n_ctx": 256, "n_embd": 128, "n_head": 4, "n_layer": 8}


def test_the_initialisation_has_gpt2s_statistics():
    params = initialise.init_params(HP, seed=0)
    flat = shapes.flatten(params)
    assert set(flat) == set(shapes.tensor_shapes(HP))
    for name, a in flat.items():
        assert a.dtype == np.float32 and a.shape == shapes.tensor_shapes(HP)[name], name
        if name.endswith("/b"):
            assert not a.any(), f"{name}: biases start at 0"
        elif name.endswith("/g"):
            assert np.all(a == 1), f"{name}: layer norm gains start at 1"
        else:
            want = 0.02 / math.sqrt(2 * HP["n_layer"]) if name.endswith("c_proj/w") else 0.02
            assert abs(float(a.std()) - want) < 0.03 * want, f"{name}: std {a.std():.5f}, not {want:.5f}"
            assert abs(float(a.mean())) < 0.05 * want, f"{name}: mean {a.mean():.2g}"
    assert initialise.residual_scale(8) == 0.25  # 1/√(2·8): the two residual writes of eight blocks


def test_the_same_seed_gives_the_same_weights():
    a, b, c = (shapes.flatten(initialise.init_params(HP, seed=s)) for s in (1, 1, 2))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["wte"], c["wte"])
