"""parameters.py: parameter counts by part (GPT-2, GPT-3, Llama 3), by formula and from the tensors; GPT-2's
initialisation, checked by its statistics (GPT-2 paper §2.3)."""
import math

import numpy as np
import pytest

from conftest import checkpoint_dir
import parameters
from plumbing import shapes
from plumbing.checkpoint import load_checkpoint


@pytest.mark.parametrize("size, total", [("124M", 124_439_808), ("355M", 354_823_168), ("774M", 774_030_080),
                                         ("1558M", 1_557_611_200)])
def test_gpt2_totals(size, total):
    assert parameters.count_parameters(shapes.hparams(size))["total"] == total


def test_124m_parts():
    c = parameters.count_parameters(shapes.hparams("124M"))
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
    counted = {name: n for name, _, n in parameters.published_counts()}
    assert round(counted["GPT-3 175B"] / 1e9, 1) == 174.6
    assert (counted["GPT-3 175B"] - 175e9) / 175e9 == pytest.approx(-0.0023, abs=0.0001)
    assert counted["Llama 3 8B"] == 8_030_261_248


def test_every_published_gpt3_size_is_within_a_few_percent():
    for name, published, counted in parameters.published_counts():
        assert abs(counted - published) / published < 0.04, name


@pytest.mark.parametrize("name", ["tiny", "odd", "many"])
def test_the_formula_agrees_with_the_checkpoint_tensors(name):
    hp, params = load_checkpoint(checkpoint_dir(name))
    assert parameters.count_tensors(params) == parameters.count_parameters(hp)["parts"]


def test_the_embedding_share_of_a_small_model():
    """docs/exercises.md's question: nanoGPT's small CPU shape at three vocabulary sizes."""
    import parameters
    shares = {V: parameters.count_parameters({"n_vocab": V, "n_ctx": 64, "n_embd": 128, "n_head": 4,
                                              "n_layer": 4})["wte_share"] for V in (257, 4096, 50257)}
    assert round(shares[257], 3) == 0.039 and round(shares[4096], 3) == 0.395 and round(shares[50257], 3) == 0.889


@pytest.mark.parametrize("name, block", [("h3/attn/c_attn/w", 3), ("h11.attn.z", 11), ("h0", 0), ("wte", None),
                                         ("ln_f/g", None), ("ln_f", None), ("head.x", None), ("h", None)])
def test_a_blocks_index_is_read_from_a_name_in_one_place(name, block):
    assert shapes.block_index(name) == block


def test_nest_and_the_models_names_agree_on_the_block(models):
    import look_inside
    hp, params = models["odd"]
    assert shapes.nest(shapes.flatten(params), hp["n_layer"])["blocks"][2]["ln_2"]["g"] is params["blocks"][2]["ln_2"]["g"]
    assert look_inside.transformer_lens_name("h2.attn.weights") == "blocks.2.attn.hook_pattern"


HP = {"n_vocab": 1000, "n_ctx": 256, "n_embd": 128, "n_head": 4, "n_layer": 8}


def test_the_initialisation_has_gpt2s_statistics():
    params = parameters.init_params(HP, seed=0)
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
    assert parameters.residual_scale(8) == 0.25  # 1/√(2·8): the two residual writes of eight blocks


def test_the_same_seed_gives_the_same_weights():
    a, b, c = (shapes.flatten(parameters.init_params(HP, seed=s)) for s in (1, 1, 2))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["wte"], c["wte"])
