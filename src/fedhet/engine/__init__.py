"""The engine: runs rounds (sampling, topologies, local training, aggregation, evaluation,
communication accounting, checkpoints, metrics); a run is assembled, then run.

What it offers the layers above (runs, reports, papers, deploy, the CLI), by concern; every
other name in `fedhet.engine` is internal to it (tests/test_architecture.py checks that the
layers above import nothing else), as a user's code reaches fedhet only through
`fedhet/__init__.py`:

- **settings** (`config`, `setting_sources`, `toml_files`, `spellings`): `parse` → `build` →
  `RunConfig`, with `config_of`, `flatten`, `path_of`, `canonical_config`, `config_sources`,
  `engine_defaults`, `read_toml_file`, and `current_value`/`current_record`/`OldFlag` (values
  and flags an earlier release spelt otherwise); the
  schema's tables `ENGINE_FIELDS`, `FIELD_DOCS`, `RECORD_KEYS`, `RESUMABLE`, `RUNTIME`,
  `COMPONENTS`, `REGISTRIES`;
- **building and running** (`assembly`, `simulation`, `federation`, `stacked_runs`, `dry`):
  `assemble`, `assemble_clients`, `ClientSide`, `ClientHost`, `Simulation`, `check_resumable`,
  `federate`, `load`, `run_together`, `dry_check`, `RunnerContext`;
- **callbacks and failures**: `CallbackLike`, `StopRun`, `ClientFailure`, `UserCodeFailed`;
- **where work runs** (`plan`, `workers`, `comm`): `ClusterOptions`, `would_stack`,
  `describe_plan`, `host_port`, `ray_address`, `usable_cores`, `CORES_ENV`, `LINKS`.

Importing the package imports none of its modules (and no torch) until a name is first used
(`fedhet.lazy`); mypy and an IDE read the names from the `TYPE_CHECKING` block below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedhet.lazy import attach

if TYPE_CHECKING:
    from fedhet.engine.assembly import ClientSide, assemble, assemble_clients
    from fedhet.engine.callbacks import CallbackLike, StopRun
    from fedhet.engine.clients import ClientHost
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
        chosen_components,
        config_of,
        engine_defaults,
        flatten,
        parse,
        path_of,
    )
    from fedhet.engine.dry import dry_check
    from fedhet.engine.failures import ClientFailure, UserCodeFailed
    from fedhet.engine.federation import federate, load
    from fedhet.engine.plan import ClusterOptions, describe_plan, host_port, ray_address, would_stack
    from fedhet.engine.rounds import RunnerContext
    from fedhet.engine.setting_sources import config_sources
    from fedhet.engine.simulation import Simulation, check_resumable
    from fedhet.engine.spellings import OldFlag, current_record, current_value
    from fedhet.engine.stacked_runs import run_together
    from fedhet.engine.toml_files import read_toml_file
    from fedhet.engine.workers import CORES_ENV, usable_cores

__all__ = [
    "COMPONENTS",
    "CORES_ENV",
    "CallbackLike",
    "ClientFailure",
    "ClientSide",
    "ClientHost",
    "ClusterOptions",
    "ENGINE_FIELDS",
    "FIELD_DOCS",
    "LINKS",
    "OldFlag",
    "RECORD_KEYS",
    "REGISTRIES",
    "RESUMABLE",
    "RUNTIME",
    "RunConfig",
    "RunnerContext",
    "Simulation",
    "StopRun",
    "UserCodeFailed",
    "assemble",
    "assemble_clients",
    "would_stack",
    "build",
    "canonical_config",
    "check_resumable",
    "chosen_components",
    "config_of",
    "config_sources",
    "current_record",
    "current_value",
    "describe_plan",
    "dry_check",
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

if not TYPE_CHECKING:
    __getattr__, __dir__ = attach(__name__, __file__)
