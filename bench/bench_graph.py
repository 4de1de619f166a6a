"""An attribution graph's speed: tracing.attribution_graph against circuit-tracer 0.5.0's attribute(), on the same
weights, the same CPU and the same threads (issue 53 §6).

    flock /work/bench.lock python bench/bench_graph.py --torch-python /work/venvs/graph-ct/bin/python
        [--threads 2] [--repeats 3] [--l0 32] [--max-features N] [--batch-size 512]

The model is random:124M (bench_speculative's: 124M's shape with GPT-2's initialisation, bench/out/124M-random-init/),
12 layers of random ReLU transcoders of 24,576 latents each (bench/out/graph-transcoders/<l>/, SAELens folders
written once: W_enc with unit columns, W_dec rows of norm 0.1, b_enc set so that on the prompt --l0 latents fire a
position on average), and a 20-token prompt (the held-out Shakespeare's first 20 ids), <|endoftext|> first.
circuit-tracer runs in a process of its own (--torch-python: a Python with circuit-tracer 0.5.0, torch), its
TransformerLensReplacementModel built from the same weights (no processing) and transcoders, float32, on CPU.
The two take turns, ours then circuit-tracer's, --repeats times after one warm-up round each; each figure is the
median of the graph's own time (attribute() or attribution_graph(), the model and transcoders loaded before), with
the machine's load (uptime's 1-minute average) when it began, and the process's peak memory. The bench checks that
the two adjacency matrices agree (within 1e-4 of the largest) and prints the dense adjacency's size.
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]
TC_DIR = os.path.join(HERE, "out", "graph-transcoders")
D_TC, N_TOKENS = 24_576, 20


def load():
    return float(open("/proc/loadavg").read().split()[0])


def peak_rss_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def prompt(encoder):
    from bench_speculative import prompt_ids

    return [encoder.eot] + prompt_ids(encoder, N_TOKENS)


def make_transcoders(folder, l0):
    """Random ReLU transcoders, one a layer, written once: b_enc puts each layer's threshold where about l0 of the
    24,576 fire a position on the prompt."""
    import numpy as np

    import gpt2_numpy as g
    from interface import loading
    from plumbing.sae_files import save_sae

    encoder, hp, params = loading.load_model(folder)
    ids = np.array(prompt(encoder))
    C, rng = hp["n_embd"], np.random.default_rng(0)
    mlp_in = {}

    def keep(name, x):
        if name.endswith(".ln_2"):
            mlp_in[name] = x[0]
        return x

    g.gpt2(ids[None], params, hp, hook=keep)
    os.makedirs(TC_DIR, exist_ok=True)
    for l in range(hp["n_layer"]):
        W_enc = rng.standard_normal((C, D_TC), dtype=np.float32)
        W_enc /= np.linalg.norm(W_enc, axis=0)
        ranked = np.sort((mlp_in[f"h{l}.ln_2"][1:] @ W_enc).ravel())  # [(T-1)·d]
        near = np.arange(len(ranked) - l0 * (N_TOKENS - 1) - 50, len(ranked) - l0 * (N_TOKENS - 1) + 50)
        at = near[np.argmax(ranked[near + 1] - ranked[near])]  # about l0 a position above: in the widest gap
        cut = (ranked[at] + ranked[at + 1]) / 2  # near there, so that float32's rounding decides no feature
        W_dec = rng.standard_normal((D_TC, C), dtype=np.float32)
        W_dec *= 0.1 / np.linalg.norm(W_dec, axis=1, keepdims=True)
        sae = {"W_enc": W_enc, "b_enc": np.full(D_TC, -cut, np.float32), "W_dec": W_dec,
               "b_dec": (rng.standard_normal(C) * 0.01).astype(np.float32),
               "cfg": {"d_in": C, "d_sae": D_TC, "d_out": C, "architecture": "transcoder", "apply_b_dec_to_input": False,
                       "metadata": {"hook_name": f"blocks.{l}.ln2.hook_normalized",
                                    "hook_name_out": f"blocks.{l}.hook_mlp_out", "model_name": "random:124M"}}}
        save_sae(os.path.join(TC_DIR, str(l)), sae)


def ours(args):
    """One process: load, then time attribution_graph each line of stdin asks for; answer a JSON line each."""
    import numpy as np

    from interface import loading
    import tracing

    encoder, hp, params = loading.load_model(args.folder)
    tcs = tracing.per_layer_transcoders([loading.load_sae(os.path.join(TC_DIR, str(l))) for l in range(hp["n_layer"])],
                                        hp)
    ids = np.array(prompt(encoder))
    for _ in sys.stdin:
        t0 = time.perf_counter()
        graph = tracing.attribution_graph(params, hp, ids, tcs, max_features=args.max_features,
                                          batch_size=args.batch_size)
        seconds = time.perf_counter() - t0
        np.save(os.path.join(HERE, "out", "graph-ours.npy"), graph["adjacency_matrix"])
        print(json.dumps({"seconds": seconds, "rss": peak_rss_gb(), "features": len(graph["active_features"]),
                          "nodes": len(graph["adjacency_matrix"])}), flush=True)


def theirs(args):
    """The same under circuit-tracer: its TransformerLensReplacementModel of our checkpoint's weights."""
    import numpy as np
    import torch
    from circuit_tracer import attribute
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.transcoder import SingleLayerTranscoder, TranscoderSet
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    from interface import loading
    from plumbing.sae_files import load_sae

    torch.set_num_threads(args.threads)
    encoder, hp, params = loading.load_model(args.folder)
    config = GPT2Config(vocab_size=hp["n_vocab"], n_positions=hp["n_ctx"], n_embd=hp["n_embd"], n_layer=hp["n_layer"],
                        n_head=hp["n_head"])
    hf = GPT2LMHeadModel(config)
    state = {"transformer.wte.weight": params["wte"], "transformer.wpe.weight": params["wpe"],
             "transformer.ln_f.weight": params["ln_f"]["g"], "transformer.ln_f.bias": params["ln_f"]["b"]}
    for i, b in enumerate(params["blocks"]):
        for ours_name, hf_name in (("ln_1", "ln_1"), ("ln_2", "ln_2")):
            state[f"transformer.h.{i}.{hf_name}.weight"], state[f"transformer.h.{i}.{hf_name}.bias"] = \
                b[ours_name]["g"], b[ours_name]["b"]
        for part, layer in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")):
            state[f"transformer.h.{i}.{part}.{layer}.weight"] = b[part][layer]["w"]
            state[f"transformer.h.{i}.{part}.{layer}.bias"] = b[part][layer]["b"]
    hf.load_state_dict({k: torch.tensor(np.array(v)) for k, v in state.items()}, strict=False)
    cfg = HookedTransformerConfig(d_model=hp["n_embd"], n_layers=hp["n_layer"], n_heads=hp["n_head"],
                                  d_head=hp["n_embd"] // hp["n_head"], d_mlp=4 * hp["n_embd"], d_vocab=hp["n_vocab"],
                                  n_ctx=hp["n_ctx"], act_fn="gelu_new", normalization_type="LN", eps=1e-5,
                                  default_prepend_bos=False, model_name="random-124M", dtype=torch.float32)
    tcs = {}
    for l in range(hp["n_layer"]):
        sae = load_sae(os.path.join(TC_DIR, str(l)))
        tc = SingleLayerTranscoder(hp["n_embd"], D_TC, torch.nn.ReLU(), l, dtype=torch.float32, device="cpu")
        with torch.no_grad():
            for name in ("b_enc", "W_dec", "b_dec"):
                getattr(tc, name).copy_(torch.tensor(sae[name]))
            tc.W_enc.copy_(torch.tensor(sae["W_enc"].T))
        tcs[l] = tc
    transcoders = TranscoderSet(tcs, feature_input_hook="mlp.hook_in", feature_output_hook="hook_mlp_out",
                                scan="random")
    vocab = os.path.join(ROOT, "tests", "data", "hf", "tiny")  # GPT-2's vocabulary, as transformers reads it
    model = TransformerLensReplacementModel(cfg, tokenizer=GPT2TokenizerFast.from_pretrained(vocab))
    model.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=False)
    model._configure_replacement_model(transcoders)
    del hf, state
    tokens = torch.tensor(prompt(encoder))
    for _ in sys.stdin:
        t0 = time.perf_counter()
        graph = attribute(tokens, model, max_feature_nodes=args.max_features, batch_size=args.batch_size)
        seconds = time.perf_counter() - t0
        np.save(os.path.join(HERE, "out", "graph-theirs.npy"), graph.adjacency_matrix.numpy())
        print(json.dumps({"seconds": seconds, "rss": peak_rss_gb(), "features": len(graph.active_features),
                          "nodes": len(graph.adjacency_matrix)}), flush=True)


def cpu_name():
    return next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--torch-python", default="/work/venvs/graph-ct/bin/python")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--l0", type=int, default=32, help="latents firing a position, on average (default 32)")
    p.add_argument("--max-features", type=int)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--worker", choices=("ours", "theirs"), help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return (ours if args.worker == "ours" else theirs)(args)
    from bench_speculative import model_folder

    folder = model_folder("random:124M")
    if not os.path.exists(os.path.join(TC_DIR, "11", "cfg.json")):
        print(f"writing {TC_DIR} (random transcoders, once)", file=sys.stderr)
        make_transcoders(folder, args.l0)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads), OPENBLAS_VERBOSE="2")
    flags = ["--folder", folder, "--threads", str(args.threads), "--batch-size", str(args.batch_size)] + \
        (["--max-features", str(args.max_features)] if args.max_features else [])
    logs = {name: open(os.path.join(HERE, "out", f"graph-{name}.log"), "w+") for name in ("ours", "circuit-tracer")}
    contenders = {"ours": ("ours", sys.executable), "circuit-tracer": ("theirs", args.torch_python)}
    workers = {name: subprocess.Popen([python, os.path.abspath(__file__), "--worker", worker, *flags], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logs[name], text=True)
               for name, (worker, python) in contenders.items()}
    runs = {name: [] for name in workers}
    for round_ in range(args.repeats + 1):  # the first round warms up
        for name, w in workers.items():
            before = load()
            try:
                w.stdin.write("go\n")
                w.stdin.flush()
                line = w.stdout.readline()
            except BrokenPipeError:
                line = ""
            if not line:
                logs[name].seek(0)
                sys.exit(f"{name} failed (exit {w.poll()}): {logs[name].read()[-2000:]}")
            result = {**json.loads(line), "load": before}
            print(f"  round {round_} {name}: {result}", file=sys.stderr)
            if round_:
                runs[name].append(result)
    import numpy as np

    a, b = (np.load(os.path.join(HERE, "out", f)) for f in ("graph-ours.npy", "graph-theirs.npy"))
    worst = float(np.abs(a - b).max() / np.abs(b).max()) if a.shape == b.shape else float("inf")
    for w in workers.values():
        w.stdin.close()
    logs["ours"].seek(0)
    kernel = re.search(r"Core: (\w+)", logs["ours"].read())
    print(f"{cpu_name()}, {args.threads} threads, OpenBLAS kernel {kernel.group(1) if kernel else '?'} "
          f"(OPENBLAS_CORETYPE {os.environ.get('OPENBLAS_CORETYPE', 'unset')}); a {N_TOKENS}-token prompt + "
          f"<|endoftext|>, random:124M, 12 x {D_TC:,} ReLU latents, L0 about {args.l0}; "
          f"max_features {args.max_features or 'all'}, batch {args.batch_size}; median of {args.repeats}")
    print(f"{runs['ours'][0]['features']:,} active features, {a.shape[0]:,} nodes: the dense adjacency is "
          f"{a.nbytes / 1e9:.2f} GB (float32); ours and circuit-tracer's agree within {worst:.1e} of the largest")
    for name, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        loads = ", ".join(f"{r['load']:.2f}" for r in results)
        print(f"  {name:>15}: {seconds:7.2f} s  (peak {max(r['rss'] for r in results):.1f} GB; load {loads})")
    print(f"  ours / circuit-tracer: {statistics.median(r['seconds'] for r in runs['ours']) / statistics.median(r['seconds'] for r in runs['circuit-tracer']):.2f}")
    if worst > 1e-4:
        sys.exit("the two graphs differ")


if __name__ == "__main__":
    main()
