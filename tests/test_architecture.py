"""The import graph of `fedhet` has no circle (imports inside functions count too, and so do
the type-only imports under `if TYPE_CHECKING:`)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """Module → the fedhet modules it imports; with `type_only`, those under `if TYPE_CHECKING:`
    count too."""
    modules = {}
    for path in (SRC / "fedhet").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {  # `if TYPE_CHECKING:` imports never run
            id(n) for block in ast.walk(tree)
            if isinstance(block, ast.If) and getattr(block.test, "id", "") == "TYPE_CHECKING"
            for stmt in block.body for n in ast.walk(stmt)
        } if not type_only else set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from package import module` reaches the module, as `from package.module
                # import name` does (neither arrow runs to the package's `__init__` surface)
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                           else node.module for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_no_import_circles_even_through_type_only_imports():
    """A `TYPE_CHECKING` back-reference is a circle the layering hides: what a lower module
    needs of a higher one (a type) is declared below it instead (`algorithms.state.HasStates`,
    `training.steps.SGDConfig`)."""
    assert cycles(import_graph(type_only=True)) == []
    typed = import_graph(type_only=True)
    assert "fedhet.algorithms.base" not in typed["fedhet.algorithms.state"]
    assert "fedhet.training.local" not in typed["fedhet.training.steps"]


def test_tests_register_components_only_for_the_length_of_a_block():
    """`Registry.added` removes its entry afterwards and refuses a name that is taken; no test
    module registers into a global registry at import time."""
    import ast
    from pathlib import Path

    import pytest

    from fedhet.models.registry import MODELS
    from fedhet.registry import NoParams

    with MODELS.added("scoped-test", lambda *a: None, NoParams, "test only"):
        assert "scoped-test" in MODELS
        with pytest.raises(ValueError, match="registered twice"), MODELS.added("mlp", lambda *a: None):
            pass
    assert "scoped-test" not in MODELS and "mlp" in MODELS
    for path in Path(__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only
            for call in ast.walk(node):
                if isinstance(node, ast.FunctionDef | ast.ClassDef):
                    break
                is_register = (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                               and call.func.attr == "register")
                assert not is_register, f"{path.name}:{call.lineno} registers at import time"
            if isinstance(node, ast.FunctionDef):
                for deco in node.decorator_list:
                    target = deco.func if isinstance(deco, ast.Call) else deco
                    assert not (isinstance(target, ast.Attribute) and target.attr == "register"), (
                        f"{path.name}:{node.lineno} registers at import time"
                    )


def test_imports_inside_functions_say_why():
    """An import inside a function guards an optional extra or a slow import, and a comment on
    it or on the line above its block says which; anything else belongs at the top."""
    missing = []
    for path in (SRC / "fedhet").rglob("*.py"):
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            imports = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Import | ast.ImportFrom)),
                             key=lambda n: n.lineno)
            block_ok, prev_end = False, -1
            for node in imports:
                first = node.lineno != prev_end + 1
                above = lines[node.lineno - 2].strip()
                ok = "#" in lines[node.lineno - 1] or above.startswith("#") or (not first and block_ok)
                if not ok:
                    missing.append(f"{path.relative_to(SRC)}:{node.lineno}")
                block_ok, prev_end = ok, node.end_lineno
    assert missing == [], f"in-function imports without a reason: {missing}"


def absolute_imports(path: Path) -> list[tuple[int, str]]:
    """`(line, module)` of every absolute import in `path` (`import a.b`, `from a.b import c`)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


LOWER = ("engine", "data", "models", "algorithms", "training", "rundir")
UPPER = ("runs", "reports", "papers", "api", "deploy", "cli")


def test_the_layers_above_the_engine_use_only_the_interfaces_of_the_layers_below():
    """runs, reports, papers, the api, deploy and cli import the engine, data, models,
    algorithms, training and rundir layers only through what each offers (its package: `from
    fedhet.data import NAME`, `from fedhet.engine import NAME`), as a user's code reaches fedhet
    only through
    `fedhet/__init__.py`: never one of their modules directly."""
    reached = []
    for path in (SRC / "fedhet").rglob("*.py"):
        rel = path.relative_to(SRC / "fedhet")
        if rel.parts[0].removesuffix(".py") not in UPPER:
            continue
        for lineno, name in absolute_imports(path):
            parts = name.split(".")
            if len(parts) > 1 and parts[0] == "fedhet" and parts[1] in LOWER and parts[2:] != []:
                reached.append(f"{rel}:{lineno} {name}")
    assert reached == [], f"modules of lower layers imported directly: {reached}"


SURFACES_ABOVE = {"runs": ("reports", "papers", "api", "deploy", "cli"),
                  "reports": ("papers", "api", "deploy", "cli")}
"""The layers above `runs` and `reports` (and each layer below, the lower ones above) reach
them only through their package's names too."""


def test_the_layers_above_the_runs_and_reports_use_their_surfaces():
    """reports, papers, the api, deploy and the CLI import `fedhet.runs` names only from the
    package (`from fedhet.runs import execute`), and papers, the api, deploy and the CLI
    `fedhet.reports` names likewise: never one of their modules directly."""
    reached = []
    for path in (SRC / "fedhet").rglob("*.py"):
        rel = path.relative_to(SRC / "fedhet")
        above = rel.parts[0].removesuffix(".py")
        for lineno, name in absolute_imports(path):
            parts = name.split(".")
            if (parts[0] == "fedhet" and len(parts) > 2 and parts[1] in SURFACES_ABOVE
                    and above in SURFACES_ABOVE[parts[1]]):
                reached.append(f"{rel}:{lineno} {name}")
    assert reached == [], f"modules of runs/reports imported directly from above: {reached}"


def test_every_package_lists_what_it_offers():
    """`fedhet` and each of its packages names its public names in `__all__` (one way for every
    package: plain imports, or the lazy `TYPE_CHECKING` block, with `__all__`)."""
    inits = [SRC / "fedhet" / "__init__.py", *sorted((SRC / "fedhet").glob("*/__init__.py"))]
    unlisted = []
    for init in inits:
        tree = ast.parse(init.read_text())
        targets = [t for node in tree.body if isinstance(node, ast.Assign | ast.AnnAssign)
                   for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
        if not any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            unlisted.append(str(init.relative_to(SRC)))
    assert len(inits) > 10 and unlisted == [], f"packages without __all__: {unlisted}"


@pytest.mark.parametrize("package", ["fedhet", "fedhet.engine", "fedhet.runs", "fedhet.reports"])
def test_a_lazy_surface_lists_what_it_imports_and_names_no_module(package):
    """A lazy package's `__all__` is its `TYPE_CHECKING` block's names (what mypy sees is what
    runs), each one loads, and none is also the name of one of its modules: importing that
    module would put the module where the name was (`from fedhet.reports import screenshot`
    would give the module once `fedhet.reports.screenshot` was imported)."""
    import importlib

    from fedhet.lazy import sources

    module = importlib.import_module(package)
    offered = sources(module.__file__)
    assert sorted(offered) == sorted(n for n in module.__all__ if n != "__version__")
    folder = Path(module.__file__).parent
    submodules = {p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")}
    shadowed = sorted(n for n, (origin, attrs) in offered.items() if n in submodules and attrs)
    assert shadowed == [], f"{package} offers names of its own modules: {shadowed}"
    for name in module.__all__:
        getattr(module, name)


LAYERS = (
    ("fedhet", "errors", "procs", "lazy", "version"),
    ("registry", "rundir", "metrics"),
    ("data", "models", "training", "configs", "userdocs"),
    ("algorithms",),
    ("components",),
    ("plugins",),
    ("engine",),
    ("provenance",),
    ("runs", "testing"),
    ("reports",),
    ("papers",),
    ("api",),
    ("deploy",),
    ("cli",),
    ("__main__",),
)
"""Every part of `src/fedhet`, bottom up: a module imports only from its own part or the parts
below it. `fedhet` itself is the bottom: its `__init__` imports nothing until a public name is
first used (and `from fedhet import plugins` names a module, not the package's surface)."""


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_module_imports_only_from_its_own_layer_or_below():
    """No arrow runs back up the house, in any module of src/fedhet (the api, components,
    testing, plugins and provenance included), counting the imports inside functions."""
    level = {name: i for i, names in enumerate(LAYERS) for name in names}
    graph = import_graph()
    unknown = sorted({_part(m) for m in graph} - set(level))
    assert unknown == [], f"parts of src/fedhet with no place in LAYERS: {unknown}"
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                    if level[_part(d)] > level[_part(m)])
    assert upward == [], f"imports that run back up the layers: {upward}"


def test_the_run_directory_package_stands_on_errors_alone_and_reads_without_torch():
    """`fedhet.rundir` (the run directory's writer and readers) imports nothing of fedhet but
    `errors`, and a process that only reads runs never imports torch."""
    import subprocess
    import sys

    graph = import_graph()
    outside = sorted(f"{m} -> {d}" for m, deps in graph.items() if m.startswith("fedhet.rundir")
                     for d in deps if not d.startswith("fedhet.rundir") and d != "fedhet.errors")
    assert outside == [], f"fedhet.rundir imports other parts of fedhet: {outside}"
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, fedhet.rundir; print('torch' in sys.modules)"],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(SRC)},
    )
    assert probe.stdout.strip() == "False", probe.stderr


@pytest.mark.parametrize("module", ["fedhet", "fedhet.engine", "fedhet.runs", "fedhet.reports",
                                    "fedhet.runs.results", "fedhet.reports.seeds"])
def test_a_package_surface_and_the_table_makers_import_without_torch(module):
    """The engine's, runs' and reports' surfaces load a module only when one of its names is
    first used, and the results table (CSV in, CSV and markdown out) needs no torch: a process
    that only tabulates runs stays light."""
    import subprocess
    import sys

    probe = subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; print('torch' in sys.modules)"],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(SRC)},
    )
    assert probe.stdout.strip() == "False", probe.stderr


def test_a_surface_name_is_what_it_names_whichever_module_was_imported_first():
    """A package's lazy surface returns the function, also after its module was imported by
    its full path (a module named like a function it offers would shadow it)."""
    import fedhet.engine.assembly  # noqa: F401
    import fedhet.runs.comparison  # noqa: F401
    from fedhet.engine import assemble, federate
    from fedhet.runs import compare, execute

    assert all(callable(f) and not hasattr(f, "__path__") and type(f).__name__ == "function"
               for f in (assemble, federate, compare, execute))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_reaches_a_private_name_of_another():
    """A name with a leading underscore is its module's own: no module of src/fedhet imports
    one from another module (`from fedhet.x import _y`) or reads one through a module it
    imported (`x._y`); what a module shares is public, named and documented."""
    modules = set(import_graph())
    reached = []
    for path in sorted((SRC / "fedhet").rglob("*.py")):
        rel = path.relative_to(SRC)
        tree = ast.parse(path.read_text())
        imported = {}  # local name → the fedhet module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedhet"):
                for alias in node.names:
                    if _private(alias.name):
                        reached.append(f"{rel}:{node.lineno} {node.module}.{alias.name}")
                    if f"{node.module}.{alias.name}" in modules:
                        imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("fedhet"):
                        imported[alias.asname or alias.name.split(".")[0]] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and isinstance(node.value, ast.Name) and node.value.id in imported):
                reached.append(f"{rel}:{node.lineno} {imported[node.value.id]}.{node.attr}")
    assert reached == [], f"private names used outside their module: {reached}"


def test_the_private_name_check_finds_both_ways_of_reaching_one(tmp_path, monkeypatch):
    """The check above on a tree of two modules, one reaching the other's `_helper` twice."""
    package = tmp_path / "fedhet"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def _helper():\n    return 1\n")
    (package / "b.py").write_text("from fedhet import a\nfrom fedhet.a import _helper\n"
                                  "x = a._helper() + _helper()\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    with pytest.raises(AssertionError) as failed:
        test_no_module_reaches_a_private_name_of_another()
    assert "fedhet/b.py:2 fedhet.a._helper" in str(failed.value)
    assert "fedhet/b.py:3 fedhet.a._helper" in str(failed.value)
