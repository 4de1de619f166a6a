"""The command line of handout.py: list the exercises, or write a copy with some left to do.

    python handout.py --list          # the exercises, their functions and tests, where each runs
    python handout.py class/ 1 4 9    # a copy with exercises 1, 4 and 9 to do (none given: all)
    python handout.py class/ 1-6 9-12 # ranges, as handout.py prints them ("1-6, 9-12" too)
    python handout.py class/ 1 9 --notebook [--model MODEL [--copy-model]]   # and class/exercises.ipynb
    python handout.py --progress class/ [alice/ bob/ ...] [--json]   # done, failing, not started

Exit status: 0 done, 2 a user's mistake (one line on stderr), 130 interrupted (Ctrl-C or
SIGTERM), with no half-written copy left behind.
"""
import argparse
import concurrent.futures
import functools
import json
import os
import shutil

import handout
from interface import notebook
from interface.options import SIZES
from plumbing import shapes
from plumbing.errors import UserError, exit_status, fail, plural
from plumbing.folders import default_models_dir


def main(argv=None):
    p = argparse.ArgumentParser(prog="handout.py", description="Write a copy of the project with exercises left to do.")
    p.add_argument("out", nargs="?", help="a new (or empty) folder for the copy")
    p.add_argument("numbers", nargs="*", type=exercise_numbers,
                   help="the exercises: 4, or a range 1-6 (default: all)")
    p.add_argument("--list", action="store_true", help="list the exercises")
    p.add_argument("--notebook", action="store_true", help=f"also write {handout.NOTEBOOK} in the copy: each "
                   "exercise's text, its functions to write, a check and the program it feeds")
    p.add_argument("--model", help=f"the model the notebook's programs run: {SIZES}, a model folder or "
                                   "hf:owner/name (default: 124M, as the commands'); a folder beside the class's "
                                   "moves with it")
    p.add_argument("--copy-model", action="store_true", help="with --model FOLDER: copy it into the class "
                   "(CLASS/models/NAME), so that the class and its model move together")
    p.add_argument("--progress", nargs="+", metavar="CLASS", help="each exercise of these handouts: done, failing "
                   "(which tests) or not started, written in the files or the notebook")
    p.add_argument("--json", action="store_true", help="with --progress: one JSON object a folder")
    p.error = fail
    args = p.parse_args(argv)
    args.numbers = [n for some in args.numbers for n in some]
    return exit_status(lambda: run(args))


def exercise_numbers(text):
    """An argparse type: "4" -> [4], "1-6" -> [1, ..., 6], "1-6," or "1-6,9" (handout.spans' output pasted)
    -> those numbers."""
    numbers = []
    for part in filter(None, text.split(",")):
        first, dash, last = part.strip().partition("-")
        if not (first.isdigit() and (last.isdigit() or not dash)):
            raise argparse.ArgumentTypeError(f"must be a whole number or a range (1-6), got {text!r}")
        if dash and int(last) < int(first):
            raise argparse.ArgumentTypeError(f"must be a range that runs up (1-6), got {text!r}")
        numbers += range(int(first), int(last or first) + 1)
    return numbers


def run(args):
    """--list (or no folder): every exercise; --progress: the class's; else the copy (and its notebook),
    and what each program then needs done."""
    check_flags(args)
    if args.progress:
        return show_progress(args.progress, args.json)
    if args.list or not args.out:
        for number, (title, fns, _, where) in handout.EXERCISES.items():
            tests = ", ".join(handout.tests(number))
            print(f"{number:>2}. {title}: {', '.join(f for _, f, _ in fns)}  (tests: {tests}; runs in {handout.WHERE[where]})")
        print()
        print("\n".join(handout.programs_waiting(list(handout.EXERCISES))))
        return
    numbers = args.numbers or list(handout.EXERCISES)
    if args.notebook:
        model, path = notebook_model(args.model, args.out, args.copy_model)
        handout.write_handout(args.out, numbers, record={"model": model, "model_path": path,
                                                         "models_dir": default_models_dir()},
                              more=functools.partial(write_notebook, numbers=numbers, model=model,
                                                     copy=path if args.copy_model else None,
                                                     name=os.path.basename(os.path.abspath(args.out))))
    else:
        handout.write_handout(args.out, numbers)
    print(f"{args.out}: exercises {handout.spans(numbers)} to do; "
          f"run the tests there with python -m pytest -q -k NAME")
    models = os.path.join(handout.HERE, "models")
    print(f"the models stay in {models}, not copied: in the copy, give --model {models}/NAME "
          f"(or --models-dir {models}); so do {', '.join(handout.LEFT_BEHIND)} (answers, and other forms of them)")
    print("\n".join(handout.programs_waiting(numbers)))
    if args.notebook:
        print(f"open {os.path.join(args.out, handout.NOTEBOOK)} from {args.out} (Jupyter, VS Code, or Colab with the "
              f"folder uploaded): each exercise's check and program are a cell there")
        if os.path.isabs(model):
            print(f"its programs run {model}, on this machine only: --copy-model ships it in the class, or put it "
                  f"beside the class's folder (MODEL in the notebook's first cell names another)")


def check_flags(args):
    """The flags that go together, before any work."""
    if args.progress and (args.out or args.numbers or args.notebook or args.model or args.copy_model or args.list):
        fail("--progress takes handout folders alone: python handout.py --progress CLASS [CLASS ...] [--json]")
    if args.json and not args.progress:
        fail("--json goes with --progress")
    if args.model and not args.notebook:
        fail("--model names the notebook's model: give --notebook too")
    if args.copy_model and not (args.model and os.path.exists(args.model)):
        fail("--copy-model copies --model's folder (or file) into the class: give --model FOLDER")
    if args.notebook and not args.out:
        fail("--notebook needs a folder for the handout: python handout.py CLASS [1 9] --notebook")


def notebook_model(model, out, copy=False):
    """--model as the notebook's cells will give it, from the handout's folder, and where it is now (a folder's or
    file's absolute path, else None): copied into the class, models/NAME; a folder or file in or beside the
    class's folder, its path from there (the two move together); elsewhere, its absolute path; a size or
    hf:owner/name as it is. Anything else is refused now, not in the notebook."""
    if not model:
        return "124M", None
    if os.path.exists(model):
        path = os.path.abspath(model)
        if copy:
            return f"models/{os.path.basename(path)}", path
        near = os.path.relpath(path, os.path.abspath(out))
        return (near if not near.startswith(os.path.join(os.pardir, os.pardir)) else path), path
    if model in shapes.SIZES or model.startswith("hf:"):
        return model, None
    raise UserError(f"--model {model}: no such model folder or file, and not a size ({SIZES}) or hf:owner/name")


def write_notebook(folder, numbers, model, copy, name):
    """The notebook, and with --copy-model the model, in the handout's folder (copy: the model's path)."""
    if copy:
        to = os.path.join(folder, model)
        os.makedirs(os.path.dirname(to), exist_ok=True)
        (shutil.copytree if os.path.isdir(copy) else shutil.copy2)(copy, to)
    notebook.write_notebook(folder, numbers, model=model, name=name)


def show_progress(folders, as_json):
    """Each folder's exercises. A folder that is not a handout (or whose notebook does not read) is a row that
    says why, the others reported all the same; then one line, and exit status 2."""
    errors = {}

    def report(folder):
        try:
            notebook.saved_cells(folder)  # its notebook, if it has one, reads
            return notebook.progress(folder)
        except UserError as e:
            errors[folder] = e
            return {"folder": folder, "error": e.message if e.path == folder else str(e)}

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # each runs pytest: a core each
        reports = list(pool.map(report, dict.fromkeys(folders)))
    bad = [r["folder"] for r in reports if "error" in r]
    if len(reports) == 1 and bad:
        raise errors[bad[0]]
    if as_json:
        print("\n".join(json.dumps(report) for report in reports))
    else:
        print("\n".join(notebook.progress_lines(reports, table=len(reports) > 1)))
    if bad:
        fail(f"{plural(len(bad), 'folder')} of {len(reports)} could not be read ({', '.join(bad)}): "
             f"{'its row says' if len(bad) == 1 else 'their rows say'} why")
