"""The command line of evaluate.py: subcommands, files, printing and exit codes.

    python evaluate.py perplexity FILE [FILE ...] [--context N] [--stride S]
    python evaluate.py surprisal FILE            # one text per line
    python evaluate.py choice FILE.jsonl         # {"context": str, "choices": [str, ...], "answer": int} a line
    python evaluate.py lambada FILE.jsonl        # {"text": str} a line
    python evaluate.py classify FILE.jsonl --model CLS   # {"text": str, "label"?} a line: a classifier's labels
    python evaluate.py preference FILE.jsonl --model POLICY --reference REF   # {"prompt", "chosen", "rejected"}

Each prints a short table, or with --json one JSON object on stdout, and only when the work is
done, so an interruption leaves nothing half-written. Exit status: 0 done, 2 a user's mistake
(one line on stderr), 130 interrupted (Ctrl-C or SIGTERM). Anything else is a bug and shows
its traceback.
"""
import argparse
import json
import sys

import classify
import dpo
import evaluate
from interface import loading
from interface.options import array_module, at_least, device_flag, model_flags, on_device, threads_flag, user_message
from plumbing import classifier_files
from plumbing.corpus import jsonl_objects, read_documents
from plumbing.errors import UserError, exit_status, fail, read_text
from plumbing.progress import progress


def parse_args(argv):
    common = argparse.ArgumentParser(add_help=False)
    model_flags(common)
    common.add_argument("--batch-size", type=at_least(1), default=evaluate.BATCH_SIZE, metavar="B",
                        help="at most B texts or windows in one forward pass (default: %(default)s)")
    common.add_argument("--batch-tokens", type=at_least(1), default=evaluate.BATCH_TOKENS, metavar="N",
                        help="at most N positions in one forward pass: its texts x the longest one's tokens; "
                             "a text longer than N goes alone (default: %(default)s)")
    common.add_argument("--limit", type=at_least(1), help="only the first N items (documents, lines)")
    common.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    common.add_argument("--quiet", action="store_true", help="no progress display")
    threads_flag(common)
    device_flag(common)
    p = argparse.ArgumentParser(prog="evaluate.py", allow_abbrev=False,
                                description="Measure a GPT-2 as lm-eval and minicons do (docs/evaluating.md).")
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ppl = commands.add_parser("perplexity", parents=[common], allow_abbrev=False,
                              help="perplexity, bits per byte: each FILE a document (a folder: each .txt in it; "
                                   ".jsonl: each line's text, or an example's prompt + response)")
    ppl.add_argument("files", nargs="+", metavar="FILE")
    ppl.add_argument("--context", type=at_least(), help="tokens a window reads (default: the model's n_ctx)")
    ppl.add_argument("--stride", type=at_least(), help="tokens a window moves, 1..context (default: the context)")
    for name, what in (("surprisal", "each word's surprisal in bits, one text a line"),
                       ("choice", 'multiple choice: {"context", "choices", "answer"} a line'),
                       ("lambada", 'LAMBADA, lm-eval\'s lambada_openai: {"text"} a line'),
                       ("classify", 'a classifier\'s labels: {"text"} or {"text", "label"} a line (with labels: the '
                                    'accuracy and the confusion table)')):
        commands.add_parser(name, parents=[common], allow_abbrev=False, help=what).add_argument("file", metavar="FILE")
    pref = commands.add_parser("preference", allow_abbrev=False, help='DPO\'s metrics of a tuned model against its '
                               'reference, as TRL reports them: {"prompt", "chosen", "rejected"} a line')
    pref.add_argument("file", metavar="FILE")
    model_flags(pref, model_help="the tuned model (the policy): a size, a folder or hf:owner/name")
    threads_flag(pref)
    pref.add_argument("--reference", required=True, metavar="MODEL", help="the model it was tuned against (the "
                                                                          "same vocabulary and context)")
    pref.add_argument("--beta", type=float, default=0.1, help="DPO's beta, as trained (default: %(default)s)")
    pref.add_argument("--dpo-loss", choices=dpo.LOSSES, default="sigmoid", help="as trained (default: %(default)s)")
    pref.add_argument("--batch-size", type=at_least(1), default=evaluate.BATCH_SIZE, metavar="B",
                      help="at most B pairs in one forward pass (default: %(default)s)")
    pref.add_argument("--limit", type=at_least(1), help="only the first N pairs")
    pref.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    pref.add_argument("--quiet", action="store_true", help="no progress display")
    for parser in [p, *commands.choices.values()]:
        parser.error = fail
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.stdout.reconfigure(errors="replace")
    return exit_status(lambda: RUN[args.command](args), user_message)


def load(args):
    xp = array_module(args)  # numpy, or cupy once a GPU has answered: before the model is fetched
    encoder, hparams, params = loading.load_model(args.model, args.models_dir, args.base_url, quiet=args.quiet)
    return encoder, hparams, on_device(xp, params, args.model)


def counter(args, total, unit):
    """The progress display, and the callback that the scoring tells of each text's tokens as it is scored."""
    bar = progress(total, unit, quiet=args.quiet)
    return bar, bar.update


# --- reading the files -----------------------------------------------------------------------

def text_lines(path):
    """A UTF-8 file's lines, without their line ends (a last empty line after the final newline dropped)."""
    lines = read_text(path).split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


# --- the commands ----------------------------------------------------------------------------

def run_perplexity(args):
    docs = read_documents(args.files)[:args.limit]  # as train.py and bpe.py read them
    encoder, hparams, params = load(args)
    counts, windows = evaluate.document_windows(docs, encoder, hparams, args.context, args.stride)
    bar, tick = counter(args, counts["tokens"], "tokens")
    with bar:
        result = evaluate.perplexity_fields(counts, evaluate.score_requests(
            windows, params, hparams, args.batch_size, tick, batch_tokens=args.batch_tokens))
    if args.json:
        print(json.dumps(result))
        return
    for field in ("documents", "tokens", "bytes", "words", "context", "stride"):
        print(f"{field:<16}{result[field]:,}")
    for field in ("nll", "loss", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte"):
        print(f"{field:<16}{result[field]:.4f}")


def run_surprisal(args):
    lines = text_lines(args.file)[:args.limit]
    encoder, hparams, params = load(args)
    bar, tick = counter(args, None, "tokens")
    try:
        with bar:
            scored = evaluate.word_surprisals(lines, encoder, params, hparams, args.batch_size, tick,
                                              batch_tokens=args.batch_tokens)
    except UserError as e:
        raise UserError(e.message, path=args.file) from None
    if args.json:
        print(json.dumps([{"line": n, "text": line, "words": [{"word": w, "surprisal": s, "tokens": k}
                                                              for w, s, k in words]}
                          for n, (line, words) in enumerate(zip(lines, scored), 1)]))
        return
    print("line\tword\tsurprisal\ttokens")
    for n, words in enumerate(scored, 1):
        for w, s, k in words:
            print(f"{n}\t{w}\t{s:.4f}\t{k}")


def run_choice(args):
    items = jsonl_objects(args.file, {"context": str, "choices": list, "answer": int}, args.limit)
    for n, item in items:
        if not item["choices"] or not all(isinstance(c, str) for c in item["choices"]):
            raise UserError(f"line {n}: 'choices' must be a non-empty list of strings", path=args.file)
        if not 0 <= item["answer"] < len(item["choices"]):
            raise UserError(f"line {n}: 'answer' {item['answer']} is not one of the choices "
                            f"0..{len(item['choices']) - 1}", path=args.file)
        if "" in item["choices"]:
            raise UserError(f"line {n}: a choice is empty", path=args.file)
    encoder, hparams, params = load(args)
    pairs = [(item["context"], c) for _, item in items for c in item["choices"]]
    names = [f"{args.file}: line {n}" for n, item in items for _ in item["choices"]]
    requests = evaluate.loglikelihood_requests(pairs, encoder, hparams["n_ctx"], names)
    bar, tick = counter(args, sum(len(t) for _, t in requests), "tokens")
    with bar:
        lls = [float(lp.sum(dtype="float64")) for lp, _ in evaluate.score_requests(
            requests, params, hparams, args.batch_size, tick, batch_tokens=args.batch_tokens)]
    per_item, i = [], 0
    for _, item in items:
        per_item.append(lls[i:i + len(item["choices"])])
        i += len(item["choices"])
    result = evaluate.choice([item for _, item in items], per_item)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'n':<10}{result['n']:,}\n{'acc':<10}{result['acc']:.4f}\n{'acc_norm':<10}{result['acc_norm']:.4f}")


def run_lambada(args):
    items = jsonl_objects(args.file, {"text": str}, args.limit)
    for n, item in items:
        if " " not in item["text"].strip():
            raise UserError(f"line {n}: the text needs a context and a last word, with a space between them: "
                            "too short to score", path=args.file)
    encoder, hparams, params = load(args)
    pairs = [evaluate.lambada_pair(item["text"]) for _, item in items]
    requests = evaluate.loglikelihood_requests(pairs, encoder, hparams["n_ctx"],
                                               [f"{args.file}: line {n}" for n, _ in items])
    bar, tick = counter(args, sum(len(t) for _, t in requests), "tokens")
    with bar:
        results = [(float(lp.sum(dtype="float64")), greedy) for lp, greedy in evaluate.score_requests(
            requests, params, hparams, args.batch_size, tick, batch_tokens=args.batch_tokens)]
    result = evaluate.lambada(results)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'n':<12}{result['n']:,}\n{'acc':<12}{result['acc']:.4f}\n{'perplexity':<12}{result['perplexity']:.4f}")


def labelled_lines(path, limit):
    """{"text"} lines, or {"text", "label"} lines (all of them labelled, or none). -> (texts, labels or None)"""
    items = jsonl_objects(path, {"text": str}, limit)
    has = [("label" in item) for _, item in items]
    if any(has) and not all(has):
        n = items[has.index(not has[0])][0]
        raise UserError(f"line {n} {'has no' if has[0] else 'has a'} label, unlike the lines before it: label every "
                        "line, or none", path=path)
    for n, item in items:
        if has[0] and (not isinstance(item["label"], (str, int)) or isinstance(item["label"], bool)):
            raise UserError(f"line {n}: 'label' must be a string or a whole number", path=path)
    return [item["text"] for _, item in items], [item["label"] for _, item in items] if has and has[0] else None


def run_preference(args):
    """TRL's metrics over the pairs (those training would keep: a prompt that fills the context is dropped)."""
    if not 0 < args.beta <= 3.4e38:  # as train.py --beta takes it
        fail(f"--beta must be above 0 and at most 3.4e+38 (as train.py takes it), got {args.beta:g}")
    texts = dpo.read_pairs(args.file)[:args.limit]
    encoder, hparams, params = load(args)
    ref_encoder, ref_hparams, reference = loading.load_model(args.reference, args.models_dir, args.base_url,
                                                             quiet=args.quiet)
    dpo.check_reference(hparams, encoder, ref_hparams, ref_encoder, args.reference)
    pairs, dropped = dpo.tokenized_pairs(encoder, texts, hparams["n_ctx"])
    if dropped:
        print(f"note: {dropped:,} of {len(texts):,} pairs dropped: the prompt alone fills the model's "
              f"{hparams['n_ctx']} positions", file=sys.stderr)
    if not pairs:
        raise UserError("every pair's prompt fills the context: none is left to judge", path=args.file)
    result = dpo.judge(pairs, params, reference, hparams, hparams["n_ctx"], encoder.eot, args.beta, args.dpo_loss,
                       args.batch_size) | {"dropped": dropped}
    if args.json:
        print(json.dumps(result))
        return
    for name, value in result.items():
        print(f"{name:<20}{value:,}" if isinstance(value, int) else f"{name:<20}{value:.4f}")


def run_classify(args):
    texts, labels = labelled_lines(args.file, args.limit)
    xp = array_module(args)  # numpy, or cupy once a GPU has answered: before the model is fetched
    encoder, hparams, params, head = loading.load_classifier(args.model, args.models_dir, args.base_url,
                                                             quiet=args.quiet)
    params = on_device(xp, params, args.model)
    names = head["labels"]
    numbers = [classifier_files.label_number(label, names) for label in labels or []]
    if None in numbers:
        n = numbers.index(None)
        raise UserError(f"text {n + 1}'s label {labels[n]!r} is not one of the classifier's, {names}", path=args.file)
    logits = classify.classify_texts(texts, encoder, params, hparams, head["pad_id"], args.batch_size)
    predicted = logits.argmax(-1).tolist() if len(texts) else []
    result = {"labels": names, "predictions": [{"label": names[i], "logits": row.tolist()}
                                               for i, row in zip(predicted, logits)]}
    if labels is not None:
        accuracy, confusion = evaluate.classification(numbers, predicted, len(names))
        result = {"accuracy": accuracy, **result, "confusion": confusion}
    if args.json:
        print(json.dumps(result))
        return
    if labels is not None:
        print(f"accuracy  {result['accuracy']:.4f}  ({round(result['accuracy'] * len(texts))} of {len(texts)})\n")
        corner = "true \\ predicted"
        first = max(len(str(x)) for x in names + [corner]) + 2
        width = max(len(str(x)) for x in names + [len(texts)]) + 2
        print(f"{corner:<{first}}" + "".join(f"{str(x):>{width}}" for x in names))
        for name, row in zip(names, result["confusion"]):
            print(f"{str(name):<{first}}" + "".join(f"{c:>{width}}" for c in row))
        print()
    print("text\t" + ("label\t" if labels is not None else "") + "predicted\tstart of the text")
    for n, p in enumerate(result["predictions"]):
        start = " ".join(texts[n][:60].split())
        print(f"{n + 1}\t" + (f"{labels[n]}\t" if labels is not None else "") + f"{p['label']}\t{start}")


RUN = {"perplexity": run_perplexity, "surprisal": run_surprisal, "choice": run_choice, "lambada": run_lambada,
       "classify": run_classify, "preference": run_preference}
