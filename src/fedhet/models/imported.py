"""Your own model by name: `model = "package.module:factory"` (`-m package.module:factory`).

Any callable that builds an `nn.Module` is a model, without registering it:

    # mymodels.py, in a folder on PYTHONPATH (the current directory, for `python -m fedhet`)
    def wide_mlp(input_shape, num_classes, hidden=128, depth=2):
        ...
        return net

    fedhet run -d digits -m mymodels:wide_mlp --set model.hidden=16

The convention: such a factory is called `factory(input_shape, num_classes, **kwargs)`, where the
keyword arguments are the model's parameters. They are read from the factory's signature
(every parameter after the first two): its defaults are the parameters' defaults, and its
annotations, or else the types of the defaults, type the values given with
`--set model.<name>=VALUE`, so `hidden=16` arrives as the integer 16, a misspelt name is refused
with the names the factory takes, and `config.json` records them for `--resume` and reports.
A factory that also takes `**kwargs` accepts any other name as well (`OpenParams`). A factory
whose third parameter is `params` (`factory(input_shape, num_classes, params)`, the signature of
registered factories and of one handed to `fedhet.run(model=...)`) is called so, with every
`--set model.<name>=VALUE` as an attribute of `params`. A factory registered with
`MODELS.register(name, ParamsClass)` is called with its own parameter dataclass.

The name itself says where the model lives, so a resumed run, a report, a grid's worker
process or a forked `--workers` process finds it again wherever the module can be imported.
Each failure is one line: the module cannot be imported, it has no such attribute, the attribute
is not callable, the factory raised, or it returned something other than an `nn.Module`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from torch import nn

from fedhet.errors import FedhetError, one_line
from fedhet.models.registry import MODELS
from fedhet.registry import Entry, OpenParams, did_you_mean, literal

REQUIRED = "<required>"
"""The default of a factory keyword without one: `validate` asks the user to set it."""


def split_spec(spec: str) -> tuple[str, str] | None:
    """`("package.module", "factory")` for `package.module:factory`; None for any other name."""
    module, colon, attr = spec.partition(":")
    if not colon:
        return None
    if not module.strip() or not attr.strip() or ":" in attr:
        raise FedhetError(
            f"model {spec!r}: write package.module:factory (a module on PYTHONPATH, a colon, "
            "and the function or class that builds the model)"
        )
    return module.strip(), attr.strip()


def import_factory(spec: str, module_name: str, attr: str) -> Callable[..., Any]:
    """The callable `attr` (dots allowed: `Class.method`) of module `module_name`."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise FedhetError(
                f"model {spec!r}: no module named {module_name!r}; run from the folder that "
                "holds it, put that folder on PYTHONPATH, or install its package"
            ) from None
        raise FedhetError(f"model {spec!r}: importing {module_name} failed: {one_line(e)}") from None
    except Exception as e:  # noqa: BLE001  (the user's module failed as it was imported)
        raise FedhetError(f"model {spec!r}: importing {module_name} failed: {one_line(e)}") from None
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            where = getattr(module, "__file__", None) or module_name
            names = [n for n in dir(value) if not n.startswith("_") and callable(getattr(value, n))]
            raise FedhetError(
                f"model {spec!r}: {module_name} ({where}) has no attribute {attr!r}"
                f"{did_you_mean(attr, names)}"
            )
        value = getattr(value, part)
    if not callable(value):
        raise FedhetError(
            f"model {spec!r}: {module_name}.{attr} is not callable (an object of type "
            f"{type(value).__name__}); give a function or class that builds the model: "
            "factory(input_shape, num_classes, **kwargs) -> nn.Module"
        )
    return value


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    for eval_str in (True, False):
        try:
            return inspect.signature(fn, eval_str=eval_str)
        except (NameError, TypeError, ValueError):
            continue
    return None


SIMPLE = (bool, int, float, str)


def _plain(value: Any) -> bool:
    """Whether a default can be written to `config.json` and given with `--set`."""
    if value is None or type(value) in SIMPLE:
        return True
    return isinstance(value, list | tuple) and all(_plain(v) for v in value)


def _field_type(param: inspect.Parameter) -> Any:
    """The type `--set` values are coerced to: the annotation (when it is a type, not a string
    that could not be resolved), else the type of the default, else `Any`."""
    if param.annotation is not inspect.Parameter.empty and not isinstance(param.annotation, str):
        return param.annotation
    if param.default is not inspect.Parameter.empty and type(param.default) in SIMPLE:
        return type(param.default)
    return Any


def params_class(spec: str, fn: Callable[..., Any]) -> type:
    """The parameter dataclass of factory `fn`: one field per keyword it takes after
    `(input_shape, num_classes)`, an `OpenParams` when it takes `**kwargs`."""
    sig = _signature(fn)
    if sig is None:  # a builtin without a signature: any names, as with **kwargs
        return dataclasses.make_dataclass("ModelKwargs", [], bases=(OpenParams,), frozen=True)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = list(sig.parameters.values())
    leading = [p for p in params[:2] if p.kind in positional]
    takes_star_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if len(leading) < 2 and not takes_star_args:
        raise FedhetError(
            f"model {spec!r}: the factory takes {sig}; a model factory is called "
            "factory(input_shape, num_classes, params), or with its settings as keywords "
            "(fedhet docs plugins)"
        )
    if _takes_params(params):
        return dataclasses.make_dataclass("ModelParams", [], bases=(OpenParams,), frozen=True)
    fields: list[tuple[str, Any, Any]] = []
    required: list[str] = []
    for p in params[len(leading):]:
        if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            continue
        default = p.default
        if default is inspect.Parameter.empty:
            default = REQUIRED
            required.append(p.name)
        elif not _plain(default):
            continue  # an object (a class, a module): the factory keeps its own default
        elif isinstance(default, list):
            default = tuple(default)
        fields.append((p.name, _field_type(p), dataclasses.field(default=default)))
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    loose = [name for name, kind, _ in fields if kind is Any]

    def post_init(self: Any) -> None:
        for name in loose:  # untyped: `--set model.k=3` is the number 3, as for **kwargs
            object.__setattr__(self, name, literal(getattr(self, name)))

    def validate(self: Any) -> None:
        missing = [name for name in required if getattr(self, name) == REQUIRED]
        if missing:
            given = " ".join(f"--set model.{n}=VALUE" for n in missing)
            raise FedhetError(
                f"model {spec!r} needs {', '.join('model.' + n for n in missing)} (the factory's "
                f"keyword{'s' * (len(missing) > 1)} without a default): give {given}"
            )

    return dataclasses.make_dataclass(
        "ModelKwargs", fields, bases=(OpenParams,) if takes_kwargs else (), frozen=True,
        namespace={"validate": validate, "__post_init__": post_init,
                   "__doc__": f"The keyword parameters of {spec}."},
    )


def _takes_params(params: list[inspect.Parameter]) -> bool:
    """Whether a factory's signature is `(input_shape, num_classes, params)`."""
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return len(params) >= 3 and params[2].name == "params" and params[2].kind in positional \
        and params[2].default is inspect.Parameter.empty


def kwargs_of(params: Any) -> dict[str, Any]:
    """The keyword arguments a factory is called with."""
    if params is None:
        return {}
    if isinstance(params, OpenParams):
        return params.kwargs()
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}


@dataclass(frozen=True)
class ImportedFactory:
    """A `module:factory` callable behind the registered signature
    `(input_shape, num_classes, params) -> nn.Module`."""

    spec: str
    fn: Callable[..., Any]
    params: type

    def __call__(self, input_shape: tuple[int, ...], num_classes: int, params: Any) -> nn.Module:
        kwargs = kwargs_of(params if params is not None else self.params())
        sig = _signature(self.fn)
        try:
            if sig is not None and _takes_params(list(sig.parameters.values())):
                module = self.fn(tuple(input_shape), num_classes, SimpleNamespace(**kwargs))
            else:
                module = self.fn(tuple(input_shape), num_classes, **kwargs)
        except FedhetError:
            raise
        except Exception as e:  # noqa: BLE001  (the user's factory failed: its message, one line)
            raise FedhetError(
                f"model {self.spec!r}: the factory raised {one_line(e)} (input_shape "
                f"{tuple(input_shape)}, num_classes {num_classes}, {_shown(kwargs)})"
            ) from None
        if not isinstance(module, nn.Module):
            raise FedhetError(
                f"model {self.spec!r}: the factory returned an object of type "
                f"{type(module).__name__}, not a torch.nn.Module"
            )
        return module


def _shown(kwargs: dict[str, Any]) -> str:
    return "no keyword arguments" if not kwargs else ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


@MODELS.resolver
def resolve(name: str) -> Entry | None:
    """The entry of a `package.module:factory` model (None for any other name)."""
    parts = split_spec(name)
    if parts is None:
        return None
    module_name, attr = parts
    fn = import_factory(name, module_name, attr)
    params = params_class(name, fn)
    doc = (inspect.getdoc(fn) or "").strip().split("\n")[0] or f"{attr} from {module_name}"
    return Entry(name, ImportedFactory(name, fn, params), params, doc, (), {}, module_name)


__all__ = ["ImportedFactory", "import_factory", "kwargs_of", "params_class", "resolve", "split_spec"]
