"""The command line of handout.py: list the exercises, or write a copy with some left to do.

    python handout.py --list          # the exercises, their functions and tests, where each runs
    python handout.py class/ 1 4 9    # a copy with exercises 1, 4 and 9 to do (none given: all)
    python handout.py class/ 1-6 9-12 # ranges, as handout.py prints them ("1-6, 9-12" too)
    python handout.py class/ 1 9 --notebook [--model MODEL]   # and class/exercises.ipynb
    python handout.py --progress class/ [alice/ bob/ ...] [--json]   # done, failing, not started

Exit status: 0 done, 2 a user's mistake (one line on stderr), 130 interrupted (Ctrl-C or
SIGTERM), with no half-written copy left behind.
"""
import argparse
import concurrent.futures
import functools
import json
import os

import handout
from interface import notebook
from interface.options import SIZES
from plumbing import shapes
from plumbing.errors import UserError, exit_status, fail
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
                                   "hf:owner/name (default: 124M, as the commands')")
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
        model = notebook_model(args.model)
        handout.write_handout(args.out, numbers, record={"model": model, "models_dir": default_models_dir()},
                              more=functools.partial(notebook.write_notebook, numbers=numbers, model=model,
                                                   name=os.path.basename(os.path.abspath(args.out))))
    else:
        handout.write_handout(args.out, numbers)
    print(f"{args.out}: exercises {', '.join(map(str, numbers))} to do; "
          f"run the tests there with python -m pytest -q -k NAME")
    models = os.path.join(handout.HERE, "models")
    print(f"the models stay in {models}, not copied: in the copy, give --model {models}/NAME "
          f"(or --models-dir {models})")
    print("\n".join(handout.programs_waiting(numbers)))
    if args.notebook:
        print(f"open {os.path.join(args.out, handout.NOTEBOOK)} from {args.out} (Jupyter, VS Code, or Colab with the "
              f"folder uploaded): each exercise's check and program are a cell there")


def check_flags(args):
    """The flags that go together, before any work."""
    if args.progress and (args.out or args.numbers or args.notebook or args.model or args.list):
        fail("--progress takes handout folders alone: python handout.py --progress CLASS [CLASS ...] [--json]")
    if args.json and not args.progress:
        fail("--json goes with --progress")
    if args.model and not args.notebook:
        fail("--model names the notebook's model: give --notebook too")
    if args.notebook and not (args.out and args.numbers):
        fail("--notebook needs a folder and the exercises to hand out: python handout.py CLASS 1 9 --notebook")


def notebook_model(model):
    """--model as the notebook's cells will give it, from the handout's folder: a folder or file by its
    absolute path; a size or hf:owner/name as it is. Anything else is refused now, not in the notebook."""
    if not model:
        return "124M"
    if os.path.exists(model):
        return os.path.abspath(model)
    if model in shapes.SIZES or model.startswith("hf:"):
        return model
    raise UserError(f"--model {model}: no such model folder or file, and not a size ({SIZES}) or hf:owner/name")


def show_progress(folders, as_json):
    """Each folder's exercises; every folder is checked to be a handout before any test runs."""
    for folder in folders:
        notebook.read_record(folder)
        notebook.saved_cells(folder)  # its notebook, if it has one, reads
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # each runs pytest: a core each
        reports = list(pool.map(notebook.progress, folders))
    if as_json:
        print("\n".join(json.dumps(report) for report in reports))
    else:
        print("\n".join(notebook.progress_lines(reports)))
