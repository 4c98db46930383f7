"""fedhet: federated learning on non-IID data with heterogeneous local work.

The public API (docs/library.md); everything else in the package is internal::

    import fedhet
    data = fedhet.from_arrays(x_train, y_train, x_test, y_test, name="mine")
    r = fedhet.run(algorithm="fednova", dataset=data, partition="dirichlet", clients=20,
                   rounds=50, settings={"partition.alpha": 0.3, "lr": 0.05}, out="runs/mine")
    r.summary["final_accuracy"], r.metrics[-1]["test_accuracy"], r.to_pandas()
    fedhet.resume("runs/mine", rounds=80)
    rows = fedhet.compare(base={"dataset": data}, sweeps={"algorithm": ["fedavg", "fednova"]},
                          out="runs/grid", jobs=2)

Names are imported on first use, so `import fedhet` (and the CLI's `--help`) stays instant.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC: dict[str, tuple[str, str]] = {
    # running and reading runs
    "run": ("fedhet.api", "run"),
    "resume": ("fedhet.api", "resume"),
    "open_run": ("fedhet.rundir", "open_run"),
    "compare": ("fedhet.api", "compare"),
    "RunResult": ("fedhet.rundir", "RunResult"),
    "assemble": ("fedhet.engine.assembly", "assemble"),
    "Callback": ("fedhet.engine.callbacks", "Callback"),
    "config_of": ("fedhet.engine.config", "config_of"),
    "RunConfig": ("fedhet.engine.config", "RunConfig"),
    "load_plugins": ("fedhet.plugins", "load_plugins"),
    "FedhetError": ("fedhet.errors", "FedhetError"),
    # your own data
    "Dataset": ("fedhet.data.base", "Dataset"),
    "from_arrays": ("fedhet.data.arrays", "from_arrays"),
    "from_huggingface": ("fedhet.data.hf", "from_huggingface"),
    # the algorithm kit
    "Algorithm": ("fedhet.algorithms.base", "Algorithm"),
    "Message": ("fedhet.algorithms.base", "Message"),
    "Reply": ("fedhet.algorithms.base", "Reply"),
    "RunInfo": ("fedhet.algorithms.base", "RunInfo"),
    "ClientContext": ("fedhet.algorithms.base", "ClientContext"),
    "ServerState": ("fedhet.algorithms.state", "ServerState"),
    "ClientState": ("fedhet.algorithms.state", "ClientState"),
    "local_sgd_update": ("fedhet.algorithms.fedavg", "local_sgd_update"),
    "mean_delta": ("fedhet.algorithms.fedavg", "mean_delta"),
    "client_diagnostics": ("fedhet.algorithms.fedavg", "client_diagnostics"),
    # the registries' decorators: register_algorithm("name", Params, "doc", **traits)(cls)
    "register_algorithm": ("fedhet.algorithms.base", "ALGORITHMS.register"),
    "register_model": ("fedhet.models.registry", "MODELS.register"),
    "register_dataset": ("fedhet.data.registry", "DATASETS.register"),
    "register_partition": ("fedhet.data.partition", "PARTITIONS.register"),
    # register_metric("name", scores=False)(fn): fn(y_true, y_pred) -> float (docs/library.md)
    "register_metric": ("fedhet.metrics", "METRICS.register"),
    "ALGORITHMS": ("fedhet.algorithms.base", "ALGORITHMS"),
    "MODELS": ("fedhet.models.registry", "MODELS"),
    "DATASETS": ("fedhet.data.registry", "DATASETS"),
    "PARTITIONS": ("fedhet.data.partition", "PARTITIONS"),
    "METRICS": ("fedhet.metrics", "METRICS"),
}

__all__ = ["__version__", "testing", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name == "testing":
        return importlib.import_module("fedhet.testing")
    if name not in _PUBLIC:
        raise AttributeError(f"module 'fedhet' has no attribute {name!r}")
    module, path = _PUBLIC[name]
    value: Any = importlib.import_module(module)  # a registry's package fills it on import
    for part in path.split("."):
        value = getattr(value, part)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
