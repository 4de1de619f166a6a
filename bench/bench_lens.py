"""A tuned lens's training step: lens.py's against tuned-lens 0.2.0's (torch CPU, float32), on the same model and batches.

    flock /work/bench.lock python bench/bench_lens.py --torch-python /work/venvs/lens-ref/bin/python   # 124M's shape
    flock /work/bench.lock python bench/bench_lens.py --n-layer 4 --n-embd 128 --n-vocab 1024 --context 64 --batch-size 8

A step is tuned-lens's train_loop.py's (its autocast to bfloat16 left out: float32 on both sides): the model's
forward pass with every hidden state, each translator's KL to the final distribution backpropagated on its own,
clip_grad_norm_ to 1, SGD with Nesterov momentum. Ours is lens.lens_step. The model is a GPT-2 of the given
shape with transformers' random initialisation, written once as a Hugging Face folder in bench/out/ (both sides
read it); tuned-lens runs in a process of its own (--torch-python: a Python with torch, transformers 4 and
tuned-lens), on --threads threads (torch.set_num_threads; ours: BLAS's, set before NumPy loads). Both take the same
batches of random windows, ours then theirs, --steps times after one warm-up step each; each figure is a median,
and the first step's loss must agree (within 1e-4, relative) or the bench stops.
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


def torch_worker(folder, threads, shape):
    """Under --torch-python: the folder (made here first if it is not there), a zero tuned lens, tuned-lens's SGD;
    then a step on each batch file named on stdin, answering {"seconds", "loss"} a line."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import numpy as np
    import torch
    import transformers
    from tuned_lens import TunedLens

    torch.set_num_threads(threads)
    if not os.path.isdir(folder):
        torch.manual_seed(0)
        n_layer, n_embd, n_vocab, n_ctx = shape
        config = transformers.GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=max(1, n_embd // 64),
                                         vocab_size=n_vocab, n_positions=n_ctx)
        transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    print("ready", flush=True)
    model = transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    lens = TunedLens.from_model(model)
    momentum = 0.9
    opt = torch.optim.SGD(lens.parameters(), lr=1.0 * (1 - momentum), momentum=momentum, nesterov=True,
                          weight_decay=1e-3)  # tuned-lens's ingredients.Optimizer, its defaults
    for line in sys.stdin:
        batch = torch.from_numpy(np.load(line.strip()))
        start = time.perf_counter()
        with torch.no_grad():
            output = model(input_ids=batch, output_hidden_states=True)
        labels = output.logits.float().log_softmax(dim=-1)
        total = 0.0
        for i, h in enumerate(output.hidden_states[:-1]):
            loss = torch.sum(labels.exp() * (labels - lens(h, idx=i).log_softmax(-1)), dim=-1).mean()
            total += loss.item()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(lens.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        print(json.dumps({"seconds": time.perf_counter() - start, "loss": total}), flush=True)


def blas_kernel():
    """OpenBLAS's version and the kernel it chose, asked of the library NumPy loaded (OPENBLAS_CORETYPE forces one)."""
    import ctypes

    path = next((line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line and ".so" in line), None)
    if path is None:
        return "not OpenBLAS"
    lib = ctypes.CDLL(path)
    for prefix in ("scipy_openblas_", "openblas_", ""):
        for end in ("64_", ""):
            core, config = (getattr(lib, f"{prefix}{name}{end}", None) for name in ("get_corename", "get_config"))
            if core is not None and config is not None:
                core.restype = config.restype = ctypes.c_char_p
                return f"{config().decode()} kernel {core().decode()} (OPENBLAS_CORETYPE " \
                       f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')})"
    return "OpenBLAS, its kernel unknown"


def bench(args):
    folder = os.path.join(OUT, f"lens-gpt2-{args.n_layer}x{args.n_embd}-{args.n_vocab}-hf")
    worker = subprocess.Popen([args.torch_python, __file__, "--worker", folder, "--threads", str(args.threads),
                               "--n-layer", str(args.n_layer), "--n-embd", str(args.n_embd), "--n-vocab",
                               str(args.n_vocab), "--context", str(args.context)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "ready", "the torch worker did not start"
    sys.path.insert(0, ROOT)
    import numpy as np

    import lens as LENS
    from plumbing.blas import set_threads
    from plumbing.weights import load_weights

    set_threads(args.threads)
    hparams, params = load_weights(folder)
    lens = LENS.new_lens(hparams["n_layer"], hparams["n_embd"])
    state = LENS.new_momentum(lens)
    rng = np.random.default_rng(0)
    ours, theirs = [], []
    for i in range(args.steps + 1):
        path = os.path.join(OUT, f"lens-batch-{args.n_vocab}-{args.batch_size}x{args.context}-{i}.npy")
        np.save(path, rng.integers(0, args.n_vocab, (args.batch_size, args.context)))
        batch = np.load(path)
        start = time.perf_counter()
        losses = LENS.lens_step(batch, params, hparams, lens, state, 0.1)
        ours.append(time.perf_counter() - start)
        worker.stdin.write(path + "\n")
        worker.stdin.flush()
        answer = json.loads(worker.stdout.readline())
        theirs.append(answer["seconds"])
        if i == 0 and abs(sum(losses) - answer["loss"]) > 1e-4 * max(1.0, abs(answer["loss"])):
            sys.exit(f"the two disagree on the first step's loss: {sum(losses)} against {answer['loss']}")
    worker.stdin.close()
    worker.wait()
    ours, theirs = ours[1:], theirs[1:]  # the first step of each is a warm-up
    a, b = statistics.median(ours), statistics.median(theirs)
    tokens = args.batch_size * args.context
    print(f"a tuned lens's step: {args.n_layer} translators {args.n_embd} wide, a vocabulary of {args.n_vocab:,}, "
          f"{args.batch_size} x {args.context} tokens, {args.threads} threads; BLAS: {blas_kernel()}; load "
          f"{os.getloadavg()[0]:.2f}")
    print(f"  lens.py                  {a:8.3f} s a step  {a / tokens * 1e3:8.3f} ms a token")
    print(f"  tuned-lens (torch CPU)   {b:8.3f} s a step  {b / tokens * 1e3:8.3f} ms a token")
    print(f"  ours / tuned-lens        {statistics.median(x / y for x, y in zip(ours, theirs)):.2f} "
          f"(median of {len(ours)} alternated pairs)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--n-vocab", type=int, default=50257)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--torch-python", default="/work/venvs/lens-ref/bin/python")
    p.add_argument("--worker", metavar="HF_DIR", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return torch_worker(args.worker, args.threads, (args.n_layer, args.n_embd, args.n_vocab,
                                                        max(args.context, 64)))
    os.makedirs(OUT, exist_ok=True)
    return bench(args)


if __name__ == "__main__":
    main()
