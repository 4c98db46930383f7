"""Plugins: the user's own algorithms, models, datasets and partitions, on every command.

A plugin is a Python module that registers components when it is imported
(`@register_algorithm("my-avgm")`, ...). It is named in one of three ways, and loaded in this
order by `startup`:

- the entry-point group `fedhet.plugins` of an installed package (`[project.entry-points.
  "fedhet.plugins"] mine = "mypkg.fedhet_plugin"`): the module is imported;
- `$FEDHET_PLUGINS`, colon-separated specs;
- `--plugin SPEC` on the command line (repeatable).

A spec is a file (`my_algos.py`, any path) or a module name (`mypkg.algos`). A file is imported
under a module name derived from its absolute path (`module_name`), so the same file is one
module in every process (a grid's workers unpickle its classes by that name). While a plugin is
imported, its components record it as their `source` (`fedhet list` shows it).

Each run records the plugins loaded in the process that made it (`loaded`, in `config.json`'s
`plugins`; `provenance` adds the file each came from), and `ensure_recorded` imports them again
wherever a saved run is read: resume, report, `config show`, a grid's worker processes and Ray
tasks. A plugin that does not import is one `FedhetError` line naming it, where it was named,
the file it was loaded from, and the original error's last line.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from fedhet import registry
from fedhet.errors import FedhetError, one_line

ENV = "FEDHET_PLUGINS"
ENTRY_POINT_GROUP = "fedhet.plugins"

_LOADED: dict[str, str] = {}
"""Plugins imported in this process, in load order: spec → the file it was loaded from."""

_COMMAND_LINE = False


class PluginError(FedhetError):
    """A plugin that did not import; `cause` is the original error's last line."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def loaded() -> list[str]:
    """The specs of the plugins imported in this process, in load order (what a run records)."""
    return list(_LOADED)


def files() -> dict[str, str]:
    """Each loaded plugin's spec → the file it was loaded from (a run's provenance)."""
    return dict(_LOADED)


def for_run(config: Mapping[str, Any]) -> dict[str, str]:
    """What a run with settings `config` records (spec → file): every plugin loaded in this
    process, and the module of each of its components that came from neither fedhet nor a
    plugin but from a module a script imported (found again by name, as a plugin). A component
    defined in a script or notebook (`__main__`) cannot be imported again and is not recorded."""
    out = files()
    for entry in _entries_of(config):
        source = entry.source
        module = sys.modules.get(source)
        if module is None or source in out or in_script(source) or source.split(".")[0] == "fedhet":
            continue
        out[source] = str(getattr(module, "__file__", None) or source)
    return out


def in_script(source: str) -> bool:
    """Whether a component's `source` is the running script or notebook (`__main__`, also as
    fresh workers re-import it, `__mp_main__`): no other process can import it."""
    return source.split(" ")[0] in ("__main__", "__mp_main__")


def is_file_spec(spec: str) -> bool:
    """Whether `spec` names a file (ends in `.py`, or holds a path separator) and not a module."""
    return spec.endswith(".py") or any(sep in spec for sep in (os.sep, os.altsep) if sep)


def module_name(path: Path) -> str:
    """The module a plugin file is imported as: its stem and a digest of its absolute path,
    the same in every process (`fedhet_plugin_my_algos_3f2a9c1e0b`)."""
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    return f"fedhet_plugin_{stem}_{digest}"


def canonical(spec: str) -> str:
    """A spec as it is recorded: a file as its absolute path, a module name as given."""
    spec = spec.strip()
    return str(Path(spec).expanduser().resolve()) if is_file_spec(spec) else spec


def load(spec: str, origin: str = "--plugin", recorded: bool = False) -> str:
    """Import plugin `spec` (a file or a module name) once in this process; returns its recorded
    spec. `origin` says where it was named (`--plugin`, `$FEDHET_PLUGINS`, a config.json),
    for the error line of a plugin that fails to import. A plugin the user named that registers
    nothing is warned about; a `recorded` one (a saved run's) may hold only a `-m` factory or
    an algorithm class handed in by name, and is not."""
    spec = canonical(spec)
    if not spec:
        raise FedhetError(f"{origin}: an empty plugin name; give a module (mypkg.algos) or a "
                          "file (my_algos.py)")
    if spec in _LOADED:
        return spec
    with _source(f"plugin {spec}"):
        module = _import_file(Path(spec), origin) if is_file_spec(spec) \
            else _import_module(spec, origin)
    _LOADED[spec] = str(getattr(module, "__file__", None) or spec)
    if not recorded and not _registered_by(f"plugin {spec}"):  # the wrong file: say so
        print(f"warning: plugin {spec} (from {origin}) registered no algorithm, model, dataset, "
              "partition or metric; check that it is the right file", file=sys.stderr)
    return spec


def _registered_by(source: str) -> bool:
    """Whether any registered component records `source` (`plugin SPEC`)."""
    from fedhet.components import REGISTRIES  # lazy: the built-ins' registries import torch
    from fedhet.metrics import METRICS

    return any(entry.source == source for reg in (*REGISTRIES.values(), METRICS) for entry in reg)


def load_plugins(*specs: str) -> list[str]:
    """From Python, what `--plugin` does on the command line: import each plugin (a `.py` file
    or a module name), after the installed packages' entry points and `$FEDHET_PLUGINS`;
    returns every plugin now loaded. Runs made afterwards record them."""
    return startup(specs, "fedhet.load_plugins")


def load_all(specs: Iterable[str], origin: str) -> list[str]:
    """`load` each of `specs`; returns their recorded specs."""
    return [load(spec, origin) for spec in specs if spec.strip()]


def startup(cli_specs: Iterable[str] = (), origin: str = "--plugin") -> list[str]:
    """Load the installed packages' entry points (`fedhet.plugins`), then `$FEDHET_PLUGINS`,
    then `cli_specs` (named by `origin`); returns the specs now loaded."""
    for ep in _entry_points():
        spec = ep.module
        if spec not in _LOADED:
            dist = getattr(getattr(ep, "dist", None), "name", None)
            _load_entry_point(ep, f"entry point {ep.name!r}" + (f" of {dist}" if dist else ""))
    env = os.environ.get(ENV, "")
    load_all([s for s in env.split(os.pathsep) if s.strip()], f"${ENV}")
    load_all(cli_specs, origin)
    return loaded()


def ensure(specs: Iterable[str], where: str, recorded_files: Mapping[str, str] | None = None,
           still_needed: Callable[[], bool] | None = None) -> None:
    """Import recorded plugins `specs` that this process has not loaded (a saved run's, the
    grid parent's). `where` names the record (`runs/x/config.json`), `recorded_files` the file
    each was loaded from when recorded. A plugin that no longer imports is one line, unless
    `still_needed()` says the run's components are all known without it (the user gave the
    moved file with --plugin)."""
    for spec in specs:
        if spec in _LOADED:
            continue
        was = (recorded_files or {}).get(spec)
        try:
            try:
                load(spec, where, recorded=True)
            except PluginError:
                root = _root_of(spec, was)
                if root is None:
                    raise
                sys.path.append(root)  # the folder it was imported from, wherever we stand now
                importlib.invalidate_caches()
                load(spec, where, recorded=True)
        except PluginError as e:
            if still_needed is not None and not still_needed():
                continue
            loaded_from = f" (loaded from {was})" if was and was != spec else ""
            fix = ("give the file that now defines its components with --plugin"
                   if is_file_spec(spec) else
                   f"run from the folder that holds {spec.split('.')[0]!r}, or put that folder on "
                   "PYTHONPATH")
            raise FedhetError(
                f"plugin {spec}{loaded_from}, recorded in {where}, can no longer be imported: "
                f"{e.cause}; restore it, or {fix}"
            ) from None


def _root_of(spec: str, file: str | None) -> str | None:
    """The folder module `spec` was imported from, given the `file` it was loaded from
    (`/r/a/b.py` or `/r/a/b/__init__.py` for `a.b`: `/r`), when that file is still there."""
    if not file or is_file_spec(spec) or not Path(file).is_file():
        return None
    path = Path(file)
    if path.name == "__init__.py":
        path = path.parent
    parts = spec.split(".")
    if path.with_suffix("").parts[-len(parts):] != tuple(parts):
        return None
    root = str(path.parents[len(parts) - 1])
    return None if root in sys.path else root


def working_directory_importable() -> None:
    """Put the working directory first on the module path, as `python -m` does, so that
    `-m mymodels.nets:tiny` and `--plugin mypkg.algos` find the user's own folders."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def ensure_recorded(config: Mapping[str, Any], where: str | Path) -> None:
    """`ensure` the plugins a saved run's `config` (its `config.json`) records."""
    specs = config.get("plugins") or []
    if not isinstance(specs, list) or not specs:
        return
    prov = config.get("provenance")
    recorded = prov.get("plugins") if isinstance(prov, Mapping) else None
    ensure([str(s) for s in specs], str(where),
           recorded if isinstance(recorded, Mapping) else None,
           still_needed=lambda: _components_missing(config))


@contextlib.contextmanager
def command_line() -> Iterator[None]:
    """Mark this process, for the body, as fedhet's command line: every component it knows
    comes from fedhet or an importable plugin, so fresh worker processes can rebuild them
    (`from_command_line`); a grid started from Python may hold components only its own memory
    has (a script's, a notebook's)."""
    global _COMMAND_LINE
    previous, _COMMAND_LINE = _COMMAND_LINE, True
    try:
        yield
    finally:
        _COMMAND_LINE = previous


def from_command_line() -> bool:
    """Whether this process runs fedhet's command line (`command_line`)."""
    return _COMMAND_LINE


# -- importing -------------------------------------------------------------------------------
@contextlib.contextmanager
def _source(text: str) -> Iterator[None]:
    """Components registered in the body record `text` as their source; fedhet's own are
    registered before (a plugin's `import fedhet...` must not claim the built-ins)."""
    import fedhet.components  # noqa: F401  (lazy: the built-ins' registries import torch)

    registry.PLUGIN_SOURCE.append(text)
    try:
        yield
    finally:
        registry.PLUGIN_SOURCE.pop()


def _import_file(path: Path, origin: str) -> ModuleType:
    name = module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise PluginError(f"plugin {path} (from {origin}): no such file; check the path",
                          "no such file")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {path} (from {origin}): not a Python file; give a .py file",
                          "not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickle look their module up while it runs
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        sys.modules.pop(name, None)
        raise
    except BaseException as e:  # noqa: BLE001  (a plugin's own failure, SystemExit included)
        sys.modules.pop(name, None)
        raise _failed(str(path), origin, str(path), e) from None
    return module


def _import_module(spec: str, origin: str) -> ModuleType:
    try:
        return importlib.import_module(spec)
    except KeyboardInterrupt:
        raise
    except ModuleNotFoundError as e:
        if e.name is None or not (spec == e.name or spec.startswith(e.name + ".")):
            raise _failed(spec, origin, _module_file(spec), e) from None
        raise PluginError(
            f"plugin {spec} (from {origin}): no module named {e.name!r} on the Python path; "
            "install its package, add its folder to PYTHONPATH, or give its file (path/to/x.py)",
            f"no module named {e.name!r}") from None
    except BaseException as e:  # noqa: BLE001  (a plugin's own failure, SystemExit included)
        raise _failed(spec, origin, _module_file(spec), e) from None


def _load_entry_point(ep: Any, origin: str) -> None:
    spec = ep.module
    with _source(f"plugin {spec}"):
        try:
            ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001  (a plugin's own failure)
            raise _failed(spec, origin, _module_file(spec), e) from None
    module = sys.modules.get(spec)
    _LOADED[spec] = str(getattr(module, "__file__", None) or spec)


def _entry_points() -> list[Any]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _module_file(spec: str) -> str | None:
    """Where module `spec` would be loaded from, when that can be known without importing it."""
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        return None
    return found.origin if found is not None else None


def _failed(spec: str, origin: str, file: str | None, e: BaseException) -> PluginError:
    """The one line of a plugin that failed to import."""
    where = f" ({file})" if file and file != spec else ""
    line = _line_in(e, file)
    cause = one_line(e) + (f" (line {line})" if line else "")
    return PluginError(f"plugin {spec} (from {origin}){where} failed to import: {cause}; fix the "
                       "plugin, or leave it out", cause)


def _line_in(e: BaseException, file: str | None) -> int | None:
    """The line of the plugin file where `e` arose (the deepest frame in that file)."""
    if isinstance(e, SyntaxError) and e.filename == file:
        return e.lineno
    line = None
    for frame in traceback.extract_tb(e.__traceback__):
        if file is not None and frame.filename == file:
            line = frame.lineno
    return line


def _entries_of(config: Mapping[str, Any]) -> list[registry.Entry]:
    """The registered entries of the components and metrics a run's `config` names (those
    known here)."""
    from fedhet.metrics import METRICS  # lazy: NumPy, and this module serves the CLI's parser

    return _component_entries(config) + [METRICS.get(n) for n in _metric_names(config) if n in METRICS]


def _component_entries(config: Mapping[str, Any]) -> list[registry.Entry]:
    """The registered entries of the components a run's `config` names (those known here)."""
    # lazy: the registries import torch; this module is imported by the command line's parser
    from fedhet.components import COMPONENTS, REGISTRIES

    out = []
    for kind in COMPONENTS:
        name = config.get(kind)
        if isinstance(name, str) and name != "auto":
            with contextlib.suppress(FedhetError):
                out.append(REGISTRIES[kind].get(name))
    return out


def _metric_names(config: Mapping[str, Any]) -> list[str]:
    """The metrics a run's `config` names (`metrics`)."""
    names = config.get("metrics")
    return [n for n in names if isinstance(n, str)] if isinstance(names, list | tuple) else []


def in_process(config: Mapping[str, Any]) -> dict[str, str]:
    """Kind → name of the components of a run's `config` that exist only in this process (handed
    in from a script or notebook, `in_script`): what no later process can build again."""
    # lazy: the registries import torch; this module is imported by the command line's parser
    from fedhet.components import COMPONENTS, REGISTRIES

    out = {}
    for kind in COMPONENTS:
        name = config.get(kind)
        if isinstance(name, str) and name != "auto":
            with contextlib.suppress(FedhetError):
                if in_script(REGISTRIES[kind].get(name).source):
                    out[kind] = name
    return out


def script_metrics(config: Mapping[str, Any]) -> list[str]:
    """The metrics of a run's `config` registered by the running script or notebook
    (`in_script`): no later process knows them unless they are registered there again."""
    from fedhet.metrics import METRICS  # lazy, as in `_entries_of`

    return [n for n in _metric_names(config) if n in METRICS and in_script(METRICS.get(n).source)]


def script_sources(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Kind → where the code of each component of `config` that a script or notebook handed in
    (`in_process`) came from: its `name`, the `object` (`module.qualname`), and the `file` and
    `line` that define it (None where Python cannot say, as for a class typed at a prompt)."""
    from fedhet.components import REGISTRIES  # lazy, as in `in_process`

    out: dict[str, dict[str, Any]] = {}
    for kind, name in in_process(config).items():
        obj = REGISTRIES[kind].get(name).factory
        try:
            file: str | None = inspect.getsourcefile(obj)
            line: int | None = inspect.getsourcelines(obj)[1]
        except (OSError, TypeError):
            file, line = None, None
        qualname = getattr(obj, "__qualname__", type(obj).__qualname__)
        out[kind] = {"name": name, "object": f"{getattr(obj, '__module__', '?')}.{qualname}",
                     "file": str(Path(file).resolve()) if file else None, "line": line}
    return out


def _components_missing(config: Mapping[str, Any]) -> bool:
    """Whether a component or a metric a saved run names is not known in this process."""
    from fedhet.components import COMPONENTS  # lazy, as in `_entries_of`
    from fedhet.metrics import METRICS, sklearn_scorer_names

    named = [k for k in COMPONENTS if isinstance(config.get(k), str) and config.get(k) != "auto"]
    if len(_component_entries(config)) < len(named):
        return True
    unregistered = {n for n in _metric_names(config) if n not in METRICS}
    return bool(unregistered and unregistered - set(sklearn_scorer_names()))


__all__ = ["ENTRY_POINT_GROUP", "ENV", "command_line", "ensure", "ensure_recorded", "files",
           "for_run", "from_command_line", "load", "load_all", "load_plugins", "loaded",
           "script_metrics", "script_sources", "startup", "working_directory_importable"]
