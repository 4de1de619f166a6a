"""Nothing of an answer left in a handout's copy (issues 45 and 51): with each exercise blanked alone, nothing
else the copy holds (every file handout.py copies, tests/ included, as it writes them) spells out the blanked
code. Four searches:

- code, compared as code: each non-trivial statement and expression of the solution (at least MIN_NODES nodes),
  its local names made one placeholder (and so an item a local picks from a local, and what a comprehension
  runs over), against every function of the copy (so a renamed variable is still found: `centred = x -
  x.mean(...)` is `y = x - x.mean(...)`; sae.adam_step's norm over `grads[k] for k in grads` is grad_norm's);
- ingredients: a function that uses every distinctive thing the solution uses (its numbers but 0, 1, 2,
  its CONSTANTS and its np./math. functions, three at least, one not NumPy's; a backward's forward
  is given, not a leak): gelu_backward used gelu's
  tanh, √(2/π) and 0.044715; varint, read_varint's 0x7F, 0x80 and 7;
- strings that are code (a table of wrong answers, a script): compared as code, and each piece of one (at
  least MIN_CHARS characters) written as it stands in the solution: tests/wrong_answers.py's
  `(step + 1) / warmup`;
- text: a solution's statement written out in a comment, a docstring or any other file (docs/).

The files that hold the exercise's own tests are the exercise's statement written out (their references,
the mistakes they name) and are not searched for it; every other test is. The copies are made in memory with
handout.handout_edits and handout.replace_body, as write_handout makes them on disk."""
import ast
import builtins
import functools
import io
import keyword
import os
import re
import textwrap
import tokenize

import pytest

from conftest import ROOT
import handout

MIN_NODES = 10  # smaller, and x.reshape(-1, x.shape[-1]) or a max over the last axis would be an answer
MIN_CHARS = 12  # a piece of a solution, in a string: (step+1)/warmup is 15 without its spaces
TRIVIAL = {0, 1, 2, -1, 0.5}  # numbers that say nothing of a formula (3 does: x³, 3·0.044715)
SKIPPED = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)  # not counted as nodes


def handout_contents():
    """({path: source} of the .py files a handout holds, {path: text} of its other text files)."""
    code, other = {}, {}
    for f in handout.handout_files(ROOT):
        try:
            with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
                text = fh.read()
        except (UnicodeDecodeError, OSError):  # weights, arrays: not text
            continue
        (code if f.endswith(".py") else other)[f.replace(os.sep, "/")] = text
    return code, other


SOURCES, OTHER = handout_contents()


@functools.lru_cache(maxsize=None)
def tree_of(source):
    """A module's tree, parsed once for every search (nothing here changes it)."""
    return ast.parse(source)


@functools.lru_cache(maxsize=None)
def functions_of(source):
    """[(name, def node, its text)] of every function in a module, at any depth."""
    tree, lines = tree_of(source), source.splitlines()
    return [(n.name, n, "\n".join(lines[n.lineno - 1:n.end_lineno])) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def body(fn):
    return fn.body[1:] if ast.get_docstring(fn) is not None else fn.body


def shape(node, local, out):
    """(node's dump with every local name as _, its size in nodes), adding each statement's and
    expression's dump of at least MIN_NODES nodes to out ({dump: node}). An item a local picks from a
    local (grads[k]) is a local too, and what a comprehension runs over is left out: the formula is
    what it computes of each."""
    if isinstance(node, ast.Name):
        return ("_" if node.id in local else node.id), 1
    if isinstance(node, ast.arg):
        return "_", 1
    if isinstance(node, ast.Subscript) and all(isinstance(n, ast.Name) and n.id in local
                                               for n in (node.value, node.slice)):
        return "_", 3
    if isinstance(node, SKIPPED):
        return type(node).__name__, 0
    if not isinstance(node, ast.AST):
        return repr(node), 0
    parts, size = [], 1
    for field, value in ast.iter_fields(node):
        if isinstance(node, ast.comprehension) and field == "iter":
            parts.append("_")
            continue
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
              for n in ast.walk(tree_of(source)) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
              and ast.get_docstring(n, clean=False)]
    return [(where, squeeze(text)) for where, text in found]


def squeeze(text):
    return re.sub(r"\s+", "", text)


SQUEEZED = {f: squeeze(text) for f, text in OTHER.items()}  # the other files, searched for each exercise


def solution(number):
    """{dump: (function, node)} of an exercise's functions as the project writes them, each one's
    ingredients {function: set}, and each one's body without its spaces {function: text}."""
    prints, needs, bodies = {}, {}, {}
    for file, function in handout.functions(number):
        name, fn, text = next(f for f in functions_of(SOURCES[file]) if f[0] == function)
        prints |= {d: (function, node) for d, node in fingerprints(name, fn, text).items()}
        needs[function] = ingredients(name, fn, text)
        bodies[function] = code_text(text)
    return prints, needs, bodies


def code_text(text):
    """A function's code as written, without its spaces, comments or strings' contents ("rewards/margins" is
    no code)."""
    tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent(text)).readline)
    return "".join("''" if t.type == tokenize.STRING else t.string for t in tokens
                   if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT))


WORD = rf"\b(?!(?:{'|'.join(keyword.kwlist)})\b)[A-Za-z]{{2,}}"
PROSE = re.compile(rf"{WORD} {WORD} {WORD}\b")  # three words, none of them Python's


@functools.lru_cache(maxsize=None)
def code_strings(source):
    """[(the string without its spaces, its statements)]: each string of a module that is Python code doing
    something (a call, an operator, a subscript), docstrings aside."""
    tree = tree_of(source)
    documented = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef,
                  ast.ClassDef)) and ast.get_docstring(n, clean=False) is not None}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in documented \
                and len(squeeze(node.value)) >= MIN_CHARS and re.search(r"[(\[=*/+]", node.value) \
                and not PROSE.search(node.value):  # a message, a help: not worth parsing
            try:
                code = ast.parse(textwrap.dedent(node.value).strip())
            except (SyntaxError, ValueError):
                continue
            if any(isinstance(n, (ast.Call, ast.BinOp, ast.Subscript, ast.AugAssign)) for n in ast.walk(code)):
                found.append((squeeze(node.value), tuple(code.body)))
    return found


@functools.lru_cache(maxsize=None)
def module_names(source):
    """The names a module binds at its top level, and Python's builtins: what a string of code may name that
    is not its own."""
    names = set(dir(builtins))
    for node in ast.walk(tree_of(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    names |= {t.id for n in tree_of(source).body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name)}
    return frozenset(names)


STRING_PRINTS = {}


def string_prints(statements, known):
    """{dump} of a string's code, every name it does not know (known: the solution's module's) a local."""
    if (statements, known) not in STRING_PRINTS:
        local = {n.id for stmt in statements for n in ast.walk(stmt) if isinstance(n, ast.Name)} - known
        out = {}
        for stmt in statements:
            shape(stmt, local, out)
        STRING_PRINTS[statements, known] = set(out)
    return STRING_PRINTS[statements, known]


TESTS_IN = {f: set(re.findall(r"^def (test_\w+)", source, re.M)) for f, source in SOURCES.items()
            if f.startswith("tests/")}


def own_test_files(number):
    """The files under tests/ that define one of the exercise's tests: its statement, written out."""
    return {f for f, tests in TESTS_IN.items() if tests & set(handout.tests(number))}


def leaks(number, sources=None, other=None):
    """Where the copy with exercise `number` blanked alone gives some of it away: ["file: function: what"]."""
    edits = handout.handout_edits([number])
    sources = dict(sources or SOURCES)
    for file, function, new_body in edits:
        sources[file] = handout.replace_body(sources[file], function, new_body)
    edited = {(file, function) for file, function, _ in edits}
    prints, needs, bodies = solution(number)
    needs = {f: need for f, need in needs.items()
             if len(need) >= 3 and any(not i.startswith(("np.", "math.")) for i in need)}
    statements = {squeeze(ast.unparse(node)): f for f, node in prints.values() if isinstance(node, ast.stmt)}
    own_docstrings = {squeeze(ast.get_docstring(handout.function_node(tree_of(SOURCES[file]), f)) or "")
                      for file, f in handout.functions(number)}
    known = frozenset().union(*(module_names(SOURCES[file]) for file, _ in handout.functions(number)))
    found, skipped = [], own_test_files(number)
    for file, source in sources.items():
        if file in skipped:
            continue
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
        for text, code in code_strings(source):
            found += [f"{file}: a string holds {prints[d][0]}'s {ast.unparse(prints[d][1])}"
                      for d in string_prints(code, known) & prints.keys()]
            found += [f"{file}: a string holds {f}'s {text}" for f, whole in bodies.items()
                      if len(text) >= MIN_CHARS and text in whole]
    for file, text in (SQUEEZED if other is None else {f: squeeze(t) for f, t in other.items()}).items():
        found += [f"{file} holds {f}'s {code}" for code, f in statements.items() if code in text]
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


def test_the_search_reads_everything_a_handout_holds():
    """Issue 51: the search skipped tests/ and bench/ by design, but what a handout ships is what a student reads.
    It reads every file handout.py copies, tests/ and docs/ included; what it leaves behind (the teacher's answers,
    bench/) is not in the copy."""
    files = handout.handout_files(ROOT)
    assert {"tests/test_gpt2_numpy.py", "tests/conftest.py", "handout.py"} <= set(SOURCES)
    assert "docs/exercises.md" in OTHER
    assert set(SOURCES) | set(OTHER) <= {f.replace(os.sep, "/") for f in files}
    assert not [f for f in files if handout.left_behind(f)] and "tests/wrong_answers.py" not in SOURCES
    assert not any(f.startswith("bench/") for f in files)


def test_the_search_finds_what_a_handout_gave_away_in_issue_51():
    """What a handout shipped: tests/wrong_answers.py's wrong answers beside the right ones' lines, and
    tests/test_handout.py's wrong bodies (its topk_relu, the answer with np.abs(h) for h), now left behind;
    sae.adam_step's global norm, grad_norm's over `grads[k] for k in grads`, now a call to grad_norm. And a
    statement in another file (docs/), and in a test that is not the exercise's own."""
    shipped = {}
    for f in ("tests/wrong_answers.py", "tests/test_handout.py"):
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            shipped[f] = fh.read()
    for function, piece in [("learning_rate", "(step+1)/warmup"), ("clip_scale", "max_norm/(norm+1e-6)"),
                            ("merge_once", "rank,i=min(ranked)"), ("grad_norm", "float(np.vdot(a,a))"),
                            ("attention_scores", "scores[..., -n_queries:] += causal_mask(n_queries, like=scores)"),
                            ("topk_relu", "np.put_along_axis(f, top, np.maximum(np.take_along_axis(h, top, -1), 0.0), "
                                          "-1)")]:
        assert f"a string holds {function}'s {piece}" in "\n".join(leaks(exercise_of(function), {**SOURCES, **shipped}))
    norm = "def adam_norm(grads):\n    return math.sqrt(sum(float(np.vdot(grads[k], grads[k])) for k in grads))\n\n\n"
    assert "sae.py: adam_norm: grad_norm's math.sqrt(" in "\n".join(leaks(24, {
        **SOURCES, "sae.py": SOURCES["sae.py"].replace("def adam_step(", norm + "def adam_step(")}))
    shift = "def shifted(x):\n    return x - x.max(axis=-1, keepdims=True)\n\n\n"
    assert leaks(5, other={"docs/notes.md": "Subtract the max first: e = x - x.max(axis=-1, keepdims=True)."}) == [
        "docs/notes.md holds softmax's e=x-x.max(axis=-1,keepdims=True)"]
    for test_file, given_away in [("tests/test_gpt2_numpy.py", False), ("tests/test_bpe.py", True)]:  # 5's own: not
        found = leaks(5, {**SOURCES, test_file: shift + SOURCES[test_file]})
        assert any(f.startswith(f"{test_file}: shifted: softmax's") for f in found) == given_away, found
