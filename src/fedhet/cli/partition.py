"""`fedhet partition`: per-client sizes and label counts of a partition (and its heatmap)."""

from __future__ import annotations

import argparse

from fedhet.cli.common import add_run_flags, run_values


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    part = sub.add_parser("partition", help="per-client sizes and label counts of a partition")
    add_run_flags(part)
    part.add_argument("--heatmap", help="save a clients × labels heatmap PNG here")
    part.add_argument("--save-indices", metavar="FILE",
                      help='write {"0": [sample indices], ...} as JSON (read by --partition file)')
    part.set_defaults(func=command)
    return part


def command(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.reports import describe_partition

    describe_partition(run_values(args), heatmap=args.heatmap, indices=args.save_indices)
    return 0
