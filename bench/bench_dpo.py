"""DPO: a step of train.py against a step of TRL 1.16.0's DPOTrainer, and the memory of DPO with LoRA on 1558M.

    flock /work/bench.lock python bench/bench_dpo.py speed --torch-python /work/ref/bin/python [--rounds 3]
    flock /work/bench.lock python bench/bench_dpo.py memory [--tmp /big/disk]

speed: 124M (random weights: the time does not depend on them), 4 pairs a step, each row 128 tokens
(a 32-token prompt, 96-token completions with their <|endoftext|>), beta 0.1, sigmoid. Each contender
runs --steps steps in a process of its own, round after round, so that drift on a shared machine
hits them all alike; each prints its median step after the first, and the ratios are taken within
each round:
  ours                 train.py's train_step on preference data (the forward and backward of the 8
                       rows, clipping, AdamW), the reference's log-probabilities computed once at the
                       start, as train.py does; "reference" is that forward pass for the 4 pairs, the
                       cost a step would add if it were made every step (printed as "ours + reference")
  TRL                  DPOTrainer.train (GPT2LMHeadModel, sdpa, float32, bf16=False, 2 torch threads):
                       the time from on_step_begin to on_step_end, which holds its reference's forward
                       pass, made every step (precompute_ref_log_probs=False, its default)
  TRL, precomputed     the same with precompute_ref_log_probs=True: the reference once, at the start
The BLAS kernel that ran is printed: OpenBLAS's (OPENBLAS_VERBOSE=2) for NumPy; for torch, the one it
links in (its build settings name it) and threadpoolctl's view of the NumPy beside it.

memory: `python train.py --model <1558M's shape, random> --data <pairs> --lora-rank 8 --batch-size 1
--context 256 --steps 2` and its save, in a process of its own, whose peak RSS (the child's, from
os.wait4) is printed. Its rows are 256 tokens (a 128-token prompt, longer completions cut to fit).
The random 1558M checkpoint (6.2 GB) is written once with train.py's own writer into --tmp.
"""
import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
VOCAB = os.path.join(ROOT, "data", "gpt2-vocab")


def texts(prompt_tokens, completion_tokens, n):
    """n pairs whose prompt is prompt_tokens tokens and whose completions are completion_tokens with
    <|endoftext|> (each word one GPT-2 token, so that the rows are exactly that long)."""
    words = [" hello", " world", " there", " again", " today", " north", " south", " river"]
    return [{"prompt": words[i % 8] * prompt_tokens, "chosen": words[(i + 1) % 8] * (completion_tokens - 1),
             "rejected": words[(i + 2) % 8] * (completion_tokens - 1)} for i in range(n)]


def ours(args):
    import numpy as np

    import bpe
    import dpo
    import optimizer
    import train
    from parameters import init_params
    from plumbing import shapes
    hp = shapes.hparams("124M")
    params, encoder = init_params(hp, 0), bpe.get_encoder(VOCAB)
    pairs = [dpo.pair_ids(encoder, *(p[k] for k in dpo.FIELDS)) for p in texts(32, 96, args.pairs)]
    assert all(len(p) + len(c) == len(p) + len(r) == args.context for p, c, r in pairs)
    times = {"step": [], "reference": []}
    for step in range(args.steps):
        if step < 2:  # its first time, and its second (the median of one)
            t = time.perf_counter()
            ref = dpo.pair_logps(pairs, params, hp, args.context, encoder.eot, args.pairs)
            times["reference"].append(time.perf_counter() - t)
        if step == 0:
            data = {"kind": "preference", "rows": pairs, "ref": ref, "lengths": dpo.pair_lengths(pairs, args.context),
                    "beta": 0.1,
                    "loss_type": "sigmoid", "pad_id": encoder.eot}
            state, recipe = optimizer.new_adamw_state(params), train.recipe_with(  # TRL's rate, 1e-6
                steps=args.steps, batch_size=args.pairs, context=args.context, warmup=0, lr=1e-6)
        t = time.perf_counter()
        train.train_step(params, hp, state, data, step, recipe, {})
        times["step"].append(time.perf_counter() - t)
    assert np.isfinite(ref).all()
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def trl(args, precompute):
    import threadpoolctl
    import torch
    import transformers
    import trl as trl_lib
    from datasets import Dataset
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with open(os.path.join(VOCAB, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(VOCAB, "vocab.bpe"), encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n")[1:] if line]
    tok = transformers.GPT2Tokenizer(vocab=vocab, merges=merges, eos_token="<|endoftext|>",
                                     bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    config = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = "sdpa"
    model = transformers.GPT2LMHeadModel(config)
    times = []

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)

    with tempfile.TemporaryDirectory() as out:
        cfg = trl_lib.DPOConfig(output_dir=out, beta=0.1, max_length=args.context, bf16=False, use_cpu=True,
                                report_to=[], per_device_train_batch_size=args.pairs, max_steps=args.steps,
                                logging_steps=10 ** 6, save_strategy="no", precompute_ref_log_probs=precompute,
                                disable_tqdm=True)
        trainer = trl_lib.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=cfg,
                                     train_dataset=Dataset.from_list(texts(32, 96, args.pairs)), processing_class=tok,
                                     callbacks=[Timer()])
        row = trainer.train_dataset[0]
        assert len(row["prompt_ids"]) + len(row["chosen_ids"]) == args.context, row
        trainer.train()
    blas = [f"{i['internal_api']} {i.get('architecture')}" for i in threadpoolctl.threadpool_info()]
    linked = next((line.strip(" -") for line in torch.__config__.show().splitlines() if "Math Kernel" in line), None)
    blas = [f"torch's own BLAS, linked in: {linked}"] * bool(linked) + [f"beside it (NumPy's): {b}" for b in blas]
    return {"step": statistics.median(times[1:]), "blas": ", ".join(blas)}


CONTENDERS = ("ours", "TRL", "TRL, precomputed")


def run_one(args):
    result = ours(args) if args.contender == "ours" else trl(args, args.contender == "TRL, precomputed")
    print(json.dumps(result))


def speed(args):
    results = {name: [] for name in CONTENDERS}
    kernel = None
    for _ in range(args.rounds):
        for name in CONTENDERS:
            python = sys.executable if name == "ours" else args.torch_python
            cmd = [python, os.path.abspath(__file__), "one", "--contender", name, "--steps", str(args.steps),
                   "--pairs", str(args.pairs), "--context", str(args.context), "--threads", str(args.threads)]
            r = subprocess.run(cmd, env=dict(os.environ, OPENBLAS_VERBOSE="2", TQDM_DISABLE="1"), capture_output=True,
                               text=True)
            if r.returncode:
                sys.exit(f"{name}: {r.stderr.strip()[-1500:]}")
            results[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
            core = re.search(r"Core: (\w+)", r.stderr)
            kernel = core.group(1) if core and name == "ours" else kernel
            print(f"  {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    print(f"124M, {args.pairs} pairs of {args.context} tokens, {args.rounds} rounds of {args.steps} steps, "
          f"{args.threads} threads; medians over the rounds (each round's own median after its first step)")
    print(f"  ours: NumPy's OpenBLAS kernel {kernel}; torch: {results['TRL'][0]['blas']}")
    median = {name: statistics.median(r["step"] for r in runs) for name, runs in results.items()}
    reference = statistics.median(r["reference"] for r in results["ours"])
    for name, value in median.items():
        print(f"  {name:<22}{value:8.2f} s a step")
    print(f"  {'ours + reference':<22}{median['ours'] + reference:8.2f} s a step (reference {reference:.2f} s)")
    for theirs in ("TRL", "TRL, precomputed"):
        ratios = [o["step"] / t["step"] for o, t in zip(results["ours"], results[theirs])]
        print(f"  ours / {theirs}: {statistics.median(ratios):.2f} (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    ratios = [(o["step"] + o["reference"]) / t["step"] for o, t in zip(results["ours"], results["TRL"])]
    print(f"  (ours + reference) / TRL: {statistics.median(ratios):.2f}")


def random_checkpoint(folder, size):
    """A checkpoint of size's shape with GPT-2's initialisation, written by train.py's own writer."""
    if os.path.exists(os.path.join(folder, "model.ckpt.index")):
        return folder
    from parameters import init_params
    from plumbing import shapes
    from plumbing.checkpoint import write_checkpoint
    hp = shapes.hparams(size)
    return write_checkpoint(folder, init_params(hp, 0), hp, vocab_dir=VOCAB)


def memory(args):
    tmp = args.tmp or tempfile.gettempdir()
    model = random_checkpoint(os.path.join(tmp, "dpo-bench-1558M-random"), "1558M")
    with tempfile.TemporaryDirectory(dir=tmp) as work:
        data = os.path.join(work, "pairs.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(p) + "\n" for p in texts(128, 200, args.pairs)))
        cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--model", model, "--data", data, "--out",
               os.path.join(work, "out"), "--lora-rank", "8", "--batch-size", "1", "--context", "256", "--steps",
               str(args.steps), "--val-fraction", "0", "--eval-every", str(args.steps), "--quiet"]
        start = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        out, err = child.stdout.read(), child.stderr.read()
        seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"train.py failed: {err.strip()[-1500:]}")
    print(f"1558M's shape, LoRA rank 8 on c_attn, {args.pairs} pairs, 1 a step (2 rows of 256 tokens), {args.steps} "
          f"steps and the save: peak RSS {usage.ru_maxrss / 1024 ** 2:.2f} GB, {seconds:.0f} s in all")
    print("  " + "\n  ".join(out.strip().splitlines()[:3]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=["speed", "memory", "one"])
    p.add_argument("--torch-python", default="/work/ref/bin/python", help="a Python with torch, transformers and trl")
    p.add_argument("--contender", choices=CONTENDERS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, help="steps a process (speed, default 4) or a run (memory, default 2)")
    p.add_argument("--pairs", type=int, help="pairs a step (speed, default 4) or in the data (memory, default 1)")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tmp", help="memory: where the 6.2 GB checkpoint and the run's output go (default: the system's)")
    args = p.parse_args()
    args.steps = args.steps or (2 if args.part == "memory" else 4)
    args.pairs = args.pairs or (1 if args.part == "memory" else 4)
    {"speed": speed, "memory": memory, "one": run_one}[args.part](args)


if __name__ == "__main__":
    main()
