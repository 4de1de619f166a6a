"""Plausible wrong answers to the exercises (handout.py EXERCISES), each of which must fail its exercise's
tests: the check that the tests teach (a test that a wrong answer passes tells a student it is right).

    python tests/wrong_answers.py                 # every wrong answer: "fails" (good) or "PASSES" (a weak test)
    python tests/wrong_answers.py gelu top_p_filter

tests/test_handout.py::test_each_plausible_wrong_answer_fails_its_exercises_tests runs it. Keyed by the
function's name, whatever its exercise's number. A wrong answer is a body (handout.write_handout's
bodies=), or (old, new): the right body with old replaced by new. Each is put in place in this process
(the function, or the method, replaced wherever it was imported, and its fast twin made a call to it as a
handout makes it), the exercise's tests run with pytest.main, and everything is put back: one process,
one import of each test file, instead of a handout and a Python for each answer.
"""
import contextlib
import importlib
import inspect
import io
import os
import re
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

import handout  # noqa: E402  (after the project's folder is on the path)

WRONG_ANSWERS = {  # function: [(body, or (old, new) in the right body), what is wrong]
    "gelu": [("return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))).astype(np.float32)",
              "the exact erf GELU, not GPT-2's tanh approximation")],
    "softmax": [("e = np.exp(x)\nreturn e / e.sum(axis=-1, keepdims=True)", "no max subtracted: exp overflows")],
    "layer_norm": [(("(y * y).mean(axis=-1, keepdims=True)", "(y * y).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1)"),
                    "the unbiased variance (torch's LayerNorm divides by C)"),
                   (("np.sqrt((y * y).mean(axis=-1, keepdims=True) + eps)",
                     "(np.sqrt((y * y).mean(axis=-1, keepdims=True)) + eps)"), "eps outside the square root")],
    "attention_scores": [(("(1.0 / math.sqrt(q.shape[-1]))", "(1.0 / q.shape[-1])"), "divided by D, not √D"),
                         (("scores[..., -n_queries:] += causal_mask(n_queries, like=scores)",
                           "scores += causal_mask(n_queries, like=scores)"),
                          "the mask over all the keys: wrong once keys are cached")],
    "attention_weights": [("return softmax(attention_scores(q, k).swapaxes(-1, -2)).swapaxes(-1, -2)",
                           "softmax over the queries")],
    "attention": [("return attention_weights(q, k) @ v / math.sqrt(q.shape[-1])", "the values scaled by 1/√D too")],
    "mha": [(('np.split(linear(x, **c_attn), 3, axis=-1)', 'np.split(linear(x, **c_attn), 3, axis=-1)[::-1]'),
             "q and v swapped")],
    "split_heads": [("B, T, C = x.shape\nreturn x.reshape(B, n_head, T, C // n_head)", "reshaped, not transposed")],
    "merge_heads": [("B, H, T, D = x.shape\nreturn x.reshape(B, T, H * D)", "the heads not moved back beside each other")],
    "kv_append": [(('kv["n"] = n + T\n', ""), "the count never moves")],
    "blocked_attention": [(("k[..., :n_past + end, :], v[..., :n_past + end, :]", "k[..., :end, :], v[..., :end, :]"),
                           "the cached keys forgotten")],
    "top_k_filter": [(("np.partition(logits, -k, axis=-1)[:, -k:]", "np.partition(logits, -k - 1, axis=-1)[:, -k - 1:]"),
                      "one token too many")],
    "top_p_filter": [(("np.cumsum(probs, axis=-1) - probs >= p", "np.cumsum(probs, axis=-1) >= p"),
                      "the token that crosses p dropped: one too few")],
    "sample_next": [(("sampling_probs(logits, temperature,", "sampling_probs(logits, 1.0,"), "the temperature ignored")],
    "count_parameters": [(('"layer norms": 2 * norm_size', '"layer norms": norm_size'), "one layer norm a block")],
    "count_tensors": [(('"ln_f": PARTS[3]', '"ln_f/": PARTS[3]'), "ln_f counted with the blocks")],
    "merge_once": [(("rank, i = min(ranked)", "rank, i = ranked[0]"), "the leftmost pair, not the best ranked")],
    "merge": [("return self.merge_once(ids) or list(ids)", "one merge, not until none is left")],
    "read_varint": [(("value |= (byte & 0x7F) << shift", "value |= byte << shift"), "the continuation bit kept")],
    "read_footer": [(("(high << 32 | low)", "(low << 32 | high)"), "the magic's halves swapped")],
    "crc32c": [(("return crc ^ 0xFFFFFFFF", "return crc"), "no final inversion")],
    "transformer_block": [(("layer_norm(x, **ln_2, eps=eps)", "layer_norm(x, **ln_1, eps=eps)"), "ln_1 used twice")],
    "logit_lens": [(('matmul(layer_norm(resid, **params["ln_f"], eps=layer_norm_eps(hparams)), params["wte"].T)',
                     'matmul(resid, params["wte"].T)'), "the residual read without ln_f")],
    "previous_token_scores": [(("offset=-1", "offset=1"), "the next token's weight, not the previous one's")],
    "induction_targets": [(("last_seen[token] + 1", "last_seen[token]"), "the earlier copy, not the token after it")],
    "induction_scores": [(("pattern[..., rows, targets[rows]]", "pattern[..., rows, targets[rows] - 1]"),
                          "the weight on the earlier copy itself, not the token after it")],
    "zero_ablate_head": [(("z[:, :, head] = 0.0", "z[:, head] = 0.0"), "a position zeroed, not a head")],
    "loss": [(("[:, :-1], ids[:, 1:]", "[:, 1:], ids[:, 1:]"), "each position scored on its own token")],
    "layer_norm_backward": [((" - xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True)", ""),
                             "the variance's dependence on x forgotten")],
    "softmax_backward": [("return y * dy", "only the diagonal of the Jacobian")],
    "attention_backward": [(("return dscores @ k * scale,", "return dscores @ k,"), "dq without the 1/√D")],
    "forward_backward": [(("dxf, dwte, p_drop", "dxf, None, p_drop"), "the output layer's share of wte's gradient lost")],
    "batch": [(("ids[s + 1:s + context + 1]", "ids[s:s + context]"), "the targets not shifted by one")],
    "embed": [(("wpe[start:start + ids.shape[1]]", "wpe[:ids.shape[1]]"), "positions counted from 0 in a cached step")],
    "learning_rate": [(("(step + 1) / warmup", "step / warmup"), "the first step's rate 0")],
    "grad_norm": [(("float(np.vdot(a, a))", "float(np.abs(a).sum())"), "the sum of |g|, not the root of Σ g²")],
    "clip_scale": [(("max_norm / (norm + 1e-6)", "norm / max_norm"), "the scale upside down")],
    "clip_grad_norm": [(("return norm", "return grad_norm(grads)"), "the norm after clipping returned")],
    "gelu_backward": [(("0.5 * (1.0 + t) + ", ""), "the derivative of gelu's x factor left out")],
    "ffn_backward": [(("hook(\"mlp.gelu\", da)", "hook(\"mlp.gelu\", da * 0.5)"), "GELU's gradient halved")],
    "varint": [(("value & 0x7F | 0x80", "value & 0x7F"), "no continuation bit")],
    "topk_relu": [(("np.maximum(np.take_along_axis(h, top, -1), 0.0)", "np.take_along_axis(h, top, -1)"),
                   "no ReLU after the top k"),
                  ("return np.where(topk_mask(h, k), np.maximum(h, 0.0), 0.0)",
                   "sae.topk_mask's choice, which in a handout asks this very function")],
    "jumprelu_backward": [(("-ste.sum(0)", "ste.sum(0)"), "the threshold's gradient of the wrong sign")],
    "act_add": [(("x[:, :n] +=", "x[:, -n:] +="), "added at the back, not the front")],
    "adamw_update": [(("(np.sqrt(v_hat) + eps)", "np.sqrt(v_hat + eps)"), "eps inside the square root"),
                     (("m_hat = m / (1.0 - beta1 ** t)", "m_hat = m"), "the momentum's bias not corrected")],
    "pair_counts": [(("counts[pair] = counts.get(pair, 0) + 1", "counts[pair] = 1"), "a pair counted once")],
    "merge_pair": [(("i += 2", "i += 1"), "the merged pair's second id kept")],
    "learn_merge": [(("max(counts, key=counts.get)", "max(sorted(counts), key=counts.get)"),
                     "a tie broken by the smaller pair, not the first seen")],
    "residual_scale": [("return 1.0 / math.sqrt(n_layer)", "one residual branch a block, not two")],
    "init_tensor": [(('name.endswith("c_proj/w")', 'name.endswith("attn/c_proj/w")'), "the MLP's c_proj not scaled")],
    "rolling_windows": [(("ids[end - 1 - context:predicted]", "ids[end - context:predicted]"),
                         "a window of N - 1 inputs")],
    "continuation_ids": [("return encoder.encode(context), encoder.encode(continuation)",
                          "each part encoded apart, its space not moved")],
    "cross_entropy": [("return next_token_loss(logits, targets), log_softmax(logits)", "the mask forgotten")],
    "cross_entropy_backward": [(("max(np.count_nonzero(counted), 1)", "counted.size"),
                                "divided by every position, counted or not")],
    "lora_update": [("return matmul(matmul(x, A), B)", "the scale alpha / R forgotten")],
    "lora_linear_backward": [(('"B": s * dsB', '"B": dsB'), "B's gradient without the scale")],
    "logit_difference": [("rows = np.arange(len(logits))\nreturn float((logits[rows, :, answer] - logits[rows, :, wrong])"
                          ".mean())", "every position's difference, not the last one's")],
    "patch_hook": [("def hook(act, name):\n    return clean.copy()\n\nreturn hook", "the whole activation, not the cell")],
    "dla_component": [("return ((component / scale) * direction).sum(-1)", "not centred")],
    "adjacency_row": [("return (grad[positions - 1] * vectors).sum(-1)", "the gradient one position early"),
                      ("return grad[positions].sum(-1) * vectors.sum(-1)", "the sums' product, not the dot product")],
    "activation_grads": [("ids = checked_ids(ids, params)\n"
                          "kept, top = training_forward(ids, params, hparams, 0.1, np.random.default_rng(0))\n"
                          "model_backward(ids, kept, top, params, hparams, matmul(dlogits, params['wte']), p_drop=0.1, "
                          "frozen=True, hook=hook)", "training's call copied: dropout on")],
    "penalize_repeats": [(("logits / penalty, logits * penalty", "logits * penalty, logits / penalty"),
                          "a seen token made likelier")],
    "ban_repeated_ngrams": [(("ids[:, None, ids.shape[1] - n + 1:]", "ids[:, None, ids.shape[1] - n:-1]"),
                             "the n-gram's start one token early")],
    "beam_step": [(("(scores[:, None] + logprobs)", "logprobs"), "the beams' scores so far forgotten")],
    "pooled_positions": [("return np.full(len(ids), ids.shape[1] - 1)", "the last position, a pad or not")],
    "quantize_block": [(("round_half_away(x * inverse)", "np.round(x * inverse)"), "halves to even (np.round)"),
                       (("round_half_away(x * inverse)", "round_half_away(x / d)"), "x / d, not x · (1/d)")],
    "dequantize_block": [("return (q.astype(np.float16) * np.float16(d)).astype(np.float32)", "multiplied in float16")],
    "encode_pre": [("return x @ sae['W_enc'] + sae['b_enc']", "b_dec not taken away first")],
    "encode": [("return encode_pre(x, sae)", "no ReLU")],
    "decode": [("return f @ sae['W_dec']", "b_dec forgotten")],
    "mse_loss": [("return float(((x_hat - x) ** 2).mean())", "the mean over the width too")],
    "l1_loss": [("return float(l1_coefficient * np.abs(f).sum(-1).mean())", "the decoder's norms forgotten")],
    "sae_backward": [(('    grads["b_dec"] -= grads["b_enc"] @ sae["W_enc"].T', '    pass'),
                      "b_dec's path through the encoder forgotten")],
    "ring_allreduce": [(("part += received[:part.size]", "part[...] = received[:part.size]"),
                        "the chunk that comes in written over the rank's own, not added to it"),
                       (("recvbuf=chunk(rank - s), source=left", "recvbuf=chunk(rank + 1 - s), source=left"),
                        "the all-gather receives into the chunk it sends: each rank keeps one chunk summed")],
    "bucket_slices": [(("start, stop = share(n, parts, part)",
                        "start, stop = n // parts * part, n // parts * (part + 1)"),
                       "slices n // parts long: the last n % parts elements of a tensor belong to no rank"),
                      ("layout = []\nfor part in range(parts):\n    layout.append([])\n    offset = 0\n"
                       "    for n in sizes:\n        start, stop = share(n, parts, part)\n"
                       "        layout[-1].append((start, stop, offset + start))\n        offset += n\nreturn layout",
                       "each slice where it lies among whole tensors: a reduce-scatter hands a rank other elements")],
    "dpo_loss": [(("rewards[:P] > rewards[P:]", "rewards[:P] >= rewards[P:]"), "a tie counted as right"),
                 (("pull = beta * sigmoid(-beta * delta) / P", "pull = beta * sigmoid(beta * delta) / P"),
                  "σ(β δ): the pairs already right pulled hardest")],
    "tuned_lens_logits": [("return matmul(layer_norm(linear(h, translator['weight'].T, translator['bias']), **ln_f, "
                           "eps=eps), wte.T)", "the translator's output alone, not added to h (the paper's formula, "
                                               "not tuned-lens's)"),
                          (("translate(h, **translator)", "translate(h, translator['weight'].T, translator['bias'])"),
                           "h A, not h Aᵀ (torch's Linear)")],
    "logistic_gradient": [(("float(r.sum())", "float(r.sum()) + b"), "the intercept penalised too"),
                          (("sigmoid(-s * (X @ w + b))", "sigmoid(s * (X @ w + b))"), "σ of the margin, not of minus it")],
}


def exercise_of(function):
    """-> (number, file) of the exercise that has the student write `function`."""
    return next((n, file) for n in handout.EXERCISES for file, f in handout.functions(n) if f == function)


def defined_tests():
    """{test name: its file under tests/}."""
    where = {}
    for name in sorted(os.listdir(HERE)):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(HERE, name), encoding="utf-8") as f:
                where.update(dict.fromkeys(re.findall(r"^def (test_\w+)\(", f.read(), re.M), name))
    return where


def definition(module, name):
    """-> (the class that defines method `name`, or None for a function of the module, the function)."""
    if inspect.isfunction(getattr(module, name, None)) and getattr(module, name).__module__ == module.__name__:
        return None, getattr(module, name)
    return next((c, c.__dict__[name]) for c in vars(module).values()
                if inspect.isclass(c) and c.__module__ == module.__name__ and name in c.__dict__)


def right_body(file, name):
    module = importlib.import_module(file[:-3].replace("/", "."))
    source = textwrap.dedent(inspect.getsource(definition(module, name)[1]))
    node = handout.function_node(__import__("ast").parse(source), name)
    start = 1 if __import__("ast").get_docstring(node) is not None else 0
    lines = source.splitlines()[node.body[start].lineno - 1:node.end_lineno]
    return textwrap.dedent("\n".join(lines))


@contextlib.contextmanager
def replaced(file, name, body):
    """The function (or method) `name` of `file` given `body`, wherever it was imported; put back after."""
    module = importlib.import_module(file[:-3].replace("/", "."))
    owner, original = definition(module, name)
    space = {}
    source = handout.replace_body(textwrap.dedent(inspect.getsource(original)), name, body)
    exec(compile(source, module.__file__, "exec"), vars(module), space)
    if owner is not None:
        setattr(owner, name, space[name])
        try:
            yield
        finally:
            setattr(owner, name, original)
        return
    swapped = [(m, k) for m in list(sys.modules.values()) for k, v in list(vars(m).items()) if v is original]
    for m, k in swapped:
        setattr(m, k, space[name])
    try:
        yield
    finally:
        for m in list(sys.modules.values()):
            for k, v in list(vars(m).items()):
                if v is space[name]:
                    setattr(m, k, original)


def wrong_body(file, function, answer):
    if isinstance(answer, str):
        return answer
    old, new = answer
    right = right_body(file, function)
    assert old in right, f"{function}: {old!r} is not in its body"
    return right.replace(old, new)


def run_tests(tests, where):
    """pytest.main on these tests, quietly -> its exit code (1: some failed)."""
    files = sorted({os.path.join(HERE, where[t]) for t in tests})
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return pytest.main(["-q", "-x", "-p", "no:cacheprovider", "--rootdir", ROOT, *files, "-k", " or ".join(tests)])


def check(function, answer, where):
    """-> 'fails' (its exercise's tests catch it) or 'PASSES'; an exit code other than 0 or 1 is an error."""
    number, file = exercise_of(function)
    with contextlib.ExitStack() as stack:
        stack.enter_context(replaced(file, function, wrong_body(file, function, answer)))
        for (twin_file, twin), (plains, body) in handout.TWINS.items():
            if function in plains:  # as a handout does: the fast twin calls the student's function
                stack.enter_context(replaced(twin_file, twin, body))
        code = run_tests(handout.tests(number), where)
    if code not in (0, 1):
        raise RuntimeError(f"{function}: pytest exit code {code}")
    return "fails" if code == 1 else "PASSES"


def main(names):
    """Print, for each wrong answer to these functions (none: every one), whether its tests catch it; first,
    that the right answers pass, through the same replacement (which imports every test file beforehand)."""
    os.chdir(ROOT)
    where, names = defined_tests(), names or list(WRONG_ANSWERS)
    tests = list(dict.fromkeys(t for f in names for t in handout.tests(exercise_of(f)[0])))
    assert run_tests(tests, where) == 0, "the exercises' tests fail with the right answers"
    for function in names:
        file = exercise_of(function)[1]
        print(f"{function}: right answer {check(function, right_body(file, function), where)}", flush=True)
        for answer, why in WRONG_ANSWERS[function]:
            print(f"{function}: {check(function, answer, where)} ({why})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
