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

Each name is imported from its module when first used (`fedhet.lazy`), so `import fedhet` (and
with it `fedhet.rundir`, which reads runs without torch, and the CLI's `--help`) imports no
torch; mypy and an IDE read the names from the `TYPE_CHECKING` block below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedhet.lazy import attach
from fedhet.version import __version__

if TYPE_CHECKING:
    import fedhet.testing as testing
    from fedhet.algorithms.base import (
        ALGORITHMS,
        Algorithm,
        ClientContext,
        Message,
        Reply,
        RunInfo,
    )
    from fedhet.algorithms.fedavg import client_diagnostics, local_sgd_update, mean_delta
    from fedhet.algorithms.state import ClientState, ServerState
    from fedhet.api import compare, resume, run
    from fedhet.data.arrays import from_arrays
    from fedhet.data.base import Dataset
    from fedhet.data.hf import from_huggingface
    from fedhet.data.partition import PARTITIONS
    from fedhet.data.registry import DATASETS
    from fedhet.engine.assembly import assemble
    from fedhet.engine.callbacks import Callback
    from fedhet.engine.config import RunConfig, config_of
    from fedhet.errors import FedhetDeprecationWarning, FedhetError
    from fedhet.metrics import METRICS
    from fedhet.models.registry import MODELS
    from fedhet.plugins import load_plugins
    from fedhet.rundir import RunResult, open_run

    # the registries' decorators: register_algorithm("name", Params, "doc", **traits)(cls);
    # register_metric("name", scores=False)(fn): fn(y_true, y_pred) -> float (docs/library.md)
    register_algorithm = ALGORITHMS.register
    register_model = MODELS.register
    register_dataset = DATASETS.register
    register_partition = PARTITIONS.register
    register_metric = METRICS.register

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Callback",
    "ClientContext",
    "ClientState",
    "DATASETS",
    "Dataset",
    "FedhetDeprecationWarning",
    "FedhetError",
    "METRICS",
    "MODELS",
    "Message",
    "PARTITIONS",
    "Reply",
    "RunConfig",
    "RunInfo",
    "RunResult",
    "ServerState",
    "__version__",
    "assemble",
    "client_diagnostics",
    "compare",
    "config_of",
    "from_arrays",
    "from_huggingface",
    "load_plugins",
    "local_sgd_update",
    "mean_delta",
    "open_run",
    "register_algorithm",
    "register_dataset",
    "register_metric",
    "register_model",
    "register_partition",
    "resume",
    "run",
    "testing",
]

if not TYPE_CHECKING:
    __getattr__, __dir__ = attach(__name__, __file__)
