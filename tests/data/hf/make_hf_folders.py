"""Write the small Hugging Face GPT-2 folders the tests read, with transformers' own save_pretrained.

Dev-only: `pip install torch==2.13.0 transformers safetensors`. Run: python tests/data/hf/make_hf_folders.py

  tiny/     GPT2LMHeadModel with GPT-2's real vocabulary (tokenizer saved by GPT2Tokenizer), float32
  inner/    n_inner = 24 and layer_norm_epsilon = 1e-3, a 96-token vocabulary
  sharded/  the same shape as inner/, other weights, saved in float16, in shards (model.safetensors.index.json)
  bf16/     the same shape, other weights, saved in bfloat16
  bare/     tiny/'s weights as the Hub's openai-community/gpt2 stores them: names without "transformer.",
            the causal-mask buffers h.N.attn.bias, and lm_head.weight (= wte), by safetensors.numpy.save_file
            (weights only: no tokenizer files)

Weights are random, biases and LayerNorm gains too (zeros and ones would hide a mistake).
golden.npz holds what HF computes on each (float32): logits and 12 greedy tokens; safetensors.json
the SHA-256 of every tensor's bytes as safetensors.numpy.load_file returns them.
"""
import hashlib
import json
import os
import shutil

import numpy as np
import safetensors.numpy
import safetensors.torch
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = os.path.join(HERE, "..", "..", "..", "data", "gpt2-vocab")


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if name.endswith("bias") else 0.5)
                    + (1.0 if "ln" in name and name.endswith("weight") else 0.0))
    return model


def make(name, config, seed, dtype=torch.float32, shard=None):
    folder = os.path.join(HERE, name)
    shutil.rmtree(folder, ignore_errors=True)
    model = randomize(transformers.GPT2LMHeadModel(config).eval(), seed)
    model.to(dtype).save_pretrained(folder, max_shard_size=shard or "5GB")
    return folder


def save_vocabulary(folder):
    """vocab.json and merges.txt, as the Hub's GPT-2 repos have them, from the tokenizer.json that
    transformers' GPT2Tokenizer writes (its save_vocabulary fails in transformers 5.3)."""
    tok = transformers.GPT2Tokenizer(os.path.join(VOCAB, "encoder.json"), os.path.join(VOCAB, "vocab.bpe"))
    tok.save_pretrained(folder)
    with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
        model = json.load(f)["model"]
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(model["vocab"], f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join((m if isinstance(m, str) else " ".join(m)) + "\n" for m in model["merges"]))
    for name in ("tokenizer.json", "tokenizer_config.json"):  # 3.5 MB that nothing here reads
        os.remove(os.path.join(folder, name))


def bare(tiny, folder):
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    tensors = {k.removeprefix("transformer."): v for k, v in
               safetensors.numpy.load_file(os.path.join(tiny, "model.safetensors")).items()}
    with open(os.path.join(tiny, "config.json")) as f:
        config = json.load(f)
    n = config["n_positions"]
    for i in range(config["n_layer"]):
        tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, n, n), np.float32))
    tensors["lm_head.weight"] = tensors["wte.weight"].copy()
    safetensors.numpy.save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(tiny, "config.json"), folder)


def golden(folder, ids):
    model = transformers.GPT2LMHeadModel.from_pretrained(folder, torch_dtype=torch.float32,
                                                         attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits.numpy()
        x = torch.tensor(ids)  # an explicit mask: else generate takes token 0 (pad_token_id) for padding
        greedy = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=12,
                                min_new_tokens=12, pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:].numpy()
    return logits, greedy


def digests(folder):
    """Each tensor's bytes as safetensors.numpy loads them (bfloat16, which NumPy lacks: as
    safetensors.torch loads them, viewed as 16-bit integers)."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            try:
                tensors = {k: (str(v.dtype), v) for k, v in safetensors.numpy.load_file(os.path.join(folder, f)).items()}
            except TypeError:
                tensors = {k: ("bfloat16", v.view(torch.int16).numpy())
                           for k, v in safetensors.torch.load_file(os.path.join(folder, f)).items()}
            for k, (dtype, v) in tensors.items():
                out[k] = {"file": f, "dtype": dtype, "shape": list(v.shape),
                          "sha256": hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()}
    return out


def main():
    base = dict(n_positions=64, n_embd=8, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    tiny = make("tiny", transformers.GPT2Config(vocab_size=50257, **base), seed=1)
    save_vocabulary(tiny)
    bare(tiny, os.path.join(HERE, "bare"))
    small = dict(base, n_embd=12, n_head=3, n_layer=3, n_positions=32)
    inner = make("inner", transformers.GPT2Config(vocab_size=96, n_inner=24, layer_norm_epsilon=1e-3, **small), seed=2)
    sharded = make("sharded", transformers.GPT2Config(vocab_size=96, n_inner=24, layer_norm_epsilon=1e-3, **small),
                   seed=3, dtype=torch.float16, shard="8KB")
    bf16 = make("bf16", transformers.GPT2Config(vocab_size=96, n_inner=24, layer_norm_epsilon=1e-3, **small),
                seed=4, dtype=torch.bfloat16)
    rng = np.random.default_rng(0)
    gold = {}
    for name, folder, vocab in (("tiny", tiny, 50257), ("inner", inner, 96), ("sharded", sharded, 96),
                                ("bf16", bf16, 96)):
        ids = rng.integers(0, vocab, (2, 10))
        logits, greedy = golden(folder, ids)
        gold.update({f"{name}/ids": ids, f"{name}/last_logits": logits[:, -1],
                     f"{name}/logits_cols": logits[:, :, :96], f"{name}/greedy": greedy})
    np.savez_compressed(os.path.join(HERE, "golden.npz"), **gold,
                        versions=np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"]))
    with open(os.path.join(HERE, "safetensors.json"), "w") as f:
        json.dump({name: digests(os.path.join(HERE, name)) for name in ("tiny", "inner", "sharded", "bare", "bf16")}, f,
                  indent=1)
    for name in ("tiny", "inner", "sharded", "bare", "bf16"):
        print(name, sorted(os.listdir(os.path.join(HERE, name))))


if __name__ == "__main__":
    main()
