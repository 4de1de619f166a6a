"""What Hugging Face's own tools make of the folders convert.py writes: tests/data/convert_golden.json
and convert_golden.npz, which tests/test_convert.py holds the project to.

Two models are converted (their sources are rebuilt the same on every run, by the NumPy-only
functions below, which the test imports):
  tiny      tests/data/tiny (a real-TensorFlow checkpoint) with GPT-2's vocabulary: 50257 ids, 64 positions
  scratch   a model "from scratch": a 512-id vocabulary learned from the start of tinyshakespeare.txt
            (its <|endoftext|> is id 511), GPT-2's initialisation with every tensor then moved at random,
            48 positions
For each, transformers' AutoModelForCausalLM.from_pretrained(OUT) gives the logits on a few ids,
GPT2TokenizerFast.from_pretrained(OUT) gives the ids of held-out multilingual text (HELD_OUT, which
neither vocabulary was learned from), and save_pretrained writes the model back, whose config files
and model.safetensors digest are kept. The SHA-256 of every file convert.py wrote is kept too: the
test converts again and checks that it writes those very bytes, so Hugging Face's numbers are about
what the project writes now.

Dev-only (torch, transformers; last: torch 2.13.0, transformers 5.24.0):

    /work/devvenv/bin/python tests/data/make_convert_golden.py            # write the goldens
    /work/devvenv/bin/python tests/data/make_convert_golden.py --check    # compare live, no goldens:
        # tiny, scratch and a random model in 124M's shape (500 MB in a temporary folder)
    /work/devvenv/bin/python tests/data/make_convert_golden.py --check FOLDER ...   # any model folder,
        # e.g. a LoRA run's OUT: converted, loaded by transformers, logits within 1e-4 of ours
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

import bpe  # noqa: E402
import convert  # noqa: E402
import gpt2_numpy as g  # noqa: E402
from parameters import init_params  # noqa: E402
from plumbing import shapes  # noqa: E402
from plumbing.checkpoint import write_checkpoint  # noqa: E402
from interface.loading import load_model  # noqa: E402

GOLDEN_JSON = os.path.join(HERE, "convert_golden.json")
GOLDEN_NPZ = os.path.join(HERE, "convert_golden.npz")
VOCAB = os.path.join(ROOT, "data", "gpt2-vocab")
SCRATCH_HP = {"n_vocab": 512, "n_ctx": 48, "n_embd": 16, "n_head": 2, "n_layer": 2}
CASES = ("tiny", "scratch")
with open(os.path.join(HERE, "bpe_train", "multilingual.txt"), encoding="utf-8") as _f:
    MULTILINGUAL = [line for line in _f.read().splitlines() if line.strip()]
HELD_OUT = MULTILINGUAL + [
    "def f(x):\n    return x ** 2  # ## #### a comment\n\n\n   indented\ttabs\r\nand CRLF",
    "Emoji 🙂👍🏽, symbols ∑∫√ and numbers 3.14159 1,000,000 2026-12-02.",
    "   leading spaces, trailing spaces   ",
]
PROMPT = "Alan Turing theorized that computers would one day become"


def tiny_source(folder):
    """tests/data/tiny with GPT-2's vocabulary beside it, as OpenAI serves a model. -> folder"""
    os.makedirs(folder)
    for f in os.listdir(os.path.join(HERE, "tiny")):
        shutil.copy(os.path.join(HERE, "tiny", f), folder)
    for f in bpe.TOKENIZER_FILES:
        shutil.copy(os.path.join(VOCAB, f), folder)
    return folder


def scratch_source(folder):
    """A from-scratch model with its own vocabulary, written as train.py --from-scratch writes one. -> folder"""
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()[:20000]
    vocab = bpe.write_vocab(folder + "-vocab", bpe.train_vocab(text, SCRATCH_HP["n_vocab"]))
    rng = np.random.default_rng(2512)
    flat = {name: (a + rng.standard_normal(a.shape) * 0.3).astype(np.float32)  # no zeros or ones to hide a mistake
            for name, a in shapes.flatten(init_params(SCRATCH_HP, seed=0)).items()}
    write_checkpoint(folder, shapes.nest(flat, SCRATCH_HP["n_layer"]), SCRATCH_HP, vocab_dir=vocab)
    shutil.rmtree(vocab)
    return folder


def random_124m_source(folder):
    """Random weights in 124M's shape and GPT-2's vocabulary (about 500 MB). -> folder"""
    hp = shapes.hparams("124M")
    rng = np.random.default_rng(124)
    flat = {name: (rng.standard_normal(shape, np.float32) * 0.02 + (1.0 if name.endswith("/g") else 0.0))
            for name, shape in shapes.tensor_shapes(hp).items()}
    return write_checkpoint(folder, shapes.nest(flat, hp["n_layer"]), hp, vocab_dir=VOCAB)


SOURCES = {"tiny": tiny_source, "scratch": scratch_source, "124M-random": random_124m_source}


def prompt_ids(encoder, hparams):
    """The ids whose logits are compared: the prompt, cut to the context."""
    return encoder.encode(PROMPT)[:hparams["n_ctx"]]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def without_version(path):
    with open(path, encoding="utf-8") as f:
        content = json.load(f)
    content.pop("transformers_version", None)
    return content


def what_hugging_face_makes(out, ids, tmp):
    """transformers on the folder out: logits [T, V], the held-out texts' ids, and what save_pretrained writes back."""
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(model).__name__ == "GPT2LMHeadModel"
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(out)
    held_out_ids = [tokenizer.encode(text) for text in HELD_OUT]
    resaved = os.path.join(tmp, "resaved")
    model.save_pretrained(resaved)
    return logits, held_out_ids, {"config.json": without_version(os.path.join(resaved, "config.json")),
                                  "generation_config.json": without_version(os.path.join(resaved,
                                                                                         "generation_config.json")),
                                  "model.safetensors": sha256(os.path.join(resaved, "model.safetensors"))}


def ours(folder, ids):
    """Our logits [T, V] on the model folder."""
    encoder, hp, params = load_model(folder)
    return g.gpt2([ids], params, hp)[0], encoder


def check(name, source, tmp):
    """Convert source, load it in transformers, compare logits and tokenizer ids with ours."""
    out = convert.convert(source, os.path.join(tmp, "hf"), "hf")
    encoder, hp, _ = load_model(source)
    ids = prompt_ids(encoder, hp)
    logits, held_out_ids, resaved = what_hugging_face_makes(out, ids, tmp)
    mine, _ = ours(source, ids)
    gap = float(np.abs(logits - mine).max())
    assert gap <= 1e-4, (name, gap)
    assert held_out_ids == [encoder.encode(text) for text in HELD_OUT], name
    assert resaved["config.json"] == without_version(os.path.join(out, "config.json")), name
    assert resaved["model.safetensors"] == sha256(os.path.join(out, "model.safetensors")), name
    print(f"ok {name}: transformers' logits within {gap:.1e} of ours; GPT2TokenizerFast gave our ids on "
          f"{len(HELD_OUT)} held-out texts; save_pretrained wrote back our config and model.safetensors")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", nargs="*", metavar="FOLDER", help="compare live (default: tiny, scratch, 124M-random)")
    args = p.parse_args()
    if args.check is not None:
        for name in args.check or SOURCES:
            with tempfile.TemporaryDirectory() as tmp:
                source = SOURCES[name](os.path.join(tmp, "source")) if name in SOURCES else name
                check(name, source, tmp)
        return
    import torch
    import transformers
    golden = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__},
              "held_out": HELD_OUT, "cases": {}}
    arrays = {}
    for name in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            source = SOURCES[name](os.path.join(tmp, "source"))
            out = convert.convert(source, os.path.join(tmp, "hf"), "hf")
            encoder, hp, _ = load_model(source)
            ids = prompt_ids(encoder, hp)
            logits, held_out_ids, resaved = what_hugging_face_makes(out, ids, tmp)
            golden["cases"][name] = {"ids": ids, "held_out_ids": held_out_ids, "resaved": resaved,
                                     "files": {f: sha256(os.path.join(out, f)) for f in sorted(os.listdir(out))}}
            arrays[f"{name}/last_logits"] = logits[-1]  # [V] at the last position
            arrays[f"{name}/logits_cols"] = logits[:, :256]  # [T, 256] at every position
    with open(GOLDEN_JSON, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    np.savez_compressed(GOLDEN_NPZ, **arrays)
    print(f"wrote {GOLDEN_JSON} and {GOLDEN_NPZ}")


if __name__ == "__main__":
    main()
