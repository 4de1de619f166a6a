"""Write tests/data/generate_golden.json: what Hugging Face's generate gives with the logit processors,
stop strings and beam search, on three small GPT-2s, for tests/test_gpt2_numpy.py to hold ours against.

Dev-only (torch, transformers 5.x). Run from the project folder:

    python tests/data/make_generate_golden.py               # writes tests/data/generate_golden.json
    python tests/data/make_generate_golden.py --out F.json  # elsewhere: tests/test_gpt2_numpy.py's live test

The models, as Hugging Face folders:
  hf/tiny       random weights, GPT-2's vocabulary (tests/data/hf/make_hf_folders.py)
  hf/inner      random weights, a 96-token vocabulary, n_inner 24, layer norms' eps 1e-3 (no tokenizer)
  shakespeare   trained here from nothing (tests/data/shakespeare/README.md), converted by convert.py --to hf

Each case is generate's keyword arguments (in generate's own names) and what it returned:
  greedy        the new ids (a batch of one: generate pads nothing)
  beams         every returned sequence's new ids (cut where beam_indices ends: generate pads the shorter ones)
                and its sequences_scores
  sampling      the ids drawn, and at each step the distribution they were drawn from: softmax of generate's
                processed scores (output_scores), as the ids and probabilities it keeps (the rest are 0)
The end-of-text id is the case's eos_token_id. The random models never write theirs, so each stands in a
token that ends their beams at many different lengths (of those greedy writes, the one that gave the most
lengths and the most cases where early stopping changes the answer): " only" (691) for hf/tiny, 49 for
hf/inner. The trained model's beams end at "\\n" (198), a line; one case keeps its own <|endoftext|>, which it
never writes, so that every beam runs to the last step.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.generation.stopping_criteria import StopStringCriteria

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
N = 16  # new tokens a case asks for (the trained model's context is 64)


def tokenizer(folder):
    """GPT2Tokenizer from the folder's vocab.json and merges.txt (in transformers 5.x, vocab_file= encodes to [])."""
    with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(folder, "merges.txt"), encoding="utf-8") as f:
        merges = [tuple(line.split(" ")) for line in f.read().splitlines()[1:] if line]
    tok = transformers.GPT2Tokenizer(vocab=vocab, merges=merges)
    assert StopStringCriteria._get_stop_string_matching_mode(tok) == "byte_level"  # stop strings match bytes
    return tok


def load(folder):
    return transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32,
                                                        attn_implementation="eager").eval()


def run(model, prompt_ids, tok=None, **kwargs):
    """generate on one prompt, as a dict of what it returned."""
    x = torch.tensor([prompt_ids])
    eos = kwargs.setdefault("eos_token_id", None)
    kwargs.setdefault("max_new_tokens", N)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), pad_token_id=eos if eos is not None else 0,
                             return_dict_in_generate=True, output_scores=True, tokenizer=tok, **kwargs)
    new = out.sequences[:, len(prompt_ids):]
    if kwargs.get("num_beams", 1) > 1:
        lengths = (out.beam_indices >= 0).sum(dim=1).tolist()
        return {"sequences": [row[:n] for row, n in zip(new.tolist(), lengths)],
                "scores": out.sequences_scores.tolist()}
    if kwargs.get("do_sample"):
        steps = []
        for t, scores in enumerate(out.scores):
            probs = torch.softmax(scores[0], dim=-1)
            kept = torch.nonzero(probs > 0)[:, 0]
            steps.append({"ids": kept.tolist(), "probs": probs[kept].tolist()})
        return {"sequences": new.tolist(), "steps": steps}
    return {"sequences": new.tolist()}


def case(cases, name, folder, model, prompt_ids, tok=None, **kwargs):
    kwargs = {"max_new_tokens": N, "eos_token_id": None, **kwargs}  # the golden says every setting it used
    got = run(model, prompt_ids, tok, **kwargs)
    cases.append({"name": name, "folder": folder, "prompt_ids": prompt_ids, "generate": kwargs, **got})
    print(name, got["sequences"][0][:12], got.get("scores", ""))
    return got


def token_texts(tok, ids):
    """Each id's bytes, as the byte-level vocabulary spells them."""
    decoder = {c: b for b, c in bytes_to_unicode().items()}
    return [bytes(decoder[c] for c in tok.convert_ids_to_tokens(i)) for i in ids]


def stop_strings_from(tok, prompt_ids, continuation):
    """Stop strings cut from a continuation, so that each one stops generate somewhere known:
    spanning three tokens and ending where one ends; ending in the middle of a token; starting in the
    prompt and ended by the first new token; two at once, the later-written one completing first."""
    pieces = token_texts(tok, continuation)
    prompt_end = token_texts(tok, prompt_ids)[-1]
    mid = next(i for i in range(3, len(pieces)) if len(pieces[i]) >= 2 and pieces[i][:1].isascii())
    return {"spanning tokens": [(pieces[1][1:] + pieces[2] + pieces[3]).decode()],
            "ending mid-token": [(pieces[mid - 1] + pieces[mid][:1]).decode()],
            "from the prompt": [(prompt_end[-1:] + pieces[0][:1]).decode()],
            "two, the second first": [(pieces[6] + pieces[7]).decode(), pieces[2].decode()],
            "never written": ["\x00never\x00"]}


def processor_cases(cases, folder, model, prompt_ids, tok=None, eos=None):
    """Greedy with each processor, then all of them; a greedy baseline first."""
    base = case(cases, f"{folder}: greedy", folder, model, prompt_ids, tok, do_sample=False, eos_token_id=eos)
    for kwargs in ({"repetition_penalty": 1.3}, {"repetition_penalty": 0.7}, {"no_repeat_ngram_size": 1},
                   {"no_repeat_ngram_size": 2}, {"no_repeat_ngram_size": 3},
                   {"repetition_penalty": 1.2, "no_repeat_ngram_size": 2}):
        what = ", ".join(f"{k} {v}" for k, v in kwargs.items())
        case(cases, f"{folder}: greedy, {what}", folder, model, prompt_ids, tok, do_sample=False, eos_token_id=eos,
             **kwargs)
    return base


def stop_string_cases(cases, folder, model, prompt_ids, tok, eos=None, **kwargs):
    """Stop strings cut from the continuation that these settings give without them; each must stop it."""
    free = run(model, prompt_ids, tok, do_sample=False, eos_token_id=eos, **kwargs)["sequences"][0]
    for what, strings in stop_strings_from(tok, prompt_ids, free).items():
        got = case(cases, f"{folder}: greedy, stop strings {what}", folder, model, prompt_ids, tok, do_sample=False,
                   eos_token_id=eos, stop_strings=strings, **kwargs)
        assert (len(got["sequences"][0]) < len(free)) == (what != "never written"), (what, strings)


def beam_cases(cases, folder, model, prompt_ids, eos, tok=None):
    """K = 2 and 4, length penalties 0, 1 and 2, early stopping on and off, every beam returned (R = K)."""
    for k in (2, 4):
        for lp in (0.0, 1.0, 2.0):
            for early in (False, True):
                case(cases, f"{folder}: beams {k}, length penalty {lp}, early stopping {early}", folder, model,
                     prompt_ids, tok, do_sample=False, num_beams=k, length_penalty=lp, early_stopping=early,
                     num_return_sequences=k, eos_token_id=eos)
    case(cases, f"{folder}: beams 3, one returned", folder, model, prompt_ids, tok, do_sample=False, num_beams=3,
         num_return_sequences=1, eos_token_id=eos)
    case(cases, f"{folder}: beams 3, repetition penalty 1.3, no repeated 2-grams", folder, model, prompt_ids, tok,
         do_sample=False, num_beams=3, num_return_sequences=2, repetition_penalty=1.3, no_repeat_ngram_size=2,
         eos_token_id=eos)


def beam_stop_string_case(cases, folder, model, prompt_ids, tok, eos):
    """Beams that a stop string ends: one cut from the fourth and fifth tokens of the best beam without it,
    ending inside the fifth; it must end some beams early."""
    kwargs = dict(do_sample=False, num_beams=3, num_return_sequences=3, eos_token_id=eos)
    pieces = token_texts(tok, run(model, prompt_ids, tok, **kwargs)["sequences"][0])
    got = case(cases, f"{folder}: beams 3, stop string", folder, model, prompt_ids, tok,
               stop_strings=[(pieces[3] + pieces[4][:1]).decode()], **kwargs)
    assert min(map(len, got["sequences"])) < N, got


def sampling_cases(cases, folder, model, prompt_ids, eos=None):
    """min-p alone, after a temperature, and with every processor and warper at once (generate's order).
    top_k 0 turns off generate's own default when sampling, top_k 50 (ours is no top-k)."""
    torch.manual_seed(0)
    for what, kwargs in (("min_p 0.1", {"min_p": 0.1, "top_k": 0}),
                         ("temperature 0.7, min_p 0.05", {"temperature": 0.7, "min_p": 0.05, "top_k": 0}),
                         ("all at once", {"repetition_penalty": 1.2, "no_repeat_ngram_size": 2, "temperature": 0.9,
                                          "top_k": 40, "top_p": 0.95, "min_p": 0.02})):
        case(cases, f"{folder}: sampling, {what}", folder, model, prompt_ids, do_sample=True, max_new_tokens=8,
             eos_token_id=eos, **kwargs)


def main():
    p = argparse.ArgumentParser(description="Hugging Face generate's goldens for the decoding tests")
    p.add_argument("--out", default=os.path.join(HERE, "generate_golden.json"), help="where to write them")
    out = p.parse_args().out
    cases = []
    tiny = os.path.join(HERE, "hf", "tiny")
    model, tok = load(tiny), tokenizer(tiny)
    prompt = tok("The cat sat on the mat")["input_ids"]
    processor_cases(cases, "hf/tiny", model, prompt, tok)
    stop_string_cases(cases, "hf/tiny", model, prompt, tok, no_repeat_ngram_size=1)  # else it writes one token over
    beam_cases(cases, "hf/tiny", model, prompt, 691)
    sampling_cases(cases, "hf/tiny", model, prompt)

    inner = load(os.path.join(HERE, "hf", "inner"))
    prompt = [5, 17, 80, 3, 41, 66, 12]
    processor_cases(cases, "hf/inner", inner, prompt)
    beam_cases(cases, "hf/inner", inner, prompt, 49)

    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "shakespeare-hf")
        subprocess.run([sys.executable, os.path.join(ROOT, "convert.py"), os.path.join(HERE, "shakespeare"), hf,
                        "--to", "hf"], check=True, cwd=ROOT)
        model, tok = load(hf), tokenizer(hf)
        prompt = tok("ROMEO:\n")["input_ids"]
        eot = tok.convert_tokens_to_ids("<|endoftext|>")
        line = tok("\n")["input_ids"]
        assert line == [198], line
        processor_cases(cases, "shakespeare", model, prompt, tok, eos=eot)
        stop_string_cases(cases, "shakespeare", model, prompt, tok, eos=eot)
        beam_cases(cases, "shakespeare", model, prompt, 198, tok)
        case(cases, "shakespeare: beams 4, its own <|endoftext|>, never written", "shakespeare", model, prompt, tok,
             do_sample=False, num_beams=4, num_return_sequences=4, eos_token_id=eot)
        beam_stop_string_case(cases, "shakespeare", model, tok("First Citizen:\n")["input_ids"], tok, eot)
        sampling_cases(cases, "shakespeare", model, prompt, eos=eot)

    with open(out, "w", encoding="utf-8") as f:
        json.dump({"versions": f"torch {torch.__version__}, transformers {transformers.__version__}", "cases": cases},
                  f, indent=0)
    print(len(cases), "cases")


if __name__ == "__main__":
    main()
