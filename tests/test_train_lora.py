"""LoRA: the forward (gpt2_numpy.linear with an adapter), its backward (backward.lora_linear_backward)
by float64 finite differences and against torch autograd on PEFT's LoRA (tests/data/lora_golden.npz,
made by tests/data/make_lora_golden.py), PEFT's start, a step that trains the adapters alone, and
train.py --lora-rank end to end: the merged model it writes, PEFT's adapter files beside it, --resume,
the memory it needs, and every bad flag as one line."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import backward
from conftest import DATA, ROOT, in_process, numerical_grad, r64
import gpt2_numpy as g
import optimizer
import parameters
import train
from interface import train_cli
from plumbing import peft_adapter, shapes
from plumbing.checkpoint import load_checkpoint
from plumbing.safetensors_reader import load_file

GOLDEN = np.load(os.path.join(DATA, "lora_golden.npz"))
CASES = ("tiny", "odd")


def golden_adapters(case):
    """The golden's adapters, as train.new_adapters makes them: {"blocks": [{part: {layer: {"lora": {A, B}}}}]}"""
    flat = {k[len(case) + 1:]: GOLDEN[k] for k in GOLDEN.files
            if k.startswith(f"{case}/h") and k.endswith(("/A", "/B"))}
    return shapes.nest(flat, 1 + max(shapes.block_index(k) for k in flat))


# --- the forward and its backward ------------------------------------------------------------

def test_a_lora_linear_adds_the_scaled_low_rank_update():
    """y = x w + b + (alpha / R) (x A) B, in float64 by hand; without an adapter, linear is x w + b."""
    x, w, b = r64(2, 3, 6, seed=1), r64(6, 5, seed=2), r64(5, seed=3)
    A, B = r64(6, 2, seed=4), r64(2, 5, seed=5)
    want = np.einsum("bti,io->bto", x, w) + b + 0.75 * np.einsum("btr,ro->bto", np.einsum("bti,ir->btr", x, A), B)
    got = g.linear(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32),
                   lora={"A": A.astype(np.float32), "B": B.astype(np.float32), "scale": 0.75})
    assert got.dtype == np.float32 and got.shape == (2, 3, 5)
    assert np.allclose(got, want, rtol=0, atol=1e-5), "linear with an adapter is not x w + b + scale (x A) B"
    assert np.allclose(g.lora_update(x, A, B, 0.75), want - (x @ w + b), rtol=0, atol=1e-12)
    assert np.array_equal(g.linear(x, w, b), x @ w + b)


def test_lora_linear_backward_by_finite_differences():
    """dx, dA and dB of sum(dy · linear(x, w, b, lora)) in float64, against central differences."""
    x, w, b = r64(2, 3, 6, seed=1), r64(6, 5, seed=2), r64(5, seed=3)
    lora = {"A": r64(6, 2, seed=4), "B": r64(2, 5, seed=5), "scale": 1.5}
    dy = r64(2, 3, 5, seed=6)

    def f():
        return float((g.linear(x, w, b, lora) * dy).sum())

    dx, grads = backward.lora_linear_backward(x, w, lora, dy)
    assert set(grads) == {"A", "B"}, "a LoRA layer's weights are frozen: only A and B get gradients"
    for name, got, want in (("dx", dx, numerical_grad(f, x)), ("dA", grads["A"], numerical_grad(f, lora["A"])),
                            ("dB", grads["B"], numerical_grad(f, lora["B"]))):
        assert got.shape == want.shape and np.allclose(got, want, rtol=0, atol=1e-6), name


def test_layer_backward_picks_the_form():
    """Trained: linear_backward's dw and db; frozen: dx alone, and an adapter's A and B where it has one."""
    x, w, b, dy = r64(4, 6, seed=1), r64(6, 5, seed=2), r64(5, seed=3), r64(4, 5, seed=4)
    dx, grads = backward.layer_backward(x, {"w": w, "b": b}, dy)
    assert np.allclose(dx, dy @ w.T) and np.allclose(grads["w"], x.T @ dy) and np.allclose(grads["b"], dy.sum(0))
    dx, grads = backward.layer_backward(x, {"w": w, "b": b}, dy, frozen=True)
    assert np.allclose(dx, dy @ w.T) and grads == {}
    lora = {"A": r64(6, 2, seed=5), "B": r64(2, 5, seed=6), "scale": 2.0}
    dx, grads = backward.layer_backward(x, {"w": w, "b": b, "lora": lora}, dy, frozen=True)
    assert set(grads) == {"lora"} and np.allclose(dx, dy @ w.T + 2.0 * dy @ lora["B"].T @ lora["A"].T)


@pytest.mark.parametrize("case", CASES)
def test_every_adapter_gradient_matches_torch(models, case):
    """loss_and_grads(frozen=True) on PEFT's adapters: the loss, and every A's and B's gradient within
    1e-5 of the tensor's largest; nothing else gets a gradient."""
    hp, params = models[case]
    scale = float(GOLDEN[f"{case}/alpha"]) / int(GOLDEN[f"{case}/rank"])
    lora_params = train.with_adapters(params, golden_adapters(case), scale)
    loss, grads = backward.loss_and_grads(GOLDEN[f"{case}/ids"], GOLDEN[f"{case}/targets"], lora_params, hp,
                                          frozen=True)
    assert abs(loss - float(GOLDEN[f"{case}/loss"])) <= 1e-5
    flat = shapes.flatten(grads)
    assert set(flat) == {k[len(f"{case}/grad/"):] for k in GOLDEN.files if k.startswith(f"{case}/grad/")}
    for name, grad in flat.items():
        want = GOLDEN[f"{case}/grad/{name}"]
        assert grad.dtype == np.float32 and grad.shape == want.shape, name
        worst = np.abs(grad - want).max()
        assert worst <= 1e-5 * np.abs(want).max(), f"{name}: {worst:.3g} from torch's (largest {np.abs(want).max():.3g})"


@pytest.mark.parametrize("case", CASES)
def test_the_adapters_start_as_peft_starts_them(models, case):
    """A uniform in ±1/√n_in (PEFT's kaiming_uniform_ with a = √5 gives the same bound), B zero, so the
    model at step 0 is the base model, bit for bit; the same seed gives the same A."""
    hp, params = models[case]
    layers = str(GOLDEN[f"{case}/layers"]).split(",")
    rank = int(GOLDEN[f"{case}/rank"])
    adapters = train.new_adapters(params, rank, layers, seed=0)
    ours = shapes.flatten(adapters)
    assert set(ours) == {k[len(f"{case}/"):] for k in GOLDEN.files if k.startswith(f"{case}/h")}
    assert bool(GOLDEN[f"{case}/init/B_is_zero"])
    for name, a in ours.items():
        if name.endswith("/B"):
            assert not a.any() and a.dtype == np.float32
            continue
        peft_a = GOLDEN[f"{case}/init/{name}"]
        bound = 1 / np.sqrt(a.shape[0])
        assert a.shape == peft_a.shape and a.dtype == np.float32
        for drawn in (a, peft_a):
            assert np.abs(drawn).max() <= bound and np.abs(drawn).max() > 0.5 * bound
    ids = GOLDEN[f"{case}/ids"]
    assert np.array_equal(g.gpt2(ids, train.with_adapters(params, adapters, 2.0), hp),
                          g.gpt2(ids, params, hp))
    again = shapes.flatten(train.new_adapters(params, rank, layers, seed=0))
    assert all(np.array_equal(again[k], ours[k]) for k in ours)


def test_a_lora_step_trains_the_adapters_alone_and_leaves_the_weights_mapped(models):
    hp, params = models["odd"]
    adapters = train.new_adapters(params, 2, ["c_attn", "c_proj"], seed=0)
    lora_params = train.with_adapters(params, adapters, 1.0)
    state = optimizer.new_adamw_state(adapters)
    before = {k: a.copy() for k, a in shapes.flatten(adapters).items()}
    recipe = train.recipe_with(seed=3, accum=2, batch_size=2, context=8, dropout=0.1, grad_clip=0.5, lr=1e-2, warmup=0,
                               steps=10)
    ids = np.random.default_rng(0).integers(0, hp["n_vocab"], 200)
    train.train_step(lora_params, hp, state, {"kind": "documents", "rows": ids}, 0, recipe, {}, adapters)
    assert set(state["m"]) == set(before) == {f"h{i}/{p}/lora/{m}" for i in range(3)
                                              for p in ("attn/c_attn", "attn/c_proj", "mlp/c_proj") for m in "AB"}
    assert all(not np.array_equal(a, before[k]) for k, a in shapes.flatten(adapters).items())
    flat = shapes.flatten(params)
    for name, a in shapes.flatten(lora_params).items():
        if "/lora/" not in name:  # the base weights: the checkpoint's read-only maps themselves
            assert a is flat[name] and not a.flags.writeable, name


def test_the_merged_model_is_the_base_plus_the_adapter(models):
    """merged: w + s A B, whose logits are the unmerged model's within float32 rounding."""
    hp, params = models["odd"]
    adapters = golden_adapters("odd")
    lora_params = train.with_adapters(params, adapters, 3.0)
    merged = train.merged_model(lora_params)
    ids = GOLDEN["odd/ids"]
    a, b = g.gpt2(ids, merged, hp), g.gpt2(ids, lora_params, hp)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
    w, lora = params["blocks"][1]["attn"]["c_attn"]["w"], adapters["blocks"][1]["attn"]["c_attn"]["lora"]
    assert np.allclose(merged["blocks"][1]["attn"]["c_attn"]["w"], w + 3.0 * lora["A"] @ lora["B"], rtol=0, atol=1e-6)
    assert merged["blocks"][1]["mlp"]["c_fc"]["w"] is params["blocks"][1]["mlp"]["c_fc"]["w"]


# --- train.py --lora-rank --------------------------------------------------------------------

def lora_args(model, data, out, *more):
    return ["--model", model, "--data", str(data), "--out", str(out), "--steps", "8", "--batch-size", "2",
            "--context", "16", "--warmup", "2", "--lr", "1e-2", "--eval-every", "4", "--sample-every", "8",
            "--save-every", "4", "--dropout", "0.1", "--quiet", "--lora-rank", "4", "--lora-alpha", "8",
            "--lora-targets", "c_proj,c_attn", *more]


@pytest.fixture(scope="module")
def lora_run(tiny_model, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "run"
    assert train_cli.main(lora_args(tiny_model, corpus, out)) == 0
    return out


def test_a_lora_run_writes_the_merged_model_and_peft_adapter_files(tiny_model, lora_run):
    """OUT is an OpenAI checkpoint like every train.py output; beside it, PEFT's adapter_model.safetensors
    ([R, n_in] and [n_out, R] under PEFT's names) and adapter_config.json; the merged model's logits are
    the base's plus the adapter's, computed unmerged."""
    hp, merged = load_checkpoint(str(lora_run))
    tensors, _ = load_file(str(lora_run / peft_adapter.ADAPTER_FILE))
    n_embd = hp["n_embd"]
    want = {}
    for i in range(hp["n_layer"]):
        for part, layer, n_in, n_out in (("attn", "c_attn", n_embd, 3 * n_embd), ("attn", "c_proj", n_embd, n_embd),
                                         ("mlp", "c_proj", 4 * n_embd, n_embd)):
            prefix = f"base_model.model.transformer.h.{i}.{part}.{layer}"
            want |= {f"{prefix}.lora_A.weight": (4, n_in), f"{prefix}.lora_B.weight": (n_out, 4)}
    assert {k: a.shape for k, a in tensors.items()} == want
    config = json.loads((lora_run / peft_adapter.CONFIG_FILE).read_text())
    assert {k: config[k] for k in ("peft_type", "task_type", "r", "lora_alpha", "target_modules", "fan_in_fan_out",
                                   "base_model_name_or_path", "bias")} == {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "target_modules": ["c_attn", "c_proj"],
        "fan_in_fan_out": True, "base_model_name_or_path": os.path.abspath(tiny_model), "bias": "none"}
    adapters, _ = peft_adapter.read_adapter(str(lora_run))
    _, base = load_checkpoint(tiny_model)
    assert any(a.any() for name, a in shapes.flatten(adapters).items() if name.endswith("/B")), "nothing was trained"
    ids = np.random.default_rng(1).integers(0, hp["n_vocab"], (2, 12))
    unmerged = g.gpt2(ids, train.with_adapters(base, adapters, 8 / 4), hp)
    assert np.abs(g.gpt2(ids, merged, hp) - unmerged).max() <= 1e-5 * np.abs(unmerged).max()
    assert not np.allclose(g.gpt2(ids, base, hp), unmerged, rtol=0, atol=1e-3)
    state = np.load(lora_run / train.STATE_FILE)
    assert sorted(state.files) == sorted(["step"] + [f"{mv}/{k}" for k in shapes.flatten(adapters) for mv in "mv"])


def test_a_lora_run_never_copies_the_weights(tiny_model, corpus, tmp_path, monkeypatch):
    """train.py --lora-rank trains on the checkpoint's read-only maps themselves: no writable copy is made."""
    seen, loop = {}, train.train

    def no_copy(params):
        raise AssertionError("a LoRA run copied the weights (train.writable_copy)")

    def watched(run, *args, **kwargs):
        seen["params"] = run["params"]
        return loop(run, *args, **kwargs)

    monkeypatch.setattr(train, "writable_copy", no_copy)
    monkeypatch.setattr(train, "train", watched)
    assert train_cli.main(lora_args(tiny_model, corpus, tmp_path / "run", "--steps", "2")) == 0
    frozen = {k: a for k, a in shapes.flatten(seen["params"]).items() if "/lora/" not in k}
    assert len(frozen) == 4 + 12 * 2 and all(not a.flags.writeable for a in frozen.values())


def test_gpt2_numpy_runs_the_merged_model(lora_run):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), "--model", str(lora_run), "--n-tokens",
                        "5", "--seed", "0", "--quiet", "the cat"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("the cat") and len(r.stdout) > len("the cat"), r.stderr


def test_ctrl_c_saves_a_lora_run_and_resume_continues_it_bit_for_bit(tiny_model, corpus, tmp_path, monkeypatch):
    """Stopped at step 5 and resumed to 8, a LoRA run writes the very files of a run never stopped: the
    resumed run starts from the base model and the adapter saved in OUT, with their saved moments."""
    norm, calls = optimizer.grad_norm, {"n": 0}

    def norm_then_interrupt(grads):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return norm(grads)

    monkeypatch.setattr(train, "grad_norm", norm_then_interrupt)
    stopped = tmp_path / "stopped"
    assert train_cli.main(lora_args(tiny_model, corpus, stopped)) == 130
    monkeypatch.setattr(train, "grad_norm", norm)
    assert int(np.load(stopped / train.STATE_FILE)["step"]) == 5
    straight = tmp_path / "straight"
    assert train_cli.main(lora_args(tiny_model, corpus, straight)) == 0
    assert train_cli.main(["--out", str(stopped), "--resume", "--quiet"]) == 0
    files = ("model.ckpt.data-00000-of-00001", train.STATE_FILE, peft_adapter.ADAPTER_FILE, peft_adapter.CONFIG_FILE)
    assert [f for f in files if (stopped / f).read_bytes() != (straight / f).read_bytes()] == []


def run_train(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], capture_output=True, text=True,
                          timeout=300)


def test_bad_lora_flags_are_one_line_and_nothing_is_written(tiny_model, corpus, lora_run, tmp_path, capsys):
    base = ["--model", tiny_model, "--data", str(corpus), "--out", str(tmp_path / "o"), "--steps", "1", "--context",
            "16", "--quiet"]
    saved = (lora_run / peft_adapter.ADAPTER_FILE).read_bytes()
    for args, message in [
            (base + ["--lora-rank", "0"], "--lora-rank must be at least 1, got 0"),
            (base + ["--lora-rank", "-2"], "--lora-rank must be at least 1, got -2"),
            (base + ["--lora-rank", "100000"], "--lora-rank 100000 is more than attn.c_attn can hold: an update of "
                                                "that 8 x 24 layer has rank at most 8: choose --lora-rank 8 or less"),
            (base + ["--lora-rank", "2", "--lora-targets", "c_attn,wte"], "--lora-targets: no layer 'wte' to adapt"),
            (base + ["--lora-rank", "2", "--lora-alpha", "0"], "--lora-alpha must be above 0"),
            (base + ["--lora-alpha", "16"], "--lora-alpha and --lora-targets go with --lora-rank"),
            (base + ["--lora-targets", "c_fc"], "--lora-alpha and --lora-targets go with --lora-rank"),
            (["--from-scratch", "--out", str(tmp_path / "o"), "--lora-rank", "2"], "leave out --from-scratch"),
            (["--out", str(lora_run), "--resume", "--steps", "9", "--lora-rank", "2"],
             "--resume continues the run saved in"),
            (["--out", str(lora_run), "--resume", "--steps", "9", "--lora-targets", "c_attn"], "its LoRA flags")]:
        r = in_process(train_cli.main, capsys, *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") \
            and message in r.stderr, (args, r.stderr)
        assert not (tmp_path / "o").exists()
    assert (lora_run / peft_adapter.ADAPTER_FILE).read_bytes() == saved


def test_a_full_run_resumed_with_lora_is_refused(tiny_model, corpus, tmp_path):
    out = tmp_path / "full"
    assert train_cli.main(lora_args(tiny_model, corpus, out)[:-6] + ["--steps", "2"]) == 0
    r = run_train("--out", str(out), "--resume", "--steps", "3", "--lora-rank", "4")
    assert r.returncode == 2 and "which trains every weight, without LoRA: leave out --lora-rank" in r.stderr \
        and r.stderr.count("\n") == 1, r.stderr


# --- memory ------------------------------------------------------------------------------------

def test_lora_fits_1558m_in_24_gb_where_full_fine_tuning_is_refused():
    """The estimate: 4 bytes a frozen weight, 16 an adapter's, the activations (or the save's 4 bytes a
    weight); full fine-tuning's 16 a parameter is refused before anything is allocated."""
    hp = shapes.hparams("1558M")
    size = train.lora_size(hp, 8, ["c_attn"])
    assert size == 48 * 8 * (1600 + 4800)
    n = parameters.count_parameters(hp)["total"]
    assert train.memory_needed(hp, 1, 256, size) == 4 * n + 16 * size + 4 * n
    assert train.memory_needed(hp, 1, 256, size) < 13e9 < 24e9 < train.memory_needed(hp, 1, 256)
    train.check_memory(hp, 1, 256, 24e9, size)
    with pytest.raises(train.UserError, match="training this model .* needs 2[0-9].[0-9] GB"):
        train.check_memory(hp, 1, 256, 24e9)
    with pytest.raises(train.UserError, match="LoRA on this model"):
        train.check_memory(hp, 1, 256, 8e9, size)


def test_a_released_size_is_refused_before_its_download(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(train_cli, "available_memory", lambda: 8e9)
    with pytest.raises(train.UserError, match="LoRA on this model .* needs 1[0-9].[0-9] GB, but 8.0 GB are free"):
        train_cli.run(train_cli.parse_args(["--model", "1558M", "--data", str(corpus), "--out", str(tmp_path / "o"),
                                            "--models-dir", str(tmp_path / "models"), "--lora-rank", "8"]))
    assert not (tmp_path / "models").exists() and not (tmp_path / "o").exists()


def test_a_rank_no_targeted_layer_can_hold_is_refused_before_the_download_and_the_adapters(corpus, tmp_path):
    """1558M's layers are 1,600 wide: rank 1601 is refused from the size's shape alone, nothing fetched; on a
    model, a rank its layers hold is accepted, one above is refused before any adapter is (here: the MLP's c_fc)."""
    args = ["--model", "1558M", "--data", str(corpus), "--out", str(tmp_path / "o"), "--models-dir",
            str(tmp_path / "models"), "--lora-rank", "1601"]
    with pytest.raises(train.UserError, match="--lora-rank 1601 is more than attn.c_attn can hold: an update of "
                                              "that 1600 x 4800 layer has rank at most 1600"):
        train_cli.run(train_cli.parse_args(args))
    assert not (tmp_path / "models").exists() and not (tmp_path / "o").exists()
    hp = {"n_embd": 8, "n_inner": 6, "n_layer": 1}
    train.check_lora_rank(hp, 8, ["c_attn"])
    with pytest.raises(train.UserError, match="mlp.c_fc can hold: an update of that 8 x 6 layer has rank at most 6"):
        train.check_lora_rank(hp, 7, ["c_attn", "c_fc"])


# --- PEFT itself (dev-only) ----------------------------------------------------------------------

DEV_PYTHON = os.environ.get("GPT2_DEV_PYTHON", "")
PEFT_LOGITS = """import sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
from make_hf_golden import hf_model
from peft import PeftModel
base, _ = hf_model("tiny")
model = PeftModel.from_pretrained(base, sys.argv[2]).eval()
with torch.no_grad():
    np.save(sys.argv[3], model(torch.tensor(np.load(sys.argv[4]))).logits.numpy())
"""


@pytest.mark.skipif(not DEV_PYTHON, reason="dev-only: needs a Python with torch, transformers and peft "
                                           "(pip install torch==2.13.0 transformers peft==0.21.2); run "
                                           "GPT2_DEV_PYTHON=/path/to/that/python python -m pytest -q "
                                           "tests/test_train_lora.py -k peft")
def test_peft_loads_the_adapter_and_gives_the_merged_models_logits(lora_run, tmp_path):
    """PeftModel.from_pretrained(GPT2LMHeadModel holding the tiny checkpoint, OUT): PEFT's own LoRA
    forward, unmerged, gives the logits of the merged model that OUT holds."""
    hp, merged = load_checkpoint(str(lora_run))
    ids = np.random.default_rng(2).integers(0, hp["n_vocab"], (2, 10))
    np.save(tmp_path / "ids.npy", ids)
    r = subprocess.run([DEV_PYTHON, "-c", PEFT_LOGITS, DATA, str(lora_run), str(tmp_path / "theirs.npy"),
                        str(tmp_path / "ids.npy")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    theirs, ours = np.load(tmp_path / "theirs.npy"), g.gpt2(ids, merged, hp)
    assert np.abs(theirs - ours).max() <= 1e-4, np.abs(theirs - ours).max()
