"""python train.py's flags (interface/train_cli.py): their help and defaults, drawn from train.py's recipe,
and every flag a run cannot use refused in one line before anything is written."""
import json
import os

import numpy as np
import pytest

from conftest import run_train, train_args
import train
from interface import train_cli


def test_bad_flags_are_one_line(tiny_model, corpus, tmp_path):
    for flag, message in [(("--dropout", "1"), "--dropout must be in [0, 1)"),
                          (("--val-fraction", "-0.1"), "--val-fraction must be in [0, 1)"),
                          (("--accum", "0"), "--accum must be at least 1, got 0"),
                          (("--steps", "1.5"), "error: --steps must be a whole number, got '1.5'"),
                          (("--lr", "fast"), "error: --lr must be a number, got 'fast'"),
                          (("--beta2", "1"), "--beta2 must be in (0, 1), got 1.0")]:
        r = run_train(*train_args(tiny_model, corpus, tmp_path / "o", *flag))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
        assert not os.path.exists(tmp_path / "o")


def test_resume_reads_the_saved_runs_flags_and_says_which_differ(tiny_model, corpus, tmp_path):
    out = tmp_path / "run"
    assert run_train(*train_args(tiny_model, corpus, out)).returncode == 0
    r = run_train("--out", str(out), "--resume", "--steps", "14", "--quiet")  # nothing else repeated
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == "resuming with --steps 14 (the saved run had 12)"
    assert "step 14: train loss" in r.stdout
    config = json.loads((out / "train_config.json").read_text())
    assert config["steps"] == 14 and config["context"] == 16 and config["lr"] == 3e-3
    r = run_train("--out", str(out), "--resume", "--model", "124M", "--quiet")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--resume continues the model saved in {out} (trained from {tiny_model}): leave out --model 124M" in r.stderr


def test_help_shows_every_default():
    r = run_train("--help")
    assert r.returncode == 0 and "(default: 0.0001)" in r.stdout and "(default: 200)" in r.stdout


@pytest.mark.parametrize("flag, message", [
    (("--lr", "-1"), "--lr must be above 0"), (("--lr", "0"), "--lr must be above 0"),
    (("--lr", "nan"), "--lr must be above 0"), (("--weight-decay", "-0.1"), "--weight-decay must be at least 0"),
    (("--min-lr-ratio", "2"), "--min-lr-ratio must be in [0, 1]"), (("--warmup", "-1"), "--warmup must be at least 0"),
    (("--grad-clip", "-1"), "--grad-clip must be at least 0"), (("--seed", "-1"), "--seed must be at least 0, got -1"),
    (("--steps", "99999999999999999999"), "--steps must be at most 1,000,000,000: no run finishes "
                                          "99,999,999,999,999,999,999 steps"),
    (("--steps", "1000", "--accum", "10000000"), "--steps 1,000 --accum 10,000,000 make 10,000,000,000 micro-batches: "
                                                 "no run finishes that many; --steps times --accum must be at most "
                                                 "1,000,000,000")])
def test_nonsense_settings_are_refused(tiny_model, corpus, tmp_path, flag, message):
    r = run_train(*train_args(tiny_model, corpus, tmp_path / "o", *flag))
    assert r.returncode == 2 and r.stderr.startswith(f"error: {message}"), r.stderr
    assert r.stderr.count("\n") == 1 and not os.path.exists(tmp_path / "o")


def test_out_folders_that_cannot_be_used_are_one_line(tiny_model, corpus, tmp_path):
    (tmp_path / "taken").mkdir()
    for args, message in [(train_args(tiny_model, corpus, tmp_path / "taken"),
                           "taken: already exists: choose a new folder, or --resume the run saved there"),
                          (["--out", str(tmp_path / "taken"), "--resume"], "taken: holds no saved run to --resume"),
                          (["--out", str(tmp_path / "new")], "--data is required")]:
        r = run_train(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_model_shape_flags_go_with_from_scratch(tiny_model, corpus, tmp_path):
    r = run_train(*train_args(tiny_model, corpus, tmp_path / "o", "--n-layer", "3"))
    assert r.returncode == 2 and "--n-layer and --n-embd go with --from-scratch" in r.stderr.replace(
        "--vocab-size, --tokenizer, --n-layer, --n-head and", "--n-layer and")


def test_the_flags_are_train_pys_tables():
    """Every setting of RECIPE, NEW_MODEL and LORA is a flag with its default and its help: the two cannot disagree."""
    p = train_cli.parser()
    actions = {a.dest: a for a in p._actions}
    tables = [(train.RECIPE, ""), (train.NEW_MODEL, ""), (train.LORA, "lora_")]
    for table, prefix in tables:
        for name, (default, kind, text) in table.items():
            action = actions[prefix + name]
            assert (action.default, type(action.type("1")), action.option_strings) == (default, kind, [
                f"--{(prefix + name).replace('_', '-')}"]) and action.help.endswith(text), name
    args = train_cli.parse_args(["--out", "o", "--data", "d.txt"])
    assert train.recipe_with(**{k: getattr(args, k) for k in train.RECIPE}) == train.recipe_with()


def test_help_names_no_default_of_none_and_one_for_warmup():
    r = run_train("--help")
    assert r.returncode == 0 and "(default: None)" not in r.stdout, r.stdout
    text = " ".join(r.stdout.split())
    assert "--out OUT the folder to write the trained model to --steps" in text
    assert "from scratch, if not given: data/tinyshakespeare.txt" in text
    assert "--warmup WARMUP steps of linear warm-up (default: a tenth of --steps, at most 20) --weight-decay" in text
    assert "(default: 256, or the model's n_ctx if it has fewer positions)" in text


def test_out_in_a_models_folder_not_yet_made_makes_it(tiny_model, corpus, tmp_path):
    """The README's --out models/baby on a fresh clone: the models folder is made (here $GPT2_MODELS_DIR's);
    a run that fails takes it away again; another missing parent is still refused."""
    models = tmp_path / "models"
    env = {"GPT2_MODELS_DIR": str(models)}
    r = run_train(*train_args(tiny_model, tmp_path / "missing.txt", models / "baby"), env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and not models.exists(), r.stderr
    r = run_train(*train_args(tiny_model, corpus, tmp_path / "runs" / "baby", "--steps", "2"), env=env)
    assert r.returncode == 2 and "runs does not exist" in r.stderr and not (tmp_path / "runs").exists(), r.stderr
    r = run_train(*train_args(tiny_model, corpus, models / "baby", "--steps", "2"), env=env)
    assert r.returncode == 0 and os.listdir(models) == ["baby"], r.stderr


FLOAT_FLAGS = {  # every float flag of train.py: values it cannot use, and the start of the one line each gets
    "--lr": (["inf", "1e308", "nan"], "--lr must be above 0 and at most 3.4e+38"),
    "--min-lr-ratio": (["nan", "inf"], "--min-lr-ratio must be in [0, 1]"),
    "--weight-decay": (["nan", "inf"], "--weight-decay must be at least 0"),
    "--grad-clip": (["nan", "inf"], "--grad-clip must be at least 0"),
    "--dropout": (["nan", "inf"], "--dropout must be in [0, 1)"),
    "--val-fraction": (["nan", "inf"], "--val-fraction must be in [0, 1)"),
    "--beta2": (["nan", "inf"], "--beta2 must be in (0, 1)"),
    "--lora-alpha": (["nan", "inf", "1e308"], "--lora-alpha must be above 0 and at most 3.4e+38"),
    "--beta": (["nan", "inf", "1e308", "0"], "--beta must be above 0 and at most 3.4e+38"),
}


def test_every_float_flag_is_finite_and_in_range(tiny_model, corpus, tmp_path, capsys):
    """--beta 1e308 trained to NaN and exit 0 (issue 44): every float flag is finite and in its range, one line,
    exit 2, nothing written. (The flags that need others, --lora-alpha and --beta, are given them.)"""
    from conftest import in_process
    kinds = {p.dest for p in train_cli.parser()._actions if p.type in (float, train_cli.number)}
    assert {f"--{k.replace('_', '-')}" for k in kinds} == set(FLOAT_FLAGS)
    for flag, (values, message) in FLOAT_FLAGS.items():
        more = ["--lora-rank", "2"] if flag == "--lora-alpha" else []
        for value in values:
            r = in_process(train_cli.main, capsys, *train_args(tiny_model, corpus, tmp_path / "o", *more, flag, value))
            assert r.returncode == 2 and r.stderr.startswith(f"error: {message}"), (flag, value, r.stderr)
            assert r.stderr.count("\n") == 1 and not os.path.exists(tmp_path / "o")


def test_a_run_whose_loss_becomes_nan_stops_in_one_line_keeping_the_last_good_step(tiny_model, corpus, tmp_path,
                                                                                     capsys):
    """A rate that makes the weights overflow: the step whose loss or gradient is not finite makes no update;
    the steps before it are saved; one line names the step and the flag; exit 2; no NaN in train_log.jsonl."""
    from conftest import in_process
    out = tmp_path / "o"
    r = in_process(train_cli.main, capsys, *train_args(tiny_model, corpus, out, "--lr", "1e30", "--warmup", "0",
                                                       "--grad-clip", "0"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    step = int(r.stderr.split("error: step ")[1].split(":")[0])
    assert "the run diverged" in r.stderr and "the likely cause: --lr 1e+30 too large" in r.stderr, r.stderr
    log = [json.loads(line) for line in (out / train.LOG_FILE).read_text().splitlines()] if step > 1 else []
    assert [x["step"] for x in log if "lr" in x] == list(range(1, step))
    assert all(np.isfinite(v) for x in log for v in x.values())
    assert f"saved step {step - 1} in {out}" in r.stderr
