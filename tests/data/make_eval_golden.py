"""Write tests/data/eval_golden.json: what the field's own tools say on the Hugging Face folder
tests/data/hf/tiny (GPT-2's vocabulary, n_embd 8, 2 layers, n_positions 64), so that
tests/test_evaluate.py can hold evaluate.py to EleutherAI's lm-evaluation-harness and to minicons.

Dev-only: neither the project nor its CI imports these. In a separate virtualenv:

    pip install torch==2.13.0 transformers lm-eval minicons
    python tests/data/make_eval_golden.py

The file's "versions" entry records which made it (last: torch 2.13.0+cpu, transformers 5.24.0,
lm-eval 0.4.13, minicons 0.3.39). The format is fixed by issue 24's API:
  windows        lm_eval.utils.get_rolling_token_windows(ids, prefix, context, context - stride + 1),
                 each pair through make_disjoint_window: [[window context ids], [predicted ids]]
  rolling        HFLM(max_length=64).loglikelihood_rolling on one document: nll = -(its log-likelihood)
  loglikelihood  HFLM(max_length=64).loglikelihood on a (context, continuation) pair: ll and greedy
  surprisal      minicons IncrementalLMScorer.word_score_tokenized (whitespace words, bos_token=True,
                 surprisal=True, base_two=True) on single-spaced lines: [[word, bits], ...]
The run also recomputes every rolling document, loglikelihood pair and surprisal line straight
from GPT2LMHeadModel's logits (log_softmax, windows, truncation and word spans written out again
by hand) and stops if the tools disagree with it; it prints each pair's greedy margin in logits.
The windows are lm-eval's own function's output and are not recomputed here.
"""
import importlib.metadata
import json
import math
import os
import re

import numpy as np
import torch
import transformers
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from minicons import scorer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FOLDER = os.path.join(HERE, "hf", "tiny")
EOT = 50256
N_CTX = 64


def shakespeare(n_chars):
    """The start of the project's own tinyshakespeare text, cut at a line end."""
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read(n_chars * 2)
    return text[:text.index("\n", n_chars)]


def windows():
    rng = np.random.default_rng(0)
    cases = []
    for n in (1, 10, 64, 65, 130, 200):
        ids = [int(i) for i in rng.integers(0, EOT, n)]
        for context, stride in ((64, 64), (64, 16), (64, 1), (8, 3), (8, 8)):
            rolling = get_rolling_token_windows(ids, EOT, context, context - stride + 1)
            pairs = [make_disjoint_window(p) for p in rolling]
            cases.append({"ids": ids, "prefix": EOT, "context": context, "stride": stride,
                          "pairs": [[list(c), list(t)] for c, t in pairs]})
    return cases


def rolling(lm, texts):
    requests = [Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(texts)]
    return [{"text": text, "context": N_CTX, "nll": -float(ll)}
            for text, ll in zip(texts, lm.loglikelihood_rolling(requests, disable_tqdm=True))]


def loglikelihood(lm, pairs):
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    return [{"context": c, "continuation": x, "ll": float(ll), "greedy": bool(g)}
            for (c, x), (ll, g) in zip(pairs, lm.loglikelihood(requests, disable_tqdm=True))]


def surprisal(lines):
    model = scorer.IncrementalLMScorer(FOLDER, "cpu")
    scores = model.word_score_tokenized(lines, bos_token=True, tokenize_function=lambda s: s.split(),
                                        surprisal=True, base_two=True)
    alone = [model.word_score_tokenized([line], bos_token=True, tokenize_function=lambda s: s.split(),
                                        surprisal=True, base_two=True)[0] for line in lines]
    worst = max(abs(a[1] - b[1]) for s, t in zip(scores, alone) for a, b in zip(s, t))
    print(f"sanity: minicons batched vs one line at a time, largest difference {worst:.2e} bits")
    assert all([w for w, _ in s] == [w for w, _ in t] for s, t in zip(scores, alone)) and worst < 1e-4
    return [{"text": line, "words": [[w, float(b)] for w, b in words]} for line, words in zip(lines, scores)]


def greedy_pair(model, tokenizer, contexts):
    """A (context, continuation) pair whose one continuation token is the tiny model's argmax."""
    for context in contexts:
        ids = tokenizer.encode(context)
        with torch.no_grad():
            top = int(model(torch.tensor([ids[-N_CTX:]])).logits[0, -1].argmax())
        continuation = tokenizer.decode([top])
        if top != EOT and continuation.strip() and tokenizer.encode(context + continuation) == ids + [top]:
            return context, continuation
    raise SystemExit("no context found whose argmax continuation tokenizes back to itself")


def direct_ll(model, context_ids, continuation_ids):
    """log p(continuation | context) from the model's logits: lm-eval's recipe written out again."""
    inp = (context_ids + continuation_ids)[-(N_CTX + 1):][:-1]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([inp])).logits[0].float(), dim=-1)
    picked = logp[-len(continuation_ids):].gather(1, torch.tensor(continuation_ids)[:, None])[:, 0]
    return float(picked.sum())


def direct_rolling_nll(model, ids):
    """Each token predicted once: the first N_CTX after <|endoftext|>, then N_CTX at a time, each
    window's input the N_CTX tokens before its last prediction (stride = context = N_CTX)."""
    nll = -direct_ll(model, [EOT], ids[:N_CTX])
    for start in range(N_CTX, len(ids), N_CTX):
        end = min(start + N_CTX, len(ids))
        nll -= direct_ll(model, ids[end - N_CTX - 1:start], ids[start:end])
    return nll


def greedy_margin(model, context_ids, continuation_ids):
    """(greedy, how far it is from flipping, in logits): for a greedy continuation, the smallest gap between
    the best and second-best logit along it; otherwise the largest gap between the best logit and
    the continuation token's (float32 rounding in another implementation moves logits ~1e-6)."""
    inp = (context_ids + continuation_ids)[-(N_CTX + 1):][:-1]
    with torch.no_grad():
        logits = model(torch.tensor([inp])).logits[0, -len(continuation_ids):]
    top2 = torch.topk(logits, 2, dim=-1).values
    picked = logits.gather(1, torch.tensor(continuation_ids)[:, None])[:, 0]
    if bool((picked == top2[:, 0]).all()):
        return True, float((top2[:, 0] - top2[:, 1]).min())
    return False, float((top2[:, 0] - picked).max())


def dump(golden, path):
    """One JSON value a line, so that a remade golden diffs line by line."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        for i, (key, value) in enumerate(golden.items()):
            end = ",\n" if i < len(golden) - 1 else "\n"
            if isinstance(value, list):
                items = ",\n".join(json.dumps(item, ensure_ascii=False) for item in value)
                f.write(f"{json.dumps(key)}: [\n{items}\n]{end}")
            else:
                f.write(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{end}")
        f.write("}\n")


def direct_surprisal(model, tokenizer, line):
    """[(word, bits)]: each token goes to the whitespace word its last character falls in."""
    encoded = tokenizer(line, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([[EOT] + ids[:-1]])).logits[0].float(), dim=-1)
    spans = [m.span() for m in re.finditer(r"\S+", line)]
    bits = [0.0] * len(spans)
    for i, (t, (_, end)) in enumerate(zip(ids, offsets)):
        word = next(j for j, (a, b) in enumerate(spans) if a < end <= b)
        bits[word] -= float(logp[i, t]) / math.log(2)
    return [(line[a:b], x) for (a, b), x in zip(spans, bits)]


def encode_pair(tokenizer, context, continuation):
    if not context:
        return [EOT], tokenizer.encode(continuation)
    stripped = context.rstrip()
    whole, own = tokenizer.encode(context + continuation), tokenizer.encode(stripped)
    return own, whole[len(own):]


def main():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel.from_pretrained(FOLDER, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(FOLDER)
    lm = HFLM(pretrained=FOLDER, max_length=N_CTX, batch_size=1, device="cpu")

    long_text = shakespeare(400)  # 134 tokens: windows of 64, 64 and 6
    documents = [long_text, "Hello there, world.", "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved?\n"]
    assert len(tokenizer.encode(long_text)) > N_CTX
    greedy = greedy_pair(model, tokenizer, ["First Citizen:\nBefore we proceed any further, hear me", "The", "Hello",
                                            "It is", "And the", "I am the", "of the", "to the", "in the"])
    pairs = [("The quick brown fox", " jumps over the lazy dog"),
             ("The quick brown fox ", "jumps"),
             ("", "Hello world"),
             ("First Citizen:\n", "Before we proceed"),
             (shakespeare(300), " and the people"),
             (shakespeare(300) + " ", "Romans, countrymen"),
             ("Once upon a time", " there"),
             greedy]
    assert len(tokenizer.encode(pairs[4][0])) > N_CTX
    lines = ["The cat sat on the mat.", "Colorless green ideas sleep furiously", "I saw a dog",
             "First Citizen: Before we proceed any further, hear me speak."]

    golden = {"model": "hf/tiny", "windows": windows(), "rolling": rolling(lm, documents),
              "loglikelihood": loglikelihood(lm, pairs), "surprisal": surprisal(lines),
              "versions": {name: importlib.metadata.version(name)
                           for name in ("torch", "transformers", "lm_eval", "minicons")}}

    for item in golden["rolling"]:
        ids = tokenizer.encode(item["text"])
        mine = direct_rolling_nll(model, ids)
        print(f"sanity: rolling nll ({len(ids)} tokens): lm-eval {item['nll']:.6f}, by hand {mine:.6f}")
        assert math.isclose(mine, item["nll"], rel_tol=1e-5)
    for item in golden["loglikelihood"]:
        mine = direct_ll(model, *encode_pair(tokenizer, item["context"], item["continuation"]))
        print(f"sanity: ll {item['continuation']!r}: lm-eval {item['ll']:.6f}, by hand {mine:.6f}")
        assert math.isclose(mine, item["ll"], rel_tol=1e-5)
    for item in golden["surprisal"]:
        mine = direct_surprisal(model, tokenizer, item["text"])
        worst = max(abs(a[1] - b[1]) for a, b in zip(mine, item["words"]))
        print(f"sanity: surprisal of {item['text']!r}: minicons and by hand differ by at most {worst:.2e} bits")
        assert [w for w, _ in mine] == [w for w, _ in item["words"]] and worst < 1e-4

    dump(golden, os.path.join(HERE, "eval_golden.json"))
    for item in golden["loglikelihood"]:
        greedy, margin = greedy_margin(model, *encode_pair(tokenizer, item["context"], item["continuation"]))
        assert greedy == item["greedy"], item
        print(f"ll {item['ll']:10.4f} greedy {item['greedy']!s:5} margin {margin:7.4f}  "
              f"{item['context'][-30:]!r} + {item['continuation']!r}")
    print("rolling nll", [round(r["nll"], 4) for r in golden["rolling"]], "versions", golden["versions"])


if __name__ == "__main__":
    main()
