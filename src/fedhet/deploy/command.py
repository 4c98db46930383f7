"""`fedhet deploy app|local`: the command line side of the Flower deployment."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhet.deploy.project import write_app
from fedhet.engine import config_of
from fedhet.errors import FedhetError
from fedhet.procs import handling
from fedhet.rundir import prepare_out

if TYPE_CHECKING:
    from fedhet.deploy.launch import LocalFederation


def deploy_app(values: dict[str, Any], out: Path, app_dir: Path, round_timeout: float,
               node_wait: float, force: bool = False, auth: bool = False) -> Path:
    """Write the Flower App for this run and print how to start the federation by hand
    (with `auth`, one where only SuperNodes whose keys were registered join)."""

    cfg = config_of(values)  # bad settings fail here, before anything is written
    path = write_app(app_dir, values, out, round_timeout=round_timeout, node_wait_timeout=node_wait,
                     force=force, supernode_auth=auth)
    q = shlex.quote
    if auth:
        _print_auth_commands(cfg.clients, node_wait, app_dir, out)
        return path
    print(f"wrote {path}\nstart the federation (each in its own terminal; see docs/deploy.md for TLS):")
    print("  export FLWR_TELEMETRY_ENABLED=0")
    print("  flower-superlink --insecure --host 127.0.0.1 --port 9093 "
          "--disable-runtime-dependency-installation")
    for i in range(cfg.clients):
        print(f"  flower-supernode --insecure --superlink 127.0.0.1:9093 --port {9100 + i} "
              f"--max-wait-time {node_wait:g} --node-config 'partition-id={i} num-partitions={cfg.clients}'")
    print(f"then: flwr run {q(str(app_dir))} <connection> --stream  (results in {out})")
    print("a SuperNode that dies is a dropped client for the rounds it misses; "
          "start it again with the same command and it rejoins")
    return path


def _print_auth_commands(clients: int, node_wait: float, app_dir: Path, out: Path) -> None:
    """How to start a federation that admits registered SuperNodes only (docs/deploy.md)."""
    print("start the federation (TLS certificates in certificates/, as docs/deploy.md makes them; "
          "only registered SuperNodes join):")
    print("  export FLWR_TELEMETRY_ENABLED=0")
    print("  flower-superlink --ssl-ca-certfile certificates/ca.crt --ssl-certfile "
          "certificates/server.pem --ssl-keyfile certificates/server.key --host 0.0.0.0 --port 9093 "
          "--disable-runtime-dependency-installation --enable-supernode-auth")
    for i in range(clients):
        print(f"  ssh-keygen -t ecdsa -b 384 -N '' -f keys/supernode-{i}   # on SuperNode {i}'s machine")
        print(f"  flwr supernode register keys/supernode-{i}.pub <connection>   # where flwr runs")
        print(f"  flower-supernode --root-certificates certificates/ca.crt --superlink SUPERLINK:9093 "
              f"--auth-supernode-private-key keys/supernode-{i} --max-wait-time {node_wait:g} "
              f"--node-config 'partition-id={i} num-partitions={clients}'")
    print(f"then: flwr run {shlex.quote(str(app_dir))} <connection> --stream  (results in {out})")


LOGS_DIR = "flower-logs"
"""Where `deploy local` keeps the Flower logs, inside the run directory."""


def deploy_local(values: dict[str, Any], out: Path, round_timeout: float, node_wait: float,
                 timeout: float, force: bool, keep_logs: Path | None,
                 simulation: bool = False, ray_address: str | None = None,
                 client_cpus: int | None = None, client_gpus: float | None = None,
                 auth: bool = False) -> dict[str, Any]:
    """Start a SuperLink and one SuperNode per client on 127.0.0.1 (or, with `simulation`,
    a SuperLink running Flower's Ray simulation runtime), run, stop everything.

    Every started process is watched: when the SuperLink, the ServerApp or `flwr run` dies,
    the others are stopped and a `FedhetError` names it (the CLI prints it as one `error:`
    line and exits non-zero), as it does when the server app wrote `OUT/error.txt`. A
    SuperNode that dies mid-run is one line and a dropped client (`watchdog.Watchdog`). The
    server app's progress lines (SuperNodes joined, one line per round, each dropped or
    rejoined client) are echoed as they happen; on a terminal the round lines overwrite each
    other. Flower's logs end up in `OUT/flower-logs` (or live in `keep_logs`, with Flower's
    home). With `simulation`, `ray_address` (else `RAY_ADDRESS`) joins an existing Ray cluster
    and each virtual node's ClientApp holds `client_cpus` CPUs and `client_gpus` GPUs. The
    returned summary carries `supernodes_finished` (SuperNodes still in the run at its end).
    With `auth`, the SuperLink runs with TLS (a throw-away CA for 127.0.0.1) and
    `--enable-supernode-auth`, each SuperNode gets its own key pair, registered with the SuperLink
    before it starts, and the run's `deploy.json` records `supernode_auth: true`.
    """

    # needs the optional extra fedhet[flower]
    from fedhet.deploy.launch import AUTH_SIMULATION, LocalFederation, probe_ray_address

    check_timeouts(("timeout", timeout))
    cfg = config_of(values)
    ray = _ray_options(simulation, ray_address, client_cpus, client_gpus)
    if auth and simulation:
        raise FedhetError(AUTH_SIMULATION)
    if simulation and (ray_address or os.environ.get("RAY_ADDRESS")):
        # a cluster that is not there fails here, not after the SuperNodes' wait
        probe_ray_address(ray_address or os.environ["RAY_ADDRESS"],
                          "--ray-address" if ray_address else "RAY_ADDRESS")
    prepare_out(out, force)
    t0 = time.perf_counter()
    logs_to = None if keep_logs else out / LOGS_DIR
    with _stopped_cleanly(), LocalFederation(cfg.clients, workdir=keep_logs, simulation=simulation,
                         node_max_wait=node_wait, logs_to=logs_to, auth=auth, **ray) as fed:
        app_dir = fed.workdir / "app"
        write_app(app_dir, values, out, round_timeout=round_timeout, node_wait_timeout=node_wait,
                  fast_pulls=not simulation, node_events=None if simulation else fed.events_file,
                  supernode_auth=auth)
        print(_started_line(fed, cfg.clients, simulation, logs_to, auth), flush=True)
        echo = Echo()
        try:
            summary = fed.run(app_dir, out, timeout=timeout, echo=echo)
        finally:
            echo.close()
    summary["deploy_wall_s"] = time.perf_counter() - t0
    summary["supernodes_finished"] = _supernodes_finished(out)
    print(f"{summary['supernodes_finished']} of {cfg.clients} SuperNodes finished the run")
    return summary


def _started_line(fed: LocalFederation, clients: int, simulation: bool, logs_to: Path | None,
                  auth: bool) -> str:
    """The line `deploy local` prints once the federation `fed` is up: where the SuperLink
    listens, how many SuperNodes (simulated, on which Ray cluster; admitted by key) and where
    Flower's logs are."""
    nodes = "simulated (Ray) " if simulation else ""
    cluster = f" on the Ray cluster at {fed.env['RAY_ADDRESS']}" \
        if simulation and fed.env["RAY_ADDRESS"] != "local" else ""
    where = f"{fed.logs} (copied to {logs_to} at the end)" if logs_to else str(fed.logs)
    admitted = (f" (TLS; only registered SuperNodes join: {len(fed.registered)} public keys "
                "registered)") if auth else ""
    return (f"SuperLink on 127.0.0.1:{fed.port} with {clients} {nodes}SuperNodes{cluster}"
            f"{admitted}; logs in {where}")


def _supernodes_finished(out: Path) -> int:
    """The SuperNodes still in the run at its end, as the server app recorded in `deploy.json`
    (every node it saw where it records no count)."""
    deploy = json.loads((out / "deploy.json").read_text())
    return deploy.get("supernodes_finished", len(deploy.get("nodes", {})))


@contextlib.contextmanager
def _stopped_cleanly() -> Iterator[None]:
    """SIGTERM or SIGHUP (a batch scheduler's time limit, a closed terminal) end the run like
    Ctrl-C does: the federation's `with` stops every process it started, then one line."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # one stop at a time
        raise FedhetError(f"stopped by {signal.Signals(signum).name}; stopped every Flower "
                          "process of the run")

    with handling((signal.SIGTERM, signal.SIGHUP), stop):
        yield


class Echo:
    """Prints the server app's lines; on a terminal a round's progress line replaces the last."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.open = False  # a progress line is on screen without its newline

    def __call__(self, line: str) -> None:
        progress = line.startswith("fedhet: round ") and " s/round, ETA " in line
        if self.tty and progress:
            self.stream.write(f"\r\033[K{line}")
            self.open = True
        else:
            self.close()
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.stream.flush()
            self.open = False


def _ray_options(simulation: bool, address: str | None, cpus: int | None,
                 gpus: float | None) -> dict[str, Any]:
    """LocalFederation's Ray arguments from the flags; one clear line for a bad one."""
    given = [f for f, v in (("--ray-address", address), ("--client-cpus", cpus),
                            ("--client-gpus", gpus)) if v is not None]
    if given and not simulation:
        verb = "applies" if len(given) == 1 else "apply"
        raise FedhetError(f"{', '.join(given)} {verb} only with --simulation (Flower's Ray runtime)")
    if cpus is not None and (cpus != int(cpus) or cpus < 1):
        raise FedhetError(f"--client-cpus must be a whole number of CPUs, at least 1, got {cpus:g}")
    if gpus is not None and not gpus >= 0:
        raise FedhetError(f"--client-gpus must be a share of GPUs >= 0 (e.g. 0.25), got {gpus:g}")
    if address is not None and not address.strip():
        raise FedhetError("--ray-address is empty; give HOST:PORT of the cluster's head, or auto")
    return {"ray_address": address, "cpus_per_node": int(cpus or 1),
            "gpus_per_node": float(gpus or 0.0)}


def check_timeouts(*pairs: tuple[str, float]) -> None:
    for name, value in pairs:
        if not value > 0:
            raise FedhetError(f"--{name} must be a positive number of seconds, got {value}")
