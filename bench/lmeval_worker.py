"""bench_evaluate.py's other side: lm-eval's HFLM on the same model and data, timed alone.

Dev-only (torch, transformers, lm-eval in their own virtualenv); bench_evaluate.py runs it as
    python bench/lmeval_worker.py TASK HF_FOLDER DATA.json BATCH THREADS
and reads one JSON line from stdout: {"seconds": the scoring alone, "result": [...]}.
TASK: rolling (loglikelihood_rolling, one request a document) or loglikelihood (one per pair).
"""
import json
import sys
import time

import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM


def main():
    task, folder, data, batch, threads = sys.argv[1:]
    torch.set_num_threads(int(threads))
    with open(data, encoding="utf-8") as f:
        items = json.load(f)
    lm = HFLM(pretrained=folder, batch_size=int(batch), device="cpu", dtype="float32")
    args = [(text,) for text in items] if task == "rolling" else [tuple(pair) for pair in items]
    kind = "loglikelihood_rolling" if task == "rolling" else "loglikelihood"
    requests = [Instance(kind, {}, a, i) for i, a in enumerate(args)]
    start = time.perf_counter()
    with torch.inference_mode():
        out = getattr(lm, kind)(requests, disable_tqdm=True)
    seconds = time.perf_counter() - start
    result = [float(x) for x in out] if task == "rolling" else [[float(ll), bool(g)] for ll, g in out]
    print(json.dumps({"seconds": seconds, "result": result}))


if __name__ == "__main__":
    main()
