"""The command line of gpt2_numpy.py: flags, printing and exit codes.

    python gpt2_numpy.py "prompt"           generate (the default)
    python gpt2_numpy.py "text" --score     each token's log-probability
    python gpt2_numpy.py "text" --trace     every stage of one forward pass
    python gpt2_numpy.py --params 355M      the parameter count by part
    python gpt2_numpy.py "text" --top 10    the 10 most likely next tokens
    python gpt2_numpy.py "text" --lens      the logit lens (--html FILE: a page of it all)
    python gpt2_numpy.py "prompt" --draft lookup   speculative decoding (--draft MODEL: a draft model)
    python gpt2_numpy.py "prompt" --num-beams 4    beam search (decoding.py); docs/decoding.md for every rule

Exit status: 0 done, 2 a user's mistake (one line on stderr, from a UserError), 130
interrupted (Ctrl-C or SIGTERM). Anything else is a bug and shows its traceback.
"""
import argparse
import codecs
import json
import os
import sys
import time

import numpy as np

import classify
import decoding
import gpt2_numpy as g
import look_inside
import parameters
from interface import loading
from interface.bpe_cli import shown_token
from interface.options import (array_module, at_least, check_output_file, device_flag, folded, model_flags, number,
                               on_device, sae_flags, sae_splice, spliced_line, threads_flag, user_message)
from plumbing import device, shapes
from plumbing.checkpoint import load_checkpoint
from plumbing.errors import UserError, exit_status, fail, given_flags, plural
from plumbing.weights import load_weights


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="gpt2_numpy.py", allow_abbrev=False,
        description="GPT-2 in plain NumPy: generate text (the default), score a text (--score), count parameters "
                    "(--params), trace every stage (--trace), and look inside: the next-token table (--top), "
                    "the logit lens (--lens), a page of it all (--html).",
        epilog="Models download on first use to --models-dir, else $GPT2_MODELS_DIR, else models/ beside this "
               "file; --base-url or $GPT2_BASE_URL picks a mirror of OpenAI's files, $HF_ENDPOINT one of the Hub.")
    p.add_argument("prompt", nargs="?", default=None,
                   help="text to continue (or to score with --score, or to trace with --trace); "
                        "empty: sample unconditionally")
    model_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    threads_flag(p)
    device_flag(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars, no speed report")
    for add_flags in (generate_flags, score_flags, trace_flags, look_inside_flags, params_flags, sae_flags):
        add_flags(p)  # each subcommand's flags are defined beside its printing, below
    p.error = fail
    args = p.parse_args(argv)
    args.given = given_flags(p, argv)
    check_flags_agree(args, args.given)
    if args.greedy:
        args.temperature = 0.0
    try:
        g.check_sampling(args.n_tokens, args.temperature, args.top_k, args.top_p, args.n_samples, args.min_p,
                         args.repetition_penalty, args.no_repeat_ngram_size, args.stop,
                         token_bytes=())  # the vocabulary's bytes come with the model
        decoding.check_beams(args.num_beams, args.num_return_sequences, args.length_penalty)
    except UserError as e:
        fail(user_message(e))
    if args.prompt is None and args.params is None:
        args.prompt = ""
    if args.prompt is not None:
        try:
            args.prompt.encode("utf-8")
        except UnicodeEncodeError:
            fail("the prompt is not valid UTF-8 text")
    if (args.score or args.trace or args.lens or args.html) and not args.prompt:
        fail("--score, --trace, --lens and --html need a text")
    if (args.sae or args.center_writing_weights or args.fold_ln) and not (args.score or args.trace or args.lens or
                                                                          args.html or (args.top and not args.json)):
        fail("--sae, --center-writing-weights and --fold-ln go with a reading: --score, --trace, --top, --lens or "
             "--html")
    if args.draft is not None:
        check_draft_flags(args, given_flags(p, argv))
    if args.tuned_lens and not (args.lens or args.html):
        fail("--tuned-lens goes with --lens or --html: the logit lens and the tuned lens, side by side")
    if args.html:
        check_output_file(args.html)
    return args


SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed")  # what greedy and beam search, sampling nothing, refuse
PENALTIES = ("repetition_penalty", "no_repeat_ngram_size")
BEAMS = ("length_penalty", "early_stopping", "num_return_sequences")  # what only beam search reads
GENERATING = SAMPLING + PENALTIES + BEAMS + ("n_tokens", "greedy", "n_samples", "no_stop", "draft", "draft_tokens",
                                            "stop", "num_beams")
READINGS = ("params", "score", "trace", "lens", "html", "top")  # each reads the text once and prints its answer


def check_flags_agree(args, given):
    """A flag that the chosen command would ignore is a mistake to say, not to pass over. Two readings
    are one too many, except --html FILE --top K: the page's next-token table then has K rows."""
    def flag(dest):
        return "--" + dest.replace("_", "-")

    if args.greedy and "temperature" in given:
        fail(f"--greedy is --temperature 0: give one of them, not --greedy --temperature {args.temperature}")
    reading = [d for d in READINGS if d in given and not (d == "top" and args.json)]  # --json --top: generating
    if {"lens", "html"} <= set(reading):
        fail("--html's page shows the logit lens too: give --lens for the table, or --html FILE for the page")
    two = [d for d in reading if not (d == "top" and "html" in reading)]
    if len(two) > 1:
        fail(f"{flag(two[0])} and {flag(two[1])} are two readings of the text: give one of them")
    if args.json and given & {"params", "html"}:
        fail(f"{flag(sorted(given & {'params', 'html'})[0])} writes no JSON: leave out --json")
    generating = sorted(given & set(GENERATING)) + (["top"] if args.json and "top" in given else [])
    if reading and generating:
        what = "--top with --json" if generating[0] == "top" else flag(generating[0])
        fail(f"{what} is for generating text; {flag(reading[0])} reads the text once and generates nothing")
    if "trace_block" in given and not args.trace:
        fail("--trace-block goes with --trace")
    if "draft_tokens" in given and "draft" not in given:
        fail("--draft-tokens goes with --draft")
    check_beam_flags(args, given, flag)
    if "" in args.stop:
        fail("--stop is empty: give the text to stop at")
    if args.num_return_sequences > args.num_beams:
        fail(f"--num-return-sequences {args.num_return_sequences} is more than --num-beams {args.num_beams}: beam "
             "search returns at most its beams")


def check_samples_nothing(args, given, flag, decoding):
    """Greedy decoding and beam search sample nothing: a flag of sampling beside them is a mistake.
    (--temperature 0 is greedy's own; --n-samples with greedy is that many copies of one text, as asked.)"""
    sampling = [d for d in SAMPLING if d in given and not (d == "temperature" and args.temperature == 0)]
    if sampling:
        fail(f"{flag(sampling[0])} is for sampling and does not go with {decoding}")


def check_beam_flags(args, given, flag):
    """Beam search samples nothing and keeps its own beams: the flags of sampling, of several samples
    and of speculative decoding are mistakes beside it, and its own flags are mistakes without it.
    Greedy decoding (--greedy, --temperature 0) samples nothing either: the same rule holds it."""
    beams = f"--num-beams {args.num_beams} (beam search, which samples nothing)"
    if args.num_beams == 1:
        for dest in BEAMS:
            if dest in given:
                fail(f"{flag(dest)} goes with --num-beams 2 or more: it is for beam search")
        if args.greedy or ("temperature" in given and args.temperature == 0):
            check_samples_nothing(args, given, flag, "--greedy (which samples nothing)" if args.greedy else
                                  "--temperature 0 (greedy decoding, which samples nothing)")
        return
    check_samples_nothing(args, given, flag, beams)
    if args.n_tokens == 0:
        fail(f"--n-tokens must be at least 1 for {beams}: the beams are the new tokens")
    if args.n_samples > 1:
        fail(f"--n-samples is for sampling; {beams} returns --num-return-sequences sequences")
    if args.draft is not None:
        fail(f"--draft and {beams} do not combine: speculative decoding samples, one token at a time")
    if args.json and args.top:
        fail(f"--top with --json gives sampling's alternatives at each step; {beams} has none")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.stdout.reconfigure(errors="replace")  # a terminal that cannot show a character gets '?'
    return exit_status(lambda: run(args), user_message)


def run(args):
    """The reading or the generation the flags ask for, on the model they name."""
    if args.params is not None:
        return print_params(args.params, args.models_dir)
    xp = array_module(args)  # numpy, or cupy once a GPU has answered: before anything is fetched
    encoder, hparams, params, head = loading.load_model_or_classifier(args.model, args.models_dir, args.base_url,
                                                                      quiet=args.quiet)
    params, splice = on_device(xp, folded(args, params), args.model), sae_splice(args, hparams)  # ({}, None): no SAE
    if splice != ({}, None) and not (args.json or args.html or (head and not args.trace)):
        print(spliced_line(args, splice[1]))  # a reading of the model with an SAE in it says so first, as circuits.py
    if head and not args.trace:  # the activations are a classifier's too; its output is a label
        run_label(args, encoder, hparams, params, head)
    elif args.trace:
        run_trace(args, encoder, hparams, params, splice, head)
    elif args.lens:
        run_lens(args, encoder, hparams, params, splice)
    elif args.html:
        run_html(args, encoder, hparams, params, splice)
    elif args.top is not None and not args.json:
        run_top(args, encoder, hparams, params, splice)
    elif args.score:
        run_score(args, encoder, hparams, params, splice)
    else:
        run_generate(args, encoder, hparams, params)


# ----------------------------------------------------------------------------
# A classifier's folder: the prompt's label
# ----------------------------------------------------------------------------

def run_label(args, encoder, hparams, params, head):
    """A classifier (classify.py) writes no text and has no next-token head: its answer to a prompt is the
    prompt's label, and each label's probability. The flags of generating and of the next-token readings
    are refused by name; --trace reads its activations as any GPT-2's."""
    refused = sorted(args.given & (set(GENERATING) | {"score", "lens", "html", "top"}))
    if refused:
        raise loading.not_a_language_model(args.model, head, refused[0])
    if not args.prompt:
        raise UserError(f"{args.model} is a classifier (labels {', '.join(map(str, head['labels']))}): give it a text "
                        "to label")
    logits = classify.classify_texts([args.prompt], encoder, params, hparams, head["pad_id"])[0]
    probs = g.softmax(logits.astype(np.float64))
    label = head["labels"][int(logits.argmax())]
    if args.json:
        print(json.dumps({"model": args.model, "label": label, "labels": head["labels"], "logits": logits.tolist(),
                          "probs": probs.tolist()}))
        return
    print(label)
    for name, p in sorted(zip(head["labels"], probs), key=lambda pair: -pair[1]):
        print(f"  {str(name):<20}{p:.4f}")


# ----------------------------------------------------------------------------
# Generating (the default)
# ----------------------------------------------------------------------------

def generate_flags(p):
    p.add_argument("--n-tokens", type=at_least(0), default=40, help="tokens to generate (default 40)")
    p.add_argument("--temperature", type=number, default=1.0, help="softmax temperature; 0 = greedy (default 1)")
    p.add_argument("--top-k", type=at_least(1), default=None, help="sample only from the k most likely tokens")
    p.add_argument("--top-p", type=number, default=1.0, help="nucleus sampling: smallest set with this mass")
    p.add_argument("--seed", type=at_least(0), default=None, help="random seed: the same seed gives the same text")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token (temperature 0)")
    p.add_argument("--n-samples", type=at_least(1), default=1, help="independent samples, run as one batch")
    p.add_argument("--no-stop", action="store_true", help="keep going after <|endoftext|>")
    p.add_argument("--draft", metavar="MODEL", help="speculative decoding: a draft model with the same vocabulary "
                                                    "(as --model takes one) proposes tokens that the model checks "
                                                    "several at a pass; 'lookup': the draft is what followed the "
                                                    "text's last words where they occurred before. The same "
                                                    "distribution (--greedy: the same text), faster where the "
                                                    "draft agrees")
    p.add_argument("--draft-tokens", type=at_least(1), default=4, metavar="K", help="tokens the draft proposes a pass "
                                                                            "(default 4)")
    p.add_argument("--min-p", type=number, default=0.0, metavar="P", help="sampling: drop every token less likely "
                                                                         "than P times the most likely (default 0)")
    p.add_argument("--repetition-penalty", type=number, default=1.0, metavar="P",
                   help="every token already in the text (prompt included) made less likely: its logit divided by "
                        "P where positive, times P where negative (default 1: none)")
    p.add_argument("--no-repeat-ngram-size", type=at_least(0), default=0, metavar="N",
                   help="never write an N-gram that the text (prompt included) already holds (default 0: none)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end where the text has written TEXT, which is printed and nothing after it (repeatable)")
    p.add_argument("--num-beams", type=at_least(1), default=1, metavar="K",
                   help="beam search with K beams (default 1: none); deterministic, no sampling flags")
    p.add_argument("--length-penalty", type=number, default=1.0, metavar="A", help="beam search: a finished text "
                                                                                  "scores its log p / length ** A "
                                                                                  "(default 1)")
    p.add_argument("--early-stopping", action="store_true",
                   help="beam search: stop as soon as K texts are finished (default: once no open beam can do better)")
    p.add_argument("--num-return-sequences", type=at_least(1), default=1, metavar="R",
                   help="beam search: print the best R of the K beams (default 1)")


def check_draft_flags(args, given):
    """--draft's settings, checked before any model loads."""
    penalties = [d for d in PENALTIES + ("min_p",) if d in given]
    if penalties:
        fail(f"--{penalties[0].replace('_', '-')} and --draft do not combine: speculative decoding keeps the "
             "model's own distribution")
    if args.n_samples != 1:
        fail("--n-samples must be 1 with a draft: speculative decoding runs one sample")


def load_draft(args, encoder, hparams):
    """--draft: 'lookup', or the draft model as (params, hparams), loaded as --model is, with the same vocabulary."""
    if args.draft == "lookup":
        return "lookup"
    draft_encoder, draft_hparams, draft_params = loading.load_model(args.draft, args.models_dir, args.base_url,
                                                                    quiet=args.quiet)
    if draft_hparams["n_vocab"] != hparams["n_vocab"] or draft_encoder.token_bytes != encoder.token_bytes:
        raise UserError(f"--draft {args.draft} has another vocabulary than --model {args.model}: a draft must "
                        "share the model's tokens")
    return on_device(array_module(args), draft_params, args.draft), draft_hparams


def start_ids(args, encoder):
    """The prompt's ids; an empty prompt is <|endoftext|> alone (sampling unconditionally, as
    OpenAI's sampler does), and so counts as one token wherever a count is shown."""
    ids = encoder.encode(args.prompt)
    if not ids and encoder.eot is None:
        raise UserError("this vocabulary has no <|endoftext|> to start from: give a prompt")
    return ids or [encoder.eot]


def say_unconditional(args):
    """An empty prompt's note, once the request is checked (a mistake is its one line alone)."""
    if not args.prompt and not args.quiet and not args.json:
        print("no prompt: sampling unconditionally, after <|endoftext|>", file=sys.stderr)


def run_generate(args, encoder, hparams, params):
    if args.num_beams > 1:
        return run_beams(args, encoder, hparams, params)
    prompt_ids = start_ids(args, encoder)
    stop = None if args.no_stop else encoder.eot
    draft = None if args.draft is None else load_draft(args, encoder, hparams)
    draft_counts = {"proposed": 0, "accepted": 0}  # filled in as the draft's tokens are judged
    start = time.perf_counter()
    samples, alternatives, first_time, first_burst = sample_and_stream(args, encoder, hparams, params, prompt_ids,
                                                                       stop, draft, draft_counts)
    elapsed = time.perf_counter() - start
    print_samples(args, encoder, prompt_ids, [ending(encoder, prompt_ids, s, stop, args.stop) for s in samples],
                  alternatives, draft_counts)
    n = sum(len(s) for s in samples)
    if not args.quiet and n:
        print(speed_line(n, len(prompt_ids), first_time - start, elapsed, min(first_burst, n),
                         acceptance_rate(draft_counts) if draft else None), file=sys.stderr)


def ending(encoder, prompt_ids, ids, stop, stop_strings):
    """A continuation as it is shown: (its ids, without the stop token; its text, which ends with the stop
    string that ended it, if one did; why it ended: "endoftext", "stop" or "length")."""
    if ids and ids[-1] == stop:
        return ids[:-1], encoder.decode(ids[:-1]), "endoftext"
    prompt = encoder.decode_bytes(prompt_ids)
    text = prompt + encoder.decode_bytes(ids)
    end = g.stop_string_end(text, len(encoder.token_bytes[ids[-1]]), [s.encode() for s in stop_strings]) \
        if ids and stop_strings else None
    return ids, text[len(prompt):end].decode("utf-8", errors="replace"), "length" if end is None else "stop"


def speed_line(n, n_prompt, first, elapsed, first_burst, accepted=None):
    """[n tokens in s: prompt and first token(s) in s, then r tokens/s]. first_burst: the tokens that came
    with the first (a sample each; with a draft, the first round's), counted with it, not in the rate."""
    line = (f"[{plural(n, 'token')} in {elapsed:.2f} s: prompt of {plural(n_prompt, 'token')} and first "
            f"{plural(first_burst, 'token') if first_burst > 1 else 'token'} in {first:.2f} s")
    if n > first_burst:
        line += f", then {(n - first_burst) / max(elapsed - first, 1e-9):.1f} tokens/s"
    if accepted is not None:
        line += f", {accepted:.0%} of the draft's tokens accepted"
    return line + "]"


def acceptance_rate(draft_counts):
    """accepted / proposed; 0 when the draft proposed nothing."""
    return draft_counts["accepted"] / max(draft_counts["proposed"], 1)


def sample_and_stream(args, encoder, hparams, params, prompt_ids, stop, draft=None, draft_counts=None):
    """Generate, writing one sample's text as it comes, and nothing past a stop string. -> (the samples'
    ids, up to and with the token that ended each; per step, per sample, the --top alternatives with --json;
    when the first token came; how many tokens came with it: one a sample, or with a draft the first round's)"""
    alternatives = []  # per step, per sample: the top --top tokens of the distribution sampled from

    def watch(logits):
        probs = g.sampling_probs(logits, args.temperature or 1.0, args.top_k, args.top_p, args.min_p)
        alternatives.append([top_entries(encoder, row, args.top) for row in probs])

    watching = watch if args.json and args.top else None
    if draft is None:
        steps = g.generate(prompt_ids, params, hparams, args.n_tokens, args.temperature, args.top_k, args.top_p,
                           args.seed, args.n_samples, stop, watch=watching, min_p=args.min_p,
                           repetition_penalty=args.repetition_penalty, no_repeat_ngram_size=args.no_repeat_ngram_size,
                           stop_strings=args.stop, token_bytes=encoder.token_bytes)
    else:  # it knows no stop strings: the loop below ends each sample at its own
        steps = decoding.generate_with_draft(prompt_ids, params, hparams, draft, args.draft_tokens, args.n_tokens,
                                                args.temperature, args.top_k, args.top_p, args.seed, stop,
                                                watch=watching, counts=draft_counts)
    say_unconditional(args)  # generate has checked the settings: nothing was printed before a mistake
    stream = args.n_samples == 1 and not args.json
    if stream:
        print(args.prompt, end="", flush=True)
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stop_strings = [s.encode() for s in args.stop]
    samples, texts = [[] for _ in range(args.n_samples)], [encoder.decode_bytes(prompt_ids)] * args.n_samples
    ended, shown = [False] * args.n_samples, len(texts[0])  # shown: how much of the first text is printed
    first_token_time, first_burst = None, args.n_samples
    for next_ids in steps:
        if first_token_time is None:
            first_token_time = time.perf_counter()
            if draft is not None:  # the first round's tokens come at once: the one judged, and those kept
                first_burst = draft_counts["accepted"] + 1
        for i, token in enumerate(next_ids.tolist()):
            if ended[i]:
                continue
            samples[i].append(token)
            ended[i] = token == stop
            if not ended[i]:
                texts[i] += encoder.token_bytes[token]
                end = g.stop_string_end(texts[i], len(encoder.token_bytes[token]), stop_strings)
                ended[i], texts[i] = end is not None, texts[i][:end]
        if stream:
            sys.stdout.write(utf8.decode(texts[0][shown:]))
            sys.stdout.flush()
            shown = len(texts[0])
        if all(ended):
            break
    if first_token_time is None:  # no step at all (--n-tokens 0)
        first_token_time = time.perf_counter()
    if stream:
        print(utf8.decode(b"", final=True))
    return samples, alternatives, first_token_time, first_burst


def print_samples(args, encoder, prompt_ids, endings, alternatives, draft_counts=None, scores=None):
    """--json: one object; several samples (or beams): one after another. (One sample was streamed already;
    one beam is printed whole.) endings: each sample's (ids, text, finish); scores: each beam's."""
    if args.json:
        out = {"model": args.model, "prompt_ids": prompt_ids,
               "samples": [{"ids": ids, "text": text, "finish": finish} for ids, text, finish in endings]}
        if args.top:
            for i, sample in enumerate(out["samples"]):
                sample["top"] = [step[i] for step in alternatives[:len(sample["ids"])]]
        if args.draft is not None:
            out["draft"] = {"model": args.draft, "tokens": args.draft_tokens, **draft_counts,
                            "acceptance_rate": acceptance_rate(draft_counts)}
        if scores is not None:
            out["num_beams"] = args.num_beams
            for sample, score in zip(out["samples"], scores):
                sample["score"] = score
        print(json.dumps(out))
    elif scores is not None and len(endings) == 1:
        print(args.prompt + endings[0][1])
    elif len(endings) > 1:
        for i, (_, text, _) in enumerate(endings):
            what = f"SAMPLE {i + 1}" if scores is None else f"BEAM {i + 1}, score {scores[i]:.4f}"
            print(f"{'=' * 20} {what} {'=' * 20}\n{args.prompt}{text}")


def run_beams(args, encoder, hparams, params):
    """--num-beams K: beam_search's best --num-return-sequences sequences, printed whole at the end."""
    prompt_ids = start_ids(args, encoder)
    stop = None if args.no_stop else encoder.eot
    g.checked_prompt(prompt_ids, params, hparams, args.n_tokens, stop)  # before the note: a mistake is one line
    say_unconditional(args)
    start = time.perf_counter()
    best = decoding.beam_search(prompt_ids, params, hparams, args.n_tokens, args.num_beams, args.length_penalty,
                                   args.early_stopping, args.num_return_sequences, stop, args.stop,
                                   encoder.token_bytes, args.repetition_penalty, args.no_repeat_ngram_size)
    elapsed = time.perf_counter() - start
    print_samples(args, encoder, prompt_ids, [ending(encoder, prompt_ids, ids, stop, args.stop) for ids, _ in best],
                  [], scores=[score for _, score in best])
    if not args.quiet:
        print(f"[{plural(args.num_beams, 'beam')} in {elapsed:.2f} s: prompt of {plural(len(prompt_ids), 'token')}, "
              f"the best {plural(len(best[0][0]), 'token')} long]", file=sys.stderr)


# ----------------------------------------------------------------------------
# --score
# ----------------------------------------------------------------------------

def score_flags(p):
    p.add_argument("--score", action="store_true", help="print each token's log-probability, the loss "
                                                        "and the perplexity of the prompt")


def run_score(args, encoder, hparams, params, splice=({}, None)):
    ids = encoder.encode(args.prompt)
    if len(ids) > hparams["n_ctx"] + 1:  # the last token is only predicted, never read
        raise UserError(f"the text has {len(ids)} tokens; at most {hparams['n_ctx'] + 1} can be scored")
    logprobs, loss, perplexity = g.score(ids, params, hparams) if splice == ({}, None) else \
        spliced_score(ids, params, hparams, splice)
    if args.json:
        spliced = {} if splice == ({}, None) else {"sae": splice[1][0] if splice[1] else None,
                                                   "use_error_term": args.use_error_term,
                                                   "center_writing_weights": args.center_writing_weights}
        print(json.dumps({"ids": ids, "logprobs": [None] + [round(float(x), 6) for x in logprobs],
                          "loss": loss, "perplexity": perplexity, **spliced}))
        return
    print(f"{'token':<20}{'id':>7}{'log p':>10}")
    for i, token in enumerate(ids):
        lp = "" if i == 0 else f"{logprobs[i - 1]:10.4f}"
        print(f"{quoted_token(encoder, token):<20}{token:>7}{lp:>10}")
    print(f"loss {loss:.4f} nats/token over {plural(len(ids) - 1, 'prediction')}, perplexity {perplexity:.2f}")


def spliced_score(ids, params, hparams, splice):
    """g.score's numbers with the --sae and --center-writing-weights hooks in the forward pass."""
    if len(ids) < 2:
        raise UserError("scoring needs at least 2 tokens: the first one is only context")
    hooks, sae = splice
    logprobs = g.token_logprobs(look_inside.run_with_hooks([ids[:-1]], params, hparams, hooks, sae=sae)[0], ids[1:])
    loss = float(-logprobs.mean())
    return logprobs, loss, float(np.exp(loss))


# ----------------------------------------------------------------------------
# --trace
# ----------------------------------------------------------------------------

def trace_flags(p):
    p.add_argument("--trace", action="store_true", help="run one forward pass on the prompt and print "
                                                        "every stage's shape and statistics (--json: the numbers)")
    p.add_argument("--trace-block", type=at_least(0), default=None, help="with --trace: only this block")


def run_trace(args, encoder, hparams, params, splice=({}, None), head=None):
    """Every stage of one forward pass; a classifier's last is its labels' logits at the pooled position, not
    the next token's (classify.py)."""
    if args.trace_block is not None and not 0 <= args.trace_block < hparams["n_layer"]:
        raise UserError(f"must be in 0..{hparams['n_layer'] - 1}", arg="trace_block")
    blocks = None if args.trace_block is None else {args.trace_block}
    ids = encoder.encode(args.prompt, allowed_special="all") if head else encoder.encode(args.prompt)
    stages = look_inside.trace(ids, params, hparams, blocks, sae=splice[1], hooks=splice[0])
    if head:
        x = dict(stages)["ln_final.hook_normalized"]  # [1, T, C]
        pooled = classify.pool(x, classify.pooled_positions(np.atleast_2d(ids), head["pad_id"]))  # [1, C]
        stages = stages[:-1] + [("score (the labels' logits)", pooled @ params["score"].T)]
    if args.json:
        print(json.dumps({"ids": ids, "stages": [
            {"name": name, "shape": list(a.shape), **dict(zip(("mean", "std", "min", "max"), stage_stats(a)))}
            for name, a in stages]}))
    else:
        print_trace(stages)


TRACE_COLUMNS = (("stage", 34), ("shape", 22), ("mean", 13), ("std", 13), ("min", 13), ("max", 13))


def stage_stats(a):
    """(mean, std, min, max) over the finite values (masked scores are -inf); None for each if there are none."""
    finite = a[np.isfinite(a)].astype(np.float64)  # float64 only for the statistics
    return (float(finite.mean()), float(finite.std()), float(finite.min()), float(finite.max())) if finite.size \
        else (None,) * 4


def print_trace(stages):
    """One row a stage."""
    print("".join(f"{name:<{w}}" if i < 2 else f"{name:>{w}}" for i, (name, w) in enumerate(TRACE_COLUMNS)))
    for name, a in stages:
        stats = [np.nan if v is None else v for v in stage_stats(a)]
        print(f"{name:<34}{str(list(a.shape)):<22}" + "".join(f" {v:>12.6g}" for v in stats))


# ----------------------------------------------------------------------------
# Looking inside: --top, --lens, --html
# ----------------------------------------------------------------------------

def look_inside_flags(p):
    p.add_argument("--top", type=at_least(1), default=None, metavar="K",
                   help="the K most likely next tokens after the prompt, with their probabilities; with --html: the "
                        "page's table holds K (default 10); with --json, while generating: each step's K most likely "
                        "tokens after temperature, top-k and top-p")
    p.add_argument("--lens", action="store_true", help="the logit lens: each layer's top next token at each "
                                                       "position (--json: the numbers)")
    p.add_argument("--html", metavar="FILE", help="write one self-contained page: the tokens, every head's "
                                                  "attention, the logit lens and the next-token table")
    p.add_argument("--tuned-lens", metavar="LENS_DIR", help="with --lens or --html: a tuned lens's reading beside the "
                                                            "logit lens's (tuned-lens's folder; lens.py trains one)")


def quoted_token(encoder, i):
    """A token's text in quotes, a newline escaped once: '\\n' (repr does the escaping)."""
    return repr(encoder.decode([int(i)]))


def top_entries(encoder, probs, k):
    """The k most likely tokens of a distribution [V], as JSON-ready dicts."""
    top = np.argsort(-probs, kind="stable")[:k]
    return [{"id": int(i), "token": encoder.decode([int(i)]), "prob": round(float(probs[i]), 6),
             "logprob": round(float(np.log(probs[i])), 6) if probs[i] > 0 else None} for i in top]


def run_top(args, encoder, hparams, params, splice=({}, None)):
    ids = start_ids(args, encoder)
    say_unconditional(args)
    logits = g.gpt2(ids, params, hparams, last_only=True)[-1] if splice == ({}, None) else \
        look_inside.run_with_hooks([ids], params, hparams, splice[0], sae=splice[1])[0, -1]
    top, probs, logprobs = look_inside.next_token_table(logits, args.top)
    print(f"after {plural(len(ids), 'token')}, ...{quoted_token(encoder, ids[-1])}:")
    print(f"{'rank':>4}  {'token':<20}{'id':>7}{'prob':>10}{'log p':>10}")
    for rank, (i, p, lp) in enumerate(zip(top, probs, logprobs), start=1):
        print(f"{rank:>4}  {quoted_token(encoder, i):<20}{int(i):>7}{p:>10.4f}{lp:>10.4f}")


def run_lens(args, encoder, hparams, params, splice=({}, None)):
    ids = encoder.encode(args.prompt)
    if len(ids) > hparams["n_ctx"]:
        raise UserError(f"the text has {len(ids)} tokens; the model reads at most {hparams['n_ctx']}")
    run = look_inside.run_with_cache([ids], params, hparams, names=look_inside.lens_activations(hparams["n_layer"]),
                                     sae=splice[1], hooks=splice[0])
    lens = look_inside.logit_lens([ids], params, hparams, run=run)
    tuned = tuned_reading(args, ids, hparams, params, run)
    if args.json:
        print(json.dumps({"ids": ids, "tokens": [encoder.decode([i]) for i in ids],
                          "layers": look_inside.lens_labels(hparams["n_layer"]),
                          "top": lens["top"][:, 0].tolist(),
                          "top_token": [[encoder.decode([i]) for i in row] for row in lens["top"][:, 0].tolist()],
                          "top_prob": np.round(lens["top_prob"][:, 0], 6).tolist(),
                          "target": lens["target"][0].tolist(),
                          "target_prob": np.round(lens["target_prob"][:, 0], 6).tolist(),
                          "target_rank": lens["target_rank"][:, 0].tolist(),
                          **({"tuned_lens": tuned_json(encoder, ids, hparams, tuned)} if tuned else {})}))
        return
    def cell(text, width=12):  # one column of the table: cut a long token short
        return (text if len(text) < width else text[:width - 2] + "…").ljust(width)

    print("the logit lens: each layer's most likely next token at each position (the last row is the model's)")
    print(f"{'':<7}" + "".join(cell(shown_token(encoder, i)) for i in ids))
    for name, row in zip(look_inside.lens_labels(hparams["n_layer"]), lens["top"][:, 0]):
        print(f"{name:<7}" + "".join(cell(shown_token(encoder, i)) for i in row))
    if tuned:
        from interface import lens_cli

        print()
        lens_cli.print_table(f"the tuned lens ({args.tuned_lens}): the same, each layer through its translator",
                             encoder, ids, hparams, tuned["top"][:, 0])


def tuned_json(encoder, ids, hparams, tuned):
    from interface import lens_cli

    return lens_cli.reading_json(encoder, ids, hparams, tuned)


def tuned_reading(args, ids, hparams, params, run):
    """--tuned-lens: lens.py's reading of the prompt (None without the flag), from run_with_cache's run of it (the
    model as spliced), the model not run again."""
    translators = tuned_lens_flag(args, hparams, params)
    if translators is None:
        return None
    import lens

    return device.to_host(lens.tuned_lens([ids], params, hparams, translators, run=run))


def tuned_lens_flag(args, hparams, params):
    """--tuned-lens LENS_DIR's translators, checked against the model (None without the flag)."""
    return lens_cli_module().loaded_lens(args.tuned_lens, hparams, params) if args.tuned_lens else None


def lens_cli_module():
    from interface import lens_cli  # only with --tuned-lens: the lens's chapter is not every command's import

    return lens_cli


def run_html(args, encoder, hparams, params, splice=({}, None)):
    from interface import html_page  # only this subcommand needs it

    ids = encoder.encode(args.prompt)
    if len(ids) > hparams["n_ctx"]:
        raise UserError(f"the text has {len(ids)} tokens; the model reads at most {hparams['n_ctx']}")
    title = os.path.basename(os.path.normpath(args.model))  # a size, or the folder's name
    n_next = args.top or html_page.N_NEXT  # --html FILE --top K: the next-token table's rows
    size = html_page.write_page(args.html, ids, encoder, params, hparams, title=title, n_next=n_next,
                                hooks=splice[0], sae=splice[1], tuned_lens=tuned_lens_flag(args, hparams, params))
    print(f"{args.html}: {size:,} bytes")


# ----------------------------------------------------------------------------
# --params
# ----------------------------------------------------------------------------

def params_flags(p):
    p.add_argument("--params", nargs="?", const="124M", metavar="MODEL",
                   help="count parameters by part for a size, or 'all' (no prompt needed)")


def print_params(model, models_dir):
    """--params: the count by part, and the tensors on disk counted too when they are there."""
    if model != "all" and model not in shapes.SIZES:
        folder = loading.model_folder(model, models_dir)
        if not os.path.isdir(folder):
            raise UserError(f"{model} is not downloaded yet: run it once, or python download.py {model}")
        return print_param_table({model: load_weights(folder)})
    loaded = {}
    for size in (shapes.SIZES if model == "all" else [model]):
        folder = loading.model_folder(size, models_dir)
        on_disk = os.path.exists(os.path.join(folder, "hparams.json"))
        loaded[size] = (shapes.hparams(size), load_checkpoint(folder)[1] if on_disk else None)
    print_param_table(loaded)
    if model == "all":
        print()
        print_published()


def print_param_table(models):
    counts = {name: parameters.count_parameters(hp, d_ff=hp.get("n_inner")) for name, (hp, _) in models.items()}
    names = list(models)
    width = max(14, *(len(n) + 2 for n in names))
    rows = [(part, lambda c, part=part: c["parts"][part], ",") for part in parameters.PARTS]
    rows += [("  per block: attention", lambda c: c["block"]["attention"], ","),
             ("  per block: mlp", lambda c: c["block"]["mlp"], ","),
             ("  per block: 2 layer norms", lambda c: c["block"]["layer norms"], ","),
             ("total", lambda c: c["total"], ","),
             ("non-embedding", lambda c: c["non_embedding"], ","),
             ("token embedding share", lambda c: c["wte_share"], ".1%"),
             ("12·L·d² (approximation)", lambda c: c["approx_12Ld2"], ","),
             ("  its error", lambda c: c["approx_error"], ".3%")]
    print(f"{'part':<28}" + "".join(f"{n:>{width}}" for n in names))
    for label, value, fmt in rows:
        print(f"{label:<28}" + "".join(f"{value(counts[n]):>{width}{fmt}}" for n in names))
    for name, (hp, params) in models.items():
        if params is None:
            continue
        found = parameters.count_tensors(params)
        diffs = [p for p in found if found[p] != counts[name]["parts"][p]]
        if diffs:
            print(f"{name}: the checkpoint's tensors differ from the formula in " +
                  ", ".join(f"{p} ({found[p]:,} vs {counts[name]['parts'][p]:,})" for p in diffs))
        else:
            print(f"{name}: counting the checkpoint's tensors gives the same {sum(found.values()):,}")


def print_published():
    print(f"{'published shapes':<16}{'published':>12}{'counted':>20}{'difference':>12}")
    for name, published, counted in parameters.published_counts():
        print(f"{name:<16}{published / 1e9:>11.3g}B{counted:>20,}{(counted - published) / published:>12.2%}")
