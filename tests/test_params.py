"""Parameter counts by part (GPT-2, GPT-3, Llama 3) and the shapes of one traced forward pass."""
import numpy as np
import pytest

import download
import gpt2_numpy as g
from conftest import checkpoint_dir


@pytest.mark.parametrize("size, total", [("124M", 124_439_808), ("355M", 354_823_168), ("774M", 774_030_080),
                                         ("1558M", 1_557_611_200)])
def test_gpt2_totals(size, total):
    assert g.count_parameters(g.gpt2_hparams(size))["total"] == total


def test_124m_parts():
    c = g.count_parameters(g.gpt2_hparams("124M"))
    d = 768
    assert c["parts"]["wte (token embedding)"] == 50257 * 768 == 38_597_376
    assert c["parts"]["wpe (position embedding)"] == 1024 * 768
    assert c["parts"]["head"] == 0  # tied to wte
    assert c["attention"] == {"c_attn.w": 3 * d * d, "c_attn.b": 3 * d, "c_proj.w": d * d, "c_proj.b": d}
    assert c["mlp"] == {"c_fc.w": 4 * d * d, "c_fc.b": 4 * d, "c_proj.w": 4 * d * d, "c_proj.b": d}
    assert c["block"]["layer norms"] == 4 * d
    assert c["parts"]["ln_f"] == 2 * d
    assert round(c["wte_share"], 3) == 0.310  # 38.6M of 124.4M
    assert c["non_embedding"] == c["total"] - 50257 * d - 1024 * d
    assert c["approx_12Ld2"] == 12 * 12 * d * d
    assert abs(c["approx_error"]) < 0.002


def test_gpt3_175b_and_llama3_8b():
    counted = {name: n for name, _, n in g.published_counts()}
    assert round(counted["GPT-3 175B"] / 1e9, 1) == 174.6
    assert (counted["GPT-3 175B"] - 175e9) / 175e9 == pytest.approx(-0.0023, abs=0.0001)
    assert counted["Llama 3 8B"] == 8_030_261_248


def test_every_published_gpt3_size_is_within_a_few_percent():
    for name, published, counted in g.published_counts():
        assert abs(counted - published) / published < 0.04, name


@pytest.mark.parametrize("name", ["tiny", "odd", "many"])
def test_the_formula_agrees_with_the_checkpoint_tensors(name):
    hp, params = download.load_checkpoint(checkpoint_dir(name))
    assert g.count_tensors(params) == g.count_parameters(hp)["parts"]


def trace_shapes(stages):
    return {name: list(a.shape) for name, a in stages}


@pytest.mark.parametrize("ids", [[[5, 6, 7, 8]], [[5, 6, 7, 8], [9, 10, 11, 12], [1, 2, 3, 4]]])
def test_trace_shapes(ids):
    hp, params = download.load_checkpoint(checkpoint_dir("odd"))
    B, T, C, H, V = len(ids), 4, 48, 3, 96
    shapes = trace_shapes(g.trace(ids, params, hp["n_head"]))
    assert shapes["token ids"] == [B, T]
    assert shapes["wte[ids]"] == shapes["+ wpe"] == [B, T, C]
    for i in range(3):
        assert shapes[f"h{i}.ln_1"] == [B, T, C]
        assert shapes[f"h{i}.attn.q"] == shapes[f"h{i}.attn.k"] == shapes[f"h{i}.attn.v"] == [B, H, T, C // H]
        assert shapes[f"h{i}.attn.weights"] == [B, H, T, T]
        assert shapes[f"h{i}.attn.c_proj"] == shapes[f"h{i}.+ attn"] == shapes[f"h{i}.ln_2"] == [B, T, C]
        assert shapes[f"h{i}.mlp.c_fc"] == shapes[f"h{i}.mlp.gelu"] == [B, T, 4 * C]
        assert shapes[f"h{i}.mlp.c_proj"] == shapes[f"h{i}.+ mlp"] == [B, T, C]
    assert shapes["ln_f"] == [B, T, C]
    assert shapes["logits = x @ wteᵀ"] == [B, T, V]
    assert list(shapes)[0] == "token ids" and list(shapes)[-1] == "logits = x @ wteᵀ"


def test_trace_computes_what_the_model_computes():
    hp, params = download.load_checkpoint(checkpoint_dir("odd"))
    ids = [[5, 6, 7, 8, 9]]
    np.testing.assert_array_equal(g.trace(ids, params, hp["n_head"])[-1][1], g.gpt2(ids, params, hp["n_head"]))


def test_trace_of_one_block():
    hp, params = download.load_checkpoint(checkpoint_dir("odd"))
    names = [n for n, _ in g.trace([[1, 2]], params, hp["n_head"], blocks={1})]
    assert any(n.startswith("h1.") for n in names)
    assert not any(n.startswith(("h0.", "h2.")) for n in names)
