"""`fedhet deploy local|app`: a run on Flower, SuperLink and SuperNodes (docs/deploy.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedhet.cli.common import add_run_flags, run_values, seconds
from fedhet.errors import FedhetError


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    dep = sub.add_parser("deploy", help="run on Flower: SuperLink + SuperNodes (docs/deploy.md)")
    dep.add_argument("mode", choices=["local", "app"],
                     help="local: start a SuperLink and one SuperNode per client on 127.0.0.1 and "
                          "run; app: write the Flower App for `flwr run` on your own federation")
    add_run_flags(dep)
    dep.add_argument("--out", "-o", help="run directory the server app writes (absolute on its host)")
    dep.add_argument("--app-dir", default="fedhet-app", help="where `app` writes the Flower App")
    dep.add_argument("--round-timeout", type=seconds, default=600.0,
                     help="seconds to wait for the replies of a round; late clients are dropped")
    dep.add_argument("--node-wait", type=seconds, default=300.0,
                     help="seconds to wait for one SuperNode per client before the first round")
    dep.add_argument("--timeout", type=seconds, default=24 * 3600.0, help="local: whole-run limit")
    dep.add_argument("--force", action="store_true", help="replace a non-empty --out")
    dep.add_argument("--keep-logs", metavar="DIR", help="local: keep Flower's logs and home in DIR")
    _add_simulation_flags(dep)
    dep.add_argument("--auth", action="store_true",
                     help="only registered SuperNodes join: TLS, --enable-supernode-auth and one "
                          "registered key pair per SuperNode (docs/deploy.md)")
    dep.set_defaults(func=command)
    return dep


def _add_simulation_flags(dep: argparse.ArgumentParser) -> None:
    dep.add_argument("--simulation", action="store_true",
                     help="local: Flower's simulation runtime (Ray; needs fedhet[flower-sim])")
    dep.add_argument("--ray-address", metavar="ADDR",
                     help="--simulation: join this Ray cluster (HOST:PORT of `ray start --head`, "
                          "or auto; default: $RAY_ADDRESS, else a private one-node Ray)")
    dep.add_argument("--client-cpus", type=float, metavar="N",
                     help="--simulation: CPUs each virtual SuperNode's ClientApp holds (default 1)")
    dep.add_argument("--client-gpus", type=float, metavar="G",
                     help="--simulation: GPU share of each virtual SuperNode (e.g. 0.25; default 0)")


def command(args: argparse.Namespace) -> int:
    # needs the optional extra fedhet[flower]
    from fedhet.deploy import require_flower

    require_flower()
    # needs the optional extra fedhet[flower]
    from fedhet.deploy.command import check_timeouts, deploy_app, deploy_local

    if not args.out:
        raise FedhetError("--out DIR is required (where the server writes metrics and checkpoints)")
    check_timeouts(("round-timeout", args.round_timeout), ("node-wait", args.node_wait))
    values, out = run_values(args), Path(args.out)
    if args.mode == "app":
        deploy_app(values, out, Path(args.app_dir), args.round_timeout, args.node_wait, args.force,
                   auth=args.auth)
        return 0
    keep = Path(args.keep_logs) if args.keep_logs else None
    summary = deploy_local(values, out, args.round_timeout, args.node_wait, args.timeout,
                           args.force, keep, simulation=args.simulation,
                           ray_address=args.ray_address, client_cpus=args.client_cpus,
                           client_gpus=args.client_gpus, auth=args.auth)
    print(
        f"{summary['algorithm']} over Flower ({summary.get('supernodes_finished', summary['clients'])} of "
        f"{summary['clients']} SuperNodes finished): final accuracy "
        f"{summary['final_accuracy']:.4f}, {summary['total_time_s']:.1f} s of rounds; results in {out}"
    )
    return 0
