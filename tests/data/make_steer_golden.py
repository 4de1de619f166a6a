"""Write tests/data/steer_golden.npz: ActAdd as the paper's code computes it, and an SAE latent added at its
hook point, in TransformerLens 4.3.0 on tests/data/hf/tiny (GPT-2's vocabulary, 2 blocks, random weights).

Dev-only: torch 2.13, transformers 5.25, transformer-lens 4.3.0. Run it offline:

    HF_HUB_OFFLINE=1 python tests/data/make_steer_golden.py

ActAdd follows montemac/activation_additions (Turner et al., 2023), written again here from its definitions:
each steering prompt is to_tokens'd (<|endoftext|> first), the shorter padded on the right with the token of
" " (get_x_vector's pad_method="tokens_right", custom_pad_id=220); each one's blocks.L.hook_resid_pre from
run_with_cache, times +coeff and -coeff (get_prompt_activations); two hooks (hook_fn_from_activations, "front")
each add theirs to the first n positions of every pass longer than one position. The generation is
model.generate under those hooks, greedy, use_past_kv_cache=False (the bridge's cached generate attends to
nothing before each step), 16 tokens; the logits are run_with_hooks over the prompt and those tokens.

The SAE latent: alpha · W_dec[i] of tests/data/sae_golden/sae (SAELens's folder, read with safetensors) added
at its hook point at every position, the same generation and logits.

Under "<case>/": "prompt" [T] (the ids generation starts from), "ids" [16], the logits of the prompt and those
ids at some columns ("cols" [K], "logits" [T + 16, K]: each position's top token and 256 at random) and
"logsumexp" [T + 16] over all V, and "vector" ([n, C] for ActAdd: the two hooks' activations summed; [C]
for the latent); for ActAdd "add", "sub" (the unpadded steering ids), "layer", "coeff"; for the latent
"latent", "alpha".
"""
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from importlib.metadata import version  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
N_COLS = 256  # the logits are kept at the columns each position's top token is, and these many more at random

SPACE = 220
N_NEW = 16
ACT_ADD = {  # case: (prompt, add, sub, layer, coeff)
    "love_hate_0": ("I hate you because", "Love", "Hate", 0, 5.0),
    "love_hate_1": ("I hate you because", "Love", "Hate", 1, 10.0),
    "padded": ("Yesterday my friend said that the weather", " weddings", "I talk about", 1, -4.0),
}
LATENT = {"latent_3": ("The weather today is", 3, 40.0), "latent_17": ("The weather today is", 17, -25.0)}


def kept_logits(case, logits):
    """[T, V] -> the golden's "<case>/cols" [K] and "<case>/logits" [T, K], and "<case>/logsumexp" [T] over all V."""
    logits = logits.float()
    cols = np.union1d(logits.argmax(-1).numpy(), np.random.default_rng(0).choice(logits.shape[-1], N_COLS, False))
    return {f"{case}/cols": cols, f"{case}/logits": logits[:, cols].numpy(),
            f"{case}/logsumexp": torch.logsumexp(logits, -1).numpy()}


def front_hook(activations):
    """The paper's prompt_hook: add to the first n positions; a one-position pass is left alone."""
    n = activations.shape[1]

    def hook(resid_pre, hook):
        if resid_pre.shape[1] == 1:
            return resid_pre
        assert resid_pre.shape[1] >= n, "The prompt is shorter than the activation sequence to be added."
        resid_pre[:, :n] = activations + resid_pre[:, :n]
        return resid_pre
    return hook


def steered(model, prompt, hooks):
    with model.hooks(fwd_hooks=hooks):
        out = model.generate(prompt, max_new_tokens=N_NEW, do_sample=False, use_past_kv_cache=False,
                             stop_at_eos=False, verbose=False, return_type="tokens")
    ids = out[0, prompt.shape[1]:]
    return ids.numpy(), model.run_with_hooks(out, fwd_hooks=hooks)[0]


def main():
    torch.set_grad_enabled(False)
    model = TransformerBridge.boot_transformers(os.path.join(HERE, "hf", "tiny"), device="cpu")
    golden = {}
    for case, (text, add, sub, layer, coeff) in ACT_ADD.items():
        name = f"blocks.{layer}.hook_resid_pre"
        tokens = [model.to_tokens(t) for t in (add, sub)]
        n = max(t.shape[1] for t in tokens)
        padded = [torch.nn.functional.pad(t, (0, n - t.shape[1]), value=SPACE) for t in tokens]
        acts = [c * model.run_with_cache(t, names_filter=lambda x: x == name)[1][name]
                for c, t in zip((coeff, -coeff), padded)]
        prompt = model.to_tokens(text)
        ids, logits = steered(model, prompt, [(name, front_hook(a)) for a in acts])
        golden.update({f"{case}/prompt": prompt[0].numpy(), f"{case}/ids": ids, **kept_logits(case, logits),
                       f"{case}/vector": (acts[0] + acts[1])[0].numpy(), f"{case}/add": tokens[0][0].numpy(),
                       f"{case}/sub": tokens[1][0].numpy(), f"{case}/layer": np.array(layer),
                       f"{case}/coeff": np.array(coeff)})
    sae_dir = os.path.join(HERE, "sae_golden", "sae")
    with open(os.path.join(sae_dir, "cfg.json")) as f:
        site = json.load(f)["metadata"]["hook_name"]
    W_dec = load_file(os.path.join(sae_dir, "sae_weights.safetensors"))["W_dec"]
    for case, (text, latent, alpha) in LATENT.items():
        v = torch.from_numpy(alpha * W_dec[latent])
        prompt = model.to_tokens(text)
        ids, logits = steered(model, prompt, [(site, lambda x, hook: x + v)])
        golden.update({f"{case}/prompt": prompt[0].numpy(), f"{case}/ids": ids, **kept_logits(case, logits),
                       f"{case}/vector": v.numpy(), f"{case}/latent": np.array(latent),
                       f"{case}/alpha": np.array(alpha)})
    golden["versions"] = np.array(f"torch {torch.__version__}, transformers {version('transformers')}, "
                                  f"transformer-lens {version('transformer-lens')}")
    np.savez_compressed(os.path.join(HERE, "steer_golden.npz"), **golden)
    for case in list(ACT_ADD) + list(LATENT):
        print(case, golden[f"{case}/prompt"].tolist(), golden[f"{case}/ids"].tolist())


if __name__ == "__main__":
    main()
