"""The exercise loop works in a classroom: every test docs/exercises.md names exists; each exercise,
blanked by handout.py, fails its tests with a message naming it, and passes restored; and the
program runs what the student writes (a wrong body changes what it prints)."""
import ast
import concurrent.futures
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import HERE, ROOT
import handout
from interface import notebook
from plumbing import classifier_files


EXERCISES_DOC = os.path.join(ROOT, "docs", "exercises.md")


def documented_exercises():
    """{number: [test names]} from docs/exercises.md: every item "N. **title**", wherever it stands."""
    with open(EXERCISES_DOC, encoding="utf-8") as f:
        items = re.split(r"\n(?=\d+\. \*\*)", f.read())
    items = [item.split("\n#", 1)[0] for item in items]  # an item ends at the next heading, if one comes first
    return {int(item.split(".", 1)[0]): list(dict.fromkeys(re.findall(r"`(?:tests/\w+\.py::)?(test_\w+)`", item)))
            for item in items if re.match(r"\d+\. \*\*", item)}


def files_defining_tests():
    """{test name: the file under tests/ that defines it}."""
    where = {}
    for path in sorted(glob.glob(os.path.join(HERE, "test_*.py"))):
        with open(path, encoding="utf-8") as f:
            where |= {n.name: os.path.basename(path) for n in ast.walk(ast.parse(f.read()))
                      if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    return where


def defined_tests():
    return set(files_defining_tests())


def test_every_test_the_docs_name_exists():
    named = documented_exercises()
    assert list(named) == list(range(1, len(named) + 1)) and len(named) >= 12, "docs/exercises.md: 1, 2, 3, ... in order"
    missing = sorted({t for tests in named.values() for t in tests} - defined_tests())
    assert not missing, f"docs/exercises.md names tests that do not exist, so their -k selects nothing: {missing}"


def test_the_docs_and_the_handout_name_the_same_tests():
    assert {n: sorted(t) for n, t in documented_exercises().items()} == {n: sorted(handout.tests(n)) for n in handout.EXERCISES}


def test_the_docs_give_one_command_for_every_exercise():
    with open(EXERCISES_DOC, encoding="utf-8") as f:
        text = f.read()
    assert "python -m pytest -q -k NAME" in text and "tests/test_gpt2_numpy.py -k" not in text


def test_the_docs_say_once_what_handout_py_says():
    """One introduction, not two that disagree: no paragraph twice, and what each program needs done
    is what python handout.py prints."""
    with open(EXERCISES_DOC, encoding="utf-8") as f:
        paragraphs = [p.strip() for p in f.read().split("\n\n") if p.strip()]
    assert len(paragraphs) == len(set(paragraphs)), "docs/exercises.md says a paragraph twice"
    printed = "\n".join("    " + line for line in handout.programs_waiting(list(handout.EXERCISES)))
    assert printed.strip() in paragraphs, f"docs/exercises.md should show what python handout.py prints:\n{printed}"


def run_tests(folder, tests):
    """The student's command, python -m pytest -q -k NAME, on the files that hold those tests alone (collecting
    every file would select the same tests, more slowly)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's modules, not ours
    files = sorted({os.path.join("tests", TEST_FILES[t]) for t in tests})
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files,
                           "-k", " or ".join(tests)], cwd=folder, capture_output=True, text=True, env=env, timeout=300)


TEST_FILES = files_defining_tests()


def on_every_core(work, items):
    """{item: work(item)}, as many at once as there are cores: each work runs processes of its own, and
    one at a time they would leave the second core idle (these tests are a third of the suite's time)."""
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return dict(zip(items, pool.map(work, items)))


@pytest.fixture(scope="module")
def blanked_runs(tmp_path_factory):
    """Each exercise blanked alone in a handout of its own, and its tests run there: {number: (folder, run)}."""
    def blank_and_test(number):
        folder = handout.write_handout(str(tmp_path_factory.mktemp(f"blank{number}") / "class"), [number])
        return folder, run_tests(folder, handout.tests(number))

    return on_every_core(blank_and_test, list(handout.EXERCISES))


@pytest.mark.parametrize("number", list(handout.EXERCISES))
def test_a_blanked_exercise_fails_its_tests_naming_the_exercise(blanked_runs, number):
    title = handout.EXERCISES[number][0]
    tests = handout.tests(number)
    folder, r = blanked_runs[number]
    assert r.returncode == 1, r.stdout[-2000:]
    failed = re.findall(r"^FAILED \S+::(test_\w+)", r.stdout, re.M)
    assert set(failed) == set(tests), (failed, r.stdout[-2000:])
    assert f"exercise {number} ({title}): write " in r.stdout
    for file, function, test in handout.EXERCISES[number][1]:  # each blank names its own function's test
        with open(os.path.join(folder, file), encoding="utf-8") as f:
            body = body_of_source(f.read(), function)
        message = f"exercise {number} ({title}): write {function}; then run python -m pytest -q -k {test}"
        assert body == f"raise NotImplementedError({message!r})", body


def test_a_handout_stopped_half_way_leaves_no_half_copy(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM, raised the same way) after the copy, while the exercises are blanked: nothing is left,
    neither class/ nor its hidden .writing-* folder; an empty class/ that was there stays as it was."""
    def stopped(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(handout, "replace_body", stopped)
    (tmp_path / "empty").mkdir()
    for out in ("class", "empty"):
        with pytest.raises(KeyboardInterrupt):
            handout.write_handout(str(tmp_path / out), [1])
    assert os.listdir(tmp_path) == ["empty"] and os.listdir(tmp_path / "empty") == []


def test_a_blanked_function_keeps_its_signature_and_docstring():
    source = 'def f(x, y=1):\n    """Doc."""\n    z = x + y\n    return z\n\n\ndef g():\n    return 2\n'
    out = handout.blank(source, "f", "exercise 0: write f")
    assert out == ('def f(x, y=1):\n    """Doc."""\n    raise NotImplementedError(\'exercise 0: write f\')\n\n\n'
                   'def g():\n    return 2\n')
    ns = {}
    exec(out, ns)
    with pytest.raises(NotImplementedError, match="exercise 0"):
        ns["f"](1)
    assert ns["g"]() == 2


def run_handout(*args, root=ROOT):
    return subprocess.run([sys.executable, os.path.join(root, "handout.py"), *args], capture_output=True, text=True,
                          cwd=root)


def test_handout_cli_lists_and_refuses_bad_requests(tmp_path):
    listed = run_handout("--list")
    assert listed.returncode == 0 and all(f"{n:>2}. " in listed.stdout for n in handout.EXERCISES)
    for args, message in [([str(tmp_path / "a"), "99"], "no exercise 99"),
                          ([str(tmp_path / "a"), "nine"], "error: numbers must be a whole number or a range (1-6), got 'nine'"),
                          ([str(tmp_path), "1"], "already exists and is not an empty folder")]:
        (tmp_path / "keep").write_text("x")
        r = run_handout(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "a").exists()


def test_handout_cli_takes_the_ranges_it_prints(tmp_path, monkeypatch):
    """"1-3, 5" as handout.py prints it, pasted: exercises 1, 2, 3 and 5; "3-1" and "1-" are one line, exit 2."""
    from interface import handout_cli
    written = []
    monkeypatch.setattr(handout, "write_handout", lambda out, numbers: written.append(numbers))
    assert handout_cli.main([str(tmp_path / "a"), "1-3,", "5", "7-7"]) == 0
    assert written == [[1, 2, 3, 5, 7]]
    for bad, message in [("3-1", "must be a range that runs up (1-6), got '3-1'"),
                         ("1-", "must be a whole number or a range (1-6), got '1-'")]:
        r = run_handout(str(tmp_path / "b"), bad)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_a_handout_inside_the_project_does_not_copy_itself(tmp_path):
    project = tmp_path / "project"
    handout.write_handout(str(project), [])
    r = run_handout("class", "4", root=str(project))
    assert r.returncode == 0, r.stderr
    assert not (project / "class" / "class").exists()
    with open(project / "class" / "gpt2_numpy.py", encoding="utf-8") as f:
        assert "exercise 4 (the embeddings): write embed" in f.read()


def small_project(folder):
    """A stand-in project (handout.py, a module and its test), with what a class folder also holds: a
    virtual environment (.venv), another under a name of its own (env2), models and a scratch file; and
    what a handout leaves behind (LEFT_BEHIND): the teacher's answers, and bench/."""
    for name, text in [("handout.py", "# the program\n"), ("mod.py", "x = 1\n"), ("tests/test_mod.py", "pass\n"),
                       ("tests/wrong_answers.py", "WRONG = {}\n"), ("tests/test_handout.py", "WRONG = {}\n"),
                       ("tests/test_handout_leaks.py", "pass\n"), ("bench/bench_mod.py", "pass\n"),
                       (".venv/pyvenv.cfg", "home = /usr/bin\n"), (".venv/lib/big.py", "pass\n"),
                       ("env2/pyvenv.cfg", "home = /usr/bin\n"), ("models/124M/checkpoint", "w\n"),
                       ("scratch.txt", "mine\n")]:
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)
    return folder


def files_in(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


def git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


def test_a_handout_copies_what_git_tracks(tmp_path):
    """Issue 37: a .venv (167 MB of a 186 MB class folder), models and untracked files stay behind; a file
    changed but not committed goes as it is now, one deleted does not. Issue 51: so do the teacher's answers
    (tests/wrong_answers.py, handout.py's own tests) and bench/, tracked as they are."""
    project = small_project(str(tmp_path / "project"))
    with open(os.path.join(project, "gone.py"), "w", encoding="utf-8") as f:
        f.write("pass\n")
    git(project, "init", "-q")
    git(project, "add", "handout.py", "mod.py", "tests", "bench", "gone.py")
    os.remove(os.path.join(project, "gone.py"))
    with open(os.path.join(project, "mod.py"), "a", encoding="utf-8") as f:
        f.write("y = 2\n")
    handout.write_handout(str(tmp_path / "class"), [], root=project)
    assert files_in(tmp_path / "class") == [handout.RECORD, "handout.py", "mod.py", os.path.join("tests", "test_mod.py")]
    assert (tmp_path / "class" / "mod.py").read_text() == "x = 1\ny = 2\n"
    with open(os.path.join(ROOT, ".gitignore"), encoding="utf-8") as f:
        assert ".venv/" in f.read().split(), "a virtual environment in the project folder is not in .gitignore"


def test_a_handout_of_a_folder_git_does_not_track_leaves_out_virtual_environments(tmp_path):
    """Not a git checkout (a zip's folder, a handout's copy), or one inside a repository that does not track
    the project (a home folder kept in git): every file but models/, caches and virtual environments."""
    project = small_project(str(tmp_path / "home" / "project"))
    expected = [handout.RECORD, "handout.py", "mod.py", "scratch.txt", os.path.join("tests", "test_mod.py")]
    handout.write_handout(str(tmp_path / "class"), [], root=project)
    assert files_in(tmp_path / "class") == expected
    git(tmp_path / "home", "init", "-q")
    git(tmp_path / "home", "add", "project/mod.py")  # the home folder's repository tracks one file of it
    handout.write_handout(str(tmp_path / "class2"), [], root=project)
    assert files_in(tmp_path / "class2") == expected


def test_the_handouts_message_says_the_models_stay_in_the_original_folder(tmp_path):
    r = run_handout(str(tmp_path / "class"), "4")
    models = os.path.join(ROOT, "models")
    assert r.returncode == 0, r.stderr
    assert f"the models stay in {models}, not copied: in the copy, give --model {models}/NAME" in r.stdout
    assert not (tmp_path / "class" / "models").exists() and not (tmp_path / "class" / ".venv").exists()


def collected(folder, *args):
    """The test ids pytest collects in a folder (run as the README says, with no path given)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", *args],
                       cwd=folder, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:]
    return [line for line in r.stdout.splitlines() if "::" in line]


def test_the_readmes_handout_inside_the_project_leaves_its_tests_alone(tmp_path):
    """python handout.py class/ in the project, then python -m pytest -q: only tests/ is collected
    (pytest.ini), not the copy's tests beside it ("import file mismatch"); and the copy runs its own."""
    project = tmp_path / "project"
    handout.write_handout(str(project), [])
    assert run_handout("class/", "1", "4", "9", root=str(project)).returncode == 0
    after = collected(project)  # the project's alone: each under tests/, once
    assert after and all(t.startswith("tests/") for t in after) and len(set(after)) == len(after)
    assert [t for t in after if "::test_gelu_is_the_tanh_approximation" in t] == [
        "tests/test_gpt2_numpy.py::test_gelu_is_the_tanh_approximation"]
    assert collected(project / "class") == after  # the copy collects its own tests/, the same tests
    with open(os.path.join(ROOT, ".gitignore"), encoding="utf-8") as f:
        assert "/class/" in f.read().split(), "the README's handout folder, class/, is not in .gitignore"


# --- the program runs what the student writes ------------------------------------------------

# Real text, not words picked for a test: a word that is itself a token skips merge (encode_piece's
# shortcut), so a prompt of whole tokens would hide exercise 1 from the table. Each text below has
# a word that BPE must merge (test_every_programs_text_has_a_word_bpe_must_merge).
PROMPT = "Alan Turing theorized that computers would one day become"
with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
    SHAKESPEARE = f.read(2000)  # the text the programs train on and score
LAMBADA = [line for line in SHAKESPEARE.splitlines() if len(line.split()) >= 6][:5]
HEADS_TEXT = "the leanness that afflicts us, the object of our misery; the leanness that afflicts us, the object"
ABLATE_TEXT = "What authority surfeits on would relieve us: if they would yield us but the superfluity"
HEADS = """import numpy as np, look_inside
from interface import loading
encoder, hp, params = loading.load_model("model")
ids = encoder.encode(TEXT)
_, cache = look_inside.run_with_cache([ids], params, hp, names=lambda n: n.endswith("hook_pattern"))
pattern = np.stack([cache[f"blocks.{i}.attn.hook_pattern"][0] for i in range(hp["n_layer"])])
print(look_inside.previous_token_scores(pattern).round(5).tolist(), look_inside.induction_scores(pattern, ids).round(5).tolist())
"""
ABLATE = """import look_inside
from interface import loading
encoder, hp, params = loading.load_model("model")
ids = [encoder.encode(TEXT)]
print(round(look_inside.loss(ids, params, hp), 5), round(look_inside.loss(ids, params, hp, {"blocks.1.attn.hook_z": look_inside.zero_ablate_head(1)}), 5))
"""
IOI = ["--clean", "When Mary and John went to the apothecary, John gave a drink to",
       "--corrupted", "When Mary and John went to the apothecary, Mary gave a drink to", "--answer", " Mary",
       "--wrong", " John"]
Q8_0 = """import os, convert
from interface import loading
import gpt2_numpy as g
os.makedirs("trained")
convert.convert("model", os.path.join("trained", "model.gguf"), "gguf", "q8_0")
encoder, hp, params = loading.load_model(os.path.join("trained", "model.gguf"))
ids = encoder.encode("Alan Turing theorized that")
print([int(t[0]) for t in g.generate(ids, params, hp, n_tokens=6, top_k=1)], float(params["blocks"][0]["mlp"]["c_proj"]["w"].sum()))
"""
GRAPH = """import numpy as np
import tracing
from interface import loading
encoder, hp, params = loading.load_model("model")
rng = np.random.default_rng(0)
C, d = hp["n_embd"], 16
tcs = [{"W_enc": rng.standard_normal((C, d)).astype(np.float32), "b_enc": (rng.standard_normal(d) * 0.3 - 0.2).astype(
    np.float32), "W_dec": (rng.standard_normal((d, 1, C)) * 0.4).astype(np.float32), "b_dec": np.zeros(C, np.float32),
    "activation": "relu"} for _ in range(hp["n_layer"])]
ids = tracing.prompt_ids(encoder.encode(TEXT), encoder.eot, hp["n_ctx"])
graph = tracing.attribution_graph(params, hp, ids, tcs)
nodes, edges, _ = tracing.prune_graph(graph)
print(len(graph["active_features"]), int(nodes.sum()), int(edges.sum()), [round(s, 4) for s in tracing.graph_scores(graph)])
"""
PROGRAMS = {  # handout.WHERE's programs, as commands run in a copy of the project
    "generate": ["gpt2_numpy.py", "--model", "model", "--seed", "1", "--top-k", "20", "--top-p", "0.9", "--n-tokens",
                 "8", "--quiet", PROMPT],
    "params": ["gpt2_numpy.py", "--params", "model"],
    "lens": ["gpt2_numpy.py", "--model", "model", "--lens", PROMPT],
    "heads": ["-c", HEADS.replace("TEXT", repr(HEADS_TEXT))],
    "ablate": ["-c", ABLATE.replace("TEXT", repr(ABLATE_TEXT))],
    "train": ["train.py", "--model", "model", "--data", "notes.txt", "--out", "trained", "--steps", "5",
              "--warmup", "2", "--batch-size", "2", "--context", "16", "--eval-every", "1", "--sample-every", "5",
              "--quiet"],
    "from_scratch": ["train.py", "--from-scratch", "--data", "notes.txt", "--out", "trained", "--vocab-size", "270",
                     "--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--context", "16", "--batch-size", "2",
                     "--steps", "3", "--eval-every", "1", "--sample-every", "3", "--quiet"],
    "perplexity": ["evaluate.py", "perplexity", "notes.txt", "--model", "model", "--context", "16", "--stride", "5",
                   "--json", "--quiet"],
    "lambada": ["evaluate.py", "lambada", "lambada.jsonl", "--model", "model",
                "--json", "--quiet"],
    "instruction": ["train.py", "--model", "model", "--data", "pairs.jsonl", "--out", "trained", "--steps", "3",
                    "--batch-size", "2", "--context", "16", "--eval-every", "1", "--sample-every", "3", "--quiet"],
    "lora": ["train.py", "--model", "model", "--data", "notes.txt", "--out", "trained", "--steps", "3", "--batch-size",
             "2", "--context", "16", "--lr", "1e-2", "--eval-every", "1", "--sample-every", "3", "--quiet",
             "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "c_attn,c_proj"],
    "dpo": ["train.py", "--model", "model", "--data", "prefs.jsonl", "--out", "trained", "--steps", "3", "--batch-size",
            "2", "--lr", "1e-2", "--eval-every", "1", "--sample-every", "3", "--quiet"],
    "repetition": ["gpt2_numpy.py", "--model", "model", "--greedy", "--repetition-penalty", "1.1", "--n-tokens", "12",
                   "--quiet", PROMPT],
    "ngrams": ["gpt2_numpy.py", "--model", "model", "--greedy", "--no-repeat-ngram-size", "2", "--n-tokens", "12",
               "--quiet", PROMPT],
    "beams": ["gpt2_numpy.py", "--model", "model", "--num-beams", "3", "--n-tokens", "10", "--quiet", PROMPT],
    "circuits": ["circuits.py", "logit-diff", *IOI[:2], *IOI[4:], "--model", "model"],
    "patch": ["circuits.py", "patch", *IOI, "--site", "head", "--model", "model"],
    "dla": ["circuits.py", "dla", *IOI[:2], *IOI[4:], "--model", "model"],
    "attribution": ["circuits.py", "attribution", *IOI, "--site", "head", "--model", "model"],
    "classify": ["evaluate.py", "classify", "labelled.jsonl", "--model", "classifier", "--json", "--quiet"],
    "q8_0": ["-c", Q8_0],
    "sae": ["-c", notebook.SAE, "model", "notes.txt"],  # the notebook's program cells, the same lines
    "steer": ["steer.py", "add", PROMPT, "--add", "Love and peace", "--sub", "Hate", "--layer", "1", "--coeff", "500",
              "--model", "model", "--greedy", "--n-tokens", "8", "--quiet"],
    "topk": ["-c", notebook.TOPK, "model", "notes.txt"],
    "sae_jumprelu": ["-c", notebook.SAE_JUMPRELU, "model", "notes.txt"],
    "tuned_lens": ["lens.py", "train", "--model", "model", "--data", "notes.txt", "--out", "trained", "--steps", "3",
                   "--batch-size", "2", "--context", "16", "--json", "--quiet"],
    "probe": ["lens.py", "probe", "--model", "model", "--data", os.path.join("data", "speakers.jsonl"), "--site",
              "blocks.1.hook_resid_pre", "--position", "mean", "--method", "logistic", "--out", "trained", "--json",
              "--quiet"],
    "data_parallel": ["-c", notebook.DATA_PARALLEL, "model", "notes.txt", "trained"],  # two ranks as two threads
    "graph": ["-c", GRAPH.replace("TEXT", repr(PROMPT))],
}
# Bodies a student might write by mistake: each runs, but the program's output changes.
WRONG = {
    "gelu": "return x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x ** 3)))",  # the 0.5 forgotten
    "merge_once": "return None",  # never merges: every byte stays a token
    "layer_norm": "return (x - x.mean(axis=-1, keepdims=True)) * g + b",  # not divided by the deviation
    "layer_norm_backward": "return dy * g, (dy * x).sum(axis=(0, 1)), dy.sum(axis=(0, 1))",  # x̂'s dependence on x forgotten
    "adamw_update": "m[...] = beta1 * m + (1 - beta1) * grad\nv[...] = beta2 * v + (1 - beta2) * grad * grad\n"
                    "p -= lr * m / (np.sqrt(v) + eps)",  # no bias correction, no decay
    "learn_merge": "counts = pair_counts(pieces)\nif not counts:\n    return None, pieces\n"
                   "best = min(counts, key=counts.get)\nreturn best, [merge_pair(ids, best, new_id) for ids in pieces]",
    "init_tensor": "if name.endswith('/b'):\n    return np.zeros(shape, np.float32)\nif name.endswith('/g'):\n"
                   "    return np.ones(shape, np.float32)\nreturn rng.normal(0.0, STD, shape).astype(np.float32)",
    "rolling_windows": "ids = list(ids)\n"
                       "return [([prefix_id], ids[s:s + context]) for s in range(0, len(ids), context)]",
    # each window from scratch after <|endoftext|>: no context carried over
    "continuation_ids": "return [end_of_text(encoder)] + encoder.encode(context), encoder.encode(continuation)",
    "cross_entropy": "return next_token_loss(logits, targets), log_softmax(logits)",  # the mask forgotten: -1 is V - 1
    "lora_update": "return (x @ A) @ B",  # the scale alpha / R forgotten (the program's alpha is 2 R)
    "lora_linear_backward": "A, B, s = lora['A'], lora['B'], lora['scale']\n"
                            "x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])\n"
                            "dh = (dy2 @ B.T) * s\n"
                            "return (dy2 @ w.T).reshape(x.shape), {'A': x2.T @ dh, 'B': ((x2 @ A) * s).T @ dy2}",
    # dx without the adapter's share: the layers below learn from the frozen weights' gradient alone
    "penalize_repeats": "out = logits.copy()\nfor b, row in enumerate(ids):\n    for t in row:\n"
                        "        out[b, t] = out[b, t] / penalty if out[b, t] > 0 else out[b, t] * penalty\nreturn out",
    # once for every time a token came, not once a token
    "ban_repeated_ngrams": "banned = np.zeros(logits.shape, dtype=bool)\n"
                           "banned[np.arange(len(ids))[:, None], ids] = True\n"
                           "return np.where(banned, -np.inf, logits).astype(np.float32)",  # every seen token: n = 1
    "beam_step": "totals = logprobs.ravel()\nbest = np.argsort(-totals, kind='stable')[:n]\n"
                 "return totals[best], best // logprobs.shape[1], best % logprobs.shape[1]",  # the beams' own scores
    # forgotten: each step's likeliest tokens, whatever the path before them
    "logit_difference": "rows = np.arange(len(logits))\n"
                        "return float((logits[rows, :, answer] - logits[rows, :, wrong]).mean())",
    # every position's difference, not the last one's
    "patch_hook": "def hook(act, name):\n    return clean.copy()\n\nreturn hook",  # the whole activation, not the cell
    "dla_component": "return ((component / scale) * direction).sum(-1)",  # not centred: ln_f subtracts the mean first
    "pooled_positions": "return np.full(len(ids), ids.shape[1] - 1)",  # the last position, a pad or not (rasbt #990)
    "quantize_block": "d = np.max(np.abs(x)) / np.float32(127)\ninverse = np.float32(1) / d if d else np.float32(0)\n"
                      "return np.float16(d), (x * inverse).astype(np.int8)",  # truncated toward zero, not rounded
    "encode_pre": "return x @ sae['W_enc'] + sae['b_enc']",  # b_dec not taken away first
    "act_add": "x = x.copy()\nn = min(len(vector), x.shape[1])\nx[:, -n:] += vector[-n:]\nreturn x",
    # at the back, not the front: every cached step is steered too
    "topk_relu": "top = np.argpartition(np.abs(h), -k, axis=-1)[..., -k:]\nf = np.zeros_like(h)\n"
                 "np.put_along_axis(f, top, np.maximum(np.take_along_axis(h, top, -1), 0.0), -1)\nreturn f",
    # the k largest in size, not in value: a strongly negative latent takes a place, and fires as 0
    "mse_loss": "return float(((x_hat - x) ** 2).mean())",  # the mean over the width too: d_in times too small
    "activation_grads": "ids = checked_ids(ids, params)\n"
                        "kept, top = training_forward(ids, params, hparams, 0.1, np.random.default_rng(0))\n"
                        "model_backward(ids, kept, top, params, hparams, dlogits @ params['wte'], p_drop=0.1, "
                        "frozen=True, hook=hook)",  # training's call copied: dropout on
    "batch": "starts = rng.integers(0, len(ids) - context, batch_size)\n"
             "x = np.stack([ids[s:s + context] for s in starts])\nreturn x, x.copy()",  # targets not shifted
    "embed": "return hook('wte', wte[ids])",  # the positions forgotten
    "train_step": "metrics, grads = gradients(params, hparams, data, step, recipe, buffers, adapters is not None)\n"
                  "scale = clip_scale(grad_norm(grads), recipe['grad_clip'])\n"
                  "adamw_step_fast(params if adapters is None else adapters, grads, state, recipe['lr'], "
                  "beta2=recipe['beta2'], weight_decay=recipe['weight_decay'], grad_scale=scale)\n"
                  "return {'lr': recipe['lr'], **metrics}",  # the schedule forgotten
    "tuned_lens_logits": "return matmul(layer_norm(linear(h, translator['weight'].T, translator['bias']), **ln_f, "
                         "eps=eps), wte.T)",  # the translator's output alone: h itself not added back
    "logistic_gradient": "r = -C * s * sigmoid(-s * (X @ w + b))\nreturn w + X.T @ r, float(r.sum()) + b",
    # the intercept penalised too
    "adjacency_row": "return (grad[positions - 1] * vectors).sum(-1)",  # the gradient one position early
    "gelu_backward": "t = np.tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x ** 3))\n"
                     "return dy * 0.5 * (1.0 + t)",  # the product rule's second term forgotten
}


def project_copy(folder, numbers, bodies=None):
    """A handout, with a model folder (the tiny checkpoint and the vocabulary) and a text to train on."""
    handout.write_handout(folder, numbers, bodies=bodies)
    model = os.path.join(folder, "model")
    os.makedirs(model)
    for source in (os.path.join(ROOT, "tests", "data", "tiny"), os.path.join(ROOT, "data", "gpt2-vocab")):
        for f in os.listdir(source):
            if not f.endswith(".md") and f != "LICENSE":
                shutil.copy(os.path.join(source, f), model)
    with open(os.path.join(folder, "notes.txt"), "w", encoding="utf-8") as f:
        f.write(SHAKESPEARE)
    with open(os.path.join(folder, "lambada.jsonl"), "w", encoding="utf-8") as f:
        f.write("".join(json.dumps({"text": line}) + "\n" for line in LAMBADA))
    words = list(dict.fromkeys(re.findall(r"\b[a-z]{4,}\b", SHAKESPEARE)))[:16]
    with open(os.path.join(folder, "pairs.jsonl"), "w", encoding="utf-8") as f:  # instruction data: the loss is masked
        f.write("".join(f'{{"prompt": "Say {w} backwards:", "response": " {w[::-1]}"}}\n' for w in words))
    classifier = shutil.copytree(model, os.path.join(folder, "classifier"))  # the model with a head of two labels
    score = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    for name, content in classifier_files.head_files(score, ["ham", "spam"], 50256).items():
        with open(os.path.join(classifier, name), "wb") as f:
            f.write(content)
    with open(os.path.join(folder, "labelled.jsonl"), "w", encoding="utf-8") as f:  # lengths that differ: padding
        f.write("".join(json.dumps({"text": " ".join(words[:n]), "label": ["ham", "spam"][n % 2]}) + "\n"
                        for n in (2, 9, 5, 12)))
    with open(os.path.join(folder, "prefs.jsonl"), "w", encoding="utf-8") as f:  # preference pairs: DPO
        f.write("".join(json.dumps({"prompt": f"Say {w}:", "chosen": f" {w}.", "rejected": f" {w[::-1]}."}) + "\n"
                        for w in words))
    return folder


# Runs a program (a file and its arguments, or -c and a script) as python would, and writes to a file
# the project's functions it called, [(file, function)], in any thread.
TRACER = """import json, os, runpy, sys, threading
out, program, *args = sys.argv[1:]
root, seen = os.getcwd() + os.sep, set()
def profile(frame, event, arg):
    if event == "call":
        seen.add(frame.f_code)
sys.argv = [program, *args[program == "-c":]]  # as python -c CODE ARGS sets it: ["-c", *ARGS]
sys.path.insert(0, root if program == "-c" else os.path.dirname(os.path.abspath(program)))
threading.setprofile(profile)
sys.setprofile(profile)
try:
    if program == "-c":
        exec(compile(args[0], "<string>", "exec"), {"__name__": "__main__"})
    else:
        runpy.run_path(os.path.abspath(program), run_name="__main__")
finally:
    sys.setprofile(None)
    threading.setprofile(None)
    with open(out, "w") as f:
        json.dump(sorted({(os.path.relpath(c.co_filename, root), c.co_name) for c in seen
                          if c.co_filename.startswith(root)}), f)
"""


def run_program(folder, where, trace=None):
    """-> (exit code, stdout, stderr); with trace, a file for the functions it called (TRACER)."""
    shutil.rmtree(os.path.join(folder, "trained"), ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = ["-c", TRACER, trace, *PROGRAMS[where]] if trace else PROGRAMS[where]
    r = subprocess.run([sys.executable, *command], cwd=folder, capture_output=True, text=True, env=env, timeout=300)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture(scope="module")
def whole_runs(tmp_path_factory):
    """Every program on the whole project (a copy with no exercise blanked), traced: {where: ((exit code,
    stdout, stderr), {(file, function) it called})}."""
    folder = project_copy(str(tmp_path_factory.mktemp("p") / "whole"), [])
    runs = {}
    for where in PROGRAMS:  # one at a time: they share the folder (and its trained/)
        trace = os.path.join(os.path.dirname(folder), f"{where}.json")
        out = run_program(folder, where, trace)
        assert out[0] == 0 and out[1], (where, out[2])
        with open(trace, encoding="utf-8") as f:
            runs[where] = out, {tuple(call) for call in json.load(f)}
    return runs


@pytest.fixture(scope="module")
def originals(whole_runs):
    """Every program's output on the whole project."""
    return {where: out for where, (out, _) in whole_runs.items()}


def exercises_called(called):
    """The exercises that a program's calls run in a handout: a fast twin called runs its plain forms there."""
    called = called | {(file, plain) for (file, twin), (plains, _) in handout.TWINS.items() if (file, twin) in called
                       for plain in plains}
    return tuple(n for n in handout.EXERCISES if any(f in called for f in handout.functions(n)))


def test_the_handout_says_which_exercises_each_program_runs(whole_runs):
    """handout.NEEDS, which python handout.py prints, is what each program really calls: training on
    documents runs the masked loss (24) too, through cross_entropy_fast; every training run samples."""
    found = {where: exercises_called(called) for where, (_, called) in whole_runs.items()}
    assert found == handout.NEEDS, f"handout.NEEDS should be, from what each program calls:\n{found}"
    assert all(exercise[3] in handout.NEEDS and n in handout.NEEDS[exercise[3]]
               for n, exercise in handout.EXERCISES.items())


def test_every_programs_text_has_a_word_bpe_must_merge():
    """The table is computed from real text: each text a program reads has a word that is not itself a
    token, so its encoding runs merge (a prompt of whole words would hide exercise 1)."""
    import bpe
    encoder = bpe.get_encoder(os.path.join(ROOT, "data", "gpt2-vocab"))
    texts = [PROMPT, SHAKESPEARE, HEADS_TEXT, ABLATE_TEXT, IOI[1], IOI[3], " ".join(LAMBADA)]  # each a program reads
    for text in texts:
        pieces = bpe.PRETOKENIZE.findall(text)
        assert any(bpe.to_printable(p.encode("utf-8")) not in encoder.encoder for p in pieces), text


def test_with_only_the_bpe_merges_left_evaluate_circuits_and_look_inside_stop_at_them(tmp_path):
    """Issue 37: with exercise 1 alone to do, evaluate.py perplexity and lambada, circuits.py and a look_inside
    script stop at it on ordinary text, as python handout.py says (the table itself is the tracer's, above)."""
    folder = project_copy(str(tmp_path / "blank"), [1])
    readers = ["perplexity", "lambada", "circuits", "heads"]  # those the table left 1 out of, one of each kind
    assert all(1 in handout.NEEDS[w] for w in readers)
    for where in readers:
        code, _, stderr = run_program(folder, where)
        assert code != 0 and "exercise 1 (BPE merges): write merge" in stderr, (where, stderr[-1000:])
    assert handout.NEEDS["params"] == (9, 10, 14, 15)  # the one program that reads no text


def body_of(file, function):
    """A function's body as written in the project, docstring left out, dedented."""
    with open(os.path.join(ROOT, file), encoding="utf-8") as f:
        return body_of_source(f.read(), function)


def body_of_source(source, function):
    node = handout.function_node(ast.parse(source), function)
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    lines = source.splitlines()[body[0].lineno - 1:node.end_lineno]
    return "\n".join(line[body[0].col_offset:] for line in lines)


# the threshold's gradient with its sign lost: the estimator pushes θ the wrong way
WRONG["jumprelu_backward"] = body_of("sae.py", "jumprelu_backward").replace("-ste.sum(0)", "ste.sum(0)")
# the chunk that comes in written over the rank's own, not added: each rank's gradient is half the sum
WRONG["ring_allreduce"] = body_of("data_parallel.py", "ring_allreduce").replace("part += received", "part[...] = received")
# the warm-up a step late: the first step's rate 0 (issue 51: with no warm-up, three steps printed the right lines)
WRONG["learning_rate"] = body_of("optimizer.py", "learning_rate").replace("(step + 1) / warmup", "step / warmup")
# the weights without σ(-β δ): every pair pulled alike, however well the model already ranks it
WRONG["dpo_loss"] = body_of("dpo.py", "dpo_loss").replace("pull = beta * sigmoid(-beta * delta) / P",
                                                          "pull = np.full(P, beta / P)")


def test_every_program_is_named_and_every_twin_and_its_plain_forms_exist():
    assert set(PROGRAMS) == set(handout.WHERE) == set(handout.NEEDS) == {e[3] for e in handout.EXERCISES.values()}
    exercise_files = {function: file for n in handout.EXERCISES for file, function in handout.functions(n)}
    for (file, twin), (plains, _) in handout.TWINS.items():
        body_of(file, twin)
        for plain in plains:
            body_of(exercise_files.get(plain, file), plain)  # gelu_backward's plain form, gelu, is gpt2_numpy's


def module_names(tree):
    """The names a module binds at its top level (its imports, defs, classes and assignments, in an if or a try too)."""
    names, statements = set(), list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            statements += [n for field in ("body", "orelse", "finalbody", "handlers") for n in getattr(node, field, [])]
            statements += [n for h in getattr(node, "handlers", []) for n in h.body]
    return names


def test_every_body_twins_writes_names_only_what_its_file_defines():
    """Issue 51: in a handout with exercise 5 (gelu) but not 18, gelu_backward's body called gelu, which backward.py
    never imports: every training run stopped with a NameError. Each body TWINS writes may use its arguments, its
    own names, what its file binds, and Python's builtins."""
    import builtins
    for (file, twin), (_, body) in handout.TWINS.items():
        with open(os.path.join(ROOT, file), encoding="utf-8") as f:
            tree = ast.parse(handout.replace_body(f.read(), twin, body))
        node = handout.function_node(tree, twin)
        own = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        own |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        own |= {(a.asname or a.name).split(".")[0] for n in ast.walk(node)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        unknown = used - own - module_names(tree) - set(dir(builtins))
        assert not unknown, f"{file}: {twin}'s handout body names {sorted(unknown)}, which {file} does not define"


@pytest.fixture(scope="module")
def student_runs(tmp_path_factory):
    """Each exercise's program in two copies of the project: the exercise blanked, and written wrong (where
    WRONG has a body for it; its other functions right); a blank also runs generate, where that is another
    program. {number: {copy: run}} (written right: right_handouts)"""
    def two_copies(number):
        where, folder = handout.EXERCISES[number][3], tmp_path_factory.mktemp(f"student{number}")
        blank = project_copy(str(folder / "blank"), [number])
        runs = {"blank": run_program(blank, where)}
        if where != "generate":
            runs["blank generate"] = run_program(blank, "generate")
        wrong = {function: WRONG[function] for _, function in handout.functions(number) if function in WRONG}
        if wrong:
            runs["wrong"] = run_program(project_copy(str(folder / "wrong"), [number], {**RIGHT, **wrong}), where)
        return runs

    return on_every_core(two_copies, list(handout.EXERCISES))


@pytest.mark.parametrize("number", list(handout.EXERCISES))
def test_the_program_runs_the_students_code(student_runs, originals, number):
    """Blanked, the exercise stops its program (and the command line, if it is on its path); written wrong,
    it prints something else (written right, it prints what the whole project prints: the test below). So
    the program runs the student's functions, not a fast twin beside them."""
    where, runs = handout.EXERCISES[number][3], student_runs[number]
    code, _, stderr = runs["blank"]
    assert code != 0 and f"exercise {number} (" in stderr, stderr[-1000:]
    if where != "generate":
        code, _, stderr = runs["blank generate"]
        assert (code != 0) == (number in handout.needed_by("generate")), stderr[-1000:]
    if any(function in WRONG for _, function in handout.functions(number)):
        code, stdout, stderr = runs["wrong"]
        assert code == 0 and stdout != originals[where][1], stderr[-1000:]


# --- a handout of one exercise, written right ------------------------------------------------

RIGHT = {function: body_of(file, function) for n in handout.EXERCISES for file, function in handout.functions(n)}


def right_groups():
    """[(exact, [numbers])]: every exercise's handout of its own, written with the project's bodies, grouped into
    as few handouts as make the same edits: an exercise joins a group when the group's handout, with it added,
    is the group's edits and its own (TWINS rewrites nothing more, and nothing less: no function of one is a
    form another's handout rewrites). A fast twin (NAME_fast) made a call to the plain form computes what it
    did, so the group's programs print what the whole project prints (exact); an exercise whose handout
    rewrites another form (log_softmax, gelu_backward, topk_mask: the same function by another route, gelu's
    derivative within float32's rounding) has a handout of its own."""
    groups = []
    for n in handout.EXERCISES:
        own = {function for _, function in handout.functions(n)}
        edits = set(handout.handout_edits([n], RIGHT))
        if any(not function.endswith("_fast") for _, function, _ in edits if function not in own):
            groups.append((False, [n]))
            continue
        group = next((g for exact, g in groups if exact and set(handout.handout_edits(g + [n], RIGHT))
                      == set(handout.handout_edits(g, RIGHT)) | edits), None)
        if group is None:
            groups.append((True, [n]))
        else:
            group.append(n)
    return groups


def readmes_class():
    """The exercises of the README's example class, python handout.py class/ 1-6 9."""
    from interface.handout_cli import exercise_numbers
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        parts = re.search(r"python handout\.py class/ ([\d ,-]+)`", f.read()).group(1).split()
    return [n for part in parts for n in exercise_numbers(part)]


@pytest.fixture(scope="module")
def right_handouts(tmp_path_factory):
    """Each group of right_groups in a handout (written right), its exercises' tests run there and every program
    that calls one of its exercises; and the README's example class, written right, trained.
    -> ({tuple(numbers): (exact, folder, the tests' run, {where: run})}, the README's class's training run)"""
    def write_and_run(item):
        exact, numbers = item
        folder = project_copy(str(tmp_path_factory.mktemp("right") / "class"), numbers,
                              {function: RIGHT[function] for n in numbers for _, function in handout.functions(n)})
        if exact is None:  # the README's class
            return run_program(folder, "train")
        tests = run_tests(folder, list(dict.fromkeys(t for n in numbers for t in handout.tests(n))))
        return exact, folder, tests, {where: run_program(folder, where) for where in PROGRAMS
                                      if set(handout.NEEDS[where]) & set(numbers)}

    readme = (None, tuple(readmes_class()))
    runs = on_every_core(write_and_run, [(exact, tuple(numbers)) for exact, numbers in right_groups()] + [readme])
    return {numbers: run for (exact, numbers), run in runs.items() if exact is not None}, runs[readme]


def test_every_exercise_written_right_in_its_handout_passes_its_tests(right_handouts):
    """Every exercise as a student meets it, in a handout of its own (right_groups: grouped where the handouts add
    up): blanked (its fast twins rewritten to call it), then written with the project's own body: its tests pass.
    (Issue 45: rolling_windows_fast handed the test the student's lists, and the test called .tolist() on them.
    Issue 51: gelu_backward, rewritten to differentiate the student's gelu, called a gelu backward.py never
    imports: exercise 25's tests failed in a handout of 5 and 25.)"""
    groups = right_handouts[0]
    assert sorted(n for numbers in groups for n in numbers) == list(handout.EXERCISES)
    for numbers, (_, folder, tests, _) in groups.items():
        assert tests.returncode == 0, (numbers, tests.stdout[-2000:])
        assert re.search(r"^\d+ passed", tests.stdout.splitlines()[-1])
        functions = {function for n in numbers for _, function in handout.functions(n)}
        for (file, twin), (plains, body) in handout.TWINS.items():
            if set(plains) & functions and twin not in functions:  # a twin that is itself an exercise is the student's
                with open(os.path.join(folder, file), encoding="utf-8") as f:
                    assert body_of_source(f.read(), twin) == body  # the program runs the student's function


@pytest.mark.parametrize("number", list(handout.EXERCISES))
def test_a_handout_of_one_exercise_written_right_runs_every_program_it_feeds(right_handouts, originals, number):
    """Issue 51: every program python handout.py says an exercise is on the path of (NEEDS) runs in its handout,
    written right (a handout of 5 alone stopped every training run); its own program (handout.py --list's) prints
    what the whole project prints, and so does every program of a group whose fast twins call the plain forms."""
    numbers, (exact, _, _, runs) = next((k, v) for k, v in right_handouts[0].items() if number in k)
    own = handout.EXERCISES[number][3]
    fed = [where for where in PROGRAMS if number in handout.NEEDS[where]]
    assert own in fed
    for where in fed:
        code, stdout, stderr = runs[where]
        assert code == 0 and stdout, (where, stderr[-2000:])
        if exact or where == own:
            assert runs[where] == originals[where], where


def test_the_readmes_class_written_right_trains(right_handouts):
    """Issue 51: the README's example class, every function pasted back from the project, showed --progress done
    for all seven, and then train.py stopped with a NameError (gelu_backward's gelu)."""
    assert 5 in readmes_class() and 18 not in readmes_class()  # gelu handed out, its backward not
    code, stdout, stderr = right_handouts[1]
    assert code == 0 and stdout, stderr[-2000:]


def test_training_on_documents_stops_at_a_masked_loss_left_to_do(tmp_path):
    """A new user's case: with exercise 17 blank, train.py --data notes.txt (no instruction data) stops at it,
    as python handout.py says: every training step's loss is the student's cross_entropy."""
    code, _, stderr = run_program(project_copy(str(tmp_path / "blank"), [17]), "train")
    assert code != 0 and "exercise 17 (the masked loss): write cross_entropy;" in stderr, stderr[-1000:]
    assert "  and python train.py --data FILE needs 17" in handout.programs_waiting([17])


def test_a_building_block_written_wrong_fails_naming_the_mistake(tmp_path):
    """Tests that teach: a gelu without its 0.5 fails saying so, not only with ACTUAL = 2 x DESIRED; so do
    a softmax that overflows without the max shift and a layer_norm that never divides."""
    wrong = {"gelu": WRONG["gelu"], "softmax": "return np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)",
             "layer_norm": WRONG["layer_norm"]}
    folder = handout.write_handout(str(tmp_path / "class"), [5], bodies=wrong)
    r = run_tests(folder, handout.tests(5))
    failed = re.findall(r"^FAILED \S+::(test_\w+)", r.stdout, re.M)
    assert r.returncode == 1 and set(failed) == set(handout.tests(5)), r.stdout[-2000:]
    for message in ["gelu is twice the answer: the 0.5 of 0.5 x (1 + tanh(...)) is missing",
                    "softmax([1000, 1001, -inf]) gives nan: exp(1000) overflows to inf",
                    "not divided by √(var + eps)"]:
        assert message in r.stdout, (message, r.stdout[-3000:])


def test_a_merge_that_never_merges_shows_in_bpe_py(tmp_path):
    """The issue's own example: python bpe.py TEXT must show the student's merge_once at work."""
    whole = project_copy(str(tmp_path / "whole"), [])
    wrong = project_copy(str(tmp_path / "wrong"), [1], {"merge_once": WRONG["merge_once"],
                                                        "merge": body_of("bpe.py", "merge")})
    runs = [subprocess.run([sys.executable, "bpe.py", "tokenization is unbelievable"], cwd=f, capture_output=True,
                           text=True) for f in (whole, wrong)]
    assert runs[0].returncode == runs[1].returncode == 0 and runs[0].stdout != runs[1].stdout


ALL_WRONG_ANSWERS = os.environ.get("GPT2_WRONG_ANSWERS") == "1"


@pytest.mark.parametrize("functions", [["quantize_block", "layer_norm"], pytest.param(None, marks=pytest.mark.skipif(
    not ALL_WRONG_ANSWERS, reason="every exercise's wrong answers (~30 s): GPT2_WRONG_ANSWERS=1 python -m pytest "
                                  "tests/test_handout.py -k wrong_answer, or python tests/wrong_answers.py"))])
def test_each_plausible_wrong_answer_fails_its_exercises_tests(functions):
    """tests/wrong_answers.py: each wrong answer (np.round's halves to even for Q8_0, the unbiased variance, ...)
    fails its exercise's tests, and the right answer, put in the same way, passes. By default the issue's
    Q8_0 case and layer_norm's; the whole table with GPT2_WRONG_ANSWERS=1."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "wrong_answers.py"), *(functions or [])],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    import wrong_answers
    names = functions or list(wrong_answers.WRONG_ANSWERS)
    assert len(lines) == sum(1 + len(wrong_answers.WRONG_ANSWERS[f]) for f in names), r.stdout
    assert [line for line in lines if not re.match(r"\w+: (fails \(|right answer PASSES$)", line)] == []


def test_a_right_act_add_in_its_own_words_passes_exercise_48s_own_test(monkeypatch):
    """Issue 51: exercise 48's test demanded the message "fewer than the steering prompts' 3", which the exercise
    never states (it says: a UserError). A right act_add that says it in its own words passes."""
    import steer
    import test_steer
    from plumbing.errors import UserError

    def act_add(x, vector):
        if x.shape[1] == 1:
            return x
        if x.shape[1] < len(vector):
            raise UserError("too short a prompt to steer")
        return np.concatenate([x[:, :len(vector)] + vector, x[:, len(vector):]], axis=1)

    monkeypatch.setattr(steer, "act_add", act_add)
    test_steer.test_act_add_hook_adds_to_the_front_and_leaves_a_one_position_pass()


def test_the_docs_progress_example_pairs_each_exercise_with_its_own_tests():
    """Issue 51: docs/exercises.md's --progress example had exercise 9 failing exercise 1's test and 1 failing 5's."""
    with open(EXERCISES_DOC, encoding="utf-8") as f:
        example = f.read().split("python handout.py --progress alice/", 1)[1].split("\n\n", 2)[1]
    fails = re.findall(r"^    \S+: (\d+) fails (.+)$", example, re.M)
    assert len(fails) >= 2
    for number, tests in fails:
        assert set(tests.split(", ")) <= set(handout.tests(int(number))), (number, tests)


def test_in_a_handout_of_46_topk_mask_asks_the_students_topk_relu():
    """Issue 51: sae.topk_mask made TopK's choice in the same file, and np.where(topk_mask(h, k), np.maximum(h, 0.0),
    0.0) passed all of exercise 46's tests. In a handout of 46, topk_mask asks the student's topk_relu (the same
    mask: AuxK's -inf, k of 0 and of every latent too), so that answer asks itself, and never ends."""
    import inspect
    import sae
    space = dict(vars(sae))
    exec(handout.replace_body(inspect.getsource(sae.topk_mask), "topk_mask", handout.TWINS["sae.py", "topk_mask"][1]),
         space)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((6, 40)).astype(np.float32) * 100
    dead = np.where(rng.random(40) < 0.5, h, -np.inf).astype(np.float32)  # AuxK's: the living latents out
    for x, ks in ((h, (0, 1, 7, 40, 41)), (dead, (0, 1, int(np.isfinite(dead[0]).sum())))):
        for k in ks:
            np.testing.assert_array_equal(space["topk_mask"](x, k), sae.topk_mask(x, k))
    space["topk_relu"] = lambda h, k: np.where(space["topk_mask"](h, k), np.maximum(h, 0.0), 0.0)
    with pytest.raises(RecursionError):
        space["topk_relu"](h, 3)
