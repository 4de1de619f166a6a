"""An SAE's training step: sae.py's against SAELens 6.54.12's (torch CPU), on the same SAE and batches.

    flock /work/bench.lock python bench/bench_sae.py --d-in 768 --d-sae 24576      # GPT-2 small's published width
    flock /work/bench.lock python bench/bench_sae.py --architecture topk --k 32    # or batchtopk, jumprelu
    flock /work/bench.lock python bench/bench_sae.py --d-in 128 --d-sae 2048       # the lesson's size (docs/sae.md)
    python bench/bench_sae.py --gather --model models/baby --site blocks.2.hook_resid_pre

A step is SAELens's trainer's: training_forward_pass (encode, decode, the architecture's losses), backward,
clip_grad_norm_ to 1, Adam. Ours is sae.train_step (standard) or sae.training_step. SAELens runs in a process of
its own (--torch-python: a Python with torch and sae-lens), on --threads threads (torch.set_num_threads; ours: BLAS's); both start from
the same SAELens-initialised SAE (written once to bench/out/) and take the same batches of --batch-tokens
random activations, ours then theirs, --steps times after one warm-up step each; each figure is a median,
and the first step's losses must agree (within 1e-4) or the bench stops.

--gather: the activations of a text gathered at a hook point, the forward pass stopped after the hook's
layer (sae.gather) against the whole forward pass with a hook (look_inside.run_with_cache), median of 5.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "out")


def torch_worker(folder, threads, l1, architecture, k):
    """Under --torch-python: the architecture's training SAE (k for TopK and BatchTopK; the L1 or L0 coefficient
    l1) with the folder's weights, then a step of SAETrainer's on each batch file named on stdin (its dead-latent
    mask all False: no latent has had time to die), answering {"seconds", "mse_loss"} a line."""
    import numpy as np
    import torch
    from sae_lens import SAE
    from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
    from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepInput
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig

    torch.set_num_threads(threads)
    loaded = SAE.load_from_disk(folder)
    shape = dict(d_in=loaded.cfg.d_in, d_sae=loaded.cfg.d_sae)
    sae, coefficients = {
        "standard": lambda: (StandardTrainingSAE(StandardTrainingSAEConfig(**shape, l1_coefficient=l1)), {"l1": l1}),
        "topk": lambda: (TopKTrainingSAE(TopKTrainingSAEConfig(**shape, k=k)), {}),
        "batchtopk": lambda: (BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(**shape, k=k)), {}),
        "jumprelu": lambda: (JumpReLUTrainingSAE(JumpReLUTrainingSAEConfig(**shape, l0_coefficient=l1)), {"l0": l1}),
    }[architecture]()
    sae.load_state_dict(loaded.state_dict(), strict=False)  # the four tensors; a JumpReLU's threshold its own
    optimizer = torch.optim.Adam(sae.parameters(), lr=3e-4, betas=(0.9, 0.999))
    dead = torch.zeros(loaded.cfg.d_sae, dtype=torch.bool)
    for line in sys.stdin:
        x = torch.from_numpy(np.load(line.strip()))
        start = time.perf_counter()
        out = sae.training_forward_pass(TrainStepInput(sae_in=x, coefficients=coefficients, dead_neuron_mask=dead,
                                                       n_training_steps=0, is_logging_step=False))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "mse_loss": out.losses["mse_loss"].item()}), flush=True)


def blas_kernel():
    try:
        from threadpoolctl import threadpool_info
        return ", ".join(f"{i.get('internal_api')} {i.get('architecture')} ({i.get('num_threads')} threads)"
                         for i in threadpool_info() if i.get("user_api") == "blas")
    except ImportError:
        return "unknown (threadpoolctl is not installed)"


def train_bench(args):
    import numpy as np

    sys.path.insert(0, ROOT)
    import sae as S
    from plumbing import sae_files

    folder = os.path.join(OUT, f"sae-{args.d_in}x{args.d_sae}")
    rng = np.random.default_rng(0)
    if not os.path.isdir(folder):
        sae_files.save_sae(folder, S.new_sae(args.d_in, args.d_sae, seed=0, metadata={"hook_name": "bench"}))
    batches = []
    for i in range(args.steps + 1):
        path = os.path.join(OUT, f"batch-{args.d_in}-{args.batch_tokens}-{i}.npy")
        if not os.path.exists(path):
            np.save(path, (rng.standard_normal((args.batch_tokens, args.d_in)) + 0.5).astype(np.float32))
        batches.append(path)
    worker = subprocess.Popen([args.torch_python, __file__, "--worker", folder, "--threads", str(args.threads),
                               "--l1", str(args.l1), "--architecture", args.architecture, "--k", str(args.k)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    settings = {"architecture": args.architecture, **S.TRAINING_DEFAULTS[args.architecture]}
    settings |= {"k": int(args.k) if args.architecture == "topk" else args.k} if "k" in settings else {}
    sae = S.new_training_sae(args.d_in, args.d_sae, settings)  # the shape and the threshold; the folder's weights
    sae.update({k: v for k, v in sae_files.load_sae(folder).items() if k in S.PARAMS})
    state = S.new_training_state(sae)
    ours, theirs = [], []
    for i, path in enumerate(batches):
        x = np.load(path)
        start = time.perf_counter()
        if args.architecture == "standard":
            losses = S.train_step(x, sae, state, 3e-4, args.l1)
        else:
            losses = S.training_step(x, sae, state, 3e-4, settings, args.l1)
        ours.append(time.perf_counter() - start)
        worker.stdin.write(path + "\n")
        worker.stdin.flush()
        answer = json.loads(worker.stdout.readline())
        theirs.append(answer["seconds"])
        if i == 0 and abs(losses["mse_loss"] - answer["mse_loss"]) > 1e-4 * max(1.0, abs(answer["mse_loss"])):
            sys.exit(f"the two disagree on mse_loss: {losses['mse_loss']} against {answer['mse_loss']}")
    worker.stdin.close()
    worker.wait()
    ours, theirs = ours[1:], theirs[1:]  # the first step of each is a warm-up
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"{args.architecture}" + (f" k {args.k:g}" if "k" in settings else "") + f": d_in {args.d_in}, "
          f"d_sae {args.d_sae:,}, {args.batch_tokens:,} tokens a step, {args.threads} threads; "
          f"BLAS: {blas_kernel()}; load {os.getloadavg()[0]:.2f}")
    print(f"  sae.py               {a:8.3f} s a step  {a / args.batch_tokens * 1e6:8.2f} µs a token")
    print(f"  SAELens (torch CPU)  {b:8.3f} s a step  {b / args.batch_tokens * 1e6:8.2f} µs a token")
    print(f"  ours / SAELens       {statistics.median(x / y for x, y in zip(ours, theirs)):.2f} "
          f"(median of {len(ours)} alternated pairs)")


def gather_bench(args):
    import numpy as np

    sys.path.insert(0, ROOT)
    import look_inside
    import sae as S
    from interface.loading import load_model

    encoder, hparams, params = load_model(args.model)
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        rows = S.windows(encoder.encode(f.read(60000)), 64, encoder.eot)[:32]
    stopped, whole = [], []
    for _ in range(5):
        start = time.perf_counter()
        S.gather(rows, params, hparams, args.site)
        stopped.append(time.perf_counter() - start)
        start = time.perf_counter()
        look_inside.run_with_cache(rows, params, hparams, names=[args.site])
        whole.append(time.perf_counter() - start)
    a, b = statistics.median(stopped), statistics.median(whole)
    print(f"{args.model}, {args.site}, {rows.shape[0]} windows of {rows.shape[1]}; load {os.getloadavg()[0]:.2f}")
    print(f"  sae.gather (stopped after the layer)   {a * 1000:8.1f} ms")
    print(f"  run_with_cache (the whole model)       {b * 1000:8.1f} ms   ratio {a / b:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-in", type=int, default=768)
    p.add_argument("--d-sae", type=int, default=24576)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--l1", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--architecture", choices=("standard", "topk", "batchtopk", "jumprelu"), default="standard")
    p.add_argument("--k", type=float, default=32, help="TopK's and BatchTopK's (default 32)")
    p.add_argument("--torch-python", default="/work/venvs/saelens/bin/python")
    p.add_argument("--worker", metavar="SAE_DIR", help=argparse.SUPPRESS)
    p.add_argument("--gather", action="store_true")
    p.add_argument("--model", default="models/baby")
    p.add_argument("--site", default="blocks.2.hook_resid_pre")
    args = p.parse_args()
    if args.worker:
        return torch_worker(args.worker, args.threads, args.l1, args.architecture,
                            int(args.k) if args.architecture == "topk" else args.k)
    os.makedirs(OUT, exist_ok=True)
    return gather_bench(args) if args.gather else train_bench(args)


if __name__ == "__main__":
    main()
