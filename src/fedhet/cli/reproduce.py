"""`fedhet reproduce PAPER`: a seed paper's preset, or one of its protocols on the user's settings.

The papers, their setups and protocols are the registry's (`fedhet.papers.PAPERS`): each paper
folder registers its preset with a one-line help and declares what its setups mean
(`folder.Paper.setup_help`), and `fedhet reproduce --help` lists them.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from fedhet.cli.common import (
    CLUSTER_FLAGS,
    SETTING_FLAGS,
    Parser,
    add_pool_flags,
    add_setting_flags,
    cluster,
    names,
    overrides,
    run_values,
    stack_runs,
)
from fedhet.errors import FedhetError

CAMPAIGN_FLAGS = ("--budget", "--cores", "--nice", "--cache", "--tables", "--results")
"""Flags of `fedhet campaign`, refused here with a line that says so."""


def papers_help() -> str:
    """Each paper of the registry: its preset's one line, its setups and protocols."""
    # lazy: the papers (their presets import torch) load only for this help
    from fedhet.papers import PAPERS
    from fedhet.papers.base import PRESETS, PROTOCOLS, SETUPS

    lines = ["papers (PAPER):"]
    for name, paper in PAPERS.items():
        lines.append(_wrapped(f"  {name:<10} ", PRESETS.get(name).doc))
        if name in SETUPS:
            first, *rest = SETUPS[name]
            lines.append(_wrapped(INDENT, f"setups (--setup): {first} (default)"
                                  + "".join(f", {s}" for s in rest)
                                  + (f"; {paper.setup_help}" if paper.setup_help else "")))
        for proto, entry in sorted(PROTOCOLS.get(name, {}).items()):
            lines.append(_wrapped(INDENT, f"protocol (--protocol {proto}): {entry.help}"))
    return "\n".join(lines)


INDENT = " " * 13


def _wrapped(first: str, text: str) -> str:
    return textwrap.fill(text, 79, initial_indent=first.ljust(len(INDENT)), subsequent_indent=INDENT)


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    rep = sub.add_parser("reproduce", help="re-run a seed paper's experiment (a preset)",
                         description="Run a paper's preset (its experiments at --scale), or one "
                                     "of its protocols on your settings (--protocol). The "
                                     "papers' tables at their own scale are `fedhet campaign`.")
    rep.add_argument("paper", help="a paper (listed below)")
    rep.add_argument("--scale", choices=("smoke", "small", "paper"), help="preset size (default smoke)")
    rep.add_argument("--out", "-o", help="output directory (default runs/PAPER-SCALE, or "
                     "runs/PAPER-PROTOCOL)")
    rep.add_argument("--protocol", metavar="NAME",
                     help="run one of the paper's protocols (listed below) on your settings "
                          "instead of its preset; takes the run flags below")
    rep.add_argument("--baselines", help="--protocol: comma-separated methods to compare against "
                     "(default: the protocol's own)")
    rep.add_argument("--quiet", "-q", action="store_true", help="--protocol: no progress bar")
    rep.add_argument("--only", metavar="DATASETS",
                     help="only the runs on these datasets (comma-separated, e.g. mnist,mnist-even-odd): "
                          "the parts whose data is here when some are not (CIFAR offline)")
    rep.add_argument("--setup", metavar="NAME",
                     help="the setup of the preset's runs, for a paper with setups (listed "
                          "below); output default runs/PAPER-SCALE-NAME")
    add_setting_flags(rep)
    add_pool_flags(rep)
    assert isinstance(rep, Parser)
    rep.more_help = papers_help
    rep.refuse(CAMPAIGN_FLAGS, "{flag} goes with the campaign: `fedhet campaign run` (a sitting) "
                               "and `fedhet campaign plan`")
    rep.set_defaults(func=command)
    return rep


def command(args: argparse.Namespace) -> int:
    if args.setup and args.protocol:
        raise FedhetError("--setup chooses a preset's setup; --protocol runs on your settings "
                          "(give them with --set, e.g. --set dataset.normalize=false)")
    if args.protocol:
        return run_protocol(args)
    given = [f for f in SETTING_FLAGS if getattr(args, f[2:].replace("-", "_")) not in (None, [])]
    if given or args.baselines is not None:
        raise FedhetError(
            f"{', '.join(given or ['--baselines'])}: a preset fixes its own settings; run settings "
            "go with --protocol (--device, --executor and --workers choose where a preset runs)"
        )
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.papers.base import PRESETS
    from fedhet.papers.reproduce import default_out, reproduce
    from fedhet.runs import DEFAULT_STACK_RUNS

    args.paper = PRESETS.canonical(args.paper)  # `FedSR` is `fedsr`
    scale = args.scale or "smoke"
    out = Path(args.out) if args.out else default_out(args.paper, scale, args.setup)
    only = names(args.only, "--only", "mnist,mnist-even-odd") if args.only is not None else None
    reproduce(args.paper, scale, out, args.jobs, args.force, args.tensorboard,
              overrides=overrides(args), only=only, setup=args.setup,
              stack_runs=stack_runs(args) or DEFAULT_STACK_RUNS, cluster=cluster(args))
    print(f"results in {out}/results.csv, {out}/summary.md and {out}/report.md")
    return 0


def run_protocol(args: argparse.Namespace) -> int:
    """`reproduce PAPER --protocol NAME`: the paper's procedure on the user's settings."""
    preset_only = [
        flag for flag in ("--scale", "--only", "--jobs", "--stack-runs", "--tensorboard",
                          *CLUSTER_FLAGS)
        if getattr(args, flag[2:].replace("-", "_"), None) not in (None, False)
    ]
    if preset_only:
        given = " ".join(f if getattr(args, f[2:].replace("-", "_")) is True
                         else f"{f} {getattr(args, f[2:].replace('-', '_'))}" for f in preset_only)
        raise FedhetError(
            f"{', '.join(preset_only)}: a preset's options; --protocol runs the paper's methods on "
            f"your settings instead. Either drop --protocol to run the preset (`fedhet reproduce "
            f"{args.paper} {given}`), or drop {', '.join(preset_only)} and set the runs' size with "
            f"the run flags (e.g. `fedhet reproduce {args.paper} --protocol {args.protocol} -r 20`)"
        )
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import parse
    from fedhet.papers.base import protocol

    proto = protocol(args.paper, args.protocol)
    settings = {**parse(proto.defaults, f"{args.paper} {args.protocol} defaults"), **run_values(args)}
    baselines = list(names(args.baselines, "--baselines", "fedavg,fednova")) \
        if args.baselines is not None else None
    show = sys.stderr.isatty() and not args.quiet
    out = Path(args.out or f"runs/{args.paper}-{args.protocol}")
    lines = not sys.stdout.isatty() and not args.quiet  # a log file: a line now and then
    for line in proto.run(settings, out, baselines=baselines, force=args.force, progress=show,
                          lines=lines):
        print(line)
    return 0
