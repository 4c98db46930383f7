"""`fedhet demo`: FedAvg against FedNova on the embedded digits, Dirichlet 0.5."""

from __future__ import annotations

import argparse
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    demo = sub.add_parser("demo", help="FedAvg vs FedNova on digits, Dirichlet 0.5 (embedded)")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--rounds", type=int, default=30)
    demo.add_argument("--force", action="store_true")
    demo.set_defaults(func=command)
    return demo


def command(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.runs import run_demo

    run_demo(Path(args.out), rounds=args.rounds, force=args.force)
    return 0
