"""The layout the README promises: the model needs NumPy alone, imports go one way, and what
the program reads at run time lives outside tests/."""
import ast
import glob
import json
import os
import subprocess
import sys

import bpe
from conftest import FILE_ORDER, HERE, ROOT

TOP = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "*.py")))
PLUMBING = sorted("plumbing." + os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "plumbing", "*.py"))
                  if not p.endswith("__init__.py"))
PROJECT = TOP + PLUMBING
GLUE = {"plumbing.gpt2_cli", "plumbing.train_cli", "plumbing.evaluate_cli", "download", "plumbing.hub",
        "plumbing.loading"}


def source(module):
    return os.path.join(ROOT, *module.split(".")) + ".py"


def modules_loaded_by(statement):
    r = subprocess.run([sys.executable, "-c", f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(r.stdout))


def test_the_model_needs_numpy_and_nothing_else():
    loaded = modules_loaded_by("import gpt2_numpy")
    assert not {"requests", "urllib3", "tqdm", "regex"} & loaded
    assert loaded & set(PROJECT) == {"gpt2_numpy", "plumbing.errors", "plumbing.shapes"}  # the standard library only
    assert not {"requests", "tqdm", "regex"} & modules_loaded_by("import plumbing.errors")


def imports(path, top_only=False):
    """The project modules a file imports: anywhere in it (or, with top_only, when it is imported),
    except under `if __name__ == "__main__":`, a script's entry point, which runs only when it is the program."""
    found = set()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    main = {id(n) for n in ast.walk(tree) if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)}

    def visit(node):
        if id(node) in main or (top_only and isinstance(node, (ast.FunctionDef, ast.ClassDef))):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "plumbing":
            found.update("plumbing." + a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found & set(PROJECT)


def test_no_import_cycle_among_the_projects_modules():
    """Imports go one way, even those made inside a function when it is first called."""
    graph = {m: imports(source(m)) for m in PROJECT}
    done, path = set(), []

    def walk(m):
        assert m not in path, f"an import cycle: {' -> '.join(path[path.index(m):] + [m])}"
        if m in done:
            return
        path.append(m)
        for n in sorted(graph[m]):
            walk(n)
        path.pop()
        done.add(m)

    for m in PROJECT:
        walk(m)


def test_the_model_knows_nothing_of_downloads_or_the_command_line():
    graph = {m: imports(source(m)) for m in PROJECT}
    assert graph["gpt2_numpy"] == {"plumbing.errors", "plumbing.shapes"} == imports(source("gpt2_numpy"), top_only=True)
    for low in ("gpt2_numpy", "backward", "optimizer", "plumbing.parallel"):
        assert not graph[low] & (GLUE | {"train"}), (low, graph[low])


def test_no_chapter_imports_the_command_line_glue():
    """Glue may import chapters; a chapter (a top-level file that is not itself a command) never imports glue."""
    chapters = {"gpt2_numpy", "bpe", "look_inside", "backward", "optimizer", "initialise", "parameters", "train",
                "evaluate"}
    for m in sorted(chapters):
        assert not imports(source(m)) & {"plumbing.gpt2_cli", "plumbing.train_cli", "plumbing.evaluate_cli"}, m


def test_the_top_level_is_a_table_of_contents():
    assert len(TOP) <= 15, TOP
    assert PLUMBING and not glob.glob(os.path.join(ROOT, "plumbing", "*", "*.py")), "the plumbing is one flat folder"


def test_what_the_program_reads_at_run_time_is_not_under_tests():
    vocab = os.path.relpath(bpe.DEFAULT_VOCAB_DIR, ROOT)
    assert vocab.split(os.sep)[0] == "data"
    assert all(os.path.isfile(os.path.join(bpe.DEFAULT_VOCAB_DIR, f)) for f in ("encoder.json", "vocab.bpe", "LICENSE"))


def test_every_test_file_has_its_place_in_the_order():
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, "test_*.py")))
    assert sorted(FILE_ORDER) == files


def test_the_readme_is_a_front_door_and_its_links_lead_somewhere():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert readme.count("\n") <= 350
    import re
    links = re.findall(r"\]\((docs/[\w.]+)\)", readme)
    assert {"docs/exercises.md", "docs/performance.md", "docs/fine_tuning.md", "docs/look_inside.md"} <= set(links)
    assert all(os.path.isfile(os.path.join(ROOT, link)) for link in links)
    listed = re.findall(r"^    (\w+\.py|\w+/) ", readme, re.M)
    assert sorted(f for f in listed if f.endswith(".py")) == [f + ".py" for f in TOP], \
        "the README's map names every top-level module, and only those"
    assert "plumbing/" in listed
    with open(os.path.join(ROOT, "plumbing", "README.md"), encoding="utf-8") as f:
        inside = set(re.findall(r"^    (\w+\.py) ", f.read(), re.M))
    assert inside == {m.split(".")[1] + ".py" for m in PLUMBING}, "plumbing/README.md names every file in the folder"
