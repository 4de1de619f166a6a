"""look_inside.py: every activation by name (against Hugging Face's hidden states and attentions),
hooks that change what flows, the logit lens, the next-token table and the attention scores."""
import copy
import math
import os

import numpy as np
import pytest

from conftest import DATA, ROOT, checkpoint_dir, float32_rounding
import gpt2_numpy as g
import look_inside as li
from plumbing.checkpoint import load_checkpoint
from plumbing.errors import UserError

GOLDEN = np.load(os.path.join(DATA, "hf_golden.npz"))
CASES = {"tiny_turing": "tiny", "tiny_batch": "tiny", "odd_full_context": "odd", "odd_prompt": "odd",
         "odd_batch": "odd"}
BLOCK = ["hook_resid_pre", "ln1.hook_normalized", "attn.hook_q", "attn.hook_k", "attn.hook_v",
         "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "hook_attn_out", "hook_resid_mid",
         "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out", "hook_resid_post"]


@pytest.fixture(scope="module")
def models():
    return {name: load_checkpoint(checkpoint_dir(name)) for name in ("tiny", "odd")}


# --- 1. every activation, by name -------------------------------------------------------------

def test_the_cache_holds_transformer_lens_names_in_order_with_their_shapes(models):
    hp, params = models["odd"]
    ids = [[5, 6, 7, 8], [9, 10, 11, 12]]
    B, T, C, H = 2, 4, 48, 3
    logits, cache = li.run_with_cache(ids, params, hp)
    want = ["hook_embed", "hook_pos_embed"] + [f"blocks.{i}.{s}" for i in range(3) for s in BLOCK] + \
        ["ln_final.hook_normalized"]
    assert list(cache) == want
    assert {n: a.shape for n, a in cache.items()} == li.activation_shapes(hp, B, T)
    assert cache["blocks.0.attn.hook_q"].shape == (B, T, H, C // H)
    assert cache["blocks.2.attn.hook_pattern"].shape == (B, H, T, T)
    np.testing.assert_array_equal(logits, g.gpt2(ids, params, hp))


@pytest.mark.parametrize("case", CASES)
def test_the_residual_stream_and_patterns_match_hugging_face(models, case):
    """One forward pass end to end: hidden_states and attentions from GPT2LMHeadModel (eager)."""
    hp, params = models[CASES[case]]
    hidden, attentions = GOLDEN[f"{case}/hidden"], GOLDEN[f"{case}/attentions"]
    _, cache = li.run_with_cache(GOLDEN[f"{case}/ids"], params, hp)
    L, n = hp["n_layer"], 4 * hp["n_embd"]  # the longest sum: the MLP's c_proj
    for i in range(L):  # four linear layers a block; the embeddings' one addition is the same on both sides
        resid = cache[f"blocks.{i}.hook_resid_pre"]
        assert np.abs(resid - hidden[i]).max() <= float32_rounding(n, 4 * i, np.abs(hidden[i]).max()), i
        assert np.abs(cache[f"blocks.{i}.attn.hook_pattern"] - attentions[i]).max() <= 2e-6, i
    x = cache[f"blocks.{L - 1}.hook_resid_post"]  # ln_f scales its input's error by g / σ
    scale = np.abs(x).max() * np.abs(params["ln_f"]["g"]).max() / np.std(x, axis=-1).min()
    assert np.abs(cache["ln_final.hook_normalized"] - hidden[L]).max() <= float32_rounding(n, 4 * L, scale)


def test_each_cached_stage_is_what_the_next_is_made_from(models):
    hp, params = models["odd"]
    ids = [[5, 6, 7, 8, 9]]
    _, c = li.run_with_cache(ids, params, hp)
    np.testing.assert_array_equal(c["blocks.0.hook_resid_pre"], c["hook_embed"] + c["hook_pos_embed"])
    np.testing.assert_array_equal(c["blocks.1.hook_resid_pre"], c["blocks.0.hook_resid_post"])
    np.testing.assert_array_equal(c["blocks.0.hook_resid_mid"], c["blocks.0.hook_resid_pre"] + c["blocks.0.hook_attn_out"])
    np.testing.assert_array_equal(c["blocks.0.attn.hook_pattern"], g.softmax(c["blocks.0.attn.hook_attn_scores"]))
    q, k, v = (c[f"blocks.0.attn.hook_{n}"].swapaxes(1, 2) for n in "qkv")
    np.testing.assert_allclose(c["blocks.0.attn.hook_z"].swapaxes(1, 2), g.attention(q, k, v), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(c["blocks.0.mlp.hook_post"], g.gelu_fast(c["blocks.0.mlp.hook_pre"]))


def test_a_names_filter_keeps_only_what_is_asked(models):
    hp, params = models["odd"]
    _, cache = li.run_with_cache([[1, 2, 3]], params, hp, names=["blocks.1.attn.hook_pattern", "hook_embed"])
    assert sorted(cache) == ["blocks.1.attn.hook_pattern", "hook_embed"]
    _, cache = li.run_with_cache([[1, 2, 3]], params, hp, names=lambda n: n.endswith("hook_resid_post"))
    assert list(cache) == [f"blocks.{i}.hook_resid_post" for i in range(3)]
    with pytest.raises(li.UserError, match="^no activation is called 'blocks.9.hook_z': names look like"):
        li.run_with_cache([[1, 2, 3]], params, hp, names=["blocks.9.hook_z"])


def test_the_memory_formula_and_a_request_that_would_not_fit(models):
    hp = {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 1600, "n_head": 25, "n_layer": 48}  # 1558M
    C, H, L, T = 1600, 25, 48, 1024
    need = 4 * sum(int(np.prod(s)) for s in li.activation_shapes(hp, 1, T).values())
    assert need == 4 * T * (L * (19 * C + 2 * H * T) + 3 * C) and need > 16e9
    hp, params = models["odd"]
    with pytest.raises(li.UserError, match=r"needs 0\.0 GB, but 0\.0 GB are free"):
        li.run_with_cache([[1, 2, 3]], params, hp, memory=1000)
    li.run_with_cache([[1, 2, 3]], params, hp, names=["hook_embed"], memory=1000)  # 3 x 48 floats fit


def test_trace_is_the_cache(models):
    hp, params = models["odd"]
    stages = li.trace([[5, 6, 7]], params, hp, blocks={1})
    names = [n for n, _ in stages]
    assert names[0] == "token ids" and names[-1] == "logits" and "blocks.1.attn.hook_pattern" in names
    assert not any(n.startswith(("blocks.0.", "blocks.2.")) for n in names)


# --- 2. hooks -------------------------------------------------------------------------------

@pytest.mark.parametrize("T", [9, 32])
def test_a_hook_that_returns_its_input_changes_nothing(models, T):
    hp, params = models["odd"]
    ids = np.random.default_rng(T).integers(0, 96, (2, T))
    every = {name: (lambda x, name: x) for name in li.activation_shapes(hp, 2, T)}
    none = {name: (lambda x, name: None) for name in every}
    plain = g.gpt2(ids, params, hp)
    assert np.array_equal(li.run_with_hooks(ids, params, hp, every), plain)
    assert np.array_equal(li.run_with_hooks(ids, params, hp, none), plain)


def test_a_hook_past_one_attention_block_still_changes_nothing_beyond_rounding(models):
    """Past 128 positions the model without hooks attends a block of queries at a time, which
    sums in another order; with a hook it forms the whole pattern."""
    hp, params = models["odd"]
    long = {**params, "wpe": np.random.default_rng(2).standard_normal((200, 48)).astype(np.float32)}
    hp = {**hp, "n_ctx": 200}
    ids = np.random.default_rng(1).integers(0, 96, (1, 150))
    plain = g.gpt2(ids, long, hp)
    hooked = li.run_with_hooks(ids, long, hp, {"blocks.0.hook_resid_pre": lambda x, name: x})
    assert np.abs(hooked - plain).max() <= float32_rounding(4 * hp["n_embd"], 4 * hp["n_layer"] + 1,
                                                            np.abs(plain).max())


def test_zero_ablating_every_head_of_a_layer_removes_its_attention(models):
    hp, params = models["odd"]
    ids = [[3, 14, 15, 92, 65, 35, 89]]
    ablated = li.run_with_hooks(ids, params, hp, {"blocks.1.attn.hook_z": lambda z, name: np.zeros_like(z)})
    # independently: a model whose layer-1 c_proj weights are zero adds only c_proj's bias
    without = copy.deepcopy({"wte": params["wte"], "wpe": params["wpe"], "ln_f": params["ln_f"],
                             "blocks": [dict(b) for b in params["blocks"]]})
    without["blocks"][1]["attn"] = {"c_attn": params["blocks"][1]["attn"]["c_attn"],
                                    "c_proj": {"w": np.zeros_like(params["blocks"][1]["attn"]["c_proj"]["w"]),
                                               "b": params["blocks"][1]["attn"]["c_proj"]["b"]}}
    np.testing.assert_allclose(ablated, g.gpt2(ids, without, hp), rtol=1e-6, atol=1e-6)
    assert np.abs(ablated - g.gpt2(ids, params, hp)).max() > 1e-2


def test_ablating_one_head_changes_only_its_share_of_the_attention_output(models):
    hp, params = models["odd"]
    ids = [[3, 14, 15, 92, 65]]

    zero_head_2 = li.zero_ablate_head(2)
    _, clean = li.run_with_cache(ids, params, hp)
    seen = {}

    def record(x, name):
        seen[name] = x  # and return None: leave it as it is

    li.run_with_hooks(ids, params, hp, {"blocks.1.attn.hook_z": zero_head_2, "blocks.0.hook_resid_post": record,
                                        "blocks.1.hook_attn_out": record})
    np.testing.assert_array_equal(seen["blocks.0.hook_resid_post"], clean["blocks.0.hook_resid_post"])
    z = clean["blocks.1.attn.hook_z"].copy()  # [B, T, H, D]; independently: c_proj of what is left
    z[:, :, 2] = 0.0
    z = z.reshape(1, 5, 48)
    c_proj = params["blocks"][1]["attn"]["c_proj"]
    np.testing.assert_allclose(seen["blocks.1.hook_attn_out"], z @ c_proj["w"] + c_proj["b"], rtol=1e-5, atol=1e-6)
    assert np.abs(seen["blocks.1.hook_attn_out"] - clean["blocks.1.hook_attn_out"]).max() > 1e-3


def test_patching_layer_0s_residual_stream_gives_the_other_runs_logits(models):
    hp, params = models["odd"]
    a, b = [[1, 2, 3, 4, 5, 6]], [[7, 8, 9, 10, 11, 12]]
    logits_a, cache_a = li.run_with_cache(a, params, hp, names=["blocks.0.hook_resid_pre"])
    patched = li.run_with_hooks(b, params, hp, {"blocks.0.hook_resid_pre": lambda x, n: cache_a[n]})
    np.testing.assert_array_equal(patched, logits_a)


def test_a_steering_hook_in_generate_equals_it_in_a_full_recomputation(models):
    hp, params = models["odd"]
    steer = np.random.default_rng(4).standard_normal(48).astype(np.float32) * 3
    hooks = {"blocks.1.hook_resid_pre": lambda x, name: x + steer}
    prompt = [5, 17, 33]
    got = np.concatenate(list(g.generate(prompt, params, hp, 12, temperature=0, stop=None,
                                         hook=li.model_hook(hooks))))
    ids = list(prompt)
    for _ in range(12):  # each step from scratch: the whole sequence, the hook at every position
        ids.append(int(li.run_with_hooks([ids], params, hp, hooks)[0, -1].argmax()))
    assert got.tolist() == ids[len(prompt):]
    plain = np.concatenate(list(g.generate(prompt, params, hp, 12, temperature=0, stop=None)))
    assert plain.tolist() != got.tolist()  # the steering did change the text


def test_hooks_in_generate_see_only_the_new_positions(models):
    hp, params = models["odd"]
    shapes = []
    hook = li.model_hook({"blocks.0.attn.hook_pattern": lambda x, name: shapes.append(x.shape)})
    list(g.generate([1, 2, 3], params, hp, 3, temperature=0, stop=None, hook=hook))
    assert shapes == [(1, 3, 3, 3), (1, 3, 1, 4), (1, 3, 1, 5)]


def test_bad_hooks_are_clear_errors(models):
    hp, params = models["odd"]
    with pytest.raises(li.UserError, match="^no activation is called 'blocks.0.hook_q'"):
        li.run_with_hooks([[1, 2]], params, hp, {"blocks.0.hook_q": lambda x, n: x})
    with pytest.raises(li.UserError, match="is not a function"):
        li.run_with_hooks([[1, 2]], params, hp, {"hook_embed": 3})


def test_ablating_a_head_changes_the_loss_and_the_plain_loss_is_scores(models):
    hp, params = models["odd"]
    ids = np.random.default_rng(5).integers(0, 96, (1, 20))
    plain = li.loss(ids, params, hp)
    assert plain == pytest.approx(g.score(ids[0], params, hp)[1], abs=1e-6)
    ablated = li.loss(ids, params, hp, {"blocks.0.attn.hook_z": li.zero_ablate_head(1)})
    assert abs(ablated - plain) > 1e-3


# --- 3. the logit lens, 4. the next-token table ---------------------------------------------------

@pytest.mark.parametrize("case", ["tiny_turing", "odd_prompt", "odd_batch"])
def test_the_logit_lens_matches_hugging_faces_ln_f_and_head(models, case):
    hp, params = models[CASES[case]]
    ids = GOLDEN[f"{case}/ids"]
    lens = li.logit_lens(ids, params, hp)
    L = hp["n_layer"]
    assert lens["top"].shape == (L + 1, *ids.shape)
    np.testing.assert_array_equal(lens["top"], GOLDEN[f"{case}/lens_top"])
    assert np.abs(lens["top_prob"] - GOLDEN[f"{case}/lens_top_prob"]).max() <= 1e-5
    assert np.abs(lens["target_prob"] - GOLDEN[f"{case}/lens_target_prob"]).max() <= 1e-5


def test_the_last_layers_lens_is_the_models_prediction(models):
    hp, params = models["odd"]
    ids = [[4, 8, 15, 16, 23, 42]]
    lens = li.logit_lens(ids, params, hp)
    logits = g.gpt2(ids, params, hp)
    np.testing.assert_array_equal(lens["top"][-1], logits.argmax(-1))
    np.testing.assert_allclose(lens["top_prob"][-1], g.softmax(logits).max(-1), rtol=1e-6)
    assert np.all(lens["target_rank"][-1] == 0) and np.array_equal(lens["target"], logits.argmax(-1))
    other = li.logit_lens(ids, params, hp, target=[[7] * 6])
    assert np.all(other["target"] == 7)
    probs = g.softmax(logits)[0, :, 7]
    np.testing.assert_allclose(other["target_prob"][-1, 0], probs, rtol=1e-5)
    assert np.array_equal(other["target_rank"][-1, 0], (logits[0] > logits[0, :, 7:8]).sum(-1))


def test_the_next_token_table():
    logits = np.log(np.array([0.1, 0.5, 0.05, 0.35], np.float32))
    ids, probs, logprobs = li.next_token_table(logits, 3)
    assert ids.tolist() == [1, 3, 0]
    np.testing.assert_allclose(probs, [0.5, 0.35, 0.1], rtol=1e-6)
    np.testing.assert_allclose(logprobs, np.log([0.5, 0.35, 0.1]), rtol=1e-6)


# --- reading the patterns ---------------------------------------------------------------------

def test_previous_token_scores_on_patterns_built_by_hand():
    T = 6
    previous = np.eye(T, k=-1)
    previous[0, 0] = 1  # the first position has nobody before it
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    pattern = np.stack([previous, uniform])  # [H=2, T, T]
    scores = li.previous_token_scores(pattern)
    np.testing.assert_allclose(scores, [1.0, np.mean([1 / t for t in range(2, T + 1)])])


def test_induction_scores_on_patterns_built_by_hand():
    tokens = [10, 11, 12, 10, 11, 12]  # a repeated sequence: positions 3, 4, 5 have occurred before
    assert li.induction_targets(tokens).tolist() == [-1, -1, -1, 1, 2, 3]
    T = len(tokens)
    induction = np.zeros((T, T))
    for t, j in enumerate(li.induction_targets(tokens)):
        induction[t, j if j >= 0 else 0] = 1
    previous = np.eye(T, k=-1)
    previous[0, 0] = 1
    scores = li.induction_scores(np.stack([induction, previous]), tokens)
    np.testing.assert_allclose(scores, [1.0, 0.0])
    assert np.isnan(li.induction_scores(np.stack([previous]), [1, 2, 3])).all()  # nothing repeats


def test_induction_and_previous_token_scores_on_the_models_cache(models):
    hp, params = models["odd"]
    rng = np.random.default_rng(0)
    half = rng.permutation(96)[:10]  # ten different tokens, then the same ten again
    tokens = np.concatenate([half, half])
    _, cache = li.run_with_cache([tokens], params, hp, names=lambda n: n.endswith("hook_pattern"))
    patterns = np.stack([cache[f"blocks.{i}.attn.hook_pattern"][0] for i in range(3)])  # [L, H, T, T]
    prev, ind = li.previous_token_scores(patterns), li.induction_scores(patterns, tokens)
    assert prev.shape == ind.shape == (3, 3)
    assert np.all((prev >= 0) & (prev <= 1)) and np.all((ind >= 0) & (ind <= 1))
    assert li.induction_targets(tokens).tolist() == [-1] * 10 + list(range(1, 11))  # position s looks at s - 9
    assert math.isclose(float(ind[2, 1]), float(np.mean([patterns[2, 1, s, s - 9] for s in range(10, 20)])),
                        rel_tol=1e-5)


def test_the_memory_refusal_is_one_helper_that_train_and_the_cache_share():
    from plumbing import memory
    with pytest.raises(li.UserError, match=r"^caching it needs 2\.0 GB, but 1\.0 GB are free: keep less$"):
        memory.check_fits(2e9, 1e9, "caching it", "keep less")
    memory.check_fits(2e9, None, "caching it", "keep less")  # the OS would not say: go on
    memory.check_fits(1e9, 1e9, "caching it", "keep less")
    assert li.check_fits is memory.check_fits and li.available_memory is memory.available_memory
    assert "import look_inside" not in open(os.path.join(ROOT, "train.py"), encoding="utf-8").read()


def test_a_hook_point_in_a_block_the_model_lacks_says_how_many_blocks_it_has(models):
    """blocks.9.hook_resid_pre on a 2-block model (an SAE trained on a deeper one, a typo): the count, not only
    what names look like."""
    hp, params = models["tiny"]
    with pytest.raises(UserError, match=rf"'blocks.9.hook_resid_pre': the model has {hp['n_layer']} blocks, blocks.0 "
                                        rf"to blocks.{hp['n_layer'] - 1}$"):
        li.run_with_cache([[1, 2]], params, hp, names=["blocks.9.hook_resid_pre"])
    with pytest.raises(UserError, match="names look like"):
        li.run_with_cache([[1, 2]], params, hp, names=["blocks.0.hook_nothing"])
