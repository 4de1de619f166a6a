"""Write tests/data/sae_golden.npz and tests/data/sae_golden/: SAELens 6.54.12's numbers for sae.py.

Dev-only, in a venv of its own (sae-lens needs transformer-lens below 4):

    python -m venv /work/saevenv && /work/saevenv/bin/pip install torch==2.13.0 && \\
        /work/saevenv/bin/pip install sae-lens==6.54.12 'transformer-lens<4'      # resolves 3.9.0
    HF_HUB_OFFLINE=1 /work/saevenv/bin/python tests/data/make_sae_golden.py

The model is tests/data/hf/tiny (GPT-2's vocabulary, 2 blocks of 2 heads, 8 wide, random weights), as
TransformerLens's HookedSAETransformer with no processing (the raw checkpoint's numbers); the SAE a random
StandardTrainingSAE on blocks.1.hook_resid_pre, 32 latents, its biases made non-zero. The tokens are four
windows of 16 of data/tinyshakespeare.txt's first lines, each <|endoftext|> first.

sae_golden/sae/          the SAE, as SAE.save_model writes it (the folder sae.py reads; and `train --init`'s)
sae_golden/pre6/         the same weights under a cfg.json from before 6.0 (hook_point, no version)
sae_golden.npz:
  tokens [4, 16]; x: the SAE's input (the hook's activations, flattened); W_enc, b_enc, W_dec, b_dec
  acts_pre, acts_post, recons; mse_loss, l1_loss (l1_coefficient 0.3); grad/<name> of their sum
  adam/<name>: the SAE after one step (torch Adam, lr 1e-2, clip_grad_norm_ to 1) on that batch
  logits/, logits_error/ (run_with_saes, without and with the error term: every 200th column, and the logsumexp
  of all); cache/<hook>: run_with_cache_with_saes's
  eval/<metric>: SAELens's evals on the four windows (exclude_special_tokens: <|endoftext|> left out)
  train/batches [S, N, 8] (for `sae.py train --activations`), train/<name>: after S steps of SAELens's step
  (training_forward_pass, backward, clip_grad_norm_, Adam lr 3e-3, the L1 coefficient warmed up over 2 steps)
  norm/factor: √d_in / mean ‖x‖ on x; norm/<name>: the SAE with it folded (fold_activation_norm_scaling_factor)
  centred/<hook>, centred_logits/: the residual stream and the logits of TransformerLens's center_writing_weights model
  loaded/pre6_hook_name: what SAE.load_from_disk reads as the pre-6.0 folder's hook
sae_circuits_golden.npz: circuits.py's experiments with the SAE spliced in (HookedSAETransformer.saes), on the two
  IOI pairs of make_circuits_golden.py ("clean", "corrupted" [2, T], "answer", "wrong" [2]), the metric the mean
  logit difference at the last position; under "sae/" (no error term), "sae_error/" (use_error_term) and
  "centred/", "centred_error/" (TransformerLens's center_writing_weights model, the SAE reading its stream):
  metric_clean, metric_corrupted; patch/resid_pre [L, T] (the SAE's own hook point patched at its
  hook_sae_input, by forward hooks); attribution/resid_pre [L, T] (torch autograd through the SAE, retain_grad at
  each resid_pre, the SAE's at its hook_sae_input); dla/components [2 + 2L + 1] (decompose_resid with the SAE's
  change hook_sae_output - hook_sae_input added after layer 0, then logit_attrs, on the fold_ln model; not centred/);
  dla/latents [d_sae] (logit_attrs of each latent's f_i W_dec[i] at the last position)
"""
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from importlib.metadata import version  # noqa: E402
from sae_lens import SAE, HookedSAETransformer  # noqa: E402
from sae_lens.evals import get_downstream_reconstruction_metrics, get_sparsity_and_variance_metrics  # noqa: E402
from sae_lens.saes.sae import TrainStepInput  # noqa: E402
from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig  # noqa: E402
from sae_lens.training.activation_scaler import ActivationScaler  # noqa: E402
from sae_lens.training.optim import CoefficientScheduler  # noqa: E402
from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402
from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights  # noqa: E402
from transformers import GPT2LMHeadModel, GPT2TokenizerFast  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(HERE, "hf", "tiny")
OUT = os.path.join(HERE, "sae_golden")
HOOK = "blocks.1.hook_resid_pre"
D_SAE, L1, EOT = 32, 0.3, 50256
TRAIN_STEPS, TRAIN_LR, WARM_UP = 4, 3e-3, 2
LOGIT_STEP = 200


def tl_model(cls, **processing):
    hf = GPT2LMHeadModel.from_pretrained(MODEL)
    c = hf.config
    cfg = HookedTransformerConfig(d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head, d_head=c.n_embd // c.n_head,
                                  d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn="gelu_new",
                                  normalization_type="LN", eps=c.layer_norm_epsilon, default_prepend_bos=False)
    model = cls(cfg)
    settings = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
    model.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), **{**settings, **processing})
    return model.eval()


def tokens():
    tok = GPT2TokenizerFast.from_pretrained(MODEL)
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        ids = tok(f.read(2000))["input_ids"][:4 * 15]
    return torch.tensor(np.concatenate([np.full((4, 1), EOT), np.array(ids).reshape(4, 15)], 1))


def new_sae():
    torch.manual_seed(0)
    cfg = StandardTrainingSAEConfig(d_in=8, d_sae=D_SAE, l1_coefficient=L1, l1_warm_up_steps=WARM_UP)
    sae = StandardTrainingSAE(cfg)
    with torch.no_grad():  # a random SAE, its biases not zero, so that every term of the gradient shows
        sae.b_enc.copy_(torch.randn(D_SAE) * 0.05)
        sae.b_dec.copy_(torch.randn(8) * 0.1)
        sae.W_enc.add_(torch.randn(8, D_SAE) * 0.3)
    sae.cfg.metadata.hook_name = HOOK
    sae.cfg.metadata.model_name = "tiny"
    return sae


def params(sae, prefix):
    return {f"{prefix}{k}": getattr(sae, k).detach().numpy().copy() for k in ("W_enc", "b_enc", "W_dec", "b_dec")}


def step(sae, optimizer, x, l1):
    out = sae.training_forward_pass(TrainStepInput(sae_in=x, coefficients={"l1": l1}, dead_neuron_mask=None,
                                                   n_training_steps=0, is_logging_step=False))
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    return out


def kept_logits(name, logits):
    """Every 200th column of the logits, and each position's logsumexp over all of them: a small file that still
    holds every column to account."""
    return {f"{name}/every_200th": logits[..., ::LOGIT_STEP].detach().numpy(),
            f"{name}/logsumexp": torch.logsumexp(logits.detach().double(), -1).numpy()}


class Store:
    """What SAELens's evals ask of an ActivationsStore: a batch of tokens (ours, always the same)."""

    def __init__(self, batch):
        self.batch = batch

    def get_batch_tokens(self, n):
        return self.batch


def main():
    out = {}
    model = tl_model(HookedSAETransformer)
    ids = tokens()
    out["tokens"] = ids.numpy()
    sae = new_sae()
    shutil.rmtree(OUT, ignore_errors=True)
    sae.save_model(os.path.join(OUT, "sae"))
    out.update(params(sae, ""))
    _, cache = model.run_with_cache(ids, names_filter=[HOOK])
    x = cache[HOOK].reshape(-1, 8).detach()
    out["x"] = x.numpy()

    # the SAE, its losses and its gradients
    f, h = sae.encode_with_hidden_pre(x)
    out["acts_pre"], out["acts_post"] = h.detach().numpy(), f.detach().numpy()
    out["recons"] = sae.decode(f).detach().numpy()
    o = sae.training_forward_pass(TrainStepInput(sae_in=x, coefficients={"l1": L1}, dead_neuron_mask=None,
                                                 n_training_steps=0, is_logging_step=False))
    out["mse_loss"], out["l1_loss"] = o.losses["mse_loss"].item(), o.losses["l1_loss"].item()
    o.loss.backward()
    out.update({f"grad/{k}": getattr(sae, k).grad.numpy().copy() for k in ("W_enc", "b_enc", "W_dec", "b_dec")})
    sae.zero_grad()

    # one Adam step with clipping
    stepped = new_sae()
    step(stepped, torch.optim.Adam(stepped.parameters(), lr=1e-2, betas=(0.9, 0.999)), x, L1)
    out.update(params(stepped, "adam/"))

    # spliced in
    inference = SAE.load_from_disk(os.path.join(OUT, "sae"))
    out.update(kept_logits("logits", model.run_with_saes(ids, saes=[inference])))
    out.update(kept_logits("logits_error", model.run_with_saes(ids, saes=[inference], use_error_term=True)))
    _, cache = model.run_with_cache_with_saes(ids, saes=[inference])
    for hook in ("hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons"):
        out[f"cache/{HOOK}.{hook}"] = cache[f"{HOOK}.{hook}"].detach().numpy()

    # SAELens's evals, <|endoftext|> left out
    store, scaler = Store(ids), ActivationScaler()
    with torch.no_grad():
        metrics = get_downstream_reconstruction_metrics(inference, model, store, scaler, compute_kl=True,
                                                        compute_ce_loss=True, n_batches=1, eval_batch_size_prompts=4,
                                                        ignore_tokens=[EOT])
        more, _ = get_sparsity_and_variance_metrics(inference, model, store, scaler, n_batches=1, compute_l2_norms=False,
                                                    compute_sparsity_metrics=True, compute_variance_metrics=True,
                                                    compute_featurewise_density_statistics=False,
                                                    eval_batch_size_prompts=4, model_kwargs={}, ignore_tokens=[EOT])
    metrics.update({k: more[k] for k in ("l0", "explained_variance")})
    out.update({f"eval/{k}": v for k, v in metrics.items()})
    print(json.dumps(metrics, indent=1))

    # a few steps of the trainer's, from the saved SAE, on batches of the model's activations
    trained = SAE.load_from_disk(os.path.join(OUT, "sae"))  # the inference SAE: its weights go into a training one
    training = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=8, d_sae=D_SAE, l1_coefficient=L1,
                                                             l1_warm_up_steps=WARM_UP))
    training.load_state_dict(trained.state_dict())
    rng = np.random.default_rng(1)
    batches = (out["x"][None] + rng.standard_normal((TRAIN_STEPS, *out["x"].shape)).astype(np.float32) * 0.5)
    out["train/batches"] = batches.astype(np.float32)
    optimizer = torch.optim.Adam(training.parameters(), lr=TRAIN_LR, betas=(0.9, 0.999))
    schedule = CoefficientScheduler(WARM_UP, L1)
    losses = []
    for batch in batches:
        o = step(training, optimizer, torch.tensor(batch), schedule.value)
        losses.append([o.losses["mse_loss"].item(), o.losses["l1_loss"].item()])
        schedule.step()
    out.update(params(training, "train/"))
    out["train/losses"] = np.array(losses)

    # normalisation: the factor, and folding it
    factor = 8 ** 0.5 / x.norm(dim=-1).mean().item()
    folded = new_sae()
    folded.fold_activation_norm_scaling_factor(factor)
    out["norm/factor"] = factor
    out.update(params(folded, "norm/"))

    # TransformerLens's center_writing_weights: the residual stream it leaves
    centred = tl_model(HookedTransformer, center_writing_weights=True)
    centred_logits, cache = centred.run_with_cache(ids)
    for hook in ("hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_attn_out",
                 "blocks.1.hook_resid_pre", "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"):
        out[f"centred/{hook}"] = cache[hook].detach().numpy()
    out.update(kept_logits("centred_logits", centred_logits))

    # a cfg.json from before 6.0, on the same weights
    pre6 = os.path.join(OUT, "pre6")
    os.makedirs(pre6)
    shutil.copy(os.path.join(OUT, "sae", "sae_weights.safetensors"), pre6)
    with open(os.path.join(pre6, "cfg.json"), "w") as f:
        json.dump({"d_in": 8, "d_sae": D_SAE, "dtype": "float32", "device": "cpu", "hook_point": HOOK,
                   "hook_point_layer": 1, "model_name": "tiny", "context_size": 16, "normalize_activations": False,
                   "apply_b_dec_to_input": True, "l1_coefficient": L1}, f)
    out["loaded/pre6_hook_name"] = SAE.load_from_disk(pre6).cfg.metadata.hook_name

    np.savez_compressed(os.path.join(HERE, "sae_golden.npz"), **out)
    circuits_golden(inference)
    print(f"sae-lens {version('sae-lens')}, transformer-lens {version('transformer-lens')}, torch {torch.__version__}:",
          len(out), "entries")


IOI = [("When Mary and John went to the store, John gave a drink to",
        "When Mary and John went to the store, Mary gave a drink to", " Mary", " John"),
       ("When Tom and James went to the park, James gave a ball to",
        "When Tom and James went to the park, Tom gave a ball to", " Tom", " James")]  # make_circuits_golden.py's


def resid_pre(layer):
    """Where circuits.py's resid_pre is with the SAE spliced: at the SAE's own hook point, its input."""
    name = f"blocks.{layer}.hook_resid_pre"
    return f"{name}.hook_sae_input" if name == HOOK else name


def circuit_runs(model, sae, use_error_term, clean, corrupted, answer, wrong, dla_model=None):
    """The metric, a resid_pre patching sweep and attribution at resid_pre, with the SAE spliced."""
    L, T = model.cfg.n_layers, clean.shape[1]
    rows = torch.arange(len(clean))

    def metric(logits):
        return (logits[rows, -1, answer] - logits[rows, -1, wrong]).mean()

    names = [resid_pre(layer) for layer in range(L)]
    out = {}
    with model.saes(saes=[sae], use_error_term=use_error_term):
        with torch.no_grad():
            clean_logits, clean_cache = model.run_with_cache(clean, names_filter=names)
            out["metric_clean"] = metric(clean_logits).item()
            out["metric_corrupted"] = metric(model(corrupted)).item()
            patched = np.zeros((L, T))
            for layer in range(L):
                for pos in range(T):
                    def hook(act, hook, pos=pos, name=names[layer]):
                        act = act.clone()
                        act[:, pos] = clean_cache[name][:, pos]
                        return act

                    logits = model.run_with_hooks(corrupted, fwd_hooks=[(names[layer], hook)])
                    patched[layer, pos] = metric(logits).item()
            out["patch/resid_pre"] = patched
        acts = {}

        def keep(act, hook):
            act.retain_grad()
            acts[hook.name] = act

        logits = model.run_with_hooks(corrupted, fwd_hooks=[(n, keep) for n in names])
        metric(logits).backward()
        out["attribution/resid_pre"] = np.stack([((clean_cache[n] - acts[n]) * acts[n].grad).sum(-1).sum(0).detach()
                                                 .numpy() for n in names])
        model.zero_grad()
    if dla_model is not None:
        with dla_model.saes(saes=[sae], use_error_term=use_error_term), torch.no_grad():
            _, cache = dla_model.run_with_cache(clean)
            stack, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
            change = (cache[f"{HOOK}.hook_sae_output"] - cache[f"{HOOK}.hook_sae_input"])[:, -1]
            stack = torch.cat([stack[:4], change[None], stack[4:]])  # embed, pos_embed, 0_attn_out, 0_mlp_out: then it
            out["dla/components"] = cache.logit_attrs(stack, answer, wrong, pos_slice=-1).mean(-1).numpy()
            assert labels[3] == "0_mlp_out", labels
            latents = cache[f"{HOOK}.hook_sae_acts_post"][:, -1, :, None] * sae.W_dec  # [B, d_sae, C]: f_i W_dec[i]
            shares = cache.logit_attrs(latents.transpose(0, 1), answer, wrong, pos_slice=-1)  # [d_sae, B]
            out["dla/latents"] = shares.mean(-1).numpy()
    return out


def circuits_golden(sae):
    model = tl_model(HookedSAETransformer)
    tok = GPT2TokenizerFast.from_pretrained(MODEL)
    clean, corrupted = ([[EOT] + tok(pair[k])["input_ids"] for pair in IOI] for k in (0, 1))
    answer, wrong = ([tok(pair[k])["input_ids"][0] for pair in IOI] for k in (2, 3))
    clean, corrupted, answer, wrong = (torch.tensor(a) for a in (clean, corrupted, answer, wrong))
    out = {"clean": clean.numpy(), "corrupted": corrupted.numpy(), "answer": answer.numpy(), "wrong": wrong.numpy()}
    folded = tl_model(HookedSAETransformer, fold_ln=True, center_unembed=True)  # the same residual stream
    centred = tl_model(HookedSAETransformer, center_writing_weights=True)
    for prefix, m, dla_model in (("sae", model, folded), ("centred", centred, None)):
        for use_error_term in (False, True):
            runs = circuit_runs(m, sae, use_error_term, clean, corrupted, answer, wrong, dla_model)
            out.update({f"{prefix}{'_error' if use_error_term else ''}/{k}": v for k, v in runs.items()})
    np.savez_compressed(os.path.join(HERE, "sae_circuits_golden.npz"), **out)
    print({k: np.round(v, 4).tolist() for k, v in out.items() if "metric" in k})


if __name__ == "__main__":
    main()
