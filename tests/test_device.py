"""--device gpu, tested without a GPU: the fake device (tests/fake_device.py) answers NumPy's calls as a CuPy
array does, refuses what CuPy refuses (an implicit copy to the host, a host array in a device call), and
counts calls and copies. On it the forward pass, generation, scoring, a training step (full and LoRA), a DPO
step and an SAE step run on "the device" and give the CPU's numbers; the CPU's chunked loops run as one call
each. The real GPU's exactness is tests/test_gpu.py's (opt-in)."""
import ast
import glob
import json
import math
import os
import sys
import types

import numpy as np
import pytest

import fake_device as fake
from conftest import ROOT, in_process
import backward
import dpo
import gpt2_numpy as g
import optimizer
import sae as S
import train
from plumbing import device, shapes
from plumbing.errors import UserError


def assert_close(got, want, tol=1e-6):
    got = device.host(got)
    assert type(got) is type(want) or np.isscalar(want)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def assert_trees_close(got, want, tol=1e-6):
    got, want = shapes.flatten(device.to_host(got)), shapes.flatten(want)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=tol, atol=tol, err_msg=k)


@pytest.fixture
def fused(monkeypatch):
    """The fake device with cupy.fuse's stand-in: the fused twins stand in for their plain forms."""
    monkeypatch.setattr(fake, "fuse", fake.identity_fuse, raising=False)
    device.twin.cache_clear(), device.adamw_twin_for.cache_clear()
    yield
    device.twin.cache_clear(), device.adamw_twin_for.cache_clear()


@pytest.fixture
def odd(models):
    hp, params = models["odd"]
    fake.COUNTS.clear()
    return hp, train.writable_copy(params), device.to_device(params, fake)


def test_the_forward_pass_and_scoring_on_the_device_give_the_cpus(odd):
    hp, params, on = odd
    ids = np.random.default_rng(0).integers(0, hp["n_vocab"], (2, 20))
    logits = g.gpt2(ids, on, hp)
    assert isinstance(logits, fake.FakeArray) and fake.COUNTS["to_host"] == 0
    got, want = g.score(ids[0], on, hp), g.score(ids[0], params, hp)
    assert isinstance(got[0], np.ndarray) and fake.COUNTS["to_host"] == 1  # the log-probabilities, once
    assert_close(logits, g.gpt2(ids, params, hp))
    assert_close(got[0], want[0]) and got[1] == pytest.approx(want[1], rel=1e-6)


@pytest.mark.parametrize("settings", [dict(temperature=0), dict(temperature=0.8, top_k=20, top_p=0.9, seed=3,
                                                                  n_samples=2, repetition_penalty=1.3)])
def test_generation_on_the_device_draws_what_the_cpu_draws(odd, settings):
    """The logits come to the host once a step, where NumPy's generator draws: the same seed, the same ids."""
    hp, params, on = odd
    got = np.array(list(g.generate([5, 7, 11], on, hp, 12, **settings)))
    assert np.array_equal(got, np.array(list(g.generate([5, 7, 11], params, hp, 12, **settings))))
    assert fake.COUNTS["to_host"] == 12


def step_on(params, hp, recipe, adapters=None):
    ids = np.random.default_rng(1).integers(0, hp["n_vocab"], 300)
    state = optimizer.new_adamw_state(adapters if adapters is not None else params)
    metrics = train.train_step(params, hp, state, {"kind": "documents", "rows": ids}, 2, recipe, {}, adapters)
    return metrics, state


RECIPE = train.recipe_with(seed=3, batch_size=2, context=12, dropout=0.0, grad_clip=0.5, lr=1e-3, warmup=0, steps=10)


def test_a_training_step_on_the_device_gives_the_cpus(odd):
    hp, params, on = odd
    got, state = step_on(on, hp, RECIPE)
    assert fake.COUNTS["to_host"] == 0 and fake.COUNTS["scalar_reads"] < 50  # the loss, the norm's parts
    want, want_state = step_on(params, hp, RECIPE)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
    assert_trees_close(on, params)
    for moment in ("m", "v"):
        for k, a in want_state[moment].items():
            assert_close(state[moment][k], a)
    assert all(isinstance(a, fake.FakeArray) for a in shapes.flatten(on).values())


def test_a_lora_step_on_the_device_gives_the_cpus(odd):
    hp, params, on = odd
    adapters = train.new_adapters(params, 2, ["c_attn", "c_proj"], seed=0)
    for a in shapes.flatten(adapters).values():  # B = 0 would make the step's gradients of A zero
        a += 0.01
    on_adapters = device.to_device(adapters, fake)
    got, _ = step_on(train.with_adapters(on, on_adapters, 2.0), hp, RECIPE, on_adapters)
    want, _ = step_on(train.with_adapters(params, adapters, 2.0), hp, RECIPE, adapters)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
    assert_trees_close(on_adapters, adapters)


def test_a_dpo_step_on_the_device_gives_the_cpus(odd):
    hp, params, on = odd
    rng = np.random.default_rng(2)
    pairs = [(rng.integers(0, 96, 4).tolist(), rng.integers(0, 96, 5).tolist(), rng.integers(0, 96, 3).tolist())
             for _ in range(2)]
    ids, mask = dpo.pair_batch(pairs, 16, 0)
    ref = dpo.completion_logps(ids, mask, on, hp) - 0.1
    assert isinstance(ref, np.ndarray)
    np.testing.assert_allclose(ref, dpo.completion_logps(ids, mask, params, hp) - 0.1, rtol=1e-6)
    got = dpo.loss_and_grads(ids, mask, ref, on, hp, 0.1)
    want = dpo.loss_and_grads(ids, mask, ref, params, hp, 0.1)
    assert got[0] == pytest.approx(want[0], rel=1e-6)
    assert_trees_close(got[1], want[1], tol=1e-5)


def test_an_sae_step_on_the_device_gives_the_cpus(odd):
    hp, params, on = odd
    ids = np.random.default_rng(3).integers(0, hp["n_vocab"], (2, 16))
    x = S.gather(ids, on, hp, "blocks.1.hook_resid_pre")
    assert isinstance(x, fake.FakeArray)
    x_host = S.gather(ids, params, hp, "blocks.1.hook_resid_pre")
    assert_close(x, x_host)
    sae, on_sae = S.new_sae(48, 96, seed=0), device.to_device(S.new_sae(48, 96, seed=0), fake)
    state, on_state = S.new_adam_state(sae), S.new_adam_state(on_sae)
    for step in range(2):
        got = S.train_step(x.reshape(-1, 48), on_sae, on_state, 1e-3, 0.5)
        want = S.train_step(x_host.reshape(-1, 48), sae, state, 1e-3, 0.5)
    assert got == pytest.approx(want, rel=1e-5)
    for k in S.PARAMS:
        assert_close(on_sae[k], sae[k], tol=1e-5)


def counted_step(hp, on, batch_size, context):
    fake.COUNTS.clear()
    step_on(on, hp, RECIPE | {"batch_size": batch_size, "context": context})
    return fake.COUNTS["calls"]


def test_the_cpus_chunks_are_one_call_each_on_the_device(odd):
    """The calls a step makes do not grow with its rows: cross_entropy_fast's LOGIT_ROWS, in_chunks' rows and
    AdamW's CHUNK are the CPU's loops; on a device each is one call (a kernel launch, not one a chunk)."""
    hp, params, on = odd
    assert counted_step(hp, on, 1, 8) == counted_step(hp, on, 4, 30) > 0
    small, large = ({"blocks": [], "wte": fake.asarray(np.ones(n, np.float32))} for n in (100, 5 * (1 << 16) + 3))
    calls = []
    for p in (small, large):
        grads, state = {"blocks": [], "wte": p["wte"] * 0.5}, optimizer.new_adamw_state(p)
        fake.COUNTS.clear()
        optimizer.adamw_step_fast(p, grads, state, 1e-3, weight_decay=0.1, grad_scale=0.5)
        calls.append(fake.COUNTS["calls"])
    assert calls[0] == calls[1]
    on_host = {"blocks": [], "wte": np.ones(large["wte"].size, np.float32)}  # every element stepped, not a chunk
    optimizer.adamw_step_fast(on_host, {"blocks": [], "wte": on_host["wte"] * 0.5},
                              optimizer.new_adamw_state(on_host), 1e-3, weight_decay=0.1, grad_scale=0.5)
    assert_close(large["wte"], on_host["wte"], tol=0)


def test_dropout_on_the_device_draws_its_own_masks_the_same_for_the_same_seed(odd):
    hp, params, on = odd
    recipe = RECIPE | {"dropout": 0.1}
    again = device.to_device(params, fake)
    a, _ = step_on(on, hp, recipe)
    b, _ = step_on(again, hp, recipe)
    c, _ = step_on(params, hp, recipe)
    assert a["loss"] == b["loss"] != c["loss"]
    assert_trees_close(on, shapes.map_tensors(device.host, again), tol=0)


def test_the_fused_twins_compute_what_their_plain_forms_compute():
    x, dy = (np.random.default_rng(s).standard_normal((4, 300)).astype(np.float32) * 4 for s in (0, 1))
    x[0, :3] = -100.0, 100.0, 0.0  # exp(-2y) = inf: the derivative's limit, 0, as gelu_backward_fast's
    with np.errstate(over="ignore"):  # as gelu_backward_fast's: a GPU's exp gives inf without a word
        np.testing.assert_allclose(device.gelu_backward_twin(x, dy, np.exp), backward.gelu_backward_fast(x, dy),
                                   rtol=2e-5, atol=1e-6)
    p, grad, m, v = (np.random.default_rng(s).standard_normal(1000).astype(np.float32) for s in range(4))
    v = np.abs(v)
    lr, decay, beta1, beta2, eps, t = 1e-3, 1e-4, 0.9, 0.95, 1e-8, 7
    c1, c2 = 1 - beta1 ** t, 1 - beta2 ** t
    new_p, new_m, new_v = device.adamw_twin(p, grad, m, v, decay, beta1, beta2, eps, lr / c1, 1 / math.sqrt(c2),
                                            0.5, np.sqrt)
    p, m, v = p.copy(), m.copy(), v.copy()
    optimizer.adamw_update_fast(p, grad * np.float32(0.5), m, v, np.empty_like(p), lr, decay, beta1, beta2, eps, c1, c2)
    for got, want in ((new_p, p), (new_m, m), (new_v, v)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def test_with_the_fused_twins_a_step_stays_within_a_hair_of_the_cpus(odd, fused):
    """The twins' sums are written in another order: not bit for bit, but within 1e-4 after AdamW (which
    divides by √v: a gradient near zero magnifies any difference), as the GPU's tests ask."""
    hp, params, on = odd
    step_on(on, hp, RECIPE)
    step_on(params, hp, RECIPE)
    assert_trees_close(on, params, tol=1e-4)


def test_a_twin_stands_in_only_for_the_function_it_twins(fused):
    """In a handout gelu_backward_fast may be the student's: the fused twin then does not replace it."""
    assert device.twin(backward.gelu_backward_fast, fake) is not None and device.twin(g.gelu_fast, fake) is None
    assert device.twin(backward.gelu_backward_fast, np) is None

    def gelu_backward_fast(x, dy):  # a student's, wrong
        return dy

    assert device.twin(gelu_backward_fast, fake) is None
    assert device.twin(g.softmax, fake) is None


def test_the_device_asked_for_and_what_is_missing(monkeypatch):
    assert device.chosen(None) == "cpu" and device.chosen("gpu") == "gpu"
    monkeypatch.setenv(device.DEVICE_ENV, "gpu")
    assert device.chosen(None) == "gpu" and device.chosen("cpu") == "cpu"
    monkeypatch.setenv(device.DEVICE_ENV, "tpu")
    with pytest.raises(UserError, match=r"\$GPT2_DEVICE must be one of cpu, gpu, got 'tpu'"):
        device.chosen(None)
    assert device.backend("cpu") is np
    monkeypatch.setitem(sys.modules, "cupy", None)  # not installed
    with pytest.raises(UserError, match="--device gpu needs CuPy, which is not installed.*requirements-gpu.txt"):
        device.backend("gpu")

    def no_gpu(*args):
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version")

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(zeros=no_gpu))
    with pytest.raises(UserError, match="CuPy is installed but no GPU answers.*InsufficientDriver"):
        device.backend("gpu")


def test_a_model_larger_than_the_free_memory_is_refused_before_loading(monkeypatch):
    monkeypatch.setattr(fake, "FREE", [3 * 2 ** 30])
    device.check_fits(fake, 2 * 2 ** 30, "loading 124M")
    with pytest.raises(UserError, match=r"loading 124M needs 6.4 GB on the GPU, but 3.2 GB are free there"):
        device.check_fits(fake, 6 * 2 ** 30, "loading 124M")
    device.check_fits(np, 10 ** 15, "anything")  # the host's memory is plumbing/memory.py's


def test_files_from_a_device_run_are_the_hosts(odd, tmp_path):
    """A run on the device saves through the host: the checkpoint loads on the CPU with the same numbers."""
    hp, params, on = odd
    step_on(on, hp, RECIPE)
    from plumbing.checkpoint import load_checkpoint, write_checkpoint
    folder = write_checkpoint(str(tmp_path / "m"), device.to_host(on), hp)
    _, back = load_checkpoint(folder)
    assert_trees_close(on, shapes.map_tensors(np.asarray, back), tol=0)


@pytest.mark.parametrize("flag, env", [(["--device", "tpu"], {}), ([], {"GPT2_DEVICE": "tpu"}),
                                       (["--device", "gpu"], {"cupy": None})])
def test_the_commands_say_what_is_wrong_with_the_device_in_one_line(capsys, monkeypatch, flag, env):
    from interface import gpt2_cli
    for name, value in env.items():
        if name == "cupy":
            monkeypatch.setitem(sys.modules, "cupy", value)
        else:
            monkeypatch.setenv(name, value)
    r = in_process(gpt2_cli.main, capsys, *flag, "--model", "/nonexistent/model", "hello")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert ("tpu" in r.stderr or "CuPy" in r.stderr) and "nonexistent" not in r.stderr  # before any work


def test_only_plumbing_device_imports_cupy():
    for path in glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "*", "*.py")):
        if os.path.relpath(path, ROOT).startswith(("tests", "bench")):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(n.split(".")[0] in ("cupy", "cupyx") for n in names), path
    with open(os.path.join(ROOT, "plumbing", "device.py"), encoding="utf-8") as f:
        assert 'importlib.import_module("cupy")' in f.read()


@pytest.fixture
def fake_gpu(monkeypatch):
    """--device gpu answered by the fake device (no CuPy needed): the commands run on it end to end."""
    real = device.backend
    monkeypatch.setattr(device, "backend", lambda name="cpu": fake if device.chosen(name) == "gpu" else real(name))


@pytest.mark.parametrize("flags", [["--seed", "3", "--n-tokens", "5", "--top-k", "5"], ["--trace"], ["--lens"],
                                   ["--num-beams", "2", "--n-tokens", "4"], ["--draft", "lookup", "--greedy"]])
def test_gpt2_numpy_py_prints_the_same_on_the_device(tiny_model, capsys, fake_gpu, flags):
    from interface import gpt2_cli
    runs = [in_process(gpt2_cli.main, capsys, "--device", name, "--model", tiny_model, "--quiet", *flags,
                       "Hello world, the cat") for name in ("cpu", "gpu")]
    assert runs[0].returncode == runs[1].returncode == 0, runs[1].stderr
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout


@pytest.mark.parametrize("more", [[], ["--lora-rank", "2"], ["--data", os.path.join(ROOT, "data", "preferences.jsonl"),
                                                              "--context", "64", "--batch-size", "2"]])
def test_train_py_on_the_device_logs_and_saves_what_the_cpu_does(tiny_model, corpus, tmp_path, capsys, fake_gpu, more):
    """The run's losses are the CPU's, and what it saves (through the host) is the CPU's checkpoint."""
    from conftest import train_args
    from interface import train_cli
    from plumbing.checkpoint import load_checkpoint
    logs, weights = [], []
    for name in ("cpu", "gpu"):
        out = tmp_path / name
        r = in_process(train_cli.main, capsys, *train_args(tiny_model, corpus, out, "--steps", "4", "--device", name,
                                                            *more))
        assert r.returncode == 0, r.stderr
        logs.append([line["loss"] for line in map(__import__("json").loads, open(out / train.LOG_FILE))
                     if "loss" in line])  # the steps' (a validation line has val_loss)
        weights.append(shapes.flatten(load_checkpoint(str(out))[1]))
    assert len(logs[0]) == 4 and logs[0] == pytest.approx(logs[1], rel=1e-6)
    for k, a in weights[0].items():
        np.testing.assert_allclose(weights[1][k], a, rtol=1e-5, atol=1e-6, err_msg=k)


HF_TINY = os.path.join(ROOT, "tests", "data", "hf", "tiny")
IOI = ["--clean", "When Mary and John went to the store, John gave a drink to", "--corrupted",
       "When Mary and John went to the store, Mary gave a drink to", "--answer", " Mary", "--wrong", " John"]
SAE_DIR = os.path.join(ROOT, "tests", "data", "sae_golden", "sae")
LENS_DIR = os.path.join(ROOT, "tests", "data", "lens", "tiny")


@pytest.mark.parametrize("command, argv", [
    ("evaluate", ["lambada", os.path.join(ROOT, "tests", "data", "eval", "lambada.jsonl")]),
    ("gpt2", ["--score", "x y z"]),
    ("circuits", ["patch", *IOI, "--site", "head"]), ("circuits", ["dla", *IOI[:2], *IOI[4:]]),
    ("circuits", ["attribution", *IOI]),
    ("sae", ["eval", "--sae", SAE_DIR, "--data", "TEXT"]),
    ("steer", ["add", "I hate you because", "--add", "Love", "--sub", "Hate", "--layer", "1", "--coeff", "3",
               "--n-tokens", "6", "--greedy"]),
    ("steer", ["vector", "I think", "--positive", "I love it", "--negative", "I hate it", "--layer", "0",
               "--n-tokens", "6", "--no-kv-cache", "--seed", "3"]),
    ("steer", ["latent", "The weather", "--sae", SAE_DIR, "--latent", "3", "--alpha", "40", "--n-tokens", "6",
               "--greedy"]),
    ("sae", ["train", "--site", "blocks.1.hook_resid_pre", "--data", "TEXT", "--d-sae", "16", "--l1", "1", "--tokens",
             "128", "--batch-tokens", "64", "--out", "OUT"]),
    ("lens", ["read", "Before we proceed any further", "--tuned-lens", LENS_DIR]),
    ("lens", ["train", "--data", "TEXT", "--out", "OUT", "--steps", "2", "--batch-size", "2", "--context", "8"]),
    ("lens", ["probe", "--data", "LABELLED", "--site", "blocks.1.hook_resid_pre", "--position", "mean", "--method",
              "logistic", "--out", "OUT"])])
def test_the_other_commands_print_the_same_on_the_device(tmp_path, capsys, fake_gpu, command, argv):
    from interface import circuits_cli, evaluate_cli, gpt2_cli, lens_cli, sae_cli, steer_cli
    main = {"evaluate": evaluate_cli.main, "circuits": circuits_cli.main, "sae": sae_cli.main,
            "gpt2": gpt2_cli.main, "steer": steer_cli.main, "lens": lens_cli.main}[command]
    (tmp_path / "t.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 6)
    (tmp_path / "l.jsonl").write_text("".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(
        ["I love it", "I hate it", "What a joy", "What a mess", "So kind", "So cruel"])))
    files = {"TEXT": str(tmp_path / "t.txt"), "LABELLED": str(tmp_path / "l.jsonl")}
    runs = []
    for name in ("cpu", "gpu"):
        given = [files.get(a, str(tmp_path / name) if a == "OUT" else a) for a in argv]
        runs.append(in_process(main, capsys, *given, "--model", HF_TINY, "--device", name, "--json", "--quiet"))
    assert runs[0].returncode == runs[1].returncode == 0, runs[1].stderr
    assert runs[0].stdout.replace(str(tmp_path / "cpu"), "OUT") == runs[1].stdout.replace(str(tmp_path / "gpu"), "OUT")


def test_a_classifier_trains_and_labels_on_the_device_as_on_the_cpu(tiny_model, tmp_path, capsys, fake_gpu):
    from conftest import train_args
    from interface import evaluate_cli, gpt2_cli, train_cli
    words = ["good fine great", "bad awful poor"]
    lines = [{"text": f"{words[i % 2]} {i}", "label": ["pos", "neg"][i % 2]} for i in range(12)]
    data = tmp_path / "l.jsonl"
    data.write_text("".join(__import__("json").dumps(line) + "\n" for line in lines))
    outs = []
    for name in ("cpu", "gpu"):
        args = train_args(tiny_model, data, tmp_path / name, "--steps", "3", "--device", name)
        r = in_process(train_cli.main, capsys, *args)
        assert r.returncode == 0, r.stderr
        runs = [in_process(gpt2_cli.main, capsys, "--model", tmp_path / name, "--device", device_name, "--json",
                           "good fine") for device_name in ("cpu", "gpu")]
        assert runs[0].stdout == runs[1].stdout and runs[0].returncode == 0
        outs.append(runs[0].stdout)
        runs = [in_process(evaluate_cli.main, capsys, "classify", data, "--model", tmp_path / name, "--device",
                           device_name, "--json", "--quiet") for device_name in ("cpu", "gpu")]
        assert runs[0].stdout == runs[1].stdout and runs[0].returncode == 0, runs[1].stderr
    got, want = (__import__("json").loads(o)["logits"] for o in outs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ctrl_c_in_a_device_run_saves_the_steps_done_through_the_host(tiny_model, corpus, tmp_path, capsys, fake_gpu,
                                                                      monkeypatch):
    from conftest import train_args
    from interface import train_cli
    from plumbing.checkpoint import load_checkpoint
    real_step = train.train_step

    def stopped_at_the_third(*args, **kwargs):
        if args[4] == 2:
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train, "train_step", stopped_at_the_third)
    r = in_process(train_cli.main, capsys, *train_args(tiny_model, corpus, tmp_path / "o", "--device", "gpu"))
    assert r.returncode == 130 and "interrupted: saved step 2" in r.stderr, r.stderr
    assert isinstance(load_checkpoint(str(tmp_path / "o"))[1]["wte"], np.ndarray)
