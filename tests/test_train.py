"""train.py: the loop (accumulation, reused buffers), the set-up, and the command line end to end on the tiny model
(its flags alone: test_train_cli.py)."""
import glob
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

import backward
from conftest import DATA, GRAD_GOLDEN as GOLDEN, ROOT, in_process, run_train, train_args
import optimizer
import train
from interface import train_cli
from plumbing import shapes
from plumbing.checkpoint import load_checkpoint
from plumbing.errors import UserError


def test_a_step_accumulating_two_micro_batches_in_reused_buffers(models):
    """train_step with --accum 2: the mean of the two micro-batches' gradients, clipped, then
    AdamW, although both micro-batches write their wte gradient into the same buffer."""
    hp, params = models["odd"]
    recipe = train.recipe_with(seed=3, accum=2, batch_size=2, context=8, dropout=0.0, grad_clip=0.5, lr=1e-3, warmup=0,
                               steps=10)
    ids = np.random.default_rng(0).integers(0, hp["n_vocab"], 200)
    a, b = train.writable_copy(params), train.writable_copy(params)
    sa, sb = optimizer.new_adamw_state(a), optimizer.new_adamw_state(b)
    loss = train.train_step(a, hp, sa, {"kind": "documents", "rows": ids}, 4, recipe, {})["loss"]
    rng = np.random.default_rng([3, 4])
    runs = [backward.loss_and_grads(*train.batch(ids, 2, 8, rng), b, hp) for _ in range(2)]
    mean = {k: (x + shapes.flatten(runs[1][1])[k]) / 2 for k, x in shapes.flatten(runs[0][1]).items()}
    grads = train.writable_copy(shapes.nest(mean, hp["n_layer"]))
    optimizer.clip_grad_norm(grads, 0.5)
    optimizer.adamw_step_fast(b, grads, sb, optimizer.learning_rate(4, 1e-3, 0, 10, 1e-4), weight_decay=0.1)
    assert loss == pytest.approx((runs[0][0] + runs[1][0]) / 2, rel=1e-6)
    fa, fb = shapes.flatten(a), shapes.flatten(b)
    assert all(np.allclose(fa[k], fb[k], rtol=0, atol=1e-6) for k in fa)  # 1e-6: AdamW's plain form too
    assert not np.array_equal(fa["wte"], shapes.flatten(params)["wte"])


def test_one_training_step_is_forward_backward_clip_then_adamw(models):
    """train_step: the forward and backward passes (train.gradients), the step's learning rate (learning_rate),
    the gradients clipped by their global norm, then AdamW, as optimizer.py's plain forms write them."""
    hp, params = models["odd"]
    recipe = train.recipe_with(seed=1, batch_size=2, context=8, grad_clip=0.1, lr=1e-2, warmup=4, steps=10,
                               weight_decay=0.1, beta2=0.99)
    data = {"kind": "documents", "rows": np.random.default_rng(0).integers(0, hp["n_vocab"], 200)}
    a, b = train.writable_copy(params), train.writable_copy(params)
    sa, sb = optimizer.new_adamw_state(a), optimizer.new_adamw_state(b)
    metrics = train.train_step(a, hp, sa, data, 2, recipe, {})
    want, grads = train.gradients(b, hp, data, 2, recipe)
    lr = optimizer.learning_rate(2, 1e-2, 4, 10, 1e-3)
    assert optimizer.clip_grad_norm(grads, 0.1) > 0.1  # clipping is at work
    optimizer.adamw_step(b, grads, sb, lr, beta2=0.99, weight_decay=0.1)
    assert metrics == {"lr": lr, **want}, "the step's metrics: {'lr': the step's learning rate, **gradients' own}"
    assert sa["step"] == 1, "one AdamW step"
    fa, fb = shapes.flatten(a), shapes.flatten(b)
    for k in fa:
        assert np.allclose(fa[k], fb[k], rtol=0, atol=1e-6), f"{k}: not gradients, clipped, then AdamW at that lr"


def test_a_batch_is_windows_of_the_text_and_their_next_tokens():
    """train.batch: each row a window of `context` consecutive tokens starting anywhere that leaves it a next
    token, and its targets the same window shifted by one; the draws are the rng's."""
    ids = np.arange(1000, 1100)
    x, y = train.batch(ids, 2000, 8, np.random.default_rng(0))
    assert x.shape == y.shape == (2000, 8)
    starts = x[:, 0] - 1000
    assert (x == ids[starts[:, None] + np.arange(8)]).all(), "each row: 8 consecutive tokens of the text"
    assert (y == x + 1).all(), "each target is the token after its input: the window shifted by one"
    assert starts.min() == 0 and starts.max() == 100 - 8 - 1, "every start, from 0 to the last that leaves a target"
    again = train.batch(ids, 2000, 8, np.random.default_rng(0))
    assert (again[0] == x).all() and (again[1] == y).all(), "the same rng state: the same batch"


def test_accumulation_copies_the_first_micro_batchs_gradients(models):
    hp, params = models["odd"]
    buffers = {}
    _, grads = backward.loss_and_grads(GOLDEN["odd/ids"], GOLDEN["odd/targets"], params, hp, buffers=buffers)
    total = train.accumulate(None, grads)
    assert not np.shares_memory(total["wte"], buffers["dwte"]) and np.array_equal(total["wte"], grads["wte"])


def test_a_writable_copy_is_writable_float32():
    from plumbing import hf_model
    _, params, _ = hf_model.load_hf_folder(os.path.join(DATA, "hf", "inner"))
    copy = train.writable_copy(params)
    assert set(copy["ln_f"]) == set(copy["blocks"][2]["ln_2"]) == {"g", "b"}  # the eps is the hparams'
    assert copy["wte"].flags.writeable and not np.shares_memory(copy["wte"], params["wte"])
    assert np.array_equal(copy["wte"], params["wte"])


def test_map_tensors_maps_every_array_and_keeps_the_nesting():
    params = {"wte": np.ones(2), "blocks": [{"attn": {"c_attn": {"w": np.zeros((1, 2)), "lora": {"scale": 2.0}}}}]}
    doubled = shapes.map_tensors(lambda a: a + 1, params)
    assert doubled["wte"].tolist() == [2, 2] and doubled["blocks"][0]["attn"]["c_attn"]["w"].tolist() == [[1, 1]]
    assert doubled["blocks"][0]["attn"]["c_attn"]["lora"] == {"scale": 2.0} and params["wte"].tolist() == [1, 1]


def test_fine_tuning_end_to_end_then_generating_from_it(tiny_model, corpus, tmp_path):
    out = tmp_path / "notes-tiny"
    r = run_train(*train_args(tiny_model, corpus, out))
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if "validation loss" in line]
    assert len(lines) == 2 and "step 12 sample:" in r.stdout
    assert sorted(os.listdir(out)) == ["checkpoint", "encoder.json", "hparams.json", "model.ckpt.data-00000-of-00001",
                                       "model.ckpt.index", "train_config.json", "train_log.jsonl", "train_state.npz",
                                       "vocab.bpe"]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    steps = [line for line in log if "lr" in line]  # a line a step, and one for each validation (every 6)
    assert [line["step"] for line in steps] == list(range(1, 13)) and all(set(line) == {"step", "lr", "loss"}
                                                                          for line in steps)
    assert steps[0]["lr"] == pytest.approx(1e-3) and steps[3]["lr"] == pytest.approx(3e-3)  # a warm-up of 3
    assert [(line["step"], sorted(line)) for line in log if "lr" not in line] == [(6, ["step", "val_loss"]),
                                                                                  (12, ["step", "val_loss"])]
    assert f"validation loss {log[-1]['val_loss']:.4f}" in lines[-1]
    g2 = subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), "--model", str(out), "the cat",
                         "--n-tokens", "5", "--quiet"], capture_output=True, text=True)
    assert g2.returncode == 0 and g2.stdout.startswith("the cat")
    _, before = load_checkpoint(tiny_model)
    _, after = load_checkpoint(str(out))
    assert not np.array_equal(before["wte"], after["wte"])  # it trained


@pytest.mark.parametrize("dropout", ["0", "0.1"])
def test_the_same_seed_gives_the_same_run_bit_for_bit(tiny_model, corpus, tmp_path, dropout):
    for name in ("a", "b"):
        assert run_train(*train_args(tiny_model, corpus, tmp_path / name, "--dropout", dropout)).returncode == 0
    for f in ("model.ckpt.data-00000-of-00001", "train_state.npz"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    config = json.loads((tmp_path / "a" / "train_config.json").read_text())
    assert config["dropout"] == float(dropout)


def run_interrupted(tiny_model, corpus, tmp_path, monkeypatch, at_call, interrupt):
    """train.py on the notes, with interrupt() called in its at_call-th step (as it takes the gradients'
    norm). -> (its exit code, the step it saved, its folder)"""
    norm, calls = optimizer.grad_norm, {"n": 0}

    def norm_then_interrupt(grads):
        calls["n"] += 1
        if calls["n"] == at_call:
            interrupt()
        return norm(grads)

    monkeypatch.setattr(train, "grad_norm", norm_then_interrupt)
    stopped = tmp_path / "stopped"
    code = train_cli.main(train_args(tiny_model, corpus, stopped))
    monkeypatch.setattr(train, "grad_norm", norm)
    return code, train.load_state(str(stopped), train.writable_copy(load_checkpoint(str(stopped))[1]))["step"], stopped


def resumed_and_straight(tiny_model, corpus, tmp_path, stopped):
    """The stopped run resumed to its end, and the same run made without a stop. -> (exit code, the
    files that differ between the two)"""
    straight = tmp_path / "straight"
    train_cli.main(train_args(tiny_model, corpus, straight))
    code = train_cli.main(train_args(tiny_model, corpus, stopped, "--resume"))
    return code, [f for f in ("model.ckpt.data-00000-of-00001", "train_state.npz")
                  if (stopped / f).read_bytes() != (straight / f).read_bytes()]


def test_ctrl_c_saves_and_resume_continues_the_same_run(tiny_model, corpus, tmp_path, monkeypatch):
    def ctrl_c():
        raise KeyboardInterrupt

    code, saved_step, stopped = run_interrupted(tiny_model, corpus, tmp_path, monkeypatch, 8, ctrl_c)
    assert code == 130
    assert saved_step == 7
    code, differ = resumed_and_straight(tiny_model, corpus, tmp_path, stopped)
    assert code == 0
    assert differ == []


def test_bad_input_is_one_line_and_nothing_is_written(tiny_model, tmp_path, capsys):
    empty, latin, short = tmp_path / "empty.txt", tmp_path / "latin.txt", tmp_path / "short.txt"
    empty.write_text("  \n")
    latin.write_bytes("café".encode("latin-1"))
    short.write_text("the cat sat")
    (tmp_path / "a file").write_text("x")
    for data, out, model, message in [
            (empty, tmp_path / "o1", tiny_model, "is empty"),
            (latin, tmp_path / "o2", tiny_model, "is not UTF-8 text"),
            (short, tmp_path / "o3", tiny_model, "too short for a context of 16"),
            (short, tmp_path / "a file" / "o4", tiny_model, "o4: its parent " + str(tmp_path / "a file") +
             " is not a folder"),
            (short, tmp_path / "no such folder" / "o6", tiny_model, "o6: its parent folder " +
             str(tmp_path / "no such folder") + " does not exist"),
            (short, tmp_path / "o5", "1558M", "are free: use a smaller model, batch or context")]:
        r = in_process(train_cli.main, capsys, *train_args(model, data, out))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
        assert not os.path.exists(out)
    assert sorted(os.listdir(tmp_path)) == ["a file", "empty.txt", "latin.txt", "short.txt"]


def test_1558m_does_not_fit_in_24_gb():
    need = train.memory_needed(shapes.hparams("1558M"), 1, 64)
    assert need > 24e9 and train.memory_needed(shapes.hparams("124M"), 4, 64) < 2.5e9


def test_resuming_a_finished_run_says_there_is_nothing_to_do(tiny_model, corpus, tmp_path):
    out = tmp_path / "run"
    assert run_train(*train_args(tiny_model, corpus, out)).returncode == 0
    before = (out / "train_state.npz").read_bytes()
    r = run_train("--out", str(out), "--resume", "--quiet")
    assert r.returncode == 0 and r.stdout == f"{out}: already trained for 12 steps, nothing to do (a larger --steps goes on)\n"
    assert (out / "train_state.npz").read_bytes() == before


def test_a_short_run_prints_its_final_validation_loss_and_warms_up_a_tenth(tiny_model, corpus, tmp_path):
    out = tmp_path / "short"
    r = run_train("--model", tiny_model, "--data", str(corpus), "--out", str(out), "--steps", "20", "--batch-size", "2",
                  "--context", "16", "--quiet")  # --eval-every 50, --warmup left to its default
    assert r.returncode == 0, r.stderr
    shown = [line for line in r.stdout.splitlines() if "validation loss" in line]
    assert len(shown) == 1 and shown[0].startswith("step 20: train loss "), r.stdout
    assert json.loads((out / "train_config.json").read_text())["warmup"] == 2


def test_a_model_openais_format_cannot_hold_is_refused_before_training(corpus, tmp_path):
    r = run_train(*train_args(os.path.join(DATA, "hf", "inner"), corpus, tmp_path / "o"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "OpenAI's format has no n_inner or layer_norm_epsilon" in r.stderr and "step" not in r.stdout
    assert not os.path.exists(tmp_path / "o")


# --- from scratch ------------------------------------------------------------------------------

SCRATCH = ["--from-scratch", "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--context", "32", "--batch-size", "8",
           "--lr", "1e-2", "--beta2", "0.99", "--eval-every", "50", "--sample-every", "1000", "--quiet"]


def test_from_scratch_the_loss_falls_and_the_folder_is_a_gpt2(tmp_path):
    """150 steps of a 2-layer model on the project's Shakespeare (its default text), bytes as the
    vocabulary: from ln(257) = 5.55 nats to below 3.5 in a few seconds."""
    out = tmp_path / "baby"
    r = run_train(*SCRATCH, "--out", str(out), "--steps", "150")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == ("a new GPT-2: 2 layers, 2 heads, 32 wide, 257 ids, 32 positions: "
                                        "34,720 parameters")
    assert "  wte (token embedding)              8,224   23.7%" in r.stdout.splitlines(), r.stdout
    val = [float(line.rsplit(" ", 1)[1]) for line in r.stdout.splitlines() if "validation loss" in line]
    assert len(val) == 3 and val[-1] < 3.5, r.stdout
    hp = json.loads((out / "hparams.json").read_text())
    assert hp == {"n_vocab": 257, "n_ctx": 32, "n_embd": 32, "n_head": 2, "n_layer": 2}
    encoder = json.loads((out / "encoder.json").read_text(encoding="utf-8"))
    assert len(encoder) == 257 and encoder["<|endoftext|>"] == 256
    g2 = subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), "--model", str(out), "ROMEO:",
                         "--n-tokens", "10", "--seed", "0"], capture_output=True, text=True)
    assert g2.returncode == 0 and g2.stdout.startswith("ROMEO:") and len(g2.stdout) > len("ROMEO:\n"), g2.stderr
    for extra in (["--score"], ["--lens"], ["--top", "3"], ["--html", str(tmp_path / "page.html")]):
        r2 = subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), "--model", str(out), "ROMEO: so",
                             *extra], capture_output=True, text=True)
        assert r2.returncode == 0 and r2.stdout, (extra, r2.stderr)
    params = subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), "--params", str(out)],
                            capture_output=True, text=True)
    assert "34,720" in params.stdout and "counting the checkpoint's tensors gives the same 34,720" in params.stdout
    further = run_train("--model", str(out), "--data", os.path.join(ROOT, "data", "tinyshakespeare.txt"), "--out",
                        str(tmp_path / "further"), "--steps", "2", "--context", "32", "--batch-size", "2", "--quiet")
    assert further.returncode == 0, further.stderr


def test_from_scratch_is_bit_reproducible_with_its_own_vocabulary(tmp_path, corpus):
    runs = [run_train(*SCRATCH, "--data", str(corpus), "--vocab-size", "280", "--context", "16", "--out",
                      str(tmp_path / name), "--steps", "5") for name in ("a", "b")]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    for f in ("model.ckpt.data-00000-of-00001", "encoder.json", "vocab.bpe", "train_state.npz"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert json.loads((tmp_path / "a" / "hparams.json").read_text())["n_vocab"] == 280
    reused = run_train(*SCRATCH, "--data", str(corpus), "--tokenizer", str(tmp_path / "a"), "--context", "16",
                       "--out", str(tmp_path / "c"), "--steps", "5")
    assert reused.returncode == 0, reused.stderr
    assert (tmp_path / "c" / "vocab.bpe").read_bytes() == (tmp_path / "a" / "vocab.bpe").read_bytes()


@pytest.mark.parametrize("args, message", [
    (["--n-embd", "30", "--n-head", "4"], "--n-embd 30 is not divisible by --n-head 4"),
    (["--model", "124M"], "--from-scratch trains a new model: leave out --model"),
    (["--context", "200000"], "too few for a context of 200000 in both"),
    (["--n-embd", "65536", "--n-head", "1", "--n-layer", "64"], "are free: use a smaller model, batch or context"),
    (["--vocab-size", "200"], "--vocab-size must be at least 257"),
    (["--vocab-size", "99999999999"], "are free: use a smaller model, batch or context"),  # before a merge is learned
    (["--beta2", "1"], "--beta2 must be in (0, 1)"),
])
def test_from_scratch_bad_input_is_one_line_and_nothing_is_written(tmp_path, capsys, args, message):
    r = in_process(train_cli.main, capsys, *SCRATCH, "--out", tmp_path / "o", "--steps", "5", *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == []


# --- the loop, in-process, and Ctrl-C ---------------------------------------------------------

def test_train_is_the_loop_the_command_line_runs(tiny_model, corpus, tmp_path, capsys):
    """set_up and train called from Python (no flags) report, sample and save as the step's number calls
    for them, and give the command line's checkpoint, bit for bit."""
    cli = tmp_path / "cli"
    assert train_cli.main(train_args(tiny_model, corpus, cli)) == 0
    capsys.readouterr()
    out = str(tmp_path / "loop")
    recipe = train.recipe_with(steps=12, batch_size=2, context=16, lr=3e-3, warmup=3, eval_every=5, sample_every=7,
                               save_every=100)
    run = train.set_up(out, recipe, [str(corpus)], base=tiny_model)
    code = train.train(run, out, config={"steps": 12}, quiet=True)
    printed = capsys.readouterr().out.splitlines()
    assert code == 0 and [line.split(":")[0] for line in printed] == ["step 5", "step 7 sample", "step 10", "step 12"]
    assert all("validation loss" in line for line in printed if "sample" not in line)
    assert open(os.path.join(out, "model.ckpt.data-00000-of-00001"), "rb").read() == (
        cli / "model.ckpt.data-00000-of-00001").read_bytes()
    assert json.loads(open(os.path.join(out, "train_config.json")).read()) == {"steps": 12}


def test_the_recipe_is_its_defaults_with_the_settings_given():
    recipe = train.recipe_with(steps=50, lr=3e-4)
    assert recipe == {name: default for name, (default, _, _) in train.RECIPE.items()} | {"steps": 50, "lr": 3e-4,
                                                                                       "warmup": 5}
    assert train.recipe_with()["warmup"] == 20 and train.recipe_with(steps=9, warmup=4)["warmup"] == 4
    assert train.with_context(recipe, {"n_ctx": 64})["context"] == 64
    assert train.with_context(recipe, {"n_ctx": 1024})["context"] == train.CONTEXT == 256
    assert train.with_context(recipe | {"context": 32}, {"n_ctx": 64})["context"] == 32
    with pytest.raises(TypeError, match="the recipe has no setting 'learning_rate'"):
        train.recipe_with(learning_rate=1e-3)


def test_set_up_says_where_the_weights_and_the_state_come_from(tiny_model, corpus, tmp_path, capsys):
    """A saved model: a writable float32 copy of its weights, a new state; resumed: the weights and state
    saved in out, and base (the command line's download) never called; new: GPT-2's initialisation,
    its table printed."""
    out = str(tmp_path / "run")
    recipe = train.recipe_with(steps=2, batch_size=2, context=16)
    run = train.set_up(out, recipe, [str(corpus)], base=lambda: tiny_model)
    _, base = load_checkpoint(tiny_model)
    assert run["params"]["wte"].flags.writeable and np.array_equal(run["params"]["wte"], base["wte"])
    assert run["state"]["step"] == 0 and run["vocab_dir"] == tiny_model and run["lora"] is None
    assert train.train(run, out, config={}, quiet=True) == 0

    def no_download():
        raise AssertionError("a resumed run fetched its model")

    resumed = train.set_up(out, recipe | {"steps": 3}, [str(corpus)], base=no_download, resume=True)
    assert resumed["state"]["step"] == 2 and resumed["vocab_dir"] == out
    assert np.array_equal(resumed["params"]["wte"], load_checkpoint(out)[1]["wte"])
    new = dict(vocab_size=None, tokenizer=tiny_model, n_layer=1, n_head=2, n_embd=8)
    capsys.readouterr()
    made = train.set_up(str(tmp_path / "new"), recipe, [str(corpus)], new=new)
    assert made["hparams"] == {"n_vocab": 50257, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 1}
    assert capsys.readouterr().out.startswith("a new GPT-2: 1 layer, 2 heads, 8 wide, 50,257 ids")
    assert not os.path.exists(tmp_path / "new")


@pytest.fixture
def sigint_raises():
    """Ctrl-C as Python's default: a KeyboardInterrupt (a shell may start the tests with SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_a_save_leaves_no_hidden_folder(tiny_model, corpus, tmp_path, monkeypatch, capsys,
                                                      sigint_raises):
    """SIGINT in the middle of the step-6 save (its tensors written, the vocabulary being copied):
    the half-written .writing-* folder goes, and the loop's Ctrl-C save writes step 6 whole."""
    copy, calls = shutil.copy, []

    def copy_then_ctrl_c(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the KeyboardInterrupt arrives here
        return copy(*args, **kwargs)

    monkeypatch.setattr(shutil, "copy", copy_then_ctrl_c)
    out = tmp_path / "run"
    assert train_cli.main(train_args(tiny_model, corpus, out)) == 130
    assert os.listdir(tmp_path) == ["run"], os.listdir(tmp_path)
    assert "interrupted: saved step 6 in" in capsys.readouterr().err
    assert train.load_state(str(out), train.writable_copy(load_checkpoint(str(out))[1]))["step"] == 6
    assert len(calls) > 1 and sorted(os.listdir(out))[-1] == "vocab.bpe"


@pytest.mark.parametrize("stop, said", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")],
                         ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_while_from_scratch_learns_its_vocabulary_is_one_line(tmp_path, stop, said):
    """SIGINT (or SIGTERM: kill, timeout, a scheduler) once the run has begun (its vocabulary's scratch
    folder beside --out exists), while bpe.py learns 3,839 merges from Shakespeare: exit 130, one line,
    nothing left behind."""
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *SCRATCH, "--vocab-size", "4096", "--out",
                          str(tmp_path / "o"), "--steps", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while not glob.glob(str(tmp_path / ".vocab-*")) and p.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # past the folder's making, well inside the seconds that the merges take
    p.send_signal(stop)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.strip() == said and "Traceback" not in err, (p.returncode, err)
    assert os.listdir(tmp_path) == []


def test_sigterm_in_the_loop_saves_the_steps_done_as_ctrl_c_does_and_leaves_no_scratch_folder(tmp_path):
    """SIGTERM once a run from scratch has saved (its vocabulary still in .vocab-* beside --out): the
    step under way is finished and saved, the scratch folder goes, exit 130; --resume goes on."""
    out = tmp_path / "o"
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *SCRATCH, "--out", str(out), "--steps",
                          "100000", "--save-every", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (out / "train_state.npz").exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted: saved step" in err and "Traceback" not in err, (p.returncode, err)
    assert os.listdir(tmp_path) == ["o"]  # no .vocab-* nor .writing-* beside it
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["from_scratch"] and os.path.exists(out / "encoder.json")


# --- what a run saves, and where --------------------------------------------------------------

def test_a_run_from_scratch_says_so_and_resume_names_it(tmp_path, capsys):
    out = tmp_path / "baby"
    assert train_cli.main([*SCRATCH, "--out", str(out), "--steps", "2"]) == 0
    config = json.loads((out / "train_config.json").read_text())
    assert config["model"] == "from scratch" and config["from_scratch"] is True
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        train_cli.main(["--out", str(out), "--resume", "--model", "355M", "--quiet"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (f"error: --resume continues the model saved in {out} (trained from scratch): "
                                       "leave out --model 355M\n")


def test_resuming_a_run_from_scratch_saved_before_it_said_so(tmp_path, capsys):
    """Runs saved with "model": "124M" (the flag's default) beside "from_scratch": true."""
    out = tmp_path / "old"
    assert train_cli.main([*SCRATCH, "--out", str(out), "--steps", "2"]) == 0
    config = json.loads((out / "train_config.json").read_text()) | {"model": "124M"}
    (out / "train_config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit):
        train_cli.main(["--out", str(out), "--resume", "--model", "124M", "--quiet"])
    assert "(trained from scratch): leave out --model 124M" in capsys.readouterr().err


def test_the_out_folder_gets_the_umasks_permissions(tiny_model, corpus, tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *train_args(tiny_model, corpus, out)],
                       capture_output=True, text=True, preexec_fn=lambda: os.umask(0o027))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(out / "train_state.npz").st_mode) == 0o640


def test_the_context_defaults_to_the_models_positions_when_it_has_fewer_than_256(tiny_model, corpus, tmp_path):
    out = tmp_path / "run"
    r = run_train(*[a for a in train_args(tiny_model, corpus, out) if a not in ("--context", "16")])
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "train_config.json").read_text())["context"] == 64  # the tiny model's n_ctx


# --- progress without a terminal --------------------------------------------------------------

def test_progress_in_a_log_is_a_plain_line_not_a_bar(tiny_model, corpus, tmp_path):
    r = run_train(*[a for a in train_args(tiny_model, corpus, tmp_path / "run") if a != "--quiet"])
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()  # a run of a second or two: the last line alone, unless the machine is slow
    assert "\r" not in r.stderr and lines and all(line.startswith("step ") for line in lines), r.stderr
    assert lines[-1].startswith("step 12/12 (100%), ") and "loss=" in lines[-1] and "tok_s=" in lines[-1]


def test_progress_is_tqdm_on_a_terminal_and_lines_elsewhere(capsys):
    from tqdm import tqdm
    from plumbing.progress import Lines, progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    with progress(3, "step", file=Terminal()) as bar:
        assert isinstance(bar, tqdm)
    log = io.StringIO()
    with progress(4, "merge", initial=1, file=log, every=0) as lines:
        assert isinstance(lines, Lines)
        lines.set_postfix(loss="2.5000")
        lines.update(1)
        lines.write("a message")
        lines.update(2)
    shown = log.getvalue().splitlines()
    assert len(shown) == 2 and shown[0].startswith("merge 2/4 (50%), ") and shown[0].endswith(", loss=2.5000")
    assert shown[1].startswith("merge 4/4 (100%), ") and "0 s left" in shown[1]
    assert capsys.readouterr().out == "a message\n"
    quiet = io.StringIO()
    with progress(4, "step", file=quiet, quiet=True) as silent:
        silent.update(4)
    assert quiet.getvalue() == ""


# --- the corpus: one reader, one separator -----------------------------------------------------

def test_a_corpus_is_its_documents_sorted_and_joined_one_way(tmp_path, capsys):
    from plumbing import corpus
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in (("b.txt", "second"), ("a.txt", "first"), ("c.txt", " \n"), ("notes.md", "not text")):
        (folder / name).write_text(text, encoding="utf-8")
    (tmp_path / "one.txt").write_text("third", encoding="utf-8")
    documents = corpus.read_documents([str(folder), str(tmp_path / "one.txt")])
    assert documents == ["first", "second", "third"]
    assert capsys.readouterr().err == f"note: {folder / 'c.txt'} is empty: skipped\n"
    assert corpus.join_documents(documents) == "first\n\nsecond\n\nthird"
    (folder / "a.txt").write_text("")
    (folder / "b.txt").write_text("")
    for paths, message in (([str(folder)], "docs: holds only empty .txt files (3)"),
                           ([str(folder / "c.txt")], "c.txt: is empty"),
                           ([str(tmp_path / "none.txt")], "none.txt: No such file or directory")):
        with pytest.raises(UserError, match=re.escape(message)):
            corpus.read_documents(paths)


def test_one_empty_file_in_a_data_folder_does_not_stop_a_run(tiny_model, corpus, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text(corpus.read_text(encoding="utf-8"), encoding="utf-8")
    (data / "empty.txt").write_text("")
    r = run_train(*train_args(tiny_model, data, tmp_path / "run"))
    assert r.returncode == 0 and r.stderr == f"note: {data / 'empty.txt'} is empty: skipped\n", r.stderr


def test_bpe_train_and_train_py_read_the_same_text(tmp_path):
    """bpe.py --train learns from the documents as train.py reads them: each on its own."""
    import bpe
    from plumbing import corpus
    files = [str(tmp_path / f"{i}.txt") for i in range(6)]
    for i, path in enumerate(files):  # where a document ends is a frequent pair here, if the documents are joined
        with open(path, "w", encoding="utf-8") as f:
            f.write("the cat.\n" if i < 3 else "a dog\n")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bpe.py"), "--train", *files, "--vocab-size", "262",
                        "--out", str(tmp_path / "v"), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = corpus.read_documents(files)
    want = bpe.vocab_files(bpe.train_merges_fast(text, 262 - 257))[1]
    assert want != bpe.vocab_files(bpe.train_merges_fast(corpus.join_documents(corpus.read_documents(files)), 5))[1]
    assert (tmp_path / "v" / "vocab.bpe").read_text(encoding="utf-8") == want


def test_the_split_is_stated_once_the_end_of_the_text_held_out(encoder):
    text = "the cat sat on the mat. " * 40
    train_ids, val_ids = train.text_ids(encoder, text, 0.25, 8)
    cut = len(text) - len(text) // 4
    assert train_ids.tolist() == encoder.encode(text[:cut])
    assert val_ids.tolist() == encoder.encode(text[cut:]) + [encoder.eot]  # the document ends in the held-out part
    with pytest.raises(UserError, match="too short for a context of 200") as e:
        train.text_ids(encoder, text, 0.25, 200)
    assert "too few for a context of 200 in both" in str(e.value)


def test_a_step_and_the_validation_use_the_models_layer_norm_eps():
    """A Hugging Face model whose config sets layer_norm_epsilon (tests/data/hf/inner: 1e-3) trains and is
    validated with that eps, as train.train passes it: not GPT-2's 1e-5."""
    import gpt2_numpy as g
    from plumbing.hf_model import load_hf_folder

    hp, params, _ = load_hf_folder(os.path.join(DATA, "hf", "inner"))
    assert g.layer_norm_eps(hp) == 1e-3
    gpt2s_eps = {k: v for k, v in hp.items() if k != "layer_norm_epsilon"}
    ids = np.random.default_rng(1).integers(0, hp["n_vocab"], 400)
    recipe = train.recipe_with(steps=10, batch_size=2, context=8, lr=1e-3, warmup=0)
    x, y = train.batch(ids, 2, 8, np.random.default_rng([0, 0]))  # the step's batch: seeded by (seed, step)
    want = backward.loss_and_grads(x, y, train.writable_copy(params), hp)[0]
    got = train.train_step(train.writable_copy(params), hp, optimizer.new_adamw_state(params),
                           {"kind": "documents", "rows": ids}, 0, recipe)["loss"]
    assert got == pytest.approx(want, rel=1e-6)
    assert got != pytest.approx(backward.loss_and_grads(x, y, train.writable_copy(params), gpt2s_eps)[0], rel=1e-6)
    val = train.validation_loss(params, hp, ids, 8)
    assert val != pytest.approx(train.validation_loss(params, gpt2s_eps, ids, 8), rel=1e-6)


def test_ctrl_c_in_the_middle_of_a_step_saves_that_step_whole(tiny_model, corpus, tmp_path, monkeypatch):
    """A real SIGINT while step 5 computes its gradients: the step (and its AdamW update, on both cores)
    is finished, then saved, so --resume gives the uninterrupted run's files bit for bit."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job ignores it
    try:
        code, saved_step, stopped = run_interrupted(tiny_model, corpus, tmp_path, monkeypatch, 5,
                                                    lambda: os.kill(os.getpid(), signal.SIGINT))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130
    assert saved_step == 5
    code, differ = resumed_and_straight(tiny_model, corpus, tmp_path, stopped)
    assert code == 0
    assert differ == []
