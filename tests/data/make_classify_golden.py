"""Write tests/data/classify_golden.npz: what transformers' GPT2ForSequenceClassification (float32,
dropout 0) computes with the weights of tests/data/tiny (GPT-2's vocabulary, 64 positions) and a
score head [3, 8] drawn here. tests/test_classify.py holds classify.py and train.py to it.

Dev-only (torch, transformers; last: torch 2.13.0, transformers 5.24.0):

    /work/ref/bin/python tests/data/make_classify_golden.py

The texts are tokenized by transformers' GPT2Tokenizer (GPT-2's vocabulary, built from the two
tables as transformers 5 wants them), padded on the right with <|endoftext|>, as a GPT-2 is padded.
One text ends in <|endoftext|> written in it, which the tokenizer reads as the special id: the
model pools it at the token before.

Under "batch/": ids [B, T], attention_mask [B, T], positions [B] (the pooled positions, as the model
finds them), labels [B], logits [B, K], loss, and each parameter's gradient by our name ("score",
"wpe", "h0/attn/c_attn/w", ...); wte's as its full gradient (the tied output layer is not used: this
is the gather's alone).
Under "hf_folder/": transformers' own reading of the folder that convert.py --to hf writes from a
classifier folder (tiny and the starting head, in the project's format): the logits that
GPT2ForSequenceClassification.from_pretrained(OUT) gives on the batch, its config's labels and pad id,
and the SHA-256 of each file convert.py wrote (the test converts again: the same bytes, so
transformers' numbers are about what the project writes now).
Under "lora/": a LoRA classifier trained here by train.py (rank 2 on c_attn, 3 steps from tiny, a
language model: a new head), and the logits that PEFT gives with its adapter,
PeftModel.from_pretrained(GPT2ForSequenceClassification.from_pretrained(tiny in Hugging Face's format,
num_labels=3, pad_token_id=50256), OUT): the test trains the same run and compares its own logits.
Under "adamw/": the loss at each of 4 steps of a plain torch loop (torch.optim.AdamW, lr 1e-3, betas
0.9, 0.999, eps 1e-8, weight decay 0, gradients clipped to norm 1, a constant rate, every example in
each batch) on TRAIN's texts and labels, from the same start.
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import peft
import torch
import transformers

from make_grad_golden import our_names
from make_hf_golden import HERE, gpt2_tokenizer, hf_model

ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

import convert  # noqa: E402
from interface import train_cli  # noqa: E402
from plumbing import classifier_files  # noqa: E402

VOCAB = os.path.join(os.path.dirname(os.path.dirname(HERE)), "data", "gpt2-vocab")
PAD = 50256
LABELS = ["ham", "other", "spam"]  # sorted: label i is score's row i
TEXTS = [("Win a free cruise now, reply YES", "spam"),
         ("Are we still on for lunch?", "ham"),
         ("Call me when you land<|endoftext|>", "ham"),
         ("The meeting moved to Thursday at ten, same room as last week", "other")]
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
STEPS = 4


def tokenizer():
    tok = gpt2_tokenizer(VOCAB)
    tok.pad_token = tok.eos_token
    return tok


def classifier(score):
    """GPT2ForSequenceClassification holding tiny's weights and this score."""
    lm, hp = hf_model("tiny")
    config = lm.config
    config.num_labels, config.pad_token_id = len(LABELS), PAD
    model = transformers.GPT2ForSequenceClassification(config).float().eval()
    missing, unexpected = model.load_state_dict(
        {k: v for k, v in lm.state_dict().items() if k.startswith("transformer.")} |
        {"score.weight": torch.from_numpy(score)}, strict=False)
    assert not unexpected and all(k.endswith((".attn.bias", ".masked_bias")) for k in missing), (missing, unexpected)
    return model, hp


def batch(tok):
    encoded = tok([t for t, _ in TEXTS], padding=True, return_tensors="pt")
    labels = torch.tensor([LABELS.index(label) for _, label in TEXTS])
    return encoded["input_ids"], encoded["attention_mask"], labels


def gradients(score, tok):
    model, hp = classifier(score)
    ids, mask, labels = batch(tok)
    seen = {}
    model.score.register_forward_hook(lambda m, i, o: seen.update(hidden=i[0]))
    out = model(ids, labels=labels)
    out.loss.backward()
    logits_all = model.score(seen["hidden"])  # [B, T, K]: which position each row's logits came from
    positions = [int(np.flatnonzero(np.all(np.isclose(la.detach().numpy(), lo.detach().numpy(), 0, 0), -1))[-1])
                 for la, lo in zip(logits_all, out.logits)]
    params = dict(model.named_parameters())
    g = {"ids": ids.numpy(), "attention_mask": mask.numpy(), "positions": np.array(positions), "labels": labels.numpy(),
         "logits": out.logits.detach().numpy(), "loss": np.float32(out.loss.item()),
         "score": params["score.weight"].grad.numpy(), "wte": params["transformer.wte.weight"].grad.numpy()}
    for ours, theirs in our_names(hp["n_layer"]).items():
        g[ours] = params[theirs].grad.numpy()
    return g


def adamw_losses(score, tok):
    model, _ = classifier(score)
    ids, _, labels = batch(tok)
    model.train()  # dropout is 0: train() changes nothing but the mode
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return {"losses": np.array(losses, np.float32)}


def tiny_folder(folder, score=None):
    """tests/data/tiny with GPT-2's vocabulary, a classifier if a score is given (the project's format)."""
    os.makedirs(folder)
    for source in (os.path.join(HERE, "tiny"), VOCAB):
        for name in os.listdir(source):
            if name != "LICENSE":
                shutil.copy(os.path.join(source, name), folder)
    for name, content in (classifier_files.head_files(score, LABELS, PAD) if score is not None else {}).items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(content)
    return folder


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


HF_FILES = ("config.json", "model.safetensors")


def hf_folder(score, tok, tmp):
    out = convert.convert(tiny_folder(os.path.join(tmp, "cls"), score), os.path.join(tmp, "cls-hf"), "hf")
    model, info = transformers.GPT2ForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    model.eval()
    ids, _, _ = batch(tok)
    with torch.no_grad():
        logits = model(ids).logits.numpy()
    config = model.config
    return {"logits": logits, "id2label": np.array([config.id2label[i] for i in range(config.num_labels)]),
            "pad_token_id": np.int64(config.pad_token_id), "architectures": np.array(config.architectures),
            "sha256": np.array([sha256(os.path.join(out, name)) for name in HF_FILES])}


LORA_RUN = ["--batch-size", "4", "--steps", "3", "--lr", "1e-2", "--lora-rank", "2", "--val-fraction", "0", "--quiet"]


def labelled_file(folder):
    path = os.path.join(folder, "labelled.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": text, "label": label}) + "\n" for text, label in TEXTS)
    return path


def lora_classifier(tok, tmp):
    base = tiny_folder(os.path.join(tmp, "lm"))
    out = os.path.join(tmp, "lora")
    assert train_cli.main(["--model", base, "--data", labelled_file(tmp), "--out", out, *LORA_RUN]) == 0
    base_hf = convert.convert(base, os.path.join(tmp, "lm-hf"), "hf")
    model = transformers.GPT2ForSequenceClassification.from_pretrained(base_hf, num_labels=len(LABELS),
                                                                        pad_token_id=PAD)
    model = peft.PeftModel.from_pretrained(model, out).eval()
    ids, _, _ = batch(tok)
    with torch.no_grad():
        return {"logits": model(ids).logits.numpy()}


def main():
    score = (np.random.default_rng(38).standard_normal((len(LABELS), 8)) * 0.5).astype(np.float32)
    tok = tokenizer()
    golden = {"start_score": score, "texts": np.array([t for t, _ in TEXTS]), "text_labels": np.array(
        [label for _, label in TEXTS]), "label_names": np.array(LABELS),
        "versions": np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"])}
    golden |= {f"batch/{k}": v for k, v in gradients(score, tok).items()}
    golden |= {f"adamw/{k}": v for k, v in adamw_losses(score, tok).items()}
    with tempfile.TemporaryDirectory() as tmp:
        golden |= {f"hf_folder/{k}": v for k, v in hf_folder(score, tok, tmp).items()}
        golden |= {f"lora/{k}": v for k, v in lora_classifier(tok, tmp).items()}
    golden["versions"] = np.append(golden["versions"], f"peft {peft.__version__}")
    np.savez_compressed(os.path.join(HERE, "classify_golden.npz"), **golden)
    print("positions", golden["batch/positions"], "loss", golden["batch/loss"], "adamw", golden["adamw/losses"])


if __name__ == "__main__":
    main()
