"""The dry start: a run's model checked on one real batch before the run writes anything.

A model a user brings (`-m package.module:factory`, `register_model`, a factory handed to
`fedhet.run`) used to meet the dataset first in round 1, after a fresh run had prepared its
directory (and, with `--force`, removed the run that was there). `dry_start`, called by
`assemble_clients` as soon as the model is built (before anything is written), checks that the
factory returned an `nn.Module` and runs its forward pass on two training samples, in
evaluation mode and without gradients (no BatchNorm statistic, random number or weight
changes: the run gives the results it would give without the check), and turns each mistake
into one line naming the model:

- the forward pass raises (an input shape it does not take);
- its output is not one row of scores per sample;
- it gives fewer scores than the dataset has classes (the cross-entropy would index past them);
- it gives more: refused unless the model says so (`extra_outputs = True` on the module), since
  the extra scores are classes no label names and the run would train silently on them.

A model with its own `loss` (the squared SVM, a user's) decides what its outputs mean, and a
forward that returns no tensor (MOON's encoders with their projections) is not checked.

A grid checks every distinct dataset and model of its runs the same way (`dry_check`) before it
writes anything, so a wrong model is one line, not a grid of failed runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from fedhet.errors import FedhetError


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
    # lazy: the loaders and the model registry import what a run needs, not what this module does
    from fedhet.engine.federation import load
    from fedhet.models.registry import MODELS
    from fedhet.registry import params_dict

    seen: set[str] = set()
    for cfg in configs:
        key = json.dumps([cfg.dataset, params_dict(cfg.dataset_params), str(cfg.data_dir),
                          cfg.model_name, params_dict(cfg.model_params)], sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        data = load(cfg, cache=True)
        torch.manual_seed(cfg.seed)
        factory = MODELS.get(cfg.model_name).factory
        dry_start(factory(tuple(data.input_shape), data.num_classes, cfg.model_params),
                  data.x_train[:2], data.num_classes, cfg.model_name, cfg.dataset)
