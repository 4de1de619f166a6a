"""Write tests/data/sae_training_golden.npz and tests/data/sae_training_golden/: SAELens 6.54.12's training of
its TopK, BatchTopK and JumpReLU SAEs (and the standard one's with run-time normalisation), for sae.py's.

Dev-only, in a venv with sae-lens 6.54.12 (make_sae_golden.py says how to make one):

    /work/venvs/saelens/bin/python tests/data/make_sae_training_golden.py

For each case of CASES: a random training SAE of 32 latents on 8-wide activations, its biases non-zero, its
decoder rows of unequal norms (so that rescale_acts_by_decoder_norm matters), a JumpReLU's thresholds among its
pre-activations and its bandwidth wide (so that the pseudo-derivatives are not all zero), half its latents dead.

sae_training_golden.npz, under "<case>/":
  x [64, 8], dead [32]; init/<name>: the SAE's tensors (threshold, topk_threshold where it has them)
  feature_acts, hidden_pre, sae_out; loss/<name>: training_forward_pass's losses (SAELens's names) and loss/total;
  grad/<name>: every parameter's gradient of the total; topk_threshold_after (BatchTopK, after the forward)
  batches [4, 64, 8]: SAETrainer's four steps (lr 1e-2, dead_feature_window 1, so AuxK and the pre-activation loss
  come in) from init: steps/<i>/<loss name>, trained/<name> after them; inference/<name>: save_inference_model's
  tensors, and inference/cfg (its cfg.json, as JSON text)
sae_training_golden/<case>/: the training SAE at init, as save_model writes it (a SAELens trainer checkpoint's SAE:
  for BatchTopK, its architecture "batchtopk" and its topk_threshold)

The cases of ALIVE, TopK and BatchTopK with run-time normalisation, have no dead latent (dead all False, the
trainer's dead_feature_window 1000): SAELens takes no AuxK loss under layer_norm or constant_norm_rescale, and
raises a ValueError at the first step with a dead latent; "<case>/raises" is what it says for the half-dead x.
"""
import json
import os
import shutil

import numpy as np
import torch
from importlib.metadata import version
from safetensors.torch import load_file
from sae_lens.config import SAETrainerConfig
from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
from sae_lens.saes.sae import TrainStepInput
from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
from sae_lens.training.sae_trainer import SAETrainer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "sae_training_golden")
D_IN, D_SAE, N, STEPS, LR = 8, 32, 64, 4, 1e-2
JUMP = dict(jumprelu_bandwidth=0.5, jumprelu_init_threshold=0.3)
CASES = {  # name: (training class, config class, its settings, this step's coefficients)
    "topk": (TopKTrainingSAE, TopKTrainingSAEConfig, dict(k=4, aux_loss_coefficient=0.5), {}),
    "topk_unscaled": (TopKTrainingSAE, TopKTrainingSAEConfig, dict(k=4, rescale_acts_by_decoder_norm=False), {}),
    "batchtopk": (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig, dict(k=2.5, topk_threshold_lr=0.1), {}),
    "jumprelu": (JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig,
                 dict(**JUMP, l0_coefficient=0.7, pre_act_loss_coefficient=0.3), {"l0": 0.7}),
    "jumprelu_ste": (JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig,
                     dict(**JUMP, l0_coefficient=0.7, pre_act_loss_coefficient=0.3, jumprelu_ste_to_input=True),
                     {"l0": 0.7}),
    "jumprelu_tanh": (JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig,
                      dict(**JUMP, l0_coefficient=0.7, jumprelu_sparsity_loss_mode="tanh", jumprelu_tanh_scale=2.0),
                      {"l0": 0.7}),
    "jumprelu_tanh_ste_ln": (JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig,
                             dict(**JUMP, l0_coefficient=0.7, jumprelu_sparsity_loss_mode="tanh",
                                  jumprelu_ste_to_input=True, normalize_activations="layer_norm"), {"l0": 0.7}),
    "standard_layer_norm": (StandardTrainingSAE, StandardTrainingSAEConfig,
                            dict(l1_coefficient=0.3, normalize_activations="layer_norm"), {"l1": 0.3}),
    "standard_constant_norm": (StandardTrainingSAE, StandardTrainingSAEConfig,
                               dict(l1_coefficient=0.3, normalize_activations="constant_norm_rescale"), {"l1": 0.3}),
    "topk_layer_norm": (TopKTrainingSAE, TopKTrainingSAEConfig,
                        dict(k=4, aux_loss_coefficient=0.5, normalize_activations="layer_norm"), {}),
    "batchtopk_constant_norm": (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig,
                                dict(k=2.5, topk_threshold_lr=0.1, normalize_activations="constant_norm_rescale"), {}),
}
ALIVE = ("topk_layer_norm", "batchtopk_constant_norm")  # no dead latent: SAELens's AuxK refuses run-time normalisation


def new_sae(name):
    cls, cfg_cls, settings, _ = CASES[name]
    torch.manual_seed(0)
    sae = cls(cfg_cls(d_in=D_IN, d_sae=D_SAE, **settings))
    with torch.no_grad():
        sae.b_enc.copy_(torch.randn(D_SAE) * 0.1)
        sae.b_dec.copy_(torch.randn(D_IN) * 0.1)
        sae.W_enc.add_(torch.randn(D_IN, D_SAE) * 0.3)
        sae.W_dec.mul_(torch.rand(D_SAE, 1) + 0.5)  # rows of norms 0.05 to 0.15
        if hasattr(sae, "threshold"):
            sae.threshold.copy_(torch.rand(D_SAE) * 0.8)
    sae.cfg.metadata.hook_name = "blocks.1.hook_resid_pre"
    sae.cfg.metadata.model_name = "tiny"
    return sae


def tensors(sae, prefix):
    return {f"{prefix}{k}": v.detach().numpy().copy() for k, v in sae.state_dict().items()}


def main():
    out = {}
    shutil.rmtree(OUT, ignore_errors=True)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal((N, D_IN)).astype(np.float32))
    dead = torch.tensor(rng.random(D_SAE) < 0.5)
    batches = torch.tensor(rng.standard_normal((STEPS, N, D_IN)).astype(np.float32))
    for name, (_, _, settings, coefficients) in CASES.items():
        p = f"{name}/"
        out.update({f"{p}x": x.numpy(), f"{p}dead": dead.numpy(), f"{p}batches": batches.numpy()})
        sae = new_sae(name)
        sae.save_model(os.path.join(OUT, name))
        out.update(tensors(sae, f"{p}init/"))
        if name in ALIVE:
            out[f"{p}dead"] = np.zeros(D_SAE, bool)
            try:
                sae.training_forward_pass(TrainStepInput(sae_in=x, coefficients=coefficients, dead_neuron_mask=dead,
                                                         n_training_steps=0, is_logging_step=False))
            except ValueError as e:
                out[f"{p}raises"] = str(e)
        o = sae.training_forward_pass(TrainStepInput(sae_in=x, coefficients=coefficients, n_training_steps=0,
                                                     dead_neuron_mask=torch.tensor(out[f"{p}dead"]),
                                                     is_logging_step=False))
        o.loss.backward()
        out.update({f"{p}feature_acts": o.feature_acts.detach().numpy(), f"{p}hidden_pre": o.hidden_pre.detach().numpy(),
                    f"{p}sae_out": o.sae_out.detach().numpy(), f"{p}loss/total": o.loss.item()})
        out.update({f"{p}loss/{k}": v.item() for k, v in o.losses.items()})
        out.update({f"{p}grad/{k}": v.grad.numpy().copy() for k, v in sae.named_parameters()})
        if name.startswith("batchtopk"):
            out[f"{p}topk_threshold_after"] = sae.topk_threshold.item()

        sae = new_sae(name)
        trainer = SAETrainer(cfg=SAETrainerConfig(total_training_samples=STEPS * N, train_batch_size_samples=N, lr=LR, lr_end=LR,
                                                  dead_feature_window=1000 if name in ALIVE else 1), sae=sae,
                             data_provider=iter(batches))
        for i, batch in enumerate(batches):  # fit()'s loop, its losses kept
            step = trainer.step(batch)
            trainer.n_training_steps += 1
            out.update({f"{p}steps/{i}/{k}": v.item() for k, v in step.losses.items()})
            out[f"{p}steps/{i}/total"] = step.loss.item()
            if name.startswith("batchtopk"):
                out[f"{p}steps/{i}/topk_threshold"] = sae.topk_threshold.item()
        out.update(tensors(sae, f"{p}trained/"))
        folder = os.path.join(OUT, "inference")
        sae.save_inference_model(folder)
        out.update({f"{p}inference/{k}": v.numpy() for k, v in load_file(os.path.join(folder, "sae_weights.safetensors"))
                    .items()})
        with open(os.path.join(folder, "cfg.json")) as f:
            out[f"{p}inference/cfg"] = f.read()
        shutil.rmtree(folder)
        print(name, {k.split("/")[-1]: round(float(v), 4) for k, v in out.items() if k.startswith(f"{p}loss/")})
    np.savez_compressed(os.path.join(HERE, "sae_training_golden.npz"), **out)
    print(f"sae-lens {version('sae-lens')}, torch {torch.__version__}:", len(out), "entries")


if __name__ == "__main__":
    main()
