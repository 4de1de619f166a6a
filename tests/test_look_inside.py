"""look_inside.py: every stage of one forward pass, recorded by the model's own hooks."""
import numpy as np
import pytest

import gpt2_numpy as g
import look_inside
from checkpoint import load_checkpoint
from conftest import checkpoint_dir

BLOCK_STAGES = ["resid_pre", "ln_1", "attn.q", "attn.k", "attn.v", "attn.scores", "attn.weights", "attn.z",
                "attn.out", "resid_mid", "ln_2", "mlp.c_fc", "mlp.gelu", "mlp.out", "resid_post"]


@pytest.fixture(scope="module")
def odd():
    return load_checkpoint(checkpoint_dir("odd"))


@pytest.mark.parametrize("ids", [[[5, 6, 7, 8]], [[5, 6, 7, 8], [9, 10, 11, 12], [1, 2, 3, 4]]])
def test_trace_names_and_shapes(odd, ids):
    hp, params = odd
    B, T, C, H, V = len(ids), 4, 48, 3, 96
    stages = look_inside.trace(ids, params, hp["n_head"])
    want = ["token ids", "wte", "wpe"] + [f"h{i}.{s}" for i in range(3) for s in BLOCK_STAGES] + ["ln_f", "logits"]
    assert [name for name, _ in stages] == want
    shapes = {name: list(a.shape) for name, a in stages}
    assert shapes["token ids"] == [B, T] and shapes["wte"] == [B, T, C] and shapes["wpe"] == [T, C]
    for i in range(3):
        for stage in ("resid_pre", "ln_1", "attn.out", "resid_mid", "ln_2", "mlp.out", "resid_post"):
            assert shapes[f"h{i}.{stage}"] == [B, T, C], stage
        for stage in ("attn.q", "attn.k", "attn.v", "attn.z"):
            assert shapes[f"h{i}.{stage}"] == [B, H, T, C // H], stage
        assert shapes[f"h{i}.attn.scores"] == shapes[f"h{i}.attn.weights"] == [B, H, T, T]
        assert shapes[f"h{i}.mlp.c_fc"] == shapes[f"h{i}.mlp.gelu"] == [B, T, 4 * C]
    assert shapes["ln_f"] == [B, T, C] and shapes["logits"] == [B, T, V]


def test_trace_computes_what_the_model_computes(odd):
    hp, params = odd
    ids = [[5, 6, 7, 8, 9]]
    stages = dict(look_inside.trace(ids, params, hp["n_head"]))
    np.testing.assert_array_equal(stages["logits"], g.gpt2(ids, params, hp["n_head"]))
    # each stage is what the next one is made from
    np.testing.assert_array_equal(stages["h0.resid_pre"], stages["wte"] + stages["wpe"])
    np.testing.assert_array_equal(stages["h1.resid_pre"], stages["h0.resid_post"])
    np.testing.assert_array_equal(stages["h0.resid_mid"], stages["h0.resid_pre"] + stages["h0.attn.out"])
    np.testing.assert_array_equal(stages["h0.attn.weights"], g.softmax(stages["h0.attn.scores"]))
    np.testing.assert_allclose(stages["h0.attn.z"], g.attention(stages["h0.attn.q"], stages["h0.attn.k"],
                                                                stages["h0.attn.v"]), rtol=1e-6, atol=1e-7)


def test_trace_of_one_block(odd):
    hp, params = odd
    names = [n for n, _ in look_inside.trace([[1, 2]], params, hp["n_head"], blocks={1})]
    assert any(n.startswith("h1.") for n in names)
    assert not any(n.startswith(("h0.", "h2.")) for n in names)
