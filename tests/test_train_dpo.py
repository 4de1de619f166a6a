"""train.py on preference pairs (DPO): a few AdamW steps at a constant rate equal TRL 1.16.0's DPOTrainer's,
step by step and metric by metric (tests/data/make_dpo_golden.py); the reference is the starting model, a
--reference model, or with LoRA the base; validation's metrics go into train_log.jsonl as val_<name>; a
resumed run is the same run; and bad input is one line, exit 2, nothing written."""
import json
import os

import numpy as np
import pytest

import dpo
import train
from conftest import DATA, model_folder_copy, run_train
from interface import train_cli
from plumbing.checkpoint import write_checkpoint
from test_dpo import GOLDEN, NUMBERS, metric_close, reference_params

STEPS = GOLDEN["steps"]


def write_pairs(path, pairs):
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def prefs(tmp_path_factory):
    return write_pairs(tmp_path_factory.mktemp("prefs") / "prefs.jsonl", GOLDEN["pairs"])


def dpo_args(model, data, out, *more):
    """TRL's run in the golden: AdamW at a constant rate, no decay, clipping at 1, a batch of every pair."""
    return ["--model", model, "--data", data, "--out", str(out), "--steps", str(STEPS["steps"]), "--lr",
            str(STEPS["lr"]), "--warmup", "0", "--min-lr-ratio", "1", "--weight-decay", "0", "--grad-clip", "1",
            "--batch-size", str(len(GOLDEN["pairs"])), "--val-fraction", "0", "--quiet", *more]


def train_log(out):
    with open(os.path.join(out, train.LOG_FILE), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_each_steps_loss_and_metrics_equal_trls_dpo_trainer(tiny_model, prefs, tmp_path, capsys):
    assert train_cli.main(dpo_args(tiny_model, prefs, tmp_path / "o")) == 0
    log = train_log(tmp_path / "o")
    assert [r["step"] for r in log] == list(range(1, STEPS["steps"] + 1)) and {r["lr"] for r in log} == {STEPS["lr"]}
    for name in dpo.METRICS:
        metric_close([r[name] for r in log], "steps", name)
    assert "1 dropped (the prompt alone fills --context 64)" in capsys.readouterr().out


@pytest.mark.parametrize("loss_type", dpo.LOSSES)
def test_a_reference_model_is_used_as_trl_uses_it(tiny_model, prefs, tmp_path, models, loss_type):
    """--reference: the first step's metrics are the golden's "ref" case (its batch, before any update)."""
    hp, params = models["tiny"]
    ref = write_checkpoint(str(tmp_path / "ref"), reference_params(params), hp, vocab_dir=tiny_model)
    args = dpo_args(tiny_model, prefs, tmp_path / "o", "--reference", ref, "--dpo-loss", loss_type, "--steps", "1")
    assert train_cli.main(args) == 0
    [first] = train_log(tmp_path / "o")
    case = "ref" if loss_type == "sigmoid" else "ref_norm"
    for name in dpo.METRICS:
        metric_close(first[name], case, name)


def test_with_lora_the_reference_is_the_base_with_the_adapters_off(tiny_model, prefs, models):
    """No second copy: the reference's log-probabilities are the base's, and B = 0 makes step 1's δ zero."""
    recipe = train.recipe_with(steps=1, batch_size=6, val_fraction=0.0, warmup=0)
    lora = {"rank": 2, "alpha": 4.0, "targets": ["c_attn", "c_proj"], "base": "tiny"}
    run = train.set_up("unused", recipe, [prefs], base=tiny_model, lora=lora)
    hp, params = models["tiny"]
    ids, mask = dpo.pair_batch(run["train_data"]["rows"], 64, 50256)
    assert np.array_equal(dpo.batch_logps(ids, mask, run["train_data"]["reference"], hp),
                          dpo.batch_logps(ids, mask, params, hp))
    metrics = train.train_step(run["params"], hp, run["state"], run["train_data"], 0, run["recipe"], {},
                               run["lora"]["adapters"])
    assert abs(metrics["loss"] - np.log(2)) < 1e-6


@pytest.fixture(scope="module")
def shakespeare_style(tmp_path_factory):
    """The DPO chapter's model's shape (2 layers, 64 wide, GPT-2's vocabulary, context 64), initialised."""
    from parameters import init_params
    hp = {"n_vocab": 50257, "n_ctx": 64, "n_embd": 64, "n_head": 2, "n_layer": 2}
    return write_checkpoint(str(tmp_path_factory.mktemp("m") / "baby"), init_params(hp, 0), hp,
                            vocab_dir=os.path.join(DATA, "..", "..", "data", "gpt2-vocab"))


@pytest.mark.parametrize("model, more", [("shakespeare_style", []), ("tiny_model", ["--batch-size", "16"])])
def test_at_step_1_every_reward_is_exactly_0_whatever_the_batch(model, more, request, tmp_path):
    """Policy and reference are one model at step 1: r = log π - log π_ref is 0 for every pair, whatever
    its batch's padding, so the rewards are 0 and the accuracy (strictly greater, TRL's) is 0, as TRL logs."""
    prefs = os.path.join(DATA, "..", "..", "data", "preferences.jsonl")
    out = tmp_path / "o"
    assert train_cli.main(["--model", request.getfixturevalue(model), "--data", prefs, "--out", str(out), "--steps",
                           "1", "--context", "64", "--quiet", *more]) == 0
    first = train_log(out)[0]
    assert [first[k] for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")] == [0] * 4


def test_dpo_with_lora_writes_the_merged_model_and_peft_adapter(tiny_model, prefs, tmp_path):
    r = run_train(*dpo_args(tiny_model, prefs, tmp_path / "o", "--steps", "2", "--lora-rank", "2"))
    assert r.returncode == 0, r.stderr
    assert {"adapter_model.safetensors", "adapter_config.json", "model.ckpt.index"} <= set(os.listdir(tmp_path / "o"))
    log = train_log(tmp_path / "o")
    assert log[0]["loss"] == pytest.approx(np.log(2), abs=1e-6) and log[1]["loss"] < log[0]["loss"]


def test_validation_pairs_get_their_metrics_in_train_log(tiny_model, tmp_path):
    prefs = write_pairs(tmp_path / "five.jsonl", GOLDEN["pairs"][:5])  # the last, the longest, held out
    args = dpo_args(tiny_model, prefs, tmp_path / "o", "--steps", "2", "--val-fraction", "0.2", "--eval-every", "1",
                    "--batch-size", "2")
    r = run_train(*args)
    assert r.returncode == 0, r.stderr
    assert "5 pairs, 1 held out for validation; 0 dropped" in r.stdout and ", validation loss " in r.stdout
    log = train_log(tmp_path / "o")
    assert [sorted(r) for r in log] == [sorted(["step", "lr", *dpo.METRICS]),
                                         sorted(["step", *(f"val_{k}" for k in dpo.METRICS)])] * 2
    assert log[1]["val_loss"] < np.log(2) and log[3]["val_loss"] < log[1]["val_loss"]  # it learns what it was not shown


def test_a_resumed_run_is_the_same_run(tiny_model, prefs, tmp_path):
    args = dpo_args(tiny_model, prefs, tmp_path / "all", "--batch-size", "2", "--steps", "4")
    assert run_train(*args).returncode == 0
    assert run_train(*dpo_args(tiny_model, prefs, tmp_path / "half", "--batch-size", "2", "--steps", "2")).returncode == 0
    r = run_train("--out", str(tmp_path / "half"), "--resume", "--steps", "4", "--quiet")
    assert r.returncode == 0, r.stderr
    assert train_log(tmp_path / "half") == train_log(tmp_path / "all")
    weights = [(tmp_path / run / "model.ckpt.data-00000-of-00001").read_bytes() for run in ("all", "half")]
    assert weights[0] == weights[1]


# --- bad input: one line, exit 2, nothing written ----------------------------------------------

def one_line_error(r, message):
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_bad_preference_lines_are_one_line(tiny_model, tmp_path):
    for n, (line, message) in enumerate([({"prompt": "a", "chosen": "b"}, "line 1 is not"),
                                         ({"prompt": "a", "chosen": "", "rejected": "c"}, "line 1's chosen is empty"),
                                         ({"prompt": "a", "chosen": "b", "rejected": ""}, "line 1's rejected is empty")]):
        data = write_pairs(tmp_path / f"bad{n}.jsonl", [line])
        one_line_error(run_train(*dpo_args(tiny_model, data, tmp_path / "o")), message)
        assert not os.path.exists(tmp_path / "o")
    good = {"prompt": "a", "chosen": "b", "rejected": "c"}
    data = write_pairs(tmp_path / "short.jsonl", [good, {"prompt": "a", "chosen": "b"}])
    one_line_error(run_train(*dpo_args(tiny_model, data, tmp_path / "o")), "line 2 is not")


@pytest.mark.parametrize("flags, message", [
    (("--beta", "0"), "--beta must be above 0 and at most 3.4e+38"),
    (("--beta", "-1"), "--beta must be above 0 and at most 3.4e+38 (float32's largest: each sequence's weight, "
                       "β σ(-β δ) / P, is float32), got -1"),
    (("--beta", "nan"), "--beta must be above 0"),
    (("--dpo-loss", "hinge"), "--dpo-loss: no loss 'hinge': choose from sigmoid, sigmoid_norm")])
def test_bad_dpo_flags_are_one_line(tiny_model, prefs, tmp_path, flags, message):
    r = run_train(*dpo_args(tiny_model, prefs, tmp_path / "o", *flags))
    one_line_error(r, message)
    assert not os.path.exists(tmp_path / "o")


def test_dpo_flags_go_with_preference_data_alone(tiny_model, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("the cat sat on the mat. " * 200, encoding="utf-8")
    for flags, given in ((("--beta", "0.2"), "--beta"), (("--reference", tiny_model), "--reference"),
                         (("--beta", "0.2", "--dpo-loss", "sigmoid"), "--beta and --dpo-loss")):
        r = run_train(*dpo_args(tiny_model, str(text), tmp_path / "o", *flags))
        one_line_error(r, f"{given} go with preference data")
        assert not os.path.exists(tmp_path / "o")


def test_a_reference_with_another_vocabulary_or_context_is_one_line(tiny_model, prefs, tmp_path, models):
    odd = model_folder_copy("odd", str(tmp_path / "odd"))  # 96 ids, 32 positions
    one_line_error(run_train(*dpo_args(tiny_model, prefs, tmp_path / "o", "--reference", odd)),
                   "must have the trained model's vocabulary and context (50,257 ids, 64 positions; it has 96 and 32)")
    hp, params = models["tiny"]
    short = write_checkpoint(str(tmp_path / "short"), params, hp | {"n_ctx": 64}, vocab_dir=tiny_model)
    vocab = json.loads((tmp_path / "short" / "encoder.json").read_text(encoding="utf-8"))
    vocab["!"], vocab['"'] = vocab['"'], vocab["!"]
    (tmp_path / "short" / "encoder.json").write_text(json.dumps(vocab), encoding="utf-8")
    one_line_error(run_train(*dpo_args(tiny_model, prefs, tmp_path / "o", "--reference", short)), "and other tokens")
    assert not os.path.exists(tmp_path / "o")


def test_dpo_from_scratch_is_one_line(prefs, tmp_path):
    r = run_train("--from-scratch", "--data", prefs, "--out", str(tmp_path / "o"), "--quiet")
    one_line_error(r, "DPO tunes a model against a reference: give --model, not --from-scratch")
    assert not os.path.exists(tmp_path / "o")


def test_the_validation_part_of_a_report_names_its_metrics_as_train_log_does():
    """The training metrics and the validation's side by side are told apart: val_<name>, as in train_log.jsonl."""
    metrics = {"lr": 1e-3, "loss": 0.5, "rewards/chosen": 0.25}
    line = train.report(3, metrics, {"loss": 0.75, "rewards/chosen": 0.125})
    assert line == ("step 3: train loss 0.5000, rewards/chosen 0.2500, validation loss 0.7500, "
                    "val_rewards/chosen 0.1250")
