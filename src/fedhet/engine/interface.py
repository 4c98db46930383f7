"""The engine layer (runs rounds: sampling, topologies, local training, aggregation, evaluation,
communication accounting, checkpoints, metrics; a run is assembled, then run) as the layers
above see it.

`fedhet.experiments`, `fedhet.deploy` and `fedhet.cli` import this layer only from here, as a
user's code imports fedhet only from `fedhet/__init__.py`; every other name in
`fedhet.engine` is internal to it (tests/test_architecture.py).
"""

from fedhet.engine.assemble import ClientSide, assemble, assemble_clients
from fedhet.engine.batch import run_together
from fedhet.engine.callbacks import CallbackLike, StopRun
from fedhet.engine.clients import ClientWork
from fedhet.engine.comm import LINKS
from fedhet.engine.config import (
    COMPONENTS,
    ENGINE_FIELDS,
    FIELD_DOCS,
    RECORD_KEYS,
    REGISTRIES,
    RESUMABLE,
    RUNTIME,
    RunConfig,
    build,
    canonical_config,
    config_of,
    config_sources,
    engine_defaults,
    flatten,
    parse,
    path_of,
    read_toml_file,
)
from fedhet.engine.dry import dry_check
from fedhet.engine.failures import ClientFailure, UserCodeFailed
from fedhet.engine.federate import federate, load
from fedhet.engine.plan import ClusterOptions, batchable, describe_plan, host_port, ray_address
from fedhet.engine.rounds import RunnerContext
from fedhet.engine.simulation import Simulation, check_resumable
from fedhet.engine.workers import CORES_ENV, usable_cores

__all__ = [
    "COMPONENTS",
    "CORES_ENV",
    "CallbackLike",
    "ClientFailure",
    "UserCodeFailed",
    "ClientSide",
    "ClientWork",
    "ClusterOptions",
    "ENGINE_FIELDS",
    "FIELD_DOCS",
    "LINKS",
    "RECORD_KEYS",
    "REGISTRIES",
    "RESUMABLE",
    "RUNTIME",
    "RunConfig",
    "RunnerContext",
    "StopRun",
    "Simulation",
    "assemble",
    "assemble_clients",
    "batchable",
    "build",
    "canonical_config",
    "check_resumable",
    "config_of",
    "config_sources",
    "dry_check",
    "describe_plan",
    "engine_defaults",
    "federate",
    "flatten",
    "host_port",
    "load",
    "parse",
    "path_of",
    "ray_address",
    "read_toml_file",
    "run_together",
    "usable_cores",
]
