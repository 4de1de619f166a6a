"""The command line of handout.py: list the exercises, or write a copy with some left to do.

    python handout.py --list          # the exercises, their functions and tests, where each runs
    python handout.py class/ 1 4 9    # a copy with exercises 1, 4 and 9 to do (none given: all)
    python handout.py class/ 1-6 9-12 # ranges, as handout.py prints them ("1-6, 9-12" too)

Exit status: 0 done, 2 a user's mistake (one line on stderr), 130 interrupted (Ctrl-C or
SIGTERM), with no half-written copy left behind.
"""
import argparse
import os

import handout
from plumbing.errors import exit_status, fail


def main(argv=None):
    p = argparse.ArgumentParser(prog="handout.py", description="Write a copy of the project with exercises left to do.")
    p.add_argument("out", nargs="?", help="a new (or empty) folder for the copy")
    p.add_argument("numbers", nargs="*", type=exercise_numbers,
                   help="the exercises: 4, or a range 1-6 (default: all)")
    p.add_argument("--list", action="store_true", help="list the exercises")
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
    """--list (or no folder): every exercise; else the copy, and what each program then needs done."""
    if args.list or not args.out:
        for number, (title, fns, _, where) in handout.EXERCISES.items():
            tests = ", ".join(handout.tests(number))
            print(f"{number:>2}. {title}: {', '.join(f for _, f, _ in fns)}  (tests: {tests}; runs in {handout.WHERE[where]})")
        print()
        print("\n".join(handout.programs_waiting(list(handout.EXERCISES))))
        return
    numbers = args.numbers or list(handout.EXERCISES)
    handout.write_handout(args.out, numbers)
    print(f"{args.out}: exercises {', '.join(map(str, numbers))} to do; "
          f"run the tests there with python -m pytest -q -k NAME")
    models = os.path.join(handout.HERE, "models")
    print(f"the models stay in {models}, not copied: in the copy, give --model {models}/NAME "
          f"(or --models-dir {models})")
    print("\n".join(handout.programs_waiting(numbers)))
