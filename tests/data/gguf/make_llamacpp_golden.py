"""Goldens from llama.cpp itself: its tokens, logits and greedy ids on GGUF files, for tests/test_gguf.py.

Dev-only (never in CI): llama.cpp built from the llama-cpp-python 0.3.36 sdist (its vendor/llama.cpp,
about 5 minutes on 2 cores for these targets), and that sdist's own ctypes bindings (llama_cpp/llama_cpp.py), which
need nothing but the standard library and NumPy:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d SDIST && tar xzf SDIST/*.tar.gz -C DIR
    cmake -S DIR/llama_cpp_python-0.3.36/vendor/llama.cpp -B BUILD -G Ninja -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF \
        -DCMAKE_BUILD_TYPE=Release && cmake --build BUILD -j2 --target llama llama-completion
    LLAMA_CPP_PYTHON=DIR/llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=BUILD/bin \
        /work/ref/bin/python tests/data/gguf/make_llamacpp_golden.py
    ... make_llamacpp_golden.py --check     # run llama.cpp again and compare, writing nothing

The files are the Shakespeare fixture's (tests/data/shakespeare) as GGUF: f32 as convert.py writes it
(the converter's bytes, tests/data/gguf/gguf_golden.json), and the converter's own f16 and q8_0
files kept beside this script. For each file and prompt, llama.cpp's defaults as llama-cli runs
them (a float16 KV cache, flash attention "auto", 2 threads) but for --no-repack (on a CPU with AMX,
llama.cpp repacks Q8_0 weights for it and crashes on GPT-2's: docs/files.md), and for the f32 file
also with a float32 KV cache and no flash attention (SETTINGS):
- the prompt's ids by llama.cpp's tokenizer (llama_tokenize, no BOS added: GPT-2 adds none);
- every 3rd logit at every position of the prompt, from one llama_decode of the whole prompt;
- GREEDY greedy ids after it, one llama_decode a token (its cache), the argmax of each.
It writes llamacpp_golden.json (ids, greedy ids, llama.cpp's system info) and llamacpp_logits.npz.
"""
import ctypes
import importlib
import json
import os
import subprocess
import sys
import tempfile
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
LLAMA_CPP_PYTHON = os.environ.get("LLAMA_CPP_PYTHON", "/work/llamacpp/llama_cpp_python-0.3.36")
PROJECT_PYTHON = os.environ.get("PROJECT_PYTHON", "python")
PROMPTS = ["ROMEO:\nO Juliet, thou", "First Citizen:\nBefore we proceed any further, hear me speak.",
           "\n\nKING HENRY VI:\nWhat"]
GREEDY = 16
# a setting -> (the KV cache's ggml type, flash attention): llama-cli's defaults (GGML_TYPE_F16, auto: on
# for a CPU), and the closest llama.cpp comes to float32 throughout (GGML_TYPE_F32, off)
SETTINGS = {"default": (1, -1), "f32-cache-no-flash": (0, 0)}
FILES = {"f32": None, "f16": "converter_shakespeare_f16.gguf", "q8_0": "converter_shakespeare_q8_0.gguf"}
RUNS = [("f32", "default"), ("f32", "f32-cache-no-flash"), ("f16", "default"), ("q8_0", "default")]
COLUMNS = 3  # every 3rd logit is kept: 155 kB for the 3 prompts and 4 runs


def bindings():
    """llama_cpp.llama_cpp alone (the package's __init__ would import its high-level API and its needs)."""
    package = types.ModuleType("llama_cpp")
    package.__path__ = [os.path.join(LLAMA_CPP_PYTHON, "llama_cpp")]
    sys.modules["llama_cpp"] = package
    return importlib.import_module("llama_cpp.llama_cpp")


def tokenize(L, vocab, text):
    raw = text.encode("utf-8")
    out = (L.llama_token * (len(raw) + 8))()
    n = L.llama_tokenize(vocab, raw, len(raw), out, len(out), False, True)  # no BOS; special tokens parsed
    assert n >= 0, n
    return [out[i] for i in range(n)]


def decode(L, ctx, ids, start, n_vocab, all_logits):
    """One llama_decode of ids at positions start.. -> the logits [len(ids), V] (or of the last alone)."""
    batch = L.llama_batch_init(len(ids), 0, 1)
    try:
        batch.n_tokens = len(ids)
        for i, t in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if all_logits or i == len(ids) - 1 else 0
        assert L.llama_decode(ctx, batch) == 0
        rows = range(len(ids)) if all_logits else [len(ids) - 1]
        return np.array([np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), (n_vocab,)) for i in rows],
                        np.float32)
    finally:
        L.llama_batch_free(batch)


def run_file(L, path, setting):
    """-> ({prompt: {"ids", "greedy"}}, {prompt: logits [T, V]}) for one GGUF file and setting."""
    settings = L.llama_model_default_params()
    settings.use_extra_bufts = False  # --no-repack: on this CPU (AMX), repacking Q8_0 crashes llama.cpp (docs/files.md)
    model = L.llama_model_load_from_file(path.encode(), settings)
    assert model, path
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    results, logits = {}, {}
    for prompt in PROMPTS:
        params = L.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_threads, params.n_threads_batch = 64, 64, 2, 2
        params.type_k = params.type_v = SETTINGS[setting][0]
        params.flash_attn_type = SETTINGS[setting][1]
        ctx = L.llama_init_from_model(model, params)
        ids = tokenize(L, vocab, prompt)
        logits[prompt] = decode(L, ctx, ids, 0, n_vocab, all_logits=True)
        greedy, last = [], logits[prompt][-1]
        for _ in range(GREEDY):
            greedy.append(int(last.argmax()))
            last = decode(L, ctx, [greedy[-1]], len(ids) + len(greedy) - 1, n_vocab, all_logits=False)[0]
        results[prompt] = {"ids": ids, "greedy": greedy}
        L.llama_free(ctx)
    L.llama_model_free(model)
    return results, logits


def main(check=False):
    L = bindings()
    L.llama_backend_init()
    golden = {"llama.cpp": "vendored by llama-cpp-python 0.3.36, built with cmake (Release, shared)",
              "system_info": L.llama_print_system_info().decode().strip(), "runs": {}}
    arrays = {}
    with tempfile.TemporaryDirectory() as tmp:
        ours = os.path.join(tmp, "shakespeare.gguf")
        subprocess.run([PROJECT_PYTHON, "convert.py", os.path.join(ROOT, "tests", "data", "shakespeare"), ours,
                        "--to", "gguf"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        for kind, setting in RUNS:
            path = ours if FILES[kind] is None else os.path.join(HERE, FILES[kind])
            results, logits = run_file(L, path, setting)
            golden["runs"][f"{kind}/{setting}"] = results
            for n, prompt in enumerate(PROMPTS):
                arrays[f"{kind}/{setting}/{n}"] = logits[prompt][:, ::COLUMNS]
    if check:
        with open(os.path.join(HERE, "llamacpp_golden.json"), encoding="utf-8") as f:
            kept = json.load(f)["runs"]
        stored = np.load(os.path.join(HERE, "llamacpp_logits.npz"))
        for run, results in golden["runs"].items():
            assert results == kept[run], f"{run}: llama.cpp now gives {results}, not {kept[run]}"
        for key, value in arrays.items():
            worst = float(np.abs(value - stored[key]).max())
            assert worst < 1e-4, f"{key}: llama.cpp's logits moved by {worst}"
            print(f"ok {key}: within {worst:.2e}")
        return
    with open(os.path.join(HERE, "llamacpp_golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    np.savez_compressed(os.path.join(HERE, "llamacpp_logits.npz"), **arrays)


if __name__ == "__main__":
    main(check="--check" in sys.argv)
