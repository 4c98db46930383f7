"""`fedhet deploy app|local`: the command line side of the Flower deployment."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

from fedhet.deploy.project import write_app
from fedhet.engine.config import config_of
from fedhet.errors import FedhetError
from fedhet.experiments.single import prepare_out


def deploy_app(values: dict[str, Any], out: Path, app_dir: Path, round_timeout: float,
               node_wait: float, force: bool = False) -> Path:
    """Write the Flower App for this run and print how to start the federation by hand."""

    cfg = config_of(values)  # bad settings fail here, before anything is written
    path = write_app(app_dir, values, out, round_timeout=round_timeout, node_wait_timeout=node_wait,
                     force=force)
    q = shlex.quote
    print(f"wrote {path}\nstart the federation (each in its own terminal; see docs/deploy.md for TLS):")
    print("  export FLWR_TELEMETRY_ENABLED=0")
    print("  flower-superlink --insecure --host 127.0.0.1 --port 9093 "
          "--disable-runtime-dependency-installation")
    for i in range(cfg.clients):
        print(f"  flower-supernode --insecure --superlink 127.0.0.1:9093 --port {9100 + i} "
              f"--max-wait-time {node_wait:g} --node-config 'partition-id={i} num-partitions={cfg.clients}'")
    print(f"then: flwr run {q(str(app_dir))} <connection> --stream  (results in {out})")
    return path


def deploy_local(values: dict[str, Any], out: Path, round_timeout: float, node_wait: float,
                 timeout: float, force: bool, keep_logs: Path | None,
                 simulation: bool = False) -> dict[str, Any]:
    """Start a SuperLink and one SuperNode per client on 127.0.0.1 (or, with `simulation`,
    a SuperLink running Flower's Ray simulation runtime), run, stop everything.

    Every started process is watched: when one dies the others are stopped and a
    `FedhetError` names it (the CLI prints it as one `error:` line and exits non-zero), as
    it does when the server app wrote `OUT/error.txt`. The server app's progress lines
    (SuperNodes joined, each dropped client per round) are echoed as they happen. The returned
    summary carries `supernodes_finished` (SuperNodes still in the run at its end).
    """

    # needs the optional extra fedhet[flower]
    from fedhet.deploy.launch import LocalFederation

    cfg = config_of(values)
    prepare_out(out, force)
    t0 = time.perf_counter()
    with LocalFederation(cfg.clients, workdir=keep_logs, simulation=simulation,
                         node_max_wait=node_wait) as fed:
        app_dir = fed.workdir / "app"
        write_app(app_dir, values, out, round_timeout=round_timeout, node_wait_timeout=node_wait,
                  fast_pulls=not simulation)
        nodes = "simulated (Ray) " if simulation else ""
        print(f"SuperLink on 127.0.0.1:{fed.port} with {cfg.clients} {nodes}SuperNodes; "
              f"logs in {fed.logs}", flush=True)
        summary = fed.run(app_dir, out, timeout=timeout, echo=lambda line: print(line, flush=True))
    summary["deploy_wall_s"] = time.perf_counter() - t0
    deploy = json.loads((out / "deploy.json").read_text())
    summary["supernodes_finished"] = deploy.get("supernodes_finished", len(deploy.get("nodes", {})))
    print(f"{summary['supernodes_finished']} of {cfg.clients} SuperNodes finished the run")
    return summary


def check_timeouts(*pairs: tuple[str, float]) -> None:
    for name, value in pairs:
        if not value > 0:
            raise FedhetError(f"--{name} must be a positive number of seconds, got {value}")
