"""Seconds per round and bytes: the same run in-process and over Flower on 127.0.0.1.

Run it inside a private network namespace so that the loopback counters see only this
federation's traffic (and nothing outside the machine is reachable):

    unshare -n sh -c 'ip link set lo up && FLWR_TELEMETRY_ENABLED=0 PYTHONPATH=src \\
        python benchmarks/bench_flower.py --algorithm fedavg --clients 3 --rounds 4 --out /tmp/bench'

`--cold` runs Flower's stock SuperNodes instead of `fedhet deploy local`'s warm ones (a fresh
`flwr-clientapp` process per message, 3 s idle polls; see docs/deploy.md, "Speed").

Prints one JSON object: median and mean round time in-process and over Flower (the medians over
all rounds and over rounds after the first),
fedhet's own byte count (`cum_bytes`), the serialized Flower payload (`cum_wire_bytes`) and the
bytes that crossed the loopback interface per round (HTTP, protobuf, polling and heartbeats
included) when /proc/net/dev is private to this process.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import time
from pathlib import Path


def lo_bytes() -> int:
    for line in Path("/proc/net/dev").read_text().splitlines():
        if line.strip().startswith("lo:"):
            return int(line.split(":", 1)[1].split()[0])
    return 0


def rows(out: Path) -> list[dict[str, str]]:
    path = out / "metrics.csv"
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def round_times(out: Path) -> list[float]:
    return [float(r["round_time_s"]) for r in rows(out)[1:]]  # row 0 is the initial model


def mean_round(out: Path) -> float:
    times = round_times(out)[1:]  # rounds after the first
    return statistics.fmean(times) if times else float("nan")


def median(times: list[float]) -> float:
    return statistics.median(times) if times else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algorithm", default="fedavg")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="/tmp/fedhet-bench")
    ap.add_argument("--simulation", action="store_true", help="Flower's simulation runtime (Ray)")
    ap.add_argument("--cold", action="store_true",
                    help="Flower's stock SuperNodes: a new ClientApp process per message")
    args = ap.parse_args()

    from fedhet.deploy.launch import LocalFederation
    from fedhet.deploy.process_tree import stop_tree
    from fedhet.deploy.project import write_app
    from fedhet.deploy.watchdog import wait_for_run
    from fedhet.runs.single import execute

    settings = {"algorithm": args.algorithm, "dataset": args.dataset, "clients": args.clients,
                "rounds": args.rounds, "lr": 0.1, "seed": 0}
    base = Path(args.out)
    local = execute(settings, base / "in-process", force=True, log=lambda _: None)
    flower_out = base / ("flower-sim" if args.simulation else "flower-cold" if args.cold else "flower")
    subprocess.run(["rm", "-rf", str(flower_out)], check=True)
    lo_start = lo_bytes()
    with LocalFederation(args.clients, workdir=base / "fed", simulation=args.simulation,
                         warm=not args.cold) as fed:
        write_app(base / "app", settings, flower_out, round_timeout=600, fast_pulls=fed.warm)
        client = fed.submit(base / "app")
        per_round, seen, last = [], 0, lo_bytes()
        t0 = time.monotonic()
        while not (flower_out / "deploy.json").exists() and time.monotonic() - t0 < 3600:
            n = len(rows(flower_out))
            if n > seen:
                now = lo_bytes()
                if seen >= 1:
                    per_round.append(now - last)
                seen, last = n, now
            if client.poll() is not None and not (flower_out / "summary.json").exists():
                break
            time.sleep(0.05)
        summary = wait_for_run(flower_out, 60, [client, fed.superlink], fed.logs)
        stop_tree(client)
    result = {
        "config": settings, "simulation_runtime": args.simulation, "cold_supernodes": args.cold,
        "in_process_s_per_round": mean_round(base / "in-process"),
        "flower_s_per_round": mean_round(flower_out),
        "flower_round_times_s": round_times(flower_out),
        "flower_median_s_per_round": median(round_times(flower_out)),
        "flower_median_s_per_round_after_first": median(round_times(flower_out)[1:]),
        "in_process_median_s_per_round": median(round_times(base / "in-process")),
        "fedhet_cum_bytes": local["cum_bytes"], "flower_cum_bytes_ledger": summary["cum_bytes"],
        "flower_payload_bytes": summary["cum_wire_bytes"],
        "loopback_bytes_per_round": per_round[1:],
        "loopback_bytes_total_session": lo_bytes() - lo_start,
        "final_accuracy_in_process": local["final_accuracy"],
        "final_accuracy_flower": summary["final_accuracy"],
    }
    print(json.dumps(result, indent=2))
    (base / "bench.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
