"""Python objects as components: the name a dataset, model factory or algorithm class handed to
`fedhet.run` (or `compare`, `assemble`) runs under, and how it is found again later.

- Already registered (a built-in, a plugin's, one registered with `register_*`): its name.
- A model factory or an `Algorithm` subclass defined in an importable module: the spec
  `package.module:Name`, which the registries resolve by importing the module (the model
  resolver in `fedhet.models.imported`, the algorithm resolver below). `config.json` records the
  spec, so `resume`, `report`, grid workers and Ray tasks find it in any process.
- Defined in a script or notebook (`__main__`), and every in-memory `Dataset`: registered in
  this process under its own name (`Dataset.name`, the factory's `__name__`, the class's `name`
  or lower-cased class name). Grid workers forked from this process inherit it; a later process
  needs the object handed in again (`fedhet.resume(dir, algorithm=MyAlgorithm)`) or the code
  moved into a plugin module.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from collections.abc import Callable
from typing import Any

from fedhet.algorithms.base import ALGORITHMS, Algorithm
from fedhet.data.base import Dataset
from fedhet.data.partition import PARTITIONS
from fedhet.data.registry import DATASETS
from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS
from fedhet.registry import PLUGIN_SOURCE, Entry, NoParams, Registry

COMPONENTS = ("algorithm", "dataset", "partition", "model")
"""The kinds of component a run names, in the order its settings list them."""

REGISTRIES: dict[str, Registry] = {
    "algorithm": ALGORITHMS, "dataset": DATASETS, "partition": PARTITIONS, "model": MODELS,
}
"""The one table of registries, by kind (the engine's settings, plugins and `name_of` read it)."""

HANDED_IN = ("algorithm", "dataset", "model")
"""The kinds a user may hand in as Python objects (`name_of`); a partition is named."""

_LIVE: dict[tuple[str, str], Any] = {}
"""(kind, name) → the object an in-process registration stands for (replaced when a notebook
cell hands in a new object under the same name)."""


def name_of(kind: str, obj: Any) -> str:
    """The name `obj` (a `Dataset`, a model factory, an `Algorithm` subclass) runs under as
    the `kind` component (`dataset`, `model`, `algorithm`); see the module docstring."""
    if kind not in HANDED_IN:
        raise FedhetError(f"a {kind} is named, not handed in as an object: give its name")
    registry = REGISTRIES[kind]
    check = {"dataset": _check_dataset, "model": _check_model, "algorithm": _check_algorithm}[kind]
    check(obj)
    for entry in registry:
        if entry.factory is obj:
            return entry.name
    if kind != "dataset" and _importable(obj):
        return f"{obj.__module__}:{obj.__qualname__}"
    return _register_live(kind, obj)


def _check_dataset(obj: Any) -> None:
    if not isinstance(obj, Dataset):
        raise FedhetError(
            f"dataset must be a name, a path or a Dataset (fedhet.from_arrays(...)), got "
            f"{type(obj).__name__}"
        )


def _check_model(obj: Any) -> None:
    if not callable(obj):
        raise FedhetError(
            "model must be a name, 'package.module:factory' or a factory "
            f"(input_shape, num_classes, params) -> nn.Module, got {type(obj).__name__}"
        )


def _check_algorithm(obj: Any) -> None:
    if not (inspect.isclass(obj) and issubclass(obj, Algorithm)):
        raise FedhetError(
            f"algorithm must be a name or a subclass of fedhet.Algorithm, got {obj!r}; an "
            "instance is built by the run itself: pass the class"
        )


def _importable(obj: Any) -> bool:
    """Whether `module:qualname` finds `obj` again in another process."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:  # a script, a lambda, a closure
        return False
    mod = sys.modules.get(module)
    return mod is not None and getattr(mod, "__file__", None) is not None


def _live_name(kind: str, obj: Any) -> str:
    if kind == "dataset":
        return obj.name
    if kind == "algorithm":
        return getattr(obj, "name", "") or obj.__name__.lower()
    name = getattr(obj, "__name__", "")
    return name if name and name != "<lambda>" else "custom-model"


def _register_live(kind: str, obj: Any) -> str:
    """Register `obj` in this process under its own name; a name fedhet or a plugin already
    uses is refused, the same name handed in again (a re-run notebook cell) is replaced."""
    registry = REGISTRIES[kind]
    name = _live_name(kind, obj)
    if (kind, name) in _LIVE:
        registry.unregister(name)
    elif name in registry:
        raise FedhetError(
            f"{kind} name {name!r} is taken by {registry.get(name).source}; give yours another "
            "name" + (" (from_arrays(..., name=...))" if kind == "dataset" else "")
        )
    _LIVE[kind, name] = obj
    PLUGIN_SOURCE.append("__main__ (this process)")
    try:
        if kind == "dataset":
            traits = {"default_model": obj.meta.get("default_model", "mlp")}
            registry.register(name, NoParams, f"in-memory data {name}", **traits)(_dataset_loader(obj))
        elif kind == "model":
            registry.register(name, getattr(obj, "params", NoParams), _doc(obj))(obj)
        else:
            registry.register(name, params_of(obj), _doc(obj))(obj)
    finally:
        PLUGIN_SOURCE.pop()
    return name


def _dataset_loader(data: Dataset) -> Callable[[Any, Any], Dataset]:
    def load(params: Any, data_dir: Any) -> Dataset:
        return data

    return load


def _doc(obj: Any) -> str:
    return (inspect.getdoc(obj) or "").split("\n")[0]


def params_of(cls: type[Algorithm]) -> type:
    """An algorithm class's parameter dataclass: its `Params` attribute, else that of the nearest
    registered base class (a FedAvg subclass takes FedAvg's settings), else none."""
    own = getattr(cls, "Params", None)
    if own is not None and dataclasses.is_dataclass(own) and isinstance(own, type):
        return own
    if own is not None:
        raise FedhetError(
            f"{cls.__name__}.Params is {own!r}, not a dataclass class: define its settings as "
            "@dataclass(frozen=True) class MyParams: gamma: float = 0.9, and set Params = MyParams"
        )
    for base in cls.__mro__[1:]:
        for entry in ALGORITHMS:
            if entry.factory is base:
                return entry.params
    return NoParams


@ALGORITHMS.resolver
def _algorithm_spec(name: str) -> Entry | None:
    """`package.module:Class` → that `Algorithm` subclass, imported."""
    obj = import_spec(name, "algorithm")
    if obj is None:
        return None
    _check_algorithm(obj)
    return Entry(name, obj, params_of(obj), _doc(obj), source=name.partition(":")[0])


def import_spec(spec: str, kind: str) -> Any:
    """The object `package.module:attr.path` names, or None when `spec` has no such shape; an
    import that fails is one line naming the module and the error."""
    module, colon, attr = spec.partition(":")
    if not colon or not module or not attr or not all(
        part.isidentifier() for part in [*module.split("."), *attr.split(".")]
    ):
        return None
    try:
        obj: Any = importlib.import_module(module)
    except Exception as e:  # the user's module: any error of theirs is one line
        raise FedhetError(
            f"{kind} {spec!r}: cannot import {module} ({type(e).__name__}: {e}); put its folder "
            "on PYTHONPATH, or load it with --plugin FILE.py"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise FedhetError(f"{kind} {spec!r}: module {module} has no {attr}")
        obj = getattr(obj, part)
    return obj
