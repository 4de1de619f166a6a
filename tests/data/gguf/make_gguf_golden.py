"""Goldens for the GGUF tests, from llama.cpp's own converter, gguf-py and transformers.

Dev-only (never in CI): /work/ref/bin/python (torch, transformers 5.24, accelerate, gguf 0.19.0)
and llama.cpp's converter from the llama-cpp-python 0.3.36 sdist, unpacked outside the repo:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d SDIST && tar xzf SDIST/*.tar.gz -C DIR
    LLAMA_CPP=DIR/llama_cpp_python-0.3.36/vendor/llama.cpp /work/ref/bin/python tests/data/gguf/make_gguf_golden.py
    ... make_gguf_golden.py --check      # make them again and compare, writing nothing (tests/test_gguf.py -k live)

The project's own steps run on the system `python` (PROJECT_PYTHON): the fixture, and
`convert.py FIXTURE DIR --to hf`, whose folder the converter is given, under the fixture's name.
The converter does not know the pre-tokenizer of a vocabulary of its own (Shakespeare's): there,
and only there, this script answers "gpt-2" for it, as the issue says, and the file is otherwise
the converter's. It writes, beside itself:

- gguf_golden.json: the SHA-256 and size of each file the converter wrote (two fixtures x f32,
  f16, q8_0), and general.name and its parts as gguf-py reads a few folders' names;
- gguf_logits.npz: every 97th logit that transformers' GGUF loader computes reading our f32 files,
  and the converter's shakespeare f16 and q8_0 files (kept here, 170 kB), on the ids it holds;
- q8_0_rows.npz: awkward rows (zeros, constants, tiny, huge, exact halves, random) and the
  bytes gguf-py's quants.quantize makes of them.
"""
import hashlib
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
LLAMA_CPP = os.environ.get("LLAMA_CPP", "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp")
PROJECT_PYTHON = os.environ.get("PROJECT_PYTHON", "python")
TYPES = ("f32", "f16", "q8_0")
# fixture -> (its folder name, where it comes from, ids to score)
FIXTURES = {"twelve": ("twelve-layers-v2", None, [15496, 11, 616, 3290, 318, 13779, 50256, 0]),
            "shakespeare": ("shakespeare", os.path.join(ROOT, "tests", "data", "shakespeare"),
                            [51, 79, 1, 200, 300, 400, 511, 7, 33])}
COLUMNS = 97  # every 97th logit is kept (GPT-2's 50,257 a position would make the goldens 2 MB)
# folder names (and parameter counts) -> general.name, basename, finetune, version, size_label, by gguf-py's rules
NAMES = [("gpt2-44K-bard-v1", 43904), ("gpt2-124M", 124439808), ("shakespeare", 43904), ("My Model", 5),
         ("gpt2-xl-1.5B-q8_0", 1557611200), ("llama-3-8b-instruct-v2.1", 124000000), ("gpt2-1024-ctx", 124439808),
         ("Mistral-7B_v0.1-x", 7_000_000_000), ("gpt2-medium", 354823168), ("v2-gpt2-355M-chat", 354823168)]
KEPT = [("shakespeare", "f16"), ("shakespeare", "q8_0")]  # the converter's files the tests read


def run_converter(args):
    """llama.cpp's convert_hf_to_gguf.py, in this process, answering "gpt-2" for a pre-tokenizer it
    does not know (a vocabulary trained here splits text as GPT-2's does)."""
    sys.path.insert(0, LLAMA_CPP)
    sys.argv = ["convert_hf_to_gguf.py"] + args
    from conversion import base
    known = base.TextModel.get_vocab_base_pre

    def pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = pre
    runpy.run_path(os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py"), run_name="__main__")


def project(*args):
    subprocess.run([PROJECT_PYTHON, *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def transformers_logits(folder, file, ids, config_folder):
    import torch
    from transformers import AutoConfig, GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(folder, gguf_file=file, config=AutoConfig.from_pretrained(config_folder))
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()[:, ::COLUMNS]


def awkward_rows():
    """Rows of 64 (two blocks each) that test the rounding and the float16 scale's edges."""
    rng = np.random.default_rng(3)
    halves = np.arange(-63.5, 64, 2, dtype=np.float32)[:32]  # d = 127/127 = 1: x*id lands on k + 0.5
    halves[0] = 127.0
    rows = [np.zeros(64), np.full(64, 0.375), np.full(64, -2.0), rng.standard_normal(64) * 1e-30,
            rng.standard_normal(64) * 1e-6, rng.standard_normal(64) * 1e9, np.full(64, 65504.0 * 127 * 1.01),
            np.concatenate([halves, -halves]), rng.standard_normal(64), rng.standard_normal(64) * 100,
            np.concatenate([np.full(32, 1e-3), np.r_[127 * 1e-3, np.zeros(31)]]),
            np.r_[rng.standard_normal(63), 0.0] * np.float32(2) ** -20]
    return np.array(rows, dtype=np.float32)


def main(check=False):
    """Write the goldens; with check, make them again and compare them with the ones here, writing nothing."""
    sys.path.insert(1, os.path.join(LLAMA_CPP, "gguf-py"))
    from gguf import GGMLQuantizationType, quants
    rows = awkward_rows()
    blocks = quants.quantize(rows, GGMLQuantizationType.Q8_0)
    if not check:
        np.savez(os.path.join(HERE, "q8_0_rows.npz"), rows=rows, blocks=blocks)
    from gguf.metadata import Metadata
    from gguf.utility import size_label
    golden = {"converter": "llama.cpp of llama-cpp-python 0.3.36 (convert_hf_to_gguf.py, its gguf-py 0.19.0)",
              "files": {}, "names": {}}
    for name, total in NAMES:
        parts = Metadata.get_model_id_components(name, total)
        golden["names"][name] = [total, Metadata.id_to_title(parts[0]), *parts[2:5],
                                 parts[5] or size_label(total, total, 0, 0)]
    logits = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "hf"))
        for fixture, (name, source, ids) in FIXTURES.items():
            if source is None:
                source = os.path.join(tmp, "fixture")
                project(os.path.join(HERE, "fixture.py"), source)
            hf = os.path.join(tmp, "hf", name)
            project("convert.py", source, hf, "--to", "hf")
            for t in TYPES:
                out = os.path.join(tmp, f"{name}-{t}.gguf")
                subprocess.run([sys.executable, __file__, "--convert", hf, "--outtype", t, "--outfile", out],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                golden["files"][f"{fixture}/{t}"] = {"sha256": sha256(out), "bytes": os.path.getsize(out)}
                if (fixture, t) in KEPT and not check:
                    shutil.copy(out, os.path.join(HERE, f"converter_{fixture}_{t}.gguf"))
                    logits[f"transformers reading the converter's {fixture}/{t}"] = transformers_logits(
                        tmp, f"{name}-{t}.gguf", ids, hf)
            ours = os.path.join(tmp, "ours", name + ".gguf")
            os.makedirs(os.path.dirname(ours), exist_ok=True)
            project("convert.py", source, ours, "--to", "gguf")
            assert sha256(ours) == golden["files"][f"{fixture}/f32"]["sha256"], "our f32 file is not the converter's"
            logits[f"transformers reading our {fixture}/f32"] = transformers_logits(
                os.path.dirname(ours), name + ".gguf", ids, hf)
            logits[f"ids {fixture}"] = np.array(ids)
    if check:
        with open(os.path.join(HERE, "gguf_golden.json"), encoding="utf-8") as f:
            kept = json.load(f)["files"]
        assert np.array_equal(np.load(os.path.join(HERE, "q8_0_rows.npz"))["blocks"], blocks), "gguf-py's Q8_0 changed"
        for case, file in golden["files"].items():
            assert file == kept[case], f"{case}: the converter now writes {file}, not {kept[case]}"
            print(f"ok {case}: {file['sha256']}")
        return
    with open(os.path.join(HERE, "gguf_golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    np.savez(os.path.join(HERE, "gguf_logits.npz"), **logits)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--convert"]:
        run_converter(sys.argv[2:])
    else:
        main(check="--check" in sys.argv)
