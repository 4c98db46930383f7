"""Where a run's work runs, decided in one place: device, executor, worker processes, backend.

`plan` takes a run's settings and returns a `Plan` with the reason for each choice. It composes
the rules that live next to what they govern — `executors.device_choice` (CUDA or CPU),
`executors.executor_choice` (sequential or stacked; `cohort.unsupported_reason` for models that
cannot be stacked), `workers.auto_workers` (`--workers auto`, measured thresholds) — and is
the only caller of them while a `Simulation` is built. `would_stack` answers the grid runner's
question (may this run step in a stack of runs?) with the same rules, and `describe_plan` lists
the plan of a config before any data is loaded (`fedhet config show`).

The plan is pure: the same settings, cores and model always give the same plan, so a resumed
run or a run on a cluster node computes exactly what it would have computed locally.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fedhet.engine.executors import device_choice, executor_choice, make_executor
from fedhet.engine.workers import ProcessExecutor, auto_workers, usable_cores
from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS

if TYPE_CHECKING:
    from fedhet.engine.clients import ClientHost
    from fedhet.engine.config import RunConfig


CLUSTERS = ("ray",)
"""The cluster backends `--cluster` names (`fedhet.runs.cluster` runs them)."""


@dataclass(frozen=True)
class ClusterOptions:
    """Where a grid's units run: a Ray cluster at `address` (`None`: `$RAY_ADDRESS`, else a
    local Ray started for this grid; `auto`: the one running on this machine), each unit asking
    for `cpus_per_run` CPUs and `gpus_per_run` GPUs."""

    kind: str = "ray"
    address: str | None = None
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in CLUSTERS:
            raise FedhetError(f"--cluster {self.kind}: unknown; choose one of {', '.join(CLUSTERS)}")
        if self.address is not None:
            ray_address(self.address, "--ray-address")
        if not self.cpus_per_run > 0:
            raise FedhetError(f"--cpus-per-run must be > 0, got {self.cpus_per_run:g}")
        if not self.gpus_per_run >= 0:
            raise FedhetError(f"--gpus-per-run must be ≥ 0, got {self.gpus_per_run:g}")
        for flag, value in (("--cpus-per-run", self.cpus_per_run),
                            ("--gpus-per-run", self.gpus_per_run)):
            _ray_quantity(flag, value)


RESOURCE_STEP = 1e-4
"""Ray counts CPUs and GPUs in steps of 0.0001 (`ray._raylet.RESOURCE_UNIT_SCALING`)."""

MAX_RESOURCE = 1e9
"""**[choice]** More CPUs or GPUs than any cluster has: a typo, refused with the others."""


def _ray_quantity(flag: str, value: float) -> None:
    """A CPU or GPU share Ray can hold: finite, at most `MAX_RESOURCE`, and a whole number of
    0.0001 steps (Ray would otherwise fail deep in task submission, or round it silently)."""
    if not math.isfinite(value) or value > MAX_RESOURCE:
        raise FedhetError(f"{flag} {value:g}: expected a number of CPUs/GPUs up to {MAX_RESOURCE:g}")
    steps = value / RESOURCE_STEP
    if abs(steps - round(steps)) > 1e-6 * max(1.0, steps) or (value > 0 and round(steps) == 0):
        raise FedhetError(f"{flag} {value:g}: Ray counts resources in steps of 0.0001; give a "
                          "multiple of it, e.g. 0.25 or 2")


def ray_address(text: str, source: str) -> str:
    """`text` as an address of a Ray cluster: `HOST:PORT` of its head's GCS port (`[v6]:PORT`
    too), `ray://HOST:PORT` (Ray Client), `auto` (the cluster `ray start` left on this
    machine) or `local` (a private local Ray). Returns it stripped; anything else is one line
    naming `source` (`--ray-address`, `RAY_ADDRESS`)."""
    address = text.strip()
    if address in ("auto", "local"):
        return address
    hint = ("expected HOST:PORT of the cluster's head (its GCS port, 6379 unless `ray start "
            "--head --port` said otherwise), ray://HOST:PORT, or auto")
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or any(c.isspace() or c in "/@" for c in host):
        raise FedhetError(f"{source} {text!r}: {hint}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise FedhetError(f"{source} {text!r}: the port must be a number from 1 to 65535; {hint}")
    return address


def host_port(address: str) -> tuple[str, int]:
    """The host and port of a `ray_address` that names one (not `auto`/`local`)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class RunShape:
    """A run's shape, once its model and data are built: the model (can it be stacked?),
    a round's estimated multiply-adds (`workers.round_cost`) and clients a round."""

    module: torch.nn.Module
    round_cost: float
    clients_per_round: int


@dataclass(frozen=True)
class Plan:
    """Where a run's work runs, and why. `workers` is 0 while `--workers auto` is undecided
    (no `RunShape` yet); `workers_note` is what the Simulation logs about it (None: nothing was
    weighed, e.g. on a GPU or with one core)."""

    device: torch.device
    executor: str
    workers: int
    backend: str
    reasons: dict[str, str] = field(default_factory=dict)
    workers_note: str | None = None

    def rows(self) -> list[tuple[str, str, str]]:
        """`(key, value, reason)` for each decision, in order."""
        workers = str(self.workers) if self.workers else "auto"
        values = {"device": str(self.device), "executor": self.executor, "workers": workers,
                  "backend": self.backend}
        return [(k, v, self.reasons.get(k, "")) for k, v in values.items()]

    def line(self) -> str:
        """The plan in one line (values only)."""
        return ", ".join(f"{k} {v}" for k, v, _ in self.rows())


def backend_of(cluster: ClusterOptions | None) -> tuple[str, str]:
    """Where the run itself executes: this process, or a task on a cluster."""
    if cluster is None:
        return "local", "this process (compare/reproduce: one of --jobs processes)"
    where = cluster.address or "$RAY_ADDRESS or a local Ray"
    return cluster.kind, (f"a task on the Ray cluster at {where}, {cluster.cpus_per_run:g} CPU "
                          f"and {cluster.gpus_per_run:g} GPU per run")


def is_linear(model: str) -> bool:
    """Whether model `model` declares itself linear where it registers (`linear=True`: the
    stacked executor is `auto`'s choice for it on the CPU too)."""
    return bool(MODELS.get(model).trait("linear", False))


def plan(
    cfg: RunConfig, cores: int, cluster: ClusterOptions | None = None, *,
    shape: RunShape | None = None, clients_here: bool = True, cuda: bool | None = None,
    linear: bool | None = None,
) -> Plan:
    """The plan of run `cfg` on `cores` usable cores (`workers.usable_cores`).

    `shape`: the built model and the round's work; without it the model is not checked for
    stacking and `--workers auto` stays undecided (0). `clients_here`: False where the clients
    run elsewhere (a Flower server: `auto` is then 1, with nothing to weigh). `cuda`: whether a
    GPU is visible where the run will execute (None: ask torch here); `device = cuda` without
    one is a `FedhetError` only when the plan is for this process (`cuda` None). `linear`:
    whether the model is linear (None: its registry entry's trait, `is_linear`)."""
    reasons: dict[str, str] = {}
    if cuda is None:
        device, reasons["device"] = device_choice(cfg.device)
    else:
        device = torch.device("cuda" if cfg.device == "cuda" or (cfg.device == "auto" and cuda)
                              else "cpu")
        reasons["device"] = ("set" if cfg.device != "auto" else
                             "auto: the runs ask for GPUs" if cuda else "auto: the runs ask for no GPU")
    module = shape.module if shape is not None else None
    if linear is None:
        linear = is_linear(cfg.model_name)
    executor, reasons["executor"] = executor_choice(cfg.executor, device, linear, module,
                                                    cfg.workers)
    note = None
    if cfg.workers > 0:
        workers, reasons["workers"] = cfg.workers, "set"
    elif not clients_here:
        workers, reasons["workers"] = 1, "auto: the clients run elsewhere (Flower SuperNodes)"
    elif shape is None:
        workers, reasons["workers"] = 0, (
            "auto: decided when the run starts, from a round's estimated work and the "
            f"{cores} usable core(s) (docs/gpu.md)")
    else:
        workers, note = auto_workers(shape.round_cost, cfg.rounds, shape.clients_per_round, cores,
                                     device.type, executor, cfg.executor)
        reasons["workers"] = f"auto: {note}" if note else "auto: nothing to weigh (one process)"
    backend, reasons["backend"] = backend_of(cluster)
    return Plan(device, executor, workers, backend, reasons, note)


def executor_for(p: Plan, clients: ClientHost, chunk: int = 0) -> Any:
    """The executor object `p` asks for over `clients`: the sequential one spread over
    `p.workers` processes, or the sequential or stacked one in this process."""
    if p.workers > 1 and p.executor == "sequential":
        return ProcessExecutor(clients, p.workers)
    return make_executor(clients, p.executor, chunk)


def would_stack(cfg: RunConfig, cuda: bool) -> bool:
    """Whether run `cfg` would use the stacked executor (so it may step in a stack of runs),
    judged from its settings alone: not with `--workers N > 1` or `--executor sequential`, and
    `auto` only on a GPU or for the linear models (`executor_choice`)."""
    if cfg.workers > 1 or cfg.executor == "sequential":
        return False
    on_gpu = cfg.device == "cuda" or (cfg.device == "auto" and cuda)
    return not (cfg.executor == "auto" and not (on_gpu or is_linear(cfg.model_name)))


def describe_plan(cfg: RunConfig, cluster: ClusterOptions | None = None) -> list[tuple[str, str, str]]:
    """`(key, value, reason)` of `cfg`'s plan on this machine before anything is built (for
    `fedhet config show`); a device that is not there is shown with the reason, not raised."""
    try:
        return plan(cfg, usable_cores(), cluster).rows()
    except FedhetError as e:
        return [("device", cfg.device, f"not possible here: {e}"),
                ("executor", cfg.executor, "as set"),
                ("workers", str(cfg.workers or "auto"), "as set"),
                ("backend", *backend_of(cluster))]


__all__ = [
    "CLUSTERS", "ClusterOptions", "Plan", "RunShape", "would_stack", "describe_plan", "executor_for",
    "is_linear", "plan",
]
