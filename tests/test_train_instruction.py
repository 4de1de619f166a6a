"""Instruction data: each example is its prompt, its response and <|endoftext|>, and the loss (plain and
fast) counts the response and its <|endoftext|> alone; the prompt and the padding get exactly no gradient.
A tiny model learns to reverse words it never saw, and bad data is one line, exit 2, nothing written."""
import json
import os

import numpy as np
import pytest

import backward
from backward import IGNORE
import bpe
from conftest import DATA, rand
from gpt2_numpy import generate, gpt2
from parameters import init_params
import optimizer
import train
from interface import train_cli
from plumbing import shapes

BYTES = bpe.parse_vocab(*bpe.vocab_files([]))  # a vocabulary from scratch with no merge: 257 ids, <|endoftext|> 256
ALPACA = "### Instruction:\nName a colour of the sky.\n\n### Response:\n"


def write_jsonl(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return str(path)


def log_softmax_64(logits):
    """The reference: log softmax in float64, written here."""
    z = logits.astype(np.float64)
    return z - np.logaddexp.reduce(z, axis=-1, keepdims=True)


# --- an example, as a row ----------------------------------------------------------------------

def test_an_example_is_its_prompt_its_response_and_endoftext_as_given(encoder):
    """No template is added: the ids are the prompt's, then the response's (each encoded alone, as the model
    meets them: a prompt, then what it writes), then 50256; the prompt's positions have the target IGNORE."""
    ids, n_prompt = train.example_ids(encoder, ALPACA, "Blue.")
    assert ids == encoder.encode(ALPACA) + encoder.encode("Blue.") + [50256] and n_prompt == len(encoder.encode(ALPACA))
    assert encoder.decode(ids) == ALPACA + "Blue.<|endoftext|>"
    inputs, targets = train.example_row(ids, n_prompt)
    assert inputs.tolist() == ids[:-1] and inputs.dtype == targets.dtype == np.int64
    assert targets.tolist() == [IGNORE] * (n_prompt - 1) + ids[n_prompt:]  # the response's first token is learned


def test_a_long_example_is_cut_keeping_the_responses_start():
    """Over context + 1 tokens: the prompt's first tokens go first, but its last one stays (the response's
    first token is predicted from it); then the response's end (and its <|endoftext|>)."""
    ids = list(range(10))  # the prompt 0-5, the response 6-8, <|endoftext|> 9
    assert train.cut_example(ids, 6, 9) == (ids, 6)  # 10 tokens: it fits
    assert train.cut_example(ids, 6, 7) == (ids[2:], 4)
    assert train.cut_example(ids, 6, 4) == (ids[5:], 1)
    assert train.cut_example(ids, 6, 2) == ([5, 6, 7], 1)
    assert train.cut_example(ids, 0, 4) == (ids[:5], 0)  # no prompt: the response's start
    inputs, targets = train.example_row(*train.cut_example(ids, 6, 2))
    assert inputs.tolist() == [5, 6] and targets.tolist() == [6, 7]
    rows, val, cut = train.example_rows(BYTES, [("a long prompt", "yes"), ("q", "no")], 0.0, 8)
    assert cut == 1 and val == [] and [len(x) for x, _ in rows] == [8, 3]
    inputs, targets = rows[0]  # "a long prompt": its first 8 bytes dropped, "rompt" kept
    assert BYTES.decode(inputs.tolist()) == "romptyes"
    assert targets[:4].tolist() == [IGNORE] * 4 and targets[4:].tolist() == BYTES.encode("yes") + [BYTES.eot]


def test_a_batch_of_examples_is_padded_on_the_right_with_no_loss():
    rows = [(np.array([1, 2, 3, 4]), np.array([IGNORE, 3, 4, 5])), (np.array([7, 8]), np.array([8, 9]))]
    picks = np.random.default_rng(3).integers(0, 2, 4)
    x, y = train.example_batch(rows, picks)
    assert x.shape == y.shape == (4, 4 if 0 in picks else 2) and x.dtype == y.dtype == np.int64
    for b, i in enumerate(picks):
        n = len(rows[i][0])
        assert x[b, :n].tolist() == rows[i][0].tolist() and y[b, :n].tolist() == rows[i][1].tolist()
        assert (x[b, n:] == 0).all() and (y[b, n:] == IGNORE).all()


# --- the masked loss ---------------------------------------------------------------------------

def masked_targets(shape, vocab, seed=0):
    """Random targets with IGNORE at a prompt's positions, at a padded end, and over a whole row."""
    targets = np.random.default_rng(seed).integers(0, vocab, shape)
    targets[0, :3] = IGNORE
    targets[1, -2:] = IGNORE
    targets[2] = IGNORE
    return targets


def test_the_masked_positions_get_exactly_zero_gradient_through_the_head():
    xf, wte = rand(3, 7, 8, seed=1), rand(50, 8, seed=2)
    targets = masked_targets((3, 7), 50)
    masked = targets == IGNORE
    loss, dx, dwte = backward.head_backward(xf, wte, targets)
    assert (dx[masked] == 0).all() and (dx[~masked] != 0).all(axis=-1).all()
    assert (backward.cross_entropy_backward(xf @ wte.T, targets)[masked] == 0).all()
    # the counted positions alone give the same loss and gradients: the masked ones add nothing
    alone_loss, alone_dx, alone_dwte = backward.head_backward(xf[~masked][None], wte, targets[~masked][None])
    assert loss == pytest.approx(alone_loss, rel=1e-6)
    np.testing.assert_allclose(dx[~masked], alone_dx[0], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(dwte, alone_dwte, rtol=1e-5, atol=1e-8)


def test_the_fast_masked_loss_is_the_plain_one_and_the_reference(monkeypatch):
    """cross_entropy_fast with IGNORE targets (a whole chunk of rows among them) against cross_entropy and
    cross_entropy_backward, and the loss against the mean over the counted positions, in float64."""
    monkeypatch.setattr(backward, "LOGIT_ROWS", 4)  # chunks cut short, shared among the cores
    logits = rand(3, 7, 50, seed=4, scale=4.0)
    targets = masked_targets((3, 7), 50)
    counted = targets != IGNORE
    reference = -np.mean(log_softmax_64(logits)[counted, targets[counted]])
    want_loss, _ = backward.cross_entropy(logits, targets)
    want = backward.cross_entropy_backward(logits, targets)
    work = logits.reshape(-1, 50).copy()
    loss = backward.cross_entropy_fast(work, targets.reshape(-1))
    assert loss == pytest.approx(reference, rel=1e-6) and want_loss == pytest.approx(reference, rel=1e-6)
    np.testing.assert_allclose(work.reshape(want.shape), want, rtol=1e-5, atol=1e-8)
    assert (work.reshape(want.shape)[~counted] == 0).all()
    softmax = np.exp(log_softmax_64(logits))
    softmax[counted, targets[counted]] -= 1.0
    np.testing.assert_allclose(want, softmax * counted[..., None] / counted.sum(), rtol=1e-5, atol=1e-7)


def test_the_loss_is_the_mean_over_the_response_tokens_alone(models, encoder):
    """loss_and_grads on a padded batch of two examples: the mean of -log p over each response's tokens
    and its <|endoftext|>, each example run alone and unpadded through the model (the reference)."""
    hp, params = models["tiny"]
    examples = [(ALPACA, "Blue, like the sea."), ("Q: What is two and two?\nA:", " Four.")]
    rows, _, _ = train.example_rows(encoder, examples, 0.0, 64)
    picks = np.random.default_rng(1).integers(0, 2, 4)
    x, y = train.example_batch(rows, picks)
    assert sorted(set(picks.tolist())) == [0, 1] and (y == IGNORE).any()
    losses = []
    for i in picks:
        prompt, response = examples[i]
        n = len(encoder.encode(prompt))
        ids = encoder.encode(prompt) + encoder.encode(response) + [encoder.eot]
        logp = log_softmax_64(gpt2(np.array(ids[:-1]), params, hp))
        losses += [-logp[t - 1, ids[t]] for t in range(n, len(ids))]  # each response token from the one before it
    loss, _ = backward.loss_and_grads(x, y, params, hp)
    assert loss == pytest.approx(np.mean(losses), rel=1e-5)
    assert backward.cross_entropy(gpt2(x, params, hp), y)[0] == pytest.approx(np.mean(losses), rel=1e-5)
    assert train.validation_loss(params, hp, rows, 64, batches=1, batch_size=4) > 0


# --- a model learns a mapping ------------------------------------------------------------------

LETTERS = "abcdefgh"
REVERSE_RECIPE = dict(steps=400, batch_size=16, context=16, accum=1, lr=3e-3, min_lr_ratio=0.1, warmup=10,
                      weight_decay=0.0, grad_clip=1.0, dropout=0.0, seed=0, beta2=0.99)
RIGHT_AT_LEAST = 14  # of the 16 words it never saw, reversed exactly (and ended) at greedy; 16 are


def test_a_tiny_model_learns_to_reverse_words_it_never_saw():
    """"abc>" -> "cba" and <|endoftext|>, from scratch (2 layers, 32 wide, 400 steps on 488 three-letter
    words, a few seconds); then 16 other words, greedy: the loss was on the responses alone."""
    rng = np.random.default_rng(0)
    words = sorted({"".join(rng.choice(list(LETTERS), 3)) for _ in range(2000)})
    rng.shuffle(words)
    unseen, seen = words[:16], words[16:]
    rows, _, _ = train.example_rows(BYTES, [(f"{w}>", w[::-1]) for w in seen], 0.0, 16)
    hp = {"n_vocab": BYTES.n_vocab, "n_ctx": 16, "n_embd": 32, "n_head": 2, "n_layer": 2}
    params = init_params(hp, 0)
    state, buffers = optimizer.new_adamw_state(params), {}
    for step in range(REVERSE_RECIPE["steps"]):
        train.train_step(params, hp, state, {"kind": "instruction", "rows": rows}, step, REVERSE_RECIPE, buffers)
    right = [w for w in unseen if np.concatenate(list(generate(BYTES.encode(f"{w}>"), params, hp, 6, top_k=1,
                                                               stop=BYTES.eot))).tolist()
             == BYTES.encode(w[::-1]) + [BYTES.eot]]
    assert len(right) >= RIGHT_AT_LEAST, right


# --- the command line --------------------------------------------------------------------------

def from_scratch(data, out, *more):
    return ["--from-scratch", "--data", str(data), "--out", str(out), "--n-layer", "1", "--n-head", "2", "--n-embd",
            "16", "--context", "16", "--batch-size", "2", "--steps", "6", "--save-every", "3", "--eval-every", "3",
            "--quiet", *more]


def test_train_py_trains_on_instruction_data_and_resumes_it_bit_for_bit(tmp_path, capsys, monkeypatch):
    """The count of examples cut is printed; Ctrl-C in step 4 saves step 3, and --resume gives the
    straight run's files, bit for bit."""
    examples = [{"prompt": f"{w}>", "response": w[::-1]} for w in ("cat", "dog", "sun", "map", "pen", "owl")]
    examples.append({"prompt": "a prompt much longer than the context of sixteen tokens>", "response": "ok"})
    data = write_jsonl(tmp_path / "reverse.jsonl", examples)
    assert train_cli.main(from_scratch(data, tmp_path / "straight")) == 0
    out = capsys.readouterr().out
    assert ("instruction data: 7 examples, 1 held out for validation; 1 longer than --context 16 + 1 tokens, cut to "
            "fit (the prompt's first tokens dropped first)") in out
    assert "validation loss" in out
    step, calls = train.train_step, []

    def ctrl_c_in_step_4(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(train, "train_step", ctrl_c_in_step_4)
    assert train_cli.main(from_scratch(data, tmp_path / "stopped")) == 130
    monkeypatch.setattr(train, "train_step", step)
    assert train_cli.main(from_scratch(data, tmp_path / "stopped", "--resume")) == 0
    stopped, straight = tmp_path / "stopped", tmp_path / "straight"
    name = "model.ckpt.data-00000-of-00001"
    assert (stopped / name).read_bytes() == (straight / name).read_bytes()
    with np.load(stopped / train.STATE_FILE) as a, np.load(straight / train.STATE_FILE) as b:
        assert sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "a", "response": "b"}\nnot json\n', "line 2 is not JSON"),
    ('{"prompt": "a", "answer": "b"}\n', 'line 1 is not {"text": ...} nor {"prompt": ..., "response": ...}'),
    ('{"prompt": "a", "response": "b"}\n{"text": "c"}\n', "line 2 is a document (text), but the lines before it "
                                                         "are an example (prompt, response): give one kind"),
    ('{"prompt": "a", "response": ""}\n', "line 1's response is empty"),
    ("", "is empty"),
    ('{"prompt": "a", "response": "b"}\n', "one example leaves none to hold out for validation: give more, or "
                                           "--val-fraction 0"),
])
def test_bad_instruction_data_is_one_line_and_nothing_is_written(tmp_path, capsys, content, message):
    data = tmp_path / "bad.jsonl"
    data.write_text(content, encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        train_cli.main(from_scratch(data, tmp_path / "out"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_the_masked_loss_and_every_gradient_match_torchs_ignore_index(models):
    """loss_and_grads with IGNORE targets (a prompt's positions, padding) against torch autograd through
    Hugging Face's GPT-2 and cross_entropy(..., ignore_index=-1): tests/data/make_masked_golden.py."""
    golden = np.load(os.path.join(DATA, "masked_golden.npz"))
    hp, params = models["odd"]
    targets = golden["masked/targets"]
    assert (targets == IGNORE).sum() == 9
    loss, grads = backward.loss_and_grads(golden["masked/ids"], targets, params, hp)
    assert abs(loss - float(golden["masked/loss"])) <= 1e-5
    for name, grad in shapes.flatten(grads).items():
        want = golden[f"masked/{name}"] if name != "wte" else golden["masked/wte/grad_rows"]
        grad = grad if name != "wte" else grad[golden["masked/wte/rows"]]
        worst = np.abs(grad - want).max()
        assert worst <= 1e-5 * np.abs(want).max(), f"{name}: {worst:.3g} from torch's (largest {np.abs(want).max():.3g})"
