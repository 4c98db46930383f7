"""The dry start: a run's model checked on one real batch, and its algorithm's class against
the protocol, before the run writes anything.

A model a user brings (`-m package.module:factory`, `register_model`, a factory handed to
`fedhet.run`) would otherwise meet the dataset first in round 1, after a fresh run has prepared
its directory (and, with `--force`, removed the run that was there). `dry_start`, called by
`assemble_clients` as soon as the model is built (before anything is written), checks that the
factory returned an `nn.Module` and runs its forward pass on two training samples, in
evaluation mode and without gradients (no BatchNorm statistic, random number or weight
changes: the run gives the results it would give without the check), and turns each mistake
into one line naming the model:

- the factory itself raises, or cannot be called as `factory(input_shape, num_classes, params)`
  (`build_model`, which calls it: the error, and where the user's code raised it);
- the forward pass raises (an input shape it does not take);
- its output is not one row of scores per sample;
- it gives fewer scores than the dataset has classes (the cross-entropy would index past them);
- it gives more: refused unless the model says so (`extra_outputs = True` on the module), since
  the extra scores are classes no label names and the run would train silently on them.

A model with its own `loss` (the squared SVM, a user's) decides what its outputs mean, and a
forward that returns no tensor (MOON's encoders with their projections) is not checked.

An algorithm a user brings (`register_algorithm` in a plugin, a class handed to `fedhet.run`)
is checked the same way before anything is built from it (`check_algorithm`): every method of
the protocol it overrides (`Algorithm.__init__`, `init`, `configure`, `aggregate`,
`client_init`, `client_update`, …) must take the arguments fedhet calls it with, and its
constructor must not raise (`build_algorithm`); each mistake is one line naming the algorithm,
the method, its signature and the call it must accept. Mistakes inside a method that takes the
right arguments show in round 1, as the client's or the round's one-line failure.

A grid checks every distinct dataset and model of its runs the same way (`dry_check`), and
every algorithm's class, before it writes anything, so a wrong model is one line, not a grid of
failed runs.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from fedhet.algorithms.base import ALGORITHMS, Algorithm
from fedhet.engine.failures import blame
from fedhet.errors import FedhetError, one_line
from fedhet.models.registry import MODELS
from fedhet.registry import params_dict


def _called(fn: Any, args: tuple[Any, ...], who: str, after: str = "") -> Any:
    """`fn(*args)`; an error that is not fedhet's own is one line, `{who} raised Type: message`,
    with where the user's code raised it and `after`, not a traceback."""
    try:
        return fn(*args)
    except FedhetError:
        raise
    except Exception as e:  # noqa: BLE001  (the user's code failed: its message, one line)
        where, user = blame(e)
        raise FedhetError(f"{who} raised {one_line(e)}" + (f" at {where}" if where and user else "")
                          + after) from None


def build_model(factory: Any, input_shape: tuple[int, ...], classes: int, params: Any,
                model: str, dataset: str) -> Any:
    """`factory(input_shape, classes, params)`; a factory that raises (a signature that takes
    other arguments, a mistake inside it) is one line naming the model, the error and where it
    was raised (`_called`)."""
    return _called(factory, (input_shape, classes, params), f"model {model!r}: the factory",
                   f" (called as factory(input_shape={input_shape}, num_classes={classes}, "
                   f"params) for dataset {dataset!r})")


PROTOCOL = ("__init__", "init", "configure", "aggregate", "eval_params", "check_local_steps",
            "note", "extra_eval_params", "client_init", "client_update")
"""The `Algorithm` methods the engine calls, each positionally with the base class's parameters."""


def check_algorithm(cls: Any, name: str) -> None:
    """Refuse an algorithm class (module doc) that is not an `Algorithm`, or whose override of a
    `PROTOCOL` method cannot be called the way the engine calls it."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise FedhetError(f"algorithm {name!r} is {cls!r}, not a subclass of fedhet.Algorithm")
    for method in PROTOCOL:
        base = getattr(Algorithm, method)
        if getattr(cls, method) is base:
            continue
        raw = inspect.getattr_static(cls, method)
        expected = list(inspect.signature(base).parameters)[1:]
        args = expected if isinstance(raw, staticmethod | classmethod) else ["self", *expected]
        try:
            signature = inspect.signature(getattr(cls, method))
        except (TypeError, ValueError):  # no signature to read (a builtin): trust it
            continue
        try:
            signature.bind(*args)
        except TypeError:
            owner = next(c for c in cls.__mro__ if method in vars(c))
            raise FedhetError(
                f"algorithm {name!r}: {owner.__name__}.{method}{signature} cannot be called as "
                f"{method}({', '.join(expected)}), the way fedhet calls it (fedhet.Algorithm."
                f"{method}; docs/library.md, section 3)"
            ) from None


def build_algorithm(cls: Any, params: Any, run: Any, name: str) -> Any:
    """`cls(params, run)`; a constructor that raises is one line naming the algorithm, the error
    and where the user's code raised it (`_called`)."""
    return _called(cls, (params, run), f"algorithm {name!r}: its constructor")


def dry_start(module: Any, x: torch.Tensor, classes: int, model: str, dataset: str) -> nn.Module:
    """Check a freshly built `module` on two of the dataset's samples `x` (module doc); returns it."""
    if not isinstance(module, nn.Module):
        raise FedhetError(
            f"model {model!r}: its factory returned an object of type {type(module).__name__}, "
            "not a torch.nn.Module"
        )
    if getattr(module, "loss", None) is not None:
        return module
    x = x[:2]
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(x)
    except Exception as e:  # noqa: BLE001  (the user's model failed: its message, one line)
        first = (str(e).strip().splitlines() or [""])[0]
        raise FedhetError(
            f"model {model!r} fails on the inputs of dataset {dataset!r} (a batch of shape "
            f"{tuple(x.shape)}): {type(e).__name__}: {first}"
        ) from None
    finally:
        module.train(was)
    if not isinstance(out, torch.Tensor):
        return module
    if out.ndim != 2 or out.shape[0] != x.shape[0]:
        raise FedhetError(
            f"model {model!r} returns an output of shape {tuple(out.shape)} for a batch of "
            f"{x.shape[0]} samples of {dataset!r}; a classifier returns (batch, classes) = "
            f"({x.shape[0]}, {classes})"
        )
    width = int(out.shape[1])
    if width < classes:
        raise FedhetError(
            f"model {model!r} returns {width} scores per sample but dataset {dataset!r} has "
            f"{classes} classes: build its last layer with num_classes outputs (the factory is "
            f"given num_classes = {classes})"
        )
    if width > classes and not getattr(module, "extra_outputs", False):
        raise FedhetError(
            f"model {model!r} returns {width} scores per sample but dataset {dataset!r} has "
            f"{classes} classes: build its last layer with num_classes outputs, or set "
            "`extra_outputs = True` on the module if the extra scores are meant"
        )
    return module


def dry_check(configs: Iterable[Any]) -> None:
    """The dry start of runs not built yet (a grid's `RunConfig`s, before it writes anything):
    each distinct dataset is loaded once and each distinct model on it built and checked."""
    # lazy: the loaders import what a run needs, not what this module does
    from fedhet.engine.federation import load

    seen: set[str] = set()
    for cfg in configs:
        check_algorithm(ALGORITHMS.get(cfg.algorithm).factory, cfg.algorithm)
        key = json.dumps([cfg.dataset, params_dict(cfg.dataset_params), str(cfg.data_dir),
                          cfg.model_name, params_dict(cfg.model_params)], sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        data = load(cfg, cache=True)
        torch.manual_seed(cfg.seed)
        factory = MODELS.get(cfg.model_name).factory
        module = build_model(factory, tuple(data.input_shape), data.num_classes, cfg.model_params,
                             cfg.model_name, cfg.dataset)
        dry_start(module, data.x_train[:2], data.num_classes, cfg.model_name, cfg.dataset)
