"""No module a newcomer must scroll: a module of `src/fedhet` over `MODULE_LINES` lines, or a
function over `FUNCTION_LINES`, says why in its docstring, on a line starting `Size:`; the few
functions still waiting to be split are listed in `WAITING`, which may only shrink.

    python tests/test_sizes.py      # what is over each limit, and the reasons given

Lines are counted as `ast` reports them: a module's lines, a function's from its `def` to its
last line (decorators aside; a method or a nested function counts on its own).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

MODULE_LINES = 600
FUNCTION_LINES = 60

WAITING: dict[str, str] = {}
"""Functions over `FUNCTION_LINES` without a `Size:` line yet, each with why it waits; an entry
that is split (or gone) must leave the list."""


def size_reason(docstring: str | None) -> str | None:
    """The text after `Size:` on a line of `docstring`, or None when no line starts so."""
    for line in (docstring or "").splitlines():
        if line.strip().startswith("Size:"):
            return line.strip().removeprefix("Size:").strip() or None
    return None


def oversized(src: Path = SRC) -> tuple[dict[str, tuple[int, str | None]], dict[str, tuple[int, str | None]]]:
    """`(modules, functions)` over their limits under `src/fedhet`: name → (lines, the reason its
    docstring gives, or None). A function is named `path:Class.name`."""
    modules: dict[str, tuple[int, str | None]] = {}
    functions: dict[str, tuple[int, str | None]] = {}
    for path in sorted((src / "fedhet").rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        lines = len(text.splitlines())
        if lines > MODULE_LINES:
            modules[rel] = (lines, size_reason(ast.get_docstring(tree)))
        for name, node in _functions(tree):
            length = node.end_lineno - node.lineno + 1 if node.end_lineno else 0
            if length > FUNCTION_LINES:
                functions[f"{rel}:{name}"] = (length, size_reason(ast.get_docstring(node)))
    return modules, functions


def _functions(tree: ast.AST, prefix: str = ""):
    """`(qualified name, node)` of every function and method in `tree`, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def test_every_module_over_the_limit_says_why():
    modules, _ = oversized()
    unexplained = sorted(f"{m} ({n} lines)" for m, (n, why) in modules.items() if why is None)
    assert unexplained == [], (
        f"modules over {MODULE_LINES} lines without a `Size:` line in their docstring: {unexplained}; "
        "split them into modules with one job each, or say why they stay one piece"
    )


def test_every_function_over_the_limit_says_why_or_waits():
    _, functions = oversized()
    unexplained = sorted(f"{f} ({n} lines)" for f, (n, why) in functions.items()
                         if why is None and f not in WAITING)
    assert unexplained == [], (
        f"functions over {FUNCTION_LINES} lines without a `Size:` line in their docstring: "
        f"{unexplained}; split them where a name explains the part"
    )
    done = sorted(f for f in WAITING if f not in functions or functions[f][1] is not None)
    assert done == [], f"no longer waiting (split, or explained): remove them from WAITING: {done}"


def test_the_size_check_finds_a_long_module_and_a_long_method_and_reads_their_reasons(tmp_path):
    """The check on a tree of three modules: one too long without a reason, one too long with
    one, and a short one holding a long method."""
    package = tmp_path / "fedhet"
    package.mkdir()
    filler = "x = 1\n" * MODULE_LINES
    (package / "long.py").write_text('"""A module."""\n' + filler)
    (package / "said.py").write_text('"""A module.\n\nSize: one table, read as one.\n"""\n' + filler)
    body = "        y = 1\n" * FUNCTION_LINES
    (package / "short.py").write_text(f"class A:\n    def step(self):\n{body}\n"
                                      f"    def said(self):\n        '''Size: a loop.'''\n{body}")
    modules, functions = oversized(tmp_path)
    assert modules == {"fedhet/long.py": (MODULE_LINES + 1, None),
                       "fedhet/said.py": (MODULE_LINES + 4, "one table, read as one.")}
    assert functions == {"fedhet/short.py:A.step": (FUNCTION_LINES + 1, None),
                         "fedhet/short.py:A.said": (FUNCTION_LINES + 2, "a loop.")}


if __name__ == "__main__":
    modules, functions = oversized()
    for title, found, limit in (("modules", modules, MODULE_LINES), ("functions", functions, FUNCTION_LINES)):
        print(f"{title} over {limit} lines: {len(found)}")
        for name, (n, why) in sorted(found.items(), key=lambda item: -item[1][0]):
            print(f"  {n:5d}  {name}: {why or WAITING.get(name) or 'NO REASON GIVEN'}")
    sys.exit(0)
