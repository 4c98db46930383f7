"""Assemble, then run: a run's parts built from its settings, any of them handed in.

`assemble(cfg, data=..., model=..., algorithm=...)` turns a `RunConfig` and whatever the caller
hands in into the parts the round loop runs on (`fedhet.engine.simulation.Parts`) and returns
the `Simulation` over them:

- the dataset (`data`: a `Dataset`, else the registered loader of `cfg.dataset`), its
  validation hold-out, partition over the clients and the clients' held-out shares
  (`federate`);
- the model (`model`: a factory `(input_shape, num_classes, params) -> nn.Module`, called with
  `cfg.model_params`; else the registered `cfg.model`), on the plan's device;
- the algorithm (`algorithm`: an `Algorithm` subclass, else the registered `cfg.algorithm`),
  built with its parameters (`algorithm_params`) and the run's `RunInfo`;
- the plan (`fedhet.engine.plan`: device, executor, worker processes), the trainer, the
  clients' work (`ClientHost` over `LocalWork`), the executor, the evaluator (`EvalSettings`),
  the fault model, the communication ledger and the topology's round runner;
- on a CPU, the process's allocator told to keep the memory a step frees for the next step
  (`fedhet.training.allocator`; `FEDHET_MALLOC=system` leaves it alone).

A handed-in part stands exactly where the registered one would: the same seeds are drawn in the
same order, so a registered component and the same component handed in give the same rows. A
component's traits (a model's `linear`) are those of its registry entry when it is registered
under any name, else none; a model's `channels_last` trait and the run's `precision` travel
with the `FlatModel` (how its passes compute).

`assemble_clients` builds the clients' half alone (data, partition, model, algorithm,
`ClientHost`, executor): what a process that only runs client updates needs (a Flower
SuperNode). Another executor for the server's loop (Flower's, which sends the requests to
SuperNodes) is handed in as `executor`, a factory over the run's `ClientHost`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.base import ALGORITHMS, Algorithm, RunInfo
from fedhet.data.base import Dataset
from fedhet.engine.callbacks import CallbackLike
from fedhet.engine.client_eval import FineTune, HeldOut
from fedhet.engine.client_store import ClientStateStore
from fedhet.engine.clients import ClientHost, LocalWork, local_steps
from fedhet.engine.comm import CommLedger
from fedhet.engine.config import RunConfig
from fedhet.engine.dry import build_algorithm, build_model, check_algorithm, dry_start
from fedhet.engine.evaluation import EvalSettings, Evaluator
from fedhet.engine.executors import Executor
from fedhet.engine.faults import FaultModel
from fedhet.engine.federation import federate
from fedhet.engine.plan import RunShape, executor_for, plan
from fedhet.engine.rounds import ROUND_RUNNERS, RoundRunner
from fedhet.engine.simulation import ClientSide, LoopSettings, Parts, Simulation, round_half_up
from fedhet.engine.workers import round_cost, usable_cores
from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS
from fedhet.registry import Entry, Registry, build_params, params_dict
from fedhet.rundir.store import RunStore
from fedhet.training.allocator import keep_freed_memory
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer

ModelFactory = Callable[[tuple[int, ...], int, Any], nn.Module]
"""`(input_shape, num_classes, params) -> nn.Module`, the shape of a registered model."""

ExecutorFactory = Callable[[ClientHost], Executor]
"""Builds the executor a run's loop hands its client requests to, over the run's `ClientHost`."""


def assemble(
    cfg: RunConfig, *, data: Dataset | None = None, model: ModelFactory | None = None,
    algorithm: type[Algorithm] | None = None, store: RunStore | None = None,
    log: Callable[[str], None] = print, callbacks: Sequence[CallbackLike] = (),
    executor: ExecutorFactory | None = None, runners: Mapping[str, RoundRunner] | None = None,
) -> Simulation:
    """The run of `cfg`, built with the parts handed in (module docstring), writing to `store`
    (None: nowhere) and telling `callbacks` (`fedhet.engine.callbacks`) of its rounds.

    `executor`: the executor of the loop's client requests (None: the plan's, in process; else
    the clients run elsewhere and `--workers auto` is 1). `runners`: round runners by topology
    that replace `ROUND_RUNNERS`' (a Flower server's star round)."""
    side = assemble_clients(cfg, data=data, model=model, algorithm=algorithm, log=log,
                            executor=executor)
    held = HeldOut.of(side.held_out, side.plan.device)
    own = [torch.from_numpy(p) for p in side.own_parts] or side.client_indices
    tune = FineTune(side.trainer, own, cfg.client_eval_finetune_steps, cfg.batch_size,
                    cfg.seed) if cfg.client_eval_finetune_steps and held else None
    evaluator = Evaluator(EvalSettings.from_config(cfg), side.model, side.data, side.algorithm,
                          side.clients.local, held, tune)
    side.algorithm.check_local_steps(side.steps)
    topology = side.algorithm.topology
    runner = (runners or {}).get(topology) or ROUND_RUNNERS.get(topology)
    if runner is None:
        raise FedhetError(f"algorithm {cfg.algorithm} needs topology {topology!r}")
    parts = Parts(
        loop=LoopSettings.from_config(cfg), config=cfg.to_dict(), side=side, evaluator=evaluator,
        faults=FaultModel.from_config(cfg), comm=CommLedger(side.model.dim), runner=runner,
    )
    return Simulation(parts, store, log, callbacks)


def assemble_clients(
    cfg: RunConfig, *, data: Dataset | None = None, model: ModelFactory | None = None,
    algorithm: type[Algorithm] | None = None, log: Callable[[str], None] = print,
    executor: ExecutorFactory | None = None,
) -> ClientSide:
    """The clients' half of the run of `cfg` (`ClientSide`), with the parts handed in as in
    `assemble`; `executor` as there (None: the plan's, in this process)."""
    algo_cls = algorithm if algorithm is not None else ALGORITHMS.get(cfg.algorithm).factory
    check_algorithm(algo_cls, cfg.algorithm)
    fed = federate(cfg, centralized=algo_cls.centralized, data=data)
    data, parts = fed.data, fed.parts
    torch.manual_seed(cfg.seed)
    factory = model if model is not None else MODELS.get(cfg.model_name).factory
    module = build_model(factory, tuple(data.input_shape), data.num_classes, cfg.model_params,
                         cfg.model_name, cfg.dataset)
    module = dry_start(module, data.x_train[:2], data.num_classes, cfg.model_name, cfg.dataset)
    local = LocalWork.from_config(cfg)
    steps = [local_steps(local, len(p), i, 0, clamp=False) for i, p in enumerate(parts)]
    per_round = min(len(parts), max(1, round_half_up(cfg.sample_fraction * len(parts))))
    dim = sum(p.numel() for p in module.parameters() if p.requires_grad)
    cost = round_cost(per_round, [max(1, t) for t in steps], [len(p) for p in parts],
                      cfg.batch_size, dim)
    the_plan = plan(cfg, usable_cores(), shape=RunShape(module, cost, per_round),
                    clients_here=executor is None, linear=_linear(model))
    if the_plan.workers_note is not None:  # else nothing was weighed: a GPU, stacked, one core
        log(f"workers: auto → {the_plan.workers} ({the_plan.workers_note})")
    device = the_plan.device
    if device.type == "cpu":  # a step's activations reuse the last step's pages
        keep_freed_memory()
    flat = FlatModel(module.to(device), channels_last=_trait(model, cfg, "channels_last"),
                     precision=cfg.precision)
    if device.type != "cpu":  # the data goes to the device once (after partitioning)
        data = dataclasses.replace(
            data, x_train=data.x_train.to(device), y_train=data.y_train.to(device),
            x_test=data.x_test.to(device), y_test=data.y_test.to(device),
        )
    trainer = LocalTrainer(flat, data.x_train, data.y_train)
    client_indices = [torch.from_numpy(np.asarray(p, dtype=np.int64)) for p in parts]
    run_info = RunInfo(
        num_clients=len(parts), rounds=cfg.rounds, lr=cfg.lr, momentum=cfg.momentum,
        weight_decay=cfg.weight_decay, seed=cfg.seed, dim=flat.dim, layers=flat.layers,
        client_optimizer=cfg.client_optimizer,
    )
    algo = build_algorithm(algo_cls, algorithm_params(cfg, algo_cls), run_info, cfg.algorithm)
    kept = ClientStateStore(algo, round(cfg.client_state_memory_mb * 2**20), device=device)
    clients = ClientHost(local, flat, trainer, client_indices, algo, log, kept)
    runs = executor(clients) if executor is not None else \
        executor_for(the_plan, clients, cfg.cohort_chunk)
    return ClientSide(data, parts, client_indices, flat, trainer, run_info, algo, clients,
                      the_plan, runs, cost, steps, fed.held_out, fed.own_parts)


def algorithm_params(cfg: RunConfig, cls: type[Algorithm]) -> Any:
    """The parameters algorithm class `cls` is built with: `cfg.algorithm_params` (built for
    the registered `cfg.algorithm`) when they are an instance of the class's own parameter
    dataclass (its registry entry's `params` when it is registered under any name, else its
    `Params` attribute) or it declares none; otherwise its own dataclass, with the values of
    the fields both share carried over and the others at their defaults."""
    entry = _entry_of(ALGORITHMS, cls)
    params_cls = entry.params if entry is not None else getattr(cls, "Params", None)
    given = cfg.algorithm_params
    if params_cls is None or isinstance(given, params_cls):
        return given
    names = {f.name for f in dataclasses.fields(params_cls)}
    values = params_dict(given) if dataclasses.is_dataclass(given) else {}
    return build_params(params_cls, {k: v for k, v in values.items() if k in names}, "algorithm")


def _linear(model: ModelFactory | None) -> bool | None:
    """A handed-in model's `linear` trait: its registry entry's, else False (None: not handed
    in, the plan reads the registered model's)."""
    if model is None:
        return None
    entry = _entry_of(MODELS, model)
    return bool(entry.trait("linear", False)) if entry is not None else False


def _trait(model: ModelFactory | None, cfg: RunConfig, key: str) -> bool:
    """The model's boolean trait `key`: the registered `cfg.model`'s, or a handed-in factory's
    registry entry's (False when it is not registered)."""
    entry = _entry_of(MODELS, model) if model is not None else MODELS.get(cfg.model_name)
    return bool(entry.trait(key, False)) if entry is not None else False


def _entry_of(registry: Registry[Any], factory: Any) -> Entry[Any] | None:
    """The entry `factory` is registered under, if any."""
    return next((e for e in registry if e.factory is factory), None)


__all__ = [
    "ClientSide", "ExecutorFactory", "ModelFactory", "algorithm_params", "assemble",
    "assemble_clients",
]
