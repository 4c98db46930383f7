"""The engine: runs rounds (sampling, topologies, local training, aggregation, evaluation,
communication accounting, checkpoints, metrics); a run is assembled, then run.

What it offers the layers above (runs, reports, papers, deploy, the CLI), by concern; every
other name in `fedhet.engine` is internal to it (tests/test_architecture.py checks that the
layers above import nothing else), as a user's code reaches fedhet only through
`fedhet/__init__.py`:

- **settings** (`config`): `parse` → `build` → `RunConfig`, with `config_of`, `flatten`,
  `path_of`, `canonical_config`, `config_sources`, `engine_defaults`, `read_toml_file`; the
  schema's tables `ENGINE_FIELDS`, `FIELD_DOCS`, `RECORD_KEYS`, `RESUMABLE`, `RUNTIME`,
  `COMPONENTS`, `REGISTRIES`;
- **building and running** (`assembly`, `simulation`, `federation`, `batch`, `dry`):
  `assemble`, `assemble_clients`, `ClientSide`, `ClientWork`, `Simulation`, `check_resumable`,
  `federate`, `load`, `run_together`, `dry_check`, `RunnerContext`;
- **callbacks and failures**: `CallbackLike`, `StopRun`, `ClientFailure`, `UserCodeFailed`;
- **where work runs** (`plan`, `workers`, `comm`): `ClusterOptions`, `batchable`,
  `describe_plan`, `host_port`, `ray_address`, `usable_cores`, `CORES_ENV`, `LINKS`.

Importing the package imports none of its modules (and no torch) until a name is first used.
"""

from __future__ import annotations

from fedhet.surface import offered

_SURFACE = {
    **dict.fromkeys(
        ("parse", "chosen_components", "build", "RunConfig", "config_of", "flatten", "path_of",
         "canonical_config",
         "config_sources", "engine_defaults", "read_toml_file", "ENGINE_FIELDS", "FIELD_DOCS",
         "RECORD_KEYS", "RESUMABLE", "RUNTIME", "COMPONENTS", "REGISTRIES"), "config"),
    "assemble": "assembly", "assemble_clients": "assembly", "ClientSide": "assembly",
    "ClientWork": "clients",
    "Simulation": "simulation", "check_resumable": "simulation",
    "federate": "federation", "load": "federation",
    "run_together": "batch",
    "dry_check": "dry",
    "RunnerContext": "rounds",
    "CallbackLike": "callbacks", "StopRun": "callbacks",
    "ClientFailure": "failures", "UserCodeFailed": "failures",
    **dict.fromkeys(("ClusterOptions", "batchable", "describe_plan", "host_port", "ray_address"),
                    "plan"),
    "usable_cores": "workers", "CORES_ENV": "workers",
    "LINKS": "comm",
}

__all__ = sorted(_SURFACE)

__getattr__ = offered(__name__, _SURFACE)
