"""dpo.py against TRL 1.16.0 (tests/data/make_dpo_golden.py): a pair's tokens and the collator's batch,
the loss, every metric and every gradient for both loss types, with the starting model, another
--reference model, and LoRA (whose reference is the base); sigmoid_norm is Raschka's per-token average."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dpo
import train
from conftest import DATA, ROOT, float32_rounding
from plumbing import shapes
from plumbing.checkpoint import write_checkpoint
from plumbing.errors import UserError

with open(os.path.join(DATA, "dpo_golden.json"), encoding="utf-8") as f:
    GOLDEN = json.load(f)
NUMBERS = np.load(os.path.join(DATA, "dpo_golden.npz"))
PAIRS = [tuple(p[k] for k in dpo.FIELDS) for p in GOLDEN["pairs"]]
BETA, CONTEXT = GOLDEN["beta"], GOLDEN["max_length"]
OURS = {"transformer.ln_f.weight": ("ln_f", "g"), "transformer.wpe.weight": ("wpe",),
        "transformer.h.1.mlp.c_fc.weight": ("blocks", 1, "mlp", "c_fc", "w")}


def reference_params(params):
    """The golden's --reference model: tiny with REFERENCE_SCALES' tensors scaled (new arrays, the rest shared)."""
    ref = train.writable_copy(params)
    for theirs, scale in GOLDEN["reference_scales"].items():
        *path, last = OURS[theirs]
        node = ref
        for key in path:
            node = node[key]
        node[last] = node[last] * np.float32(scale)
    return ref


def lora_params(params):
    """tiny with the golden's adapters (PEFT's A, and B seeded) in their layers, scale alpha / r."""
    adapters = {"blocks": [{} for _ in params["blocks"]]}
    for name in NUMBERS.files:
        if name.startswith("lora/lora/"):
            _, _, block, part, layer, _, matrix = name.split("/")
            slot = adapters["blocks"][int(block[1:])].setdefault(part, {}).setdefault(layer, {"lora": {}})
            slot["lora"][matrix] = NUMBERS[name]
    scale = GOLDEN["lora"]["lora_alpha"] / GOLDEN["lora"]["r"]
    return train.with_adapters(params, adapters, scale)


@pytest.fixture(scope="module")
def tiny(models):
    return models["tiny"]


@pytest.fixture(scope="module")
def batch(encoder):
    kept, dropped = dpo.tokenized_pairs(encoder, PAIRS, CONTEXT)
    return dpo.pair_batch(kept, CONTEXT, encoder.eot)


# --- a pair's tokens, and a batch of pairs ------------------------------------------------------

def test_a_pairs_tokens_are_trls(encoder):
    """<|endoftext|> ended each completion (not twice), the three texts encoded whole, the common prefix
    is the prompt; the pair whose prompt fills the context is dropped, and counted."""
    kept, dropped = dpo.tokenized_pairs(encoder, PAIRS, CONTEXT)
    assert dropped == GOLDEN["dropped"] == 1
    assert [list(map(list, ids)) for ids in kept] == [[k["prompt_ids"], k["chosen_ids"], k["rejected_ids"]]
                                                      for k in GOLDEN["kept"]]


def test_a_prompt_that_ends_in_a_space_gives_the_space_to_the_completion(encoder):
    """"is " + "Paris." encodes as "is" + " Paris.": the prompt's last token, " ", is not a prefix of the whole."""
    prompt, chosen, rejected = dpo.pair_ids(encoder, "The capital of France is ", "Paris.", "London.")
    assert encoder.decode(prompt) == "The capital of France is"
    assert encoder.decode(chosen) == " Paris.<|endoftext|>" and encoder.decode(rejected) == " London.<|endoftext|>"
    assert chosen[-1] == rejected[-1] == encoder.eot


def test_the_batch_is_trls_collators(batch):
    """The chosen rows, then the rejected, each kept to its first 64 tokens, right-padded with <|endoftext|>."""
    ids, mask = batch
    assert ids.tolist() == GOLDEN["collated"]["input_ids"]
    assert mask.tolist() == GOLDEN["collated"]["completion_mask"]


def test_a_preference_file_is_read_and_bad_lines_are_one_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n\n', encoding="utf-8")
    assert dpo.read_pairs(str(path)) == [("a", "b", "c")]
    for line, message in (('{"prompt": "a", "chosen": "b"}', "line 1 is not "),  # of any kind: as train.py says it
                          ('{"prompt": "a", "chosen": "", "rejected": "c"}', "line 1's chosen is empty"),
                          ('{"prompt": "a", "chosen": 3, "rejected": "c"}', "line 1: 'chosen' must be a string"),
                          ('{"text": "a"}', "holds a document \\(text\\) lines, not preference pairs")):
        path.write_text(line + "\n", encoding="utf-8")
        with pytest.raises(UserError, match=message):
            dpo.read_pairs(str(path))


# --- the loss, the metrics and the gradients, against TRL -------------------------------------

def assert_close(got, want, name, rel=1e-5, scale=None):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(np.abs(want).max(), 1e-12) if scale is None else scale
    assert got.shape == want.shape, name
    assert np.abs(got - want).max() <= rel * scale, f"{name}: {np.abs(got - want).max():.3g} off (largest {scale:.3g})"


def metric_close(got, prefix, name):
    """TRL's metric `name` of a golden case (prefix). The rewards and their margin are β times differences of
    log-probabilities, so float32 rounds them relative to those log-probabilities, not to the difference: a
    margin near 0 has no digits of its own (against 1e-5 of itself it stood at 0.83 of the bound on OpenBLAS's
    Haswell kernel, 0.78 on SkylakeX)."""
    scale = None
    if name.startswith("rewards/") and name != "rewards/accuracies":
        scale = BETA * max(np.abs(NUMBERS[f"{prefix}/logps/{side}"]).max() for side in ("chosen", "rejected"))
    assert_close(got, NUMBERS[f"{prefix}/{name}"], name, scale=scale)


CASES = {"start": (None, "sigmoid"), "start_norm": (None, "sigmoid_norm"), "ref": ("ref", "sigmoid"),
         "ref_norm": ("ref", "sigmoid_norm"), "lora": ("lora", "sigmoid"), "lora_norm": ("lora", "sigmoid_norm")}


@pytest.mark.parametrize("case", CASES)
def test_the_loss_every_metric_and_every_gradient_are_trls(tiny, batch, case):
    hp, params = tiny
    kind, loss_type = CASES[case]
    ids, mask = batch
    policy, reference = (lora_params(params), params) if kind == "lora" else (
        params, reference_params(params) if kind == "ref" else params)
    ref_logps = dpo.completion_logps(ids, mask, reference, hp)
    loss, grads, metrics = dpo.loss_and_grads(ids, mask, ref_logps, policy, hp, BETA, loss_type,
                                              frozen=kind == "lora")
    assert set(metrics) == set(dpo.METRICS)
    for name in dpo.METRICS:
        metric_close(metrics[name], case, name)
    assert loss == metrics["loss"]
    for name, grad in shapes.flatten(grads).items():
        assert grad.dtype == np.float32, name
        if name == "wte":
            # a norm: a sum of V·C squares, each side within float32's rounding of that sum (1e-5 stood at 0.62)
            assert_close(np.linalg.norm(grad), NUMBERS[f"{case}/grad/wte/norm"], "|wte|",
                         rel=float32_rounding(grad.size, 1, 1.0))
            grad, name = grad[NUMBERS[f"{case}/grad/wte/rows"]], "wte/grad_rows"
        assert_close(grad, NUMBERS[f"{case}/grad/{name}"], name)
    assert len(shapes.flatten(grads)) == len([n for n in NUMBERS.files if n.startswith(f"{case}/grad/")]) - 2 * (
        kind != "lora")  # wte's three entries are one gradient


def test_at_the_start_the_loss_is_log_2_and_no_pair_counts_as_won(tiny, batch):
    """Policy = reference: every δ is 0, σ(0) = 1/2; accuracies count chosen > rejected strictly, so 0."""
    hp, params = tiny
    ids, mask = batch
    _, _, metrics = dpo.loss_and_grads(ids, mask, dpo.completion_logps(ids, mask, params, hp), params, hp, BETA)
    assert abs(metrics["loss"] - np.log(2)) < 1e-7 and metrics["rewards/accuracies"] == 0.0


# --- the loss's pieces -------------------------------------------------------------------------

def test_sigmoid_norm_is_raschkas_per_token_average():
    """Raschka's notebook (LLMs-from-scratch ch07/04): each sequence's log-probability averaged over its
    completion's tokens, then the usual DPO loss; TRL's sigmoid_norm divides each log-ratio by that length."""
    rng = np.random.default_rng(0)
    P, lengths = 3, np.array([4, 7, 2, 5, 3, 9])
    logps, ref = -rng.uniform(5, 30, 2 * P), -rng.uniform(5, 30, 2 * P)
    avg, ref_avg = logps / lengths, ref / lengths  # compute_logprobs(..., averaged over the mask)
    model_ratios, ref_ratios = avg[:P] - avg[P:], ref_avg[:P] - ref_avg[P:]
    raschka = np.mean(-np.log(1 / (1 + np.exp(-BETA * (model_ratios - ref_ratios)))))
    loss, _, _ = dpo.dpo_loss(logps, ref, lengths, BETA, "sigmoid_norm")
    assert abs(loss - raschka) < 1e-12


@pytest.mark.parametrize("loss_type", dpo.LOSSES)
def test_each_sequences_weight_is_minus_the_losss_derivative_by_its_logp(loss_type):
    """w_b = -d loss / d log π_b, by central differences in float64."""
    rng = np.random.default_rng(1)
    logps, ref, lengths = -rng.uniform(5, 30, 8), -rng.uniform(5, 30, 8), rng.integers(1, 9, 8)
    _, weights, _ = dpo.dpo_loss(logps, ref, lengths, BETA, loss_type)
    for b in range(8):
        up, down = logps.copy(), logps.copy()
        up[b] += 1e-6
        down[b] -= 1e-6
        slope = (dpo.dpo_loss(up, ref, lengths, BETA, loss_type)[0] - dpo.dpo_loss(down, ref, lengths, BETA,
                                                                                  loss_type)[0]) / 2e-6
        assert abs(-slope - weights[b]) <= 1e-6 * max(abs(slope), 1e-3)
    assert (weights[:4] > 0).all() and (weights[4:] < 0).all()  # the chosen learned, the rejected unlearned


def test_log_sigmoid_does_not_overflow():
    z = np.array([-1000.0, -20.0, 0.0, 20.0, 1000.0])
    want = -np.logaddexp(0.0, -z)
    assert np.allclose(dpo.log_sigmoid(z), want, rtol=1e-12, atol=0)


def test_an_unknown_loss_type_is_refused():
    with pytest.raises(ValueError, match="unknown DPO loss 'hinge'"):
        dpo.dpo_loss([0.0, 0.0], [0.0, 0.0], [1, 1], BETA, "hinge")


# --- judging a tuned model: evaluate.py preference -------------------------------------------

def run_evaluate(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "evaluate.py"), "preference", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def reference_folder(tiny, tiny_model, tmp_path_factory):
    hp, params = tiny
    return write_checkpoint(str(tmp_path_factory.mktemp("ref") / "ref"), reference_params(params), hp,
                            vocab_dir=tiny_model)


@pytest.mark.parametrize("loss_type, case", [("sigmoid", "ref"), ("sigmoid_norm", "ref_norm")])
def test_evaluate_preference_gives_trls_metrics_and_drops_what_training_drops(tiny_model, reference_folder,
                                                                              tmp_path, loss_type, case):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in GOLDEN["pairs"]), encoding="utf-8")
    r = run_evaluate(str(data), "--model", tiny_model, "--reference", reference_folder, "--beta", str(BETA),
                     "--dpo-loss", loss_type, "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert list(result) == ["pairs", *dpo.METRICS, "dropped"] and (result["pairs"], result["dropped"]) == (5, 1)
    assert r.stderr == "note: 1 of 6 pairs dropped: the prompt alone fills the model's 64 positions\n"
    for name in dpo.METRICS:
        metric_close(result[name], case, name)


def test_evaluate_preference_refuses_bad_input_in_one_line(tiny, tiny_model, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps(GOLDEN["pairs"][0]) + "\n", encoding="utf-8")
    hp, params = tiny
    short = write_checkpoint(str(tmp_path / "short"), params | {"wpe": params["wpe"][:32]}, hp | {"n_ctx": 32},
                             vocab_dir=tiny_model)
    for args, message in (((), "the following arguments are required: --reference"),
                          (("--reference", tiny_model, "--beta", "0"), "--beta must be above 0 and at most 3.4e+38 (as "
                                                                       "train.py takes it), got 0"),
                          (("--reference", tiny_model, "--beta", "1e308"), "--beta must be above 0 and at most 3.4e+38"),
                          (("--reference", tiny_model, "--beta", "nan"), "--beta must be above 0 and at most 3.4e+38"),
                          (("--reference", tiny_model, "--threads", "0"), "--threads must be at least 1, got 0"),
                          (("--reference", tiny_model, "--dpo-loss", "ipo"), "invalid choice: 'ipo'"),
                          (("--reference", short), "must have the trained model's vocabulary and context (50,257 "
                                                   "ids, 64 positions; it has 50,257 and 32)")):
        r = run_evaluate(str(data), "--model", tiny_model, *args, "--quiet")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
        assert r.stdout == ""


def test_a_pair_won_by_a_wide_margin_makes_no_subnormal_gradient(tiny, batch):
    """σ(-β δ) of 1e-40 would make every product of the backward a subnormal float32 (and a CPU step 30x
    slower); such a weight moves nothing, and is 0: every gradient is exactly 0, none subnormal."""
    hp, params = tiny
    ids, mask = batch
    logps = dpo.completion_logps(ids, mask, params, hp)
    P = len(logps) // 2
    ref = logps - np.concatenate([np.full(P, 460.0), np.full(P, -460.0)]).astype(np.float32)  # β δ = 92
    loss, grads, _ = dpo.loss_and_grads(ids, mask, ref, params, hp, BETA)
    assert 0 < loss < 1e-38
    flat = shapes.flatten(grads)
    assert all(not a.any() for a in flat.values())


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_model_judged_against_itself_has_every_reward_exactly_0(tiny, encoder, batch_size):
    """evaluate.py preference scores the policy and the reference in the same batches: the same model twice
    gives r = 0 exactly, whatever the batch (docs/evaluating.md)."""
    hp, params = tiny
    kept, _ = dpo.tokenized_pairs(encoder, PAIRS, CONTEXT)
    result = dpo.judge(kept, params, {**params}, hp, CONTEXT, encoder.eot, BETA, batch_size=batch_size)
    assert [result[k] for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")] == [0] * 4


def test_the_lessons_figure_goes_beside_its_log_unless_told(tmp_path):
    """docs/make_dpo_lesson.py figure LOG writes LOG's folder's dpo_rewards.svg, not the tracked docs/ one."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("lesson", os.path.join(ROOT, "docs", "make_dpo_lesson.py"))
    lesson = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lesson)
    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "lr": 1e-3, "loss": 0.69, "rewards/accuracies": 0.0, "rewards/margins": 0.0},
        {"step": 1, "val_loss": 0.6, "val_rewards/accuracies": 1.0, "val_rewards/margins": 0.2}]), encoding="utf-8")
    lesson.figure(str(log))
    assert (tmp_path / "dpo_rewards.svg").read_text(encoding="utf-8").startswith("<svg")
    lesson.figure(str(log), str(tmp_path / "other.svg"))
    assert (tmp_path / "other.svg").exists()
