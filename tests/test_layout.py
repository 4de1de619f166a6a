"""The layout the README promises: the model needs NumPy alone; two floors beside the chapters,
plumbing/ below them and interface/ above; imports go one way; and what the program reads at run
time lives outside tests/; a bench makes the folder it writes into (bench/out/)."""
import ast
import glob
import json
import os
import subprocess
import sys

import pytest

import bpe
from conftest import FILE_ORDER, HERE, ROOT
import handout


def folder_modules(folder):
    return sorted(f"{folder}." + os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, folder, "*.py"))
                  if not p.endswith("__init__.py"))


TOP = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "*.py")))
PLUMBING = folder_modules("plumbing")
INTERFACE = folder_modules("interface")
PROJECT = TOP + PLUMBING + INTERFACE
FLOOR = {**dict.fromkeys(PLUMBING, 0), **dict.fromkeys(TOP, 1), **dict.fromkeys(INTERFACE, 2)}
GLUE = set(INTERFACE) | {"download", "plumbing.hub", "plumbing.fetching"}  # the command lines, and downloading


def source(module):
    return os.path.join(ROOT, *module.split(".")) + ".py"


def modules_loaded_by(statement):
    r = subprocess.run([sys.executable, "-c", f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(r.stdout))


def test_the_model_needs_numpy_and_nothing_else():
    """gpt2_numpy imports plumbing/errors.py and perhaps shapes.py (GPT-2's facts), which need the standard library
    alone, and plumbing/device.py (its host copy), which needs NumPy and imports CuPy only when a GPU is asked for;
    and plumbing/parallel.py (the hot path's threads, as many as BLAS's: plumbing/blas.py asks it, through ctypes)."""
    loaded = modules_loaded_by("import gpt2_numpy")
    assert not {"requests", "urllib3", "tqdm", "regex", "cupy"} & loaded
    assert "gpt2_numpy" in loaded and loaded & set(PROJECT) <= {"gpt2_numpy", "plumbing.errors", "plumbing.shapes",
                                                                 "plumbing.device", "plumbing.parallel", "plumbing.blas"}
    for helper in ("plumbing.errors", "plumbing.shapes"):
        assert not {"numpy", "requests", "tqdm", "regex"} & modules_loaded_by(f"import {helper}"), helper


def imports(path, top_only=False, main_only=False):
    """The project modules a file imports: anywhere in it (or, with top_only, when it is imported),
    except under `if __name__ == "__main__":`, a script's entry point, which runs only when it is the
    program; with main_only, those of its entry point alone."""
    found = set()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    main = {id(n) for n in ast.walk(tree) if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)}

    def visit(node, in_main=False):
        in_main = in_main or id(node) in main
        if (in_main and not main_only) or (top_only and isinstance(node, (ast.FunctionDef, ast.ClassDef))):
            return
        if in_main or not main_only:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module in ("plumbing", "interface"):
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child, in_main)

    visit(tree)
    return found & set(PROJECT)


def graph():
    """{module: the project modules it imports}, the __main__ hand-offs left out."""
    return {m: imports(source(m)) for m in PROJECT}


def test_every_import_goes_down_a_floor_or_along_one():
    """plumbing/ (formats, helpers) < the chapters and commands < interface/ (the command lines): no file
    imports from a floor above its own. Only a script's __main__ hand-off reaches up, to its command line."""
    up = [(m, n) for m, imported in graph().items() for n in sorted(imported) if FLOOR[n] > FLOOR[m]]
    assert up == [], up


def test_a_top_level_file_reaches_interface_only_at_its_entry_point():
    """Each command hands over to its own command line, interface/*_cli.py, through interface/start.py:
    `start("..._cli")` in its `if __name__ == "__main__":`, which comes above the file's imports, so that
    Ctrl-C and SIGTERM are caught before NumPy loads. Nothing else below interface/ imports it, and no
    file in interface/ is a program of its own."""
    clis = {}
    for m in TOP:
        with open(source(m), encoding="utf-8") as f:
            body = ast.parse(f.read()).body
        mains = [i for i, n in enumerate(body) if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        if not mains:
            continue
        first_import = next(i for i, n in enumerate(body) if isinstance(n, (ast.Import, ast.ImportFrom)))
        assert len(mains) == 1 and mains[0] < first_import, f"{m}: the hand-off comes above the imports"
        assert imports(source(m), main_only=True) == {"interface.start"}, m
        call = next(n for n in ast.walk(body[mains[0]]) if isinstance(n, ast.Call) and ast.unparse(n.func) == "start")
        clis[m] = call.args[0].value
    assert all(f"interface.{cli}" in INTERFACE and cli.endswith("_cli") for cli in clis.values()), clis
    assert len(set(clis.values())) == len(clis) >= 7, clis  # one command line a command
    for m in TOP + PLUMBING:
        assert not imports(source(m)) & set(INTERFACE), m
    for m in INTERFACE:
        with open(source(m), encoding="utf-8") as f:
            assert not [n for n in ast.walk(ast.parse(f.read())) if isinstance(n, ast.If)
                        and "__main__" in ast.unparse(n.test)], f"{m} is run through its command's hand-off"


def test_a_commands_first_step_loads_no_library():
    """interface/start.py, run before a command's imports, needs the standard library alone."""
    assert not {"numpy", "regex", "requests", "tqdm"} & modules_loaded_by("import interface.start")


def test_no_import_cycle_among_the_projects_modules():
    """Imports go one way, even those made inside a function when it is first called: drawn without
    the __main__ hand-offs, the imports have no loop."""
    edges, done, path = graph(), set(), []

    def walk(m):
        assert m not in path, f"an import cycle: {' -> '.join(path[path.index(m):] + [m])}"
        if m in done:
            return
        path.append(m)
        for n in sorted(edges[m]):
            walk(n)
        path.pop()
        done.add(m)

    for m in PROJECT:
        walk(m)


def test_the_model_knows_nothing_of_downloads_or_the_command_line():
    edges = graph()
    assert edges["gpt2_numpy"] <= {"plumbing.errors", "plumbing.shapes", "plumbing.device", "plumbing.parallel"}
    assert edges["gpt2_numpy"] == imports(source("gpt2_numpy"), top_only=True)
    for low in ("gpt2_numpy", "backward", "optimizer", "plumbing.parallel"):
        assert not edges[low] & (GLUE | {"train"}), (low, edges[low])


def test_the_top_level_is_a_table_of_contents():
    assert len(TOP) <= 20, TOP
    for folder, modules in (("plumbing", PLUMBING), ("interface", INTERFACE)):
        assert modules and not glob.glob(os.path.join(ROOT, folder, "*", "*.py")), f"{folder}/ is one flat folder"


def test_what_the_program_reads_at_run_time_is_not_under_tests():
    vocab = os.path.relpath(bpe.DEFAULT_VOCAB_DIR, ROOT)
    assert vocab.split(os.sep)[0] == "data"
    assert all(os.path.isfile(os.path.join(bpe.DEFAULT_VOCAB_DIR, f)) for f in ("encoder.json", "vocab.bpe", "LICENSE"))


def test_every_test_file_has_its_place_in_the_order():
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, "test_*.py")))
    assert sorted(f for f in FILE_ORDER if f in files or not handout.left_behind(f"tests/{f}")) == files  # a handout's


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
    assert {"plumbing/", "interface/"} <= set(listed)
    for folder, modules in (("plumbing", PLUMBING), ("interface", INTERFACE)):
        with open(os.path.join(ROOT, folder, "README.md"), encoding="utf-8") as f:
            inside = set(re.findall(r"^    (\w+\.py) ", f.read(), re.M))
        assert inside == {m.split(".")[1] + ".py" for m in modules}, f"{folder}/README.md names every file in it"


def test_the_readme_makes_a_venv_shows_every_command_and_says_how_a_script_elsewhere_imports_it(tmp_path):
    """Issue 51: the README never said to make a virtual environment; steer.py had no line of its own; the Python
    API said "run it from the project folder", from where python /elsewhere/x.py cannot import gpt2_numpy."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert "python -m venv .venv && . .venv/bin/activate" in readme
    listed = readme.split("## The command line", 1)[1].split("\n\n", 2)[1]
    assert all(f"    python {m}.py " in listed for m in ("gpt2_numpy", "train", "convert", "sae", "steer"))
    script = tmp_path / "elsewhere.py"
    script.write_text("import gpt2_numpy\nprint(gpt2_numpy.__name__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = [subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, env=env | more)
           for more in ({}, {"PYTHONPATH": ROOT})]
    assert "No module named 'gpt2_numpy'" in run[0].stderr and run[1].stdout == "gpt2_numpy\n", run[1].stderr
    assert "`PYTHONPATH=/path/to/gpt2-numpy python script.py`" in readme.split("## The Python API", 1)[1][:400]


def test_one_texts_training_part_holds_no_end_of_text():
    """docs/from_scratch.md: without a prompt, the baby model's first character can be `�`, for it never saw
    <|endoftext|>, which a text of one document holds only at its end, in the validation tenth."""
    import train
    encoder = bpe.get_encoder(os.path.join(ROOT, "data", "gpt2-vocab"))
    train_ids, val_ids = train.text_ids(encoder, "to be or not. " * 40, 0.1, 8)
    assert 50256 not in train_ids.tolist() and val_ids.tolist()[-1] == 50256
    with open(os.path.join(ROOT, "docs", "from_scratch.md"), encoding="utf-8") as f:
        assert "Without a prompt its first character can be `�`" in f.read()


def test_the_readmes_tour_of_gpt2_numpy_names_its_functions_through_generation():
    """The tour's table names real functions, and goes on past sample_next: the processors, stop strings and
    LoRA's update (issue 37)."""
    import re
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        tour = f.read().split("## A tour of gpt2_numpy.py", 1)[1].split("| function |", 1)[1].split("\n\n", 1)[0]
    named = {name for row in re.findall(r"^\| (`.*?`) \|", tour, re.M) for name in re.findall(r"`(\w+)`", row)}
    with open(source("gpt2_numpy"), encoding="utf-8") as f:
        defined = {n.name for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef)}
    assert named <= defined, f"the tour names functions gpt2_numpy.py lacks: {sorted(named - defined)}"
    assert {"penalize_repeats", "ban_repeated_ngrams", "top_k_filter", "top_p_filter", "min_p_filter", "sampling_probs",
            "sample_next", "stop_string_end", "lora_update", "generate", "score"} <= named


def test_each_module_has_a_test_file_named_for_it():
    """tests/test_X.py for each top-level X.py; every test file names the module it tests (test_train_lora.py:
    a part of train.py), but for this one and the opt-in runs on the real weights and on a real GPU."""
    names = {os.path.basename(p)[5:-3] for p in glob.glob(os.path.join(HERE, "test_*.py"))}
    assert set(TOP) <= names, set(TOP) - names
    modules = {m.split(".")[-1] for m in PROJECT}
    strays = {n for n in names - modules - {"layout", "real_weights", "gpu"}
              if not any(n.startswith(m + "_") for m in TOP)}
    assert not strays, f"test files that name no module: {sorted(strays)}"


def test_the_spine_is_the_forward_pass_first():
    """gpt2_numpy.py holds the model, generation and scoring; the forward pass ends in its first half."""
    with open(os.path.join(ROOT, "gpt2_numpy.py"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 550  # 500, and section 7's fast forms beside the plain ones (issue 54)
    assert next(i for i, line in enumerate(lines, 1) if line.startswith("def gpt2(")) < 260


# --- bench/: on a fresh clone, where bench/out/ is not yet there, a bench makes the folder it writes into ----------

IN_A_HANDOUT = pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "bench")),
                                  reason="bench/ stays behind in a handout (handout.py's LEFT_BEHIND)")

BENCH_TINY = {"n_vocab": 50257, "n_ctx": 8, "n_embd": 8, "n_head": 2, "n_layer": 1}  # random:SIZE's, but small


def bench_script(monkeypatch, name, tmp_path):
    """bench/NAME.py, imported (bench/ is not a package: its scripts import each other by name), writing to tmp_path."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    import importlib

    script = importlib.import_module(name)
    monkeypatch.setattr(script, "HERE", str(tmp_path / "bench"), raising=False)
    return script


@IN_A_HANDOUT
def test_a_bench_writes_its_random_model_into_a_bench_out_not_yet_made(tmp_path, monkeypatch):
    """bench_circuits.py's (and bench_speculative.py's) random:124M on a fresh clone."""
    from plumbing import shapes
    from plumbing.checkpoint import load_checkpoint

    bench = bench_script(monkeypatch, "bench_speculative", tmp_path)
    monkeypatch.setattr(shapes, "hparams", lambda size: dict(BENCH_TINY))
    folder = bench.model_folder("random:124M")
    assert folder == str(tmp_path / "bench" / "out" / "124M-random-init")
    assert load_checkpoint(folder)[0] == BENCH_TINY


@IN_A_HANDOUT
def test_a_bench_keeps_its_trained_model_in_a_bench_out_not_yet_made(tmp_path, monkeypatch):
    from parameters import init_params

    bench = bench_script(monkeypatch, "bench_from_scratch", tmp_path)
    hp = dict(BENCH_TINY, n_vocab=257)
    bench.keep("scratch-257", init_params(hp), hp, [], "held out")
    assert sorted(os.listdir(tmp_path / "bench" / "out")) == ["scratch-257", "shakespeare-heldout.txt"]


# --- bench/: every bench still runs (a bench is run by hand, rarely: a change to a function it calls breaks it unseen) --

def bench_misfits(path):
    """The calls in bench script `path` to the project's functions that no longer fit them: a name the module
    lacks, or arguments its signature refuses (inspect.signature.bind on the call's own arguments)."""
    import importlib
    import inspect

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names, misfits = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in (a for a in node.names if a.name.split(".")[0] in {*TOP, "plumbing", "interface"}):
                names[a.asname or a.name.split(".")[0]] = importlib.import_module(a.asname and a.name or
                                                                                  a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in {*TOP, "plumbing", "interface"}:
            module = importlib.import_module(node.module)
            for a in node.names:
                if not hasattr(module, a.name) and f"{node.module}.{a.name}" not in PROJECT:
                    misfits.append(f"line {node.lineno}: {node.module} has no {a.name}")
                else:
                    names[a.asname or a.name] = getattr(module, a.name, None) or \
                        importlib.import_module(f"{node.module}.{a.name}")

    def resolve(f):
        if isinstance(f, ast.Name):
            return names.get(f.id)
        base = resolve(f.value) if isinstance(f, ast.Attribute) else None
        if base is not None and inspect.ismodule(base):
            if not hasattr(base, f.attr):
                misfits.append(f"line {f.lineno}: {ast.unparse(f)}: no such name")
            return getattr(base, f.attr, None)

    for node in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        fn = resolve(node.func)
        if not inspect.isfunction(fn) or any(isinstance(a, ast.Starred) for a in node.args) or \
                any(k.arg is None for k in node.keywords):
            continue
        try:
            inspect.signature(fn).bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as e:
            misfits.append(f"line {node.lineno}: {ast.unparse(node)[:60]}: {e}")
    return misfits


@IN_A_HANDOUT
def test_every_benchs_calls_still_fit_the_functions_they_call(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    found = {os.path.basename(p): bench_misfits(p) for p in sorted(glob.glob(os.path.join(ROOT, "bench", "*.py")))}
    assert len(found) >= 20 and not {k: v for k, v in found.items() if v}, found


@IN_A_HANDOUT
def test_bench_readme_names_every_script_in_bench():
    """Issue 51 §7: bench/ as a reader finds it; its page named none of the three benches added after it."""
    with open(os.path.join(ROOT, "bench", "README.md"), encoding="utf-8") as f:
        page = f.read()
    scripts = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "bench", "*.py"))}
    scripts |= {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "bench", "*.sh"))}
    assert sorted(s for s in scripts if f"`{s}`" not in page) == []


BENCH_SMOKE = {  # the smallest setting of the benches that run on a checkpoint folder alone, with NumPy alone
    "bench_circuits": ["--model", os.path.join(HERE, "data", "hf", "tiny"), "--no-tl", "--repeats", "1",
                       "--threads", "1"],
    "bench_decode": ["--folder", os.path.join(HERE, "data", "circuits_model"), "--rounds", "1", "--tokens", "2"],
    "bench_prefill_parts": ["--folder", os.path.join(HERE, "data", "circuits_model"), "--tokens", "8",
                            "--repeats", "1"],
    "bench_products": ["--rows", "8", "--n-embd", "8", "--layers", "1", "--vocab", "16", "--threads", "1"],
    "bench_ab": ["--baseline", ROOT, "--what", "scratch-step", "--pairs", "1"],  # this checkout against itself
}


def test_the_benches_run_at_their_smallest(tmp_path, monkeypatch, capsys):
    """Each runs its main() in this process, on a model of tests/data: what a change to the project would break
    (bench_circuits.py's key for copies_forward's arguments once did) shows here, not on the next measurement."""
    import circuits

    for name in ("run_with_cache", "copies_forward"):  # bench_circuits times them by wrapping them: put back after
        monkeypatch.setattr(circuits, name, getattr(circuits, name))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, os.environ.get(var, ""))  # bench_circuits sets them (for the NumPy it then loads)
    for name, argv in BENCH_SMOKE.items():
        bench = bench_script(monkeypatch, name, tmp_path)
        monkeypatch.setattr(sys, "argv", [name + ".py", *argv])
        bench.main()
        out = capsys.readouterr().out
        assert out.strip(), name
