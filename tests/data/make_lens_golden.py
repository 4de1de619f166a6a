"""Write tests/data/lens_golden.npz and tests/data/lens/tiny/: the tuned lens as tuned-lens 0.2.0 reads and trains
it, and linear probes as scikit-learn and Geometry of Truth fit them, on small random GPT-2s (tests/data/hf).

Dev-only, in a venv of its own (tuned-lens pins transformers below 5): torch 2.13.0 (CPU), tuned-lens 0.2.0,
transformers 4.57.6, scikit-learn 1.9.1. Run it offline from the project's folder:

    HF_HUB_OFFLINE=1 python tests/data/make_lens_golden.py

tuned-lens's scripts import torchdata's dataloader2, which torchdata 0.11 no longer has: it is stubbed, so that
its own optimizer settings (scripts/ingredients.py's Optimizer: SGD, Nesterov, lr = lr_scale (1 - momentum), the
linear schedule with its K - W) are used as they are. The training steps are train_loop.py's loop body, line for
line, in float32 (its autocast to bfloat16 left out): the model's hidden_states[:-1], each translator's loss
(KL with shift 0, or CE with shift 1) backpropagated on its own, clip_grad_norm_(1.0), opt.step, zero_grad,
scheduler.step. The batches are the windows taken B at a time in order, from the first again when they run out.

On hf/inner (3 blocks, 12 wide, a 96-id vocabulary, layer_norm_epsilon 1e-3), under "inner/": "ids" [2, 10] and
"reading" [L, 2, 10, V], every translator's logits of a lens with random translators ("weight" [L, C, C], "bias"
[L, C]), and "logits" the model's. Under "<case>/" for each training case: "windows" [N, T], the settings
("steps", "batch_size", "lr_scale", "momentum", "weight_decay", "warmup", "loss", "init": "zero" or "random"),
"losses" [K, L] (each translator's logged loss), "grad_weight", "grad_bias" (step 0's gradients, before
clipping), "weight" [L, C, C] and "bias" [L, C] after the K steps.

tests/data/lens/tiny/: a lens for hf/tiny (GPT-2's vocabulary) with random translators, as TunedLens.save writes
it (torch.save's params.pt, config.json with tuned-lens's unembed_hash); under "tiny/": the text's "ids" and its
reading at some columns ("cols" [K]: each position's top token and 64 at random; "reading" [L, T, K],
"logsumexp" [L, T] over all V), "serialization_id" (params.pt's). tests/data/lens/deep.pt: deep_archive's.

Probes, under "probe/": the texts ("texts", "labels"), their activations at blocks.1.hook_resid_pre of hf/tiny as
transformers computes them ("last" [N, 8], "mean" [N, 8]), and for each case "<case>/direction", "<case>/bias":
LogisticRegression(C, solver="lbfgs", tol=1e-10, max_iter=100000) (after StandardScaler where standardized:
"<case>/mean", "<case>/scale"), or Geometry of Truth's MMProbe.from_data (direction μ₁ - μ₀, and its iid form
pinv(cov, hermitian=True, atol=1e-3) @ direction); "synthetic/X" [60, 6], whose covariance has an eigenvalue
below 1e-3, for the iid probe's dropped eigenvalues.
"""
import json
import os
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
for name in ("torchdata.dataloader2", "torchdata.datapipes"):  # what tuned-lens's scripts import, gone from torchdata
    sys.modules[name] = types.ModuleType(name)
sys.modules["torchdata.dataloader2"].DataLoader2 = object

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from tuned_lens import TunedLens  # noqa: E402
from tuned_lens.scripts.ingredients import Optimizer  # noqa: E402
from tuned_lens.utils import shift_labels, shift_preds  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = "Hello there, my friend. How are you today?"
CASES = {  # case: (init, steps, batch, lr_scale, momentum, weight_decay, warmup, loss, windows' count and length)
    "kl_zero": ("zero", 5, 2, 1.0, 0.9, 1e-3, 0, "kl", (5, 10)),
    "ce_random": ("random", 4, 2, 0.5, 0.8, 1e-2, 2, "ce", (6, 9)),
    "kl_warmup": ("random", 6, 3, 1.0, 0.9, 1e-3, 1, "kl", (7, 8)),
}


def model_at(folder):
    model = transformers.GPT2LMHeadModel.from_pretrained(os.path.join(HERE, "hf", folder), dtype=torch.float32)
    model.config.name_or_path = f"tests/data/hf/{folder}"  # the lens's base_model_name_or_path: no local path
    return model.eval()


def randomized(lens, seed, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for translator in lens:
            translator.weight.copy_(torch.randn(translator.weight.shape, generator=g) * scale)
            translator.bias.copy_(torch.randn(translator.bias.shape, generator=g) * scale)
    return lens


def stacked(lens):
    return (torch.stack([t.weight.detach() for t in lens]).numpy().copy(),
            torch.stack([t.bias.detach() for t in lens]).numpy().copy())


def train_case(model, case, settings, golden):
    """train_loop.py's steps, in float32, on windows taken in order."""
    init, steps, batch_size, lr_scale, momentum, weight_decay, warmup, loss, (n, T) = settings
    lens = TunedLens.from_model(model)
    if init == "random":
        randomized(lens, 1)
    windows = np.random.default_rng(len(case)).integers(0, model.config.vocab_size, (n, T))
    opt_config = Optimizer(weight_decay=weight_decay, lr_scale=lr_scale, momentum=momentum, warmup_steps=warmup)
    params = [p for p in lens.parameters() if p.requires_grad]
    opt = opt_config.create_optim(params)
    scheduler = opt_config.create_scheduler(opt, steps)
    losses = []
    for step in range(steps):
        batch = torch.tensor(windows[np.arange(step * batch_size, (step + 1) * batch_size) % n])
        with torch.no_grad():
            output = model(input_ids=batch, output_hidden_states=True)
        final_logits, hidden_states = output.logits, output.hidden_states[:-1]
        if loss == "ce":
            labels, shift = batch, 1
        else:
            labels, shift = final_logits.float().log_softmax(dim=-1), 0
        labels = shift_labels(labels, shift)
        step_losses = []
        for i, h in enumerate(hidden_states):
            logits = shift_preds(lens(h, idx=i), shift)
            if loss == "ce":
                value = torch.nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten())
            else:
                value = torch.sum(labels.exp() * (labels - logits.log_softmax(-1)), dim=-1).mean()
            step_losses.append(value.item())
            value.backward()
        if step == 0:
            golden[f"{case}/grad_weight"] = torch.stack([t.weight.grad for t in lens]).numpy().copy()
            golden[f"{case}/grad_bias"] = torch.stack([t.bias.grad for t in lens]).numpy().copy()
        torch.nn.utils.clip_grad_norm_(lens.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        scheduler.step()
        losses.append(step_losses)
    weight, bias = stacked(lens)
    golden.update({f"{case}/windows": windows, f"{case}/steps": np.array(steps), f"{case}/batch_size": np.array(batch_size),
                   f"{case}/lr_scale": np.array(lr_scale), f"{case}/momentum": np.array(momentum),
                   f"{case}/weight_decay": np.array(weight_decay), f"{case}/warmup": np.array(warmup),
                   f"{case}/loss": np.array(loss), f"{case}/init": np.array(init), f"{case}/losses": np.array(losses),
                   f"{case}/weight": weight, f"{case}/bias": bias})


def inner_golden(golden):
    model = model_at("inner")
    lens = randomized(TunedLens.from_model(model), 1)  # the training cases' "random" lens
    ids = torch.tensor(np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 10)))
    with torch.no_grad():
        output = model(input_ids=ids, output_hidden_states=True)
        reading = torch.stack([lens(h, idx=i) for i, h in enumerate(output.hidden_states[:-1])])
    weight, bias = stacked(lens)
    golden.update({"inner/ids": ids.numpy(), "inner/reading": reading.numpy(), "inner/logits": output.logits.numpy(),
                   "inner/weight": weight, "inner/bias": bias})
    for case, settings in CASES.items():
        train_case(model, case, settings, golden)


def tiny_golden(golden):
    model = model_at("tiny")
    tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.join(HERE, "hf", "tiny"))
    lens = randomized(TunedLens.from_model(model), 2, scale=0.5)
    folder = os.path.join(HERE, "lens", "tiny")
    lens.save(folder)
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        output = model(input_ids=ids, output_hidden_states=True)
        reading = torch.stack([lens(h, idx=i)[0] for i, h in enumerate(output.hidden_states[:-1])])  # [L, T, V]
    cols = np.union1d(reading.argmax(-1).numpy().ravel(),
                      np.random.default_rng(0).choice(reading.shape[-1], 64, replace=False))
    import zipfile

    with zipfile.ZipFile(os.path.join(folder, "params.pt")) as z:
        golden["tiny/serialization_id"] = np.array(z.read("params/.data/serialization_id").decode())
    golden.update({"tiny/ids": ids.numpy()[0], "tiny/cols": cols, "tiny/reading": reading[..., cols].numpy(),
                   "tiny/logsumexp": torch.logsumexp(reading, -1).numpy()})
    return model, tokenizer


SUBJECTS = ["the cat", "my friend", "the old king", "a small bird", "her brother", "the teacher", "our dog",
            "the captain", "a young girl", "the farmer"]
GOOD = ["smiled at the kind words", "loved the bright morning", "laughed with joy", "sang a happy song",
        "felt wonderful today", "thanked them warmly"]
BAD = ["frowned at the cruel words", "hated the grey morning", "wept with sorrow", "cursed the awful rain",
       "felt miserable today", "shouted at them angrily"]


def probe_texts():
    """40 short texts, half of them glad (label 1), half sad (label 0)."""
    rng = np.random.default_rng(3)
    texts, labels = [], []
    for i in range(40):
        label = i % 2
        texts.append(f"{SUBJECTS[rng.integers(len(SUBJECTS))]} {(GOOD if label else BAD)[rng.integers(6)]}")
        labels.append(label)
    return texts, np.array(labels)


def logistic(X, y, C):
    clf = LogisticRegression(C=C, solver="lbfgs", tol=1e-10, max_iter=100000).fit(X, y)
    assert clf.n_iter_[0] < 100000
    return clf.coef_[0], clf.intercept_[0]


def mass_mean(X, y, iid):
    """Geometry of Truth's MMProbe.from_data, and its iid form's direction, inv @ direction."""
    acts, labels = torch.tensor(X, dtype=torch.float64), torch.tensor(y)
    pos, neg = acts[labels == 1], acts[labels == 0]
    direction = pos.mean(0) - neg.mean(0)
    centred = torch.cat([pos - pos.mean(0), neg - neg.mean(0)], 0)
    covariance = centred.t() @ centred / acts.shape[0]
    if iid:
        direction = torch.linalg.pinv(covariance, hermitian=True, atol=1e-3) @ direction
    mid = (pos.mean(0) + neg.mean(0)) / 2
    return direction.numpy(), float(-direction @ mid)


def probe_golden(model, tokenizer, golden):
    texts, labels = probe_texts()
    features = {"last": [], "mean": []}
    with torch.no_grad():
        for text in texts:
            h = model(input_ids=torch.tensor([tokenizer(text)["input_ids"]]), output_hidden_states=True).hidden_states[1][0]
            features["last"].append(h[-1].numpy())
            features["mean"].append(h.mean(0).numpy())
    X = dict(zip(features, map(np.stack, features.values())))
    rng = np.random.default_rng(4)
    base = rng.standard_normal((60, 5))
    synthetic = np.hstack([base, base[:, :1] * 1.0 + rng.standard_normal((60, 1)) * 1e-3])  # a near-copy
    synthetic_labels = (base[:, 1] + 0.5 * rng.standard_normal(60) > 0).astype(np.int64)
    golden.update({"probe/texts": np.array(texts), "probe/labels": labels, "probe/last": X["last"],
                   "probe/mean": X["mean"], "synthetic/X": synthetic, "synthetic/labels": synthetic_labels})
    cases = {  # case: (features, method, C, standardize, iid)
        "logistic_last": ("last", "logistic", 1.0, False, False),
        "logistic_mean_std": ("mean", "logistic", 0.05, True, False),
        "logistic_strong": ("last", "logistic", 100.0, False, False),
        "mean_diff_last": ("last", "mean-diff", None, False, False),
        "mean_diff_iid": ("mean", "mean-diff", None, False, True),
        "mean_diff_iid_std": ("last", "mean-diff", None, True, True),
        "synthetic_iid": ("synthetic", "mean-diff", None, False, True),
        "synthetic_logistic": ("synthetic", "logistic", 3.0, True, False),
    }
    for case, (feature, method, C, standardize, iid) in cases.items():
        data = synthetic if feature == "synthetic" else X[feature].astype(np.float64)
        y = synthetic_labels if feature == "synthetic" else labels
        mean, scale = np.zeros(data.shape[1]), np.ones(data.shape[1])
        if standardize:
            scaler = StandardScaler().fit(data)
            mean, scale = scaler.mean_, scaler.scale_
            data = scaler.transform(data)
        direction, bias = logistic(data, y, C) if method == "logistic" else mass_mean(data, y, iid)
        golden.update({f"{case}/features": np.array(feature), f"{case}/method": np.array(method),
                       f"{case}/C": np.array(np.nan if C is None else C), f"{case}/standardize": np.array(standardize),
                       f"{case}/iid": np.array(iid), f"{case}/direction": direction, f"{case}/bias": np.array(bias),
                       f"{case}/mean": mean, f"{case}/scale": scale})


def deep_archive(golden):
    """tests/data/lens/deep.pt: 13 translators 20 wide, so that the pickle's memo passes 255 (LONG_BINPUT) and a
    weight's count 256 (BININT2); the values are their own positions, so that a reader's order shows."""
    import zipfile

    layers = torch.nn.ModuleList([torch.nn.Linear(20, 20) for _ in range(13)])
    with torch.no_grad():
        for i, p in enumerate(layers.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) + 1000 * i)
    path = os.path.join(HERE, "lens", "deep.pt")
    torch.save(layers.state_dict(), path)
    with zipfile.ZipFile(path) as z:
        golden["deep/serialization_id"] = np.array(z.read("deep/.data/serialization_id").decode())


def main():
    torch.manual_seed(0)
    golden = {}
    deep_archive(golden)
    inner_golden(golden)
    model, tokenizer = tiny_golden(golden)
    probe_golden(model, tokenizer, golden)
    np.savez_compressed(os.path.join(HERE, "lens_golden.npz"), **golden)
    with open(os.path.join(HERE, "lens", "tiny", "config.json"), encoding="utf-8") as f:
        print(json.load(f))
    print(f"{len(golden)} arrays; torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
