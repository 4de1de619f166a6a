"""The exercise loop works in a classroom: every test the README names exists, and each
exercise, blanked by handout.py, fails its tests with a message naming it, and passes restored."""
import ast
import glob
import os
import re
import subprocess
import sys

import pytest

import handout
from conftest import HERE, ROOT


def readme_exercises():
    """{number: [test names]} from the README's "Exercises" section."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        section = f.read().split("\n## Exercises\n", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n(?=\d+\. \*\*)", section)
    return {int(item.split(".", 1)[0]): re.findall(r"`(?:tests/\w+\.py::)?(test_\w+)`", item)
            for item in items if re.match(r"\d+\. \*\*", item)}


def defined_tests():
    names = set()
    for path in glob.glob(os.path.join(HERE, "test_*.py")):
        with open(path, encoding="utf-8") as f:
            names |= {n.name for n in ast.walk(ast.parse(f.read())) if isinstance(n, ast.FunctionDef)}
    return {n for n in names if n.startswith("test_")}


def test_every_test_the_readme_names_exists():
    named = readme_exercises()
    assert sorted(named) == list(range(1, len(named) + 1)) and len(named) >= 12
    missing = sorted({t for tests in named.values() for t in tests} - defined_tests())
    assert not missing, f"the README names tests that do not exist, so their -k selects nothing: {missing}"


def test_the_readme_and_the_handout_name_the_same_tests():
    assert readme_exercises() == {n: tests for n, (_, _, tests) in handout.EXERCISES.items()}


def test_the_readme_gives_one_command_for_every_exercise():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        section = f.read().split("\n## Exercises\n", 1)[1].split("\n## ", 1)[0]
    assert "python -m pytest -q -k NAME" in section and "tests/test_model.py -k" not in section


def run_tests(folder, tests):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's modules, not ours
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", " or ".join(tests)],
                          cwd=folder, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("number", list(handout.EXERCISES))
def test_a_blanked_exercise_fails_its_tests_naming_the_exercise(tmp_path, number):
    title, functions, tests = handout.EXERCISES[number]
    folder = handout.write_handout(str(tmp_path / "class"), [number])
    r = run_tests(folder, tests)
    assert r.returncode == 1, r.stdout[-2000:]
    failed = re.findall(r"^FAILED \S+::(test_\w+)", r.stdout, re.M)
    assert set(failed) == set(tests), (failed, r.stdout[-2000:])
    assert f"exercise {number} ({title}): write" in r.stdout


def test_restored_every_exercise_passes(tmp_path):
    folder = handout.write_handout(str(tmp_path / "class"), [])
    tests = [t for _, _, ts in handout.EXERCISES.values() for t in ts]
    r = run_tests(folder, tests)
    assert r.returncode == 0, r.stdout[-2000:]
    assert re.search(r"^\d+ passed", r.stdout.splitlines()[-1])


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
                          ([str(tmp_path), "1"], "already exists and is not an empty folder")]:
        (tmp_path / "keep").write_text("x")
        r = run_handout(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "a").exists()


def test_a_handout_inside_the_project_does_not_copy_itself(tmp_path):
    project = tmp_path / "project"
    handout.write_handout(str(project), [])
    r = run_handout("class", "4", root=str(project))
    assert r.returncode == 0, r.stderr
    assert not (project / "class" / "class").exists()
    with open(project / "class" / "gpt2_numpy.py", encoding="utf-8") as f:
        assert "exercise 4 (the KV cache): write kv_append" in f.read()
