"""The notebook handout (python handout.py CLASS 5 1 --notebook): its cells run in order, from the
class's folder, as a kernel runs them, for a blank, a wrong and a right student; what each check and
program cell prints; which of the notebook and the files wins; the teacher's view (--progress); and
the mistakes each says in one line. Opt-in: the same notebook in a real Jupyter kernel (nbclient)."""
import ast
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, in_process, model_folder_copy
import handout
from interface import handout_cli, notebook
from plumbing.errors import UserError
from test_handout import PROGRAMS, RIGHT as ALL_RIGHT, WRONG, body_of, body_of_source, on_every_core

NUMBERS = [5, 1]
DEV_PYTHON = os.environ.get("GPT2_DEV_PYTHON", "")

# The code cells in order, as a kernel runs them: from the class's folder (on sys.path, as a kernel's ""),
# each cell's source added to In (IPython's history, where check and run_program find the student's cells
# as last run), a line "=== TAGS" before each cell's output. A cell that raises stops the rest, as in Jupyter.
RUN_CELLS = """import json, sys
sys.path.insert(0, "")
In = [""]
with open("exercises.ipynb", encoding="utf-8") as f:
    cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
for i, cell in enumerate(cells):
    In.append("".join(cell["source"]))
    print("===", " ".join(cell["metadata"]["tags"]), flush=True)
    exec(compile(In[-1], f"<cell {i}>", "exec"), globals())
    sys.stdout.flush()
"""


def write_class(folder, model):
    """python handout.py FOLDER 5 1 --notebook --model MODEL, as the command line does it."""
    assert handout_cli.main([folder, *map(str, NUMBERS), "--notebook", "--model", model]) == 0
    return folder


def notebook_of(folder):
    with open(os.path.join(folder, handout.NOTEBOOK), encoding="utf-8") as f:
        return json.load(f)


def write_cells(folder, bodies):
    """The student writes {function: body} in the notebook's cells (and saves it)."""
    nb = notebook_of(folder)
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        for function, body in bodies.items():
            if "student" in cell["metadata"]["tags"] and f": {function} (" in source.splitlines()[0]:
                cell["source"] = handout.replace_body(source, function, body).splitlines(keepends=True)
    with open(os.path.join(folder, handout.NOTEBOOK), "w", encoding="utf-8") as f:
        json.dump(nb, f)


def write_files(folder, bodies):
    """The student writes {function: body} in the program's files instead."""
    for file, function in [f for n in NUMBERS for f in handout.functions(n)]:
        if function in bodies:
            path = os.path.join(folder, file)
            with open(path, encoding="utf-8") as f:
                source = f.read()
            with open(path, "w", encoding="utf-8") as f:
                f.write(handout.replace_body(source, function, bodies[function]))


def body_in(folder, file, function):
    with open(os.path.join(folder, file), encoding="utf-8") as f:
        return body_of_source(f.read(), function)


def run_cells(folder):
    """{"exercise-5 check": its output, ...} of the notebook's code cells run in order."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", RUN_CELLS], cwd=folder, capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]  # no cell raised: Run all went through
    return {part.split("\n", 1)[0]: part.split("\n", 1)[1] if "\n" in part else ""
            for part in r.stdout.split("=== ")[1:]}


RIGHT = {function: body_of(file, function) for n in NUMBERS for file, function in handout.functions(n)}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_folder_copy("tiny", str(tmp_path_factory.mktemp("m") / "tiny"))


@pytest.fixture(scope="module")
def students(tmp_path_factory, model):
    """Three students' handouts, the notebook run in each: {student: (folder, outputs)}.
    blank: nothing written. wrong: every function written right in the files, then in the notebook
    with gelu and merge_once wrong (the notebook wins). right: exercise 5 written in the notebook,
    exercise 1 in the files, its cells left blank (the files count)."""
    def student(name):
        folder = write_class(str(tmp_path_factory.mktemp(name) / "class"), model)
        if name == "wrong":
            write_files(folder, RIGHT)
            write_cells(folder, {**RIGHT, "gelu": WRONG["gelu"], "merge_once": WRONG["merge_once"]})
        if name == "right":
            write_cells(folder, {f: RIGHT[f] for _, f in handout.functions(5)})
            write_files(folder, {f: RIGHT[f] for _, f in handout.functions(1)})
        return folder, run_cells(folder)

    return on_every_core(student, ["blank", "wrong", "right"])


def test_the_notebook_has_each_exercises_text_functions_check_and_program_in_order(students):
    folder, _ = students["blank"]
    nb = notebook_of(folder)
    assert nb["nbformat"] == 4 and nb["metadata"]["kernelspec"]["name"] == "python3"
    sections = [[t for t in c["metadata"]["tags"] if t != f"exercise-{n}"] for n in NUMBERS for c in nb["cells"]
                if f"exercise-{n}" in c["metadata"]["tags"]]
    assert sections == [["text"], *[["student"]] * 3, ["check"], ["program"],
                        ["text"], *[["student"]] * 2, ["check"], ["program"]]
    cells = {tuple(c["metadata"]["tags"]): "".join(c["source"]) for c in nb["cells"]}
    assert "test_gelu_is_the_tanh_approximation" in cells[("exercise-5", "text")]  # docs/exercises.md's text
    assert "the notebook's cell wins" in cells[("intro",)]
    assert "from interface.notebook import check, run_program\n" in cells[("setup",)]
    for c in nb["cells"]:
        if "student" in c["metadata"]["tags"]:
            tree = ast.parse("".join(c["source"]))
            assert [type(n) for n in tree.body] == [ast.ImportFrom, ast.FunctionDef]
            assert notebook.is_blank(tree.body[1]) and ast.get_docstring(tree.body[1])
    # the rest: "run it there yourself" (a classifier's labelled texts); issue 51: 46's, 47's and 48's read no
    # file of the student's, and run
    assert set(notebook.COMMANDS) <= set(handout.WHERE) and {"topk", "sae_jumprelu", "steer"} <= set(notebook.COMMANDS)
    assert cells[("exercise-1", "check")] == "check(1)\n"
    assert cells[("exercise-1", "program")].startswith("run_program(1, MODEL)")
    assert "MODEL = " in cells[("setup",)] and "another? a size (124M), a model folder" in cells[("setup",)]


def test_a_blank_notebook_says_not_written_yet_and_which_exercise_the_program_needs(students):
    _, out = students["blank"]
    assert out["exercise-5 check"] == ("exercise 5 (gelu, softmax, layer_norm): not written yet: write gelu, "
                                       "softmax, layer_norm in the cells above (or in gpt2_numpy.py)\n")
    needs = ('python gpt2_numpy.py "prompt" needs exercises 1, 5 written first: 1 (merge_once, merge not yet); '
             '5 (gelu, softmax, layer_norm not yet)\n')
    assert out["exercise-5 program"] == out["exercise-1 program"] == needs


def test_a_wrong_notebook_fails_its_tests_with_their_messages_and_changes_what_the_program_prints(students):
    folder, out = students["wrong"]
    _, right = students["right"]
    assert out["exercise-5 check"].splitlines() == [  # tests, not their parameters: 1 FAILED line, 1 failed
        "FAILED tests/test_gpt2_numpy.py::test_gelu_is_the_tanh_approximation - AssertionError: Not equal to "
        "tolerance rtol=1e-05, atol=1e-06 gelu is twice the answer: the 0.5 of 0.5 x (1 + tanh(...)) is missing",
        "1 failed, 2 passed"]
    assert out["exercise-1 check"].splitlines()[-1] == "2 failed, 1 passed"
    assert "FAILED tests/test_bpe.py::test_one_merge_joins_the_pair_with_the_lowest_rank - assert None ==" \
        in out["exercise-1 check"]
    # the notebook won over the files, where the student had written them right
    assert body_in(folder, "gpt2_numpy.py", "gelu") == WRONG["gelu"]
    assert body_in(folder, "bpe.py", "merge_once") == WRONG["merge_once"]
    assert out["exercise-5 program"].startswith("$ python gpt2_numpy.py --model ")
    assert out["exercise-5 program"] == out["exercise-1 program"] != right["exercise-5 program"]


def test_a_right_notebook_passes_and_its_program_prints_what_the_project_prints(students, model):
    folder, out = students["right"]
    assert out["exercise-5 check"] == "3 passed\n" and out["exercise-1 check"] == "3 passed\n"  # 1: in the files
    assert body_in(folder, "gpt2_numpy.py", "gelu") == RIGHT["gelu"]
    assert body_in(folder, "bpe.py", "merge") == RIGHT["merge"]
    command, *printed = out["exercise-1 program"].splitlines()
    argv = [model if a == "MODEL" else a for a in notebook.COMMANDS["generate"]]
    assert command == "$ python " + " ".join(argv[:-1]) + f" '{argv[-1]}'"
    project = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert project.returncode == 0 and printed == project.stdout.splitlines() and printed
    assert out["exercise-5 program"] == out["exercise-1 program"]  # the same body prints the same every run


def test_a_cell_with_another_name_or_not_python_is_one_line_and_writes_nothing(tmp_path, model, monkeypatch, capsys):
    folder = write_class(str(tmp_path / "class"), model)
    capsys.readouterr()
    before = body_in(folder, "gpt2_numpy.py", "gelu")
    marker = notebook.cell_marker(5, "gelu") + "gpt2_numpy.py)\n"
    monkeypatch.chdir(folder)
    for cell, said in [(marker + "def gelu2(x):\n    return x\n",
                        "exercise 5: gelu's cell defines no function gelu (it defines gelu2): keep the name, the "
                        "program calls it by it"),
                       (marker + "C = 0.044715\n\ndef cube(x):\n    return x ** 3\n\ndef gelu(x):\n"
                        "    return 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * (x + C * cube(x))))\n",  # issue 51
                        "exercise 5: gelu's cell has C, cube outside gelu, and only gelu's body goes into "
                        "gpt2_numpy.py, which has no C or cube: put them inside gelu"),
                       (marker + "def gelu(x):\n    return (x\n", "exercise 5: gelu's cell is not Python: line 3: ")]:
        monkeypatch.setattr(sys.modules["__main__"], "In", ["", cell], raising=False)
        for call in (notebook.check, notebook.run_program):
            call(5)  # it prints; it does not raise
            printed = capsys.readouterr().out
            assert printed.count("\n") == 1 and printed.startswith(said), printed
    assert body_in(folder, "gpt2_numpy.py", "gelu") == before
    notebook.check(4)
    assert capsys.readouterr().out == "exercise 4 is not in this handout (it holds 1, 5)\n"
    with open(os.path.join(folder, "bpe.py"), "a", encoding="utf-8") as f:
        f.write("def (\n")  # the student broke the file itself
    notebook.check(1)
    assert capsys.readouterr().out.startswith("exercise 1: bpe.py is not Python: line ")


def test_a_notebook_handout_stopped_half_way_leaves_nothing(tmp_path, model, monkeypatch, capsys):
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(notebook, "write_notebook", stopped)
    r = in_process(handout_cli.main, capsys, str(tmp_path / "class"), "1", "--notebook", "--model", model)
    assert r.returncode == 130 and os.listdir(tmp_path) == []


def test_pasting_the_projects_own_body_into_every_student_cell_gives_the_projects_function(tmp_path):
    """For every exercise: the cell, with the project's body pasted in, puts the project's function back. The
    handout of them all: python handout.py CLASS --notebook, no numbers (issue 51: the help said all, it refused)."""
    folder = str(tmp_path / "class")
    assert handout_cli.main([folder, "--notebook"]) == 0
    assert notebook.read_record(folder)["exercises"] == list(handout.EXERCISES)
    cells = notebook.saved_cells(folder)
    assert set(cells) == {(n, f) for n in handout.EXERCISES for _, f in handout.functions(n)}
    files = {(n, function): file for n in handout.EXERCISES for file, function in handout.functions(n)}
    pasted = {key: handout.replace_body(source, key[1], body_of(files[key], key[1])) for key, source in cells.items()}
    where, problems = notebook.apply_cells(folder, list(handout.EXERCISES), pasted)
    assert not problems and set(where.values()) == {"notebook"}
    trees = {}
    for root in (ROOT, folder):
        for file in set(files.values()):
            with open(os.path.join(root, file), encoding="utf-8") as f:
                trees[root, file] = ast.parse(f.read())
    for (n, function), file in files.items():
        assert ast.dump(handout.function_node(trees[ROOT, file], function)) == \
            ast.dump(handout.function_node(trees[folder, file], function)), (n, function)


def test_progress_reads_the_files_and_the_notebook_and_leaves_the_folder_as_it_was(students, capsys):
    """--progress: done, failing (which tests), not started; a cell saved but never checked counts, applied
    to a copy: the student's own file is not changed. Issue 51: a cell that is not Python is "not Python", not
    "failing" (with every test of its exercise)."""
    blank, wrong, right = (students[s][0] for s in ("blank", "wrong", "right"))
    write_cells(blank, {**{f: RIGHT[f] for _, f in handout.functions(5)}, "merge_once": "return (ids"})  # saved only
    before = body_in(blank, "gpt2_numpy.py", "gelu")
    r = in_process(handout_cli.main, capsys, "--progress", blank, wrong, right, "--json")
    assert r.returncode == 0, r.stderr
    reports = [json.loads(line) for line in r.stdout.splitlines()]
    status = {(rep["folder"], e["number"]): (e["status"], e["failing"] if e["status"] != "not Python" else None,
                                             e["written_in"]) for rep in reports for e in rep["exercises"]}
    assert status == {
        (blank, 5): ("done", [], ["notebook"]), (blank, 1): ("not Python", None, ["notebook"]),
        (wrong, 5): ("failing", ["test_gelu_is_the_tanh_approximation"], ["notebook"]),
        (wrong, 1): ("failing", ["test_one_merge_joins_the_pair_with_the_lowest_rank",
                                 "test_merges_match_the_classic_algorithm"], ["notebook"]),
        (right, 5): ("done", [], ["notebook"]), (right, 1): ("done", [], ["files"])}
    said = reports[0]["exercises"][1]["problems"]
    assert len(said) == 1 and said[0].startswith("exercise 1: merge_once's cell is not Python: line "), said
    assert set(reports[0]) == {"folder", "exercises"} and set(reports[0]["exercises"][0]) >= {
        "number", "name", "status", "failing", "problems", "runs_failing"}
    assert body_in(blank, "gpt2_numpy.py", "gelu") == before
    table = notebook.progress_lines(reports)
    assert table[0].split() == ["folder", "1", "5"] and table[1].split() == [blank, "not", "Python", "done"]
    assert f"{wrong}: 5 fails test_gelu_is_the_tanh_approximation" in table[4:]
    assert f"{blank}: 1 not Python; {said[0]}" in table[4:]
    assert notebook.progress_lines(reports[2:]) == [" 5. gelu, softmax, layer_norm: done, in the notebook",
                                                    " 1. BPE merges: done, in the files"]
    plain = handout.write_handout(os.path.join(os.path.dirname(blank), "plain"), [12])  # no notebook: the files alone
    assert notebook.progress(plain)["exercises"] == [
        {"number": 12, "name": "the KV cache", "status": "not started", "failing": [], "written_in": [],
         "problems": [], "runs_failing": []}]


def test_progress_reports_every_readable_folder_and_a_row_for_each_that_is_not(tmp_path, capsys):
    """Issue 51: --progress A BAD B stopped the whole class at the first folder it could not read. Every other
    folder is reported; each bad one is a row saying why; then one line on stderr, exit status 2."""
    blank = handout.write_handout(str(tmp_path / "blank"), [5, 1])
    plain = handout.write_handout(str(tmp_path / "plain"), [12])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / handout.RECORD).write_text("{")
    (tmp_path / "bad notebook").mkdir()
    (tmp_path / "bad notebook" / handout.RECORD).write_text('{"exercises": [1]}')
    (tmp_path / "bad notebook" / handout.NOTEBOOK).write_text("{")
    broken, bad, nowhere = str(tmp_path / "broken"), str(tmp_path / "bad notebook"), str(tmp_path / "nowhere")
    r = in_process(handout_cli.main, capsys, "--progress", blank, broken, plain, bad, nowhere)
    assert r.returncode == 2 and r.stderr == f"error: 3 folders of 5 could not be read ({broken}, {bad}, {nowhere}): " \
                                             "their rows say why\n"
    lines = r.stdout.splitlines()
    width = max(len(f) for f in (blank, plain))  # the folder column's
    not_a_handout = f"not a handout (no readable {handout.RECORD}: python handout.py {{}} 1 9 writes one)"
    assert lines[0].split() == ["folder", "1", "5", "12"]
    assert lines[1].split() == [blank, "not", "started", "not", "started"]
    assert lines[2].split() == [plain, "not", "started"]
    assert lines[3:] == [f"{broken.ljust(width)}  {not_a_handout.format(broken)}",
                         f"{bad.ljust(width)}  {os.path.join(bad, handout.NOTEBOOK)}: not a notebook that Jupyter "
                         "saved (its JSON does not read)",
                         f"{nowhere.ljust(width)}  {not_a_handout.format(nowhere)}"]
    r = in_process(handout_cli.main, capsys, "--progress", plain, broken, "--json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert [json.loads(line).get("error", "read") for line in r.stdout.splitlines()] == [
        "read", not_a_handout.format(broken)]


def test_bad_requests_are_one_line_and_leave_nothing(tmp_path, capsys):
    out = str(tmp_path / "class")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("x")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / handout.RECORD).write_text("{")
    (tmp_path / "bad notebook").mkdir()
    (tmp_path / "bad notebook" / handout.RECORD).write_text('{"exercises": [1]}')
    (tmp_path / "bad notebook" / handout.NOTEBOOK).write_text("{")
    for args, message in [(["--notebook"], "--notebook needs a folder for the handout"),
                          ([out, "99", "--notebook"], "no exercise 99: choose from 1 to"),
                          ([out, "0", "--notebook"], "no exercise 0: choose from 1 to"),
                          ([str(tmp_path / "full"), "1", "--notebook"], "already exists and is not an empty folder"),
                          ([out, "1", "--notebook", "--model", "nowhere"], "--model nowhere: no such model folder"),
                          ([out, "1", "--model", "124M"], "--model names the notebook's model: give --notebook too"),
                          ([out, "1", "--notebook", "--copy-model"], "--copy-model copies --model's folder"),
                          ([out, "1", "--notebook", "--model", "124M", "--copy-model"], "--copy-model copies"),
                          (["--progress", str(tmp_path / "full")], "not a handout (no readable handout.json"),
                          (["--progress", str(tmp_path / "broken")], "not a handout"),
                          (["--progress", str(tmp_path / "bad notebook")], "exercises.ipynb: not a notebook"),
                          ([out, "1", "--json"], "--json goes with --progress")]:
        r = in_process(handout_cli.main, capsys, *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, (args, r.stderr)
    assert sorted(os.listdir(tmp_path)) == ["bad notebook", "broken", "full"]


def test_the_notebook_is_valid_nbformat(tmp_path, model):
    """nbformat's own schema, where nbformat is installed (here or in GPT2_DEV_PYTHON's python)."""
    path = os.path.join(write_class(str(tmp_path / "class"), model), handout.NOTEBOOK)
    validate = f"import nbformat; nbformat.validate(nbformat.read({path!r}, as_version=4)); print('valid')"
    for python in (sys.executable, DEV_PYTHON):
        if python:
            r = subprocess.run([python, "-c", validate], capture_output=True, text=True, timeout=120)
            if "No module named 'nbformat'" not in r.stderr:
                assert r.stdout == "valid\n", r.stderr[-2000:]
                return
    pytest.skip("nbformat is not installed: GPT2_DEV_PYTHON=/path/to/python-with-nbformat python -m pytest -q "
                "tests/test_handout_notebook.py -k nbformat")


KERNEL = """import json, sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read("exercises.ipynb", as_version=4)
NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
print(json.dumps({" ".join(c.metadata.tags): "".join(o.get("text", "") for o in c.outputs)
                  for c in nb.cells if c.cell_type == "code"}))
"""


@pytest.mark.skipif(not DEV_PYTHON, reason="a real Jupyter kernel: set GPT2_DEV_PYTHON to a python with nbclient and "
                    "ipykernel (GPT2_DEV_PYTHON=/path/to/python python -m pytest -q tests/test_handout_notebook.py -k "
                    "kernel)")
def test_the_notebook_in_a_real_jupyter_kernel(tmp_path, model):
    """nbclient runs the notebook in a python3 kernel, as Jupyter's Run all: exercise 5 written right in
    the notebook, exercise 1 wrong; no cell raises; each check and program prints as in the subprocess."""
    folder = write_class(str(tmp_path / "class"), model)
    write_cells(folder, {**RIGHT, "merge_once": WRONG["merge_once"]})
    r = subprocess.run([DEV_PYTHON, "-c", KERNEL], cwd=folder, capture_output=True, text=True, timeout=600)
    if "No module named 'nbclient'" in r.stderr:
        pytest.skip(f"{DEV_PYTHON} has no nbclient: pip install nbclient ipykernel there")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["exercise-5 check"] == "3 passed\n"
    assert out["exercise-1 check"].splitlines()[-1] == "2 failed, 1 passed"
    assert out["exercise-1 program"].startswith("$ python gpt2_numpy.py --model ") and \
        out["exercise-1 program"] == out["exercise-5 program"]
    assert body_in(folder, "bpe.py", "merge_once") == WRONG["merge_once"]


# --- issue 51: the checks, the programs and the class's model --------------------------------

def test_a_failure_inside_another_exercises_function_says_so(tmp_path):
    """Issue 51: a layer_norm without keepdims made 25 and 48 fail ("operands could not be broadcast"), and
    nothing said why. Here a softmax without keepdims, and exercise 6 right: its check, and --progress, say
    that its tests also run exercise 5's softmax, which fails its own tests; 5's say nothing of 6."""
    right = {function: ALL_RIGHT[function] for n in (5, 6) for _, function in handout.functions(n)}
    folder = handout.write_handout(str(tmp_path / "class"), [5, 6], bodies={
        **right, "softmax": "e = np.exp(x - x.max(axis=-1))\nreturn e / e.sum(axis=-1)"})
    lines = notebook.check_lines(folder, 6)
    assert lines[-1] == "these tests also run exercise 5's softmax, which fails its own tests: check(5)", lines
    assert any(line.startswith("FAILED tests/") for line in lines)
    report = {e["number"]: e for e in notebook.progress(folder)["exercises"]}
    assert report[6]["status"] == "failing" and report[6]["runs_failing"] == [{"number": 5, "functions": ["softmax"]}]
    assert report[5]["status"] == "failing" and report[5]["runs_failing"] == []
    assert notebook.progress_lines([{"folder": folder, "exercises": list(report.values())}])[1].endswith(
        "; these tests also run exercise 5's softmax, which fails its own tests: check(5)")


def test_the_notebooks_training_warms_up_then_decays():
    """Issue 51: exercise 23's program trained 3 steps with the default warm-up (a tenth of them: none), so a
    warm-up written wrong printed the right one's lines. It trains on test_handout's schedule, where a warm-up a
    step late prints other lines (test_the_program_runs_the_students_code[23])."""
    def schedule(argv):
        return [int(argv[argv.index(flag) + 1]) for flag in ("--steps", "--warmup")]

    steps, warmup = schedule(notebook.COMMANDS["train"])
    assert schedule(PROGRAMS["train"]) == [steps, warmup] and 1 <= warmup and warmup + 2 <= steps


def test_a_class_ships_its_model_and_runs_46_to_48_where_it_goes(tmp_path, model, capsys):
    """Issue 51: a notebook handout made with a local --model baked the teacher's path in, and on a student's
    machine every program cell said "no such folder"; 46's and 48's ran nothing. --copy-model ships the model
    in the class: moved alone where the teacher's model is not, the class runs TopK's encode, a JumpReLU SAE's
    training steps and ActAdd on it."""
    teacher = shutil.copytree(model, str(tmp_path / "teacher" / "tiny"))
    folder = str(tmp_path / "teacher" / "class")
    r = in_process(handout_cli.main, capsys, folder, "46-48", "--notebook", "--model", teacher, "--copy-model")
    assert r.returncode == 0, r.stderr
    record = notebook.read_record(folder)
    assert record["model"] == "models/tiny" and record["model_path"] == teacher
    assert sorted(os.listdir(os.path.join(folder, "models", "tiny"))) == sorted(os.listdir(teacher))
    setup = "".join(notebook_of(folder)["cells"][1]["source"])
    assert "MODEL = 'models/tiny'  # the programs' model: another? a size (124M), a model folder" in setup
    for file, function in [f for n in (46, 47, 48) for f in handout.functions(n)]:
        with open(os.path.join(folder, file), encoding="utf-8") as f:
            source = f.read()
        with open(os.path.join(folder, file), "w", encoding="utf-8") as f:
            f.write(handout.replace_body(source, function, ALL_RIGHT[function]))
    moved = shutil.move(folder, str(tmp_path / "student"))  # the class alone...
    shutil.rmtree(str(tmp_path / "teacher"))  # ...where the teacher's model is not
    for number, command in [(46, "$ python -c TOPK models/tiny TEXT"), (47, "$ python -c SAE_JUMPRELU models/tiny TEXT"),
                            (48, "$ python steer.py add 'I hate you because' --add Love --sub Hate --layer 1")]:
        lines = notebook.run_program_lines(moved, number)
        assert lines[0].startswith(command) and len(lines) > 1 and "the program stopped" not in "\n".join(lines), lines


def test_a_class_finds_a_model_beside_it_or_the_teachers_and_says_how_to_point_at_another(tmp_path):
    """--model FOLDER beside the class's folder: its path from the class, so that the two move together; the class
    moved alone on the teacher's machine: the folder --model named; neither: one line, saying how to give another
    (the first cell's MODEL, which wins)."""
    teacher = str(tmp_path / "t" / "tiny")
    os.makedirs(teacher)
    beside, alone = str(tmp_path / "t" / "class"), str(tmp_path / "alone" / "class")
    assert handout_cli.notebook_model(teacher, beside) == (os.path.join("..", "tiny"), teacher)
    assert handout_cli.notebook_model(teacher, str(tmp_path / "a" / "b" / "class")) == (teacher, teacher)  # far: as is
    assert handout_cli.notebook_model("hf:owner/name", beside) == ("hf:owner/name", None)
    record = {"exercises": [46], "model": os.path.join("..", "tiny"), "model_path": teacher}
    os.makedirs(beside)
    os.makedirs(alone)
    assert notebook.program_model(beside, record) == os.path.join("..", "tiny")
    assert notebook.program_model(alone, record) == teacher
    assert notebook.program_model(alone, record, "355M") == "355M"
    shutil.rmtree(teacher)
    with pytest.raises(UserError, match=r"^no model \.\./tiny here \(.*alone.*\): put it there, or set MODEL in the "
                                        r"first cell to a size \(124M, 355M, 774M, 1558M\), a model folder or hf:"):
        notebook.program_model(alone, record)
