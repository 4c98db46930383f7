"""The main job of the README: FedAvg vs FedNova on scikit-learn's digits, Dirichlet(0.5).

Ten clients whose label mixes differ (Dirichlet α = 0.5) and whose local work differs (each
client draws 1–4 local epochs per round, FedNova's straggler setting). Prints a table of test
accuracy by round and says where the results went.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedhet.rundir import check_out, metric_columns, read_metrics
from fedhet.runs.single import execute

DEMO_ALGORITHMS = ("fedavg", "fednova")
DEMO_SETTINGS = {
    "dataset": "digits", "partition": "dirichlet", "partition.alpha": 0.5, "clients": 10,
    "lr": 0.05, "batch_size": 16, "epochs_min": 1, "epochs_max": 4, "seed": 0,
}


def run_demo(out: Path, rounds: int = 30, force: bool = False) -> dict[str, dict]:
    """Run each demo algorithm into `out/<name>` and print the comparison table."""
    for name in DEMO_ALGORITHMS:
        check_out(out / name, force)
    summaries = {}
    for name in DEMO_ALGORITHMS:
        print(f"running {name} ({rounds} rounds) ...", flush=True)
        settings = {**DEMO_SETTINGS, "algorithm": name, "rounds": rounds}
        summaries[name] = execute(settings, out / name, force=force)
    print()
    print(_table(out, rounds))
    print()
    for name, s in summaries.items():
        print(f"{name:<8} final accuracy {s['final_accuracy']:.4f}  best {s['best_accuracy']:.4f}"
              f"  time {s['total_time_s']:.1f} s")
    print(f"results: {out}/<algorithm>/metrics.csv, summary.json, config.json")
    (out / "demo.json").write_text(json.dumps(summaries, indent=2))
    return summaries


def _table(out: Path, rounds: int) -> str:
    acc = {}
    for name in DEMO_ALGORITHMS:
        columns = metric_columns(read_metrics(out / name))
        acc[name] = dict(zip(map(int, columns["round"]), columns["test_accuracy"], strict=True))
    shown = sorted({0, 1, 2, 5, *range(10, rounds + 1, 10), rounds} & set(range(rounds + 1)))
    lines = ["round  " + "  ".join(f"{n:>8}" for n in DEMO_ALGORITHMS)]
    lines += [f"{k:>5}  " + "  ".join(f"{acc[n][k]:>8.4f}" for n in DEMO_ALGORITHMS) for k in shown]
    return "\n".join(lines)
