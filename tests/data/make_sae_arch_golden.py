"""Write tests/data/sae_arch_golden.npz and tests/data/sae_arch/: SAELens 6.54.12's numbers for every architecture
sae.py reads (issue 46), on small random SAEs of each on tests/data/hf/tiny (make_sae_golden.py's model, tokens and
venv; its docstring says how to make the venv; here /work/venvs/saelens):

    HF_HUB_OFFLINE=1 /work/venvs/saelens/bin/python tests/data/make_sae_arch_golden.py

Each SAE is random (its biases and thresholds not zero, its decoder rows of uneven norms, so that every term shows):
  topk          TopKSAE, k 4 of 32, rescale_acts_by_decoder_norm, layer_norm, at blocks.1.hook_resid_pre (save_model)
  topk_saved    TopKTrainingSAE, k 3, rescale, no b_dec on the input, at blocks.0.hook_resid_post, written by
                save_inference_model (the decoder norms folded into the encoder)
  jumprelu      JumpReLUSAE, constant_norm_rescale, at blocks.1.hook_resid_mid (save_model)
  batchtopk     BatchTopKTrainingSAE, k 4, its topk_threshold 0.3, at blocks.1.hook_resid_pre, written by
                save_inference_model (a jumprelu whose threshold is 0.3 for every latent)
  transcoder    Transcoder blocks.0.ln2.hook_normalized -> blocks.0.hook_mlp_out, 24 latents
  skip_transcoder           SkipTranscoder (W_skip random) blocks.1.ln2.hook_normalized -> blocks.1.hook_mlp_out
  jumprelu_transcoder       JumpReLUTranscoder, layer_norm (the input normalised, the output not: SAELens's),
                            blocks.1.ln2.hook_normalized -> blocks.1.hook_mlp_out
  jumprelu_skip_transcoder  JumpReLUSkipTranscoder, constant_norm_rescale, blocks.0.ln2.hook_normalized ->
                            blocks.0.hook_mlp_out
The transcoders read TransformerLens's ln2.hook_normalized, x̂ before ln_2's gain and bias: sae.py's
fold_layer_norms (--fold-ln) gives it.
sae_arch/<name>/: the folder SAELens wrote; sae_arch/ours_<name>/: the folder plumbing/sae_files.save_sae wrote
from ours loaded, which SAE.load_from_disk read back here (its encode and forward equal within 1e-6: asserted).
sae_arch/openai/v5_32k_layer_1.pt/: a folder in the layout of OpenAI's GPT-2 small TopK SAEs as SAELens's
pretrained_saes.yaml finds them (gpt2-small-resid-post-v5-32k: repo jbloom/GPT2-Small-OAI-v5-32k-resid-post-SAEs,
one folder v5_32k_layer_L.pt a layer, cfg.json from before SAELens 6: hook_point, activation_fn "topk" with
activation_fn_kwargs k, normalize_activations "layer_norm"), topk's weights with unit decoder rows; "openai" in the
golden is what SAE.load_from_disk makes of it.
sae_arch_golden.npz, under <name>/: x (the input, flattened), target (the activation where it writes), acts_pre,
acts_post, recons (hook_sae_recons), out (sae.forward: SkipTranscoder's with W_skip x), logits/, logits_error/
(run_with_saes without and with the error term: every 1000th column and the logsumexp), and for the two skip
transcoders logits_whole/, logits_whole_error/: the whole forward spliced by hooks (SAELens's run_with_saes drops
W_skip x; sae.py does not).
"""
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from make_sae_golden import tl_model, tokens  # noqa: E402
from sae_lens import SAE, HookedSAETransformer  # noqa: E402
from sae_lens.saes import (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig, JumpReLUSAE,  # noqa: E402
                           JumpReLUSAEConfig, JumpReLUSkipTranscoder, JumpReLUSkipTranscoderConfig,
                           JumpReLUTranscoder, JumpReLUTranscoderConfig, SkipTranscoder, SkipTranscoderConfig,
                           TopKSAE, TopKSAEConfig, TopKTrainingSAE, TopKTrainingSAEConfig, Transcoder,
                           TranscoderConfig)

from plumbing import sae_files  # noqa: E402

OUT = os.path.join(HERE, "sae_arch")
C, D_SAE = 8, 32


def randomise(sae, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            if name == "threshold":
                p.copy_(torch.rand_like(p) * 0.5)
            elif name in ("W_dec",):
                p.copy_(torch.randn_like(p) * 0.3 * (0.5 + torch.rand(p.shape[0], 1)))  # uneven row norms
            else:
                p.copy_(torch.randn_like(p) * (0.3 if name != "b_dec" else 0.1))
    return sae


def metadata(sae, hook, out=None):
    sae.cfg.metadata.hook_name = hook
    sae.cfg.metadata.model_name = "tiny"
    if out:
        sae.cfg.metadata.hook_name_out = out
    return sae


def made():
    """{name: (the SAE as SAELens loads its folder)}, each folder written."""
    shutil.rmtree(OUT, ignore_errors=True)
    cases = {
        "topk": metadata(randomise(TopKSAE(TopKSAEConfig(d_in=C, d_sae=D_SAE, k=4, rescale_acts_by_decoder_norm=True,
                                                         normalize_activations="layer_norm")), 1),
                         "blocks.1.hook_resid_pre"),
        "jumprelu": metadata(randomise(JumpReLUSAE(JumpReLUSAEConfig(
            d_in=C, d_sae=D_SAE, normalize_activations="constant_norm_rescale")), 3), "blocks.1.hook_resid_mid"),
        "transcoder": metadata(randomise(Transcoder(TranscoderConfig(d_in=C, d_sae=24, d_out=C,
                                                                     apply_b_dec_to_input=False)), 5),
                               "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"),
        "skip_transcoder": metadata(randomise(SkipTranscoder(SkipTranscoderConfig(d_in=C, d_sae=24, d_out=C,
                                                                                  apply_b_dec_to_input=False)), 6),
                                    "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"),
        "jumprelu_transcoder": metadata(randomise(JumpReLUTranscoder(JumpReLUTranscoderConfig(
            d_in=C, d_sae=24, d_out=C, apply_b_dec_to_input=False, normalize_activations="layer_norm")), 7),
            "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"),
        "jumprelu_skip_transcoder": metadata(randomise(JumpReLUSkipTranscoder(JumpReLUSkipTranscoderConfig(
            d_in=C, d_sae=24, d_out=C, apply_b_dec_to_input=False, normalize_activations="constant_norm_rescale")), 8),
            "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out")}
    for name, sae in cases.items():
        sae.save_model(os.path.join(OUT, name))
    training = {
        "topk_saved": metadata(randomise(TopKTrainingSAE(TopKTrainingSAEConfig(
            d_in=C, d_sae=D_SAE, k=3, apply_b_dec_to_input=False)), 2), "blocks.0.hook_resid_post"),
        "batchtopk": metadata(randomise(BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(d_in=C, d_sae=D_SAE, k=4)), 4),
                              "blocks.1.hook_resid_pre")}
    training["batchtopk"].topk_threshold = torch.tensor(0.3, dtype=torch.double)
    for name, sae in training.items():
        sae.save_inference_model(os.path.join(OUT, name))
    openai = os.path.join(OUT, "openai", "v5_32k_layer_1.pt")
    os.makedirs(openai)
    unit = dict(cases["topk"].state_dict())
    unit["W_dec"] = unit["W_dec"] / unit["W_dec"].norm(dim=-1, keepdim=True)
    save_file({k: v.contiguous() for k, v in unit.items()}, os.path.join(openai, "sae_weights.safetensors"))
    with open(os.path.join(openai, "cfg.json"), "w") as f:
        json.dump({"model_name": "gpt2-small", "hook_point": "blocks.1.hook_resid_pre", "hook_point_layer": 1,
                   "d_in": C, "d_sae": D_SAE, "dtype": "float32", "device": "cpu", "activation_fn_str": "topk",
                   "activation_fn_kwargs": {"k": 4}, "normalize_activations": "layer_norm",
                   "apply_b_dec_to_input": True, "context_size": 64, "prepend_bos": True}, f)
    folders = {**{name: os.path.join(OUT, name) for name in list(cases) + list(training)}, "openai": openai}
    return {name: SAE.load_from_disk(folder) for name, folder in folders.items()}


def kept_logits(name, logits):
    """Every 1000th column of the logits, and each position's logsumexp over all of them."""
    return {f"{name}/every_1000th": logits[..., ::1000].detach().numpy(),
            f"{name}/logsumexp": torch.logsumexp(logits.detach().double(), -1).numpy()}


def spliced_whole(model, sae, ids, use_error_term):
    """The skip transcoder's whole forward (W_skip x included) in place of its output hook, by hooks."""
    kept = {}

    def read(act, hook):
        kept["x"] = act.clone()

    def write(act, hook):
        out = sae(kept["x"])
        return out + (act - out).detach() if use_error_term else out

    return model.run_with_hooks(ids, fwd_hooks=[(sae.cfg.metadata.hook_name, read),
                                                (sae.cfg.metadata.hook_name_out, write)])


def main():
    model = tl_model(HookedSAETransformer)
    ids = tokens()
    _, cache = model.run_with_cache(ids)
    out = {}
    for name, sae in made().items():
        hook, hook_out = sae.cfg.metadata.hook_name, sae.cfg.metadata.hook_name_out or sae.cfg.metadata.hook_name
        x = cache[hook].reshape(-1, C).detach()
        with torch.no_grad():
            _, inner = sae.run_with_cache(x)
            f = sae.encode(x)
            out.update({f"{name}/x": x.numpy(), f"{name}/target": cache[hook_out].reshape(-1, C).numpy(),
                        f"{name}/acts_pre": inner["hook_sae_acts_pre"].numpy(),
                        f"{name}/acts_post": f.numpy(), f"{name}/recons": inner["hook_sae_recons"].numpy(),
                        f"{name}/out": sae(x).numpy()})
            for use_error_term, key in ((False, "logits"), (True, "logits_error")):
                out.update(kept_logits(f"{name}/{key}", model.run_with_saes(ids, saes=[sae],
                                                                            use_error_term=use_error_term)))
                if name.endswith("skip_transcoder"):
                    out.update(kept_logits(f"{name}/{key.replace('logits', 'logits_whole')}",
                                           spliced_whole(model, sae, ids, use_error_term)))
            if name == "openai":
                assert type(sae) is TopKSAE and sae.cfg.k == 4 and sae.cfg.normalize_activations == "layer_norm"
                continue
            ours = sae_files.load_sae(os.path.join(OUT, name))
            folder = os.path.join(OUT, f"ours_{name}")
            sae_files.save_sae(folder, ours)
            back = SAE.load_from_disk(folder)
            assert type(back) is type(sae), (name, type(back))
            assert (back.encode(x) - f).abs().max() <= 1e-6 and (back(x) - sae(x)).abs().max() <= 1e-6, name
        print(name, type(sae).__name__, "L0", float((f > 0).float().sum(-1).mean()))
    np.savez_compressed(os.path.join(HERE, "sae_arch_golden.npz"), **out)


if __name__ == "__main__":
    main()
