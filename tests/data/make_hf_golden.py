"""Write tests/data/hf_golden.npz: what Hugging Face's GPT2LMHeadModel (float32) computes
on the committed tiny checkpoints.

The weights come from <name>_expected.npz (the values make_checkpoints.py gave to
TensorFlow), not from our loader, so the goldens are independent of the code
under test. Dev-only: `pip install torch==2.13.0 transformers` (the file's
"versions" entry records which made it; last: torch 2.13.0, transformers 5.3.0). Run:

    python tests/data/make_hf_golden.py

Every case stores, under "<case>/...":
  ids            [B, T] the input
  logits_cols    [B, T, K] logits at every position for the vocabulary columns `cols`
  cols           [K] which columns (all of them when the vocabulary is small)
  last_logits    [B, V] full logits at the last position
  logprobs       [B, T-1] log p(ids[t+1] | ids[:t+1])
  loss           [B] mean of -logprobs
  greedy         [B, 20] HF's greedy continuation of ids (do_sample=False)
  min_margin     smallest gap between the best and second-best logit along the greedy path
  hidden         [L+1, B, T, C] output_hidden_states: the residual stream into each block
                 (hidden[0] = wte[ids] + wpe), and last, ln_f of the last block's output
  attentions     [L, B, H, T, T] output_attentions (eager attention): each block's weights
  lens_top       [L+1, B, T] the logit lens: argmax of lm_head(ln_f(hidden[i])) (hidden[L] has ln_f already)
  lens_top_prob  [L+1, B, T] its probability
  lens_target_prob [L+1, B, T] the probability of the model's final prediction at that position
"""
import os

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
TURING = [36235, 39141, 18765, 1143, 326, 9061, 561, 530, 1110, 1716]  # "Alan Turing theorized that ... become"


def expected(name):
    with np.load(os.path.join(HERE, f"{name}_expected.npz")) as z:
        names, shapes, offsets, values = z["names"], z["shapes"], z["offsets"], z["values"]
    return {n.decode(): values[offsets[i]:offsets[i + 1]].reshape([d for d in shapes[i] if d >= 0])
            for i, n in enumerate(names)}


def gpt2_tokenizer(folder, **special):
    """transformers' GPT2Tokenizer from a folder's encoder.json and vocab.bpe, as transformers 5.x takes them
    (vocab= and merges=: vocab_file= silently encodes to []). special: its special tokens, e.g. eos_token."""
    import json
    with open(os.path.join(folder, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(folder, "vocab.bpe"), encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n")[1:] if line]
    return transformers.GPT2Tokenizer(vocab=vocab, merges=merges, **special)


def hf_model(name):
    import json
    with open(os.path.join(HERE, name, "hparams.json")) as f:
        hp = json.load(f)
    config = transformers.GPT2Config(vocab_size=hp["n_vocab"], n_positions=hp["n_ctx"], n_embd=hp["n_embd"],
                                     n_layer=hp["n_layer"], n_head=hp["n_head"], activation_function="gelu_new",
                                     layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     tie_word_embeddings=True)
    config._attn_implementation = "eager"  # the attention weights are only returned by the eager path
    model = transformers.GPT2LMHeadModel(config).float().eval()
    t = expected(name)
    state = {"transformer.wte.weight": t["model/wte"], "transformer.wpe.weight": t["model/wpe"],
             "transformer.ln_f.weight": t["model/ln_f/g"], "transformer.ln_f.bias": t["model/ln_f/b"]}
    for i in range(hp["n_layer"]):
        p, q = f"model/h{i}/", f"transformer.h.{i}."
        for ours, theirs in [("ln_1/g", "ln_1.weight"), ("ln_1/b", "ln_1.bias"),
                             ("ln_2/g", "ln_2.weight"), ("ln_2/b", "ln_2.bias"),
                             ("attn/c_attn/w", "attn.c_attn.weight"), ("attn/c_attn/b", "attn.c_attn.bias"),
                             ("attn/c_proj/w", "attn.c_proj.weight"), ("attn/c_proj/b", "attn.c_proj.bias"),
                             ("mlp/c_fc/w", "mlp.c_fc.weight"), ("mlp/c_fc/b", "mlp.c_fc.bias"),
                             ("mlp/c_proj/w", "mlp.c_proj.weight"), ("mlp/c_proj/b", "mlp.c_proj.bias")]:
            value = t[p + ours]
            state[q + theirs] = value[0] if value.ndim == 3 else value  # Conv1D keeps [nx, nf]
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()},
                                                strict=False)
    assert not unexpected and all(k == "lm_head.weight" or k.endswith((".attn.bias", ".masked_bias"))
                                  for k in missing), (missing, unexpected)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    return model, hp


def greedy_path(model, ids, n):
    """HF's greedy continuation, and the smallest top-1/top-2 logit gap along it."""
    with torch.no_grad():
        x = torch.tensor(ids)  # an explicit mask: else generate takes token 0 (pad_token_id) for padding
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=0, eos_token_id=None)
        logits = model(out).logits[:, ids.shape[1] - 1:-1]
    top2 = torch.topk(logits, 2, dim=-1).values
    return out[:, ids.shape[1]:].numpy(), float((top2[..., 0] - top2[..., 1]).min())


def logit_lens(model, hidden_states, target):
    """HF's own ln_f and head on each layer's hidden state."""
    with torch.no_grad():
        probs = [torch.softmax(model.lm_head(model.transformer.ln_f(h) if i < len(hidden_states) - 1 else h), -1)
                 for i, h in enumerate(hidden_states)]
    probs = torch.stack(probs)  # [L+1, B, T, V]
    top = probs.max(-1)
    return {"lens_top": top.indices.numpy(), "lens_top_prob": top.values.numpy(),
            "lens_target_prob": torch.gather(probs, 3, target[None, ..., None].expand(len(probs), -1, -1, 1))[..., 0]
            .numpy()}


def case(model, hp, ids, cols, n_greedy=20):
    ids = np.asarray(ids, dtype=np.int64)
    with torch.no_grad():
        out = model(torch.tensor(ids), output_hidden_states=True, output_attentions=True)
        logits = out.logits.float()  # [B, T, V]
        logp = torch.log_softmax(logits, dim=-1)
        lp = torch.gather(logp[:, :-1], 2, torch.tensor(ids[:, 1:, None])).squeeze(-1)
        losses = torch.stack([model(torch.tensor(row[None]), labels=torch.tensor(row[None])).loss for row in ids])
    out = {"ids": ids, "cols": cols, "logits_cols": logits[:, :, cols].numpy(), "last_logits": logits[:, -1].numpy(),
           "logprobs": lp.numpy(), "loss": losses.numpy(),
           "hidden": torch.stack(out.hidden_states).numpy(), "attentions": torch.stack(out.attentions).numpy(),
           **logit_lens(model, out.hidden_states, logits.argmax(-1))}
    if n_greedy and ids.shape[1] + n_greedy <= hp["n_ctx"]:
        out["greedy"], out["min_margin"] = greedy_path(model, ids, n_greedy)
    return out


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    golden = {}
    tiny, hp_tiny = hf_model("tiny")
    cols = np.sort(rng.choice(hp_tiny["n_vocab"], 1024, replace=False))
    golden["tiny_turing"] = case(tiny, hp_tiny, [TURING], cols)
    golden["tiny_batch"] = case(tiny, hp_tiny, rng.integers(0, hp_tiny["n_vocab"], (2, 12)), cols)
    odd, hp_odd = hf_model("odd")
    all_cols = np.arange(hp_odd["n_vocab"])
    golden["odd_full_context"] = case(odd, hp_odd, rng.integers(0, hp_odd["n_vocab"], (1, hp_odd["n_ctx"])),
                                      all_cols, n_greedy=0)
    golden["odd_prompt"] = case(odd, hp_odd, rng.integers(0, hp_odd["n_vocab"], (1, 12)), all_cols)
    golden["odd_batch"] = case(odd, hp_odd, rng.integers(0, hp_odd["n_vocab"], (3, 9)), all_cols)
    flat = {f"{name}/{key}": np.asarray(value) for name, c in golden.items() for key, value in c.items()}
    flat["versions"] = np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"])
    np.savez_compressed(os.path.join(HERE, "hf_golden.npz"), **flat)
    for name, c in golden.items():
        print(name, c["ids"].shape, "greedy margin", c.get("min_margin"))


if __name__ == "__main__":
    main()
