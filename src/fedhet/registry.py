"""Named components with typed, validated parameters.

Datasets, partitioners, models and algorithms are each a `Registry` of `Entry`s. An entry's
parameters are a dataclass: its fields are the names a user may set (`--set algorithm.mu=0.1`),
its defaults are the papers' defaults, and an optional `validate()` method rejects impossible
values with a `FedhetError` before any work starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import math
import pkgutil
import sys
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from fedhet.errors import FedhetError

T = TypeVar("T")


@dataclass(frozen=True)
class NoParams:
    """For components without parameters. Reading a setting from it names the fix: a class
    handed in unregistered that reads `self.params.gamma` needs a `Params` dataclass."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"no setting {name!r}: this component was given no parameters class; give its class "
            "a `Params` dataclass attribute (class MyAlgo(Algorithm): Params = MyParams) or "
            "register it with its dataclass (register_algorithm(name, MyParams))"
        )


@dataclass(frozen=True)
class OpenParams:
    """Base of a parameter dataclass that also takes names it does not declare (a
    `package.module:factory` model whose factory takes `**kwargs`). `build_params` keeps them
    in `extra` as `(name, value)` pairs in name order, a string (`--set model.depth=3`) read as
    the number or boolean it spells (`literal`); `params_dict` writes them beside the declared
    fields, so a saved `config.json` builds the same parameters again."""

    extra: tuple[tuple[str, Any], ...] = field(default=(), kw_only=True)

    def kwargs(self) -> dict[str, Any]:
        """Every parameter by name: the declared fields, then the extra ones."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out.update(self.extra)
        return out


def literal(value: Any) -> Any:
    """A value of an undeclared parameter: a string that spells an integer, a finite number,
    `true` or `false` becomes one; a list becomes a tuple; anything else is kept."""
    if isinstance(value, list | tuple):
        return tuple(literal(v) for v in value)
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return number if math.isfinite(number) else value
    return value


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered component: its name, factory, parameter dataclass, one-line doc, and
    `traits` it declares for the engine (a model's `linear=True`, a dataset's
    `default_model="mlp"`), so the engine keeps no lists of names. `source` says where it came
    from (`fedhet` for the built-ins, else the module or plugin file that registered it)."""

    name: str
    factory: T
    params: type = NoParams
    doc: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    traits: Mapping[str, Any] = field(default_factory=dict)
    source: str = "fedhet"

    def trait(self, key: str, default: Any = None) -> Any:
        """The value of trait `key` this component declared, or `default`."""
        return self.traits.get(key, default)


PLUGIN_SOURCE: list[str] = []
"""The plugin being imported (`fedhet.plugins` pushes its spec while it imports one), so the
components it registers record it as their `source`."""


def source_of(factory: Any) -> str:
    """Where a component registered now comes from: the plugin being loaded, `fedhet` for a
    module of the package, else the defining module (`__main__` for a script or notebook)."""
    if PLUGIN_SOURCE:
        return PLUGIN_SOURCE[-1]
    module = getattr(factory, "__module__", None) or "?"
    return "fedhet" if module == "fedhet" or module.startswith("fedhet.") else module


def coerce(value: Any, hint: Any, where: str) -> Any:
    """Turn `value` (from TOML or a `key=value` string) into the type `hint` names: a union's
    first member that takes it (`none`/`null` for None), a literal's choice in any case, a list
    or tuple (also from `a, b` text), a bool, int, float or str; any other hint leaves it as it
    is. A value that does not fit is one `FedhetError` naming `where`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, hint, where)
    if origin is typing.Literal:
        return _coerce_literal(value, typing.get_args(hint), where)
    if origin in (tuple, list):
        return _coerce_sequence(value, hint, where)
    if hint is bool:
        return _coerce_bool(value, where)
    if hint is int:
        return _coerce_int(value, where)
    if hint is float:
        if isinstance(value, bool):
            raise FedhetError(f"{where} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise FedhetError(f"{where} must be a number, got {value!r}") from None
    if hint is str:
        if not isinstance(value, str | int | float):
            raise FedhetError(f"{where} must be a string, got {value!r}")
        return str(value)
    return value


def _coerce_union(value: Any, hint: Any, where: str) -> Any:
    """`value` as the first member of the union `hint` that takes it; None from `none`/`null`;
    else the first member's error."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        return None
    errors = []
    for arg in args:
        try:
            return coerce(value, arg, where)
        except FedhetError as e:
            errors.append(str(e))
    raise FedhetError(errors[0])


def _coerce_literal(value: Any, choices: tuple[Any, ...], where: str) -> Any:
    """One of `choices`, a string matched in any case (`Cosine` is `cosine`)."""
    if value in choices:
        return value
    if isinstance(value, str):
        folded = {fold(c): c for c in choices if isinstance(c, str)}
        if fold(value) in folded:
            return folded[fold(value)]
    hint_text = did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
    raise FedhetError(
        f"{where} must be one of {', '.join(map(str, choices))}, got {value!r}{hint_text}"
    )


def _coerce_sequence(value: Any, hint: Any, where: str) -> list[Any] | tuple[Any, ...]:
    """A list or tuple (`hint`'s origin) of its item type, from a list, a tuple or `[a, b]` /
    `a, b` text."""
    if isinstance(value, str):
        value = [v.strip() for v in value.replace("[", "").replace("]", "").split(",")
                 if v.strip()]
    if not isinstance(value, list | tuple):
        raise FedhetError(f"{where} must be a list, got {value!r}")
    (item,) = typing.get_args(hint)[:1] or (Any,)
    items = [coerce(v, item, where) for v in value]
    return tuple(items) if typing.get_origin(hint) is tuple else items


def _coerce_bool(value: Any, where: str) -> bool:
    """A bool, or its words: true/1/yes/on and false/0/no/off, in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
        return False
    raise FedhetError(f"{where} must be true or false, got {value!r}")


def _coerce_int(value: Any, where: str) -> int:
    """An int, a whole float, or the text of an int; never a bool."""
    if isinstance(value, bool):
        raise FedhetError(f"{where} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(str(value))
    except ValueError:
        raise FedhetError(f"{where} must be an integer, got {value!r}") from None


def fold(name: str) -> str:
    """A name as it is compared: lower case, `_` and `-` alike (`FedAvg`, `fashion_mnist`,
    `local-epochs` match `fedavg`, `fashion-mnist`, `local_epochs`)."""
    return name.strip().lower().replace("_", "-")


def nearest(word: str, choices: Iterable[str], synonyms: Mapping[str, str] | None = None) -> list[str]:
    """The choices a mistyped `word` most likely meant, best first (at most three): a known
    synonym (`learning_rate` → `lr`), then close spellings (`difflib`, ratio ≥ 0.75, or 0.6 for
    words of up to four letters, compared `fold`ed), then choices that contain the word or are
    contained in it (`epochs` → `local_epochs`)."""
    choices = list(dict.fromkeys(choices))
    by_fold = {fold(c): c for c in choices}
    out: list[str] = []
    key = fold(word)
    synonym = (synonyms or {}).get(key.replace("-", "_")) or (synonyms or {}).get(key)
    if synonym in choices:
        out.append(synonym)
    cutoff = 0.75 if len(key) > 4 else 0.6  # a short word's one slip weighs more (`rnu` → `run`)
    out += [by_fold[m] for m in difflib.get_close_matches(key, list(by_fold), n=3, cutoff=cutoff)]
    if len(key) >= 3:
        out += [c for f, c in by_fold.items() if key in f or (len(f) >= 3 and f in key)]
    return list(dict.fromkeys(out))[:3]


def did_you_mean(word: str, choices: Iterable[str], synonyms: Mapping[str, str] | None = None) -> str:
    """` (did you mean 'x'?)`, or `` when nothing is close (`nearest`): the hint an unknown
    name's error carries."""
    near = nearest(word, choices, synonyms)
    if not near:
        return ""
    return " (did you mean " + " or ".join(repr(n) for n in near) + "?)"


_WARNED: set[str] = set()


def deprecated_name(old: str, new: str) -> None:
    """One line on stderr, once per process, for a parameter spelt the old way."""
    if old not in _WARNED:
        _WARNED.add(old)
        print(f"note: {old} is deprecated; use {new} (same meaning)", file=sys.stderr)


def build_params(cls: type, values: Mapping[str, Any], where: str) -> Any:
    """Instantiate parameter dataclass `cls` from user `values`, checking names and types.

    A class may map old parameter names to current ones in `ALIASES` (a `ClassVar`): the old
    name is accepted with a one-line deprecation note, and giving both is an error. It may also
    say, in a static `upgrade(values) -> values`, what values written before one of its
    parameters existed meant (a saved `config.json` lacks the new parameter)."""
    hints = typing.get_type_hints(cls)
    is_open = issubclass(cls, OpenParams)
    names = [f.name for f in dataclasses.fields(cls) if not (is_open and f.name == "extra")]
    aliases: dict[str, str] = getattr(cls, "ALIASES", {})
    renamed: dict[str, Any] = {}
    for key, value in values.items():
        new = aliases.get(key)
        if new is None:
            renamed[key] = value
            continue
        if new in values:
            raise FedhetError(
                f"{where}.{key} and {where}.{new} are the same parameter; give only {where}.{new}"
            )
        deprecated_name(f"{where}.{key}", f"{where}.{new}")
        renamed[new] = value
    values = renamed
    upgrade = getattr(cls, "upgrade", None)
    if upgrade is not None:
        values = upgrade(values)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in values.items():
        if key not in names and is_open:
            extra[key] = literal(value)
            continue
        if key not in names:
            valid = ", ".join(names) if names else "none"
            hint = did_you_mean(key, names)
            raise FedhetError(f"unknown parameter {where}.{key}{hint}; valid parameters: {valid}")
        kwargs[key] = coerce(value, hints[key], f"{where}.{key}")
    if extra:
        kwargs["extra"] = tuple(sorted(extra.items()))
    params = cls(**kwargs)
    validate = getattr(params, "validate", None)
    if validate is not None:
        validate()
    return params


def params_dict(params: Any) -> dict[str, Any]:
    """The parameter dataclass as plain JSON-able values (an `OpenParams`' extra names beside
    its fields)."""
    items = params.kwargs().items() if isinstance(params, OpenParams) else (
        (f.name, getattr(params, f.name)) for f in dataclasses.fields(params))
    return {name: list(v) if isinstance(v, tuple) else v for name, v in items}


class Registry(Generic[T]):
    """A name → `Entry` table whose lookups fail with the list of valid names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        self._resolvers: list[Callable[[str], Entry[T] | None]] = []
        self._resolved: dict[str, Entry[T]] = {}
        """Entries the resolvers built, kept apart from the registered names (`names()`)."""

    def resolver(self, fn: Callable[[str], Entry[T] | None]) -> Callable[[str], Entry[T] | None]:
        """Decorator: `fn(name)` builds the `Entry` of a name that is no registered name but
        stands for a component itself (a data file's path, `package.module:factory`), or
        returns None. `get` asks the resolvers in order and keeps the entry under that name."""
        self._resolvers.append(fn)
        return fn

    def register(
        self, name: str, params: type = NoParams, doc: str = "", tags: tuple[str, ...] = (),
        **traits: Any,
    ) -> Callable[[T], T]:
        """Decorator: register `factory` as `name`, with its parameter dataclass, doc and
        `traits` (`Entry`). Registering a name twice is refused, unless it is the same factory
        again (a plugin module imported a second time)."""
        if not (isinstance(params, type) and dataclasses.is_dataclass(params)):
            raise FedhetError(
                f"register {self.kind} {name!r}: its parameters must be a dataclass class (its "
                f"fields are the settings `{self.kind}.NAME`; leave it out when there are none), got "
                f"{params!r}"
            )

        def deco(factory: T) -> T:
            old = self._entries.get(name)
            if old is not None and not _same_factory(old.factory, factory):
                raise ValueError(
                    f"{self.kind} {name!r} registered twice (first by {old.source}); "
                    "choose another name"
                )
            text = doc or (getattr(factory, "__doc__", "") or "").strip().split("\n")[0]
            self._entries[name] = Entry(name, factory, params, text, tags, dict(traits),
                                        source_of(factory))
            return factory

        return deco

    @contextlib.contextmanager
    def added(
        self, name: str, factory: T, params: type = NoParams, doc: str = "", **traits: Any
    ) -> Iterator[T]:
        """`factory` registered under `name`, with its `traits`, for the length of a `with`
        block only (a test's model or algorithm, a component tried out): the entry is gone
        afterwards, and a name that is already taken is refused as by `register`."""
        self.register(name, params, doc, **traits)(factory)
        try:
            yield factory
        finally:
            self._entries.pop(name, None)

    def unregister(self, name: str) -> None:
        """Remove `name` (a component a notebook cell registers again with a new definition)."""
        self._entries.pop(name, None)

    def canonical(self, name: str) -> str:
        """The registered spelling of `name` in any case, `_` or `-` (`FedAvg` → `fedavg`,
        `fashion_mnist` → `fashion-mnist`); `name` itself when nothing matches."""
        if name in self._entries:
            return name
        folded = {fold(n): n for n in self._entries}
        return folded.get(fold(name), name)

    def get(self, name: str) -> Entry[T]:
        name = self.canonical(name)
        if name in self._resolved:
            return self._resolved[name]
        if name not in self._entries:
            for resolve in self._resolvers:
                entry = resolve(name)
                if entry is not None:
                    self._resolved[name] = entry
                    return entry
            hint = did_you_mean(name, self._entries)
            raise FedhetError(
                f"unknown {self.kind} {name!r}{hint}; choose one of: {', '.join(sorted(self._entries))}"
            )
        return self._entries[name]

    def params(self, name: str, values: Mapping[str, Any] | None = None) -> Any:
        return build_params(self.get(name).params, values or {}, self.kind)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def aliases(self) -> dict[str, str]:
        """Old parameter name → current name, over every entry's `ALIASES`."""
        out: dict[str, str] = {}
        for entry in self._entries.values():
            out.update(getattr(entry.params, "ALIASES", {}))
        return out

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries[n] for n in self.names())

    def __contains__(self, name: str) -> bool:
        return name in self._entries


def _same_factory(a: Any, b: Any) -> bool:
    """Whether two factories are one definition: the same object, or the same qualified name
    defined in the same file (a plugin file imported again, or under another module name)."""
    if a is b:
        return True
    name = getattr(a, "__qualname__", None)
    return name is not None and name == getattr(b, "__qualname__", None) \
        and _file_of(a) is not None and _file_of(a) == _file_of(b)


def _file_of(obj: Any) -> str | None:
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    return str(Path(path).resolve()) if path else None


def import_all(package: str, path: Sequence[str]) -> None:
    """Import every module and subpackage of `package` (its `__path__`), in name order, so each
    registers what it defines: a package's `__init__` calls this, and a new module or folder is
    found without any list to edit."""
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        importlib.import_module(f"{package}.{info.name}")
