"""--device gpu on a real GPU, against the CPU: opt-in, since CI has no GPU (tests/test_device.py tests the
same paths on a fake device, everywhere). They run where CuPy is installed and a GPU answers a probe
allocation (pip install -r requirements-gpu.txt; then python -m pytest tests/test_gpu.py), and without
pytest too (python3 tests/test_gpu.py: bench/gpu_check.sh runs them so). TF32 is off (CUPY_TF32=0): exact
float32 products, as the CPU's, with sums in another order.

    logits within 1e-4 of the CPU's largest; every gradient of a step within 1e-4 of its tensor's largest;
    20 fine-tuning steps' losses within 1e-4; 64 greedy tokens the same ids; a run's files written from the
    GPU load on the CPU and give the CPU's numbers; the fused twins equal their plain forms there.

The shapes are small (4 layers, 256 wide, GPT-2's vocabulary), so that the CPU's side stays quick.
"""
import contextlib
import json
import math
import os
import sys
import tempfile
import time

os.environ["CUPY_TF32"] = "0"  # before CuPy loads: exactness is tested with exact float32 products
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import backward  # noqa: E402
import gpt2_numpy as g  # noqa: E402
import optimizer  # noqa: E402
import train  # noqa: E402
from parameters import init_params  # noqa: E402
from plumbing import device, shapes  # noqa: E402
from plumbing.errors import UserError  # noqa: E402

HOW = ("no GPU answered: these run where CuPy is installed and a GPU answers (pip install -r requirements-gpu.txt; "
       "python -m pytest tests/test_gpu.py)")
HP = {"n_vocab": 50257, "n_ctx": 256, "n_embd": 256, "n_head": 4, "n_layer": 4}


def gpu():
    """cupy, if it is installed and a GPU answers; else None."""
    try:
        return device.backend("gpu")
    except UserError:
        return None


try:
    import pytest
    pytestmark = pytest.mark.skipif(gpu() is None, reason=HOW)
except ImportError:  # python3 tests/test_gpu.py, on a machine without pytest
    pytest = None


def models():
    """(params on the host, the same on the GPU, cupy)"""
    cp = gpu()
    params = init_params(HP, seed=0)
    return params, device.to_device(params, cp), cp


WORST = {}  # what each comparison found: its largest error, relative to the largest value (gpu_check.sh prints it)


def within(got, want, tol, what):
    """max |got - want| <= tol · max |want|"""
    got, want = np.asarray(device.host(got), np.float64), np.asarray(want, np.float64)
    error, scale = float(np.abs(got - want).max()), float(np.abs(want).max()) or 1.0
    WORST[what] = max(WORST.get(what, 0.0), error / scale)
    assert error <= tol * scale, f"{what}: off by {error:.3g}, {error / scale:.3g} of its largest {scale:.3g}"


def test_logits_are_the_cpus_within_1e_4_of_their_largest():
    params, on, _ = models()
    ids = np.random.default_rng(0).integers(0, HP["n_vocab"], (2, 200))
    within(g.gpt2(ids, on, HP), g.gpt2(ids, params, HP), 1e-4, "logits")


def test_every_gradient_of_a_step_is_the_cpus_within_1e_4():
    params, on, _ = models()
    ids = np.random.default_rng(1).integers(0, HP["n_vocab"], (4, 129))
    want_loss, want = backward.loss_and_grads(ids[:, :-1], ids[:, 1:], params, HP)
    loss, got = backward.loss_and_grads(ids[:, :-1], ids[:, 1:], on, HP)
    assert abs(loss - want_loss) <= 1e-4 * want_loss
    got, want = shapes.flatten(got), shapes.flatten(want)
    for k in want:
        within(got[k], want[k], 1e-4, f"gradient {k}")


def test_twenty_fine_tuning_steps_lose_what_the_cpus_lose():
    params, on, _ = models()
    on = train.writable_copy(on)
    params = train.writable_copy(params)
    text = np.random.default_rng(2).integers(0, min(1000, HP["n_vocab"]), 20000)  # a thousand ids: learnable
    recipe = train.recipe_with(steps=20, batch_size=4, context=64, lr=3e-4, warmup=2, seed=1)
    losses = []
    for p in (params, on):
        state = optimizer.new_adamw_state(p)
        losses.append([train.train_step(p, HP, state, {"kind": "documents", "rows": text}, step, recipe, {})["loss"]
                       for step in range(20)])
    WORST["20 steps' losses (absolute)"] = max(abs(a - b) for a, b in zip(*losses))
    assert WORST["20 steps' losses (absolute)"] <= 1e-4, f"losses {losses}"


def test_64_greedy_tokens_are_the_cpus():
    params, on, _ = models()
    prompt = [i % HP["n_vocab"] for i in (464, 2068, 7586, 21831, 18045, 625, 262)]
    ids = [np.concatenate(list(g.generate(prompt, p, HP, 64, temperature=0))).tolist() for p in (params, on)]
    assert ids[0] == ids[1]


def test_a_run_written_from_the_gpu_loads_on_the_cpu_with_the_cpus_numbers():
    from interface import train_cli
    data = os.path.join(os.path.dirname(HERE), "data", "tinyshakespeare.txt")
    outs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("cpu", "gpu"):
            outs.append(os.path.join(tmp, name))
            with contextlib.redirect_stdout(sys.stderr):  # stdout is the figures' (python3 tests/test_gpu.py)
                code = train_cli.main(["--from-scratch", "--vocab-size", "257", "--n-layer", "2", "--n-head", "4",
                                       "--n-embd", "128", "--context", "64", "--batch-size", "8", "--steps", "6",
                                       "--warmup", "2", "--eval-every", "3", "--sample-every", "100", "--data", data,
                                       "--out", outs[-1], "--device", name, "--quiet"])
            assert code == 0
        logs = [[json.loads(line) for line in open(os.path.join(o, train.LOG_FILE))] for o in outs]
        for a, b in zip(*logs):
            for k in set(a) & {"loss", "val_loss"}:
                assert abs(a[k] - b[k]) <= 1e-4, (a, b)
        from plumbing.weights import load_weights
        (hp, cpu), (_, gpu_run) = (load_weights(o) for o in outs)
        ids = np.random.default_rng(3).integers(0, 257, (1, 60))
        within(g.gpt2(ids, gpu_run, hp), g.gpt2(ids, cpu, hp), 1e-4, "the saved model's logits")


def test_the_fused_twins_stand_in_on_the_gpu_and_equal_the_plain_forms():
    cp = gpu()
    x = cp.asarray(np.random.default_rng(4).standard_normal((64, 1024)).astype(np.float32) * 4)
    dy = cp.asarray(np.random.default_rng(5).standard_normal((64, 1024)).astype(np.float32))
    fused_backward = device.twin(backward.gelu_backward_fast, cp)
    assert fused_backward is not None
    within(fused_backward(x, dy), device.host(backward.gelu_backward_fast(x, dy)), 1e-5, "gelu_backward's twin")
    p, grad, m, v = (cp.asarray(np.random.default_rng(s).standard_normal(4096).astype(np.float32)) for s in range(4))
    v = abs(v)
    scalars = map(np.float32, (1e-4, 0.9, 0.999, 1e-8, 1e-3 / 0.1, 1 / math.sqrt(0.05), 0.5))  # as adamw_step_fast's
    fused = device.adamw_twin_for(cp)(p, grad, m, v, *scalars)
    p2, m2, v2 = p.copy(), m.copy(), v.copy()
    optimizer.adamw_update_fast(p2, grad * 0.5, m2, v2, cp.empty_like(p2), 1e-3, 1e-4, 0.9, 0.999, 1e-8, 0.1, 0.05)
    for got, want, what in zip(fused, (p2, m2, v2), "pmv"):
        within(got, device.host(want), 1e-6, f"adamw's twin, {what}")


TESTS = [test_logits_are_the_cpus_within_1e_4_of_their_largest, test_every_gradient_of_a_step_is_the_cpus_within_1e_4,
         test_twenty_fine_tuning_steps_lose_what_the_cpus_lose, test_64_greedy_tokens_are_the_cpus,
         test_a_run_written_from_the_gpu_loads_on_the_cpu_with_the_cpus_numbers,
         test_the_fused_twins_stand_in_on_the_gpu_and_equal_the_plain_forms]

if __name__ == "__main__":  # without pytest: each test's outcome and worst error, a JSON line each
    if gpu() is None:
        print(json.dumps({"section": "exactness", "skipped": HOW}), flush=True)
        sys.exit(0)
    failed = 0
    for test in TESTS:
        start = time.perf_counter()
        WORST.clear()
        try:
            test()
            line = {"passed": True}
        except Exception as e:  # one failure does not hide the others
            failed += 1
            line = {"passed": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        print(json.dumps({"section": "exactness", "test": test.__name__, **line, "worst": dict(WORST),
                          "seconds": round(time.perf_counter() - start, 1)}), flush=True)
    sys.exit(1 if failed else 0)
