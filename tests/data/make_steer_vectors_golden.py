"""Write tests/data/steer_vectors_golden.npz: steering vectors from contrastive pairs, as the steering-vectors
package computes and applies them, on tests/data/hf/tiny (GPT-2's vocabulary, 2 blocks, random weights).

Dev-only, in a venv of its own (steering-vectors pins transformers below 5): steering-vectors 0.12.2,
transformers 4.57.6, torch. Run it offline:

    HF_HUB_OFFLINE=1 python tests/data/make_steer_vectors_golden.py

The vectors: train_steering_vector(model, tokenizer, pairs, layers, read_token_index, aggregator) with the
package's mean_aggregator or pca_aggregator (texts tokenized as the tokenizer does, without <|endoftext|>;
batch_size 1). Applied: `with vector.apply(model, multiplier=M, min_token_index=K)`: the logits of one
forward pass over the prompt and the new tokens, and the greedy tokens of model.generate with use_cache=False
(every step a whole pass from position 0, where the package's count of positions is the text's; the
attention mask is passed, so that nothing is masked). "ids_package_cached" are the package's own tokens
with the KV cache on (use_cache=True): each cached step is a pass of one position, index 0 to the package,
so with K > 0 the generated tokens are never steered (docs/steering.md).

Under "<case>/": "pairs_positive", "pairs_negative" (each text's ids, concatenated) with "pairs_lengths" [N, 2],
"layers", "read_token_index", "multiplier", "min_token_index", "aggregator" ("mean" or "pca"), "vectors"
[len(layers), C] (before the multiplier), "prompt" [T], "ids" [16], the logits at some columns ("cols" [K],
"logits" [T + 16, K]: each position's top token and 256 at random), "logsumexp" [T + 16] over all V, and
"ids_package_cached".
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from importlib.metadata import version  # noqa: E402
from steering_vectors import mean_aggregator, pca_aggregator, train_steering_vector  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
N_COLS = 256  # the logits are kept at the columns each position's top token is, and these many more at random

N_NEW = 16
PAIRS = [("I love this film, it is wonderful", "I hate this film, it is awful"),
         ("What a lovely morning", "What a dreadful morning"),
         ("She smiled at the kind words", "She frowned at the cruel words"),
         ("Thank you so much", "Leave me alone now")]
CASES = {  # case: (prompt, layers, aggregator, read_token_index, multiplier, min_token_index)
    "mean_both": ("I think that the weather", [0, 1], "mean", -1, 1.0, 0),
    "mean_from_3": ("I think that the weather", [1], "mean", -2, 8.0, 3),
    "pca_1": ("My opinion of the play is", [1], "pca", 1, -6.0, 2),
}


def kept_logits(case, logits):
    """[T, V] -> the golden's "<case>/cols" [K] and "<case>/logits" [T, K], and "<case>/logsumexp" [T] over all V."""
    logits = logits.float()
    cols = np.union1d(logits.argmax(-1).numpy(), np.random.default_rng(0).choice(logits.shape[-1], N_COLS, False))
    return {f"{case}/cols": cols, f"{case}/logits": logits[:, cols].numpy(),
            f"{case}/logsumexp": torch.logsumexp(logits, -1).numpy()}


def main():
    torch.set_grad_enabled(False)
    folder = os.path.join(HERE, "hf", "tiny")
    model = transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    golden = {}
    tokenized = [[tokenizer(t)["input_ids"] for t in pair] for pair in PAIRS]
    for case, (text, layers, aggregator, read, multiplier, k) in CASES.items():
        vector = train_steering_vector(model, tokenizer, PAIRS, layers=layers, read_token_index=read,
                                       aggregator=mean_aggregator() if aggregator == "mean" else pca_aggregator())
        prompt = torch.tensor([tokenizer(text)["input_ids"]])
        with vector.apply(model, multiplier=multiplier, min_token_index=k):
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=N_NEW,
                                 do_sample=False, use_cache=False, pad_token_id=50256)
            logits = model(out).logits[0]
            cached = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=N_NEW,
                                    do_sample=False, use_cache=True, pad_token_id=50256)
        golden.update({
            f"{case}/pairs_positive": np.concatenate([p for p, _ in tokenized]),
            f"{case}/pairs_negative": np.concatenate([n for _, n in tokenized]),
            f"{case}/pairs_lengths": np.array([[len(p), len(n)] for p, n in tokenized]),
            f"{case}/layers": np.array(layers), f"{case}/aggregator": np.array(aggregator),
            f"{case}/read_token_index": np.array(read), f"{case}/multiplier": np.array(multiplier),
            f"{case}/min_token_index": np.array(k),
            f"{case}/vectors": torch.stack([vector.layer_activations[layer] for layer in layers]).numpy(),
            f"{case}/prompt": prompt[0].numpy(), f"{case}/ids": out[0, prompt.shape[1]:].numpy(),
            **kept_logits(case, logits), f"{case}/ids_package_cached": cached[0, prompt.shape[1]:].numpy()})
    golden["versions"] = np.array(f"torch {torch.__version__}, transformers {version('transformers')}, "
                                  f"steering-vectors {version('steering-vectors')}")
    np.savez_compressed(os.path.join(HERE, "steer_vectors_golden.npz"), **golden)
    for case in CASES:
        print(case, golden[f"{case}/ids"].tolist(), golden[f"{case}/ids_package_cached"].tolist())


if __name__ == "__main__":
    main()
