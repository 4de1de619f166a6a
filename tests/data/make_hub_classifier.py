"""Write tests/data/hub_classifier/: two GPT2ForSequenceClassification folders as transformers 5 saves them
(save_pretrained of the model and of its tokenizer: config.json, model.safetensors, tokenizer.json and
tokenizer_config.json, no vocab.json or merges.txt), and golden.npz, what transformers computes on them.
tests/test_classify_hub.py serves them from a fake Hub (hf:owner/name) and holds train.py, evaluate.py
classify and gpt2_numpy.py to these numbers.

Dev-only (torch, transformers; last: torch 2.13.0, transformers 5.24.0):

    /work/ref/bin/python tests/data/make_hub_classifier.py

Both start from tests/data/shakespeare (its body, converted by convert.py --to hf, and its 512-token
vocabulary, given to GPT2Tokenizer as transformers 5 wants it) with a score head drawn here:
  named/    3 labels named in id2label (comedy, history, tragedy), pad_token_id <|endoftext|> (511)
  default/  num_labels left at transformers' default, 2, and no pad token: transformers then writes no
            id2label (its labels are LABEL_0 and LABEL_1) and "pad_token_id": null (each text is pooled
            at its last token, and a batch of more than one text is refused)
golden.npz: the texts and labels; for each folder the logits that from_pretrained(folder) gives on each
text alone, tokenized by AutoTokenizer.from_pretrained(folder) (the fast tokenizer, from tokenizer.json),
under "<folder>/ids/<i>" and "<folder>/logits"; for named/, the loss of each of 3 steps of a plain torch
loop (AdamW, lr 1e-3, betas 0.9, 0.999, eps 1e-8, weight decay 0, gradients clipped to norm 1, every
text in each batch, right-padded with the pad) from the folder as saved: "named/adamw_losses".
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

import convert  # noqa: E402
from make_hf_golden import gpt2_tokenizer  # noqa: E402  (this folder's scripts share it)

BODY = os.path.join(HERE, "shakespeare")
OUT = os.path.join(HERE, "hub_classifier")
LABELS = ["comedy", "history", "tragedy"]
TEXTS = [("ROMEO:\nO, she doth teach the torches to burn bright!", "tragedy"),
         ("KING HENRY:\nOnce more unto the breach, dear friends", "history"),
         ("BENEDICK:\nI will live in thy heart, die in thy lap", "comedy"),
         ("HAMLET:\nThe rest is silence.<|endoftext|>", "tragedy"),
         ("FALSTAFF:\nThe better part of valour is discretion", "history")]
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
STEPS = 3


def tokenizer():
    return gpt2_tokenizer(BODY, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>")


def save(name, lm_folder, seed, **config):
    """The body with a new score head (normal(0, 0.5): logits far enough apart to tell labels by), saved."""
    model = transformers.GPT2ForSequenceClassification.from_pretrained(lm_folder, **config)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=g) * 0.5)
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    tok = tokenizer()
    if config.get("pad_token_id") is not None:
        tok.pad_token = tok.eos_token
    tok.save_pretrained(folder)
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors", "tokenizer.json",
                                          "tokenizer_config.json"], os.listdir(folder)
    return folder


def logits_alone(folder):
    """Each text alone (a batch of one, as transformers can run a classifier with no pad token)."""
    model = transformers.GPT2ForSequenceClassification.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    out = {}
    rows = []
    with torch.no_grad():
        for i, (text, _) in enumerate(TEXTS):
            ids = tok(text, return_tensors="pt")["input_ids"]
            out[f"ids/{i}"] = ids[0].numpy()
            rows.append(model(ids).logits[0].numpy())
    out["logits"] = np.array(rows)
    out["id2label"] = np.array([model.config.id2label[i] for i in range(model.config.num_labels)])
    return out


def adamw_losses(folder):
    model = transformers.GPT2ForSequenceClassification.from_pretrained(folder)
    model.train()  # the config's dropout (0.1) would make the losses random: none, as train.py's default
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tok([t for t, _ in TEXTS], padding=True, return_tensors="pt")
    labels = torch.tensor([model.config.label2id[label] for _, label in TEXTS])
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return np.array(losses, np.float32)


def main():
    golden = {"texts": np.array([t for t, _ in TEXTS]), "text_labels": np.array([label for _, label in TEXTS]),
              "versions": np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"])}
    with tempfile.TemporaryDirectory() as tmp:
        lm = convert.convert(BODY, os.path.join(tmp, "lm"), "hf")
        named = save("named", lm, 38, num_labels=3, id2label=dict(enumerate(LABELS)),
                     label2id={name: i for i, name in enumerate(LABELS)}, pad_token_id=511)
        default = save("default", lm, 39)
    for name, folder in (("named", named), ("default", default)):
        golden |= {f"{name}/{k}": v for k, v in logits_alone(folder).items()}
    golden["named/adamw_losses"] = adamw_losses(named)
    with open(os.path.join(default, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert "id2label" not in config and config["pad_token_id"] is None, config
    np.savez_compressed(os.path.join(OUT, "golden.npz"), **golden)
    print("named", golden["named/logits"].argmax(-1), "default", golden["default/logits"].argmax(-1),
          "adamw", golden["named/adamw_losses"])


if __name__ == "__main__":
    main()
