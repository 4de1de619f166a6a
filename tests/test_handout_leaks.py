"""Nothing of an answer left in a handout's copy (issue 45): with each exercise blanked alone, no other line of
the copy (every .py outside tests/, as handout.py writes it) spells out the blanked code. Three searches:

- code, compared as code: each non-trivial statement and expression of the solution (at least MIN_NODES nodes),
  its local names made one placeholder, against every function of the copy (so a renamed variable is still
  found: `centred = x - x.mean(...)` is `y = x - x.mean(...)`);
- ingredients: a function that uses every distinctive thing the solution uses (its numbers but 0, 1, 2,
  its CONSTANTS and its np./math. functions, three at least, one not NumPy's; a backward's forward
  is given, not a leak): gelu_backward used gelu's
  tanh, √(2/π) and 0.044715; varint, read_varint's 0x7F, 0x80 and 7;
- text: a solution's statement written out in a comment or a docstring.

A test's own copy of an answer is the teacher's (tests/ is not searched). The copies are made in memory with
handout.handout_edits and handout.replace_body, as write_handout makes them on disk."""
import ast
import functools
import io
import os
import re
import tokenize

import pytest

from conftest import ROOT
import handout

MIN_NODES = 10  # smaller, and x.reshape(-1, x.shape[-1]) or a max over the last axis would be an answer
TRIVIAL = {0, 1, 2, -1, 0.5}  # numbers that say nothing of a formula (3 does: x³, 3·0.044715)
SKIPPED = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)  # not counted as nodes


def project_sources():
    """{path: source} of every .py file of the project outside tests/."""
    files = handout.tracked_files(ROOT)
    if files is None:  # a handout's folder, not a git checkout
        files = [os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(ROOT) for f in fs]
    sources = {}
    for f in sorted(files):
        if f.endswith(".py") and not f.startswith("tests" + os.sep) and not f.startswith("tests/"):
            with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
                sources[f.replace(os.sep, "/")] = fh.read()
    return sources


SOURCES = project_sources()


@functools.lru_cache(maxsize=None)
def functions_of(source):
    """[(name, def node, its text)] of every function in a module, at any depth."""
    tree, lines = ast.parse(source), source.splitlines()
    return [(n.name, n, "\n".join(lines[n.lineno - 1:n.end_lineno])) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def body(fn):
    return fn.body[1:] if ast.get_docstring(fn) is not None else fn.body


def shape(node, local, out):
    """(node's dump with every local name as _, its size in nodes), adding each statement's and
    expression's dump of at least MIN_NODES nodes to out ({dump: node})."""
    if isinstance(node, ast.Name):
        return ("_" if node.id in local else node.id), 1
    if isinstance(node, ast.arg):
        return "_", 1
    if isinstance(node, SKIPPED):
        return type(node).__name__, 0
    if not isinstance(node, ast.AST):
        return repr(node), 0
    parts, size = [], 1
    for _, value in ast.iter_fields(node):
        for v in (value if isinstance(value, list) else [value]):
            d, n = shape(v, local, out)
            parts.append(d)
            size += n
    dump = f"{type(node).__name__}({','.join(parts)})"
    if size >= MIN_NODES and isinstance(node, (ast.stmt, ast.expr)) and not isinstance(node, ast.FunctionDef):
        out.setdefault(dump, node)
    return dump, size


PRINTS = {}


def fingerprints(name, fn, text):
    """{dump: node} of a function's non-trivial statements and expressions, its locals renamed (cached by text)."""
    if (name, text) not in PRINTS:
        local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        out = {}
        for stmt in body(fn):
            shape(stmt, local, out)
        PRINTS[name, text] = out
    return PRINTS[name, text]


INGREDIENTS = {}


def ingredients(name, fn, text):
    """The distinctive things a function's body uses: numbers (not TRIVIAL), CONSTANTS, np. and math. functions."""
    if (name, text) not in INGREDIENTS:
        out = set()
        for n in (n for stmt in body(fn) for n in ast.walk(stmt)):
            if isinstance(n, ast.Constant) and type(n.value) in (int, float) and n.value not in TRIVIAL:
                out.add(repr(float(n.value)))  # 3 and 3.0 alike
            elif isinstance(n, ast.Name) and n.id.isupper() and len(n.id) > 1:
                out.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("np", "math"):
                out.add(f"{n.value.id}.{n.attr}")
        INGREDIENTS[name, text] = frozenset(out)
    return INGREDIENTS[name, text]


@functools.lru_cache(maxsize=None)
def texts(source):
    """[(where, text without whitespace)]: each comment and docstring of a module."""
    found = [("a comment", t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]
    found += [(f"{getattr(n, 'name', 'the module')}'s docstring", ast.get_docstring(n, clean=False))
              for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
              and ast.get_docstring(n, clean=False)]
    return [(where, squeeze(text)) for where, text in found]


def squeeze(text):
    return re.sub(r"\s+", "", text)


def solution(number):
    """{dump: (function, node)} of an exercise's functions as the project writes them, and each one's
    ingredients {function: set}."""
    prints, needs = {}, {}
    for file, function in handout.functions(number):
        name, fn, text = next(f for f in functions_of(SOURCES[file]) if f[0] == function)
        prints |= {d: (function, node) for d, node in fingerprints(name, fn, text).items()}
        needs[function] = ingredients(name, fn, text)
    return prints, needs


def leaks(number, sources=None):
    """Where the copy with exercise `number` blanked alone gives some of it away: ["file: function: what"]."""
    edits = handout.handout_edits([number])
    sources = dict(sources or SOURCES)
    for file, function, new_body in edits:
        sources[file] = handout.replace_body(sources[file], function, new_body)
    edited = {(file, function) for file, function, _ in edits}
    prints, needs = solution(number)
    needs = {f: need for f, need in needs.items()
             if len(need) >= 3 and any(not i.startswith(("np.", "math.")) for i in need)}
    statements = {squeeze(ast.unparse(node)): f for f, node in prints.values() if isinstance(node, ast.stmt)}
    own_docstrings = {squeeze(ast.get_docstring(handout.function_node(ast.parse(SOURCES[file]), f)) or "")
                      for file, f in handout.functions(number)}
    found = []
    for file, source in sources.items():
        for name, fn, text in functions_of(source):
            if (file, name) in edited:
                continue
            found += [f"{file}: {name}: {prints[d][0]}'s {ast.unparse(prints[d][1])}"
                      for d in fingerprints(name, fn, text).keys() & prints.keys()]
            found += [f"{file}: {name}: uses all of {f}'s {', '.join(sorted(need))}" for f, need in needs.items()
                      if need <= ingredients(name, fn, text) and f != f"{name}_backward"]  # a backward's forward
        for where, text in texts(source):
            found += [f"{file}: {where} holds {f}'s {code}" for code, f in statements.items()
                      if text not in own_docstrings and code in text]
    return found


def exercise_of(function):
    return next(n for n in handout.EXERCISES if any(f == function for _, f in handout.functions(n)))


@pytest.mark.parametrize("number", list(handout.EXERCISES))
def test_a_blanked_exercise_leaves_no_answer_in_the_copy(number):
    found = leaks(number)
    assert not found, f"exercise {number} is given away in its handout:\n" + "\n".join(found)


def test_the_search_finds_what_gave_answers_away():
    """The search finds each kind of leak issue 45 found: another function with the same statement (softmax's
    max subtraction in log_softmax), the same ingredients (gelu's tanh form in gelu_backward, read_varint's
    layout in varint), and a comment holding the code."""
    def found(function, file, before, added):
        """The leaks of function's exercise with `added` written into file before `before`."""
        assert before in SOURCES[file], before
        return "\n".join(leaks(exercise_of(function), {**SOURCES, file: SOURCES[file].replace(before, added + before)}))

    assert "log_softmax_again: softmax's e = x - x.max" in found("softmax", "gpt2_numpy.py", "def log_softmax(", (
        "def log_softmax_again(x):\n    shifted = x - x.max(axis=-1, keepdims=True)\n    return shifted\n\n\n"))
    assert "gelu_backward_again: uses all of gelu's 3.0, GELU_CUBIC, SQRT_2_OVER_PI, np.tanh" in found(
        "gelu", "backward.py", "def gelu_backward(", (
            "def gelu_backward_again(x, dy):\n    t = np.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_CUBIC * x * x))\n"
            "    return dy * (1.0 + t + x * (1.0 - t * t) * (1.0 + 3.0 * GELU_CUBIC * x * x))\n\n\n"))
    assert "a comment holds gelu's" in found("gelu", "gpt2_numpy.py", "def gelu_fast(", (
        "# as gelu does it: return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x ** 3)))\n"))
    assert "varint_again: uses all of read_varint's 127.0, 128.0, 7.0" in found(
        "read_varint", "plumbing/checkpoint.py", "def varint(", (
            "def varint_again(value):\n    out = []\n    while value >= 0x80:\n"
            "        out.append(value & 0x7F | 0x80)\n        value >>= 7\n    return out\n\n\n"))
