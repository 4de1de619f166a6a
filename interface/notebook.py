"""The notebook handout: exercises.ipynb in a handout's folder, the two calls its cells make, and
the teacher's view of a class.

    write_notebook(folder, numbers)   exercises.ipynb: for each exercise its text, its functions, a check, its program
    check(N)                          a cell: the student's functions into the program's files, then N's tests
    run_program(N, MODEL)             a cell: the program exercise N feeds, on the first cell's model
    progress(folder)                  each exercise: done, failing (which tests) or not started

The notebook and the files are one handout. A student cell, once written (its body no longer
`raise NotImplementedError(...)`), wins: check and run_program write its body into the function's
file, over what the file held. A cell still blank leaves the file as it is, so a student may write
in the files instead and still use the notebook's checks. The cell that counts is the one last run
in the kernel (IPython's `In`), else the one saved in exercises.ipynb (as --progress reads it).
"""
import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import handout
from plumbing.errors import UserError
from plumbing.folders import MODELS_DIR_ENV, whole_file
from plumbing.shapes import SIZES

PROMPT = "Alan Turing theorized that computers would one day become"
IOI = ["--clean", "When Mary and John went to the store, John gave a drink to",
       "--corrupted", "When Mary and John went to the store, Mary gave a drink to",
       "--answer", " Mary", "--wrong", " John"]
# Five steps, two of them warm-up: a warm-up written wrong (the first step's rate 0), or a decay, shows in the losses.
TRAIN = ["--model", "MODEL", "--out", "OUT", "--steps", "5", "--warmup", "2", "--batch-size", "2", "--context", "32",
         "--eval-every", "1", "--sample-every", "5", "--quiet"]
# The programs that are a few lines of Python rather than a command: python -c HEADS MODEL, ... (SCRIPTS).
HEADS = """import sys, numpy as np, look_inside
from interface import loading
encoder, hp, params = loading.load_model(sys.argv[1])
ids = encoder.encode("the leanness that afflicts us, the object of our misery; the leanness that afflicts us")
_, cache = look_inside.run_with_cache([ids], params, hp, names=lambda n: n.endswith("hook_pattern"))
pattern = np.stack([cache[f"blocks.{i}.attn.hook_pattern"][0] for i in range(hp["n_layer"])])
print("previous-token scores, a row a layer:", look_inside.previous_token_scores(pattern).astype(float).round(3))
print("induction scores, a row a layer:", look_inside.induction_scores(pattern, ids).astype(float).round(3))
"""
ABLATE = """import sys, look_inside
from interface import loading
encoder, hp, params = loading.load_model(sys.argv[1])
ids = [encoder.encode("What authority surfeits on would relieve us: if they would yield us but the superfluity")]
print("loss:", round(look_inside.loss(ids, params, hp), 4))
ablated = {"blocks.0.attn.hook_z": look_inside.zero_ablate_head(1)}
print("with layer 0's head 1 ablated:", round(look_inside.loss(ids, params, hp, ablated), 4))
"""
Q8_0 = """import os, sys, convert, gpt2_numpy as g
from interface import loading
os.makedirs(sys.argv[2])
convert.convert(loading.fetch_model(sys.argv[1]), os.path.join(sys.argv[2], "model.gguf"), "gguf", "q8_0")
encoder, hp, params = loading.load_model(os.path.join(sys.argv[2], "model.gguf"))
ids = encoder.encode("Alan Turing theorized that")
print("greedy, from the Q8_0 file:", [int(t[0]) for t in g.generate(ids, params, hp, n_tokens=8, top_k=1)])
"""
SAE = """import sys, sae
from interface import loading
encoder, hp, params = loading.load_model(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    rows = sae.windows(encoder.encode(f.read()), 16, encoder.eot)[:8]
x = sae.gather(rows, params, hp, "blocks.0.hook_resid_post").reshape(-1, hp["n_embd"])
s = sae.new_sae(x.shape[1], 32, seed=0, metadata={"hook_name": "blocks.0.hook_resid_post"})
state = sae.new_adam_state(s)
for step in range(3):
    losses = sae.train_step(x, s, state, 1e-2, sae.l1_coefficient(step, 1.0, 2))
    print(f"step {step + 1}:", {k: round(v, 4) for k, v in losses.items()})
print("the latents' sum:", round(float(sae.encode(x, s).sum()), 4))
"""
DATA_PARALLEL = """import os, sys
sys.path.insert(0, "tests")  # fake_comm: two ranks as two threads of this process; mpiexec -n 2 runs two processes
import data_parallel, train
from fake_comm import ranks
from interface import loading
model, text, out = sys.argv[-3:]
os.makedirs(out, exist_ok=True)
for zero in (0, 1):  # plain data parallelism (the gradients summed by the ring all-reduce), then ZeRO-1
    def rank(comm):
        recipe = train.recipe_with(steps=2, batch_size=2, context=16, eval_every=2, sample_every=2, save_every=2)
        run = train.set_up(os.path.join(out, str(zero)), recipe, [text], base=lambda: loading.fetch_model(model),
                           quiet=True)
        train.train(run, os.path.join(out, str(zero)), {}, quiet=True, parallel=data_parallel.parallel(comm, run, zero))
    print(f"two ranks, --zero {zero}:")
    ranks(2, rank)
"""
TOPK = """import sys, sae
from interface import loading
encoder, hp, params = loading.load_model(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    rows = sae.windows(encoder.encode(f.read()), 16, encoder.eot)[:4]
x = sae.gather(rows, params, hp, "blocks.0.hook_resid_post").reshape(-1, hp["n_embd"])
s = sae.new_sae(x.shape[1], 64, seed=0, metadata={"hook_name": "blocks.0.hook_resid_post"})
s["cfg"].update(architecture="topk", k=8)  # a TopK SAE, untrained: each token's 8 largest latents fire
f = sae.encode(x, s)
print("latents firing, the first 16 tokens:", (f > 0).sum(-1)[:16].tolist())
print("their sum over every token:", round(float(f.sum()), 4))
"""
SAE_JUMPRELU = """import sys, sae
from interface import loading
encoder, hp, params = loading.load_model(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    rows = sae.windows(encoder.encode(f.read()), 16, encoder.eot)[:8]
x = sae.gather(rows, params, hp, "blocks.0.hook_resid_post").reshape(-1, hp["n_embd"])
settings = {**sae.TRAINING_DEFAULTS["jumprelu"], "architecture": "jumprelu", "jumprelu_bandwidth": 1.0}
s = sae.new_training_sae(x.shape[1], 32, settings, metadata={"hook_name": "blocks.0.hook_resid_post"})
state = sae.new_training_state(s)
for step in range(3):
    losses = sae.training_step(x, s, state, 1e-2, settings, 0.1)
    print(f"step {step + 1}:", {k: round(v, 4) for k, v in losses.items()})
print("the first thresholds:", [round(float(t), 4) for t in s["threshold"][:6]])
"""
SCRIPTS = {"HEADS": HEADS, "ABLATE": ABLATE, "Q8_0": Q8_0, "SAE": SAE, "TOPK": TOPK, "SAE_JUMPRELU": SAE_JUMPRELU,
           "DATA_PARALLEL": DATA_PARALLEL}
# What a program cell runs for each of handout.WHERE's programs: python's arguments, in the handout's
# folder, MODEL the handout's model, OUT a new folder, TEXT the first lines of data/tinyshakespeare.txt,
# LAMBADA five of its lines as lambada's JSON lines, PAIRS instruction pairs made of its words. Each
# prints the same every run (greedy, or a fixed seed). A program not here is named for the student to
# run (it reads a file of their own: a classifier).
COMMANDS = {
    "heads": ["-c", "HEADS", "MODEL"],
    "ablate": ["-c", "ABLATE", "MODEL"],
    "q8_0": ["-c", "Q8_0", "MODEL", "OUT"],
    "sae": ["-c", "SAE", "MODEL", "TEXT"],
    "data_parallel": ["-c", "DATA_PARALLEL", "MODEL", "TEXT", "OUT"],
    "topk": ["-c", "TOPK", "MODEL", "TEXT"],
    "sae_jumprelu": ["-c", "SAE_JUMPRELU", "MODEL", "TEXT"],
    "steer": ["steer.py", "add", "I hate you because", "--add", "Love", "--sub", "Hate", "--layer", "1",
              "--coeff", "10", "--model", "MODEL", "--greedy", "--n-tokens", "20", "--quiet"],
    "lambada": ["evaluate.py", "lambada", "LAMBADA", "--model", "MODEL", "--quiet"],
    "instruction": ["train.py", "--data", "PAIRS", *TRAIN],
    "generate": ["gpt2_numpy.py", "--model", "MODEL", "--seed", "1", "--top-k", "20", "--top-p", "0.9",
                 "--n-tokens", "20", "--quiet", PROMPT],
    "params": ["gpt2_numpy.py", "--params", "MODEL"],
    "lens": ["gpt2_numpy.py", "--model", "MODEL", "--lens", PROMPT],
    "repetition": ["gpt2_numpy.py", "--model", "MODEL", "--greedy", "--repetition-penalty", "1.1", "--n-tokens", "20",
                   "--quiet", PROMPT],
    "ngrams": ["gpt2_numpy.py", "--model", "MODEL", "--greedy", "--no-repeat-ngram-size", "2", "--n-tokens", "20",
               "--quiet", PROMPT],
    "beams": ["gpt2_numpy.py", "--model", "MODEL", "--num-beams", "3", "--n-tokens", "12", "--quiet", PROMPT],
    "train": ["train.py", "--data", "TEXT", *TRAIN],
    "lora": ["train.py", "--data", "TEXT", *TRAIN, "--lora-rank", "4", "--lora-alpha", "8"],
    "dpo": ["train.py", "--data", os.path.join("data", "preferences.jsonl"), *TRAIN],
    "from_scratch": ["train.py", "--from-scratch", "--data", "TEXT", "--out", "OUT", "--vocab-size", "270",
                     "--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--context", "16", "--batch-size", "2",
                     "--steps", "3", "--eval-every", "1", "--sample-every", "3", "--quiet"],
    "perplexity": ["evaluate.py", "perplexity", "TEXT", "--model", "MODEL", "--context", "64", "--stride", "32",
                   "--quiet"],
    "circuits": ["circuits.py", "logit-diff", *IOI[:2], *IOI[4:], "--model", "MODEL"],
    "patch": ["circuits.py", "patch", *IOI, "--site", "head", "--model", "MODEL"],
    "dla": ["circuits.py", "dla", *IOI[:2], *IOI[4:], "--model", "MODEL"],
    "attribution": ["circuits.py", "attribution", *IOI, "--site", "head", "--model", "MODEL"],
    "tuned_lens": ["lens.py", "train", "--model", "MODEL", "--data", "TEXT", "--out", "OUT", "--steps", "3",
                   "--batch-size", "2", "--context", "16", "--json", "--quiet"],
    "probe": ["lens.py", "probe", "--model", "MODEL", "--data", os.path.join("data", "speakers.jsonl"), "--site",
              "blocks.1.hook_resid_pre", "--position", "mean", "--method", "logistic", "--out", "OUT", "--json",
              "--quiet"],
}
TEXT_CHARACTERS = 2000  # of Shakespeare, for TEXT: a few seconds of training or scoring


def read_record(folder):
    """handout.json of a handout's folder -> {"exercises": [...], "model": ..., ...}; else one line."""
    try:
        with open(os.path.join(folder, handout.RECORD), encoding="utf-8") as f:
            record = json.load(f)
        numbers = record["exercises"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"not a handout (no readable {handout.RECORD}: python handout.py {folder} 1 9 writes one)",
                        path=folder) from None
    unknown = [n for n in numbers if n not in handout.EXERCISES]
    if unknown:
        raise UserError(f"{handout.RECORD} names exercise {unknown[0]}, which this project has not", path=folder)
    return record


# --- the student's cells ---------------------------------------------------------------------

def cell_marker(number, function):
    """The first line of a student cell, which finds it again in the kernel's history."""
    return f"# exercise {number}: {function} ("


def saved_cells(folder):
    """{(number, function): source} of the student cells saved in the folder's exercises.ipynb: each
    found by its first line, or, that line gone, by its place among its exercise's student cells."""
    path = os.path.join(folder, handout.NOTEBOOK)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            cells = json.load(f)["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError("not a notebook that Jupyter saved (its JSON does not read)", path=path) from None
    by_exercise = {}
    for cell in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        numbers = [int(t.split("-")[1]) for t in tags if re.fullmatch(r"exercise-\d+", t)]
        if cell.get("cell_type") == "code" and "student" in tags and numbers and numbers[0] in handout.EXERCISES:
            source = cell.get("source", "")
            by_exercise.setdefault(numbers[0], []).append(source if isinstance(source, str) else "".join(source))
    found = {}
    for number, sources in by_exercise.items():
        names = [function for _, function in handout.functions(number)]
        for i, function in enumerate(names):
            marked = [s for s in sources if s.lstrip().startswith(cell_marker(number, function))]
            if marked or i < len(sources):
                found[(number, function)] = marked[-1] if marked else sources[i]
    return found


def history_cells(history, numbers):
    """{(number, function): source} of the student cells as last run in the kernel (IPython's In)."""
    found = {}
    for source in history or []:  # oldest first: a later run replaces an earlier one
        for number in numbers:
            for _, function in handout.functions(number):
                if isinstance(source, str) and source.lstrip().startswith(cell_marker(number, function)):
                    found[(number, function)] = source
    return found


def is_blank(node):
    """A def whose body (its docstring aside) is nothing, or raise NotImplementedError(...): not written."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    if not body:
        return True
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"


def body_text(source, node):
    """A def's body as written, its docstring left out, dedented (comments above its first line kept)."""
    documented = ast.get_docstring(node) is not None
    body = node.body[1:] if documented else node.body
    first = node.body[0].end_lineno if documented else body[0].lineno - 1
    column = body[0].col_offset
    lines = [line[column:] if not line[:column].strip() else line.lstrip()
             for line in source.splitlines()[first:node.end_lineno]]
    return "\n".join(lines).strip("\n")


class NotPython(UserError):
    """A student's cell, or the file it goes into, that Python cannot read."""


def bound_names(nodes):
    """The names these statements bind where they stand (not inside a def or class): assigned, defined, imported."""
    names, todo = set(), list(nodes)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        else:
            todo += ast.iter_child_nodes(node)
    return names


def free_names(node):
    """The names a def reads that it does not bind itself (its arguments, its assignments, its own defs)."""
    own = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)} | bound_names(node.body)
    own |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - own


def cell_body(source, number, function, file="its file", defined=frozenset()):
    """The body a student cell gives `function`, or None while it is blank; a cell that is not Python, that
    defines another name, or whose function reads a name the cell binds outside it that the file (whose
    top-level names are `defined`) lacks, is one line (a UserError)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise NotPython(f"exercise {number}: {function}'s cell is not Python: line {e.lineno}: {e.msg}") from None
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    node = next((n for n in defs if n.name == function), None)
    if node is None:
        named = f" (it defines {', '.join(n.name for n in defs)})" if defs else ""
        raise UserError(f"exercise {number}: {function}'s cell defines no function {function}{named}: "
                        f"keep the name, the program calls it by it")
    outside = sorted(free_names(node) & bound_names([n for n in tree.body if n is not node]) - set(defined))
    if outside and not is_blank(node):
        them = "it" if len(outside) == 1 else "them"
        raise UserError(f"exercise {number}: {function}'s cell has {', '.join(outside)} outside {function}, and only "
                        f"{function}'s body goes into {file}, which has no {' or '.join(outside)}: put {them} inside "
                        f"{function}")
    return None if is_blank(node) else body_text(source, node)


def apply_cells(folder, numbers, cells):
    """Write each written cell's body into its function's file in folder -> ({(number, function):
    "notebook", "files" or None (blank in both)}, {(number, function): a UserError (one line), for each cell
    that could not be written}): a cell that is not Python (NotPython), or defines another name, or
    leaves a helper outside its function, or a file that is not Python (NotPython)."""
    written, problems, sources, trees = {}, {}, {}, {}
    for number in numbers:
        for file, function in handout.functions(number):
            if file not in sources:
                with open(os.path.join(folder, file), encoding="utf-8") as f:
                    sources[file] = f.read()
            try:
                trees[file] = trees.get(file) or ast.parse(sources[file])
            except SyntaxError as e:
                problems[(number, function)] = NotPython(f"exercise {number}: {file} is not Python: line {e.lineno}: "
                                                         f"{e.msg}")
                written[(number, function)] = "files"
                continue
            try:
                body = (cell_body(cells[(number, function)], number, function, file, bound_names(trees[file].body))
                        if (number, function) in cells else None)
            except UserError as e:
                problems[(number, function)] = e
                written[(number, function)] = "notebook"
                continue
            if body is None:
                blank = is_blank(handout.function_node(trees[file], function))
                written[(number, function)] = None if blank else "files"
                continue
            sources[file], trees[file] = handout.replace_body(sources[file], function, body), None
            written[(number, function)] = "notebook"
    for file, source in sources.items():
        path = os.path.join(folder, file)
        with open(path, encoding="utf-8") as f:
            if f.read() == source:
                continue
        with whole_file(path, file) as tmp:  # never half a file
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(source)
    return written, problems


# --- the exercise's tests --------------------------------------------------------------------

def test_files(folder, tests):
    """The files under folder/tests that define these tests (collecting only them is faster)."""
    files = []
    for path in sorted(os.listdir(os.path.join(folder, "tests"))):
        if re.fullmatch(r"test_\w+\.py", path):
            with open(os.path.join(folder, "tests", path), encoding="utf-8") as f:
                defined = set(re.findall(r"^def (test_\w+)", f.read(), re.M))
            if defined & set(tests):
                files.append(os.path.join("tests", path))
    return files


def run_tests(folder, tests):
    """The student's command, python -m pytest -q -k NAME, in folder -> (the names that passed, {failed
    name: pytest's line}, the count of each, {failed name: {(file, function)} its traceback went through});
    a pytest that could not run is one line (UserError). A test function counts once, its parameters all
    passing, or failing with its first failure's line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the folder's modules, not another's
    env["COLUMNS"] = "1000"  # each failure's line whole, its message included
    command = [sys.executable, "-m", "pytest", "-q", "-rA", "--tb=short", "--color=no", "-p", "no:cacheprovider",
               *test_files(folder, tests), "-k", " or ".join(tests)]
    r = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env)
    lines = r.stdout.splitlines()
    if r.returncode == 5:  # none of them is in the folder's tests/
        return set(), {}, f"no test ran: the folder's tests/ has none of {', '.join(tests)}", {}
    if r.returncode not in (0, 1) and not any(line.startswith("ERROR ") for line in lines):
        said = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
        raise UserError(f"pytest did not run in {folder} ({said}): install requirements.txt in this python "
                        f"({sys.executable})")
    sections = re.split(r"^_{3,} (\S+) _{3,}$", r.stdout, flags=re.M)  # each failure's traceback
    said, ran = {}, {}
    for name, text in zip(sections[1::2], sections[2::2]):
        said[name.split("[")[0]] = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
        ran.setdefault(name.split("[")[0], set()).update(re.findall(r"^(\S+\.py):\d+: in (\w+)$", text, re.M))
    passed, failed = set(), {}
    for line in lines:
        kind, _, rest = line.partition(" ")
        name = re.match(r"\S*::(\w+)", rest)
        if kind == "PASSED" and name:
            passed.add(name.group(1))
        elif kind in ("FAILED", "ERROR"):
            test = name.group(1) if name else rest.split(" - ")[0]
            if line.rstrip().endswith(":"):  # a message that starts on its next line (NumPy's): its first lines
                line = " ".join([line.rstrip(), *[e for e in said.get(test, [])[1:] if e][:2]])
            failed.setdefault(test, line)
    passed -= set(failed)
    count = ", ".join(f"{len(them)} {kind}" for kind, them in (("failed", failed), ("passed", passed)) if them)
    skipped = next((re.sub(r"(, \d+ deselected)? in [\d.]+s.*", "", line.strip("= ")) for line in reversed(lines)
                    if re.search(r"\d+ (skipped|xfailed)", line)), "no test ran")
    return passed, failed, count or skipped, {test: ran.get(test, set()) for test in failed}


def blanks(written, number):
    return [function for _, function in handout.functions(number) if written[(number, function)] is None]


def failing_elsewhere(number, numbers, ran, own_failing):
    """[(M, [functions])]: the other exercises of the handout whose functions the failing tests of exercise
    `number` went through (ran: their tracebacks' (file, function)), each function among them that fails its
    own test (own_failing(tests) -> the failing ones)."""
    went = set().union(*ran.values()) if ran else set()
    through = {m: [(f, t) for file, f, t in handout.EXERCISES[m][1] if (file, f) in went]
               for m in numbers if m != number}
    through = {m: pairs for m, pairs in through.items() if pairs}
    failing = own_failing([t for pairs in through.values() for _, t in pairs]) if through else set()
    found = [(m, list(dict.fromkeys(f for f, t in pairs if t in failing))) for m, pairs in through.items()]
    return [(m, functions) for m, functions in found if functions]


def elsewhere_lines(found):
    """A line for each other exercise that failing tests went through, which fails its own tests."""
    return [f"these tests also run exercise {m}'s {', '.join(functions)}, which fail{'s' * (len(functions) == 1)} "
            f"{'its' if len(functions) == 1 else 'their'} own tests: check({m})" for m, functions in found]


def check_lines(folder, number, history=None):
    """What a check cell prints: each problem in one line; "not written yet"; or pytest's verdict (and the
    exercises these tests also run that fail their own)."""
    numbers = read_record(folder)["exercises"]
    if number not in numbers:
        return [f"exercise {number} is not in this handout (it holds {handout.spans(numbers)})"]
    title, file = handout.EXERCISES[number][0], handout.EXERCISES[number][1][0][0]
    written, problems = apply_cells(folder, [number], {**saved_cells(folder), **history_cells(history, [number])})
    if problems:
        return list(dict.fromkeys(map(str, problems.values())))
    todo = blanks(written, number)
    if len(todo) == len(handout.functions(number)):
        return [f"exercise {number} ({title}): not written yet: write {', '.join(todo)} in the cells above "
                f"(or in {file})"]
    _, failed, count, ran = run_tests(folder, handout.tests(number))
    elsewhere = failing_elsewhere(number, numbers, ran, lambda tests: set(run_tests(folder, tests)[1]))
    return ([f"exercise {number}: {function} not written yet" for function in todo]
            + list(failed.values()) + [count] + elsewhere_lines(elsewhere))


def run_program_lines(folder, number, history=None, model=None):
    """What a program cell prints: which exercise it still needs, or the program's output. model: the first
    cell's MODEL (None: the handout's)."""
    record = read_record(folder)
    numbers, where = record["exercises"], handout.EXERCISES[number][3] if number in handout.EXERCISES else None
    if number not in numbers:
        return [f"exercise {number} is not in this handout (it holds {handout.spans(numbers)})"]
    written, problems = apply_cells(folder, numbers, {**saved_cells(folder), **history_cells(history, numbers)})
    if problems:
        return list(dict.fromkeys(map(str, problems.values())))
    todo = [n for n in handout.needed_by(where) if n in numbers and blanks(written, n)]
    if todo:
        return [f"{handout.WHERE[where]} needs exercise{'s' * (len(todo) > 1)} {handout.spans(todo)} written first: "
                + "; ".join(f"{n} ({', '.join(blanks(written, n))} not yet)" for n in todo)]
    if where not in COMMANDS:
        return [f"exercise {number} runs in {handout.WHERE[where]}: run it there yourself"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if os.path.isdir(record.get("models_dir") or "") and MODELS_DIR_ENV not in env:
        env[MODELS_DIR_ENV] = record["models_dir"]  # the project's models, where the handout's message says they stay
    return program_lines(folder, where, program_model(folder, record, model), env)


def program_model(folder, record, model=None):
    """The model a program cell runs: `model` (the first cell's MODEL), else the handout's; a size or hf:owner/name
    as it is, a folder or file from the handout's folder (shipped in it or beside it, so that the two move
    together). The handout's own, not there (the class moved alone): where --model named it on the teacher's
    machine. Neither: one line, that says how to point at another."""
    model = model or record.get("model") or "124M"
    if model in SIZES or model.startswith("hf:") or os.path.exists(os.path.join(folder, model)):
        return model
    if model == record.get("model") and os.path.exists(record.get("model_path") or ""):
        return record["model_path"]
    raise UserError(f"no model {model} here ({os.path.abspath(os.path.join(folder, model))}): put it there, or set "
                    f"MODEL in the first cell to a size ({', '.join(SIZES)}), a model folder or hf:owner/name")


def program_lines(folder, where, model, env=None):
    """The program `where` (COMMANDS) run in folder on model: its command line, what it printed, and how it
    stopped if it did."""
    with tempfile.TemporaryDirectory() as tmp:
        files = program_files(folder, tmp)
        argv = [{"MODEL": model, **SCRIPTS, **files}.get(a, a) for a in COMMANDS[where]]
        r = subprocess.run([sys.executable, *argv], cwd=folder, capture_output=True, text=True, env=env)
    said = r.stdout.rstrip("\n"), r.stderr.rstrip("\n")
    for name, path in files.items():  # the temporary files by their names: the same every run
        said = tuple(text.replace(path, name) for text in said)
    lines = [f"$ python {' '.join(shlex.quote(model if a == 'MODEL' else a) for a in COMMANDS[where])}",
             *said[0].splitlines()]
    if r.returncode:
        lines += [f"the program stopped (exit status {r.returncode}):", *said[1].splitlines()[-12:]]
    return lines


def program_files(folder, tmp):
    """{TEXT, LAMBADA, PAIRS, OUT: a path in tmp}: the files a program cell reads, made from the first
    lines of the handout's data/tinyshakespeare.txt, and a folder for what it writes."""
    with open(os.path.join(folder, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read(TEXT_CHARACTERS)
    lines = [line for line in text.splitlines() if len(line.split()) >= 6][:5]
    words = list(dict.fromkeys(re.findall(r"\b[a-z]{4,}\b", text)))[:16]
    files = {"TEXT": text, "LAMBADA": "".join(json.dumps({"text": line}) + "\n" for line in lines),
             "PAIRS": "".join(json.dumps({"prompt": f"Say {w} backwards:", "response": f" {w[::-1]}"}) + "\n"
                              for w in words)}
    paths = {"OUT": os.path.join(tmp, "out")}
    for name, content in files.items():
        paths[name] = os.path.join(tmp, name.lower() + (".txt" if name == "TEXT" else ".jsonl"))
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write(content)
    return paths


def kernel_history():
    """The cells run so far in this kernel, oldest first (IPython's In), or None outside IPython."""
    history = getattr(sys.modules.get("__main__"), "In", None)  # the kernel's namespace: no import of it
    return history if isinstance(history, list) else None


def check(number):
    """A check cell: write exercise `number`'s cells into the program's files, run its tests, print
    the verdict. It never raises for what the student wrote, so Run all goes on."""
    try:
        print("\n".join(check_lines(os.getcwd(), number, kernel_history())))
    except UserError as e:
        print(e)


def run_program(number, model=None):
    """A program cell: the program exercise `number` feeds, on model (the first cell's MODEL; None: the
    handout's), running every function the notebook's cells hold; or the exercise it still needs."""
    try:
        print("\n".join(run_program_lines(os.getcwd(), number, kernel_history(), model)))
    except UserError as e:
        print(e)


# --- writing the notebook --------------------------------------------------------------------

def exercise_texts(docs):
    """{number: markdown} of each numbered item "N. **title** ..." of docs/exercises.md."""
    with open(docs, encoding="utf-8") as f:
        items = re.split(r"\n(?=\d+\. \*\*)", f.read())
    texts = {}
    for item in items:
        item = item.split("\n#", 1)[0].strip()  # an item ends at the next heading, if one comes first
        if re.match(r"\d+\. \*\*", item):
            number, text = item.split(". ", 1)
            texts[int(number)] = "\n".join(line.strip() for line in text.splitlines())
    return texts


def student_source(folder, number, file, function, parsed):
    """A student cell: its marker line, the file's names (its constants, for a default argument; NumPy,
    to try the function here), then the blanked def as the handout's file holds it. parsed: {file:
    (source, tree)}, each file read once for the whole notebook."""
    if file not in parsed:
        with open(os.path.join(folder, file), encoding="utf-8") as f:
            source = f.read()
        parsed[file] = source, ast.parse(source)
    source, tree = parsed[file]
    node = handout.function_node(tree, function)
    lines = source.splitlines()[node.lineno - 1:node.end_lineno]
    definition = "\n".join(line[node.col_offset:] if not line[:node.col_offset].strip() else line for line in lines)
    module = file[:-3].replace("/", ".")
    return (f"{cell_marker(number, function)}{file}): write its body; check({number}) below puts it into "
            f"{file} and runs the tests\nfrom {module} import *  # the file's names\n\n{definition}\n")


def cell(kind, source, tags, key):
    lines = source.splitlines(keepends=True)
    made = {"cell_type": kind, "id": key, "metadata": {"tags": tags}, "source": lines}
    return {**made, "execution_count": None, "outputs": []} if kind == "code" else made


INTRO = """# Exercises {numbers}

Each exercise below has its text, a cell for each function to write, a check and the program it feeds.
Run this notebook from the handout's folder (Jupyter, JupyterLab or VS Code: open `{notebook}` there;
Colab: zip the folder, upload and unzip it, and the first cell below moves into it).

- **Write** each function's body in its cell, and run the cell. Only the body goes into the program:
  a helper you need, define it inside the function.
- **`check(N)`** writes the functions of exercise N into the program's file (the notebook's cell wins over
  what the file held), runs the exercise's tests (`python -m pytest -q -k NAME`) and prints their verdict:
  `N passed`, or a `FAILED tests/FILE::TEST - message` line for each failing test.
- **`run_program(N, MODEL)`** runs the program the exercise feeds on `MODEL` (the first cell's: `{model}`), so
  that you see your code at work; the same code prints the same every run. Another model: set `MODEL` in
  the first cell to a size (124M), a model folder (its path) or `hf:owner/name`.

A cell still blank (its body `raise NotImplementedError(...)`) leaves the file as it is: you may write a
function in its file instead (`{files}`), and the checks test that.
"""

SETUP = """import os
if not os.path.exists("{record}") and os.path.exists(os.path.join("{name}", "{record}")):
    os.chdir("{name}")  # Colab: the uploaded folder
from plumbing.blas import set_threads
set_threads(1)  # one BLAS thread: a kernel beside other work runs 2-3x faster so (docs/performance.md)
from interface.notebook import check, run_program
MODEL = {model!r}  # the programs' model: another? a size (124M), a model folder (its path) or hf:owner/name
"""


def write_notebook(folder, numbers, model="124M", name=None):
    """folder/exercises.ipynb (nbformat 4, kernel python3) for the exercises `numbers` of the handout
    written in folder: the text of each from docs/exercises.md, a cell for each of its functions, a
    check and a program cell. name: the folder's name once written (Colab's first cell moves into it)."""
    texts = exercise_texts(os.path.join(folder, "docs", "exercises.md"))
    files = sorted({file for n in numbers for file, _ in handout.functions(n)})
    parsed = {}
    cells = [cell("markdown", INTRO.format(numbers=handout.spans(numbers), notebook=handout.NOTEBOOK, model=model,
                                           files="`, `".join(files)), ["intro"], "intro"),
             cell("code", SETUP.format(record=handout.RECORD, name=name or os.path.basename(os.path.abspath(folder)),
                                       model=model), ["setup"], "setup")]
    for n in numbers:
        title, _, _, where = handout.EXERCISES[n]
        text = texts.get(n, f"**{title}**: write {', '.join(f for _, f in handout.functions(n))}.")
        tag = f"exercise-{n}"
        cells.append(cell("markdown", f"## Exercise {n}\n\n{text}\n", [tag, "text"], f"{tag}-text"))
        cells += [cell("code", student_source(folder, n, file, function, parsed), [tag, "student"], f"{tag}-{function}")
                  for file, function in handout.functions(n)]
        cells.append(cell("code", f"check({n})\n", [tag, "check"], f"{tag}-check"))
        cells.append(cell("code", f"run_program({n}, MODEL)  # {handout.WHERE[where]}\n", [tag, "program"],
                          f"{tag}-program"))
    notebook = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                             "language_info": {"name": "python"}}}
    with open(os.path.join(folder, handout.NOTEBOOK), "w", encoding="utf-8") as f:
        json.dump(notebook, f, indent=1, ensure_ascii=False)
        f.write("\n")


# --- the teacher's view ----------------------------------------------------------------------

def copy_for_progress(folder, to):
    """The student's folder, as it is, without what tests do not read (models, caches, environments)."""
    skip = shutil.ignore_patterns(".git", "models", "__pycache__", ".pytest_cache", ".ipynb_checkpoints")

    def ignore(where, names):
        return set(skip(where, names)) | {n for n in names if os.path.isfile(os.path.join(where, n, "pyvenv.cfg"))}

    shutil.copytree(folder, to, ignore=ignore, symlinks=True)


def progress(folder):
    """{"folder", "exercises": [{"number", "name", "status", "failing", "written_in", "problems", "runs_failing"}]}:
    each exercise of the handout in folder done (its tests pass), failing (those that do not), not Python (a
    cell, or its file, that Python cannot read) or not started (blank), written in the files or the notebook;
    a cell's other problems (another name, a helper outside its function) in one line each; the other
    exercises its failing tests went through that fail their own ({"number", "functions"}). The notebook's
    cells count as check counts them, applied to a copy: the student's folder is left as it is."""
    numbers = read_record(folder)["exercises"]
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "class")
        copy_for_progress(folder, copy)
        written, problems = apply_cells(copy, numbers, saved_cells(folder))
        started = [n for n in numbers if len(blanks(written, n)) < len(handout.functions(n))]
        tests = list(dict.fromkeys(t for n in started for t in handout.tests(n)))
        passed, _, _, ran = run_tests(copy, tests) if tests else (set(), {}, "", {})
    report = []
    for n in numbers:  # a cell that could not be written fails its function's own test
        own = [test for _, function, test in handout.EXERCISES[n][1] if (n, function) in problems]
        failing = list(dict.fromkeys(own + [t for t in handout.tests(n) if t not in passed])) if n in started else []
        said = [problems[(n, f)] for _, f in handout.functions(n) if (n, f) in problems]
        status = ("not Python" if any(isinstance(e, NotPython) for e in said) else "not started" if n not in started
                  else "failing" if failing else "done")
        elsewhere = failing_elsewhere(n, started, {t: ran[t] for t in failing if t in ran},
                                      lambda tests: {t for t in tests if t not in passed})
        report.append({"number": n, "name": handout.EXERCISES[n][0], "status": status, "failing": failing,
                       "written_in": sorted({written[(n, f)] for _, f in handout.functions(n)} - {None}),
                       "problems": list(dict.fromkeys(map(str, said))),
                       "runs_failing": [{"number": m, "functions": functions} for m, functions in elsewhere]})
    return {"folder": folder, "exercises": report}


def notes(e):
    """What follows an exercise's status: each problem of its cells, then the exercises it runs that fail."""
    return e["problems"] + elsewhere_lines([(r["number"], r["functions"]) for r in e["runs_failing"]])


def progress_lines(reports, table=None):
    """One folder: a line an exercise. Several (or table): one table, a student a row (a folder that is not
    a handout, {"folder", "error"}: its row says why), then what each fails."""
    if not (len(reports) > 1 if table is None else table):
        return [f"{e['number']:>2}. {e['name']}: {e['status']}"
                + (f" ({', '.join(e['failing'])})" if e["failing"] and e["status"] == "failing" else "")
                + (f", in the {' and the '.join(e['written_in'])}" if e["written_in"] else "")
                + "".join(f"; {note}" for note in notes(e)) for e in reports[0]["exercises"]]
    read = [r for r in reports if "exercises" in r]
    numbers = sorted({e["number"] for r in read for e in r["exercises"]})
    rows = [["folder", *map(str, numbers)]]
    rows += [[r["folder"], *({e["number"]: e["status"] for e in r["exercises"]}.get(n, "") for n in numbers)]
             for r in read]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(text.ljust(w) for text, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"{r['folder'].ljust(widths[0])}  {r['error']}" for r in reports if "error" in r]
    return lines + [f"{r['folder']}: {e['number']} "
                    + (f"fails {', '.join(e['failing'])}" if e["failing"] and e["status"] == "failing" else e["status"])
                    + "".join(f"; {note}" for note in notes(e))
                    for r in read for e in r["exercises"] if (e["failing"] and e["status"] == "failing") or notes(e)]
