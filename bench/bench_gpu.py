"""The GPU's figures, ours (NumPy's lines on CuPy) beside torch's on the same GPU: one section a call, each a
JSON line on stdout (bench/gpu_check.sh runs every section in a process of its own, with its own time limit,
so that one failure or one slow section loses nothing else, and TF32 is set per process).

    python3 bench/bench_gpu.py env                         the GPU, the driver, CuPy's, torch's, transformers' versions
    python3 bench/bench_gpu.py step 124M [--tf32]          a training step, B=16, T=1024: forward, backward by hand,
                                                           clipping, AdamW (and the same without the fused twins)
    python3 bench/bench_gpu.py torch-step 124M [--tf32]    transformers' GPT2LMHeadModel (sdpa) + torch.optim.AdamW
    python3 bench/bench_gpu.py step 1558M --lora 8 --batch 4   LoRA (rank 8 on c_attn) and full fine-tuning: time
    python3 bench/bench_gpu.py torch-step 1558M ...        and peak device memory, ours and torch's
    python3 bench/bench_gpu.py decode 124M                 batch 1: tokens a second, ours and HF generate's, the
                                                           per-token floor (the step's products alone), prefill of 1,024
    python3 bench/bench_gpu.py scratch                     the README's from-scratch recipe at 124M's shape on
                                                           data/tinyshakespeare.txt: N steps timed, 1,000 extrapolated,
                                                           the loss curve beside the CPU's first steps

--quick: every section's code on tiny shapes, on the fake device (tests/fake_device.py) where CuPy is absent
and on torch's CPU: the plumbing of bench/gpu_check.sh checked anywhere (its times mean nothing).
Weights are random, of the sizes' shapes (nothing is downloaded); TF32 is CuPy's CUPY_TF32 (read when CuPy
loads: set by gpu_check.sh per process) and torch's allow_tf32.
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # fake_device, for --quick

import numpy as np  # noqa: E402

from plumbing import device, shapes  # noqa: E402

QUICK_SHAPES = {"124M": {"n_vocab": 512, "n_ctx": 64, "n_embd": 64, "n_head": 4, "n_layer": 2},
                "1558M": {"n_vocab": 512, "n_ctx": 64, "n_embd": 96, "n_head": 4, "n_layer": 3}}


def emit(**line):
    print(json.dumps(line), flush=True)


def array_module(quick):
    """cupy; with --quick, cupy if a GPU answers, else the fake device."""
    try:
        return device.backend("gpu")
    except Exception:
        if not quick:
            raise
        import fake_device
        fake_device.fuse = fake_device.identity_fuse  # the twins' code paths too
        return fake_device


def sync(xp):
    if hasattr(xp, "cuda") and hasattr(xp.cuda, "Device"):
        xp.cuda.Device().synchronize()


def timed(fn, xp, n, warm=1):
    """fn() warm times (compiling CuPy's kernels, filling its memory pool), then n times: -> seconds each."""
    for _ in range(warm):
        fn()
    sync(xp)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        sync(xp)
        times.append(time.perf_counter() - start)
    return times


def pool_bytes(xp):
    """CuPy's memory pool at its largest so far (freed blocks are kept: its total is the peak reserved)."""
    return int(xp.get_default_memory_pool().total_bytes()) if hasattr(xp, "get_default_memory_pool") and \
        hasattr(xp.get_default_memory_pool(), "total_bytes") else None


def hparams(size, quick):
    return dict(QUICK_SHAPES[size]) if quick else shapes.hparams(size)


def random_params(hp, xp, seed=0):
    """Weights of hp's shapes, made on the device (1558M's on the host would take a minute): GPT-2's scales,
    normal(0, 0.02), ones and zeros for the layer norms and the biases."""
    flat = {}
    gen = xp.random.default_rng(seed)
    for name, shape in shapes.tensor_shapes(hp).items():
        if name.endswith("/g"):
            flat[name] = xp.asarray(np.ones(shape, np.float32))
        elif name.endswith("/b"):
            flat[name] = xp.asarray(np.zeros(shape, np.float32))
        else:
            flat[name] = gen.random(shape, dtype=np.float32) * 0.0693 - 0.0346  # uniform, std 0.02
    return shapes.nest(flat, hp["n_layer"])


# ----------------------------------------------------------------------------
# env
# ----------------------------------------------------------------------------

def env(args):
    line = {"numpy": np.__version__, "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    try:
        line["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True).stdout.strip()
    except OSError:
        pass
    try:
        import cupy
        props = cupy.cuda.runtime.getDeviceProperties(0)
        line |= {"cupy": cupy.__version__, "gpu": props["name"].decode(), "memory_gib": props["totalGlobalMem"] / 2**30,
                 "driver": cupy.cuda.runtime.driverGetVersion(), "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion()}
    except Exception as e:
        line["cupy_error"] = f"{type(e).__name__}: {e}"
    try:
        import torch
        import transformers
        line |= {"torch": torch.__version__, "transformers": transformers.__version__,
                 "torch_cuda": torch.version.cuda, "torch_sees_gpu": torch.cuda.is_available()}
    except Exception as e:
        line["torch_error"] = f"{type(e).__name__}: {e}"
    try:
        line["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    emit(section="env", **line)


# ----------------------------------------------------------------------------
# a training step: ours
# ----------------------------------------------------------------------------

def our_step(args):
    import backward
    import optimizer
    import train
    xp = np if args.cpu else array_module(args.quick)
    hp = hparams(args.size, args.quick)
    B, T = (2, 32) if args.quick else (args.batch, args.context)
    params = random_params(hp, xp)
    lora = args.lora
    if lora:
        adapters = device.to_device(train.new_adapters(params, 2 if args.quick else lora, ["c_attn"], seed=0), xp)
        params = train.with_adapters(params, adapters, 1.0)
    trained = adapters if lora else params
    state, buffers = optimizer.new_adamw_state(trained), {}
    ids = np.random.default_rng(0).integers(0, hp["n_vocab"], (B, T + 1))
    losses = []

    def step():
        loss, grads = backward.loss_and_grads(ids[:, :-1], ids[:, 1:], params, hp, buffers=buffers,
                                              frozen=bool(lora))
        scale = optimizer.clip_scale(optimizer.grad_norm(grads), 1.0)
        optimizer.adamw_step_fast(trained, grads, state, 1e-5, weight_decay=0.1, grad_scale=scale)
        losses.append(loss)

    n = 2 if args.quick else args.steps
    times = timed(step, xp, n, warm=1 if args.cpu else 2)
    line = {"section": "step", "who": "ours, on the CPU" if args.cpu else "ours", "size": args.size, "B": B, "T": T,
            "lora_rank": lora,
            "tf32": os.environ.get("CUPY_TF32", "0"), "step_ms": [round(t * 1e3, 1) for t in times],
            "median_ms": round(statistics.median(times) * 1e3, 1),
            "tokens_per_s": round(B * T / statistics.median(times)), "peak_pool_gib": None,
            "loss": losses[-1]}
    peak = pool_bytes(xp)
    line["peak_pool_gib"] = round(peak / 2**30, 2) if peak is not None else None
    emit(**line)
    if args.parts:  # where the step spends it: the forward alone, the gradients' norm alone and AdamW alone
        fwd = timed(lambda: backward.training_forward(ids[:, :-1], params, hp), xp, n)
        _, grads = backward.loss_and_grads(ids[:, :-1], ids[:, 1:], params, hp, buffers=buffers, frozen=bool(lora))
        adam = timed(lambda: optimizer.adamw_step_fast(trained, grads, state, 1e-5, weight_decay=0.1), xp, n)
        norm = timed(lambda: optimizer.grad_norm(grads), xp, n)
        emit(section="step_parts", who="ours", size=args.size, B=B, T=T, tf32=line["tf32"],
             forward_ms=round(statistics.median(fwd) * 1e3, 1), adamw_ms=round(statistics.median(adam) * 1e3, 1),
             grad_norm_ms=round(statistics.median(norm) * 1e3, 1))
    if args.twins_off:  # what the fused twins buy: the same step with their plain forms, whole-array calls
        device.twin.cache_clear()
        device.adamw_twin_for.cache_clear()
        device.twin = lambda fn, xp: None
        device.adamw_twin_for = lambda xp: None
        plain = timed(step, xp, n, warm=1)
        emit(section="step_without_twins", who="ours", size=args.size, B=B, T=T, tf32=line["tf32"],
             median_ms=round(statistics.median(plain) * 1e3, 1), with_twins_ms=line["median_ms"])


# ----------------------------------------------------------------------------
# a training step: torch's
# ----------------------------------------------------------------------------

def torch_model(hp, quick, tf32):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    dev = "cuda" if torch.cuda.is_available() and not quick else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    config = GPT2Config(vocab_size=hp["n_vocab"], n_positions=hp["n_ctx"], n_embd=hp["n_embd"], n_layer=hp["n_layer"],
                        n_head=hp["n_head"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        attn_implementation="sdpa")
    with torch.device(dev):
        model = GPT2LMHeadModel(config)
    return model, dev


def torch_sync(dev):
    import torch
    if dev == "cuda":
        torch.cuda.synchronize()


def torch_step(args):
    import torch
    hp = hparams(args.size, args.quick)
    B, T = (2, 32) if args.quick else (args.batch, args.context)
    model, dev = torch_model(hp, args.quick, args.tf32)
    model.train()
    if args.lora:  # LoRA by hand (PEFT may be absent): y = c_attn(x) + (x A) B, every weight frozen
        rank = 2 if args.quick else args.lora
        for p in model.parameters():
            p.requires_grad_(False)
        adapters = []
        for block in model.transformer.h:
            C = hp["n_embd"]
            A = torch.nn.Parameter(torch.randn(C, rank, device=dev) / math.sqrt(C))
            Bm = torch.nn.Parameter(torch.full((rank, 3 * C), 1e-3, device=dev))
            adapters += [A, Bm]
            block.attn.c_attn.register_forward_hook(lambda m, inp, out, A=A, Bm=Bm: out + (inp[0] @ A) @ Bm)
        trained = adapters
    else:
        trained = list(model.parameters())
    opt = torch.optim.AdamW(trained, lr=1e-5, weight_decay=0.1)
    ids = torch.as_tensor(np.random.default_rng(0).integers(0, hp["n_vocab"], (B, T)), device=dev)
    losses = []

    def step():
        loss = model(ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))

    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        step()
    torch_sync(dev)
    times = []
    for _ in range(2 if args.quick else args.steps):
        start = time.perf_counter()
        step()
        torch_sync(dev)
        times.append(time.perf_counter() - start)
    line = {"section": "step", "who": "torch eager, transformers GPT2LMHeadModel sdpa + torch.optim.AdamW",
            "size": args.size, "B": B, "T": T, "lora_rank": args.lora, "tf32": int(args.tf32),
            "step_ms": [round(t * 1e3, 1) for t in times], "median_ms": round(statistics.median(times) * 1e3, 1),
            "tokens_per_s": round(B * T / statistics.median(times)), "loss": losses[-1], "device": dev}
    if dev == "cuda":
        line |= {"peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                 "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2)}
    emit(**line)


# ----------------------------------------------------------------------------
# decode and prefill
# ----------------------------------------------------------------------------

def decode(args):
    import gpt2_numpy as g
    xp = array_module(args.quick)
    hp = hparams(args.size, args.quick)
    params = random_params(hp, xp)
    n = 8 if args.quick else args.tokens
    prompt = list(np.random.default_rng(1).integers(0, hp["n_vocab"], 8))
    list(g.generate(prompt, params, hp, 4, temperature=0))  # warm: compiles, fills the pool
    sync(xp)
    start = time.perf_counter()
    ids = list(g.generate(prompt, params, hp, n, temperature=0))
    sync(xp)
    ours = n / (time.perf_counter() - start)
    C = hp["n_embd"]
    x = {n: xp.asarray(np.ones((1, n), np.float32)) for n in (C, 4 * C)}  # a token's input to each layer

    def products():  # a token's products alone (every weight read once): the floor that no overhead adds to
        for block in params["blocks"]:
            for part, layer in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")):
                w = block[part][layer]["w"]
                x[w.shape[0]] @ w
        x[C] @ params["wte"].T

    floor = statistics.median(timed(products, xp, 5 if not args.quick else 1))
    T = min(1024, hp["n_ctx"])
    long = np.random.default_rng(2).integers(0, hp["n_vocab"], (1, T))

    def prefill():
        g.gpt2(long, params, hp, g.new_kv_cache(hp, 1, T, like=params["wte"]), last_only=True)

    pre = statistics.median(timed(prefill, xp, 3 if not args.quick else 1))
    emit(section="decode", who="ours", size=args.size, tokens=n, tokens_per_s=round(ours, 1),
         ms_per_token=round(1e3 / ours, 2), floor_ms_per_token=round(floor * 1e3, 3), prefill_tokens=T,
         prefill_ms=round(pre * 1e3, 1), first_ids=[int(i[0]) for i in ids[:8]])
    del params
    if not args.no_torch:
        torch_decode(args, hp, n, prompt, T)


def torch_decode(args, hp, n, prompt, T):
    try:
        import torch
    except ImportError as e:
        emit(section="decode", who="HF generate", skipped=str(e))
        return
    model, dev = torch_model(hp, args.quick, False)
    model.eval()
    ids = torch.as_tensor([prompt], device=dev)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        torch_sync(dev)
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch_sync(dev)
        theirs = n / (time.perf_counter() - start)
        long = torch.as_tensor(np.random.default_rng(2).integers(0, hp["n_vocab"], (1, T)), device=dev)
        model(long)
        torch_sync(dev)
        times = []
        for _ in range(3 if not args.quick else 1):
            start = time.perf_counter()
            model(long, use_cache=True)
            torch_sync(dev)
            times.append(time.perf_counter() - start)
    emit(section="decode", who="HF generate (greedy, eager, sdpa)", size=args.size,
         tokens=int(out.shape[1] - len(prompt)),
         tokens_per_s=round(theirs, 1), ms_per_token=round(1e3 / theirs, 2), prefill_tokens=T,
         prefill_ms=round(statistics.median(times) * 1e3, 1), device=dev)


# ----------------------------------------------------------------------------
# the from-scratch recipe at 124M's shape
# ----------------------------------------------------------------------------

def scratch(args):
    import train
    xp = array_module(args.quick)
    shape = dict(n_layer=2, n_head=4, n_embd=64) if args.quick else dict(n_layer=12, n_head=12, n_embd=768)
    recipe = train.recipe_with(steps=1000, batch_size=12, context=64, lr=1e-3, warmup=100, min_lr_ratio=0.1,
                               beta2=0.99, seed=0)
    new = {"vocab_size": 257, "tokenizer": None, **shape}
    data = [os.path.join(ROOT, "data", "tinyshakespeare.txt")]
    curves = {}
    for name, module, n in (("gpu", xp, 4 if args.quick else args.steps), ("cpu", np, 2 if args.quick else 3)):
        with tempfile.TemporaryDirectory() as tmp:
            with contextlib.redirect_stdout(sys.stderr):  # set_up's table of parameters: stdout is the figures'
                run = train.set_up(os.path.join(tmp, "out"), recipe, data, new=new, vocab_dir=os.path.join(tmp, "v"),
                                   quiet=True, xp=module)
            losses, times = [], []
            for step in range(n):
                start = time.perf_counter()
                losses.append(train.train_step(run["params"], run["hparams"], run["state"], run["train_data"], step,
                                               recipe, {})["loss"])
                sync(module)
                times.append(time.perf_counter() - start)
        curves[name] = (losses, times)
    losses, times = curves["gpu"]
    per = statistics.median(times[2:] or times)
    emit(section="scratch", recipe="README's from-scratch flags, --vocab-size 257, at 124M's shape (12 layers, 12 "
                                   "heads, 768 wide), B=12 T=64", steps_timed=len(times),
         median_step_ms=round(per * 1e3, 1),
         first_step_ms=round(times[0] * 1e3, 1), extrapolated_1000_steps_s=round(times[0] + 999 * per, 1),
         gpu_losses=[round(x, 4) for x in losses], cpu_losses=[round(x, 4) for x in curves["cpu"][0]],
         cpu_step_ms=[round(t * 1e3) for t in curves["cpu"][1]])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("section", choices=["env", "step", "torch-step", "decode", "scratch"])
    p.add_argument("size", nargs="?", default="124M", choices=["124M", "1558M"])
    p.add_argument("--tf32", action="store_true", help="torch's allow_tf32 (CuPy's is $CUPY_TF32, set before it loads)")
    p.add_argument("--lora", type=int, default=0, help="LoRA's rank on c_attn, every weight frozen (0: full)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5, help="steps timed, after 2 warm-up ones")
    p.add_argument("--tokens", type=int, default=64, help="decode: tokens generated")
    p.add_argument("--parts", action="store_true", help="step: the forward alone and AdamW alone, timed too")
    p.add_argument("--twins-off", action="store_true", help="step: timed again without the fused twins")
    p.add_argument("--no-torch", action="store_true", help="decode: ours alone")
    p.add_argument("--quick", action="store_true", help="tiny shapes, the fake device where no GPU answers")
    p.add_argument("--cpu", action="store_true", help="step: on the CPU (NumPy), for the lesson's other side")
    args = p.parse_args()
    {"env": env, "step": our_step, "torch-step": torch_step, "decode": decode, "scratch": scratch}[args.section](args)


if __name__ == "__main__":
    main()
